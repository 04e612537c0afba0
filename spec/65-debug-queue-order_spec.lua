-- Debug mode: deadlocks through queue order (docs/debug.md, Deadlocks).  A
-- waiter is granted only from its queue's head (docs/semantics.md, Dispatch),
-- so it waits for the holders that must give back AND for the acquirers the
-- grant rule serves before it: a read queued behind a writer that waits for
-- the reader's first read, a Semaphore request behind a larger one
-- (head-of-line blocking), a request of a lower priority.  A waiter ahead
-- that a release outside the cycle will let in breaks it; a timed wait does
-- not.
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

local rec = dr.recorder(before_each, after_each)

local deadlocks, first_deadlock = rec.deadlocks, rec.first_deadlock
local function pat(v) return (tostring(v):gsub("%p", "%%%0")) end

describe("a read queued behind a writer", function()
  it("a second read of an RWLock behind a writer that waits for the first raises E_DEADLOCK", h.async(function()
    local rw = am.debug.name(am.RWLock.new(), "routes")
    local rd = rw:acquireRead()
    local w = h.acquirer(nil, "writer", rw)  -- waits for the read above
    assert.is_false(w.done)
    local ok, err = pcall(rw.acquireRead, rw)
    assert.is_false(ok)
    assert.equal(am.E_DEADLOCK, err)
    assert.equal(1, deadlocks())
    local text = first_deadlock().text
    assert.matches('requests RWLock "routes", held by ' .. pat(coroutine.running()) .. ".-, queued behind "
                   .. pat(w.co), text)
    assert.matches("waits for RWLock \"routes\", held by " .. pat(coroutine.running()), text)
    assert.equal(2, #first_deadlock().info.cycle)
    assert.is_false(w.done)
    rd()
    h.wait_until(function() return w.done end)
    assert.is_true(w.ok)
    w.release()
  end))

  it("the same cycle through a KeyedRWLock key and a timed writer", h.left_free(am.KeyedRWLock.new, function(k)
    local rd = k:acquireRead("doc")
    local timed = am.withTimeout(k, 60000)    -- a timeout does not break it
    local w = h.acquirer(nil, "writer", timed, "doc")
    assert.is_false(w.done)
    assert.equal(am.E_DEADLOCK, select(2, pcall(k.acquireRead, k, "doc")))
    assert.equal(1, deadlocks())
    rd()
    h.wait_until(function() return w.done end)
    assert.is_true(w.ok)
    w.release()
  end))

  it("is not reported when the writer waits only for a reader outside the cycle", h.async(function()
    local rw, m = am.RWLock.new(), am.Mutex.new()
    local outside = h.spawn(function()
      local r = rw:acquireRead(); coroutine.yield(); r()
    end)
    local w = h.acquirer(nil, "writer", rw)  -- waits for the outside reader
    local t = {}
    t.co = h.spawn(function()
      local rm = m:acquire()                  -- holds something: the search runs
      local r = rw:acquireRead()              -- behind the writer
      r(); rm(); t.done = true
    end)
    local m_waiter = h.acquirer(nil, "m", m) -- waits for t
    assert.is_false(w.done)
    assert.is_nil(t.done)
    assert.equal(0, deadlocks())
    assert(coroutine.resume(outside))         -- the outside read ends
    h.wait_until(function() return w.done end)
    w.release()
    h.wait_until(function() return t.done and m_waiter.done end)
    m_waiter.release()
    assert.equal(0, deadlocks())
  end))

  it("is not reported for a holder's read of a higher priority than the queued writer (served first)", h.async(function()
    local rw = am.RWLock.new()
    local rd = rw:acquireRead()
    local w = h.acquirer(nil, "writer", rw, 1)
    local rd2 = rw:acquireRead(5)             -- above the writer: granted now
    assert.equal(0, deadlocks())
    rd2(); rd()
    h.wait_until(function() return w.done end)
    w.release()
  end))
end)

describe("Semaphore head-of-line blocking", function()
  it("a request behind a larger waiting one that needs the requester's units raises E_DEADLOCK", h.async(function()
    local s = am.debug.name(am.Semaphore.new(2), "pool")
    local _, r = s:acquire()
    local big = h.acquirer(nil, "big", s, 2)  -- needs the unit held here
    assert.is_false(big.done)
    assert.equal(1, s:getValue())             -- one unit free, but not first
    local ok, err = pcall(s.acquire, s, 1)
    assert.is_false(ok)
    assert.equal(am.E_DEADLOCK, err)
    assert.matches('requests Semaphore "pool", held by ' .. pat(coroutine.running()) .. ".-, queued behind "
                   .. pat(big.co), first_deadlock().text)
    r()
    h.wait_until(function() return big.done end)
    big.release()
  end))

  it("a waitForUnlock behind it raises E_DEADLOCK too", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    local big = h.acquirer(nil, "big", s, 2)
    assert.equal(am.E_DEADLOCK, select(2, pcall(s.waitForUnlock, s, 1)))
    r()
    h.wait_until(function() return big.done end)
    big.release()
  end))

  it("is not reported when a holder outside can let the larger request in", h.async(function()
    local s = am.Semaphore.new(3)
    local outside = h.acquirer(nil, "outside", s)   -- holds a unit
    local t = {}
    t.co = h.spawn(function()
      local _, r = s:acquire()                -- holds a unit
      coroutine.yield()
      local _, r2 = s:acquire(1)              -- behind big
      r2(); r(); t.done = true
    end)
    local big = h.acquirer(nil, "big", s, 2)  -- the free unit + the outside one
    assert.is_false(big.done)
    assert(coroutine.resume(t.co))            -- t waits behind big
    assert.is_nil(t.done)
    assert.equal(0, deadlocks())
    outside.release()
    h.wait_until(function() return big.done end)
    big.release()
    h.wait_until(function() return t.done end)
    assert.equal(0, deadlocks())
  end))

  it("is not reported when the holder's own request is above the larger one's priority and fits", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    local big = h.acquirer(nil, "big", s, 2, 1)
    local _, r2 = s:acquire(1, 5)             -- served before big: fits now
    assert.equal(0, deadlocks())
    r2(); r()
    h.wait_until(function() return big.done end)
    big.release()
  end))
