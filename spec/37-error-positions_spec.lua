-- Usage errors are raised at the user's call, exactly as Lua's own argument
-- errors: "file:line: " of the line that called the module, whatever runs
-- in between (runExclusive, acquireAll, decorated locks, keyed locks), and
-- no position when the caller is C, such as pcall (docs/semantics.md,
-- Errors).  The other specs compare messages without their position; this
-- one asserts the position of every usage error docs/api.md lists, and of
-- the same errors reached through the wrappers.
local h = require "helpers"
local am = require "async_mutex"

local function f() end

-- Each case is a function whose body is one call, written on the line
-- that defines it, and the exact message it raises.
local function cases()
  local m, s = am.Mutex.new(), am.Semaphore.new(2)
  local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(2)
  local WEIGHT = "(weight must be a positive integer)"
  local PRIO = "(priority must be a number, got string)"
  return {
    { function() m:acquire("x") end, "bad argument #1 to 'acquire' " .. PRIO },
    { function() s:acquire(0) end, "bad argument #1 to 'acquire' " .. WEIGHT },
    { function() s:acquire(1, 0 / 0) end, "bad argument #2 to 'acquire' (priority must not be NaN)" },
    { function() s:waitForUnlock(0) end, "bad argument #1 to 'waitForUnlock' " .. WEIGHT },
    { function() s:release(0) end, "bad argument #1 to 'release' " .. WEIGHT },
    { function() s:setValue(1.5) end,
      "bad argument #1 to 'setValue' (number has no integer representation)" },
    { function() am.Semaphore.new() end, "bad argument #1 to 'new' (number expected, got no value)" },
    { function() m:runExclusive(42) end,
      "bad argument #1 to 'runExclusive' (function expected, got number)" },
    { function() am.withTimeout(m, -1) end,
      "bad argument #2 to 'withTimeout' (timeout must be a non-negative number)" },
    { function() am.withTimeout({}, 10) end,
      "bad argument #1 to 'withTimeout' (async_mutex lock expected, got table)" },
    { function() am.tryAcquire(nil) end,
      "bad argument #1 to 'tryAcquire' (async_mutex lock expected, got nil)" },
    { function() m.acquire() end,
      "bad argument #1 to 'acquire' (async_mutex.Mutex expected, got no value)" },
    { function() am.setErrorHandler(42) end,
      "bad argument #1 to 'setErrorHandler' (function or nil expected, got number)" },
    { function() km:acquire(nil) end, "bad argument #1 to 'acquire' (key must not be nil)" },
    { function() am.KeyedMutex.new({ maxPending = -1 }) end,
      "bad argument #1 to 'new' (maxPending must be a non-negative integer)" },
    -- through runExclusive: the numbers are runExclusive's
    { function() m:runExclusive(f, "x") end, "bad argument #2 to 'runExclusive' " .. PRIO },
    { function() s:runExclusive(f, 0) end, "bad argument #2 to 'runExclusive' " .. WEIGHT },
    { function() km:runExclusive(nil, f) end,
      "bad argument #1 to 'runExclusive' (key must not be nil)" },
    { function() km:runExclusive("k", f, "x") end, "bad argument #3 to 'runExclusive' " .. PRIO },
    { function() ks:runExclusive("k", f, 0) end, "bad argument #3 to 'runExclusive' " .. WEIGHT },
    -- through the multi-key requests
    { function() km:acquireAll({}) end, "bad argument #1 to 'acquireAll' (key set must not be empty)" },
    { function() km:acquireAll({ 1 }, "x") end, "bad argument #2 to 'acquireAll' " .. PRIO },
    { function() ks:acquireAll({ 1 }, 0) end, "bad argument #2 to 'acquireAll' " .. WEIGHT },
    { function() km:runExclusiveAll({}, f) end,
      "bad argument #1 to 'runExclusiveAll' (key set must not be empty)" },
    { function() km:runExclusiveAll({ 1 }, 42) end,
      "bad argument #2 to 'runExclusiveAll' (function expected, got number)" },
    { function() km:runExclusiveAll({ 1 }, f, "x") end,
      "bad argument #3 to 'runExclusiveAll' " .. PRIO },
    { function() ks:runExclusiveAll({ 1 }, f, 0) end,
      "bad argument #3 to 'runExclusiveAll' " .. WEIGHT },
    -- through decorated locks
    { function() am.withTimeout(s, 5):acquire(0) end, "bad argument #1 to 'acquire' " .. WEIGHT },
    { function() am.tryAcquire(s):waitForUnlock(0) end,
      "bad argument #1 to 'waitForUnlock' " .. WEIGHT },
    { function() am.withTimeout(s, 5):setValue(1.5) end,
      "bad argument #1 to 'setValue' (number has no integer representation)" },
    { function() am.tryAcquire(s):release(0) end, "bad argument #1 to 'release' " .. WEIGHT },
    { function() am.withTimeout(m, 5):runExclusive(f, "x") end,
      "bad argument #2 to 'runExclusive' " .. PRIO },
    { function() am.withTimeout(m, 5).acquire(m) end,
      "bad argument #1 to 'acquire' (decorated Mutex expected, got async_mutex.Mutex)" },
    { function() am.withTimeout(km, 5):acquire(nil) end,
      "bad argument #1 to 'acquire' (key must not be nil)" },
    { function() am.tryAcquire(km):isLocked(nil) end,
      "bad argument #1 to 'isLocked' (key must not be nil)" },
    { function() am.withTimeout(km, 5):runExclusive("k", f, "x") end,
      "bad argument #3 to 'runExclusive' " .. PRIO },
    { function() am.withTimeout(km, 5):acquireAll({}) end,
      "bad argument #1 to 'acquireAll' (key set must not be empty)" },
    { function() am.tryAcquire(ks):runExclusiveAll({ 1 }, f, 0) end,
      "bad argument #3 to 'runExclusiveAll' " .. WEIGHT },
  }
