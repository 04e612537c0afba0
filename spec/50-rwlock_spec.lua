-- RWLock: shared reads, exclusive writes, one queue in priority-then-arrival
-- order granted from its head (docs/lockkinds.md, RWLock).  Every rule of
-- the Mutex holds: deferred wake-ups, no
-- barging, cancel, waitForUnlock, releasers, withTimeout, tryAcquire.
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

local no_more_pending = h.pending_baseline(before_each)

local reader, writer = h.reader, h.writer

-- Holds the lock `hold` times from main code: a function releasing it.
local function held_read(rw)
  local co = coroutine.create(function()
    local r = rw:acquireRead()
    coroutine.yield()
    r()
  end)
  assert(coroutine.resume(co))
  return function() assert(coroutine.resume(co)) end
end

describe("RWLock.new", function()
  it("creates an unlocked lock with no readers", function()
    local rw = am.RWLock.new()
    assert.is_false(rw:isLocked())
    assert.is_false(rw:isWriteLocked())
    assert.equal(0, rw:readers())
    assert.matches("^async_mutex.RWLock %(0 readers, 0 waiting%)", tostring(rw))
  end)

  it("accepts a custom cancel error", h.async(function()
    local err = {}
    local rw = am.RWLock.new(err)
    local w = rw:acquireWrite()
    local a = reader(nil, "a", rw)
    rw:cancel()
    h.tick()
    assert.equal(err, a.err)
    w()
  end))
end)

describe("RWLock:acquireRead", function()
  it("is granted at once, without yielding, while no writer holds or waits", h.left_free(am.RWLock.new, function(rw)
    local rs = h.granted_at_once(5, function() return rw:acquireRead() end)
    assert.equal(5, rw:readers())
    assert.is_true(rw:isLocked())
    assert.is_false(rw:isWriteLocked())
    assert.matches("%(5 readers, 0 waiting%)", tostring(rw))
    for i = 1, 5 do rs[i]() end
    assert.equal(0, rw:readers())
  end))

  it("waits while a writer holds the lock, then all readers enter together", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    local rs = {}
    for i = 1, 10 do rs[i] = reader(nil, i, rw) end
    h.tick(2)
    for i = 1, 10 do assert.is_false(rs[i].done) end
    w()
    assert.equal(10, rw:readers())             -- granted in the release itself
    for i = 1, 10 do assert.is_false(rs[i].done) end   -- woken from the loop
    h.tick()
    for i = 1, 10 do assert.is_true(rs[i].ok) end
    for i = 1, 10 do rs[i].release() end
    assert.is_false(rw:isLocked())
  end))

  it("queues behind a waiting writer even while readers hold the lock (no starving writers)", h.async(function()
    local log = {}
    local rw = am.RWLock.new()
    local release_read = held_read(rw)
    local w = writer(log, "w", rw)
    local r = reader(log, "r", rw)
    h.tick(2)
    assert.same({}, log)
    assert.equal(1, rw:readers())
    release_read()
    h.granted_in_turn(log, w, r)
  end))

  it("is refused by tryAcquire when a writer waits, even while readers hold it", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local try = am.tryAcquire(rw)
    local r2 = try:acquireRead()                -- no writer waits: shared
    assert.equal(2, rw:readers())
    local w = writer(nil, "w", rw)
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquireRead, try) })
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquireWrite, try) })
    r(); r2()
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))
end)

describe("RWLock:acquireWrite", function()
  it("is exclusive: no reader and no other writer while it holds", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    assert.is_true(rw:isWriteLocked())
    assert.equal(0, rw:readers())
    assert.matches("%(write%-locked, 0 waiting%)", tostring(rw))
    local w2 = writer(nil, "w2", rw)
    local r = reader(nil, "r", rw)
    h.tick(3)
    assert.is_false(w2.done)
    assert.is_false(r.done)
    assert.matches("%(write%-locked, 2 waiting%)", tostring(rw))
    w()
    h.served_in_turn(w2, r)
  end))

  it("waits for every reader to leave", h.async(function()
    local rw = am.RWLock.new()
    local r1, r2 = rw:acquireRead(), rw:acquireRead()
    local w = writer(nil, "w", rw)
    r1()
    h.tick()
    assert.is_false(w.done)
    r2()
    h.tick()
    assert.is_true(w.ok)
    assert.is_true(rw:isWriteLocked())
    w.release()
  end))

  it("acquire is acquireWrite, so an RWLock stands where a Mutex is expected", h.async(function()
    local rw, w = h.held(am.RWLock.new())
    assert.is_true(rw:isWriteLocked())
    local a = h.acquirer(nil, "a", rw)          -- the Mutex helpers work as is
    h.check_one_owner(rw, { done = true, release = w }, a)
  end))
