-- Debug mode: deadlocks caught as they close (docs/debug.md, Deadlocks).  A
-- request that would wait for ever raises am.E_DEADLOCK in the requester at
-- once, queues nothing, and the report names every member with its
-- traceback; a wait that only looks like a cycle (a holder outside it can
-- release enough, a timeout or a cancel broke it) is never reported.
local h = require "helpers"
local am = require "async_mutex"

local THIS = "spec/61%-debug%-deadlock_spec.lua"

local dr = require "debug_reports"

local rec = dr.recorder(before_each, after_each)

-- The deadlock reports (lockdep's are spec 62's), and the first of them.
local deadlocks, first_deadlock = rec.deadlocks, rec.first_deadlock

-- A coroutine that acquires `first`, signals, then requests `second` (the
-- arguments after it passed on), and records the outcome.
local function cross(first, second, ...)
  local t = { held = false }
  local args = table.pack(...)
  t.co = h.spawn(function()
    local a, b = first:acquire()
    local release_first = b or a
    t.held = true
    coroutine.yield()                         -- resumed by the test: go on
    local res = table.pack(pcall(second.acquire, second, table.unpack(args, 1, args.n)))
    t.ok, t.err = res[1], not res[1] and res[2] or nil
    if res[1] then
      local release = res[3] or res[2]
      release()
    end
    t.done = true
    release_first()
  end)
  return t
end

local function go(t) assert(coroutine.resume(t.co)) end

describe("self-deadlock", function()
  it("a Mutex taken twice by one coroutine raises E_DEADLOCK at once and queues nothing", h.async(function()
    local m = am.debug.name(am.Mutex.new(), "m")
    local r = m:acquire()
    local ok, err = pcall(m.acquire, m); local at = debug.getinfo(1, "l").currentline
    assert.is_false(ok)
    assert.equal(am.E_DEADLOCK, err)
    assert.equal(1, deadlocks())
    assert.is_true(m:isLocked())
    assert.matches("0 waiting", tostring(m))
    local text = first_deadlock().text
    assert.matches('requested Mutex "m" and would wait for ever', text)
    assert.matches(THIS .. ":" .. at .. ":", text)          -- the requester's traceback
    assert.equal(coroutine.running(), first_deadlock().info.requester)
    r()
    local r2 = m:acquire()                    -- the lock is as it was
    r2()
  end))

  it("a holder's waitForUnlock raises E_DEADLOCK", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    assert.equal(am.E_DEADLOCK, select(2, pcall(m.waitForUnlock, m)))
    r()
  end))

  it("a write requested while holding a read of the same RWLock, and a read while writing", h.left_free(am.RWLock.new, function(rw)
    local rd = rw:acquireRead()
    assert.equal(am.E_DEADLOCK, select(2, pcall(rw.acquireWrite, rw)))
    rd()
    local wr = rw:acquireWrite()
    assert.equal(am.E_DEADLOCK, select(2, pcall(rw.acquireRead, rw)))
    assert.equal(am.E_DEADLOCK, select(2, pcall(rw.acquireWrite, rw)))
    wr()
    assert.equal(3, deadlocks())
  end))

  it("a Semaphore holder asking for more than the others can ever give back", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    assert.equal(am.E_DEADLOCK, select(2, pcall(s.acquire, s, 2)))
    r()
  end))

  it("a timed request (withTimeout) raises E_DEADLOCK at once, not E_TIMEOUT later", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    local t = am.withTimeout(m, 60000)        -- waiting would pass the deadline
    assert.equal(am.E_DEADLOCK, select(2, pcall(t.acquire, t)))
    r()
  end))

  it("a key of a keyed lock taken twice", h.left_free(am.KeyedMutex.new, function(k)
    local r = k:acquire("x")
    assert.equal(am.E_DEADLOCK, select(2, pcall(k.acquire, k, "x")))
    assert.same({ 0, 0 }, { k:waiting("x") })
    r()
  end))

  it("a write of a KeyedRWLock key requested while holding a read of it", h.left_free(am.KeyedRWLock.new, function(k)
    local rd = k:acquireRead("doc")
    assert.equal(am.E_DEADLOCK, select(2, pcall(k.acquireWrite, k, "doc")))
    local other = k:acquireWrite("other")     -- another key: no deadlock
    other(); rd()
  end))

  it("a key refused leaves no lock behind in its set", h.left_free(am.KeyedSemaphore.new, 1, function(k)
    local _, r = k:acquire("x")
    assert.equal(am.E_DEADLOCK, select(2, pcall(k.waitForUnlock, k, "x")))
    r()
  end))
