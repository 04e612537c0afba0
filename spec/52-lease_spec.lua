-- Leases: am.withLease(lock, ms [, lost_error [, options]]) bounds a hold;
-- the lost-hold vocabulary (releasers return booleans, check(), E_LOST)
-- (docs/lockkinds.md, Leases).
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

local no_more_pending = h.pending_baseline(before_each)

describe("releasers' results", function()
  it("are true for the call that releases and false afterwards, for every kind", h.async(function()
    local m, s, rw = am.Mutex.new(), am.Semaphore.new(2), am.RWLock.new()
    local r = m:acquire()
    assert.is_true(r:check())
    assert.is_true(r())
    assert.is_false(r())
    assert.is_false(r:check())                  -- an ordinary releaser never raises
    local _, rs = s:acquire()
    assert.same({ true, false }, { rs(), rs() })
    local rr = rw:acquireRead()
    assert.same({ true, false }, { rr(), rr() })
  end))

  it("check false once an unscoped release ended the hold, as tostring shows", h.async(function()
    local m, rw = am.Mutex.new(), am.RWLock.new()
    local r = m:acquire()
    m:release()
    assert.is_false(r:check())
    local r2 = m:acquire()                      -- a later hold is not r's
    assert.is_false(r:check())
    assert.is_true(r2:check())
    r2()
    local w = rw:acquireWrite()
    rw:release()
    assert.is_false(w:check())
    local rd = rw:acquireRead()
    rw:release()                                -- ends no read
    assert.is_true(rd:check())
    rd()
  end))

  it("are false after an unscoped release ended the hold", h.async(function()
    local m, r = h.held(am.Mutex.new())
    m:release()
    assert.is_false(r())                        -- its first call: a no-op on the lock
    assert.is_false(m:isLocked())
    -- the same for a write hold, a key's, through a lease, and once
    -- someone else holds the lock since: false, and that hold stays
    local rw, km, lm = am.RWLock.new(), am.KeyedMutex.new(), am.withLease(am.Mutex.new(), 1000)
    local w = rw:acquireWrite()
    rw:release()
    assert.is_false(w())
    local k = km:acquire("k")
    km:release("k")
    assert.is_false(k())
    local l = lm:acquire()
    lm:release()
    assert.is_false(l())
    r = m:acquire()
    m:release()
    local later = m:acquire()
    assert.is_false(r())
    assert.is_true(m:isLocked())
    assert.is_true(later())
    -- a read hold is not ended by rw:release(): its call ends it
    local rd = rw:acquireRead()
    rw:release()
    assert.is_true(rd())
  end))
end)

