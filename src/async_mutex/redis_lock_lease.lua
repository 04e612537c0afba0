--- async_mutex.redis_lock_lease: the leases of the Redis locks (a part of
-- async_mutex.redis_lock_base, which the kinds require): a lease is the
-- releaser of one grant, renewed by its timer, lost when Redis no longer
-- has it; and what a client's close does to the holds of its locks (ended
-- here, given back in Redis on a connection of their own).  The lease
-- vocabulary (E_LOST, releasers returning booleans, check) is the one of
-- docs/semantics.md, "Leases and lost holds".  Private.

local scripts = require "async_mutex.redis_scripts"
local uv = require "luv"
local hub_m = require "async_mutex.redis_lock_hub"

local redis_internal = require("async_mutex.redis")._internal
local rcore = require "async_mutex.redis_core"
local close_handle, run_script, is_client =
  redis_internal.close_handle, redis_internal.run_script, redis_internal.is_client
local alive = rcore.alive

local getmetatable, ipairs, pairs, pcall, setmetatable, tostring =
  getmetatable, ipairs, pairs, pcall, setmetatable, tostring
local isyieldable = coroutine.isyieldable
local huge, max, floor, ceil = math.huge, math.max, math.floor, math.ceil
local format = string.format
local hrtime, update_time = uv.hrtime, uv.update_time

local NS, eval, send_release, release_token, background, hub_unuse, replicated,
      unsubscribe_if_idle =
  hub_m.NS, hub_m.eval, hub_m.send_release, hub_m.release_token, hub_m.background,
  hub_m.hub_unuse, hub_m.replicated, hub_m.unsubscribe_if_idle

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error, typeerror, typename = checks.usage_error, checks.typeerror, checks.typename