end)

describe("not a self-deadlock", function()
  it("a ReentrantMutex re-acquired by its holder", h.async(function()
    local m = am.ReentrantMutex.new()
    local r1 = m:acquire()
    local r2 = m:acquire()
    r2(); r1()
    assert.equal(0, deadlocks())
  end))

  it("a write requested again by its holder after rw:release() ended it and let a reader in", h.async(function()
    local rw = am.RWLock.new()
    rw:acquireWrite()
    local reader = h.requester("acquireRead", nil, "reader", rw)
    rw:release()                              -- ends the write: the reader reads
    h.tick()
    assert.is_true(reader.ok)
    h.spawn(function() h.sleep(5); reader.release() end)
    local ok, again = pcall(rw.acquireWrite, rw)   -- waits for the reader only
    assert.equal(0, deadlocks())
    assert.is_true(ok, again)
    again()
  end))

  it("tryAcquire never deadlocks: it refuses", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    local t = am.tryAcquire(m)
    assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(t.acquire, t)))
    r()
    assert.equal(0, deadlocks())
  end))

  it("a Semaphore holder asking for what another holder will give back", h.async(function()
    local s = am.Semaphore.new(2)
    local _, r = s:acquire()
    local other = h.acquirer(nil, "other", s)       -- holds the other unit
    local mine = h.spawn(function()
      local _, r2 = s:acquire()                   -- waits for other's unit
      r2()
    end)
    assert.equal("suspended", coroutine.status(mine))
    other.release()
    h.tick()
    assert.equal("dead", coroutine.status(mine))
    r()
    assert.equal(0, deadlocks())
  end))

  it("a lock held by a grant made before debug mode was on (unknown holder)", h.async(function()
    am.debug.disable()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local t1 = cross(a, b)
    rec.enable()
    local rb = b:acquire()
    go(t1)                                    -- t1 waits for b
    local t2 = h.spawn(function() local r = a:acquire(); r() end)   -- waits: unknown holder of a
    assert.equal("suspended", coroutine.status(t2))
    rb()
    h.wait_until(function() return t1.done and coroutine.status(t2) == "dead" end)
    assert.equal(0, deadlocks())
  end))
end)

