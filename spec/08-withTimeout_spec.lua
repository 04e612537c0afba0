-- withTimeout(lock, ms [, err]): bounded waits; timed-out requests leave the
-- queue at once (P1); timers only while waiting (docs/semantics.md, Timeouts).
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

local MUTEX_METHODS = { "acquire", "runExclusive", "waitForUnlock", "isLocked", "release", "cancel" }
local SEM_METHODS = { "acquire", "runExclusive", "waitForUnlock", "isLocked", "release", "cancel",
  "getValue", "setValue" }

describe("withTimeout", function()
  it("returns an object with the Mutex's methods sharing its state", h.async(function()
    local m = am.Mutex.new()
    local wt = am.withTimeout(m, 100)
    for _, name in ipairs(MUTEX_METHODS) do
      assert.is_truthy(wt[name], name)
    end
    local r = wt:acquire()
    assert.is_true(m:isLocked())
    assert.is_true(wt:isLocked())
    wt:release()
    assert.is_false(m:isLocked())
    r()                                        -- no-op: unlocked (P3)
    assert.is_false(wt:isLocked())
    local a = h.acquirer(nil, "a", m)
    assert.is_true(a.done)
    local b = h.acquirer(nil, "b", m)
    wt:cancel()
    h.tick()
    assert.equal(am.E_CANCELED, b.err)
    a.release()
  end))

  it("returns an object with the Semaphore's methods sharing its state", h.async(function()
    local s = am.Semaphore.new(2)
    local wt = am.withTimeout(s, 100)
    for _, name in ipairs(SEM_METHODS) do
      assert.is_truthy(wt[name], name)
    end
    assert.equal(2, wt:getValue())
    wt:setValue(5)
    assert.equal(5, s:getValue())
    wt:release(2)
    assert.equal(7, s:getValue())
    local v, r = wt:acquire(3)
    assert.equal(7, v)
    assert.equal(4, wt:getValue())
    r()
    assert.equal(7, s:getValue())
    s:setValue(0)
    assert.is_true(wt:isLocked())
  end))

  it("acquires a free lock at once, without yielding and without creating a timer", h.async(function()
    local m = am.Mutex.new()
    local before = h.count_handles("uv_timer_t")
    local wt = am.withTimeout(m, 1000)
    local completed, res = h.without_yield(function() return wt:acquire() end)
    assert.is_true(completed)
    assert.equal(before, h.count_handles("uv_timer_t"))
    assert.is_true(m:isLocked())
    res[1]()
    local s = am.Semaphore.new(3)
    local ws = am.withTimeout(s, 1000)
    completed, res = h.without_yield(function() return ws:acquire(2) end)
    assert.is_true(completed)
    assert.equal(3, res[1])
    assert.equal(before, h.count_handles("uv_timer_t"))
    res[2]()
  end))

  it("raises exactly am.E_TIMEOUT when the lock is not granted in time", h.holding(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 20)
    h.tick()
    uv.update_time()                           -- the timers' clock is the loop's
    local t0 = uv.hrtime()
    local ok, err = pcall(wt.acquire, wt)
    local took = h.ms_since(t0)
    assert.is_false(ok)
    assert.equal(am.E_TIMEOUT, err)
    assert.is_true(took >= 19, "timed out after " .. took .. " ms")
    assert.is_true(took < 1000, "timed out after " .. took .. " ms")
    assert.is_true(m:isLocked())
  end))

  it("raises the custom timeout error unchanged", h.holding(am.Mutex.new, function(m)
    local tbl = {}
    for _, e in ipairs { "too slow", tbl } do
      local wt = am.withTimeout(m, 5, e)
      local ok, err = pcall(wt.acquire, wt)
      assert.is_false(ok)
      assert.is_true(rawequal(e, err), tostring(err))
    end
  end))

  it("uses am.E_TIMEOUT when the timeout error is nil", h.holding(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 2, nil)
    assert.same({ false, am.E_TIMEOUT }, { pcall(wt.acquire, wt) })
  end))

  it("accepts a timeout of 0: immediate success when free, E_TIMEOUT on the next turn when not", h.left_free(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 0)
    local r = wt:acquire()
    local a = h.acquirer(nil, "a", wt)
    assert.is_false(a.done)
    h.wait_until(function() return a.done end, 500)
    assert.equal(am.E_TIMEOUT, a.err)
    r()
  end))

  it("accepts a fractional timeout", h.holding(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 2.5)
    assert.same({ false, am.E_TIMEOUT }, { pcall(wt.acquire, wt) })
  end))

  it("removes a timed-out request: no phantom owner after the holder releases (P1, #54)", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local base = am.pending()
    local wt = am.withTimeout(m, 5)
    for _ = 1, 3 do
      assert.same({ false, am.E_TIMEOUT }, { pcall(wt.acquire, wt) })
    end
    assert.equal(base, am.pending())
    r()
    assert.is_false(m:isLocked())
    local ta = am.tryAcquire(m)
    local r2 = ta:acquire()
    r2()
  end))

  it("leaves the Semaphore's value untouched by timed-out requests (P1)", h.left_free(am.Semaphore.new, 1, function(s)
    local _, r = s:acquire()
    local wt = am.withTimeout(s, 5)
    assert.same({ false, am.E_TIMEOUT }, { pcall(wt.acquire, wt, 1) })
    r()
    assert.equal(1, s:getValue())
  end))

  it("unblocks lighter requests queued behind a heavy request when it times out (P1)", h.async(function()
    local s = am.Semaphore.new(1)
    local log = {}
    local wt = am.withTimeout(s, 60)
    local a = h.acquirer(log, "a", wt, 3)      -- blocks the head
    local b = h.acquirer(log, "b", s, 1)       -- head-of-line blocked
    h.tick()
    -- b waits as long as a does (a slow turn may have let a time out)
    assert.is_true(a.done or not b.done, "b granted while a blocked the head")
    h.wait_until(function() return b.done end, 1000)
    assert.equal(am.E_TIMEOUT, a.err)
    assert.is_true(b.ok)
    assert.equal(1, b.value)
    assert.same({ "a", "b" }, log)             -- settled in this order
    b.release()
    assert.equal(1, s:getValue())
  end))

  it("unblocks waitForUnlock waiters when the blocking request times out (P1)", h.async(function()
    local s = am.Semaphore.new(1)
    local wt = am.withTimeout(s, 60)
    local a = h.acquirer(nil, "a", wt, 2)
    local w = h.waiter(nil, "w", s, 1)
    h.tick()
    assert.is_true(a.done or not w.done, "w resumed while a blocked the head")
    h.wait_until(function() return w.done end, 1000)
    assert.equal(am.E_TIMEOUT, a.err)
    assert.is_true(w.ok)
  end))

  it("lets a grant before the deadline win, and the dead timer neither fires nor keeps the loop", function()
    local t0 = uv.hrtime()
    h.run(function()
      local m, r = h.held(am.Mutex.new())
      local wt = am.withTimeout(m, 10000)
      local a = h.acquirer(nil, "a", wt)
      h.sleep(5)
      r()
      h.tick()
      assert.is_true(a.ok)
      assert.equal(0, h.count_handles("uv_timer_t", true))
      a.release()
    end)
    assert.is_true(h.ms_since(t0) < 1000 * h.TIME_SCALE, "the loop waited for a dead timer")
  end)

  it("does not disturb a waiter granted before the deadline when the deadline passes", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local wt = am.withTimeout(m, 15)
    local state
    h.spawn(function()
      local rel = wt:acquire()
      state = "held"
      h.sleep(40)                              -- across the old deadline
      state = "slept"
      rel()
    end)
    r()                                        -- granted now, no loop turn between:
    assert.is_true(m:isLocked())               -- before the deadline, however slow
    h.wait_until(function() return state == "slept" end, 1000)
    assert.is_false(m:isLocked())
  end))

  it("settles a timeout racing a release one way only and resumes the waiter once", h.async(function()
    for i = 1, 20 do
      local m = am.Mutex.new()
      local wt = am.withTimeout(m, 4)
      local r = m:acquire()
      local resumed, outcome = 0, nil
      h.spawn(function()
        local ok, v = pcall(wt.acquire, wt)
        resumed = resumed + 1
        outcome = { ok = ok, v = v }
        h.sleep(2)                             -- fails on a second resume
        outcome.slept = true
      end)
      h.sleep(2 + i % 5)
      r()
      h.wait_until(function() return outcome ~= nil end, 1000)
      if outcome.ok then
        assert.is_true(m:isLocked())
        outcome.v()
      else
        assert.equal(am.E_TIMEOUT, outcome.v)
      end
      assert.is_false(m:isLocked())
      h.wait_until(function() return outcome.slept end, 1000)
      assert.equal(1, resumed)
    end
  end))

  it("orders waiting requests by weight and priority like the lock itself", h.async(function()
    local s = am.Semaphore.new(0)
    local wt = am.withTimeout(s, 2000)
    local log = {}
    local a = h.acquirer(log, "a", wt, 1, 0)
    local b = h.acquirer(log, "b", wt, 2, 5)
    local c = h.acquirer(log, "c", wt, nil, 1)
    s:setValue(4)
    h.tick()
    assert.same({ "b", "c", "a" }, log)
    assert.same({ 4, 2, 1 }, { b.value, c.value, a.value })
    a.release(); b.release(); c.release()
    local m = am.Mutex.new()
    local mt = am.withTimeout(m, 2000)
    local r = m:acquire()
    log = {}
    local x = h.acquirer(log, "x", mt)
    local y = h.acquirer(log, "y", mt, 3)
    r()
    h.granted_in_turn(log, y, x)
  end))

  it("leaves no timer active after a timeout", h.holding(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 3)
    assert.same({ false, am.E_TIMEOUT }, { pcall(wt.acquire, wt) })
    h.tick()
    assert.equal(0, h.count_handles("uv_timer_t", true))
  end))
