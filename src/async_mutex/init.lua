--- async_mutex: async-mutex's Mutex and Semaphore for Lua coroutines on luv.
-- The C core (async_mutex.core) owns the queues and the scheduling; this
-- layer composes its calls into runExclusive, withTimeout, tryAcquire and
-- the multi-key requests of keyed locks.

local core = require "async_mutex.core"
local uv = require "luv"

local error, getmetatable, ipairs, pcall, rawget, setmetatable, type =
  error, getmetatable, ipairs, pcall, rawget, setmetatable, type
local huge, max, sort = math.huge, math.max, table.sort
local now = uv.now

local kind_of = core.kind
local limited_acquire = core.acquire

local M = {
  _VERSION = "0.1.0",             -- the release; `make rock` reads it here
  E_TIMEOUT = core.E_TIMEOUT,
  E_ALREADY_LOCKED = core.E_ALREADY_LOCKED,
  E_CANCELED = core.E_CANCELED,
  E_MAX_PENDING = core.E_MAX_PENDING,
  E_UNAVAILABLE = "redis server unavailable",   -- async_mutex.redis (docs/redis.md)
  E_LOST = "lock lost: lease expired",
  setErrorHandler = core.setErrorHandler,
  pending = core.pending,
}

local KINDS = { "Mutex", "Semaphore", "KeyedMutex", "KeyedSemaphore" }
local is_keyed = { KeyedMutex = true, KeyedSemaphore = true }

local function typename(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__name")) == "string"
    and mt.__name or type(v)
end

-- Raises an argument error at 'level' (1 = the caller of argerror).
local function argerror(level, n, fname, msg)
  error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), level + 1)
end

local function is_callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end


-- A decorated lock is a table {lock, limit, err}: limit is a timeout in
-- ms (withTimeout) or false (tryAcquire).  It shares all state with the
-- lock; only the requests (acquire, waitForUnlock, runExclusive, and the
-- multi-key ones) behave differently.
local decorated = {}

-- The metatables each kind's wrappers accept as self: plain and decorated.
local accepts = {}

for _, kind in ipairs(KINDS) do
  decorated[kind] = { __name = "async_mutex.decorated " .. kind }
  local sample = kind:find("Semaphore") and core[kind].new(1) or core[kind].new()
  accepts[kind] = { [getmetatable(sample)] = true, [decorated[kind]] = true }
end

local function check_self(self, kind, fname)
  if not accepts[kind][getmetatable(self)] then
    argerror(3, 1, fname, ("async_mutex.%s expected, got %s"):format(kind, typename(self)))
  end
end


-- {========================================================== runExclusive
-- The releaser is to-be-closed: it releases when runExclusive returns, and
-- when the coroutine is closed while fn is suspended.  fn's error is
-- caught so as to release before it propagates (an error that kills a
-- coroutine closes nothing until the coroutine is closed), then re-raised
-- unchanged (level 0).

local function finish(release, ok, ...)
  if not ok then
    release()
    error((...), 0)
  end
  return ...
end

local function check_fn(fn, n)
  if not is_callable(fn) then
    argerror(3, n, "runExclusive", "function expected, got " .. typename(fn))
  end
end

local run = {}

function run.Mutex(self, fn, priority)
  check_self(self, "Mutex", "runExclusive")
  check_fn(fn, 1)
  local release <close> = self:acquire(priority)
  return finish(release, pcall(fn))
end

function run.Semaphore(self, fn, weight, priority)
  check_self(self, "Semaphore", "runExclusive")
  check_fn(fn, 1)
  local value, release <close> = self:acquire(weight, priority)
  return finish(release, pcall(fn, value))
end

function run.KeyedMutex(self, key, fn, priority)
  check_self(self, "KeyedMutex", "runExclusive")
  check_fn(fn, 2)
  local release <close> = self:acquire(key, priority)
  return finish(release, pcall(fn))
end

function run.KeyedSemaphore(self, key, fn, weight, priority)
  check_self(self, "KeyedSemaphore", "runExclusive")
  check_fn(fn, 2)
  local value, release <close> = self:acquire(key, weight, priority)
  return finish(release, pcall(fn, value))
end

-- }==========================================================


