-- The module table: exports, error strings, pending(), and loading it twice.
local h = require "helpers"
local am = require "async_mutex"

describe("require 'async_mutex'", function()
  it("exports Mutex.new, Semaphore.new, withTimeout, tryAcquire, setErrorHandler, pending, spawn and sleep as functions", function()
    assert.is_function(am.Mutex.new)
    assert.is_function(am.Semaphore.new)
    assert.is_function(am.withTimeout)
    assert.is_function(am.tryAcquire)
    assert.is_function(am.setErrorHandler)
    assert.is_function(am.pending)
    assert.is_function(am.spawn)
    assert.is_function(am.sleep)
  end)

  it("exports async-mutex's three error strings verbatim", function()
    assert.equal("timeout while waiting for mutex to become available", am.E_TIMEOUT)
    assert.equal("mutex already locked", am.E_ALREADY_LOCKED)
    assert.equal("request for lock canceled", am.E_CANCELED)
  end)

  it("loads its core from the C module async_mutex.core", function()
    assert.is_not_nil(package.loaded["async_mutex.core"])
    assert.is_string(package.searchpath("async_mutex.core", package.cpath))
  end)

  it("creates independent locks", h.async(function()
    local m1, m2 = am.Mutex.new(), am.Mutex.new()
    local r1 = m1:acquire()
    assert.is_true(m1:isLocked())
    assert.is_false(m2:isLocked())
    local r2 = m2:acquire()
    r1()
    assert.is_false(m1:isLocked())
    assert.is_true(m2:isLocked())
    r2()
  end))
end)

describe("async_mutex.pending()", function()
  it("counts coroutines queued or granted but not yet resumed", h.async(function()
    local base = am.pending()
    local m = am.Mutex.new()
    local r = m:acquire()
    assert.equal(base, am.pending())          -- an immediate grant queues nothing
    local a = h.acquirer(nil, "a", m)
    local b = h.acquirer(nil, "b", m)
    assert.equal(base + 2, am.pending())
    r()                                       -- a granted, not resumed yet
    assert.equal(base + 2, am.pending())
    h.tick()
    assert.is_true(a.done)
    assert.equal(base + 1, am.pending())
    a.release()
    h.tick()
    assert.is_true(b.done)
    assert.equal(base, am.pending())
    b.release()
  end))

  it("counts waitForUnlock waiters and forgets canceled acquirers once resumed", h.async(function()
    local base = am.pending()
    local s = am.Semaphore.new(0)
    local w = h.waiter(nil, "w", s)
    local a = h.acquirer(nil, "a", s)
    assert.equal(base + 2, am.pending())
    s:cancel()
    h.tick()
    assert.is_true(a.done)
    assert.equal(am.E_CANCELED, a.err)
    assert.equal(base + 1, am.pending())
    s:release(1)
    h.tick()
    assert.is_true(w.done)
    assert.equal(base, am.pending())
  end))
end)

describe("require 'async_mutex' again after clearing package.loaded", function()
  it("gives a second copy that works on the same loop alongside the first", h.async(function()
    local old = am
    package.loaded.async_mutex = nil
    package.loaded["async_mutex.core"] = nil
    local new = require "async_mutex"
    assert.equal(old.E_CANCELED, new.E_CANCELED)

    local log = {}
    local m1, m2 = old.Mutex.new(), new.Mutex.new()
    local s1, s2 = old.Semaphore.new(1), new.Semaphore.new(1)
    local r1, r2 = m1:acquire(), m2:acquire()
    local _, q1 = s1:acquire()
    local _, q2 = s2:acquire()
    local w = {
      h.acquirer(log, "m1", m1), h.acquirer(log, "m2", m2),
      h.acquirer(log, "s1", s1), h.acquirer(log, "s2", s2),
    }
    r1(); r2(); q1(); q2()
    assert.same({}, log)                      -- deferred in both copies
    h.tick()
    table.sort(log)
    assert.same({ "m1", "m2", "s1", "s2" }, log)
    for _, x in ipairs(w) do x.release() end
    assert.is_false(m1:isLocked())
    assert.is_false(m2:isLocked())

    -- timeouts and tryAcquire from both copies
    local hold1, hold2 = m1:acquire(), m2:acquire()
    local t1 = h.acquirer(nil, "t1", old.withTimeout(m1, 5))
    local t2 = h.acquirer(nil, "t2", new.withTimeout(m2, 5))
    h.wait_until(function() return t1.done and t2.done end)
    assert.equal(old.E_TIMEOUT, t1.err)
    assert.equal(new.E_TIMEOUT, t2.err)
    local ta = new.tryAcquire(m2)
    assert.same({ false, new.E_ALREADY_LOCKED }, { pcall(ta.acquire, ta) })
    hold1(); hold2()
    package.loaded.async_mutex = old
  end))

  it("keeps the first copy's queued waiters alive and resumable", h.async(function()
    local old = am
    local m = old.Mutex.new()
    local r = m:acquire()
    local log = {}
    local a = h.acquirer(log, "a", m)
    package.loaded.async_mutex = nil
    package.loaded["async_mutex.core"] = nil
    local new = require "async_mutex"
    h.gc()
    local n = new.Mutex.new()
    local rn = n:acquire()
    local b = h.acquirer(log, "b", n)
    r()
    rn()
    h.tick()
    table.sort(log)
    assert.same({ "a", "b" }, log)
    a.release()
    b.release()
    assert.is_false(m:isLocked())
    assert.is_false(n:isLocked())
    package.loaded.async_mutex = old
  end))
end)

describe("async_mutex.setErrorHandler", function()
  it("refuses a handler that is neither a function nor nil, and keeps the current one", function()
    local function mine() end
    local prev = am.setErrorHandler(mine)
    local ok, err = pcall(function() am.setErrorHandler(42) end)
    assert.is_false(ok)
    assert.is_truthy(err:find("bad argument #1 to 'setErrorHandler' (function or nil expected, got number)", 1, true), err)
    assert.equal(mine, am.setErrorHandler(prev))    -- unchanged by the bad call
  end)
end)