describe("am.withLease", function()
  it("exports am.E_LOST with its exact text", function()
    assert.equal("lock lost: lease expired", am.E_LOST)
  end)

  it("leaves a hold released in time as an ordinary one", h.left_free(am.Mutex.new, function(m)
    local lm = am.withLease(m, 1000)
    local r = lm:acquire()
    assert.is_true(m:isLocked())
    assert.is_true(r:check())
    assert.is_true(r())
    assert.is_false(r())
    assert.is_false(r:check())
  end))

  it("ends a hold that outlasts its lease: the lock passes on, the releaser returns false", h.left_free(am.Mutex.new, function(m)
    local lm = am.withLease(m, 10)
    local r = lm:acquire()
    local w = h.acquirer(nil, "w", m)
    h.wait_until(function() return w.done end)
    assert.is_true(w.ok)                        -- the waiter got the lock
    assert.is_false(r())                        -- the lost hold: nothing to do
    assert.matches("%(lost%)", tostring(r))
    assert.same({ false, am.E_LOST }, { pcall(r.check, r) })
    assert.is_true(m:isLocked())                -- r() did not touch w's hold
    w.release()
  end))

  it("raises a custom lost error from check()", h.async(function()
    local err = {}
    local m = am.Mutex.new()
    local r = am.withLease(m, 5, err):acquire()
    h.wait_until(function() return not m:isLocked() end)
    assert.same({ false, err }, { pcall(r.check, r) })
  end))

  it("makes runExclusive raise the lost error when fn returns, whatever fn returned", h.left_free(am.Mutex.new, function(m)
    local lm = am.withLease(m, 10)
    assert.same({ false, am.E_LOST }, { pcall(lm.runExclusive, lm, function()
      h.sleep(40)
      return "stale"
    end) })
    assert.same({ "fresh" }, { lm:runExclusive(function() return "fresh" end) })
    local boom = {}
    assert.same({ false, boom }, { pcall(lm.runExclusive, lm, function()
      h.sleep(40)
      error(boom)
    end) })                                     -- fn's own error wins
  end))

  it("is not lost once an unscoped release ended the hold: the lease just ends", h.left_free(am.Mutex.new, function(m)
    local lm = am.withLease(m, 10)
    local r = lm:acquire()
    m:release()
    local r2 = m:acquire()                      -- the next holder, not leased
    h.sleep(30)                                 -- r's lease runs out
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(r))
    assert.is_false(r:check())                  -- no E_LOST: it was released
    assert.is_false(r())
    assert.is_true(m:isLocked())                -- r2's hold untouched
    r2()
    assert.same({ "kept" }, { lm:runExclusive(function()
      m:release()                               -- fn ends its own hold
      h.sleep(30)
      return "kept"
    end) })
  end))

  it("counts from the grant by default: time spent waiting is not charged", h.async(function()
    local m = am.Mutex.new()
    local lm = am.withLease(m, 30)
    local hold = m:acquire()
    local got
    h.spawn(function()
      local r = lm:acquire()
      got = r
    end)
    h.sleep(50)                                 -- longer than the lease, while waiting
    hold()
    h.wait_until(function() return got end)
    assert.is_true(got:check())                 -- the lease started at the grant
    assert.is_true(got())
  end))

  it("counts from the request with fromRequest: a hold granted too late is lost at once", h.async(function()
    local m = am.Mutex.new()
    local lm = am.withLease(m, 20, nil, { fromRequest = true })
    local hold = m:acquire()
    local got
    h.spawn(function() got = lm:acquire() end)
    h.sleep(40)
    hold()
    h.wait_until(function() return got end)
    h.wait_until(function() return not m:isLocked() end)
    assert.same({ false, am.E_LOST }, { pcall(got.check, got) })
    assert.is_false(got())
  end))

  it("leases every kind: a Semaphore's weight, an RWLock's reads and writes, a keyed lock's key", h.async(function()
    local s = am.Semaphore.new(3)
    local v, rs = am.withLease(s, 5):acquire(2)
    assert.equal(3, v)
    assert.equal(1, s:getValue())
    h.wait_until(function() return s:getValue() == 3 end)
    assert.is_false(rs())

    local rw = am.RWLock.new()
    local lrw = am.withLease(rw, 5)
    local r1, r2 = lrw:acquireRead(), lrw:acquireRead()
    assert.equal(2, rw:readers())
    h.wait_until(function() return not rw:isLocked() end)
    assert.same({ false, false }, { r1(), r2() })
    local wr = lrw:acquireWrite()
    assert.equal("attempt to downgrade a leased write hold", E(function() wr:downgrade() end))
    h.wait_until(function() return not rw:isLocked() end)

    local km = am.KeyedMutex.new()
    local rk = am.withLease(km, 5):acquire("k")
    assert.is_true(km:isLocked("k"))
    h.wait_until(function() return not km:isLocked("k") end)
    assert.equal(0, km:count())
    assert.is_false(rk())
  end))

  it("composes with withTimeout, either way round, and with tryAcquire", h.async(function()
    local m, hold = h.held(am.Mutex.new())
    local a = am.withTimeout(am.withLease(m, 10), 5)
    local b = am.withLease(am.withTimeout(m, 5, "slow"), 10)
    assert.same({ false, am.E_TIMEOUT }, { pcall(a.acquire, a) })
    assert.same({ false, "slow" }, { pcall(b.acquire, b) })
    local c = am.tryAcquire(am.withLease(m, 10))
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(c.acquire, c) })
    hold()
    for _, l in ipairs({ a, b, c }) do
      local r = l:acquire()
      h.wait_until(function() return not m:isLocked() end)   -- the lease ends it
      assert.is_false(r())
    end
  end))

  it("a waiting coroutine closed leaves no lease behind; a released lease stops its timer", h.async(function()
    local m, hold = h.held(am.Mutex.new())
    local w = h.acquirer(nil, "w", am.withLease(m, 5))
    assert.is_true(coroutine.close(w.co))
    hold()
    local r = am.withLease(m, 60000):acquire()
    assert.is_true(r())
    -- h.async fails if a timer were left active
    no_more_pending()
  end))

  it("serves many leases on the one timer heap", h.async(function()
    local n = h.load(2000)
    local s = am.Semaphore.new(n)
    local ls = am.withLease(s, 5)
    local rs = {}
    for i = 1, n do local _, r = ls:acquire(); rs[i] = r end
    assert.equal(0, s:getValue())
    for i = 1, n, 2 do assert.is_true(rs[i]()) end   -- half released in time
    h.wait_until(function() return s:getValue() == n end)
    for i = 2, n, 2 do assert.is_false(rs[i]()) end  -- half lost
  end))
end)

describe("am.withLease bad input", function()
  it("rejects a bad lock, lease or options and a ReentrantMutex", function()
    local m = am.Mutex.new()
    assert.equal("bad argument #1 to 'withLease' (async_mutex lock expected, got table)",
      E(function() am.withLease({}, 10) end))
    assert.equal("bad argument #2 to 'withLease' (lease must be a positive finite number)",
      E(function() am.withLease(m, 0) end))
    assert.equal("bad argument #2 to 'withLease' (lease must be a positive finite number)",
      E(function() am.withLease(m, math.huge) end))
    assert.equal("bad argument #2 to 'withLease' (lease must be a positive finite number)",
      E(function() am.withLease(m, "10") end))
    assert.equal("bad argument #4 to 'withLease' (options must be a table, got number)",
      E(function() am.withLease(m, 10, nil, 1) end))
    assert.equal("bad argument #1 to 'withLease' (a ReentrantMutex cannot be leased (its levels are one hold))",
      E(function() am.withLease(am.ReentrantMutex.new(), 10) end))
  end)

  it("numbers a leased lock's arguments as the lock's own", h.async(function()
    local lm = am.withLease(am.Mutex.new(), 10)
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got table)",
      E(function() lm:acquire({}) end))
    assert.equal("bad argument #2 to 'runExclusive' (priority must be a number, got table)",
      E(function() lm:runExclusive(function() end, {}) end))
    local ls = am.withLease(am.Semaphore.new(1), 10)
    assert.equal("bad argument #1 to 'acquire' (weight must be a positive integer)",
      E(function() ls:acquire(0) end))
  end))
end)
