--- async_mutex: async-mutex's Mutex and Semaphore for Lua coroutines on luv.
-- The C core (async_mutex.core) owns the queues and the scheduling; this
-- layer composes its calls into runExclusive, withTimeout and tryAcquire.

local core = require "async_mutex.core"

local error, getmetatable, pcall, setmetatable, type =
  error, getmetatable, pcall, setmetatable, type
local ipairs, pairs, rawget = ipairs, pairs, rawget

local kind = core.kind
local limited_acquire, limited_wait = core.acquire, core.waitForUnlock

local M = {
  E_TIMEOUT = core.E_TIMEOUT,
  E_ALREADY_LOCKED = core.E_ALREADY_LOCKED,
  E_CANCELED = core.E_CANCELED,
  setErrorHandler = core.setErrorHandler,
  pending = core.pending,
}

local function typename(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__name")) == "string"
    and mt.__name or type(v)
end

local function is_callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

-- Raises an argument error at 'level' (1 = the caller of argerror).
local function argerror(level, n, fname, msg)
  error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), level + 1)
end

local function check_callable(fn)
  if not is_callable(fn) then
    argerror(3, 1, "runExclusive", "function expected, got " .. typename(fn))
  end
end


-- A decorated lock is a table {lock, limit, err}: limit is a timeout in
-- ms (withTimeout) or false (tryAcquire).  It shares all state with the
-- lock; only acquire, waitForUnlock and runExclusive behave differently.
local decorated = { Mutex = {}, Semaphore = {} }

-- Which objects each runExclusive serves (by metatable).
local runs_mutex = {
  [getmetatable(core.Mutex.new())] = true, [decorated.Mutex] = true,
}
local runs_semaphore = {
  [getmetatable(core.Semaphore.new(1))] = true, [decorated.Semaphore] = true,
}

-- runExclusive releases before fn's error propagates (an error that kills
-- a coroutine closes nothing until the coroutine is closed), and the
-- releaser is also to-be-closed, for when the coroutine is closed while fn
-- is suspended.  The error value is re-raised unchanged (level 0).
local function finish(release, ok, ...)
  release()
  if not ok then error((...), 0) end
  return ...
end

local function mutex_run(self, fn, priority)
  if not runs_mutex[getmetatable(self)] then
    argerror(2, 1, "runExclusive", "async_mutex.Mutex expected, got " .. typename(self))
  end
  check_callable(fn)
  local release <close> = self:acquire(priority)
  return finish(release, pcall(fn))
end

local function semaphore_run(self, fn, weight, priority)
  if not runs_semaphore[getmetatable(self)] then
    argerror(2, 1, "runExclusive", "async_mutex.Semaphore expected, got " .. typename(self))
  end
  check_callable(fn)
  local value, release <close> = self:acquire(weight, priority)
  return finish(release, pcall(fn, value))
end

core.Mutex.methods.runExclusive = mutex_run
core.Semaphore.methods.runExclusive = semaphore_run

M.Mutex = { new = core.Mutex.new }
M.Semaphore = { new = core.Semaphore.new }


-- {========================================================== decorators

local function unwrap(self, fname)
  local mt = getmetatable(self)
  if mt ~= decorated.Mutex and mt ~= decorated.Semaphore then
    argerror(3, 1, fname, "decorated lock expected, got " .. typename(self))
  end
  return self[1], self[2], self[3]
end

for name, mt in pairs(decorated) do
  local methods = {}
  mt.__index = methods
  mt.__name = "async_mutex.decorated " .. name

  function methods:acquire(...)
    local lock, limit, err = unwrap(self, "acquire")
    return limited_acquire(lock, limit, err, ...)
  end

  function methods:waitForUnlock(...)
    local lock, limit, err = unwrap(self, "waitForUnlock")
    return limited_wait(lock, limit, err, ...)
  end

  methods.runExclusive = name == "Mutex" and mutex_run or semaphore_run

  local forwarded = name == "Mutex"
    and { "isLocked", "release", "cancel" }
    or { "isLocked", "release", "cancel", "getValue", "setValue" }
  for _, method in ipairs(forwarded) do
    methods[method] = function(self, ...)
      local lock = unwrap(self, method)
      return lock[method](lock, ...)
    end
  end
end

local function decorate(fname, lock, limit, err)
  local k = kind(lock)
  if not k then
    argerror(3, 1, fname, "async_mutex.Mutex or async_mutex.Semaphore expected, got "
      .. typename(lock))
  end
  return setmetatable({ lock, limit, err }, decorated[k])
end

--- withTimeout(lock, ms [, timeout_error]): the lock, whose acquire,
-- runExclusive and waitForUnlock raise timeout_error after ms milliseconds.
function M.withTimeout(lock, ms, timeout_error)
  if type(ms) ~= "number" or not (ms >= 0) then
    argerror(2, 2, "withTimeout", "timeout must be a non-negative number")
  end
  if timeout_error == nil then timeout_error = M.E_TIMEOUT end
  local d = decorate("withTimeout", lock, ms, timeout_error)
  return d                    -- not a tail call: errors name our caller

end

--- tryAcquire(lock [, already_locked_error]): the lock, whose acquire,
-- runExclusive and waitForUnlock raise already_locked_error at once when
-- they cannot succeed now.
function M.tryAcquire(lock, already_locked_error)
  if already_locked_error == nil then already_locked_error = M.E_ALREADY_LOCKED end
  local d = decorate("tryAcquire", lock, false, already_locked_error)
  return d
end

-- }==========================================================

return M