end)

describe("RWLock queue discipline", function()
  it("grants in arrival order: consecutive readers together, a writer alone", h.async(function()
    local log = {}
    local rw, w0 = h.held(am.RWLock.new(), "acquireWrite")
    local q = {
      reader(log, "r1", rw), reader(log, "r2", rw), writer(log, "w1", rw),
      reader(log, "r3", rw), writer(log, "w2", rw), reader(log, "r4", rw),
      reader(log, "r5", rw),
    }
    w0()
    h.tick()
    assert.same({ "r1", "r2" }, log)
    q[1].release()
    h.tick()
    assert.same({ "r1", "r2" }, log)            -- w1 waits for r2 too
    q[2].release()
    h.tick()
    assert.same({ "r1", "r2", "w1" }, log)
    q[3].release()
    h.tick()
    assert.same({ "r1", "r2", "w1", "r3" }, log)
    q[4].release()
    h.tick()
    assert.same({ "r1", "r2", "w1", "r3", "w2" }, log)
    q[5].release()
    h.tick()
    assert.same({ "r1", "r2", "w1", "r3", "w2", "r4", "r5" }, log)
    q[6].release(); q[7].release()
    assert.is_false(rw:isLocked())
  end))

  it("orders by priority first: a higher reader passes queued writers, a higher writer passes readers", h.async(function()
    local log = {}
    local rw, w0 = h.held(am.RWLock.new(), "acquireWrite")
    local lo_w = writer(log, "lo_w", rw, 0)
    local hi_r = reader(log, "hi_r", rw, 5)
    local mid_r = reader(log, "mid_r", rw, 1)
    local hi_w = writer(log, "hi_w", rw, 9)
    w0()
    h.tick()
    assert.same({ "hi_w" }, log)
    hi_w.release()
    h.tick()
    assert.same({ "hi_w", "hi_r", "mid_r" }, log)   -- the readers at the head together
    hi_r.release(); mid_r.release()
    h.tick()
    assert.same({ "hi_w", "hi_r", "mid_r", "lo_w" }, log)
    lo_w.release()
  end))

  it("lets a reader of higher priority than every waiting writer share at once", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local w = writer(nil, "w", rw, 1)
    local completed, res = h.without_yield(function() return rw:acquireRead(2) end)
    assert.is_true(completed)
    assert.equal(2, rw:readers())
    local completed2 = h.without_yield(function()
      local x = rw:acquireRead(1)              -- equal priority: behind the writer
      x()
    end)
    assert.is_false(completed2)
    r(); res[1]()
    h.tick()
    assert.is_true(w.ok)
    w.release()
    h.tick()
  end))

  it("defers every wake-up to the loop: a release resumes nobody synchronously", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local w = writer(nil, "w", rw)
    r()
    assert.is_true(rw:isWriteLocked())          -- granted, not yet resumed
    assert.is_false(w.done)
    -- nobody barges in while the grant waits for the loop
    local barged = h.without_yield(function() rw:acquireRead()() end)
    assert.is_false(barged)
    h.tick()
    assert.is_true(w.ok)
    w.release()
    h.tick()
  end))

  it("bounds the waiting of both under a steady stream of readers and writers", h.async(function()
    -- Readers keep arriving while others hold: a writer still gets in as
    -- soon as the readers ahead of it leave, and the readers behind it get
    -- in as soon as it leaves.  Every request is granted within the
    -- requests ahead of it at its arrival.
    local rw = am.RWLock.new()
    local order = {}
    local ahead = {}                 -- name -> requests queued when it arrived
    local inside = h.occupancy()
    local writers_inside = h.occupancy(1)
    local n, finished = 0, 0
    local function one(kind, i)
      n = n + 1
      local name = kind .. i
      h.spawn(function()
        local release = kind == "w" and rw:acquireWrite() or rw:acquireRead()
        order[#order + 1] = name
        if kind == "w" then
          writers_inside:enter()
          assert(inside:now() == 0, "a writer entered while readers hold")
        end
        inside:enter()
        h.tick()
        inside:leave()
        if kind == "w" then writers_inside:leave() end
        release()
        finished = finished + 1
      end)
      ahead[name] = n
    end
    for i = 1, 60 do
      one(i % 6 == 0 and "w" or "r", i)
      if i % 3 == 0 then h.tick() end
    end
    h.wait_until(function() return finished == n end)
    -- bounded: granted no later than the position it arrived at
    for pos, name in ipairs(order) do
      assert(pos <= ahead[name], name .. " was passed by a later request")
    end
    assert.is_true(inside:most() > 1)          -- readers did share
    assert.equal(1, writers_inside:most())
    assert.is_false(rw:isLocked())
  end))
end)

