--- async_mutex.redis_lock_base: the machinery every Redis lock shares
-- (RedisMutex, RedisSemaphore and KeyedRedisMutex in redis_lock.lua, and
-- the kinds built on them): the hub of each client, leases, the give-back
-- at close, the eviction check, the Redis half of an acquisition, and the
-- helpers of the lock records.  The rules are in docs/redis-locks.md; the
-- lease vocabulary (E_LOST, releasers returning booleans, check) is the
-- one of docs/semantics.md, "Leases and lost holds".
--
-- Each lock has two halves:
-- * a local gate (a core Mutex, or a core KeyedMutex for keyed sets): the
--   coroutines of this process that want the lock queue there, by priority
--   then arrival, and only the gate's holder talks to Redis.  So the
--   process holds at most one place in the Redis queue per lock name, and
--   withTimeout, tryAcquire and cancel work on the local queue as usual;
-- * the state in Redis, changed only by the scripts of
--   async_mutex.redis_scripts: holders with leases, a FIFO queue of
--   processes, a counter for fencing tokens.  A release hands the lock to
--   the queue's head and wakes its process with one PUBLISH on the
--   process's channel (one per client, see 'hub' below).
-- The gate is released as soon as Redis granted (or refused) the lock, so
-- the next local coroutine joins the Redis queue at once, behind the
-- processes that came before it.


local am = require "async_mutex"
local core = require "async_mutex.core"
local scripts = require "async_mutex.redis_scripts"
local uv = require "luv"

-- The client's Lua layer owns the helpers the locks share: closing a luv
-- handle safely at exit (docs/redis.md, "Closing and exiting"), running a
-- script (EVALSHA, EVAL on NOSCRIPT), telling its clients, and others.
local redis_internal = require("async_mutex.redis")._internal
local rcore = require "async_mutex.redis_core"
local close_handle, run_script, is_client =
  redis_internal.close_handle, redis_internal.run_script, redis_internal.is_client

-- The cluster client's (async_mutex.redis_cluster, loaded by a cluster's
-- connect): its '_internal' once a cluster client exists, and the test.
local cluster
local function is_cluster(client)
  if not cluster then
    local mod = package.loaded["async_mutex.redis_cluster"]
    if not mod then return false end
    cluster = mod._internal
  end
  return cluster.is_cluster(client)
end
local alive = rcore.alive

local error, getmetatable, ipairs, pairs, pcall, setmetatable,
      tonumber, tostring, type =
  error, getmetatable, ipairs, pairs, pcall, setmetatable,
  tonumber, tostring, type
local co_create, co_resume, isyieldable, running =
  coroutine.create, coroutine.resume, coroutine.isyieldable, coroutine.running
local huge, min, max, floor, ceil, tointeger =
  math.huge, math.min, math.max, math.floor, math.ceil, math.tointeger
local format = string.format
local hrtime, update_time = uv.hrtime, uv.update_time
local limited = core.acquire
-- The locks made here (gates, bells) are the library's own: debug mode
-- does not watch them (docs/debug.md, Deadlocks).
local internal = core.dbg_internal

local E_LOST, E_UNAVAILABLE = am.E_LOST, am.E_UNAVAILABLE
-- What a request cut off by its client's close raises: the E_UNAVAILABLE
-- whose reason says so, as the client's own calls cut off that way
-- (docs/redis.md, Failures)
local CLOSED = require("async_mutex.unavailable").new("client closed")

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local typename, is_callable, argerror, unknown_option, check_open =
  checks.typename, checks.is_callable, checks.argerror, checks.unknown_option, checks.check_open



-- A fresh 128-bit token from the system's cryptographic source, as 32 hex
-- digits: /dev/urandom read through a buffered file, 4 KB at a time (one
-- read(2) and one hex conversion, in C, serve 128 tokens; uv.random costs
-- a getrandom(2) call each, about 8 us here), or uv.random where
-- /dev/urandom cannot be opened.  Each byte read is used once.
local urandom = io.open("/dev/urandom", "rb")
local hex_pool, hex_at = "", 1
local to_hex = rcore.hex
local function random_hex()
  if hex_at > #hex_pool then
    local bytes = urandom and urandom:read(4096)
    if not bytes or #bytes ~= 4096 then bytes = uv.random(4096) end
    hex_pool, hex_at = to_hex(bytes), 1
  end
  local s = hex_pool:sub(hex_at, hex_at + 31)
  hex_at = hex_at + 32
  return s
end

-- Runs fn(...) in a coroutine of its own and returns at its first yield:
-- requests whose result nobody waits for (releases, withdrawals,
-- renewals).  Errors are dropped: each caller says why that is safe.
local function background(fn, ...)
  local co = co_create(fn)
  co_resume(co, ...)
end

-- For the locks with `replicas` (their WAIT, below), per coroutine, of its
-- last script: on a cluster, the node's client that ran it; the epoch of
-- the connection it ran on (rcore.epoch).  Keyed weakly: a coroutine's
-- entries go with it.
local wrote_on = setmetatable({}, { __mode = "k" })
local wrote_at = setmetatable({}, { __mode = "k" })
local epoch = rcore.epoch

-- Runs a script of redis_scripts for the lock record lk: an
-- async_mutex.redis client takes the keys' list and the args as values (no
-- table per request), another client goes through its eval.
-- A reply that comes back after close() (a script's first run is EVAL,
-- then SCRIPT LOAD, and the client may be closed between the two) is an
-- E_UNAVAILABLE like any call the close cut off: a grant then is not
-- turned into a lease after the client's holds were ended (its lease
-- runs out in Redis).
local function eval(lk, script, keys, ...)
  if lk.direct then
    local r = run_script(lk.client, script, keys, ...)
    if lk.hub.closed then error(CLOSED, 0) end
    if lk.replicas then wrote_at[running()] = epoch(lk.client) end
    return r
  elseif lk.cluster then           -- (docs/redis-locks.md, "On a cluster")
    local r, node = cluster.script(lk.client, script, keys, ...)
    if lk.hub.closed then error(CLOSED, 0) end
    -- (replicas: the WAIT that confirms it goes to the node that ran it)
    if lk.replicas then
      local co = running()
      wrote_on[co], wrote_at[co] = node, epoch(node)
    end
    return r
  end
  return lk.client:eval(script, keys, { ... })
end

-- Runs the release script for 'token' (a hold, or a waiter leaving the
-- queue: the script removes either), with the lock's limit from its keys'
-- list.  The hub knows the token until the answer, so that a close() that
-- cuts the request off gives it back all the same (client_closed).
-- Returns pcall's results: an unreachable Redis is not an error here
-- (each caller says why).  send_release: the same, for a token the caller
-- has put in 'inflight' already.
local function send_release(lk, keys, token)
  local ok, r = pcall(eval, lk, lk.release_script, keys, token, keys.limit)
  lk.hub.inflight[token] = nil
  return ok, r
