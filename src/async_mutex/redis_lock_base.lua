--- async_mutex.redis_lock_base: the machinery every Redis lock shares
-- (RedisMutex, RedisSemaphore and KeyedRedisMutex in redis_lock.lua, and
-- the kinds built on them): the helpers of the lock records (here), and,
-- served through this module's table, the parts it is made of, one job
-- each: the hub of each client, the scripts' requests and `replicas`
-- (redis_lock_hub.lua); leases and the give-back at close
-- (redis_lock_lease.lua); the eviction check and the Redis half of an
-- acquisition, steal and query (redis_lock_acquire.lua).  The rules are in docs/redis-locks.md; the
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
local hub_m = require "async_mutex.redis_lock_hub"
local lease_m = require "async_mutex.redis_lock_lease"
local acquire_m = require "async_mutex.redis_lock_acquire"

local redis_internal = require("async_mutex.redis")._internal
local rcore = require "async_mutex.redis_core"
local is_client = redis_internal.is_client

local error, getmetatable, pairs, pcall, setmetatable, tostring, type =
  error, getmetatable, pairs, pcall, setmetatable, tostring, type
local isyieldable = coroutine.isyieldable
local huge, min, max, floor, tointeger = math.huge, math.min, math.max, math.floor, math.tointeger
local format = string.format
local hrtime, update_time = uv.hrtime, uv.update_time
local limited = core.acquire
-- The locks made here (gates, bells) are the library's own: debug mode
-- does not watch them (docs/debug.md, Deadlocks).
local internal = core.dbg_internal
local E_LOST = am.E_LOST

local CLOSED, NS, eval, get_hub, is_cluster =
  hub_m.CLOSED, hub_m.NS, hub_m.eval, hub_m.get_hub, hub_m.is_cluster
local release_lease = lease_m.release_lease
local eviction, doze, lock_keys, keys_of, redis_acquire =
  acquire_m.eviction, acquire_m.doze, acquire_m.lock_keys, acquire_m.keys_of,
  acquire_m.redis_acquire

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local typeerror = checks.typeerror
local typename, is_callable, argerror, unknown_option, check_open =
  checks.typename, checks.is_callable, checks.argerror, checks.unknown_option, checks.check_open

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
  typeerror(1, fname, mt.__name, self)
end

-- Worded as the core locks word it (src/core/args/args.c), so that a priority error
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
    typeerror(1, fname, "redis client", client)
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
    local timeout = lk.cluster and hub_m.cluster().command_timeout(client)
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
    typeerror(n, "runExclusive", "function", fn)
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

-- What the kinds use: the records' helpers above, and the functions of
-- the parts (which the kinds do not require themselves).
return {
  -- the lock records (this file)
  decorated_of = decorated_of, decorable = decorable, check_self = check_self,
  check_priority = check_priority, check_key = check_key, check_usable = check_usable,
  deadline_of = deadline_of, acquire = acquire, OPTIONS = OPTIONS, MAX_MS = MAX_MS,
  MAX_LIMIT = MAX_LIMIT, options_of = options_of, check_client = check_client,
  check_name = check_name, check_prefix = check_prefix, new_record = new_record,
  release_name = release_name, cancel = cancel, state = state,
  wait_for_unlock = wait_for_unlock, finish = finish, check_fn = check_fn,
  check_steal = check_steal, check_query_key = check_query_key, check_no_key = check_no_key,
  -- the hub, requests, replicas (redis_lock_hub.lua)
  CLOSED = CLOSED, NS = NS, random_hex = hub_m.random_hex, background = hub_m.background,
  dropping_errors = hub_m.dropping_errors,
  eval = eval, release_token = hub_m.release_token, get_hub = get_hub,
  hub_use = hub_m.hub_use, hub_unuse = hub_m.hub_unuse, subscribe = hub_m.subscribe,
  replicated = hub_m.replicated, confirm_grant = hub_m.confirm_grant,
  -- leases (redis_lock_lease.lua)
  Lease = lease_m.Lease, lease_methods = lease_m.lease_methods, drift = lease_m.drift,
  lose = lease_m.lose, forget = lease_m.forget, stolen = lease_m.stolen,
  new_lease = lease_m.new_lease, release_lease = release_lease,
  stop_timer = lease_m.stop_timer, end_after_close = lease_m.end_after_close,
  open_gate = lease_m.open_gate,
  NOT_A_WRITE_HOLD = lease_m.NOT_A_WRITE_HOLD,
  -- acquisition, steal, query (redis_lock_acquire.lua)
  eviction = eviction, doze = doze, lock_keys = lock_keys, keys_of = keys_of,
  split = acquire_m.split, redis_acquire = redis_acquire,
  redis_steal = acquire_m.redis_steal, redis_query = acquire_m.redis_query,
}
