-- Abort signals: am.signal(), s:abort([reason]), s.aborted, s.reason and
-- am.withSignal(lock, s); one signal aborts every request made with it at
-- once, and a request made with an aborted signal fails at once without
-- queueing (docs/semantics.md, Abort signals).
local h = require "helpers"
local am = require "async_mutex"

-- A coroutine requesting through `lock[method](lock, ...)` under pcall.
local function req(lock, method, ...)
  return h.requester(method or "acquire", nil, "r", lock, ...)
end

describe("am.signal()", function()
  it("makes a signal that is not aborted, whose abort sets its reason once", h.async(function()
    local s = am.signal()
    assert.is_false(s.aborted)
    assert.is_nil(s.reason)
    assert.matches("^async_mutex%.Signal %(not aborted, 0 waiting%): 0x%x+$", tostring(s))
    s:throwIfAborted()                          -- nothing to raise
    local reason = { "a reason" }
    s:abort(reason)
    assert.is_true(s.aborted)
    assert.equal(reason, s.reason)
    s:abort("later")                            -- the first abort's reason stands
    assert.equal(reason, s.reason)
    assert.matches("^async_mutex%.Signal %(aborted, 0 waiting%)", tostring(s))
    local ok, err = pcall(s.throwIfAborted, s)
    assert.is_false(ok)
    assert.equal(reason, err)
  end))

  it("gives E_CANCELED as the reason of an abort without one", h.async(function()
    local s1, s2 = am.signal(), am.signal()
    s1:abort()
    s2:abort(nil)
    assert.equal(am.E_CANCELED, s1.reason)
    assert.equal(am.E_CANCELED, s2.reason)
  end))

  it("has no other fields", h.async(function()
    local s = am.signal()
    assert.is_nil(s.abortd)
    assert.is_nil(s[1])
  end))
end)