end

local function release_token(lk, keys, token)
  lk.hub.inflight[token] = keys
  return send_release(lk, keys, token)
end


-- {========================================================== hub
-- One hub per client: the channel on which this process's waiters are told
-- of hand-offs, one subscription to it for every lock of the client, and
-- the waiters by token.  The subscription exists while a lock of the client
-- is held or waited for (so that an idle client keeps no handle active and
-- uv.run() can return); it is dropped one loop turn after the last use.

local hubs = setmetatable({}, { __mode = "k" })

-- 'ended': no grant of this waiter with a fence up to it can be taken:
-- each ended before a request that found the waiter not holding (the n of
-- that request's answer, see ask), and its message may still come: the
-- fences of later grants are larger.  For the same reason a message read
-- while the waiter has one already (of a grant that a request in flight
-- may find ended) replaces it when its fence is larger.
local stolen                         -- (hub, token, fence): below, with the leases

local function on_message(hub, message)
  local token, fence, value = message:match("^(%S+) (%d+) (%-?%d+)$")
  if not token then
    -- a steal ended the hold (token, fence) of this process
    token, fence = message:match("^(%S+) (%d+) lost$")
    if token then stolen(hub, token, tointeger(tonumber(fence))) end
    return
  end
  local w = hub.waiters[token]
  if w then
    fence = tointeger(tonumber(fence))
    if (w.ended and fence <= w.ended) or (w.fence and fence <= w.fence) then return end
    w.fence, w.value = fence, tointeger(tonumber(value))
    -- a waiter that sleeps has a bell: its coroutine is resumed by the core
    if w.bell then w.bell:release() end
  end
end

local client_closed                  -- (hub): close() was called, below

local giveback_timer                 -- made with the first hub, see give_back

-- The hub of a client: its channel, its waiters by token, its locks (weak:
-- to end their holds at close), the bells of its waitForUnlock calls, the
-- keys of its tokens whose release is in flight (release_token), and what
-- the server on its connection may do to the locks' keys ('evicts': nil
-- not read yet, false safe, or the policy, see eviction()).
local function get_hub(client)
  local hub = hubs[client]
  if not hub then
    local id = random_hex()
    hub = { client = client, id = id, channel = "async_mutex:" .. id,
            waiters = {}, users = 0, sub = nil, sub_gate = internal(core.Mutex.new()),
            idle_timer = nil, locks = setmetatable({}, { __mode = "k" }),
            unlockers = {}, closed = false, inflight = {},
            evicts = false, evicts_gate = nil, warned = false, ssubs = {} }
    hubs[client] = hub
    -- Made here, by the program's own code: close() may come from a
    -- finalizer at lua_close, where no handle may be made any more.
    if not giveback_timer then giveback_timer = uv.new_timer() end
    -- Our own client says when it is closed (docs/redis.md, "Closing and
    -- exiting") and when it has a new connection; another client object
    -- cannot, and its locks learn of a close at their next request (and
    -- do not read the eviction policy).  The callbacks hold the hub
    -- weakly: the client's state is reachable from luv (its timer's
    -- callback), and the hub holds the client, which must stay
    -- collectable (spec 70).
    if is_client(client) then
      local ref = setmetatable({ hub }, { __mode = "v" })
      local state = rcore.state(client)
      state.on_close = function()
        local hb = ref[1]
        if hb then client_closed(hb) end
      end
      -- the server's policy is read again on each connection (a restart
      -- or another server behind the address may have changed it)
      state.on_connected = function()
        local hb = ref[1]
        if hb then hb.evicts, hb.warned, hb.started = nil, false, nil end
      end
      hub.evicts, hub.evicts_gate = nil, internal(core.Mutex.new())
    elseif is_cluster(client) then
      -- a cluster client (async_mutex.redis_cluster) says when it is closed
      local ref = setmetatable({ hub }, { __mode = "v" })
      client.on_close = function()
        local hb = ref[1]
        if hb then client_closed(hb) end
      end
    end
  end
  return hub
end

local function unsubscribe_if_idle(hub)
  if hub.users == 0 and hub.sub then
    local sub = hub.sub
    hub.sub = nil
    sub:unsubscribe()               -- never waits
  end
  if hub.users == 0 and hub.ssubs and next(hub.ssubs) then     -- (a cluster's)
    local ssubs = hub.ssubs
    hub.ssubs = {}
    for _, sub in pairs(ssubs) do sub:unsubscribe() end
  end
end

local function hub_use(hub)
  hub.users = hub.users + 1
end

-- One idle timer for every hub, made once and kept (stopped, it keeps no
-- loop running): a process that takes a contended lock over and over
-- starts it at every release.  The hubs to check are held weakly, and the
-- timer's callback holds no hub, so that an unreferenced client (and its
-- hub) can still be collected.
local idle_hubs = setmetatable({}, { __mode = "k" })
local idle_timer

local function on_idle()
  for hub in pairs(idle_hubs) do
    idle_hubs[hub] = nil
    unsubscribe_if_idle(hub)
  end
end

local function hub_unuse(hub)
  hub.users = hub.users - 1
  if hub.users == 0 and (hub.sub or hub.ssubs and next(hub.ssubs)) then
    idle_hubs[hub] = true
    if not idle_timer then idle_timer = uv.new_timer() end
    idle_timer:start(0, 0, on_idle)
  end
end

-- Whether this process listens on the hand-off channel `ch` of the hub
-- (nil: the hub's channel; on a cluster, one of its shard channels).
local function subscribed(hub, ch)
  if ch then return hub.ssubs[ch] ~= nil end
  return hub.sub ~= nil
end

-- Makes sure this process is subscribed to the hub's channel (or, on a
-- cluster, to its shard channel `ch`); yields for the subscription when
-- there is none yet.
local function subscribe(hub, ch)
  if subscribed(hub, ch) then return end
  local release <close> = hub.sub_gate:acquire()
  -- closed while the coroutine before us subscribed (whether or not it
  -- got the subscription): a waiter's error, not the closed client's
  -- misuse error from our next request
  if hub.closed then error(CLOSED, 0) end
  if subscribed(hub, ch) then return end
  local fn = hub.on_message
  if not fn then
    fn = function(message) on_message(hub, message) end
    redis_internal.direct_callbacks[fn] = true   -- it never yields: no coroutine
    hub.on_message = fn
  end
  if ch then
    local sub = hub.client:ssubscribe(ch, fn)
    if hub.ssubs[ch] then sub:unsubscribe() else hub.ssubs[ch] = sub end
  else
    hub.sub = hub.client:subscribe(hub.channel, fn)
  end
