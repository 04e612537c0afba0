-- Bad input raises a clear error naming the argument and changes nothing;
-- blocking calls outside a yieldable coroutine raise and change nothing
-- (docs/semantics.md, Errors; docs/api.md lists every message).
--
-- Messages are compared after stripping one leading "file:line: " (usage
-- errors may carry a position).  The API is called as a statement inside the
-- function given to h.error_of, so that Lua knows the called method's name.
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

local WEIGHT = "(weight must be a positive integer)"

-- Snapshot of everything a bad call must leave unchanged.
local function state(lock)
  return {
    locked = lock:isLocked(),
    value = lock.getValue and lock:getValue() or nil,
    pending = am.pending(),
  }
end

describe("bad arguments to Semaphore:acquire", function()
  it("reject a zero, negative or fractional weight with the exact message", h.async(function()
    local s = am.Semaphore.new(3)
    local before = state(s)
    assert.equal("bad argument #1 to 'acquire' " .. WEIGHT, E(function() s:acquire(0) end))
    assert.equal("bad argument #1 to 'acquire' " .. WEIGHT, E(function() s:acquire(-1) end))
    assert.equal("bad argument #1 to 'acquire' " .. WEIGHT, E(function() s:acquire(1.5) end))
    assert.equal("bad argument #1 to 'acquire' " .. WEIGHT, E(function() s:acquire(-math.huge) end))
    assert.same(before, state(s))
  end))

  it("reject a non-number weight naming the argument", h.async(function()
    local s = am.Semaphore.new(3)
    local before = state(s)
    local msg = E(function() s:acquire({}) end)
    assert.is_truthy(msg:find("bad argument #1 to 'acquire'", 1, true), msg)
    assert.same(before, state(s))
  end))

  it("reject a non-number priority with the exact message", h.async(function()
    local s = am.Semaphore.new(3)
    local before = state(s)
    assert.equal("bad argument #2 to 'acquire' (priority must be a number, got table)",
      E(function() s:acquire(1, {}) end))
    assert.equal("bad argument #2 to 'acquire' (priority must be a number, got boolean)",
      E(function() s:acquire(nil, true) end))
    assert.same(before, state(s))
  end))

  it("reject a bad weight even when the request would have to wait", h.async(function()
    local s = am.Semaphore.new(0)
    local before = state(s)
    assert.equal("bad argument #1 to 'acquire' " .. WEIGHT, E(function() s:acquire(0) end))
    assert.same(before, state(s))
  end))

  it("accept an integral float weight", h.async(function()
    local s = am.Semaphore.new(3)
    local v, r = s:acquire(2.0)
    assert.equal(3, v)
    r()
    assert.equal(3, s:getValue())
  end))
end)

describe("bad arguments to Mutex:acquire", function()
  it("reject a non-number priority with the exact message", h.async(function()
    local m = am.Mutex.new()
    local before = state(m)
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)",
      E(function() m:acquire("x") end))
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got table)",
      E(function() m:acquire({}) end))
    assert.same(before, state(m))
  end))

  it("reject a bad priority on a held mutex too, queuing nothing", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local before = state(m)
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)",
      E(function() m:acquire("x") end))
    assert.same(before, state(m))
    r()
    assert.is_false(m:isLocked())
  end))
end)

describe("bad arguments to Semaphore:release", function()
  it("reject a zero, negative or fractional weight with the exact message", function()
    local s = am.Semaphore.new(1)
    assert.equal("bad argument #1 to 'release' " .. WEIGHT, E(function() s:release(0) end))
    assert.equal("bad argument #1 to 'release' " .. WEIGHT, E(function() s:release(-2) end))
    assert.equal("bad argument #1 to 'release' " .. WEIGHT, E(function() s:release(1.5) end))
    assert.equal(1, s:getValue())
  end)
end)

describe("bad arguments to Semaphore:setValue", function()
  it("reject a non-integer with the exact message", function()
    local s = am.Semaphore.new(1)
    assert.equal("bad argument #1 to 'setValue' (number has no integer representation)",
      E(function() s:setValue(1.5) end))
    assert.equal(1, s:getValue())
  end)

  it("reject a missing or non-number value", function()
    local s = am.Semaphore.new(1)
    for _, f in ipairs {
      function() s:setValue() end,
      function() s:setValue("x") end,
      function() s:setValue({}) end,
    } do
      local msg = E(f)
      assert.is_truthy(msg:find("bad argument #1 to 'setValue'", 1, true), msg)
    end
    assert.equal(1, s:getValue())
  end)
end)

