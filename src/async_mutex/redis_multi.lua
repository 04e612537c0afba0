--- async_mutex.redis_multi: acquireAll and runExclusiveAll for the keyed
-- Redis locks (KeyedRedisMutex; KeyedRedisRWLock's reads and writes),
-- several keys at once, all or nothing (docs/redis-locks.md, "Several keys
-- at once").
--
-- The keys are taken as one atomic script when every one of their locks
-- is free in Redis (no holder, nobody queued): one request, and no other
-- process ever sees part of them held.  Otherwise they are taken one by
-- one, each through its gate and its Redis queue as a single key is, in one
-- canonical order that every process shares (the lock names' bytes, not
-- the locale's collation), so two acquireAll of overlapping keys cannot
-- deadlock: a process waits only for a key above every key it holds.  A key
-- that cannot be had (timeout, cancel, try, error, the coroutine closed)
-- gives back the keys taken before it.  The releaser gives every key back,
-- each by its own request, all in flight at once, even when one fails.

local core = require "async_mutex.core"
local base = require "async_mutex.redis_lock_base"
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local uv = require "luv"

local error, getmetatable, ipairs, pcall, setmetatable, tointeger, tonumber, type, unpack =
  error, getmetatable, ipairs, pcall, setmetatable, math.tointeger, tonumber, type, table.unpack
local co_create, co_resume, isyieldable = coroutine.create, coroutine.resume, coroutine.isyieldable
local byte, format, concat, sort = string.byte, string.format, table.concat, table.sort
local min, max, huge = math.min, math.max, math.huge
local hrtime = uv.hrtime
local typeerror = checks.typeerror
local typename, argerror, is_callable = checks.typename, checks.argerror, checks.is_callable
local NS = base.NS

local M = {}

--- ACQUIRE_ALL: KEYS N:h, N:q, N:n of each lock; ARGV ttl, weight, limit,
-- then one token per lock.  If no lock has a holder or a queue, grants
-- each to its token, as the acquire script grants a free lock
-- (redis_scripts.lua: the record "end weight fence value", N:h expiring
-- with the lease, the fence max(last + 1, server time in us)), and returns
-- {1, fence...}; otherwise {0, i} (the first lock that is not free) and
-- changes nothing.
M.ACQUIRE_ALL = [[
local n = #KEYS / 3
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[3 * i + 1], KEYS[3 * i + 2]) ~= 0 then return {0, i + 1} end
end
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local e = string.format('%d', sec * 1000 + math.floor(usec / 1000) + tonumber(ARGV[1]))
local rest = ' ' .. ARGV[2] .. ' '
local out = {1}
for i = 0, n - 1 do
  local last = tonumber(redis.call('GET', KEYS[3 * i + 3]) or '0')
  local fence = string.format('%d', math.max(last + 1, sec * 1000000 + usec))
  redis.call('SET', KEYS[3 * i + 3], fence, 'PX', 3600000)
  redis.call('HSET', KEYS[3 * i + 1], ARGV[4 + i], e .. rest .. fence .. ' ' .. ARGV[3])
  redis.call('PEXPIREAT', KEYS[3 * i + 1], e)
  out[i + 2] = fence
end
return out
]]

-- Byte order, whatever the locale (Lua's < on strings is strcoll's): the
-- order must be the same in every process.
local function bytewise(a, b)
  for i = 1, min(#a, #b) do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- The keys of 'keys' as {key, name} records, one per lock name, sorted by
-- name; the usage errors of the local acquireAll, and the Redis keys' own.
local function canonical(lk, keys, fname)
  if type(keys) ~= "table" then
    typeerror(1, fname, "table of keys", keys)
  end
  local n = #keys
  if n == 0 then argerror(1, fname, "key set must not be empty") end
  local seen, sorted, names = {}, {}, {}
  for i = 1, n do
    local key = keys[i]
    local t = type(key)
    local k
    if t == "string" then
      if key == "" and lk.name == "" then
        argerror(1, fname, format("key #%d must not be empty when the prefix is empty"
          .. " (a lock name must be a non-empty string)", i))
      end
      k = key
    elseif t == "number" and key == key and key ~= huge and key ~= -huge then
      local int = tointeger(key)
      k = int and format("%d", int) or format("%.17g", key)
    else
      argerror(1, fname, format("key #%d must be a string or a finite number, got %s", i,
        typename(key)))
    end
    local name = lk.name .. k
    names[i] = name
    if not seen[name] then
      seen[name] = true
      sorted[#sorted + 1] = { key, name }
    end
  end
  sort(sorted, function(a, b) return bytewise(a[2], b[2]) end)
  return sorted, names
end

-- {========================================================== releaser
-- What acquireAll returns: the leases of its keys, released together.

local Multi = { __name = "async_mutex.RedisMultiReleaser" }
local multi_methods = {}
Multi.__index = multi_methods

-- Whether a key's hold was lost.
local function lost(m)
  for i = 1, #m do
    local lease = m[i]
    if lease.state == "held" and hrtime() >= lease.valid_until then base.lose(lease, "expired") end
    if lease.state == "lost" then return true end
  end
  return false
end

-- Calls fn(x) for every x of 'list' (in coroutines of their own, all at
-- once, when the caller can yield and wait for them all); returns the
-- results, and the first error raised (every call is made, whatever the
-- others did).
local function each(list, fn)
  local n = #list
  local results, first_err = {}, nil
  local function call(i)
    local ok, r = pcall(fn, list[i])
    if ok then results[i] = r elseif first_err == nil then first_err = r end
  end
  if n == 1 or not isyieldable() then
    for i = 1, n do call(i) end
    return results, first_err
  end
  local left, waiting = n, nil
  local bell = core.dbg_internal(core.Semaphore.new(0))
  for i = 1, n do
    co_resume(co_create(function()
      call(i)
      left = left - 1
      if left == 0 and waiting then bell:release() end
    end))
  end
  if left > 0 then
    waiting = true
    local _ = bell:acquire()
  end
  return results, first_err
end

M.each = each

-- true if this call gave every key back with its hold in place; false if
-- it had been called before, or if a key's hold was lost (or ended by a
-- close).  Each key is released as a single key's releaser releases it
-- (in a coroutine, waiting for Redis); a release that raises does not keep
-- the others, and its error is raised once all are done.
local function release_all(m)
  if m.done then return false end
  m.done = true
  local results, err = each(m, base.release_lease)
  if err ~= nil then error(err, 0) end
  for i = 1, #m do
    if not results[i] then return false end
  end
  return true
end

Multi.__call, Multi.__close = release_all, release_all

--- releaser:check(): raises the lost error if a key's hold was lost; true
-- while every key is held, false once they were given back.
function multi_methods.check(m)
  if getmetatable(m) ~= Multi then
    typeerror(1, "check", "async_mutex.RedisMultiReleaser", m)
  end
  if lost(m) then error(m[1].lock.lost_error, 0) end
  if m.done then return false end
  for i = 1, #m do
    if m[i].state ~= "held" then return false end
  end
  return true
end

function Multi.__tostring(m)
  local names = {}
  for i = 1, #m do names[i] = m[i].keys.name end
  return format("async_mutex.RedisMultiReleaser (%s, %s)", concat(names, ", "),
                m.done and "released" or "held")
end

-- The releaser of 'leases' (in the keys' canonical order); 'fences' maps
-- each key as the caller gave it ('keys', whose lock names are 'names') to
-- its hold's fence.
local function new_multi(leases, sorted, keys, names)
  local m = setmetatable({ done = false }, Multi)
  local fence_of = {}
  for i, lease in ipairs(leases) do
    m[i] = lease
    fence_of[sorted[i][2]] = lease.fence
  end
  local fences = {}
  for i = 1, #keys do fences[keys[i]] = fence_of[names[i]] end
  m.fences = fences
  return m
end

-- }==========================================================

-- Keys in Redis of the atomic request: N:h, N:q and N:n of each lock.
local function atomic_keys(lk, sorted)
  local list, keys = {}, {}
  for i, rec in ipairs(sorted) do
    local k = base.keys_of(lk, rec[2])
    keys[i] = k
    list[#list + 1] = k[1]
    list[#list + 1] = k[2]
    list[#list + 1] = k[5]
  end
  return list, keys
end

-- The atomic path: every key in one request if every lock is free in
-- Redis; nil if one is not (nothing granted).  The tokens are known to the
-- hub while the request is out, so that a close() gives back what it
-- granted; a request that fails (the client closed, Redis unreachable)
-- gives them back in the background, as a waiter that gives up does.
local function take_atomic(lk, sorted, s_weight)
  local hub = lk.hub
  if hub.closed then error(base.CLOSED, 0) end
  if hub.evicts ~= false then base.eviction(lk) end
  local list, keys = atomic_keys(lk, sorted)
  local n = #sorted
  local tokens, records = {}, {}
  for i = 1, n do
    tokens[i] = hub.id .. ":" .. base.random_hex()
    records[i] = { keys = keys[i], token = tokens[i] }
    hub.waiters[tokens[i]] = records[i]
  end
  local settled = false
  local _ <close> = setmetatable({}, { __close = function()
    for i = 1, n do
      if hub.waiters[tokens[i]] == records[i] then hub.waiters[tokens[i]] = nil end
      if not settled then base.background(base.release_token, lk, keys[i], tokens[i]) end
    end
  end })
  local sent = hrtime()
  local r = base.eval(lk, M.ACQUIRE_ALL, list, lk.s_ttl, s_weight, lk.s_limit,
                      unpack(tokens, 1, n))
  if r[1] ~= 1 then
    settled = true                  -- nothing was granted
    if hub.evicts == nil then base.eviction(lk) end
    return nil
  end
  if hub.evicts == nil then base.eviction(lk) end   -- a new connection: refused, given back
  -- (replicas: not confirmed, every token is given back, as on a failure)
  if lk.replicas then base.confirm_grant(lk) end
  settled = true
  local leases = {}
  for i = 1, n do
    base.hub_use(hub)
    leases[i] = base.new_lease(lk, keys[i], tokens[i], tointeger(tonumber(r[i + 1])), sent,
                               lk.ttl)
  end
  -- Closed by a finalizer or a hook since the answer (at an allocation or
  -- a luv call of new_lease): the close gave every token back (still
  -- waiters' here, or holds'); the holds are not handed out, as
  -- redis_acquire does not hand out its own.
  if hub.closed then
    for i = 1, n do base.end_after_close(leases[i]) end
    error(base.CLOSED, 0)
  end
  return leases
end

-- Gives back the leases taken so far, unless the acquisition completed;
-- in the background: the caller's error is raised at once.
local Partial = { __close = function(p)
  if p.done then return end
  for i = 1, #p do base.background(base.release_lease, p[i]) end
end }

-- The whole acquisition of 'sorted' with 'weight' (the decorator's limit
-- and error as for one key: nil, ms, or false for a try).
local function acquire_all(lk, limit, err, sorted, weight, priority, on_lease)
  local s_weight = weight == 1 and "1" or format("%d", weight)
  local gate = lk.gate
  local free = true
  for _, rec in ipairs(sorted) do
    if gate:isLocked(rec[1]) then free = false; break end
  end
  -- on a cluster, keys in several slots cannot be taken by one script:
  -- one at a time in the canonical order, a try too (all or nothing: what
  -- it took is given back when one is refused)
  local split = lk.cluster and base.split(lk, sorted)
  local deadline = base.deadline_of(limit)
  if free and not split then
    local leases = take_atomic(lk, sorted, s_weight)
    if leases then
      if on_lease then for _, l in ipairs(leases) do on_lease(l) end end
      return leases
    end
  end
  if limit == false and not split then error(err, 0) end  -- a try: all at once or nothing
  local taken <close> = setmetatable({}, Partial)
  for i, rec in ipairs(sorted) do
    local left = limit
    if deadline then left = max(0, (deadline - hrtime()) / NS) end
    taken[i] = base.acquire(lk, left, err, rec[1], rec[2], weight, priority)
    if on_lease then on_lease(taken[i]) end
  end
  taken.done = true
  local leases = {}
  for i = 1, #taken do leases[i] = taken[i] end
  return leases
end

-- runExclusiveAll's end, as a single key's (redis_lock_base.finish): the
-- lost error when a key's hold was lost while fn ran.
local function finish(lk, release, ok, ...)
  if not ok then
    release()
    error((...), 0)
  end
  if not release() and lost(release) then error(lk.lost_error, 0) end
  return ...
end

--- Adds the multi-key methods to the keyed Redis lock kind of metatable
-- 'mt' (methods table 'methods'): for each mode {all = "acquireAll", run =
-- "runExclusiveAll", weight = ..., on_lease = fn or nil}.
function M.install(methods, mt, modes)
  for _, mode in ipairs(modes) do
    local fname, run_name, weight, on_lease = mode.all, mode.run, mode.weight, mode.on_lease
    methods[fname] = function(self, keys, priority)
      local lk, limit, err = base.check_self(self, mt, fname)
      local sorted, names = canonical(lk, keys, fname)
      base.check_priority(priority, 2, fname)
      base.check_usable(lk, "acquire a Redis lock")
      local release = new_multi(acquire_all(lk, limit, err, sorted, weight, priority, on_lease),
                                sorted, keys, names)
      return release
    end
    methods[run_name] = function(self, keys, fn, priority)
      local lk, limit, err = base.check_self(self, mt, run_name)
      local sorted, names = canonical(lk, keys, run_name)
      if not is_callable(fn) then
        typeerror(2, run_name, "function", fn)
      end
      base.check_priority(priority, 3, run_name)
      base.check_usable(lk, "acquire a Redis lock")
      local release <close> = new_multi(acquire_all(lk, limit, err, sorted, weight, priority,
                                                    on_lease), sorted, keys, names)
      return finish(lk, release, pcall(fn))
    end
  end
end

return M