end

-- }==========================================================


-- {========================================================== replicas
-- The option `replicas = N` (docs/redis-locks.md, "Scaling out"): a
-- grant, a renewal and a release are confirmed by `WAIT N timeout` on the
-- client's connection (on a cluster, the lock's master's), which returns
-- once every write made on it so far (the script's) has reached N
-- replicas, or at the timeout with the count that has.  The timeout
-- stays within the client's commandTimeout (the connection is blocked
-- meanwhile: its timer would fail it) and a quarter of the lease.
-- Returns true, or false and why not (E_UNAVAILABLE's reason).
local function replicated(lk)
  local c = lk.client
  -- On a cluster, WAIT goes on the connection of the master that ran the
  -- script (the caller's last, in this coroutine): WAIT counts the writes
  -- of its own connection only, and another node's would confirm at once
  -- (docs/redis-locks.md, "On a cluster").
  local co = running()
  if lk.cluster then c = wrote_on[co] end
  local ok, n = pcall(c.call, c, "WAIT", lk.s_replicas, lk.s_wait_for)
  if not ok then
    return false, type(n) == "table" and n.reason or tostring(n)
  end
  -- A WAIT on a later connection than the script's (the server ended that
  -- one after its reply, and this call made a new one) counts no write,
  -- and would confirm at once a write that may be on no replica.
  if epoch(c) ~= wrote_at[co] then
    return false, "the connection that made the write ended before its WAIT"
  end
  if tointeger(n) and n >= lk.replicas then return true end
  return false, format("%s of %d replicas within %s ms", tostring(n), lk.replicas, lk.s_wait_for)
end

-- A grant not confirmed is given back (by the caller's Pending, or its
-- own give-back) and raised.
local function confirm_grant(lk)
  local ok, why = replicated(lk)
  if not ok then
    error(require("async_mutex.unavailable").new("grant not confirmed: " .. why), 0)
  end
end
-- }==========================================================

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

local NS = 1e6                      -- hrtime units (ns) per ms

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

-- The hold is lost: tell the holder's onLost.  Redis is not asked to end
-- it.  A lease that ended by the local clock may still run in Redis for
-- up to the drift allowance (its local end comes first), and a release
-- then would let the next process in while this one, told only by onLost
-- or check(), may still be in its section: the server's lease runs out
-- by itself.  A refused one is no longer in Redis.
local function lose(lease, reason)
  if lease.state ~= "held" then return end
  lease.state = "lost"
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
function stolen(hub, token, fence)
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
-- part: the lock's name and ":free" channel are in its keys' list.
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
-- lost, and not released in Redis (lose).
local function release_lease(lease)
  -- (the clock first: a close() in a hook of that luv call ends the hold)
  local now = hrtime()
  if lease.state ~= "held" then return false end
  if now >= lease.valid_until then
    lose(lease, "expired")
    return false
  end
  lease.state = "released"
  local lk, keys = lease.lock, lease.keys
  -- In flight from here on, for a close() in a hook of the calls below:
  -- the lease is no longer among the holds it gives back (send_release)
  lk.hub.inflight[lease.token] = keys
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
    c, ms = cluster.sibling(client)
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
function client_closed(hub)
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
    argerror(1, "check", "async_mutex.RedisReleaser expected, got " .. typename(lease))
  end
  if lease.state == "held" and hrtime() >= lease.valid_until then
    lose(lease, "expired")
  end
  if lease.state == "lost" then error(lease.lock.lost_error, 0) end
  return lease.state == "held"
end

--- releaser:downgrade(): the write hold of a readers-writer lock becomes
-- a read hold (its lock record's 'downgrade', redis_rwlock.lua); refused
-- for any other releaser, as the local releasers refuse it (src/rwlock.c).
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
    argerror(1, "upgrade", "async_mutex.RedisReleaser expected, got " .. typename(lease))
  end
  usage_error("attempt to upgrade a read hold: not offered (two upgraders would deadlock);"
    .. " release it, then acquireWrite")
end

function Lease.__tostring(lease)
  return format("async_mutex.RedisReleaser (%s, fence %d, %s)", lease.keys.name,
                lease.fence, lease.state)
end

-- }==========================================================


-- {---------------------------------------------------------- eviction
-- A server that may evict keys when it reaches maxmemory may evict a
-- lock's holders (two holders) or its queue: the locks refuse such a
-- server, or warn about it once per connection with the option
-- unsafeEviction = "warn" (docs/redis-locks.md, "Eviction").  Since every
-- key of a lock has an expiry, the volatile-* policies may evict them
-- too: only noeviction, or no maxmemory at all, is safe.  The policy is
-- read (INFO memory) at the first use of a lock on each connection of the
-- client (get_hub resets it), by one coroutine while the others wait.  A
-- server that does not let us read it (an ACL) is not refused.  The
-- refusal is raised as the request's outcome (at level 0, as
-- E_UNAVAILABLE is): it is the server's, not a misuse at the caller's line.

-- The first line of 'info' with 'field', as a string.
local function info_field(info, field)
  return info:match("\n" .. field .. ":([^\r\n]*)") or info:match("^" .. field .. ":([^\r\n]*)")
end

local function read_policy(hub)
  local ok, info = pcall(hub.client.call, hub.client, "INFO", "memory")
  if not ok then
    if info == E_UNAVAILABLE then error(info, 0) end
    return false                      -- refused (ACL): not checked
  end
  local policy = type(info) == "string" and info_field(info, "maxmemory_policy")
  local limit = type(info) == "string" and tonumber(info_field(info, "maxmemory"))
  if not policy or policy == "noeviction" or limit == 0 then return false end
  return format("maxmemory-policy %s, maxmemory %s", policy, limit or "?")
end

-- Raises if the server may evict the lock's keys and the lock does not
-- take that (unsafeEviction).  Called before a lock's requests while the
-- answer is not known to be safe (hub.evicts ~= false).
local function eviction(lk)
  local hub = lk.hub
  local evicts = hub.evicts
  local warn = lk.unsafe_eviction == "warn"
  -- not read on this connection yet; or refused, then read again at each
  -- use: a lock that refuses sends nothing else, and would never see a
  -- new connection, or a server whose policy was changed
  if evicts == nil or (evicts and not warn) then
    local _ <close> = hub.evicts_gate:acquire()
    -- closed while the coroutine before us read it
    if hub.closed then error(CLOSED, 0) end
    evicts = hub.evicts
    if evicts == nil or (evicts and not warn) then
      evicts = read_policy(hub)
      hub.evicts = evicts
    end
    if not evicts then return end
  end
  if warn then
    if not hub.warned then
      hub.warned = true
      io.stderr:write("async_mutex: warning: the Redis server may evict the Redis locks' keys (",
        evicts, "): two holders are possible; use maxmemory-policy noeviction",
        " (docs/redis-locks.md, \"Eviction\")\n")
    end
    return
  end
  error(format("the Redis server may evict the lock's keys (%s): use maxmemory-policy"
    .. " noeviction, or the option unsafeEviction = \"warn\"", evicts), 0)
end
-- }----------------------------------------------------------