-- {========================================================== leases
-- A lease is the releaser of one grant: callable and to-be-closed, with
-- check() and the fencing token.  Its validity is kept on the local
-- monotonic clock: it ends 'ttl' minus a drift allowance after the request
-- that last set it was sent.  One timer per lease fires at the next
-- renewal or at the end of validity, whichever comes first.  Timers are
-- kept for the next lease once stopped (a stopped timer keeps no loop
-- running), so that a cycle of acquire and release makes no handle.

local Lease = { __name = "async_mutex.RedisReleaser" }
local lease_methods = {}
Lease.__index = lease_methods

local function drift(ttl) return ttl // 100 + 2 end

local report                        -- reports an error of onLost

-- A timer's callback is made with the timer and finds its lease in
-- 'owner' (weak values): a spare timer holds no lease, so no lock or client
-- is kept alive by it.
local spare_timers, SPARE_MAX = {}, 64
local owner, fire_of = setmetatable({}, { __mode = "v" }), {}

local function stop_timer(lease)
  local t = lease.timer
  if t then
    lease.timer = nil
    owner[t] = nil
    t:stop()
    local n = #spare_timers
    if n < SPARE_MAX then
      spare_timers[n + 1] = t
    else
      fire_of[t] = nil
      close_handle(t)
    end
  end
end

-- A RedisRWLock's write hold keeps its process's gate (redis_rwlock.lua,
-- rw_acquire) until it ends: opened here, wherever a hold ends (released,
-- lost, downgraded, ended by a close).
local function open_gate(lease)
  local g = lease.gate
  if g then
    lease.gate = nil
    g()
  end
end

local function forget(lease)
  local name = lease.keys.name
  local holds = lease.lock.holds[name]
  if holds then
    for i = 1, #holds do
      if holds[i] == lease then table.remove(holds, i); break end
    end
    -- a plain lock keeps its empty list for the next grant (one table
    -- less per acquisition); a keyed set's key gives its list up
    if #holds == 0 and name ~= lease.lock.name then
      lease.lock.holds[name] = nil
    end
  end
end

-- Leases lost here that Redis may still have (ended by the local clock,
-- or a downgrade whose answer never came): their holder's release gives
-- them back, once (give_back_lost).  Keyed weakly: a lease nobody
-- releases runs out in Redis.
local unreturned = setmetatable({}, { __mode = "k" })

-- The hold is lost: tell the holder's onLost.  Redis is not asked to end
-- it.  A lease that ended by the local clock may still run in Redis for
-- up to the drift allowance (its local end comes first), or for a whole
-- ttl (a renewal that Redis ran, answered after the local end), and a
-- release then would let the next process in while this one, told only
-- by onLost or check(), may still be in its section: it is given back by
-- its holder's release (release_lease), whoever saw the loss first.  A
-- refused or stolen one is no longer in Redis.
local function lose(lease, reason)
  if lease.state ~= "held" then return end
  lease.state = "lost"
  if reason ~= "refused" and reason ~= "stolen" then unreturned[lease] = true end
  open_gate(lease)
  stop_timer(lease)
  forget(lease)
  local lk = lease.lock
  hub_unuse(lk.hub)
  local keys = lease.keys
  if lk.on_lost then
    local ok, err = pcall(lk.on_lost, { name = keys.name, fence = lease.fence,
                                        reason = reason, releaser = lease })
    if not ok then report(err) end
  end
end

-- A steal ended the hold of 'token' whose fence is 'fence' (its message,
-- or the stealer's answer in this process): that hold of this client, if
-- it still has it, is lost.  The fence tells it from a later grant of the
-- same token (a waiter that asked again after the steal: a larger fence).
local function stolen(hub, token, fence)
  for lk in pairs(hub.locks) do
    for _, holds in pairs(lk.holds) do
      for i = 1, #holds do
        local lease = holds[i]
        if lease.token == token and lease.fence == fence then
          return lose(lease, "stolen")
        end
      end
    end
  end
end

function report(err)
  io.stderr:write("async_mutex: error in onLost: ", tostring(err), "\n")
end

local arm                           -- (re)starts a lease's timer

local function renew(lease)
  local lk = lease.lock
  local sent = hrtime()
  lease.next_renew = lk.renew > 0 and sent + lk.renew * NS or nil
  local ok, r = pcall(eval, lk, scripts.renew, lease.keys, lease.token, lk.s_limit, lk.s_ttl)
  if lease.state ~= "held" then return end
  -- (replicas: a renewal not confirmed extends nothing; tried again as
  -- an unreachable one is)
  if ok and r == 1 and lk.replicas then ok = replicated(lk) end
  if lease.state ~= "held" then return end
  if ok and r == 1 then
    lease.valid_until = max(lease.valid_until, sent + (lk.ttl - drift(lk.ttl)) * NS)
    arm(lease)
  elseif ok then
    lose(lease, "refused")          -- Redis no longer has our token
  elseif not lease.next_renew then
    -- Unreachable, and no watchdog: the one renewal of a hand-off's short
    -- first lease failed.  Tried again halfway to the lease's end (one
    -- transient failure ended the hold at waiterTimeout instead of ttl).
    local t = hrtime()
    if t < lease.valid_until then
      lease.next_renew = t + (lease.valid_until - t) / 2
      arm(lease)
    end
  end                               -- unreachable: try again at the next turn
end

local function on_timer(lease)
  if lease.state ~= "held" then return end
  local t = hrtime()
  if t >= lease.valid_until then
    return lose(lease, "expired")
  end
  if lease.next_renew and t >= lease.next_renew then
    background(renew, lease)
  end
  arm(lease)
end

function arm(lease)
  if lease.state ~= "held" then return end
  local due = lease.valid_until
  if lease.next_renew and lease.next_renew < due then due = lease.next_renew end
  local ms = max(0, (due - hrtime()) / NS)
  local t = lease.timer
  if not t then
    local n = #spare_timers
    if n > 0 then
      t = spare_timers[n]
      spare_timers[n] = nil
    else
      local new = uv.new_timer()
      fire_of[new] = function()
        local l = owner[new]
        if l then on_timer(l) end
      end
      t = new
    end
    lease.timer = t
    owner[t] = lease
  end
  t:start(floor(ms) + (ms % 1 > 0 and 1 or 0), 0, fire_of[t])
  -- ended by a close() in a hook of the luv calls above: its timer must not
  -- run (it would keep uv.run() from returning)
  if lease.state ~= "held" then
    if lease.timer == t then stop_timer(lease) else t:stop() end
  end
end

-- 'first' is the length of the lease Redis granted: the ttl, or for a
-- hand-off the shorter first lease (redis_scripts.lua, N:c), renewed after
-- a third of it whatever the watchdog's setting.
-- A lease has eight fields at most (lock, keys, token, fence, state,
-- valid_until, next_renew, timer), so that its table has no larger hash
-- part: the lock's name and ":free" channel are in its keys' list.  (A
-- RedisRWLock's write hold has a ninth, its gate: open_gate.)
local function new_lease(lk, keys, token, fence, sent, first)
  local next_renew
  if first < lk.ttl then next_renew = sent + (first // 3) * NS
  elseif lk.renew > 0 then next_renew = sent + lk.renew * NS end
  local lease = setmetatable({
    lock = lk, keys = keys, token = token, fence = fence, state = "held",
    valid_until = sent + (first - drift(first)) * NS,
    next_renew = next_renew,
  }, Lease)
  local name = keys.name
  local holds = lk.holds[name]
  if not holds then holds = {}; lk.holds[name] = holds end
  holds[#holds + 1] = lease
  arm(lease)
  return lease
end

-- A hold made after its client's close, by a finalizer or a hook at an
-- allocation or a luv call of new_lease: it was not among the holds the
-- close ended (the close gave its token back all the same), so it ends
-- here as they did.  The caller then raises CLOSED.
local function end_after_close(lease)
  if lease.state == "held" then
    lease.state = "released"
    open_gate(lease)
    stop_timer(lease)
    forget(lease)
    local hub = lease.lock.hub
    hub.users = hub.users - 1
  end
end

-- Ends the hold: true if this call ended it, false if it had already been
-- given back or lost (docs/semantics.md, "Leases and lost holds").  In a
-- coroutine that can yield (<close> included) the call waits for Redis's
-- answer, so that a hold Redis no longer had is reported lost (false,
-- onLost).  Where it cannot yield, the release is sent without waiting: it
-- is written before any later request of this client.  A release that
-- cannot reach Redis still returns true: the hold ended here, and ends in
-- Redis with its lease.  A close() while the release is in flight sends
-- it again (client_closed).  A lease that ended by the local clock is
-- lost (lose), and given back in Redis all the same, in the background:
-- Redis may have it still (a renewal it ran whose answer came after the
-- local end), and its holder is done with it, so others need not wait
-- for it to run out there (spec 45).  So is one lost so before the
-- release (its timer at the local end, check()): once.  The token is
-- this grant's alone: the give-back removes nothing of anyone else's.
local function give_back_lost(lease)
  if not unreturned[lease] then return end
  unreturned[lease] = nil
  local lk = lease.lock
  if not lk.hub.closed then background(release_token, lk, lease.keys, lease.token) end
end

local function release_lease(lease)
  -- (the clock first: a close() in a hook of that luv call ends the hold)
  local now = hrtime()
  if lease.state ~= "held" then
    give_back_lost(lease)               -- (lost before: by its timer, check(), ...)
    return false
  end
  if now >= lease.valid_until then
    lose(lease, "expired")
    give_back_lost(lease)               -- (nil already if onLost released it)
    return false
  end
  lease.state = "released"
  local lk, keys = lease.lock, lease.keys
  -- In flight from here on, for a close() in a hook of the calls below:
  -- the lease is no longer among the holds it gives back (send_release)
  lk.hub.inflight[lease.token] = keys
  -- (the readers it lets in run from the next loop turn: their requests
  -- follow this release on the connection)
  open_gate(lease)
  stop_timer(lease)
  forget(lease)
  if not isyieldable() then
    hub_unuse(lk.hub)
    background(send_release, lk, keys, lease.token)
    return true
  end
  -- The hub stays in use until the answer, so that a coroutine that
  -- acquires again at once keeps the subscription.
  local ok, r = send_release(lk, keys, lease.token)
  if ok and r == 0 then
    lease.state = "held"            -- so that lose() reports it
    lose(lease, "refused")
    return false
  end
  -- (replicas: the release reaches them before it returns, so that a
  -- failover just after it does not bring the hold back; not confirmed,
  -- the hold ended all the same, and a copy of it runs out with its lease)
  if ok and lk.replicas then replicated(lk) end
  hub_unuse(lk.hub)
  return true
end

Lease.__call = release_lease
Lease.__close = release_lease

-- {---------------------------------------------------------- give-back
-- What a closed client had in Redis (holds, places in queues, releases and
-- withdrawals cut off by the close) is given back on a connection of its
-- own to the same server, one loop turn after the close, and that
-- connection is closed once every release is answered, or after the
-- client's commandTimeout.  Without it the other processes waited for the
-- leases to run out (ttl, 30 s by default) and for dead waiters to be
-- skipped (waiterTimeout).  The loop turn: close() may come from a
-- finalizer at lua_close, where no connection may be made (its client
-- would never be finalized: a leak); the timer, made long before
-- (get_hub), is then finalized already or never runs.  Nor may the job
-- run when the script ends after close() (no uv.run() again) and
-- lua_close runs the loop once to complete pending handle closes
-- (close_handle's guards, in redis.lua): each job has a sentinel, made
-- after those guards, whose finalizer (run first, newest first) marks the
-- job dead.

local giveback_jobs = {}
-- The connections giving back, until done: nothing else may reference
-- them (a client whose calls wait is collected with them when nothing
-- does, spec 42), and the give-back would end unsent.
local giving = {}                    -- luacheck: ignore 241 (an anchor)

-- Sends the release of every {keys, token} of 'items' on a new connection
-- to the server of 'client' (closed), in coroutines of their own.
local function give_back(client, items)
  local c, ms
  if is_client(client) then
    c, ms = redis_internal.sibling(client), rcore.state(client).commandTimeout
  else                                  -- a cluster client: a new one
    c, ms = hub_m.cluster().sibling(client)
  end
  local left, bound = #items, nil
  local function finish()
    giving[c] = nil
    c:close()
    if bound then
      close_handle(bound)
      bound = nil
    end
  end
  if ms ~= huge then
    bound = uv.new_timer()
    update_time()                     -- (a full commandTimeout from now)
    bound:start(ceil(ms), 0, finish)
  end
  giving[c] = true
  for i = 1, #items do
    local keys, token = items[i][1], items[i][2]
    background(function()
      -- an unreachable server, or the bound: the lease ends in Redis
      if is_client(c) then
        pcall(run_script, c, scripts.release, keys, token, keys.limit)
      else
        pcall(c.eval, c, scripts.release, keys, { token, keys.limit })
      end
      left = left - 1
      if left == 0 then finish() end
    end)
  end
end

local function on_giveback()
  local jobs = giveback_jobs
  giveback_jobs = {}
  -- (nil: inside a finalizer, Lua 5.4.4 and later: lua_close's loop run)
  if collectgarbage("isrunning") == nil then return end
  for i = 1, #jobs do
    local job = jobs[i]
    if not job.dead then give_back(job[1], job[2]) end
  end
end

local SENTINEL = { __gc = function(s) s.job.dead = true end }
-- }----------------------------------------------------------

-- client:close() ends every hold of the client's locks here, as a release
-- that cannot reach Redis does (docs/redis-locks.md, "Closing the
-- client"): the releaser returns false from then on, check() false, and
-- nobody is told it was lost; then the holds are given back in Redis
-- (give_back), so that the next process need not wait for the lease.
-- Its timer stops: no renewal can be sent on a closed client, and a timer
-- left running would keep uv.run() from returning until the lease ran
-- out.  Waiters (in the Redis queue, in waitForUnlock) are woken and raise
-- E_UNAVAILABLE, as the client's waiting calls do, and leave the Redis
-- queue with the give-back; later ones (queued at the lock's gate) raise
-- it when their turn comes.
--
-- close() may also come from a finalizer at lua_close, after luv has freed
-- some of the handles (docs/redis.md, "Closing and exiting"): a lease's
-- timer that luv has finalized is dropped, not stopped, the hub's
-- subscription is ended here rather than by the idle timer, and nothing
-- is given back (a finalized timer, or one that never runs again).
local function client_closed(hub)
  hub.closed = true
  local items, seen = {}, {}
  local function give(keys, token)
    if not seen[token] then
      seen[token] = true
      items[#items + 1] = { keys, token }
    end
  end
  for token, keys in pairs(hub.inflight) do give(keys, token) end
  for token, w in pairs(hub.waiters) do give(w.keys, token) end
  for lk in pairs(hub.locks) do
    local ended = {}
    for _, holds in pairs(lk.holds) do
      for i = 1, #holds do ended[#ended + 1] = holds[i] end
    end
    for _, lease in ipairs(ended) do
      if lease.state == "held" then
        lease.state = "released"
        open_gate(lease)
        local t = lease.timer
        if t and not alive(t) then
          lease.timer, owner[t], fire_of[t] = nil, nil, nil
        end
        stop_timer(lease)
        forget(lease)
        hub.users = hub.users - 1
        give(lease.keys, lease.token)
      end
    end
  end
  local giveback_timer = hub_m.giveback_timer()   -- (made by get_hub)
  if items[1] and alive(giveback_timer) then
    local job = { hub.client, items }
    job.sentinel = setmetatable({ job = job }, SENTINEL)
    giveback_jobs[#giveback_jobs + 1] = job
    giveback_timer:start(0, 0, on_giveback)
  end
  unsubscribe_if_idle(hub)
  for _, w in pairs(hub.waiters) do
    if w.bell then w.bell:release() end
  end
  for bell in pairs(hub.unlockers) do bell:release() end
end

--- releaser:check(): raises the lost error if the hold was lost; true while
-- it is held, false once it was given back.
function lease_methods.check(lease)
  if getmetatable(lease) ~= Lease then
    typeerror(1, "check", "async_mutex.RedisReleaser", lease)
  end
  if lease.state == "held" and hrtime() >= lease.valid_until then
    lose(lease, "expired")
  end
  if lease.state == "lost" then error(lease.lock.lost_error, 0) end
  return lease.state == "held"
end

--- releaser:downgrade(): the write hold of a readers-writer lock becomes
-- a read hold (its lock record's 'downgrade', redis_rwlock.lua); refused
-- for any other releaser, as the local releasers refuse it (src/core/kinds/rwlock.c).
local NOT_A_WRITE_HOLD =
  "attempt to downgrade a releaser that is not a readers-writer lock's write hold"
function lease_methods.downgrade(lease)
  local down = getmetatable(lease) == Lease and lease.lock.downgrade
  if not down then usage_error(NOT_A_WRITE_HOLD) end
  return down(lease)
end

--- releaser:upgrade(): not offered, as locally: two readers that both
-- upgrade would each wait for the other's read hold to end.
function lease_methods.upgrade(lease)
  if typename(lease) ~= "async_mutex.RedisReleaser" then
    typeerror(1, "upgrade", "async_mutex.RedisReleaser", lease)
  end
  usage_error("attempt to upgrade a read hold: not offered (two upgraders would deadlock);"
    .. " release it, then acquireWrite")
end

function Lease.__tostring(lease)
  return format("async_mutex.RedisReleaser (%s, fence %d, %s)", lease.keys.name,
                lease.fence, lease.state)
end

-- }==========================================================

return {
  Lease = Lease, lease_methods = lease_methods, drift = drift,
  lose = lose, forget = forget, stolen = stolen, new_lease = new_lease,
  release_lease = release_lease, stop_timer = stop_timer, open_gate = open_gate,
  end_after_close = end_after_close, client_closed = client_closed,
  NOT_A_WRITE_HOLD = NOT_A_WRITE_HOLD,
}