end)

describe("withTimeout(...):waitForUnlock", function()
  it("returns at once when the lock is free", h.async(function()
    local m = am.Mutex.new()
    local wt = am.withTimeout(m, 10)
    assert.is_true((h.without_yield(function() wt:waitForUnlock() end)))
  end))

  it("returns when the lock is released in time", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local wt = am.withTimeout(m, 1000)
    local w = h.waiter(nil, "w", wt)
    h.sleep(3)
    r()
    h.tick()
    assert.is_true(w.ok)
  end))

  it("raises the timeout error when it is not, and leaves the waiter list (P1)", h.async(function()
    local s = am.Semaphore.new(0)
    local e = { "late" }
    local wt = am.withTimeout(s, 5, e)
    local base = am.pending()
    local outcome
    h.spawn(function()
      local ok, err = pcall(wt.waitForUnlock, wt, 2)
      outcome = { ok, err }
      h.sleep(20)                              -- fails if woken by the later release
      outcome[3] = "slept"
    end)
    h.wait_until(function() return outcome ~= nil end, 1000)
    assert.is_false(outcome[1])
    assert.is_true(rawequal(e, outcome[2]))
    assert.equal(base, am.pending())
    s:setValue(2)
    h.wait_until(function() return outcome[3] == "slept" end, 1000)
  end))
end)

describe("withTimeout(...):runExclusive", function()
  it("runs the function under the lock and returns its results", h.async(function()
    local s = am.Semaphore.new(3)
    local wt = am.withTimeout(s, 100)
    local n, a, b = select("#", wt:runExclusive(function(v) return v, nil end, 2)),
      wt:runExclusive(function(v) return v, s:getValue() end, 2)
    assert.equal(2, n)
    assert.equal(3, a)
    assert.equal(1, b)
    assert.equal(3, s:getValue())
  end))

  it("never calls the function after a timeout", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local wt = am.withTimeout(m, 5)
    local called = false
    assert.same({ false, am.E_TIMEOUT }, { pcall(wt.runExclusive, wt, function() called = true end) })
    r()
    h.tick()
    assert.is_false(called)
    assert.is_false(m:isLocked())
  end))

  it("does not limit how long the function holds the lock (#84)", h.left_free(am.Mutex.new, function(m)
    local wt = am.withTimeout(m, 5)
    local res = wt:runExclusive(function()
      h.sleep(25)
      return "done"
    end)
    assert.equal("done", res)
  end))
end)
