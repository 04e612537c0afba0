--- async_mutex.redis_reentrant: RedisReentrantMutex, a RedisMutex that the
-- coroutine holding it may acquire again without waiting, with the API
-- and semantics of am.ReentrantMutex (docs/lockkinds.md, ReentrantMutex;
-- docs/redis-locks.md, "RedisReentrantMutex").
--
-- One hold in Redis, counted in levels here: the holder is a coroutine of
-- this process, its first acquire goes through the lock's gate and the
-- Redis queue as a RedisMutex's does (redis_lock_base.acquire), and every
-- acquire of that coroutine while the hold lasts is one more level, granted
-- at once without a request.  The last level released gives the hold back
-- in Redis.  A hold that is lost (its lease, docs/redis-locks.md "Leases")
-- ends every level: their releasers return false, check() raises the lost
-- error, and the coroutine's next acquire is a new acquisition.

local base = require "async_mutex.redis_lock_base"
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local uv = require "luv"

local error, getmetatable, ipairs, pcall, setmetatable =
  error, getmetatable, ipairs, pcall, setmetatable
local running, isyieldable = coroutine.running, coroutine.isyieldable
local format = string.format
local hrtime = uv.hrtime
local check_open = checks.check_open
local lose, release_lease = base.lose, base.release_lease
local check_self, check_priority = base.check_self, base.check_priority

local M = {}

local Reentrant = { __name = "async_mutex.RedisReentrantMutex" }
local methods = {}
Reentrant.__index = methods

