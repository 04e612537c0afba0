--- async_mutex.redis_rwlock: RedisRWLock, a readers-writer lock shared
-- through one Redis server, with the API of am.RWLock (docs/lockkinds.md,
-- RWLock; docs/redis-locks.md, "RedisRWLock").
--
-- It is the counting lock of redis_scripts.lua with a limit of WRITE: a
-- read weighs 1 and a write WRITE, so a read fits while no writer holds
-- and a write only when nobody does.  That structure's rules are then the
-- RWLock's: one FIFO queue across processes, whose head is granted while
-- it fits, so the readers at the head are granted together by one script
-- (each told by its own message), and a read that arrives while anyone is
-- queued (a writer) queues behind it.  Each read and write is a hold of its
-- own, with its own token, lease, watchdog and fence (one counter for
-- both: fences strictly increase across reads and writes).  downgrade is
-- one more script: the write's record becomes a read's, with a new fence,
-- and the readers at the head join in the same atomic step.

local core = require "async_mutex.core"
local base = require "async_mutex.redis_lock_base"
local scripts = require "async_mutex.redis_scripts"
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local uv = require "luv"

local error, pcall, setmetatable, tointeger, tonumber =
  error, pcall, setmetatable, math.tointeger, tonumber
local isyieldable = coroutine.isyieldable
local format = string.format
local hrtime = uv.hrtime
local typeerror = checks.typeerror
local check_open = checks.check_open
local check_self, check_priority, acquire, finish, check_fn =
  base.check_self, base.check_priority, base.acquire, base.finish, base.check_fn
local limited_read, limited_write = core.acquireRead, core.acquireWrite

-- A write's weight and the lock's limit: above any number of readers, and
-- exact in the scripts' doubles (WRITE + readers stays below 2^53).
local WRITE = 1 << 40

--- downgrade: ARGV token, limit, ttl.  The token's write hold (its record's
-- weight is the limit) becomes a read hold: weight 1, a new fence, a lease
-- of ttl from now; then the queue's head is dispatched (the readers there
-- join).  Returns {1, fence}, or 0 when the token holds no write (its
-- lease ended, or it was released).
local DOWNGRADE = scripts.PRELUDE .. [[
local token, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local u = held()
local g = redis.call('HGET', H, token)
local w, value = string.match(g or '', '^%d+ (%d+) %d+ (%-?%d+)$')
if not w or tonumber(w) ~= limit then
  keep()
  return 0
end
local fence = draw()
put(token, now + ttl, '1 ' .. fmt(fence) .. ' ' .. value)
expire_waiters()
dispatch(limit, u - limit + 1)
keep()
return {1, fmt(fence)}
]]

-- The write holds of this process (leases, weak): rw:release() ends the
-- oldest of them, and only a write can be downgraded.
local writes = setmetatable({}, { __mode = "k" })

local ENDED = "attempt to downgrade a write hold that has ended"