describe("bad arguments to Semaphore.new", function()
  it("reject a missing value with the exact message", function()
    assert.equal("bad argument #1 to 'new' (number expected, got no value)",
      E(function() am.Semaphore.new() end))
  end)

  it("reject nil, a non-integer and a non-number", function()
    local msg = E(function() am.Semaphore.new(nil) end)
    assert.is_truthy(msg:find("bad argument #1 to 'new'", 1, true), msg)
    assert.equal("bad argument #1 to 'new' (number has no integer representation)",
      E(function() am.Semaphore.new(1.5) end))
    msg = E(function() am.Semaphore.new({}) end)
    assert.is_truthy(msg:find("bad argument #1 to 'new'", 1, true), msg)
  end)
end)

describe("bad arguments to runExclusive", function()
  it("reject a non-function with the exact message and leave the lock free", h.left_free(am.Mutex.new, function(m)
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got number)",
      E(function() m:runExclusive(42) end))
    assert.is_false(m:isLocked())
    local s = am.Semaphore.new(2)
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got number)",
      E(function() s:runExclusive(42) end))
    assert.equal(2, s:getValue())
    local msg = E(function() m:runExclusive() end)
    assert.is_truthy(msg:find("bad argument #1 to 'runExclusive'", 1, true), msg)
  end))

  it("reject a non-function on a held lock without queuing", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local before = state(m)
    E(function() m:runExclusive("not a function") end)
    assert.same(before, state(m))
    r()
    assert.is_false(m:isLocked())
  end))

  it("reject a bad weight or priority without calling fn", h.async(function()
    local s = am.Semaphore.new(2)
    local m = am.Mutex.new()
    local called = false
    local fn = function() called = true end
    local msg = E(function() s:runExclusive(fn, 0) end)
    assert.is_truthy(msg:find("weight must be a positive integer", 1, true), msg)
    msg = E(function() s:runExclusive(fn, 1.5) end)
    assert.is_truthy(msg:find("weight must be a positive integer", 1, true), msg)
    msg = E(function() s:runExclusive(fn, 1, "high") end)
    assert.is_truthy(msg:find("priority must be a number", 1, true), msg)
    msg = E(function() m:runExclusive(fn, "high") end)
    assert.is_truthy(msg:find("priority must be a number", 1, true), msg)
    assert.is_false(called)
    assert.equal(2, s:getValue())
    assert.is_false(m:isLocked())
  end))
end)

describe("bad arguments to waitForUnlock", function()
  it("reject a bad weight or priority with the acquire-style message", h.async(function()
    local s = am.Semaphore.new(0)
    local m = am.Mutex.new()
    local before_s, before_m = state(s), state(m)
    assert.equal("bad argument #1 to 'waitForUnlock' " .. WEIGHT,
      E(function() s:waitForUnlock(0) end))
    assert.equal("bad argument #1 to 'waitForUnlock' " .. WEIGHT,
      E(function() s:waitForUnlock(2.5) end))
    assert.equal("bad argument #2 to 'waitForUnlock' (priority must be a number, got string)",
      E(function() s:waitForUnlock(1, "x") end))
    assert.equal("bad argument #1 to 'waitForUnlock' (priority must be a number, got string)",
      E(function() m:waitForUnlock("x") end))
    assert.same(before_s, state(s))
    assert.same(before_m, state(m))
  end))
end)

describe("bad arguments to withTimeout", function()
  it("reject a negative timeout with the exact message", function()
    local m = am.Mutex.new()
    assert.equal("bad argument #2 to 'withTimeout' (timeout must be a non-negative number)",
      E(function() am.withTimeout(m, -1) end))
  end)

  it("reject a missing or non-number timeout naming the argument", function()
    local m = am.Mutex.new()
    for _, f in ipairs {
      function() am.withTimeout(m) end,
      function() am.withTimeout(m, nil) end,
      function() am.withTimeout(m, "10") end,
      function() am.withTimeout(m, {}) end,
    } do
      local msg = E(f)
      assert.is_truthy(msg:find("bad argument #2 to 'withTimeout'", 1, true), msg)
    end
  end)

  it("reject something that is not a lock with the exact message", function()
    assert.equal("bad argument #1 to 'withTimeout' "
      .. "(async_mutex lock expected, got table)",
      E(function() am.withTimeout({}, 10) end))
    for _, f in ipairs {
      function() am.withTimeout(nil, 10) end,
      function() am.withTimeout("mutex", 10) end,
      function() am.withTimeout(io.stdout, 10) end,
    } do
      local msg = E(f)
      assert.is_truthy(msg:find("bad argument #1 to 'withTimeout' (async_mutex lock expected", 1, true), msg)
    end
  end)

  it("make the decorated acquire reject a bad weight before starting any timer", h.async(function()
    local s = am.Semaphore.new(0)
    local wt = am.withTimeout(s, 1000)
    local timers = h.count_handles("uv_timer_t")
    local before = state(s)
    local msg = E(function() wt:acquire(0) end)
    assert.is_truthy(msg:find("weight must be a positive integer", 1, true), msg)
    msg = E(function() wt:acquire(1, "x") end)
    assert.is_truthy(msg:find("priority must be a number", 1, true), msg)
    assert.same(before, state(s))
    assert.equal(timers, h.count_handles("uv_timer_t"))
  end))
end)

