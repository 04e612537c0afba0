--- async_mutex.optimistic: the retry loop of optimistic concurrency, for
-- any store that has a conditional write (SQL's `UPDATE ... WHERE version =
-- ?`, a Redis script, a compare-and-set in memory).
--
-- am.optimistic(fn [, options]) calls fn(attempt); fn reads, computes and
-- tries one conditional write, and returns true (and any results) when the
-- write went through, false when it lost to another writer.  On false the
-- loop sleeps on luv's loop with am.sleep (capped exponential backoff with
-- full jitter) and calls fn again, up to options.maxAttempts times, then
-- raises E_CONFLICT.  An error raised by fn propagates at once: nothing is
-- retried.  docs/optimistic.md explains the choices.
--
-- init.lua installs it: require("async_mutex.optimistic").install(am).

local coroutine, error, pairs, tostring, type =
  coroutine, error, pairs, tostring, type
local pack, unpack = table.pack, table.unpack
local floor, huge, min, mtype, random =
  math.floor, math.huge, math.min, math.type, math.random

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local typename, is_callable, unknown_option =
  checks.typename, checks.is_callable, checks.unknown_option

local M = {}

--- Raised when every attempt conflicted (an exact value, compared with ==).
M.E_CONFLICT = "optimistic update gave up: too many conflicts"

-- The defaults: 10 attempts, sleeps capped by 1, 2, 4, ... ms and by 100 ms.
local DEFAULTS = { maxAttempts = 10, baseDelay = 1, maxDelay = 100 }


-- {========================================================== options

-- Each check returns the option's value, or nil and the complaint.
local CHECKS = {}

function CHECKS.maxAttempts(v)
  if v == huge then return v end
  if mtype(v) == "float" and v == floor(v) then v = floor(v) end
  if mtype(v) ~= "integer" or v < 1 then
    return nil, "maxAttempts must be a positive integer or math.huge"
  end
  return v
end

local function delay(name)
  return function(v)
    if type(v) ~= "number" or not (v >= 0) or v == huge then
      return nil, name .. " must be a non-negative finite number"
    end
    return v
  end
end
CHECKS.baseDelay = delay("baseDelay")
CHECKS.maxDelay = delay("maxDelay")

local function callable(name)
  return function(v)
    if not is_callable(v) then
      return nil, ("%s must be a function, got %s"):format(name, typename(v))
    end
    return v
  end
end
CHECKS.random = callable("random")
CHECKS.sleep = callable("sleep")

function CHECKS.conflictError(v) return v end

-- The options as a fresh table with every field set (defaults filled in),
-- or nil and what is wrong with them.
local function read_options(options, default_sleep)
  local o = { maxAttempts = DEFAULTS.maxAttempts, baseDelay = DEFAULTS.baseDelay,
    maxDelay = DEFAULTS.maxDelay, random = random, sleep = default_sleep,
    conflictError = M.E_CONFLICT }
  if options == nil then return o end
  if type(options) ~= "table" then
    return nil, "table expected, got " .. typename(options)
  end
  local unknown = unknown_option(options, CHECKS)
  if unknown then return nil, unknown end
  for k, v in pairs(options) do
    local value, complaint = CHECKS[k](v)
    if complaint then return nil, complaint end
    o[k] = value
  end
  return o
end

-- }==========================================================


-- {========================================================== the loop

--- The sleep before attempt `attempt + 1`, in whole milliseconds: full
-- jitter, uniform over 0 .. cap, where cap = min(maxDelay, baseDelay *
-- 2^(attempt - 1)) (rounded down).  `random()` must return a number in
-- [0, 1), as math.random() does.
local function backoff(o, attempt)
  local cap = floor(min(o.maxDelay, o.baseDelay * 2.0 ^ (attempt - 1)))
  local r = o.random()
  if type(r) ~= "number" or not (r >= 0 and r < 1) then
    error(("optimistic: options.random must return a number in [0, 1), got %s")
      :format(type(r) == "number" and tostring(r) or typename(r)), 0)
  end
  local ms = floor(r * (cap + 1))
  return ms <= cap and ms or cap
end

-- What fn returned: true and results, or false.  Anything else is an error
-- in fn (a forgotten return is the usual one).
local function outcome(written, ...)
  if written == true then return true, ... end
  if written == false then return false end
  usage_error(("optimistic: fn must return true (written) or false (conflict), got %s")
    :format(typename(written)))
end

--- What is wrong with `options` for optimistic (a message for an
-- argument error), or nil when nothing is: for wrappers that check the
-- options they pass on before they start (versioned:update).
function M.check_options(options)
  local o, complaint = read_options(options, nil)
  return not o and complaint or nil
end

function M.install(am)
  am.E_CONFLICT = M.E_CONFLICT

  --- optimistic(fn [, options]): calls fn(attempt) until it returns true,
  -- sleeping between attempts; returns what fn returned after true.
  function am.optimistic(...)
    local fn, options = ...
    if not is_callable(fn) then
      checks.typeerror(1, "optimistic", "function", ...)
    end
    local o, complaint = read_options(options, am.sleep)
    if not o then
      checks.argerror(2, "optimistic", complaint)
    end
    if not coroutine.isyieldable() then
      usage_error("attempt to run an optimistic update outside a coroutine")
    end
    local attempt = 1
    while true do
      local results = pack(outcome(fn(attempt)))
      if results[1] then return unpack(results, 2, results.n) end
      if attempt >= o.maxAttempts then error(o.conflictError, 0) end
      o.sleep(backoff(o, attempt))
      attempt = attempt + 1
    end
  end
end

-- }==========================================================

return M