-- The write hold 'lease' becomes a read hold: one atomic script, and the
-- write releaser is spent (it returns false from then on); returns the
-- read releaser.  Called by releaser:downgrade() (redis_lock_base.lua).
-- A reply that does not come leaves Redis's state unknown
-- (a read hold, or still the write): the write is then taken as lost
-- (reason "unknown"), since it can no longer be trusted to exclude readers.
local function downgrade(lease)
  local lk = lease.lock
  if not writes[lease] then
    usage_error(base.NOT_A_WRITE_HOLD)
  end
  -- (the clock first: a close() in a hook of that luv call ends the hold)
  local now = hrtime()
  if lease.state == "held" and now >= lease.valid_until then base.lose(lease, "expired") end
  if lease.state == "lost" then error(lk.lost_error, 0) end
  if lease.state ~= "held" then usage_error(ENDED) end
  check_open(lk.client)
  if not isyieldable() then
    usage_error(checks.cannot_yield("downgrade a Redis write hold"))
  end
  -- (replicas: a downgrade is not confirmed by WAIT: lost in a failover,
  -- the promoted replica has the write hold instead of the read, which
  -- excludes more, and the read lease's renewals are confirmed)
  local sent = hrtime()
  local ok, r = pcall(base.eval, lk, DOWNGRADE, lease.keys, lease.token, lk.s_limit, lk.s_ttl)
  if not ok then
    base.lose(lease, "unknown")
    error(r, 0)
  end
  if lease.state ~= "held" then
    -- lost meanwhile by the local clock (or the client closed): the read
    -- hold Redis may have now ends with its lease, as a lost one does
    if lease.state == "lost" then error(lk.lost_error, 0) end
    if lk.hub.closed then error(base.CLOSED, 0) end   -- the close gave it back
    usage_error(ENDED)
  end
  if r == 0 then
    base.lose(lease, "refused")
    error(lk.lost_error, 0)
  end
  -- the write ends here without a request (Redis has the read now); the
  -- hub stays in use for the read hold.  The token is in flight until the
  -- read lease holds it, for a close() in a hook or finalizer of the calls
  -- between: the close gives it back, and the read is not handed out.
  local hub = lk.hub
  lease.state = "released"
  writes[lease] = nil
  hub.inflight[lease.token] = lease.keys
  base.open_gate(lease)             -- this process's readers may join it
  base.stop_timer(lease)
  base.forget(lease)
  local read = base.new_lease(lk, lease.keys, lease.token, tointeger(tonumber(r[2])), sent, lk.ttl)
  hub.inflight[lease.token] = nil
  if hub.closed then
    base.end_after_close(read)
    error(base.CLOSED, 0)
  end
  return read
end

local RW = { __name = "async_mutex.RedisRWLock" }
local methods = {}
RW.__index = methods

--- RedisRWLock.new(client, name [, options])
local function new(client, name, opts)
  base.check_client(client, "new")
  base.check_name(name)
  local o = base.options_of(opts, 3, "new", client)
  local lk = base.new_record(RW, client, name, WRITE, o, false)
  -- The local gate is a core RWLock, not a Mutex (redis_lock_base.lua):
  -- the readers of this process go to Redis together, each request in
  -- flight at once on the connection, where a Mutex let one through per
  -- round trip; a writer still goes alone, and a reader queues behind a
  -- writer waiting at the gate, so the local order is the RWLock's.
  lk.gate = core.dbg_internal(core.RWLock.new(o.cancel_error))
  lk.downgrade = downgrade
  return lk
end

-- A write's gate until its lease has it: opened by the close of a write
-- acquisition that raised (or whose coroutine was closed).
local GateUntilHeld = {
  __close = function(g)
    local release = g.release
    if release then
      g.release = nil
      release()
    end
  end,
}

-- The whole acquisition (base.acquire's, through the RWLock gate in the
-- request's mode): the gate, then Redis with what is left of the bound.
-- A read opens the gate once Redis granted it.  A write keeps it closed
-- until its hold ends (the lease opens it: redis_lock_lease.lua,
-- open_gate): no reader of this process could be granted beside it, and
-- one that went to Redis meanwhile queued there behind it, a request, a
-- place in the queue, a hand-off message and a wake-up each, where it
-- now waits at the gate and, let in by the release, is most often
-- granted at once beside the readers the release let in
-- (docs/redis-locks.md, "RedisRWLock").
local function rw_acquire(lk, limit, err, weight, priority)
  local deadline = base.deadline_of(limit)
  local gate = lk.gate
  local gate_release
  if weight == 1 then
    if limit == nil then gate_release = gate:acquireRead(priority)
    else gate_release = limited_read(gate, limit, err, priority) end
  elseif limit == nil then gate_release = gate:acquireWrite(priority)
  else gate_release = limited_write(gate, limit, err, priority) end
  if weight == 1 then
    local _ <close> = gate_release
    return base.redis_acquire(lk, lk.name, weight, deadline, err)
  end
  local g <close> = setmetatable({ release = gate_release }, GateUntilHeld)
  local lease = base.redis_acquire(lk, lk.name, weight, deadline, err)
  lease.gate, g.release = gate_release, nil
  -- ended already (a close() in a finalizer run by that allocation): it
  -- opened no gate, so the gate opens here
  if lease.state ~= "held" then base.open_gate(lease) end
  return lease
end

local function write(lk, limit, err, priority)
  local lease = rw_acquire(lk, limit, err, WRITE, priority)
  writes[lease] = true
  return lease
end

function methods.acquireRead(self, priority)
  local lk, limit, err = check_self(self, RW, "acquireRead")
  check_priority(priority, 1, "acquireRead")
  base.check_usable(lk, "acquire a Redis lock")
  local release = rw_acquire(lk, limit, err, 1, priority)
  return release
end

-- acquireWrite, and acquire under its own name: a RedisRWLock stands
-- wherever a RedisMutex is expected
local function write_method(name)
  return function(self, priority)
    local lk, limit, err = check_self(self, RW, name)
    check_priority(priority, 1, name)
    base.check_usable(lk, "acquire a Redis lock")
    local release = write(lk, limit, err, priority)
    return release
  end
end
methods.acquireWrite, methods.acquire = write_method("acquireWrite"), write_method("acquire")

function methods.runShared(self, fn, priority)
  local lk, limit, err = check_self(self, RW, "runShared")
  if not checks.is_callable(fn) then
    typeerror(1, "runShared", "function", fn)
  end
  check_priority(priority, 2, "runShared")
  base.check_usable(lk, "acquire a Redis lock")
  local release <close> = rw_acquire(lk, limit, err, 1, priority)
  return finish(lk, release, pcall(fn))
end

function methods.runExclusive(self, fn, priority)
  local lk, limit, err = check_self(self, RW, "runExclusive")
  check_fn(fn, 1)
  check_priority(priority, 2, "runExclusive")
  base.check_usable(lk, "acquire a Redis lock")
  local release <close> = write(lk, limit, err, priority)
  return finish(lk, release, pcall(fn))
end

--- waitForUnlock([priority]): until a write could be granted (nobody
-- holds, nobody queued), as locally.
function methods.waitForUnlock(self, priority)
  local lk, limit, err = check_self(self, RW, "waitForUnlock")
  check_priority(priority, 1, "waitForUnlock")
  base.check_usable(lk, "wait for a Redis lock")
  base.wait_for_unlock(lk, limit, err, lk.name, WRITE)
end

function methods.isLocked(self)
  local lk = check_self(self, RW, "isLocked")
  base.check_usable(lk, "ask Redis")
  return (base.state(lk, lk.name)) > 0
end

function methods.isWriteLocked(self)
  local lk = check_self(self, RW, "isWriteLocked")
  base.check_usable(lk, "ask Redis")
  return (base.state(lk, lk.name)) >= WRITE
end

--- readers(): how many read holds there are, of every process.
function methods.readers(self)
  local lk = check_self(self, RW, "readers")
  base.check_usable(lk, "ask Redis")
  local used = base.state(lk, lk.name)
  return used < WRITE and used or 0
end

--- release(): ends this process's oldest write hold, as rw:release()
-- does locally; false (and nothing done) when it has none.
function methods.release(self)
  local lk = check_self(self, RW, "release")
  local holds = lk.holds[lk.name]
  for i = 1, holds and #holds or 0 do
    if writes[holds[i]] then return base.release_lease(holds[i]) end
  end
  return false
end

function methods.cancel(self)
  local lk = check_self(self, RW, "cancel")
  base.cancel(lk, nil, nil)
end

--- steal([priority]) (a write hold), stealRead([priority]) (a read hold):
-- every hold in place ends, readers and writers alike (docs/redis-locks.md,
-- "Steal"); the readers at the queue's head join a read steal.
local function steal_method(name, weight)
  return function(self, priority)
    local lk, limit = check_self(self, RW, name)
    check_priority(priority, 1, name)
    base.check_steal(lk, limit)
    local release = base.redis_steal(lk, lk.name, weight)
    if weight == WRITE then writes[release] = true end
    return release
  end
end
methods.steal, methods.stealRead = steal_method("steal", WRITE), steal_method("stealRead", 1)

function RW.__query(self, key, n)
  local lk = check_self(self, RW, "query")
  base.check_no_key(lk, key, n)
  return base.redis_query(lk, lk.name, "rw")
end

function RW.__tostring(lk)
  return format("async_mutex.RedisRWLock (%s)", lk.name)
end

base.decorable(RW)

-- KeyedRedisRWLock ------------------------------------------------------
-- A RedisRWLock per key, named prefix .. key, with the gate of a keyed set
-- (a core KeyedMutex) and the multi-key requests of redis_multi.lua: the
-- API of am.KeyedRWLock.

local Keyed = { __name = "async_mutex.KeyedRedisRWLock" }
local keyed = {}
Keyed.__index = keyed

local check_key = base.check_key

--- KeyedRedisRWLock.new(client, prefix [, options])
local function new_keyed(client, prefix, opts)
  base.check_client(client, "new")
  base.check_prefix(prefix)
  local o = base.options_of(opts, 3, "new", client)
  local lk = base.new_record(Keyed, client, prefix, WRITE, o, true)
  lk.downgrade = downgrade
  return lk
end

local function keyed_write(lk, limit, err, key, name, priority)
  local lease = acquire(lk, limit, err, key, name, WRITE, priority)
  writes[lease] = true
  return lease
end

function keyed.acquireRead(self, key, priority)
  local lk, limit, err = check_self(self, Keyed, "acquireRead")
  local k = check_key(key, 1, "acquireRead", lk.name)
  check_priority(priority, 2, "acquireRead")
  base.check_usable(lk, "acquire a Redis lock")
  local release = acquire(lk, limit, err, key, lk.name .. k, 1, priority)
  return release
end

local function keyed_write_method(name)
  return function(self, key, priority)
    local lk, limit, err = check_self(self, Keyed, name)
    local k = check_key(key, 1, name, lk.name)
    check_priority(priority, 2, name)
    base.check_usable(lk, "acquire a Redis lock")
    local release = keyed_write(lk, limit, err, key, lk.name .. k, priority)
    return release
  end
end
keyed.acquireWrite, keyed.acquire = keyed_write_method("acquireWrite"), keyed_write_method("acquire")

function keyed.runShared(self, key, fn, priority)
  local lk, limit, err = check_self(self, Keyed, "runShared")
  local k = check_key(key, 1, "runShared", lk.name)
  if not checks.is_callable(fn) then
    typeerror(2, "runShared", "function", fn)
  end
  check_priority(priority, 3, "runShared")
  base.check_usable(lk, "acquire a Redis lock")
  local release <close> = acquire(lk, limit, err, key, lk.name .. k, 1, priority)
  return finish(lk, release, pcall(fn))
end

function keyed.runExclusive(self, key, fn, priority)
  local lk, limit, err = check_self(self, Keyed, "runExclusive")
  local k = check_key(key, 1, "runExclusive", lk.name)
  check_fn(fn, 2)
  check_priority(priority, 3, "runExclusive")
  base.check_usable(lk, "acquire a Redis lock")
  local release <close> = keyed_write(lk, limit, err, key, lk.name .. k, priority)
  return finish(lk, release, pcall(fn))
end

function keyed.waitForUnlock(self, key, priority)
  local lk, limit, err = check_self(self, Keyed, "waitForUnlock")
  local k = check_key(key, 1, "waitForUnlock", lk.name)
  check_priority(priority, 2, "waitForUnlock")
  base.check_usable(lk, "wait for a Redis lock")
  base.wait_for_unlock(lk, limit, err, lk.name .. k, WRITE)
end

-- (Each method checks its arguments itself: the errors are at the level
-- of the user's call.)
function keyed.isLocked(self, key)
  local lk = check_self(self, Keyed, "isLocked")
  local k = check_key(key, 1, "isLocked", lk.name)
  base.check_usable(lk, "ask Redis")
  return (base.state(lk, lk.name .. k)) > 0
end

function keyed.isWriteLocked(self, key)
  local lk = check_self(self, Keyed, "isWriteLocked")
  local k = check_key(key, 1, "isWriteLocked", lk.name)
  base.check_usable(lk, "ask Redis")
  return (base.state(lk, lk.name .. k)) >= WRITE
end

function keyed.readers(self, key)
  local lk = check_self(self, Keyed, "readers")
  local k = check_key(key, 1, "readers", lk.name)
  base.check_usable(lk, "ask Redis")
  local used = base.state(lk, lk.name .. k)
  return used < WRITE and used or 0
end

--- release(key): ends this process's oldest write hold of the key.
function keyed.release(self, key)
  local lk = check_self(self, Keyed, "release")
  local k = check_key(key, 1, "release", lk.name)
  local holds = lk.holds[lk.name .. k]
  for i = 1, holds and #holds or 0 do
    if writes[holds[i]] then return base.release_lease(holds[i]) end
  end
  return false
end

function keyed.cancel(self, key)
  local lk = check_self(self, Keyed, "cancel")
  if key == nil then return base.cancel(lk, nil, nil) end
  local k = check_key(key, 1, "cancel", lk.name)
  base.cancel(lk, key, lk.name .. k)
end

local function keyed_steal_method(name, weight)
  return function(self, key, priority)
    local lk, limit = check_self(self, Keyed, name)
    local k = check_key(key, 1, name, lk.name)
    check_priority(priority, 2, name)
    base.check_steal(lk, limit)
    local release = base.redis_steal(lk, lk.name .. k, weight)
    if weight == WRITE then writes[release] = true end
    return release
  end
end
keyed.steal, keyed.stealRead = keyed_steal_method("steal", WRITE),
  keyed_steal_method("stealRead", 1)

function Keyed.__query(self, key, n)
  local lk = check_self(self, Keyed, "query")
  local k = base.check_query_key(lk, key, n, "query")
  base.check_usable(lk, "query a Redis lock")
  return base.redis_query(lk, lk.name .. k, "rw")
end

function keyed.query(self, key)
  return Keyed.__query(self, key, 1)
end

function Keyed.__tostring(lk)
  return format("async_mutex.KeyedRedisRWLock (%s*)", lk.name)
end

local function mark_write(lease) writes[lease] = true end
require("async_mutex.redis_multi").install(keyed, Keyed, {
  { all = "acquireAll", run = "runExclusiveAll", weight = WRITE, on_lease = mark_write },
  { all = "acquireAllWrite", run = "runExclusiveAllWrite", weight = WRITE, on_lease = mark_write },
  { all = "acquireAllRead", run = "runSharedAll", weight = 1 },
})
keyed.runExclusiveAllWrite = nil      -- (runExclusiveAll writes)

base.decorable(Keyed)

return { RedisRWLock = { new = new }, KeyedRedisRWLock = { new = new_keyed } }
