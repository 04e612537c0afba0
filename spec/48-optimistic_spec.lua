-- am.optimistic: the store-agnostic retry loop of optimistic concurrency
-- (docs/optimistic.md).  Attempts, results, errors and bad input are checked
-- exactly; the backoff is checked through an injected random source and
-- sleep function, and once on the real loop by a lower bound on loop time
-- (timers never fire early), never by an upper bound.

local am = require "async_mutex"
local uv = require "luv"
local h = require "helpers"

local ROOT = h.ROOT

--- fn for optimistic: conflicts `n` times, then returns true and `...`.
-- Records the attempt numbers it was called with in the returned list.
local function conflicting(n, ...)
  local seen = {}
  local results = table.pack(...)
  return function(attempt)
    seen[#seen + 1] = attempt
    if #seen <= n then return false end
    return true, table.unpack(results, 1, results.n)
  end, seen
end

--- A sleep option that records its argument and returns at once.
local function recorder()
  local slept = {}
  return function(ms) slept[#slept + 1] = ms end, slept
end

--- A random option returning `values` in turn (then the last one again).
local function sequence(values)
  local i = 0
  return function()
    i = math.min(i + 1, #values)
    return values[i]
  end
end

describe("am.E_CONFLICT", function()
  it("is the exact string optimistic raises when every attempt conflicted", function()
    assert.equal("optimistic update gave up: too many conflicts", am.E_CONFLICT)
  end)
end)

describe("am.optimistic(fn [, options])", function()
  it("returns fn's results after true, on the first attempt without yielding",
    h.async(function()
      local fn, seen = conflicting(0, "a", nil, 3)
      local done, res = h.without_yield(function() return am.optimistic(fn) end)
      assert.is_true(done)
      assert.equal(3, res.n)
      assert.same({ "a", nil, 3 }, { res[1], res[2], res[3] })
      assert.same({ 1 }, seen)
    end))

  it("returns nothing when fn returns true alone", h.async(function()
    local n = select("#", am.optimistic(function() return true end))
    assert.equal(0, n)
  end))

  it("calls fn again after each false, with the attempt number, until true",
    h.async(function()
      local fn, seen = conflicting(4, "done")
      local sleep, slept = recorder()
      assert.equal("done", am.optimistic(fn, { sleep = sleep }))
      assert.same({ 1, 2, 3, 4, 5 }, seen)
      assert.equal(4, #slept)             -- one sleep between two attempts
    end))

  it("raises am.E_CONFLICT after maxAttempts conflicts (default 10), "
    .. "without sleeping after the last", h.async(function()
      local fn, seen = conflicting(math.huge)
      local sleep, slept = recorder()
      local ok, err = pcall(am.optimistic, fn, { sleep = sleep })
      assert.is_false(ok)
      assert.equal(am.E_CONFLICT, err)    -- the value itself, no position
      assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, seen)
      assert.equal(9, #slept)

      fn, seen = conflicting(math.huge)
      ok, err = pcall(am.optimistic, fn, { maxAttempts = 3, sleep = sleep })
      assert.is_false(ok)
      assert.equal(am.E_CONFLICT, err)
      assert.same({ 1, 2, 3 }, seen)
    end))

  it("succeeds on the last allowed attempt", h.async(function()
    local fn, seen = conflicting(2, "last")
    assert.equal("last", am.optimistic(fn, { maxAttempts = 3, sleep = function() end }))
    assert.same({ 1, 2, 3 }, seen)
  end))

  it("with maxAttempts = 1 tries once and never sleeps", h.async(function()
    local fn, seen = conflicting(1)
    local sleep, slept = recorder()
    local ok, err = pcall(am.optimistic, fn, { maxAttempts = 1, sleep = sleep })
    assert.is_false(ok)
    assert.equal(am.E_CONFLICT, err)
    assert.same({ 1 }, seen)
    assert.same({}, slept)
  end))

  it("with maxAttempts = math.huge retries until fn succeeds", h.async(function()
    local fn, seen = conflicting(50, "at last")
    assert.equal("at last", am.optimistic(fn,
      { maxAttempts = math.huge, sleep = function() end }))
    assert.equal(51, #seen)
  end))

  it("accepts maxAttempts given as an integral float", h.async(function()
    local fn, seen = conflicting(math.huge)
    assert.is_false(pcall(am.optimistic, fn, { maxAttempts = 2.0, sleep = function() end }))
    assert.same({ 1, 2 }, seen)
  end))

  it("raises conflictError, unchanged, instead of E_CONFLICT", h.async(function()
    local mine = setmetatable({}, { __name = "my conflict" })
    local ok, err = pcall(am.optimistic, function() return false end,
      { maxAttempts = 2, sleep = function() end, conflictError = mine })
    assert.is_false(ok)
    assert.is_true(rawequal(mine, err))
  end))

  it("propagates an error raised by fn at once, unchanged, with no retry and no sleep",
    h.async(function()
      local boom = setmetatable({}, { __name = "boom" })
      local sleep, slept = recorder()
      local calls = 0
      local ok, err = pcall(am.optimistic, function()
        calls = calls + 1
        error(boom)
      end, { sleep = sleep })
      assert.is_false(ok)
      assert.is_true(rawequal(boom, err))
      assert.equal(1, calls)
      assert.same({}, slept)
    end))

  it("propagates an error raised after some conflicts, and stops there", h.async(function()
    local seen = {}
    local ok, err = pcall(am.optimistic, function(attempt)
      seen[#seen + 1] = attempt
      if attempt < 3 then return false end
      error("store is read-only")
    end, { sleep = function() end })
    assert.is_false(ok)
    assert.matches("48%-optimistic_spec%.lua:%d+: store is read%-only$", err)
    assert.same({ 1, 2, 3 }, seen)
  end))

  it("propagates an error raised by the sleep function", h.async(function()
    local calls = 0
    local ok, err = pcall(am.optimistic, function()
      calls = calls + 1
      return false
    end, { sleep = function() error("no sleep", 0) end })
    assert.is_false(ok)
    assert.equal("no sleep", err)
    assert.equal(1, calls)
  end))

  it("accepts a callable table as fn", h.async(function()
    local fn = setmetatable({}, { __call = function(_, attempt) return true, attempt end })
    assert.equal(1, am.optimistic(fn))
  end))

  it("runs each attempt in the calling coroutine", h.async(function()
    local me = coroutine.running()
    local where
    am.optimistic(function(attempt)
      where = coroutine.running()
      return attempt == 2
    end, { sleep = function() end })
    assert.equal(me, where)
  end))

  it("keeps the options table it was given unchanged", h.async(function()
    local options = { maxAttempts = 2, sleep = function() end }
    pcall(am.optimistic, function() return false end, options)
    assert.same({ "maxAttempts", "sleep" }, (function()
      local keys = {}
      for k in pairs(options) do keys[#keys + 1] = k end
      table.sort(keys)
      return keys
    end)())
    assert.equal(2, options.maxAttempts)
  end))
end)

describe("am.optimistic's backoff (docs/optimistic.md, Backoff)", function()
  it("sleeps random() * cap, in whole ms, with cap = min(maxDelay, baseDelay * 2^(n-1))",
    h.async(function()
      local sleep, slept = recorder()
      -- random just below 1: each sleep is its cap
      assert.is_false(pcall(am.optimistic, function() return false end, {
        maxAttempts = 10, baseDelay = 3, maxDelay = 50, sleep = sleep,
        random = sequence({ 0.9999999 }) }))
      assert.same({ 3, 6, 12, 24, 48, 50, 50, 50, 50 }, slept)
    end))

  it("sleeps 0 ms when random() is 0, and half the cap when it is 0.5",
    h.async(function()
      local sleep, slept = recorder()
      assert.is_false(pcall(am.optimistic, function() return false end, {
        maxAttempts = 5, baseDelay = 10, maxDelay = 1000, sleep = sleep,
        random = sequence({ 0, 0.5, 0.5, 0.5 }) }))
      -- caps 10, 20, 40, 80: floor(r * (cap + 1))
      assert.same({ 0, 10, 20, 40 }, slept)
      for _, ms in ipairs(slept) do assert.equal("integer", math.type(ms)) end
    end))

  it("uses defaults baseDelay 1 ms and maxDelay 100 ms", h.async(function()
    local sleep, slept = recorder()
    assert.is_false(pcall(am.optimistic, function() return false end, {
      maxAttempts = 12, sleep = sleep, random = sequence({ 0.9999999 }) }))
    assert.same({ 1, 2, 4, 8, 16, 32, 64, 100, 100, 100, 100 }, slept)
  end))

  it("with the default random source stays within 0 .. cap, and varies",
    h.async(function()
      local sleep, slept = recorder()
      for _ = 1, 50 do
        pcall(am.optimistic, function() return false end, {
          maxAttempts = 9, baseDelay = 4, maxDelay = 256, sleep = sleep })
      end
      assert.equal(50 * 8, #slept)
      local distinct = {}
      for i, ms in ipairs(slept) do
        local n = (i - 1) % 8 + 1
        local cap = math.min(256, 4 * 2 ^ (n - 1))
        assert(math.type(ms) == "integer" and ms >= 0 and ms <= cap,
          ("sleep %d of an attempt: %s ms, outside 0 .. %d"):format(n, tostring(ms), cap))
        distinct[ms] = true
      end
      local count = 0
      for _ in pairs(distinct) do count = count + 1 end
      assert(count > 20, "jitter: only " .. count .. " distinct sleeps in 400")
    end))

  it("with maxDelay = 0 sleeps 0 ms every time (a yield to the loop)", h.async(function()
    local sleep, slept = recorder()
    assert.is_false(pcall(am.optimistic, function() return false end, {
      maxAttempts = 4, maxDelay = 0, sleep = sleep }))
    assert.same({ 0, 0, 0 }, slept)
  end))

  it("sleeps on the loop by default: other coroutines run between attempts, "
    .. "and the loop time passed is at least the sum of the sleeps", h.async(function()
      local ticks = 0
      local ticker = uv.new_timer()
      ticker:start(1, 1, function() ticks = ticks + 1 end)
      local seen_ticks = {}
      uv.update_time()
      local t0 = uv.now()
      local result = am.optimistic(function(attempt)
        seen_ticks[attempt] = ticks
        return attempt == 4, "ok"
      end, { baseDelay = 20, maxDelay = 20, random = sequence({ 0.9999999 }) })
      local elapsed = uv.now() - t0
      ticker:close()
      assert.equal("ok", result)
      assert(elapsed >= 60, ("three sleeps of 20 ms took %d ms of loop time"):format(elapsed))
      for i = 2, 4 do
        assert(seen_ticks[i] > seen_ticks[i - 1], "the loop did not run between attempts")
      end
    end))

  it("sleeps with am.sleep: a coroutine closed while it sleeps is gone from the "
    .. "module and never called again", h.async(function()
      local calls = 0
      local co = coroutine.create(function()
        am.optimistic(function()
          calls = calls + 1
          return false
        end, { baseDelay = 50, maxDelay = 50, random = sequence({ 0.9999999 }) })
      end)
      local before = am.pending()
      assert(coroutine.resume(co))
      assert.equal("suspended", coroutine.status(co))
      assert.equal(before + 1, am.pending())          -- a sleeper of the module
      assert(coroutine.close(co))
      assert.equal(before, am.pending())
      h.sleep(80)
      assert.equal(1, calls)
    end))
end)

describe("am.optimistic's bad input", function()
  local function fn() return true end

  local CASES = {
    { "no function", function() am.optimistic() end,
      "bad argument #1 to 'optimistic' (function expected, got no value)" },
    { "a number as fn", function() am.optimistic(42) end,
      "bad argument #1 to 'optimistic' (function expected, got number)" },
    { "options not a table", function() am.optimistic(fn, 5) end,
      "bad argument #2 to 'optimistic' (table expected, got number)" },
    { "an unknown option", function() am.optimistic(fn, { maxAttempt = 3 }) end,
      "bad argument #2 to 'optimistic' (unknown option 'maxAttempt'; did you mean"
        .. " 'maxAttempts'? options: baseDelay, conflictError, maxAttempts, maxDelay, random, sleep)" },
    { "maxAttempts 0", function() am.optimistic(fn, { maxAttempts = 0 }) end,
      "bad argument #2 to 'optimistic' (maxAttempts must be a positive integer or math.huge)" },
    { "maxAttempts -1", function() am.optimistic(fn, { maxAttempts = -1 }) end,
      "bad argument #2 to 'optimistic' (maxAttempts must be a positive integer or math.huge)" },
    { "maxAttempts 1.5", function() am.optimistic(fn, { maxAttempts = 1.5 }) end,
      "bad argument #2 to 'optimistic' (maxAttempts must be a positive integer or math.huge)" },
    { "maxAttempts NaN", function() am.optimistic(fn, { maxAttempts = 0 / 0 }) end,
      "bad argument #2 to 'optimistic' (maxAttempts must be a positive integer or math.huge)" },
    { "maxAttempts a string", function() am.optimistic(fn, { maxAttempts = "3" }) end,
      "bad argument #2 to 'optimistic' (maxAttempts must be a positive integer or math.huge)" },
    { "baseDelay -1", function() am.optimistic(fn, { baseDelay = -1 }) end,
      "bad argument #2 to 'optimistic' (baseDelay must be a non-negative finite number)" },
    { "baseDelay NaN", function() am.optimistic(fn, { baseDelay = 0 / 0 }) end,
      "bad argument #2 to 'optimistic' (baseDelay must be a non-negative finite number)" },
    { "baseDelay a string", function() am.optimistic(fn, { baseDelay = "1" }) end,
      "bad argument #2 to 'optimistic' (baseDelay must be a non-negative finite number)" },
    { "maxDelay math.huge", function() am.optimistic(fn, { maxDelay = math.huge }) end,
      "bad argument #2 to 'optimistic' (maxDelay must be a non-negative finite number)" },
    { "maxDelay -0.5", function() am.optimistic(fn, { maxDelay = -0.5 }) end,
      "bad argument #2 to 'optimistic' (maxDelay must be a non-negative finite number)" },
    { "random not callable", function() am.optimistic(fn, { random = 0.5 }) end,
      "bad argument #2 to 'optimistic' (random must be a function, got number)" },
    { "sleep not callable", function() am.optimistic(fn, { sleep = "zzz" }) end,
      "bad argument #2 to 'optimistic' (sleep must be a function, got string)" },
  }

  for _, case in ipairs(CASES) do
    it("raises for " .. case[1] .. ", at the caller's line, before calling fn",
      h.async(function()
        local called = false
        local real_fn = fn
        fn = function() called = true; return true end
        local ok, err = pcall(case[2])
        fn = real_fn
        assert.is_false(ok)
        assert.matches("^[^:]*48%-optimistic_spec%.lua:%d+: ", err)
        assert.equal(case[3], h.strip_pos(err))
        assert.is_false(called)
      end))
  end

  it("raises outside a coroutine, even when the first attempt would succeed",
    function()
      local called = false
      local ok, err = pcall(function()
        am.optimistic(function() called = true; return true end)
      end)
      assert.is_false(ok)
      assert.matches("48%-optimistic_spec%.lua:%d+: attempt to run an optimistic "
        .. "update outside a coroutine$", err)
      assert.is_false(called)
    end)

  it("raises when fn returns neither true nor false, without retrying",
    h.async(function()
      local calls = 0
      local cases = { { nil, "nil" }, { 1, "number" }, { "yes", "string" }, { {}, "table" } }
      for _, case in ipairs(cases) do
        local ok, err = pcall(function()
          am.optimistic(function()
            calls = calls + 1
            return case[1]
          end)
        end)
        assert.is_false(ok)
        assert.matches("48%-optimistic_spec%.lua:%d+: ", err)
        assert.equal("optimistic: fn must return true (written) or false (conflict), got "
          .. case[2], h.strip_pos(err))
      end
      assert.equal(#cases, calls)
    end))

  it("raises when random returns something outside [0, 1), before sleeping",
    h.async(function()
      for _, bad in ipairs({ { 1, "1" }, { -0.25, "-0.25" }, { 0 / 0, "nan" }, { "x", "string" } }) do
        local sleep, slept = recorder()
        local ok, err = pcall(function()
          am.optimistic(function() return false end,
            { random = function() return bad[1] end, sleep = sleep })
        end)
        assert.is_false(ok)
        local msg = h.strip_pos(err)
        assert.equal("optimistic: options.random must return a number in [0, 1), got ",
          msg:sub(1, 63))
        if bad[2] ~= "nan" then assert.equal(bad[2], msg:sub(64)) end
        assert.same({}, slept)
      end
    end))
end)

describe("examples/optimistic_sql.lua", function()
  it("oversells with a blind write and never with a version column", function()
    local p = assert(io.popen(("cd '%s' && timeout 10 lua5.4 examples/optimistic_sql.lua 2>&1")
      :format(ROOT)))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.equal(0, code, out)
    assert.matches("Read, then write blindly:\n.-  sold 5, stock left 2: oversold\n", out)
    local tail = out:match("With a version column and am%.optimistic:\n(.*)$")
    assert(tail, out)
    assert.matches("  sold 3, stock left 0: nothing oversold\n$", tail)
    local _, bought = tail:gsub(": bought %(attempt %d+%)", "")
    local _, sold_out = tail:gsub(": sold out %(attempt %d+%)", "")
    assert.equal(3, bought)
    assert.equal(2, sold_out)
  end)
end)
