-- Decorators compose (docs/semantics.md, Where async-mutex is silent:
-- Nested decoration; the document said nested decoration was refused):
-- withTimeout, tryAcquire and withLease take a decorated lock as they take
-- its lock; the outermost limit stands, with its own error; a lease and a
-- limit keep each other.
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

-- The error of lock:acquire() while 'm' is held here, and the loop time it
-- took.
local function refused(lock)
  local t0 = uv.now()
  local ok, err = pcall(lock.acquire, lock)
  assert.is_false(ok)
  return err, uv.now() - t0
end

describe("a decorated lock decorated again", function()
  it("withTimeout of withTimeout: the outer timeout and its error", h.holding(am.Mutex.new, function(m)
    local err, ms = refused(am.withTimeout(am.withTimeout(m, 5000, "inner"), 10))
    assert.equal(am.E_TIMEOUT, err)
    assert.is_true(ms >= 10 and ms < 2000, tostring(ms))
    err = refused(am.withTimeout(am.withTimeout(m, 5000, "inner"), 10, "outer"))
    assert.equal("outer", err)
  end))

  it("tryAcquire of withTimeout never waits; withTimeout of tryAcquire waits", h.holding(am.Mutex.new, function(m)
    local err, ms = refused(am.tryAcquire(am.withTimeout(m, 5000)))
    assert.equal(am.E_ALREADY_LOCKED, err)
    assert.equal(0, ms)
    err, ms = refused(am.withTimeout(am.tryAcquire(m), 10))
    assert.equal(am.E_TIMEOUT, err)
    assert.is_true(ms >= 10, tostring(ms))
  end))

  it("withLease of withTimeout keeps the timeout; the grant is leased", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local d = am.withLease(am.withTimeout(m, 10), 20)
    assert.equal(am.E_TIMEOUT, (refused(d)))
    r()
    local leased = d:acquire()
    -- the lease ends the hold (its timer: 20 ms, later under GC stress
    -- beside valgrind, whose loop time lags)
    h.wait_until(function() return not m:isLocked() end, 2000, "the lease's end")
    assert.is_false(leased())
  end))

  it("shares the plain lock's state", h.left_free(am.Mutex.new, function(m)
    local d = am.tryAcquire(am.withTimeout(am.withLease(m, 1000), 10))
    local r = d:acquire()
    assert.is_true(m:isLocked())
    assert.is_true(d:isLocked())
    r()
  end))
end)