-- {========================================================== acquire
-- The Redis half of an acquisition, run by the holder of the local gate:
-- one ACQUIRE request grants at once or queues this process; a queued
-- waiter then sleeps on a private core Semaphore (its "bell"), rung by the
-- hand-off message, and wakes every waiterTimeout/3 to renew its place
-- (which also catches a lost message).  'deadline' is nil (no bound), the
-- monotonic time (uv.hrtime) at which 'err' is raised, or false (a try).

local REFRESH = setmetatable({}, { __name = "async_mutex.refresh" })

-- Sleeps on 'bell' until it is rung (true) or the monotonic time 'due'
-- (false; at once if it has passed).  The core's timer counts from the
-- loop's time, which lags behind while a callback runs (blocking work
-- before the call): it is brought up to date first, and the callers
-- compare the clock, not the timer, with their deadlines, so that none
-- is ever taken as passed before it has.
local function doze(bell, due)
  local ms = (due - hrtime()) / NS
  if ms <= 0 then return false end
  update_time()
  local ok, e = pcall(limited, bell, ceil(ms), REFRESH)
  if not ok and e ~= REFRESH then error(e, 0) end
  return ok
end

-- The waiter's cleanup when its acquisition does not complete (error,
-- timeout, cancel, coroutine closed): leave the Redis queue, or give back
-- a grant that arrived too late.  In the background: the caller's error is
-- raised at once (after one commandTimeout, not two, when Redis does not
-- answer), and the withdrawal is written before any later request of this
-- client, so the process's next request finds it done.
local Pending = {
  __close = function(w)
    local lk = w.lk
    local hub = lk.hub
    if hub.waiters[w.token] == w then hub.waiters[w.token] = nil end
    lk.waiting[w] = nil
    if w.done then return end
    hub_unuse(hub)
    background(release_token, lk, w.keys, w.token)
  end,
}