-- {========================================================== multi-key
-- acquireAll takes every key of a set, all or nothing.  Keys are taken in
-- one canonical order whatever order the caller gives, so two callers
-- with overlapping sets cannot deadlock; duplicates are dropped.  If a
-- key cannot be had (timeout, cancel, tryAcquire, error, the coroutine
-- being closed) the keys already taken are released.

local RANK = { boolean = 1, number = 2, string = 3 }

local function before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    local ra, rb = RANK[ta] or 4, RANK[tb] or 4
    if ra ~= rb then return ra < rb end
    return ta < tb
  end
  if ta == "number" or ta == "string" then return a < b end
  if ta == "boolean" then return b and not a end
  return ("%p"):format(a) < ("%p"):format(b)    -- tables, userdata, ...
end

local function canonical(keys, fname)
  if type(keys) ~= "table" then
    argerror(3, 1, fname, "table of keys expected, got " .. typename(keys))
  end
  local n = #keys
  if n == 0 then argerror(3, 1, fname, "key set must not be empty") end
  local seen, sorted = {}, {}
  for i = 1, n do
    local key = keys[i]
    if key == nil then argerror(3, 1, fname, ("key #%d must not be nil"):format(i)) end
    if key ~= key then argerror(3, 1, fname, ("key #%d must not be NaN"):format(i)) end
    if not seen[key] then
      seen[key] = true
      sorted[#sorted + 1] = key
    end
  end
  sort(sorted, before)
  return sorted
end

-- A releaser of several keys: callable and to-be-closed, first call only.
local multi = { __name = "async_mutex.MultiReleaser" }
local function release_all(self)
  if not self.done then
    self.done = true
    for i = #self, 1, -1 do self[i]() end
  end
end
multi.__call, multi.__close = release_all, release_all

-- Releases what was taken unless the acquisition completed.
local guard = { __close = function(self) if not self.done then release_all(self) end end }

-- The releaser is the last value a keyed acquire returns.
local function releaser(a, b) return b or a end

local function acquire_all(self, kind, fname, keys, ...)
  check_self(self, kind, fname)
  local sorted = canonical(keys, fname)
  local lock, limit, err = self, nil, nil
  if getmetatable(self) == decorated[kind] then lock, limit, err = self[1], self[2], self[3] end
  local deadline = type(limit) == "number" and limit ~= huge and now() + limit
  local held <close> = setmetatable({}, guard)
  for i = 1, #sorted do
    if limit == nil then
      held[i] = releaser(lock:acquire(sorted[i], ...))
    else
      local left = deadline and max(0, deadline - now()) or limit
      held[i] = releaser(limited_acquire(lock, left, err, sorted[i], ...))
    end
  end
  held.done = true
  local all = setmetatable({}, multi)
  for i = 1, #held do all[i] = held[i] end
  return all
end

local all = {}

function all.KeyedMutex(self, keys, priority)
  return acquire_all(self, "KeyedMutex", "acquireAll", keys, priority)
end

function all.KeyedSemaphore(self, keys, weight, priority)
  return acquire_all(self, "KeyedSemaphore", "acquireAll", keys, weight, priority)
end

local function run_all(self, kind, keys, fn, ...)
  check_self(self, kind, "runExclusiveAll")
  if not is_callable(fn) then
    argerror(2, 2, "runExclusiveAll", "function expected, got " .. typename(fn))
  end
  local release <close> = acquire_all(self, kind, "runExclusiveAll", keys, ...)
  return finish(release, pcall(fn))
end

local run_all_of = {}

function run_all_of.KeyedMutex(self, keys, fn, priority)
  return run_all(self, "KeyedMutex", keys, fn, priority)
end

function run_all_of.KeyedSemaphore(self, keys, fn, weight, priority)
  return run_all(self, "KeyedSemaphore", keys, fn, weight, priority)
end

-- }==========================================================


-- {========================================================== methods

local FORWARDED = {
  Mutex = { "isLocked", "release", "cancel" },
  Semaphore = { "isLocked", "release", "cancel", "getValue", "setValue" },
  KeyedMutex = { "isLocked", "release", "cancel", "count", "waiting", "keys" },
  KeyedSemaphore = { "isLocked", "release", "cancel", "getValue", "count",
                     "waiting", "keys" },
}

local function unwrap(self, kind, fname)
  if getmetatable(self) ~= decorated[kind] then
    argerror(3, 1, fname, ("decorated %s expected, got %s"):format(kind, typename(self)))
  end
  return self[1], self[2], self[3]
end

for _, kind in ipairs(KINDS) do
  -- the plain type: interpose the Lua-written methods
  local methods = core[kind].methods
  methods.runExclusive = run[kind]
  if is_keyed[kind] then
    methods.acquireAll = all[kind]
    methods.runExclusiveAll = run_all_of[kind]
  end
  M[kind] = { new = core[kind].new }

  -- the decorated type
  local dmethods = {
    runExclusive = run[kind],
    acquireAll = all[kind],
    runExclusiveAll = run_all_of[kind],
  }
  decorated[kind].__index = dmethods

  dmethods.acquire, dmethods.waitForUnlock = core.decorate(decorated[kind], kind)

  for _, method in ipairs(FORWARDED[kind]) do
    dmethods[method] = function(self, ...)
      local lock = unwrap(self, kind, method)
      return lock[method](lock, ...)
    end
  end
end

-- }==========================================================


-- {========================================================== decorators

local function decorate(fname, lock, limit, err)
  local mt = getmetatable(lock)
  if type(mt) == "table" and type(rawget(mt, "__decorate")) == "function" then
    return mt.__decorate(lock, limit, err)      -- a Redis lock (redis_lock.lua)
  end
  local kind = kind_of(lock)
  if not kind then
    argerror(3, 1, fname, "async_mutex lock expected, got " .. typename(lock))
  end
  return setmetatable({ lock, limit, err }, decorated[kind])
end

--- withTimeout(lock, ms [, timeout_error]): the lock, whose requests raise
-- timeout_error when not granted within ms milliseconds.
function M.withTimeout(lock, ms, timeout_error)
  if type(ms) ~= "number" or not (ms >= 0) then
    argerror(2, 2, "withTimeout", "timeout must be a non-negative number")
  end
  if timeout_error == nil then timeout_error = M.E_TIMEOUT end
  local d = decorate("withTimeout", lock, ms, timeout_error)
  return d                    -- not a tail call: errors name our caller
end

--- tryAcquire(lock [, already_locked_error]): the lock, whose requests
-- raise already_locked_error at once when they cannot succeed now.
function M.tryAcquire(lock, already_locked_error)
  if already_locked_error == nil then already_locked_error = M.E_ALREADY_LOCKED end
  local d = decorate("tryAcquire", lock, false, already_locked_error)
  return d
end

-- }==========================================================


-- The Redis locks live in async_mutex.redis_lock, loaded on first use so
-- that this module loads without Redis support (docs/redis-locks.md).
local REDIS_LOCKS = { RedisMutex = true, RedisSemaphore = true, KeyedRedisMutex = true }
setmetatable(M, { __index = function(_, name)
  if REDIS_LOCKS[name] then return require("async_mutex.redis_lock")[name] end
end })

return M