end)

describe("priorities", function()
  it("a request of a lower priority than a blocked waiter waits behind it: E_DEADLOCK", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    local big = h.acquirer(nil, "big", s, 2, 5)
    assert.equal(am.E_DEADLOCK, select(2, pcall(s.acquire, s, 1, 1)))
    r()
    h.wait_until(function() return big.done end)
    big.release()
  end))

  it("a waitForUnlock of an equal priority is blocked; of a higher one, not", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    local big = h.acquirer(nil, "big", s, 2, 3)
    assert.equal(am.E_DEADLOCK, select(2, pcall(s.waitForUnlock, s, 1, 3)))
    assert.equal(1, deadlocks())
    s:waitForUnlock(1, 4)                     -- strictly above the head: resolves
    assert.equal(1, deadlocks())
    r()
    h.wait_until(function() return big.done end)
    big.release()
  end))

  it("a waiter ahead that is served after a release outside the cycle breaks it", h.async(function()
    -- t holds m and waits for a unit behind 'big' (priority 5), which waits
    -- for a unit an outside coroutine gives back; no cycle
    local s, m = am.Semaphore.new(2), am.Mutex.new()
    local outside = h.acquirer(nil, "outside", s, 2)
    local big = h.acquirer(nil, "big", s, 1, 5)
    local t = {}
    t.co = h.spawn(function()
      local rm = m:acquire()
      local _, r = s:acquire(1, 1)
      r(); rm(); t.done = true
    end)
    local m_waiter = h.acquirer(nil, "m", m)
    assert.equal(0, deadlocks())
    outside.release()
    h.wait_until(function() return big.done and t.done end)
    big.release()
    h.wait_until(function() return m_waiter.done end)
    m_waiter.release()
    assert.equal(0, deadlocks())
  end))
end)
