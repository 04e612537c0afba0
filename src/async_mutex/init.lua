--- async_mutex: async-mutex's Mutex and Semaphore for Lua coroutines on luv.
-- The C core (async_mutex.core) owns the queues and the scheduling; this
-- layer composes its calls into runExclusive, withTimeout, tryAcquire and
-- the multi-key requests of keyed locks.

local core = require "async_mutex.core"
local uv = require "luv"

local error, getmetatable, ipairs, pcall, rawget, setmetatable, type =
  error, getmetatable, ipairs, pcall, rawget, setmetatable, type
local huge, max, sort, tointeger = math.huge, math.max, table.sort, math.tointeger
local now = uv.now

local kind_of = core.kind
local limited_acquire = core.acquire

local M = {
  _VERSION = "0.1.0",             -- the release; `make rock` reads it here
  E_TIMEOUT = core.E_TIMEOUT,
  E_ALREADY_LOCKED = core.E_ALREADY_LOCKED,
  E_CANCELED = core.E_CANCELED,
  E_MAX_PENDING = core.E_MAX_PENDING,
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

-- The core's rules for a request's own arguments (src/request.c), checked
-- by the wrappers before they call the core, so that an error names the
-- wrapper and the argument as the user wrote them, at the user's line.
-- Numbers only: a numeric string is refused, as everywhere.
-- ('level': of the user's call, counted from the checker; default 3.)
local function check_weight(w, n, fname, level)
  if w ~= nil and not (type(w) == "number" and tointeger(w) and w > 0) then
    argerror(level or 3, n, fname, "weight must be a positive integer")
  end
end

local function check_priority(p, n, fname, level)
  if p == nil then return end
  if type(p) ~= "number" then
    argerror(level or 3, n, fname, "priority must be a number, got " .. type(p))
  end
  if p ~= p then argerror(level or 3, n, fname, "priority must not be NaN") end
end

local function check_key(key, n, fname)
  if key == nil then argerror(3, n, fname, "key must not be nil") end
  if key ~= key then argerror(3, n, fname, "key must not be NaN") end
end

-- A request's weight (semaphores) and priority, arguments n and n + 1
-- (a mutex: its priority, argument n).
local function check_request(kind, n, fname, a, b)
  if kind:find("Semaphore") then
    check_weight(a, n, fname, 4)
    check_priority(b, n + 1, fname, 4)
  else
    check_priority(a, n, fname, 4)
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
  check_priority(priority, 2, "runExclusive")
  local release <close> = self:acquire(priority)
  return finish(release, pcall(fn))
end

function run.Semaphore(self, fn, weight, priority)
  check_self(self, "Semaphore", "runExclusive")
  check_fn(fn, 1)
  check_weight(weight, 2, "runExclusive")
  check_priority(priority, 3, "runExclusive")
  local value, release <close> = self:acquire(weight, priority)
  return finish(release, pcall(fn, value))
end

function run.KeyedMutex(self, key, fn, priority)
  check_self(self, "KeyedMutex", "runExclusive")
  check_key(key, 1, "runExclusive")
  check_fn(fn, 2)
  check_priority(priority, 3, "runExclusive")
  local release <close> = self:acquire(key, priority)
  return finish(release, pcall(fn))
end

function run.KeyedSemaphore(self, key, fn, weight, priority)
  check_self(self, "KeyedSemaphore", "runExclusive")
  check_key(key, 1, "runExclusive")
  check_fn(fn, 2)
  check_weight(weight, 3, "runExclusive")
  check_priority(priority, 4, "runExclusive")
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

-- Takes the keys 'sorted' (canonical), the arguments already checked.
local function take_all(self, kind, sorted, ...)
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

local function acquire_all(self, kind, keys, ...)
  check_self(self, kind, "acquireAll")
  local sorted = canonical(keys, "acquireAll")
  check_request(kind, 2, "acquireAll", ...)
  return take_all(self, kind, sorted, ...)
end

local all = {}

function all.KeyedMutex(self, keys, priority)
  return acquire_all(self, "KeyedMutex", keys, priority)
end

function all.KeyedSemaphore(self, keys, weight, priority)
  return acquire_all(self, "KeyedSemaphore", keys, weight, priority)
end

local function run_all(self, kind, keys, fn, ...)
  check_self(self, kind, "runExclusiveAll")
  local sorted = canonical(keys, "runExclusiveAll")
  if not is_callable(fn) then
    argerror(2, 2, "runExclusiveAll", "function expected, got " .. typename(fn))
  end
  check_request(kind, 3, "runExclusiveAll", ...)
  local release <close> = take_all(self, kind, sorted, ...)
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

  -- C functions calling the lock's own in their frame: its errors name
  -- the method and the user's line (a Lua wrapper would be named '?')
  for _, method in ipairs(FORWARDED[kind]) do
    dmethods[method] = core.forward(decorated[kind], kind, methods[method], method)
  end
end

-- }==========================================================


-- {========================================================== decorators

local function decorate(fname, lock, limit, err)
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

return M