end

-- Misuse outside a coroutine, at the user's line too.
local function misuse()
  local m, s, km = am.Mutex.new(), am.Semaphore.new(0), am.KeyedMutex.new()
  local held = am.KeyedMutex.new()
  local ACQ = "attempt to acquire a mutex outside a coroutine"
  return {
    { function() m:acquire() end, ACQ },
    { function() s:waitForUnlock() end, "attempt to wait for a semaphore outside a coroutine" },
    { function() m:runExclusive(f) end, ACQ },
    { function() am.withTimeout(m, 5):runExclusive(f) end, ACQ },
    { function() km:acquire("k") end, ACQ },
    { function() km:runExclusive("k", f) end, ACQ },
    { function() held:acquireAll({ 1 }) end, ACQ },
    { function() held:runExclusiveAll({ 1 }, f) end, ACQ },
  }
end

local check = h.raises_at_caller

describe("usage errors", function()
  it("are positioned at the user's line, for every call of docs/api.md's table and through every wrapper",
    h.async(function()
      local pending = am.pending()
      for _, case in ipairs(cases()) do check(case) end
      assert.equal(pending, am.pending())
    end))

  it("are positioned at the user's line outside a coroutine too", function()
    for _, case in ipairs(misuse()) do check(case) end
  end)

  it("carry no position when the module is called directly by pcall", h.async(function()
    local m, s = am.Mutex.new(), am.Semaphore.new(2)
    local km = am.KeyedMutex.new()
    local function bare(...)
      local ok, err = pcall(...)
      assert.is_false(ok)
      return err
    end
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)",
      bare(m.acquire, m, "x"))
    assert.equal("bad argument #2 to 'withTimeout' (timeout must be a non-negative number)",
      bare(am.withTimeout, m, -1))
    assert.equal("bad argument #2 to 'runExclusive' (priority must be a number, got string)",
      bare(m.runExclusive, m, f, "x"))
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got number)",
      bare(s.runExclusive, s, 42))
    assert.equal("bad argument #1 to 'acquireAll' (key set must not be empty)",
      bare(km.acquireAll, km, {}))
    assert.equal("bad argument #3 to 'runExclusiveAll' (priority must be a number, got string)",
      bare(km.runExclusiveAll, km, { 1 }, f, "x"))
    local d = am.withTimeout(s, 5)
    assert.equal("bad argument #1 to 'acquire' (weight must be a positive integer)",
      bare(d.acquire, d, 0))
  end))

  it("are positioned at the user's line when the user's own function calls a wrapper", h.async(function()
    local m = am.Mutex.new()
    local function helper() m:runExclusive(f, "x") end
    check({ helper, "bad argument #2 to 'runExclusive' (priority must be a number, got string)" })
  end))