-- {========================================================== levels
-- A level's releaser has the interface of a Redis lock's releaser
-- (async_mutex.RedisReleaser: callable, to-be-closed, check(), fence):
-- it ends exactly its own level, once, whichever coroutine calls it.

local Level = { __name = "async_mutex.RedisReleaser" }
local level_methods = setmetatable({}, { __index = base.lease_methods })
Level.__index = level_methods

-- The lease of a hold, as it is now: one whose local end has passed is
-- lost at this call (as the lease's own check() does).
local function lease_now(lease)
  if lease.state == "held" and hrtime() >= lease.valid_until then
    lose(lease, "expired")
  end
  return lease
end

-- The hold of this process, or nil: a hold whose lease was lost, or ended
-- by the client's close, is no hold any more.
local function current_hold(lk)
  local hold = lk.hold
  if hold and lease_now(hold.lease).state ~= "held" then
    lk.hold = nil
    return nil
  end
  return hold
end

local function new_level(lk, hold)
  return setmetatable({ lock = lk, hold = hold, fence = hold.lease.fence,
                        released = false, let_go = false }, Level)
end

-- true if this call ended its level; false if it had ended already, or
-- if the hold was lost (or ended by a close) meanwhile.  The last level
-- gives the hold back in Redis, and returns what the lease's release
-- returns (docs/redis-locks.md: in a coroutine it waits for Redis).
local function release_level(lv)
  if lv.released then return false end
  local hold = lv.hold
  if lease_now(hold.lease).state ~= "held" then
    -- (a lost hold: once its every level is let go, its holder is done,
    -- and its lease, which Redis may still have, is given back:
    -- redis_lock_lease.lua, release_lease)
    if not lv.let_go then
      lv.let_go = true
      hold.depth = hold.depth - 1
      if hold.depth == 0 then release_lease(hold.lease) end
    end
    return false
  end
  lv.released = true
  hold.depth = hold.depth - 1
  if hold.depth > 0 then return true end
  local lk = lv.lock
  if lk.hold == hold then lk.hold = nil end
  return release_lease(hold.lease)
end

Level.__call = release_level
Level.__close = release_level

--- releaser:check(): raises the lost error if the hold was lost while this
-- level was held; true while it is held, false once it was given back.
function level_methods.check(lv)
  if getmetatable(lv) ~= Level then
    return base.lease_methods.check(lv)       -- a plain lease, or the error
  end
  local lease = lease_now(lv.hold.lease)
  if lv.released then return false end
  if lease.state == "lost" then error(lv.lock.lost_error, 0) end
  return lease.state == "held"
end

function Level.__tostring(lv)
  local lease = lv.hold.lease
  local state = lv.released and "released" or lease.state
  return format("async_mutex.RedisReleaser (%s, fence %d, %s)", lease.keys.name,
                lv.fence, state)
end

-- }==========================================================

-- The lock's onLost: the hold ends here (every level with it), and the
-- user's onLost is told, with the outermost level's releaser.
local function on_lost_of(lk, user)
  return function(info)
    local hold = lk.hold
    local top = info.releaser
    if hold and hold.lease == info.releaser then
      lk.hold = nil
      top = hold.top
    end
    if user then
      user({ name = info.name, fence = info.fence, reason = info.reason, releaser = top })
    end
  end
end

--- RedisReentrantMutex.new(client, name [, options])
function M.new(client, name, opts)
  base.check_client(client, "new")
  base.check_name(name)
  local o = base.options_of(opts, 3, "new", client)
  local lk = base.new_record(Reentrant, client, name, 1, o, false)
  lk.on_lost = on_lost_of(lk, o.on_lost)
  return lk
end

-- The hold of coroutine 'co' on a new grant ('lease'), at depth 1: its
-- outermost level's releaser.
local function new_hold(lk, lease, co)
  local hold = { lease = lease, owner = co, depth = 1 }
  lk.hold = hold
  local top = new_level(lk, hold)
  hold.top = top
  return top
end

-- The acquisition of the running coroutine: one more level of its hold,
-- at once; or a new hold, through the gate and the Redis queue.  The
-- misuse errors at the user's line.
local function acquire(lk, limit, err, priority)
  check_open(lk.client)
  local co = running()
  local hold = current_hold(lk)
  if hold and hold.owner == co then
    hold.depth = hold.depth + 1
    return new_level(lk, hold)
  end
  if not isyieldable() then
    usage_error(checks.cannot_yield("acquire a Redis lock"))
  end
  return new_hold(lk, base.acquire(lk, limit, err, nil, lk.name, 1, priority), co)
end

function methods.acquire(self, priority)
  local lk, limit, err = check_self(self, Reentrant, "acquire")
  check_priority(priority, 1, "acquire")
  local release = acquire(lk, limit, err, priority)
  return release
end

function methods.runExclusive(self, fn, priority)
  local lk, limit, err = check_self(self, Reentrant, "runExclusive")
  base.check_fn(fn, 1)
  check_priority(priority, 2, "runExclusive")
  local release <close> = acquire(lk, limit, err, priority)
  local function finish(ok, ...)
    if not ok then
      release()
      error((...), 0)
    end
    if not release() and lease_now(release.hold.lease).state == "lost" then
      error(lk.lost_error, 0)
    end
    return ...
  end
  return finish(pcall(fn))
end

function methods.waitForUnlock(self, priority)
  local lk, limit, err = check_self(self, Reentrant, "waitForUnlock")
  check_priority(priority, 1, "waitForUnlock")
  base.check_usable(lk, "wait for a Redis lock")
  local hold = current_hold(lk)
  if hold and hold.owner == running() then
    usage_error("attempt to wait for a reentrant mutex that this coroutine holds"
      .. " (it would wait for itself)")
  end
  base.wait_for_unlock(lk, limit, err, lk.name, 1)
end

function methods.isLocked(self)
  local lk = check_self(self, Reentrant, "isLocked")
  base.check_usable(lk, "ask Redis")
  local used = base.state(lk, lk.name)
  return used >= 1
end

--- depth(): the levels this process's holder holds (0: no hold here).
function methods.depth(self)
  local hold = current_hold((check_self(self, Reentrant, "depth")))
  return hold and hold.depth or 0
end

--- isHeldByMe(): whether the running coroutine holds the lock.
function methods.isHeldByMe(self)
  local hold = current_hold((check_self(self, Reentrant, "isHeldByMe")))
  return hold ~= nil and hold.owner == running()
end

function methods.cancel(self)
  local lk = check_self(self, Reentrant, "cancel")
  base.cancel(lk, nil, nil)
end

--- steal([priority]): docs/redis-locks.md, "Steal".  The stealer holds at
-- depth 1; the hold it ended (of this process or another) loses every
-- level.  The coroutine holding it cannot steal it (it would hold it
-- twice), as a local ReentrantMutex refuses (docs/semantics.md, "Steal").
function methods.steal(self, priority)
  local lk, limit = check_self(self, Reentrant, "steal")
  check_priority(priority, 1, "steal")
  base.check_steal(lk, limit)
  local co = running()
  local hold = current_hold(lk)
  if hold and hold.owner == co then
    usage_error("attempt to steal a reentrant mutex that this coroutine holds"
      .. " (it would hold it twice)")
  end
  -- (the hold of another coroutine here was lost by the steal's answer,
  -- and its onLost cleared lk.hold)
  return new_hold(lk, base.redis_steal(lk, lk.name, 1), co)
end

function Reentrant.__query(self, key, n)
  local lk = check_self(self, Reentrant, "query")
  base.check_no_key(lk, key, n)
  local q = base.redis_query(lk, lk.name)
  -- this process's holder: the coroutine and its levels
  local hold = current_hold(lk)
  for _, e in ipairs(q.held) do
    if hold and e.owner == hold.lease.token then e.depth = hold.depth end
  end
  return q
end

function Reentrant.__tostring(lk)
  return format("async_mutex.RedisReentrantMutex (%s)", lk.name)
end

base.decorable(Reentrant)

return { RedisReentrantMutex = { new = M.new } }