describe("bad arguments to tryAcquire", function()
  it("reject something that is not a lock with the exact message", function()
    assert.equal("bad argument #1 to 'tryAcquire' "
      .. "(async_mutex lock expected, got table)",
      E(function() am.tryAcquire({}) end))
    local msg = E(function() am.tryAcquire() end)
    assert.is_truthy(msg:find("bad argument #1 to 'tryAcquire'", 1, true), msg)
  end)

  it("make the decorated acquire reject a bad weight", h.async(function()
    local s = am.Semaphore.new(3)
    local ts = am.tryAcquire(s)
    local msg = E(function() ts:acquire(-1) end)
    assert.is_truthy(msg:find("weight must be a positive integer", 1, true), msg)
    assert.equal(3, s:getValue())
  end))
end)

describe("decorated methods called on something else", function()
  it("raise the exact message naming the decorated kind and what they got", h.async(function()
    local pending0 = am.pending()
    local m, s = am.Mutex.new(), am.Semaphore.new(1)
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(1)
    local cases = {
      { am.withTimeout(m, 10), "Mutex" }, { am.tryAcquire(s), "Semaphore" },
      { am.withTimeout(km, 10), "KeyedMutex" }, { am.tryAcquire(ks), "KeyedSemaphore" },
    }
    for _, case in ipairs(cases) do
      local d, kind = case[1], case[2]
      for _, name in ipairs { "acquire", "waitForUnlock" } do
        local pre = ("bad argument #1 to '%s' (decorated %s expected, got "):format(name, kind)
        assert.equal(pre .. "no value)", E(function() d[name]() end))
        assert.equal(pre .. "number)", E(function() d[name](5) end))
        assert.equal(pre .. "table)", E(function() d[name]({ m, 10, "x" }) end))
        assert.equal(pre .. "async_mutex.Mutex)", E(function() d[name](m) end))
        local other = kind == "Mutex" and am.tryAcquire(s) or am.withTimeout(m, 1)
        assert.equal(pre .. getmetatable(other).__name .. ")", E(function() d[name](other) end))
      end
    end
    assert.is_false(m:isLocked())
    assert.equal(1, s:getValue())
    assert.equal(pending0, am.pending())
  end))
end)

describe("methods called without self", function()
  it("raise the exact message for a Mutex method", h.async(function()
    local m = am.Mutex.new()
    assert.equal("bad argument #1 to 'acquire' (async_mutex.Mutex expected, got no value)",
      E(function() m.acquire() end))
  end))

  it("raise a message naming the expected type for every method", h.async(function()
    local m, s = am.Mutex.new(), am.Semaphore.new(1)
    for _, name in ipairs { "acquire", "runExclusive", "waitForUnlock", "isLocked", "release", "cancel" } do
      local msg = E(function() m[name]() end)
      assert.is_truthy(msg:find("async_mutex.Mutex expected", 1, true), name .. ": " .. msg)
      msg = E(function() m[name]({}) end)
      assert.is_truthy(msg:find("async_mutex.Mutex expected", 1, true), name .. ": " .. msg)
    end
    for _, name in ipairs { "acquire", "runExclusive", "waitForUnlock", "isLocked", "release",
        "cancel", "getValue", "setValue" } do
      local msg = E(function() s[name]() end)
      assert.is_truthy(msg:find("async_mutex.Semaphore expected", 1, true), name .. ": " .. msg)
    end
    local msg = E(function() m.acquire(s) end)          -- a Semaphore is not a Mutex
    assert.is_truthy(msg:find("async_mutex.Mutex expected", 1, true), msg)
    assert.is_false(m:isLocked())
    assert.equal(1, s:getValue())
  end))
end)