end)

-- The option tables the C core reads refuse a key they do not know, with
-- the Lua modules' words (checks.unknown_option, owned by src/core/args/args.c): a
-- misspelt option would otherwise leave its default silently in place.
describe("unknown options", function()
  local KEYED = "cancelError, maxPending, maxPendingError"
  -- the complaint: the key, the option meant when one is near, the options
  local function unknown(n, fname, key, options, near)
    return ("bad argument #%d to '%s' (unknown option '%s'; %soptions: %s)"):format(n, fname, key,
      near and ("did you mean '%s'? "):format(near) or "", options)
  end

  it("are refused by every option table of the core, at the user's line", h.async(function()
    local m, km = am.Mutex.new(), am.KeyedMutex.new()
    for _, case in ipairs({
      { function() am.KeyedMutex.new({ maxPendng = 1 }) end,
        unknown(1, "new", "maxPendng", KEYED, "maxPending") },
      { function() am.KeyedSemaphore.new(2, { cancelErr = "x" }) end,
        unknown(2, "new", "cancelErr", KEYED, "cancelError") },
      { function() am.KeyedRWLock.new({ maxPendingErorr = "x" }) end,
        unknown(1, "new", "maxPendingErorr", KEYED, "maxPendingError") },
      { function() am.withLease(m, 10, nil, { fromRequst = true }) end,
        unknown(4, "withLease", "fromRequst", "fromRequest", "fromRequest") },
      { function() am.withLease(km, 10, "lost", { fromRequest = true, x = 1 }) end,
        unknown(4, "withLease", "x", "fromRequest") },
      { function() am.KeyedMutex.new({ [1] = true }) end, unknown(1, "new", "1", KEYED) },
    }) do check(case) end
  end))

  it("are refused with the same words as the Lua modules'", function()
    local checks = require "async_mutex.checks"
    local redis = require "async_mutex.redis"
    local from_core = h.error_of(function() am.KeyedMutex.new({ bogus = 1 }) end)
    local from_lua = h.error_of(function() redis.connect({ bogus = 1 }) end)
    assert.equal("bad argument #1 to 'new' (unknown option 'bogus'; options: " .. KEYED .. ")",
      from_core)
    assert.equal("bad argument #1 to 'connect' (unknown option 'bogus'; options: commandTimeout, connectTimeout, db, host, master, password, path, pingInterval, port, reconnectDelay, reconnectDelayMax, sentinelPassword, sentinelUsername, sentinels, username)",
      from_lua)
    assert.equal("unknown option 'bogus'; options: other",
      checks.unknown_option({ bogus = 1 }, { other = true }))
    assert.is_nil(checks.unknown_option({ other = 1 }, { other = true }))
  end)

  it("leave the known options working", h.async(function()
    local km = am.KeyedMutex.new({ cancelError = "c", maxPending = 1, maxPendingError = "full" })
    local r = km:acquire("k")
    local w = h.acquirer(nil, "w", km, "k")
    assert.equal("full", h.error_of(function() km:acquire("k") end))
    km:cancel("k")
    h.tick()
    assert.equal("c", w.err)
    r()
    local lm = am.withLease(am.Mutex.new(), 1000, nil, { fromRequest = true })
    lm:acquire()()
  end))
end)