describe("wait-for cycles", function()
  it("two coroutines, two Mutexes: the request that closes the cycle raises, the other proceeds", h.async(function()
    local a = am.debug.name(am.Mutex.new(), "a")
    local b = am.debug.name(am.Mutex.new(), "b")
    local t1, t2 = cross(a, b), cross(b, a)
    go(t1)                                    -- t1 holds a, waits for b
    assert.is_nil(t1.done)
    go(t2)                                    -- t2 holds b, requests a: closes it
    assert.is_true(t2.done)
    assert.is_false(t2.ok)
    assert.equal(am.E_DEADLOCK, t2.err)
    h.wait_until(function() return t1.done end)
    assert.is_true(t1.ok)                     -- b was released by t2
    assert.equal(1, deadlocks())
    local text = first_deadlock().text
    assert.matches("requests Mutex \"a\", held by " .. tostring(t1.co):gsub("%p", "%%%0"), text)
    assert.matches("waits for Mutex \"b\", held by " .. tostring(t2.co):gsub("%p", "%%%0"), text)
    assert.equal(2, #first_deadlock().info.cycle)
    for _, m in ipairs(first_deadlock().info.cycle) do
      assert.matches(THIS .. ":%d+:", m.traceback)
    end
    assert.is_false(a:isLocked() or b:isLocked())
  end))

  it("three coroutines across a Mutex, a Semaphore and a keyed lock", h.async(function()
    local m = am.Mutex.new()
    local s = am.Semaphore.new(1)
    local k = am.KeyedMutex.new()
    -- t1: m then s; t2: s then key x; t3: key x then m
    local t1 = cross(m, s)
    local t2 = h.spawn(function()
      local _, rs = s:acquire()
      coroutine.yield()
      local ok, err = pcall(k.acquire, k, "x")
      if ok then err() end
      rs()
    end)
    local t3 = { }
    t3.co = h.spawn(function()
      local rk = k:acquire("x")
      coroutine.yield()
      local ok, err = pcall(m.acquire, m)
      t3.ok, t3.err = ok, err
      if ok then err() end
      rk()
    end)
    go(t1)                                    -- t1 waits for s (t2)
    assert(coroutine.resume(t2))              -- t2 waits for x (t3)
    assert(coroutine.resume(t3.co))           -- t3 requests m (t1): closes it
    assert.is_false(t3.ok)
    assert.equal(am.E_DEADLOCK, t3.err)
    assert.equal(3, #first_deadlock().info.cycle)
    assert.matches("KeyedMutex created at " .. THIS .. ":%d+ key x", first_deadlock().text)
    h.wait_until(function() return t1.done and coroutine.status(t2) == "dead" end)
    assert.is_false(m:isLocked() or s:isLocked())
    assert.equal(0, k:count())
  end))

  it("two keys of one keyed lock", h.async(function()
    local k = am.KeyedMutex.new()
    local t1 = { }
    t1.co = h.spawn(function()
      local r1 = k:acquire(1); coroutine.yield()
      local r2 = k:acquire(2); r2(); r1()
      t1.done = true
    end)
    local t2 = { }
    t2.co = h.spawn(function()
      local r2 = k:acquire(2); coroutine.yield()
      t2.ok, t2.err = pcall(k.acquire, k, 1)
      r2()
    end)
    go(t1); go(t2)
    assert.is_false(t2.ok)
    assert.equal(am.E_DEADLOCK, t2.err)
    h.wait_until(function() return t1.done end)
  end))

  it("a KeyedRWLock read in the cycle: a write waits for a reader that waits for the writer", h.async(function()
    local k = am.KeyedRWLock.new()
    local m = am.Mutex.new()
    local t1 = { }
    t1.co = h.spawn(function()
      local rd = k:acquireRead("doc"); coroutine.yield()
      local r = m:acquire(); r(); rd()
      t1.done = true
    end)
    local t2 = { }
    t2.co = h.spawn(function()
      local r = m:acquire(); coroutine.yield()
      t2.ok, t2.err = pcall(k.acquireWrite, k, "doc")
      r()
    end)
    go(t1); go(t2)
    assert.equal(am.E_DEADLOCK, t2.err)
    assert.matches("KeyedRWLock created at " .. THIS .. ":%d+ key doc", first_deadlock().text)
    h.wait_until(function() return t1.done end)
  end))

  it("through a member waiting with a timeout: timed waits count as waits", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local t1 = cross(a, am.withTimeout(b, 5000))
    local t2 = cross(b, a)
    go(t1); go(t2)
    assert.equal(am.E_DEADLOCK, t2.err)
    h.wait_until(function() return t1.done end)
    assert.is_true(t1.ok)
  end))

  it("a shared hold in the cycle: a write waits for a reader that waits for the writer", h.async(function()
    local rw, m = am.RWLock.new(), am.Mutex.new()
    local t1 = { }
    t1.co = h.spawn(function()
      local rd = rw:acquireRead(); coroutine.yield()
      local r = m:acquire(); r(); rd()
      t1.done = true
    end)
    local t2 = { }
    t2.co = h.spawn(function()
      local r = m:acquire(); coroutine.yield()
      t2.ok, t2.err = pcall(rw.acquireWrite, rw)
      r()
    end)
    go(t1); go(t2)
    assert.equal(am.E_DEADLOCK, t2.err)
    h.wait_until(function() return t1.done end)
  end))
end)

describe("no cycle", function()
  it("a Semaphore cycle resolved by a holder outside it is not reported", h.async(function()
    local s = am.Semaphore.new(2)
    local m = am.Mutex.new()
    local t1 = cross(s, m)                    -- t1 holds one unit, will wait for m
    local outside = h.acquirer(nil, "outside", s)   -- holds the other unit
    local t2 = cross(m, s)                    -- t2 holds m, will want a unit
    go(t1)
    go(t2)                                    -- waits: outside can give a unit back
    assert.is_nil(t2.done)
    assert.equal(0, deadlocks())
    outside.release()
    h.wait_until(function() return t1.done and t2.done end)
    assert.is_true(t1.ok and t2.ok)
    assert.equal(0, deadlocks())
  end))

  it("a KeyedSemaphore cycle resolved by a holder outside it is not reported", h.async(function()
    local k = am.KeyedSemaphore.new(2)
    local m = am.Mutex.new()
    local t1 = { }
    t1.co = h.spawn(function()
      local _, r = k:acquire("pool"); coroutine.yield()
      local rm = m:acquire(); rm(); r()
      t1.done = true
    end)
    local _, outside = k:acquire("pool")      -- the other unit, held here
    local t2 = { }
    t2.co = h.spawn(function()
      local rm = m:acquire(); coroutine.yield()
      local _, r = k:acquire("pool"); r(); rm()
      t2.done = true
    end)
    go(t1); go(t2)                            -- t2 waits: a unit can come back
    assert.is_nil(t2.done)
    outside()
    h.wait_until(function() return t1.done and t2.done end)
    assert.equal(0, deadlocks())
  end))

  it("a chain that ends at a holder who is not waiting", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local rb = b:acquire()                    -- held by this coroutine, running
    local t1 = cross(a, b)
    go(t1)                                    -- t1: holds a, waits for b
    local t3 = h.spawn(function() local r = a:acquire(); r() end)
    assert.equal("suspended", coroutine.status(t3))
    rb()
    h.wait_until(function() return t1.done and coroutine.status(t3) == "dead" end)
    assert.equal(0, deadlocks())
  end))

  it("a cycle broken by a timeout before it could close", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local t2 = cross(b, a)                    -- t2 holds b
    local t1 = { }
    t1.co = h.spawn(function()
      local ra = a:acquire()
      t1.ok, t1.err = pcall(function() am.withTimeout(b, 5):acquire() end)
      coroutine.yield()                       -- holds a, waits for nothing
      ra()
    end)
    h.wait_until(function() return t1.err ~= nil end)
    assert.equal(am.E_TIMEOUT, t1.err)
    go(t2)                                    -- t2 holds b, waits for a: no cycle
    assert.is_nil(t2.done)
    assert(coroutine.resume(t1.co))           -- t1 releases a
    h.wait_until(function() return t2.done end)
    assert.is_true(t2.ok)
    assert.equal(0, deadlocks())
  end))

  it("a cycle broken by a cancel before it could close", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local rb = b:acquire()
    local t1 = cross(a, b)
    go(t1)                                    -- t1 holds a, waits for b
    b:cancel()
    h.tick()
    assert.equal(am.E_CANCELED, t1.err)
    local t2 = h.spawn(function() local r = a:acquire(); r() end)
    h.wait_until(function() return coroutine.status(t2) == "dead" end)
    rb()
    assert.equal(0, deadlocks())
  end))

  it("a waiter closed with coroutine.close is no longer in the graph", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local rb = b:acquire()
    local t1 = h.spawn(function()
      local _ = a:acquire()                   -- not to-be-closed: stays held
      local r = b:acquire(); r()
    end)
    coroutine.close(t1)                       -- t1 dead, still holding a
    local t2 = h.spawn(function()
      local r = a:acquire(); r()
    end)
    assert.equal("suspended", coroutine.status(t2))  -- waits for a dead holder: no cycle
    assert.equal(0, deadlocks())
    a:release()
    h.wait_until(function() return coroutine.status(t2) == "dead" end)
    rb()
  end))
end)
