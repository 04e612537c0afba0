-- Debug mode reports only what can hang (docs/debug.md, Deadlocks and
-- Lockdep):
--  * a leased hold ends by itself (am.withLease; docs/lockkinds.md,
--    Leases), so it closes no wait-for cycle: a request for a lock the
--    requester's own lease holds, or a cycle through another's lease, waits
--    as it does with debug mode off, and is granted when the lease ends
--    (it raised E_DEADLOCK);
--  * a ReentrantMutex's re-entry by its holder is granted at once, past
--    the queue: it never waits, so it orders nothing (rm, then m, then rm
--    again was reported as an inversion of rm and m).
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

local rec = dr.recorder(before_each, after_each)

local deadlocks, inversions = rec.deadlocks, rec.inversions

describe("a leased hold in a wait-for cycle", function()
  it("its holder requesting the lock again waits for the lease's end and gets it", h.left_free(am.Mutex.new, function(m)
    local leased = am.withLease(m, 30)
    local r1 = leased:acquire()
    local ok, r2 = pcall(m.acquire, m)         -- waits about 30 ms
    assert.is_true(ok, r2)
    assert.equal(0, deadlocks())
    assert.is_false(r1())                      -- the lease ended: given back already
    r2()
  end))

  it("a write requested while the holder's own leased read lasts", h.async(function()
    local rw = am.RWLock.new()
    local rd = am.withLease(rw, 30):acquireRead()
    local ok, wr = pcall(rw.acquireWrite, rw)
    assert.is_true(ok, wr)
    assert.equal(0, deadlocks())
    wr()
    assert.is_false(rd())
  end))

  it("a Semaphore unit of the requester's own lease counts as coming back", h.async(function()
    local s = am.Semaphore.new(1)
    local _, r1 = am.withLease(s, 30):acquire()
    local ok, _, r2 = pcall(s.acquire, s)
    assert.is_true(ok)
    assert.equal(0, deadlocks())
    r2()
    assert.is_false(r1())
  end))

  it("a cycle through another coroutine's lease: A holds a by lease and waits for b, B holds b and requests a", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local rb_here = b:acquire()                -- B: this coroutine
    local A = {}
    A.co = h.spawn(function()
      local ra = am.withLease(a, 30):acquire()
      local rb = b:acquire()                   -- waits for B
      A.lease_ended = not ra()
      rb()
      A.done = true
    end)
    assert.is_nil(A.done)                      -- A waits for b
    local ok, ra = pcall(a.acquire, a)         -- waits for A's lease to end
    assert.is_true(ok, ra)
    assert.equal(0, deadlocks())
    ra(); rb_here()
    h.wait_until(function() return A.done end)
    assert.is_true(A.lease_ended)
  end))

  it("a lease counted from the request, held by the requester", h.async(function()
    local m = am.Mutex.new()
    local r1 = am.withLease(m, 30, nil, { fromRequest = true }):acquire()
    local ok, r2 = pcall(m.acquire, m)
    assert.is_true(ok, r2)
    assert.equal(0, deadlocks())
    r2()
    assert.is_false(r1())
  end))

  it("is still a deadlock when the cycle does not go through the lease", h.async(function()
    -- this coroutine holds m (plain) and a leased n: requesting m again
    -- waits for its own plain hold, which no lease ends
    local m, n = am.Mutex.new(), am.Mutex.new()
    local rm = m:acquire()
    local rn = am.withLease(n, 60000):acquire()
    assert.equal(am.E_DEADLOCK, select(2, pcall(m.acquire, m)))
    assert.equal(1, deadlocks())
    rn(); rm()
  end))
end)

describe("a ReentrantMutex re-entered by its holder", function()
  it("rm, then m, then rm again: no inversion", h.async(function()
    local rm = am.debug.name(am.ReentrantMutex.new(), "rm")
    local m = am.debug.name(am.Mutex.new(), "m")
    local r1 = rm:acquire()
    local r2 = m:acquire()
    local r3 = rm:acquire()                    -- a re-entry: granted at once
    r3(); r2(); r1()
    assert.equal(0, inversions())
    assert.matches("lockdep: 2 classes, 1 edges", am.debug.report())   -- rm -> m only
  end))

  it("the same through withTimeout and runExclusive", h.async(function()
    local rm = am.debug.name(am.ReentrantMutex.new(), "rm")
    local m = am.debug.name(am.Mutex.new(), "m")
    rm:runExclusive(function()
      m:runExclusive(function()
        am.withTimeout(rm, 1000):runExclusive(function() end)
      end)
    end)
    assert.equal(0, inversions())
  end))

  it("a real inversion through a ReentrantMutex is still reported: rm then m, and m then rm", h.async(function()
    local rm = am.debug.name(am.ReentrantMutex.new(), "rm")
    local m = am.debug.name(am.Mutex.new(), "m")
    rm:runExclusive(function() m:runExclusive(function() end) end)
    m:runExclusive(function() rm:runExclusive(function() end) end)
    assert.equal(1, inversions())
  end))

  it("a cycle through its held levels is still found: T holds m and waits for rm, its holder requests m", h.async(function()
    local rm, m = am.ReentrantMutex.new(), am.Mutex.new()
    local r1 = rm:acquire()
    local r2 = rm:acquire()                    -- two levels, here
    local T = {}
    T.co = h.spawn(function()
      local rmm = m:acquire()
      local rr = rm:acquire()                  -- waits for both levels
      rr(); rmm()
      T.done = true
    end)
    assert.is_nil(T.done)
    assert.equal(am.E_DEADLOCK, select(2, pcall(m.acquire, m)))
    assert.equal(1, deadlocks())
    r2(); r1()
    h.wait_until(function() return T.done end)
  end))
end)
