-- Ownership passes synchronously at release time (no barging); wake-ups are
-- deferred to the loop and delivered in grant order; never recursive
-- (docs/semantics.md, Dispatch; Coroutines and the loop).
local h = require "helpers"
local am = require "async_mutex"

describe("ownership at release time", function()
  it("grants the next Mutex waiter inside release(): still locked, waiter not yet run", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local a = h.acquirer(nil, "a", m)
    r()
    assert.is_true(m:isLocked())
    assert.is_false(a.done)
    h.tick()
    assert.is_true(a.done)
    a.release()
  end))

  it("queues a newcomer behind the granted waiter whatever its priority", h.async(function()
    h.newcomer_behind_waiter(am.Mutex.new())
  end))

  it("decrements a Semaphore's value inside release() and queues newcomers behind", h.async(function()
    local s = am.Semaphore.new(1)
    local _, r = s:acquire()
    local a = h.acquirer(nil, "a", s)
    r()
    assert.equal(0, s:getValue())
    assert.is_true(s:isLocked())
    local b = h.acquirer(nil, "b", s, 1, 100)
    assert.is_false(b.done)
    h.tick()
    assert.is_true(a.done)
    assert.equal(1, a.value)
    assert.is_false(b.done)
    a.release()
    h.tick()
    assert.is_true(b.done)
    b.release()
    assert.equal(1, s:getValue())
  end))

  it("makes tryAcquire fail right after the release that handed the lock on", h.async(function()
    local _, _, a = h.handed_on_refuses_try()
    a.release()
  end))

  it("sends a holder that releases and re-acquires at once to the back of the queue", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    h.spawn(function()
      local r = m:acquire()
      log[#log + 1] = "x1"
      h.sleep(2)
      r()
      local r2 = m:acquire()
      log[#log + 1] = "x2"
      r2()
    end)
    local a = h.acquirer(log, "a", m)
    a.after = function(w) w.release() end
    h.wait_until(function() return #log == 3 end)
    assert.same({ "x1", "a", "x2" }, log)
  end))
end)

describe("deferred wake-ups", function()
  it("resume the waiter from the loop, not inside setValue()", h.async(function()
    local s = am.Semaphore.new(0)
    local a = h.acquirer(nil, "a", s)
    s:setValue(1)
    assert.equal(0, s:getValue())
    assert.is_false(a.done)
    h.tick()
    assert.is_true(a.done)
    assert.equal(1, a.value)
    a.release()
  end))

  it("resume a canceled waiter from the loop, not inside cancel()", h.holding(am.Mutex.new, function(m)
    local a = h.acquirer(nil, "a", m)
    m:cancel()
    assert.is_false(a.done)
    h.tick()
    assert.is_true(a.done)
    assert.equal(am.E_CANCELED, a.err)
  end))

  it("are not delivered inside a releaser called by a resumed coroutine either", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local seen
    local b
    local a = h.acquirer(nil, "a", m)
    a.after = function(w)
      w.release()
      seen = b.done                           -- b granted, not yet resumed
    end
    b = h.acquirer(nil, "b", m)
    r()
    h.wait_until(function() return b.done end)
    assert.is_false(seen)
    b.release()
  end))

  it("are delivered in grant order across release, setValue and cancel", h.async(function()
    local s = am.Semaphore.new(0)
    local log = {}
    local a = h.acquirer(log, "a", s)
    local b = h.acquirer(log, "b", s)
    local c = h.acquirer(log, "c", s)
    local d = h.acquirer(log, "d", s)
    s:setValue(1)                              -- a
    s:release(1)                               -- b
    s:cancel()                                 -- c, d rejected
    assert.same({}, log)
    h.tick()
    assert.same({ "a", "b", "c", "d" }, log)
    assert.is_true(a.ok and b.ok)
    assert.same({ am.E_CANCELED, am.E_CANCELED }, { c.err, d.err })
    a.release(); b.release()
  end))

  it("hand over 300 waiters that each acquire and release without yielding", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local n = 0
    local function worker()
      local rel = m:acquire()
      n = n + 1
      rel()
    end
    for _ = 1, 300 do coroutine.wrap(worker)() end
    r()
    assert.equal(0, n)
    h.wait_until(function() return n == 300 end)
    assert.is_false(m:isLocked())
  end))
end)

describe("resumption by the module", function()
  it("resumes a waiter once per wait, and never while it waits on something else", h.async(function()
    local m1, m2 = am.Mutex.new(), am.Mutex.new()
    local log = {}
    local r1 = m1:acquire()
    local r2 = m2:acquire()
    h.spawn(function()
      local x1 = m1:acquire()
      log[#log + 1] = "got m1"
      local x2 = m2:acquire()
      log[#log + 1] = "got m2"
      x2(); x1()
    end)
    r1()
    h.tick()
    assert.same({ "got m1" }, log)
    -- activity on m1 while the coroutine waits on m2
    m1:release()                               -- releases its hold on m1
    local y = m1:acquire()
    m1:cancel()
    y()
    local wt = am.withTimeout(m1, 1)
    local z = wt:acquire()
    z()
    h.tick(3)
    assert.same({ "got m1" }, log)
    r2()
    h.tick()
    assert.same({ "got m1", "got m2" }, log)
  end))

  it("does not resume a timed-out waiter when the lock is later released", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local wt = am.withTimeout(m, 5)
    local outcome
    h.spawn(function()
      local ok, err = pcall(wt.acquire, wt)
      outcome = { ok, err }
      h.sleep(30)                              -- fails if anything else wakes it
      outcome[3] = "slept"
    end)
    h.wait_until(function() return outcome ~= nil end)
    assert.same({ false, am.E_TIMEOUT }, outcome)
    r()
    assert.is_false(m:isLocked())
    h.wait_until(function() return outcome[3] == "slept" end)
  end))

  it("does not resume a canceled waiter when the lock is later released", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local outcome
    h.spawn(function()
      local ok, err = pcall(m.acquire, m)
      outcome = { ok, err }
      h.sleep(20)
      outcome[3] = "slept"
    end)
    m:cancel()
    h.tick()
    assert.same({ false, am.E_CANCELED }, outcome)
    r()
    assert.is_false(m:isLocked())
    h.wait_until(function() return outcome[3] == "slept" end)
  end))
end)
