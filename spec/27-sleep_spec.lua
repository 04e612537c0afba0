-- am.sleep(ms): suspends the calling coroutine for ms milliseconds of loop
-- time.  A sleeper is a timed waiter of the scheduler (docs/api.md, am.sleep):
-- no luv handle of its own, the same timer queue as withTimeout requests,
-- the same fate under coroutine.close and spurious resumes.
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

-- Coroutines the module holds beyond `base` (earlier spec files may leave
-- some waiting for ever on purpose).
local function held(base) return am.pending() - base end

-- A coroutine of our own (am.spawn makes a task, whose coroutine is its
-- own), started at once: for the cases of coroutine.close and resume.
local function spawn_co(fn)
  local co = coroutine.create(fn)
  assert(coroutine.resume(co))
  return co
end

describe("async_mutex.sleep", function()
  it("suspends for at least ms milliseconds of loop time, and returns nothing",
    h.async(function()
      local t0 = uv.now()
      local n = select("#", am.sleep(20))
      assert.is_true(uv.now() - t0 >= 20, "woke after " .. (uv.now() - t0) .. " ms")
      assert.equal(0, n)
    end))

  it("always yields, even for 0 ms: the caller goes on first, the sleeper from the loop",
    h.async(function()
      local log = {}
      am.spawn(function() am.sleep(0); log[#log + 1] = "sleeper" end)
      log[#log + 1] = "caller"
      assert.is_false((h.without_yield(am.sleep, 0)))
      h.wait_until(function() return #log == 2 end)
      assert.same({ "caller", "sleeper" }, log)
    end))

  it("accepts fractions of a millisecond (rounded up by the timer) and -0", h.async(function()
    local t0 = uv.now()
    am.sleep(0.5)
    am.sleep(-0.0)
    assert.is_true(uv.now() - t0 >= 0.5)
  end))

  it("wakes sleepers in deadline order, equal deadlines in call order", h.async(function()
    -- (deadlines 100 ms apart: each counts from its own call, so a stall of
    -- the process between two calls on a loaded machine must not reorder them)
    local log = {}
    for _, sleeper in ipairs({ { 300, "300" }, { 100, "100 first" }, { 200, "200" },
                               { 100, "100 second" }, { 0, "0" } }) do
      am.spawn(function() am.sleep(sleeper[1]); log[#log + 1] = sleeper[2] end)
    end
    h.wait_until(function() return #log == 5 end)
    assert.same({ "0", "100 first", "100 second", "200", "300" }, log)
  end))

  it("shares the scheduler's timer queue with withTimeout requests, in deadline order",
    h.async(function()
      local m = am.Mutex.new()
      local release = m:acquire()
      local log = {}
      am.spawn(function() am.sleep(30); log[#log + 1] = "sleep 30" end)
      am.spawn(function()
        local ok, err = pcall(am.withTimeout(m, 20).acquire, am.withTimeout(m, 20))
        log[#log + 1] = (not ok and err == am.E_TIMEOUT) and "timeout 20" or "?"
      end)
      am.spawn(function() am.sleep(10); log[#log + 1] = "sleep 10" end)
      h.wait_until(function() return #log == 3 end)
      assert.same({ "sleep 10", "timeout 20", "sleep 30" }, log)
      release()
    end))

  it("makes no luv handle per sleeper: a thousand sleepers share the scheduler's one timer",
    h.async(function()
      local base = am.pending()
      local before = h.count_handles("uv_timer_t")
      local n, woke = 1000, 0
      for i = 1, n do
        am.spawn(function() am.sleep(i % 7); woke = woke + 1 end)
      end
      assert.equal(n, held(base))
      assert.is_true(h.count_handles("uv_timer_t") <= math.max(before, 1))
      assert.equal(1, h.count_handles("uv_timer_t", true))
      h.wait_until(function() return woke == n end)
      assert.equal(0, held(base))
      assert.equal(0, h.count_handles("uv_timer_t", true))
    end))

  it("costs no more memory than a timed waiter (a withTimeout request) waiting as long",
    h.async(function()
      local n = h.load(10000)
      --- Heap bytes per coroutine started by start(), while they all wait.
      local function per_coroutine(start)
        local cos = {}
        h.gc()
        local before = collectgarbage("count")
        for i = 1, n do cos[i] = start() end
        h.gc()
        local after = collectgarbage("count")
        for i = 1, n do assert(cos[i]:cancel()) end
        return (after - before) * 1024 / n
      end
      local timed = am.withTimeout(am.Semaphore.new(0), 60000)
      local function waiter()
        return am.spawn(function() pcall(timed.acquire, timed) end)
      end
      local function sleeper()
        return am.spawn(function() am.sleep(60000) end)
      end
      per_coroutine(waiter)                   -- the scheduler's tables grow here
      local waiter_bytes = per_coroutine(waiter)
      local sleeper_bytes = per_coroutine(sleeper)
      assert.is_true(sleeper_bytes <= waiter_bytes,
        ("a sleeper costs %.0f bytes, a timed waiter %.0f"):format(sleeper_bytes, waiter_bytes))
    end))

  it("does not wake early when someone else resumes the sleeper", h.async(function()
    local t0 = uv.now()
    local woke_at
    local co = spawn_co(function() am.sleep(20); woke_at = uv.now() end)
    assert.is_true(coroutine.resume(co, "spurious"))
    assert.equal("suspended", coroutine.status(co))
    h.wait_until(function() return woke_at ~= nil end)
    assert.is_true(woke_at - t0 >= 20)
  end))

  it("keeps a sleeper that nothing else refers to alive until it wakes", h.async(function()
    local woke = false
    am.spawn(function() am.sleep(5); woke = true end)   -- the coroutine is dropped
    h.gc()
    h.wait_until(function() return woke end)
  end))

  it("holds a lock across the sleep when called inside runExclusive", h.left_free(am.Mutex.new, function(m)
    local inside = h.occupancy(1)
    local done = 0
    for _ = 1, 3 do
      am.spawn(function()
        m:runExclusive(function() inside:enter(); am.sleep(2); inside:leave() end)
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 3 end)
    assert.equal(1, inside:most())
  end))

  describe("under coroutine.close", function()
    it("a closed sleeper never wakes, its deadline is gone and no timer stays active",
      h.async(function()
        local base = am.pending()
        local woke = false
        local co = spawn_co(function() am.sleep(10000); woke = true end)
        assert.equal(1, held(base))
        assert.equal(1, h.count_handles("uv_timer_t", true))
        assert.is_true(coroutine.close(co))
        assert.equal(0, held(base))
        assert.equal(0, h.count_handles("uv_timer_t", true))
        assert.is_false(woke)
      end))       -- h.async fails if a handle is left active

    it("closing one sleeper leaves the others to wake at their time", h.async(function()
      local log = {}
      local a = spawn_co(function() am.sleep(5); log[#log + 1] = "a" end)
      am.spawn(function() am.sleep(10); log[#log + 1] = "b" end)
      assert.is_true(coroutine.close(a))
      h.wait_until(function() return #log == 1 end)
      assert.same({ "b" }, log)
    end))

    it("runs the sleeper's <close> variables: a lock held across the sleep is released",
      h.async(function()
        local base = am.pending()
        local m = am.Mutex.new()
        local co = spawn_co(function()
          local release <close> = m:acquire()
          am.sleep(1e12)                       -- beyond one timer start
        end)
        assert.is_true(m:isLocked())
        assert.is_true(coroutine.close(co))
        assert.is_false(m:isLocked())
        assert.equal(0, held(base))
      end))
  end)

  it("lets uv.run() return once every sleeper has woken", function()
    local r = h.am_subprocess([[
      local woke = 0
      for i = 1, 100 do am.spawn(function() am.sleep(i % 5); woke = woke + 1 end) end
      uv.run()
      local active = 0
      uv.walk(function(hd) if hd:is_active() then active = active + 1 end end)
      print(woke, am.pending(), active)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("100\t0\t0\n", r.stdout)
  end)

  describe("outside a coroutine", function()
    it("raises at the caller's line, from the main thread", function()
      local base = am.pending()
      local ok, err = pcall(function() am.sleep(1) end)
      assert.is_false(ok)
      assert.matches("^[^:]*27%-sleep_spec%.lua:%d+: attempt to sleep outside a coroutine$", err)
      assert.equal(0, held(base))
    end)

    it("raises where the coroutine cannot yield, saying so (a string.gsub callback, a __tostring)",
      h.async(function()
        local base = am.pending()
        local CANNOT = "attempt to sleep" .. h.CANNOT_YIELD
        assert.equal(CANNOT,
          h.error_of(function() string.gsub("x", "x", function() am.sleep(1) end) end))
        local t = setmetatable({}, { __tostring = function() am.sleep(1); return "" end })
        assert.equal(CANNOT, h.error_of(function() tostring(t) end))
        assert.equal(0, held(base))
        assert.equal(0, h.count_handles("uv_timer_t", true))
      end))
  end)

  describe("bad input", function()
    local NUMBER = "ms must be a non-negative finite number"
    local cases = {
      { "no value", function() am.sleep() end, "number expected, got no value" },
      { "nil", function() am.sleep(nil) end, "number expected, got nil" },
      { "a numeric string", function() am.sleep("10") end, "number expected, got string" },
      { "a boolean", function() am.sleep(true) end, "number expected, got boolean" },
      { "a table", function() am.sleep({}) end, "number expected, got table" },
      { "a lock", function() am.sleep(am.Mutex.new()) end,
        "number expected, got async_mutex.Mutex" },
      { "-1", function() am.sleep(-1) end, NUMBER },
      { "-0.5", function() am.sleep(-0.5) end, NUMBER },
      { "NaN", function() am.sleep(0 / 0) end, NUMBER },
      { "math.huge", function() am.sleep(math.huge) end, NUMBER },
      { "-math.huge", function() am.sleep(-math.huge) end, NUMBER },
      { "math.mininteger", function() am.sleep(math.mininteger) end, NUMBER },
    }
    for _, case in ipairs(cases) do
      it("refuses " .. case[1] .. " at the caller's line, and changes nothing",
        h.async(function()
          local base = am.pending()
          local ok, err = pcall(case[2])
          assert.is_false(ok)
          assert.equal("bad argument #1 to 'sleep' (" .. case[3] .. ")", h.strip_pos(err))
          assert.matches("^[^:]*27%-sleep_spec%.lua:%d+: ", err)
          assert.equal(0, held(base))
          assert.equal(0, h.count_handles("uv_timer_t", true))
        end))
    end

    it("checks the argument before the coroutine: bad ms outside a coroutine is an argument error",
      function()
        assert.equal("bad argument #1 to 'sleep' (number expected, got string)",
          h.error_of(function() am.sleep("1") end))
      end)
  end)
end)