-- The keys of the lock 'name' (scripts.keys), with the name as field
-- 'name' and the limit the scripts take (a string) as 'limit'.
-- On a Redis Cluster (docs/redis-locks.md, "On a cluster") every key of
-- one lock is in one slot, so that its scripts run on one master: the
-- keys are made from "{name}" unless the name has a hash tag already.
local function has_tag(name)       -- as Redis reads a hash tag: the first {
  local open = name:find("{", 1, true)
  local close = open and name:find("}", open + 1, true)
  return close ~= nil and close > open + 1
end

local function lock_keys(name, s_limit, on_cluster)
  local base = name
  if on_cluster and not has_tag(name) then base = "{" .. name .. "}" end
  local keys = scripts.keys(base)
  keys.name, keys.limit = name, s_limit
  -- the hashed part of its keys: its hand-off channels are in its slot
  if on_cluster then keys.tag = base:match("^[^{]*{([^}]*)}") end
  return keys
end

-- The channel the hand-offs of a waiter with `keys` are published on:
-- the hub's; on a cluster its shard channel in the lock's slot (the
-- scripts SPUBLISH to a channel that begins with "{", and a script may
-- only publish on a shard channel of its own keys' slot).
local function channel_of(lk, keys)
  if not lk.cluster then return lk.hub.channel, nil end
  local ch = keys.channel
  if not ch then
    ch = "{" .. keys.tag .. "}" .. lk.hub.channel
    keys.channel = ch
  end
  return ch, ch
end

-- The keys of the lock 'name' of lk: a plain lock's are made once.
local function keys_of(lk, name)
  if name == lk.name then return lk.keys end
  return lock_keys(name, lk.s_limit, lk.cluster)
end

-- Whether the locks of 'sorted' (acquireAll's {key, name} records) are
-- in more than one slot of lk's cluster.
local function split(lk, sorted)
  local slot
  for _, rec in ipairs(sorted) do
    local s = rcore.keyslot(keys_of(lk, rec[2])[1])
    if slot and s ~= slot then return true end
    slot = s
  end
  return false
end

-- The acquire request of the waiter w (mode "wait", "try" or "again"), by
-- the lock's own script if it has one (redlock.lua's: the acquire script,
-- then more in the same call when it grants).  A
-- request that opened a new connection (on_connected) is followed by the
-- eviction check of that connection: refused, its grant or place in the
-- queue is given back (Pending) as for any error.
--
-- An answer that this waiter does not hold carries n: every grant made
-- before the request has a fence <= n, every later one a larger fence
-- (redis_scripts.lua, acquire).  A grant of this waiter made before the
-- request ended before it (the request would have found it held), and
-- its hand-off message comes on the other connection: it may be read
-- while the request is in flight, or after the answer (the two sockets
-- are read in no set order, and a process that blocks reads both late).
-- So such a message is dropped, and any later one of fence <= n ignored
-- (on_message): a message kept or read from here on is of a grant made
-- after this request, whose lease Redis started after it was sent
-- (docs/redis-locks.md, "Waiting without polling"; spec 126).
local function ask(lk, w, s_weight, mode)
  -- (closed by a finalizer or a hook since the caller looked: a waiter's
  -- outcome, not the closed client's misuse error)
  if lk.hub.closed then error(CLOSED, 0) end
  local r = eval(lk, lk.acquire_script, w.keys, w.token, lk.s_limit, s_weight, lk.s_ttl,
                 lk.s_wait, (channel_of(lk, w.keys)), mode)
  local n = r[1] ~= 1 and r[3]
  if n then
    n = tointeger(tonumber(n))
    if not w.ended or n > w.ended then w.ended = n end
    if w.fence and w.fence <= n then w.fence, w.value = nil, nil end
  end
  if lk.hub.evicts == nil then eviction(lk) end
  return r
end

-- Sleeps in the Redis queue until the hand-off message comes (nil) or a
-- request of its own is granted (that reply); asks again at every third
-- of waiterTimeout and when the first holder's lease ends ('r' the last
-- reply).  Raises the cancel error, 'err' at the deadline, E_UNAVAILABLE
-- when the client is closed.  Returns the reply that granted (or nil) and
-- the time its request was sent (nil: none sent).
local function wait_in_queue(lk, w, s_weight, deadline, err, r)
  local hub = lk.hub
  local refresh = max(1, lk.wait_ms // 3) * NS
  local sent
  while r[1] ~= 1 and not w.fence do
    local t = hrtime()
    local again = t + refresh
    if r[2] and r[2] >= 0 then again = min(again, t + (r[2] + 1) * NS) end
    repeat
      if not w.canceled then
        local bell = w.bell
        if not bell then
          bell = internal(core.Semaphore.new(0))
          w.bell = bell
        end
        doze(bell, deadline and min(again, deadline) or again)
        -- woken by close(): a grant that came meanwhile is given back
        -- with the close (client_closed)
        if hub.closed then error(CLOSED, 0) end
      end
      if w.fence then return nil, sent end
      if w.canceled then error(lk.cancel_error, 0) end
      t = hrtime()
      if deadline and t >= deadline then error(err, 0) end
    until t >= again
    sent = t
    -- (a message of a grant made before this request, read while it was
    -- in flight, is dropped by ask: the grant has ended)
    r = ask(lk, w, s_weight, "again")
  end
  if r[1] == 1 then return r, sent end
  return nil, sent
end

-- The request's numbers go as strings made once (the client would format
-- them per call), and its arguments as values: no table per request.
-- The waiter record 'w' has four fields while the lock is granted at once
-- (lk, keys, token, done), one hash part of four slots.
--
-- A grant's lease is counted from the request that set it: the one that
-- was answered, or for a hand-off the last request sent, whose answer
-- found this waiter queued: a message is kept only when its grant came
-- after that request (ask), so Redis started that lease later, at the
-- release, and the count here ends first.  But a waiter
-- sleeps up to a third of waiterTimeout between requests, and a hand-off
-- that comes late in that sleep was counted from long ago: when the
-- lease's renewal is due already, the grant is confirmed by one request
-- before acquire() returns (it replaces the renewal that would be sent at
-- once anyway), and counted from it.  So acquire() never returns a lease
-- that is over, or nearly so.  'token': the token to
-- use (redlock.lua sends a request with it behind the acquire's), else a
-- fresh one.
local function redis_acquire(lk, name, weight, deadline, err, token)
  local hub = lk.hub
  if hub.closed then error(CLOSED, 0) end   -- closed while at the gate
  local keys = keys_of(lk, name)
  token = token or hub.id .. ":" .. random_hex()
  local try = deadline == false
  local s_weight = weight == 1 and "1" or tostring(weight)
  -- (done: nothing to withdraw until the first request goes out)
  local w <close> = setmetatable({ lk = lk, keys = keys, token = token, done = true },
                                 Pending)
  -- Known to the hub before the request goes out: the hand-off message
  -- comes on the other connection and may be read before the reply; and
  -- to cancel(), which may come before the reply too (not a try's: it
  -- never waits); and to close(), which gives back what it had in Redis.
  -- The waiter's bell (a core Semaphore) is made only when it has to sleep.
  hub.waiters[token] = w
  if not try then lk.waiting[w] = true end
  if hub.evicts ~= false then
    eviction(lk)
    if w.canceled then error(lk.cancel_error, 0) end
    if deadline and hrtime() >= deadline then error(err, 0) end
  end
  hub_use(hub)
  w.done = false
  local sent = hrtime()
  local r = ask(lk, w, s_weight, try and "try" or "wait")
  local first                       -- the length of the lease Redis granted
  while true do
    if r and r[1] == 1 then
      first = lk.ttl
    elseif w.fence then             -- the hand-off message
      first = min(lk.ttl, lk.wait_ms)
    elseif try then
      w.done = true                 -- refused: never queued, nothing to withdraw
      error(err, 0)
    else
      -- Queued: wait for the hand-off.  Later requests ask again.  The
      -- bound is checked between requests: one that passed while this one
      -- was in flight sends nothing more (the withdrawal goes out with
      -- Pending).
      if deadline and hrtime() >= deadline then error(err, 0) end
      local _, shard = channel_of(lk, w.keys)
      if not subscribed(hub, shard) then
        subscribe(hub, shard)
        sent = hrtime()             -- a hand-off before we listened: ask again
        r = ask(lk, w, s_weight, "again")
      end
      local at
      r, at = wait_in_queue(lk, w, s_weight, deadline, err, r)
      sent = at or sent
      first = r and lk.ttl or min(lk.ttl, lk.wait_ms)
    end
    -- (replicas: a grant by hand-off was written on another process's
    -- connection, which WAIT on this one does not cover: it is confirmed
    -- by asking again, a write of this connection, as a stale one is)
    if hrtime() - sent < first * NS / 3
      and not (lk.replicas and not (r and r[1] == 1)) then break end
    -- Canceled meanwhile (cancel(), or a RedlockMutex's attempt that no
    -- longer needs this server, whose release may have gone out behind
    -- the request already): not asked again, which would take the lock
    -- anew after that release; the token is given back (Pending).
    if w.canceled then error(lk.cancel_error, 0) end
    -- Stale: confirm it by asking again (Redis renews a grant it still
    -- has to ttl from this request, and answers with its fence), or learn
    -- that it ended meanwhile (this process was too slow to take it): the
    -- same request then queues this waiter again, or grants anew, and
    -- late messages of the ended grant, or of any grant made before the
    -- request, are ignored (ask, on_message).  Its answer, not the grant
    -- seen before, gives the fence: a renewal answers only "held", and
    -- the hold it renewed may be a later grant (one that came while it was
    -- in flight, after the first had ended).  A try is never queued: it
    -- renews, and its token can hold no other grant.
    local fence, value
    if r and r[1] == 1 then fence, value = r[2], r[3] else fence, value = w.fence, w.value end
    w.fence = nil
    sent = hrtime()
    if try then
      if eval(lk, scripts.renew, keys, token, lk.s_limit, lk.s_ttl) ~= 1 then
        w.done = true                 -- not held, never queued: nothing to withdraw
        error(err, 0)
      end
      r = { 1, fence, value }
    else
      r = ask(lk, w, s_weight, "again")
    end
  end
  if lk.replicas then confirm_grant(lk) end   -- else given back (Pending)
  w.done = true
  local lease, value, extra
  if r and r[1] == 1 then
    -- (r[4]: what a lock's own acquire script adds to a grant it answers)
    lease, value, extra = new_lease(lk, keys, token, tointeger(tonumber(r[2])), sent, first),
                          tointeger(tonumber(r[3])), r[4]
  else
    lease, value = new_lease(lk, keys, token, w.fence, sent, first), w.value
  end
  -- Closed by a finalizer or a hook since the last look (at an allocation
  -- or a luv call of new_lease): the close gave the token back, as this
  -- waiter's or as the hold's, and the next process may hold already.
  -- The hold is not handed out; it ends here as the close ends holds.
  if hub.closed then
    end_after_close(lease)
    error(CLOSED, 0)
  end
  return lease, value, extra
end

-- }==========================================================

-- {========================================================== steal, query
-- lock:steal on the Redis locks (docs/redis-locks.md, "Steal"): one
-- script ends every hold in place and grants the stealer with a new fence
-- (redis_scripts.lua, steal); the queue keeps its order.  The steal goes
-- around the lock's local gate: it takes no place in the Redis queue,
-- which the gate is there to keep to one per process.  Its request is
-- known to the hub as a waiter's is (close() gives it back), and a grant
-- not confirmed (replicas) or cut off is given back (Pending).  The holds
-- it ended in this process are lost at its answer; the other processes
-- are told by a message on their hand-off channel when they listen, and
-- otherwise at their next renewal or release, which find the hold gone.
local function redis_steal(lk, name, weight)
  local hub = lk.hub
  if hub.closed then error(CLOSED, 0) end
  local keys = keys_of(lk, name)
  local token = hub.id .. ":" .. random_hex()
  local w <close> = setmetatable({ lk = lk, keys = keys, token = token, done = true },
                                 Pending)
  hub.waiters[token] = w
  if hub.evicts ~= false then eviction(lk) end
  hub_use(hub)
  w.done = false
  local sent = hrtime()
  -- (the ended holders' channels: the hub channel's form, see channel_of)
  local prefix = lk.cluster and "{" .. keys.tag .. "}async_mutex:" or "async_mutex:"
  local r = eval(lk, scripts.steal, keys, token, lk.s_limit,
                 weight == 1 and "1" or tostring(weight), lk.s_ttl, prefix)
  if hub.evicts == nil then eviction(lk) end      -- a new connection (see ask)
  local ended = r[4]
  for i = 1, #ended, 2 do stolen(hub, ended[i], tointeger(tonumber(ended[i + 1]))) end
  if lk.replicas then confirm_grant(lk) end       -- else given back (Pending)
  w.done = true
  local lease = new_lease(lk, keys, token, tointeger(tonumber(r[2])), sent, lk.ttl)
  if hub.closed then                  -- (as at the end of redis_acquire)
    end_after_close(lease)
    error(CLOSED, 0)
  end
  return lease, tointeger(tonumber(r[3]))
end

-- am.query on the Redis locks (docs/redis-locks.md, "Query"): the holders
-- and the queue of the lock 'name' as Redis has them, after expiry and
-- dispatch.  'rw': a readers-writer lock's weights name the mode; a
-- semaphore's entries ('weighted') have their weight.
local function redis_query(lk, name, kind)
  local hub = lk.hub
  if hub.evicts ~= false then eviction(lk) end
  if hub.closed then error(CLOSED, 0) end
  local r = eval(lk, scripts.query, keys_of(lk, name), lk.s_limit)
  if hub.evicts == nil then eviction(lk) end
  local now, h, q, c = tonumber(r[1]), r[2], r[3], r[4]
  local function entry(token, weight)
    weight = tointeger(tonumber(weight)) or 1
    local client = token:match("^([^:]+):")
    local e = { owner = token, client = client, mine = client == hub.id }
    if kind == "weighted" then
      e.mode, e.weight = "weighted", weight
    elseif kind == "rw" then
      e.mode = weight == lk.limit and "exclusive" or "shared"
    else
      e.mode = "exclusive"
    end
    return e
  end
  local held = {}
  for i = 1, #h, 2 do
    local ends, weight, fence = h[i + 1]:match("^(%d+) (%d+) (%d+)")
    local e = entry(h[i], weight)
    e.fence, e.ttl = tointeger(tonumber(fence)), tointeger(tonumber(ends) - now)
    held[#held + 1] = e
  end
  -- oldest grant first: fences grow with every grant
  table.sort(held, function(a, b) return a.fence < b.fence end)
  local pending = {}
  for i = 1, #q do pending[i] = entry(q[i], c[i]:match("^(%d+)")) end
  return { held = held, pending = pending }
end
-- }==========================================================

-- {========================================================== locks
-- A lock record: client, hub, limit (1 for mutexes), options, the local
-- gate, its waiters in the Redis queue, and the holds of this process by
-- lock name (for the unscoped release).  'keyed' sets use a core KeyedMutex
-- as gate and name each key's lock prefix .. key.


local decorated_of = {}             -- plain metatable -> decorated metatable

-- Returns the lock record and its limit, error of a plain or decorated lock
-- (nil limit: no bound; a number: ms; false: a try).
local function check_self(self, mt, fname)
  local smt = getmetatable(self)
  if smt == mt then return self, nil, nil end
  if smt == decorated_of[mt] then return self[1], self[2], self[3] end
  argerror(1, fname, mt.__name .. " expected, got " .. typename(self))
end

-- Worded as the core locks word it (src/args.c), so that a priority error
-- reads the same on a local and a Redis lock.
local function check_priority(p, n, fname)
  if p == nil then return end
  if type(p) ~= "number" then
    argerror(n, fname, "priority must be a number, got " .. type(p))
  elseif p ~= p then
    argerror(n, fname, "priority must not be NaN")
  end
end

-- 'prefix': the set's; with an empty one, the key is the whole lock name,
-- which must not be empty (as RedisMutex.new's name).
local function check_key(key, n, fname, prefix)
  local t = type(key)
  if t == "string" then
    if key == "" and prefix == "" then
      argerror(n, fname, "key must not be empty when the prefix is empty"
        .. " (a lock name must be a non-empty string)")
    end
    return key
  end
  if t == "number" and key == key and key ~= huge and key ~= -huge then
    local i = tointeger(key)
    return i and format("%d", i) or format("%.17g", key)
  end
  argerror(n, fname, "key must be a string or a finite number, got " .. typename(key))
end

-- The misuse errors of a method that talks to Redis, at its caller's line
-- (the client would raise them at this file's): a closed client, or not
-- in a coroutine.
local function check_usable(lk, what)
  check_open(lk.client)
  if not isyieldable() then
    usage_error(checks.cannot_yield(what))
  end
end

-- The monotonic time (uv.hrtime) at which a bound of 'limit' ms taken now
-- ends (nil: no bound; false: a try).  Not the loop's time, which lags
-- behind while a callback runs: blocking work before the call would have
-- ended the bound early by as long as it took.  The loop's time is
-- brought up to date too, for the timer of the core lock ('limited')
-- that bounds a wait at the gate.
local function deadline_of(limit)
  if limit == false then return false end
  if limit and limit ~= huge then
    update_time()
    return hrtime() + limit * NS
  end
end

-- The whole acquisition: the local gate (with the decorator's bound),
-- then Redis with what is left of it.
local function acquire(lk, limit, err, key, name, weight, priority)
  local deadline = deadline_of(limit)
  local gate = lk.gate
  local gate_release
  if limit == nil then
    if key ~= nil then gate_release = gate:acquire(key, priority)
    else gate_release = gate:acquire(priority) end
  elseif key ~= nil then
    gate_release = limited(gate, limit, err, key, priority)
  else
    gate_release = limited(gate, limit, err, priority)
  end
  local _ <close> = gate_release
  return redis_acquire(lk, name, weight, deadline, err)
end

-- Every option the Redis locks know: a misspelt one (`tll`) is an error,
-- as it is to redis.connect and am.optimistic.
local OPTIONS = {
  ttl = true, renewInterval = true, waiterTimeout = true, onLost = true,
  cancelError = true, lostError = true, unsafeEviction = true, replicas = true,
}

-- The largest ttl / waiterTimeout (ms, about 34 years) and semaphore
-- limit: the scripts compute with Redis's doubles and write numbers with
-- %d (a C long); a larger ttl made now + ttl overflow there, a lease that
-- ended at once (two holders).  Also keeps ttl in ns (leases) below 2^63.
local MAX_MS, MAX_LIMIT = 1 << 40, 1 << 53

-- 'known': the option names a kind takes, when not all of OPTIONS.
local function options_of(opts, n, fname, client, known)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    argerror(n, fname, "options must be a table, got " .. typename(opts))
  end
  local unknown = unknown_option(opts, known or OPTIONS)
  if unknown then argerror(n, fname, unknown) end
  local function int(field, default, least)
    local v = opts[field]
    if v == nil then return default end
    if type(v) ~= "number" or tointeger(v) == nil or v < least then
      argerror(n, fname, format("options.%s must be an integer >= %d", field, least))
    end
    if v > MAX_MS then
      argerror(n, fname, format("options.%s must be an integer <= %d", field, MAX_MS))
    end
    return tointeger(v)
  end
  local ttl = int("ttl", 30000, 10)
  local o = {
    ttl = ttl,
    renew = int("renewInterval", ttl // 3, 0),
    wait_ms = int("waiterTimeout", 3000, 10),
    on_lost = opts.onLost,
    cancel_error = opts.cancelError,
    lost_error = opts.lostError,
    unsafe_eviction = opts.unsafeEviction,
    replicas = int("replicas", nil, 1),
  }
  if o.renew >= ttl then
    argerror(n, fname, "options.renewInterval must be below options.ttl")
  end
  if o.replicas and not is_client(client) and not is_cluster(client) then
    -- (WAIT is no script's command: it needs the client's own call)
    argerror(n, fname, "options.replicas needs an async_mutex.redis client")
  end
  if o.on_lost ~= nil and not is_callable(o.on_lost) then
    argerror(n, fname, "options.onLost must be callable")
  end
  local ue = o.unsafe_eviction
  if ue ~= nil and ue ~= "error" and ue ~= "warn" then
    argerror(n, fname, "options.unsafeEviction must be \"error\" or \"warn\"")
  end
  if o.cancel_error == nil then o.cancel_error = am.E_CANCELED end
  if o.lost_error == nil then o.lost_error = E_LOST end
  return o
end

local function check_client(client, fname)
  local ok = pcall(function() return is_callable(client.eval) and is_callable(client.subscribe) end)
  if not ok or not (is_callable(client.eval) and is_callable(client.subscribe)) then
    argerror(1, fname, "redis client expected, got " .. typename(client))
  end
end

-- Argument #2 of a lock's new: its name, or for a keyed lock the prefix
-- of its keys' names (which may be empty).
local function check_name(name)
  if type(name) ~= "string" or name == "" then
    argerror(2, "new", "lock name must be a non-empty string, got " .. typename(name))
  end
end

local function check_prefix(prefix)
  if type(prefix) ~= "string" then
    argerror(2, "new", "key prefix must be a string, got " .. typename(prefix))
  end
end

local function new_record(mt, client, name, limit, opts, keyed)
  local lk = setmetatable(opts, mt)
  lk.client, lk.hub, lk.name, lk.limit = client, get_hub(client), name, limit
  lk.hub.locks[lk] = true
  lk.gate = internal(keyed and core.KeyedMutex.new({ cancelError = opts.cancel_error })
    or core.Mutex.new(opts.cancel_error))
  lk.s_limit, lk.s_ttl, lk.s_wait = tostring(limit), tostring(opts.ttl), tostring(opts.wait_ms)
  lk.cluster = is_cluster(client)
  lk.keys, lk.direct = lock_keys(name, lk.s_limit, lk.cluster), is_client(client)
  if lk.replicas then
    -- WAIT's timeout: within the client's commandTimeout and the lease
    local timeout = lk.cluster and cluster.command_timeout(client)
      or rcore.state(client).commandTimeout
    local within = min(timeout / 2, lk.ttl / 4)
    lk.s_replicas, lk.s_wait_for = tostring(lk.replicas), tostring(max(1, floor(within)))
  end
  lk.acquire_script = scripts.acquire     -- (a kind may put its own: ask)
  lk.release_script = scripts.release     -- (and its own release: send_release)
  lk.waiting = {}
  lk.holds = {}
  return lk
end

-- Unscoped release of the oldest hold of this process on 'name'.
local function release_name(lk, name)
  local holds = lk.holds[name]
  if not holds or not holds[1] then return false end
  return release_lease(holds[1])
end

-- Rejects this process's waiters of 'name' (all names when nil).
local function cancel(lk, key, name)
  if key == nil then lk.gate:cancel() else lk.gate:cancel(key) end
  for w in pairs(lk.waiting) do
    if name == nil or w.keys.name == name then
      w.canceled = true
      -- a sleeping waiter wakes, sees 'canceled' and leaves (one that is
      -- not asleep sees it before it sleeps)
      if w.bell then w.bell:release() end
    end
  end
end

-- The state in Redis: weight held, queue length.  With 'weight', marks
-- the lock for waitForUnlock when such a request could not be granted now
-- (redis_scripts.lua, M.state).
local function state(lk, name, weight)
  if lk.hub.evicts ~= false then eviction(lk) end
  if lk.hub.closed then error(CLOSED, 0) end     -- as in ask
  local r
  if weight then
    r = eval(lk, scripts.state, keys_of(lk, name), lk.s_limit, tostring(weight), lk.s_wait)
  else
    r = eval(lk, scripts.state, keys_of(lk, name), lk.s_limit)
  end
  if lk.hub.evicts == nil then eviction(lk) end     -- a new connection (see ask)
  return r[1], r[2], r[3]
end

-- waitForUnlock: until a request like this one could be granted at once
-- (room for 'weight', nobody queued).  Waits on the lock's ":free"
-- channel, with the same renewal period as a waiter as a safety net.  A
-- release publishes there only when it finds the lock marked: every check
-- made once subscribed marks it (for waiterTimeout, renewed at each check)
-- in the same atomic step, so a release that comes after the check is
-- heard, and one before it is seen by the check.
local function wait_for_unlock(lk, limit, err, name, weight)
  local deadline = deadline_of(limit)
  local hub = lk.hub
  local bell = internal(core.Semaphore.new(0))
  hub.unlockers[bell] = true          -- rung by close()
  local cleanup <close> = setmetatable({}, { __close = function(c)
    hub.unlockers[bell] = nil
    if c.sub then c.sub:unsubscribe() end
  end })
  while true do
    local used, queued, lease_end = state(lk, name, cleanup.sub and weight)
    if queued == 0 and used + weight <= lk.limit then return end
    if deadline == false then error(err, 0) end
    if not cleanup.sub then
      -- (the bound, checked between requests, as in redis_acquire)
      if deadline and hrtime() >= deadline then error(err, 0) end
      -- (its key N:free: "{N}:free" on a cluster, where the scripts publish)
      cleanup.sub = lk.client:subscribe(keys_of(lk, name)[6], function() bell:release() end)
    else
      local t = hrtime()
      local again = t + max(1, lk.wait_ms // 3) * NS
      -- a holder that dies publishes nothing: look again when the first
      -- lease ends (a renewed one is found running, and waited for again)
      if lease_end >= 0 then again = min(again, t + (lease_end + 1) * NS) end
      local rung
      repeat
        rung = doze(bell, deadline and min(again, deadline) or again)
        if hub.closed then error(CLOSED, 0) end
        t = hrtime()
        if deadline and t >= deadline then error(err, 0) end
      until rung or t >= again
    end
  end
end

-- A steal's refusals, at the user's line ('limit': check_self's): through
-- tryAcquire (as a local lock's, docs/semantics.md "Steal"), or where it
-- cannot wait for Redis's answer.
local function check_steal(lk, limit)
  if limit == false then
    usage_error("attempt to steal through tryAcquire (a steal takes the lock whoever holds it)")
  end
  check_open(lk.client)
  if not isyieldable() then usage_error(checks.cannot_yield("steal a Redis lock")) end
end

-- The key of a keyed set's query (argument n), required: a set's keys are
-- in Redis, where only a scan could list them.
local function check_query_key(lk, key, n, fname)
  if key == nil then
    argerror(n, fname, "key expected: a Redis lock set is queried one key at a time")
  end
  return check_key(key, n, fname, lk.name)
end

-- No key for a lock that has none (am.query(lock, key), argument 2).
local function check_no_key(lk, key, n)
  if key ~= nil then
    argerror(n, "query", "no key expected: a " .. getmetatable(lk).__name:match("%.(.*)$")
      .. " has no keys")
  end
  check_open(lk.client)
  if not isyieldable() then usage_error(checks.cannot_yield("query a Redis lock")) end
end

local function finish(lk, release, ok, ...)
  if not ok then
    release()
    error((...), 0)
  end
  if not release() and release.state == "lost" then error(lk.lost_error, 0) end
  return ...
end

local function check_fn(fn, n)
  if not is_callable(fn) then
    argerror(n, "runExclusive", "function expected, got " .. typename(fn))
  end
end

-- {========================================================== decorators
-- am.withTimeout and am.tryAcquire hand Redis locks to mt.__decorate: the
-- decorated lock is {lock, limit, err} (as for local locks) whose methods
-- are the plain ones, which read the bound from it (check_self).

-- Makes the Redis lock kind of metatable 'mt' decorable.
local function decorable(mt)
  local d = { __name = "async_mutex.decorated " .. mt.__name:match("%.(.*)$") }
  d.__index = mt.__index
  d.__query = mt.__query              -- (am.query, on the lock's own)
  decorated_of[mt] = d
  -- (fname, lock, ms, timeout_error) for withTimeout, (fname, lock,
  -- already_locked_error) for tryAcquire; called by am's decorators.
  mt.__decorate = function(fname, lock, a, b)
    if fname == "tryAcquire" then
      if a == nil then a = am.E_ALREADY_LOCKED end
      return setmetatable({ lock, false, a }, d)
    end
    if type(a) ~= "number" or not (a >= 0) then
      checks.argerror(2, "withTimeout", "timeout must be a non-negative number")
    end
    if b == nil then b = am.E_TIMEOUT end
    return setmetatable({ lock, a, b }, d)
  end
end

-- }==========================================================

return {
  CLOSED = CLOSED, end_after_close = end_after_close,
  random_hex = random_hex, background = background, eval = eval,
  release_token = release_token, get_hub = get_hub, hub_use = hub_use,
  hub_unuse = hub_unuse, subscribe = subscribe,
  Lease = Lease, lease_methods = lease_methods, NS = NS, drift = drift,
  lose = lose, forget = forget, new_lease = new_lease, release_lease = release_lease,
  stop_timer = stop_timer,
  eviction = eviction, doze = doze, lock_keys = lock_keys, keys_of = keys_of, split = split,
  redis_acquire = redis_acquire, redis_steal = redis_steal, redis_query = redis_query,
  stolen = stolen, check_steal = check_steal, check_query_key = check_query_key,
  check_no_key = check_no_key, replicated = replicated, confirm_grant = confirm_grant,
  decorated_of = decorated_of, decorable = decorable, check_self = check_self, check_priority = check_priority,
  check_key = check_key, check_usable = check_usable, deadline_of = deadline_of,
  acquire = acquire, OPTIONS = OPTIONS, MAX_MS = MAX_MS, MAX_LIMIT = MAX_LIMIT,
  options_of = options_of, check_client = check_client, check_name = check_name,
  check_prefix = check_prefix, new_record = new_record, release_name = release_name,
  cancel = cancel, state = state, NOT_A_WRITE_HOLD = NOT_A_WRITE_HOLD,
  wait_for_unlock = wait_for_unlock, finish = finish, check_fn = check_fn,
}