describe("RWLock:waitForUnlock", function()
  it("returns once no reader and no writer holds the lock, without acquiring", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local u = h.waiter(nil, "u", rw)
    h.tick()
    assert.is_false(u.done)
    r()
    h.tick()
    assert.is_true(u.ok)
    assert.is_false(u.locked_then)
    assert.is_false(rw:isLocked())
  end))

  it("returns at once when the lock is free, and waits behind queued acquirers of its priority", h.async(function()
    local rw = am.RWLock.new()
    assert.is_true((h.without_yield(function() rw:waitForUnlock() end)))
    local w = rw:acquireWrite()
    local log = {}
    local a = reader(log, "a", rw)
    local u = h.waiter(log, "u", rw)
    w()
    h.tick()
    assert.same({ "a" }, log)
    a.release()
    h.tick()
    assert.same({ "a", "u" }, log)
    assert.is_true(u.ok)
  end))
end)

describe("RWLock:cancel", function()
  it("rejects every queued reader and writer with am.E_CANCELED; holders keep the lock", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local w = writer(nil, "w", rw)
    local r2 = reader(nil, "r2", rw)
    rw:cancel()
    h.tick()
    assert.same({ false, am.E_CANCELED }, { w.ok, w.err })
    assert.same({ false, am.E_CANCELED }, { r2.ok, r2.err })
    assert.equal(1, rw:readers())
    r()
    assert.is_false(rw:isLocked())
  end))
end)

describe("RWLock:release", function()
  it("ends the write hold, like Mutex:release(); the writer's releaser is then a no-op", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    rw:release()
    assert.is_false(rw:isLocked())
    local w2 = rw:acquireWrite()
    w()                                         -- not w2's grant
    assert.is_true(rw:isWriteLocked())
    w2()
    assert.is_false(rw:isLocked())
  end))

  it("ends the write hold its releaser shows: tostring says released; readers stay held", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    rw:release()
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(w))
    w = rw:acquireWrite()
    local queued = h.requester("acquireRead", nil, "reader", rw)
    rw:release()                                -- the queued reader gets it
    assert.is_true(rw:isLocked())
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(w))
    assert.is_false(w:check())
    h.tick()
    queued.release()
    local r = rw:acquireRead()
    rw:release()                                -- no write hold: nothing ends
    assert.matches("^async_mutex%.Releaser %(held%)", tostring(r))
    r()
    local s = am.Semaphore.new(1)
    local _, rs = s:acquire()
    s:release()                                 -- a semaphore's holds have no owner
    assert.matches("^async_mutex%.Releaser %(held%)", tostring(rs))
    rs()
  end))

  it("does nothing while readers hold the lock or nobody does", h.left_free(am.RWLock.new, function(rw)
    rw:release()
    assert.is_false(rw:isLocked())
    local r = rw:acquireRead()
    rw:release()
    assert.equal(1, rw:readers())
    r()
  end))
end)

describe("RWLock releasers", function()
  it("release once; later calls are ignored", h.async(function()
    local rw = am.RWLock.new()
    local r1, r2 = rw:acquireRead(), rw:acquireRead()
    r1(); r1(); r1()
    assert.equal(1, rw:readers())
    r2()
    assert.equal(0, rw:readers())
  end))

  it("release on scope exit as <close> variables", h.left_free(am.RWLock.new, function(rw)
    do
      local _ <close> = rw:acquireRead()
      local _ <close> = rw:acquireRead()
      assert.equal(2, rw:readers())
    end
    assert.is_false(rw:isLocked())
    do
      local _ <close> = rw:acquireWrite()
      assert.is_true(rw:isWriteLocked())
    end
  end))

  it("a queued writer whose coroutine is closed leaves the queue, letting the readers behind it in", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local w = writer(nil, "w", rw)
    local r2 = reader(nil, "r2", rw)
    h.tick()
    assert.is_false(r2.done)
    assert.is_true(coroutine.close(w.co))
    assert.equal(2, rw:readers())               -- r2 granted at once
    h.tick()
    assert.is_true(r2.ok)
    r(); r2.release()
    assert.is_false(rw:isLocked())
    no_more_pending()
  end))

  it("refuse to upgrade a read hold, saying why", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    assert.equal("attempt to upgrade a read hold: not offered (two upgraders would deadlock); "
      .. "release it, then acquireWrite", E(function() r:upgrade() end))
    assert.equal(1, rw:readers())
    r()
  end))