describe("am.withSignal(lock, s)", function()
  it("aborts every request made with the signal at once, on several locks, each with the reason", h.async(function()
    local m, sem, rw, km = am.Mutex.new(), am.Semaphore.new(1), am.RWLock.new(), am.KeyedMutex.new()
    local rm, rs, rr, rk = m:acquire(), select(2, sem:acquire()), rw:acquireWrite(), km:acquire("k")
    local s = am.signal()
    local reqs = {
      req(am.withSignal(m, s)), req(am.withSignal(m, s)),
      req(am.withSignal(sem, s), "acquire", 1),
      req(am.withSignal(rw, s), "acquireRead"), req(am.withSignal(rw, s), "acquireWrite"),
      req(am.withSignal(km, s), "acquire", "k"),
      req(am.withSignal(m, s), "waitForUnlock"),
    }
    local unsignalled = req(m)
    local base = am.pending()
    assert.matches("%(not aborted, 7 waiting%)", tostring(s))
    s:abort("stop")
    assert.matches("%(aborted, 0 waiting%)", tostring(s))
    assert.equal(base, am.pending())            -- decided now, resumed next turn
    for _, r in ipairs(reqs) do assert.is_false(r.done) end
    h.tick()
    for _, r in ipairs(reqs) do
      assert.is_true(r.done)
      assert.is_false(r.ok)
      assert.equal("stop", r.err)
    end
    assert.is_false(unsignalled.done)           -- other requests wait on
    assert.same({ unsignalled.co }, { am.query(m).pending[1].owner })
    assert.equal(1, #am.query(m).pending)
    rm(); rs(); rr(); rk(); h.tick()
    assert.is_true(unsignalled.ok)
    unsignalled.release()
    assert.equal(0, km:count())
  end))

  it("lets the queue move on: an aborted head no longer blocks the requests behind it", h.async(function()
    local sem = am.Semaphore.new(2)
    local _, r1 = sem:acquire(1)
    local s = am.signal()
    local big = req(am.withSignal(sem, s), "acquire", 2)
    local small = h.acquirer(nil, "small", sem, 1)
    assert.is_false(small.done)                 -- behind the head (the grant rule)
    s:abort()
    h.tick()
    assert.equal(am.E_CANCELED, big.err)
    assert.is_true(small.ok)
    small.release(); r1()
  end))

  it("fails at once with an aborted signal, without yielding or queueing, even on a free lock", h.async(function()
    local s = am.signal()
    s:abort("too late")
    local m, km = am.Mutex.new(), am.KeyedMutex.new()
    local base = am.pending()
    for _, call in ipairs({
      function() return am.withSignal(m, s):acquire() end,
      function() return am.withSignal(m, s):waitForUnlock() end,
      function() return am.withSignal(km, s):acquire("k") end,
      function() return am.withSignal(km, s):waitForUnlock("k") end,
      function() return am.withSignal(am.Semaphore.new(0), s):acquire() end,
      function() return am.withSignal(am.RWLock.new(), s):acquireRead() end,
      function() return am.tryAcquire(am.withSignal(m, s)):acquire() end,
      function() return am.withTimeout(am.withSignal(m, s), 10):acquire() end,
      function() return am.withSignal(km, s):acquireAll({ "a", "b" }) end,
      function() return am.withSignal(m, s):runExclusive(function() error("ran") end) end,
    }) do
      local finished, res = h.try_now(call)
      assert.is_true(finished)
      assert.same({ false, "too late", n = 2 }, res)
    end
    assert.equal(base, am.pending())
    assert.is_false(m:isLocked())
    assert.equal(0, km:count())                 -- no key's lock made
  end))

  it("leaves a granted hold alone: aborting after the grant changes nothing", h.async(function()
    local m = am.Mutex.new()
    local s = am.signal()
    local rel = m:acquire()
    local r = req(am.withSignal(m, s))
    rel(); h.tick()
    assert.is_true(r.ok)
    s:abort()
    assert.is_true(m:isLocked())
    assert.is_true(r.release())
    assert.is_false(m:isLocked())
    assert.equal("done", am.withSignal(m, am.signal()):runExclusive(function() return "done" end))
  end))

  it("composes with withTimeout either way round: whichever comes first ends the wait", h.holding(am.Mutex.new, function(m)
    local s1, s2 = am.signal(), am.signal()
    local a = req(am.withTimeout(am.withSignal(m, s1), 1000))
    local b = req(am.withSignal(am.withTimeout(m, 1000), s2))
    local c = req(am.withSignal(am.withTimeout(m, 5), am.signal()))
    s1:abort("a"); s2:abort("b")
    h.wait_until(function() return c.done end)
    assert.equal("a", a.err)
    assert.equal("b", b.err)
    assert.equal(am.E_TIMEOUT, c.err)
  end))

  it("composes with tryAcquire and withLease", h.async(function()
    local m = am.Mutex.new()
    local s = am.signal()
    local rel = am.tryAcquire(am.withSignal(m, s)):acquire()
    assert.equal(am.E_ALREADY_LOCKED, h.error_of(function() am.tryAcquire(am.withSignal(m, s)):acquire() end))
    rel()
    local leased = am.withLease(am.withSignal(m, s), 1000)
    local r = req(leased)
    assert.is_true(r.ok)
    local w = req(leased)
    s:abort("gone")
    h.tick()
    assert.equal("gone", w.err)
    assert.is_true(r.release())
  end))

  it("ends acquireAll with the reason, giving back the keys it took", h.async(function()
    local km, rb = h.held(am.KeyedMutex.new(), "acquire", "b")
    local s = am.signal()
    local r = req(am.withSignal(km, s), "acquireAll", { "a", "b", "c" })
    assert.is_true(km:isLocked("a"))            -- "a" taken, waiting for "b"
    s:abort("stop")
    h.tick()
    assert.equal("stop", r.err)
    assert.is_false(km:isLocked("a"))
    assert.is_false(km:isLocked("c"))
    rb()
  end))

  it("bounds acquireAll by one deadline and the signal together", h.async(function()
    local km = am.KeyedMutex.new()
    local rb = km:acquire("b")
    local s = am.signal()
    local aborted = req(am.withTimeout(am.withSignal(km, s), 1000), "acquireAll", { "a", "b" })
    local timed = req(am.withSignal(am.withTimeout(km, 5), am.signal()), "acquireAll", { "b", "c" })
    s:abort("stop")
    h.wait_until(function() return aborted.done and timed.done end)
    assert.equal("stop", aborted.err)
    assert.equal(am.E_TIMEOUT, timed.err)
    assert.is_false(km:isLocked("a"))
    assert.is_false(km:isLocked("c"))
    rb()
    local all = am.withTimeout(am.withSignal(km, am.signal()), 1000):acquireAll({ "a", "b" })
    assert.is_true(km:isLocked("a") and km:isLocked("b"))
    all()
  end))

  it("forgets a request whose coroutine was closed, and one that timed out", h.holding(am.Mutex.new, function(m)
    local s = am.signal()
    local a = req(am.withSignal(m, s))
    local b = req(am.withTimeout(am.withSignal(m, s), 5))
    assert.matches("2 waiting", tostring(s))
    coroutine.close(a.co)
    h.wait_until(function() return b.done end)
    assert.equal(am.E_TIMEOUT, b.err)
    assert.matches("0 waiting", tostring(s))
    s:abort()
    assert.same({}, am.query(m).pending)
  end))

  it("is seen by am.query as a pending request like any other", h.holding(am.Mutex.new, function(m)
    local s = am.signal()
    local r = req(am.withSignal(m, s), "acquire", 3)
    local q = am.query(m)
    assert.equal(r.co, q.pending[1].owner)
    assert.equal(3, q.pending[1].priority)
    s:abort(); h.tick()
  end))

  it("lets a finalizer abort a signal, whenever the collector runs it", h.holding(am.Mutex.new, function(m)
    local s = am.signal()
    local waiting = am.withSignal(m, s)
    -- garbage whose finalizer aborts: the collector runs it at one of the
    -- allocations the request makes before it queues, or later
    setmetatable({}, { __gc = function() s:abort("from a finalizer") end })
    local r = req(waiting)
    collectgarbage()
    h.tick()
    assert.is_true(r.done)
    assert.equal("from a finalizer", r.err)
    assert.same({}, am.query(m).pending)
  end))

  it("survives lua_close with requests still waiting with a signal", function()
    local res = h.subprocess([[
      local am = require "async_mutex"
      local m = am.Mutex.new()
      local s = am.signal()
      local holder = coroutine.wrap(function() local r = m:acquire(); coroutine.yield(); r() end)
      holder()
      for _ = 1, 3 do
        coroutine.wrap(function() am.withSignal(m, s):acquire() end)()
      end
      print(tostring(s):match("%d+ waiting"))
    ]])
    assert.equal(0, res.rc)
    assert.equal("3 waiting\n", res.stdout)
    assert.equal("", res.stderr)
  end)
end)

describe("am.withSignal: bad input", function()
  it("names the argument and what it expects", h.async(function()
    local m = am.Mutex.new()
    assert.equal("bad argument #2 to 'withSignal' (async_mutex.Signal expected, got table)",
      h.error_of(function() am.withSignal(m, {}) end))
    assert.equal("bad argument #2 to 'withSignal' (async_mutex.Signal expected, got no value)",
      h.error_of(function() am.withSignal(m) end))
    assert.equal("bad argument #1 to 'withSignal' (async_mutex lock expected, got table)",
      h.error_of(function() am.withSignal({}, am.signal()) end))
    local s = am.signal()
    assert.equal("bad argument #1 to 'abort' (async_mutex.Signal expected, got table)",
      h.error_of(function() s.abort({}) end))
  end))
end)
