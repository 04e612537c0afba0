--- async_mutex.redis_lock_hub: what every Redis lock of one client shares
-- (a part of async_mutex.redis_lock_base, which the kinds require): the
-- hub of each client (its hand-off channel, its subscription, its waiters
-- by token), the scripts' requests (eval, the release of a token), the
-- tokens, and the WAIT of the option `replicas`.  The rules are in
-- docs/redis-locks.md.  Private: its functions are the lock kinds' own.
--
-- The leases (redis_lock_lease.lua) require this module; the hub calls
-- them back (a steal's message, a client's close) through `leases()`,
-- which finds them loaded by then (redis_lock_base loads both).

local core = require "async_mutex.core"
local uv = require "luv"

-- The client's Lua layer owns the helpers the locks share: closing a luv
-- handle safely at exit (docs/redis.md, "Closing and exiting"), running a
-- script (EVALSHA, EVAL on NOSCRIPT), telling its clients, and others.
local redis_internal = require("async_mutex.redis")._internal
local rcore = require "async_mutex.redis_core"
local run_script, is_client = redis_internal.run_script, redis_internal.is_client

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

-- The leases' module, which requires this one: looked up at its first use
-- (a message, a close), never while the two load.
local lease_mod
local function leases()
  if not lease_mod then lease_mod = require "async_mutex.redis_lock_lease" end
  return lease_mod
end

local error, next, pairs, pcall, setmetatable, tonumber, tostring, type =
  error, next, pairs, pcall, setmetatable, tonumber, tostring, type
local co_create, co_resume, running = coroutine.create, coroutine.resume, coroutine.running
local traceback, xpcall, io = debug.traceback, xpcall, io
local tointeger = math.tointeger
local format, str_find, str_match, str_sub = string.format, string.find, string.match, string.sub
-- The locks made here (gates, bells) are the library's own: debug mode
-- does not watch them (docs/debug.md, Deadlocks).
local internal = core.dbg_internal

-- What a request cut off by its client's close raises: the E_UNAVAILABLE
-- whose reason says so, as the client's own calls cut off that way
-- (docs/redis.md, Failures)
local CLOSED = require("async_mutex.unavailable").new("client closed")

-- a part of the Lua layer: an error raised through it stands at the
-- user's call (async_mutex.checks)
require("async_mutex.checks").join_layer()

local NS = 1e6                      -- hrtime units (ns) per ms

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
-- renewals).  Their outcomes are dropped: each caller says why that is
-- safe.  Also those raised after a yield (a reply that says the client was
-- closed meanwhile): the client would hand them to the error handler, as a
-- failure of the program's own.  An outcome is an error object (an
-- E_UNAVAILABLE, an error reply: tables); any other error is a fault of
-- the module or of code it called, and is written to stderr with its
-- traceback rather than lost.
local function fault_trace(e)
  if type(e) == "table" then return e end
  return traceback(tostring(e), 2)
end
local function dropping_errors(fn, ...)
  local ok, e = xpcall(fn, fault_trace, ...)
  if not ok and type(e) ~= "table" then
    io.stderr:write("async_mutex: error in a Redis lock's background request: ", e, "\n")
  end
end
local function background(fn, ...)
  local co = co_create(dropping_errors)
  co_resume(co, fn, ...)
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
-- is held or waited for (so that an idle client keeps no loop running and
-- uv.run() can return); it is dropped one loop turn after the last use.

local hubs = setmetatable({}, { __mode = "k" })

-- 'ended': no grant of this waiter with a fence up to it can be taken:
-- each ended before a request that found the waiter not holding (the n of
-- that request's answer, see ask), and its message may still come: the
-- fences of later grants are larger.  For the same reason a message read
-- while the waiter has one already (of a grant that a request in flight
-- may find ended) replaces it when its fence is larger.

-- A message is "token fence value" (a grant) or "token fence lost" (a
-- steal, redis_scripts.lua).  The token is cut at its first space by a
-- plain find, and the short rest matched from there: a class pattern over
-- the token's 65 characters (%S+) cost about 4,300 instructions per
-- message, on the path of every hand-off (docs/bench.md, "RedisRWLock:
-- where a queued reader's cost goes").  A token is only looked up (a
-- waiter's, a lease's): one that is not ours finds nothing.
local function on_message(hub, message)
  local space = str_find(message, " ", 1, true)
  if not space or space == 1 then return end
  local fence, value = str_match(message, "^(%d+) (%-?%d+)$", space + 1)
  if not fence then
    -- a steal ended the hold (token, fence) of this process
    fence = str_match(message, "^(%d+) lost$", space + 1)
    if fence then
      leases().stolen(hub, str_sub(message, 1, space - 1), tointeger(tonumber(fence)))
    end
    return
  end
  local w = hub.waiters[str_sub(message, 1, space - 1)]
  if w then
    fence = tointeger(tonumber(fence))
    if (w.ended and fence <= w.ended) or (w.fence and fence <= w.fence) then return end
    w.fence, w.value = fence, tointeger(tonumber(value))
    -- a waiter that sleeps has a bell: its coroutine is resumed by the core
    if w.bell then w.bell:release() end
  end
end

local giveback_timer                 -- made with the first hub (redis_lock_lease.lua)

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
        if hb then leases().client_closed(hb) end
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
        if hb then leases().client_closed(hb) end
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

return {
  CLOSED = CLOSED, NS = NS, is_cluster = is_cluster,
  cluster = function() return cluster end,
  giveback_timer = function() return giveback_timer end,
  random_hex = random_hex, background = background, dropping_errors = dropping_errors,
  eval = eval,
  send_release = send_release, release_token = release_token,
  get_hub = get_hub, hub_use = hub_use, hub_unuse = hub_unuse,
  unsubscribe_if_idle = unsubscribe_if_idle, subscribed = subscribed, subscribe = subscribe,
  replicated = replicated, confirm_grant = confirm_grant,
}