end)

describe("write releaser:downgrade", function()
  it("turns the write hold into a read hold atomically and returns its releaser", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    local r = w:downgrade()
    assert.is_false(rw:isWriteLocked())
    assert.equal(1, rw:readers())
    w()                                         -- spent: a no-op
    assert.equal(1, rw:readers())
    r()
    assert.is_false(rw:isLocked())
  end))

  it("lets the readers at the head of the queue in, not the writers", h.async(function()
    local log = {}
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    local a = reader(log, "a", rw)
    local b = reader(log, "b", rw)
    local w2 = writer(log, "w2", rw)
    local c = reader(log, "c", rw)
    local r = w:downgrade()
    assert.equal(3, rw:readers())
    h.tick()
    assert.same({ "a", "b" }, log)
    r(); a.release(); b.release()
    h.tick()
    assert.same({ "a", "b", "w2" }, log)
    w2.release()
    h.tick()
    c.release()
    assert.is_false(rw:isLocked())
  end))

  it("raises for a read releaser, another lock's releaser, or a write hold that ended", h.left_free(am.RWLock.new, function(rw)
    local NOT = "attempt to downgrade a releaser that is not a readers-writer lock's write hold"
    local ENDED = "attempt to downgrade a write hold that has ended"
    local r = rw:acquireRead()
    assert.equal(NOT, E(function() r:downgrade() end))
    r()
    local m = am.Mutex.new():acquire()
    assert.equal(NOT, E(function() m:downgrade() end))
    local w = rw:acquireWrite()
    w()
    assert.equal(ENDED, E(function() w:downgrade() end))
    local w2 = rw:acquireWrite()
    rw:release()
    assert.equal(ENDED, E(function() w2:downgrade() end))
    local w3 = rw:acquireWrite()
    local r3 = w3:downgrade()
    assert.equal(ENDED, E(function() w3:downgrade() end))
    r3()
  end))
end)

describe("RWLock runShared and runExclusive", function()
  it("runShared runs fn holding a read hold and returns its results", h.left_free(am.RWLock.new, function(rw)
    assert.same({ 1, 2 }, { rw:runShared(function()
      assert.equal(1, rw:readers())
      return 1, 2
    end) })
  end))

  it("runShared lets readers overlap, runExclusive does not", h.left_free(am.RWLock.new, function(rw)
    local inside = h.occupancy()
    local writers = h.occupancy(1)
    local done = 0
    for i = 1, 10 do
      h.spawn(function()
        if i % 3 == 0 then
          rw:runExclusive(function()
            writers:enter(); inside:enter()
            assert(inside:now() == 1, "a writer shared the lock")
            h.tick()
            inside:leave(); writers:leave()
          end)
        else
          rw:runShared(function() inside:enter(); h.tick(); inside:leave() end)
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 10 end)
    assert.is_true(inside:most() > 1)
  end))

  it("release when fn raises and re-raise the error unchanged", h.left_free(am.RWLock.new, function(rw)
    local err = {}
    assert.same({ false, err }, { pcall(rw.runShared, rw, function() error(err) end) })
    assert.same({ false, err }, { pcall(rw.runExclusive, rw, function() error(err) end) })
  end))

  it("take a priority", h.async(function()
    local log = {}
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    h.spawn(function() rw:runShared(function() log[#log + 1] = "lo" end, 1) end)
    h.spawn(function() rw:runExclusive(function() log[#log + 1] = "hi" end, 2) end)
    w()
    h.wait_until(function() return #log == 2 end)
    assert.same({ "hi", "lo" }, log)
  end))
end)

describe("RWLock with withTimeout and tryAcquire", function()
  it("withTimeout bounds reads and writes with the exact error", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    local t = am.withTimeout(rw, 5)
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquireRead, t) })
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquireWrite, t) })
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquire, t) })
    assert.same({ false, "late" }, { pcall(am.withTimeout(rw, 5, "late").waitForUnlock,
      am.withTimeout(rw, 5, "late")) })
    w()
    assert.is_false(rw:isLocked())
    no_more_pending()
  end))

  it("a writer timing out lets the readers queued behind it share with the holders", h.async(function()
    local rw, r = h.held(am.RWLock.new(), "acquireRead")
    local t = am.withTimeout(rw, 10)
    local w = h.writer(nil, "w", t)
    local r2 = reader(nil, "r2", rw)
    h.wait_until(function() return w.done end)
    assert.equal(am.E_TIMEOUT, w.err)
    h.tick()
    assert.is_true(r2.ok)
    assert.equal(2, rw:readers())
    r(); r2.release()
  end))

  it("decorated locks keep the other methods and the Mutex-like ones", h.async(function()
    local rw = am.RWLock.new()
    local t = am.withTimeout(rw, 100)
    local r = t:acquireRead()
    assert.equal(1, t:readers())
    assert.is_true(t:isLocked())
    assert.is_false(t:isWriteLocked())
    assert.same({ 7 }, { t:runShared(function() return 7 end) })
    r()
    assert.same({ 8 }, { t:runExclusive(function() return 8 end) })
    local try = am.tryAcquire(rw, "busy")
    local w = try:acquireWrite()
    assert.same({ false, "busy" }, { pcall(try.acquireRead, try) })
    w()
  end))