describe("blocking calls outside a coroutine", function()
  it("raise for Mutex:acquire even when the mutex is free, and change nothing", function()
    local m = am.Mutex.new()
    local before = state(m)
    assert.equal("attempt to acquire a mutex outside a coroutine", E(function() m:acquire() end))
    assert.same(before, state(m))
  end)

  it("raise for Semaphore:acquire even when it could be granted, and change nothing", function()
    local s = am.Semaphore.new(3)
    local before = state(s)
    assert.equal("attempt to acquire a semaphore outside a coroutine", E(function() s:acquire() end))
    assert.same(before, state(s))
  end)

  it("raise for runExclusive without calling fn", function()
    local m, s = am.Mutex.new(), am.Semaphore.new(2)
    local called = false
    assert.equal("attempt to acquire a mutex outside a coroutine",
      E(function() m:runExclusive(function() called = true end) end))
    assert.equal("attempt to acquire a semaphore outside a coroutine",
      E(function() s:runExclusive(function() called = true end) end))
    assert.is_false(called)
    assert.is_false(m:isLocked())
    assert.equal(2, s:getValue())
  end)

  it("raise for waitForUnlock, even on a free lock", function()
    local m, s = am.Mutex.new(), am.Semaphore.new(1)
    local before = state(m)
    assert.equal("attempt to wait for a mutex outside a coroutine",
      E(function() m:waitForUnlock() end))
    assert.equal("attempt to wait for a semaphore outside a coroutine",
      E(function() s:waitForUnlock() end))
    assert.same(before, state(m))
    assert.equal(1, s:getValue())
  end)

  it("raise for a held lock too, queuing nothing", function()
    local m = am.Mutex.new()
    local release = h.holder(m)
    local before = state(m)
    assert.equal("attempt to acquire a mutex outside a coroutine", E(function() m:acquire() end))
    assert.equal("attempt to wait for a mutex outside a coroutine",
      E(function() m:waitForUnlock() end))
    assert.same(before, state(m))
    release()
    assert.is_false(m:isLocked())
  end)

  it("raise for the acquire of a withTimeout lock, starting no timer", function()
    local m = am.Mutex.new()
    local wt = am.withTimeout(m, 1000)
    local timers = h.count_handles("uv_timer_t")
    local msg = E(function() wt:acquire() end)
    assert.is_truthy(msg:find("coroutine", 1, true), msg)
    msg = E(function() wt:runExclusive(function() end) end)
    assert.is_truthy(msg:find("coroutine", 1, true), msg)
    assert.is_false(m:isLocked())
    assert.equal(timers, h.count_handles("uv_timer_t"))
  end)
end)

describe("blocking calls in a non-yieldable context inside a coroutine", function()
  -- inside a coroutine that cannot yield here: said so, not "outside a coroutine"
  local CANNOT_YIELD = h.CANNOT_YIELD

  it("raise from a string.gsub callback even when the lock is free, and change nothing", h.async(function()
    local m, s = am.Mutex.new(), am.Semaphore.new(2)
    local bm, bs = state(m), state(s)
    local errs = {}
    ("ab"):gsub(".", function(c)
      local ok, err = pcall(function()
        if c == "a" then m:acquire() else s:acquire() end
      end)
      errs[#errs + 1] = not ok and h.strip_pos(err) or "no error"
    end)
    assert.same({ "attempt to acquire a mutex" .. CANNOT_YIELD,
      "attempt to acquire a semaphore" .. CANNOT_YIELD }, errs)
    assert.same(bm, state(m))
    assert.same(bs, state(s))
  end))

  it("raise from a table.sort comparator for runExclusive and waitForUnlock", h.left_free(am.Mutex.new, function(m)
    local called = false
    local errs = {}
    table.sort({ 2, 1 }, function(a, b)
      local ok, err = pcall(function() m:runExclusive(function() called = true end) end)
      errs[#errs + 1] = ok and "no error" or h.strip_pos(err)
      ok, err = pcall(function() m:waitForUnlock() end)
      errs[#errs + 1] = ok and "no error" or h.strip_pos(err)
      return a < b
    end)
    assert.is_true(#errs >= 2)
    for i, e in ipairs(errs) do
      assert.equal((i % 2 == 1 and "attempt to acquire a mutex" or "attempt to wait for a mutex")
        .. CANNOT_YIELD, e)
    end
    assert.is_false(called)
  end))

  it("raise in a non-yieldable context even on a held lock, queuing nothing", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local before = state(m)
    local err
    ("a"):gsub(".", function()
      local _
      _, err = pcall(function() m:acquire() end)
    end)
    assert.equal("attempt to acquire a mutex" .. CANNOT_YIELD, h.strip_pos(err))
    assert.same(before, state(m))
    r()
    assert.is_false(m:isLocked())
  end))
end)