end)

describe("RWLock bad input", function()
  it("rejects a non-number or NaN priority naming the method and argument", h.async(function()
    local rw = am.RWLock.new()
    assert.equal("bad argument #1 to 'acquireRead' (priority must be a number, got table)",
      E(function() rw:acquireRead({}) end))
    assert.equal("bad argument #1 to 'acquireWrite' (priority must be a number, got string)",
      E(function() rw:acquireWrite("x") end))
    assert.equal("bad argument #1 to 'acquire' (priority must not be NaN)",
      E(function() rw:acquire(0 / 0) end))
    assert.equal("bad argument #1 to 'waitForUnlock' (priority must be a number, got boolean)",
      E(function() rw:waitForUnlock(true) end))
    assert.equal("bad argument #2 to 'runShared' (priority must be a number, got table)",
      E(function() rw:runShared(function() end, {}) end))
    assert.equal("bad argument #2 to 'runExclusive' (priority must be a number, got table)",
      E(function() rw:runExclusive(function() end, {}) end))
    local t = am.withTimeout(rw, 10)
    assert.equal("bad argument #1 to 'acquireRead' (priority must be a number, got table)",
      E(function() t:acquireRead({}) end))
    assert.is_false(rw:isLocked())
    no_more_pending()
  end))

  it("rejects a function argument that is not callable", h.left_free(am.RWLock.new, function(rw)
    assert.equal("bad argument #1 to 'runShared' (function expected, got nil)",
      E(function() rw:runShared() end))
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got number)",
      E(function() rw:runExclusive(1) end))
  end))

  it("rejects a self that is not an RWLock", h.async(function()
    local rw = am.RWLock.new()
    local m = am.Mutex.new()
    assert.equal("bad argument #1 to 'acquireRead' (async_mutex.RWLock expected, got async_mutex.Mutex)",
      E(function() rw.acquireRead(m) end))
    assert.equal("bad argument #1 to 'readers' (async_mutex.RWLock expected, got no value)",
      E(function() rw.readers() end))
    assert.equal("bad argument #1 to 'runShared' (async_mutex.RWLock expected, got table)",
      E(function() rw.runShared({}, function() end) end))
  end))

  it("refuses to wait outside a coroutine, changing nothing", function()
    local rw = am.RWLock.new()
    local w = h.holder(rw)
    assert.equal("attempt to acquire a readers-writer lock outside a coroutine",
      E(function() rw:acquireRead() end))
    assert.equal("attempt to wait for a readers-writer lock outside a coroutine",
      E(function() rw:waitForUnlock() end))
    w()
    assert.is_false(rw:isLocked())
    no_more_pending()
  end)

  it("reports bad-input errors at the caller's line", h.async(function()
    local rw = am.RWLock.new()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() rw:acquireRead({}) end)
    assert.is_false(ok)
    assert.matches(":" .. line .. ": bad argument #1 to 'acquireRead'", err)
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() rw:runShared(function() end, {}) end)
    assert.matches(":" .. line .. ": bad argument #2 to 'runShared'", err)
  end))
end)
