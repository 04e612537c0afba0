-- lock:steal() (docs/semantics.md, Steal): granted at once, every hold in
-- place ends lost as a lease's end makes it (docs/semantics.md, Leases and
-- lost holds), the queue is left in its order.
local h = require "helpers"
local am = require "async_mutex"

after_each(function() am.debug.disable() end)

-- The outcome of releaser:check(): true/false, or the error it raised.
local function check(release)
  local ok, res = pcall(release.check, release)
  if ok then return res end
  return "raised: " .. tostring(res)
end

local LOST = "raised: " .. am.E_LOST

describe("mutex:steal", function()
  it("is granted at once on a free mutex", h.left_free(am.Mutex.new, function(m)
    local release = m:steal()
    assert.is_true(m:isLocked())
    assert.is_true(release())
  end))

  it("works outside a coroutine", function()
    local m = am.Mutex.new()
    local release = m:steal()
    assert.is_true(m:isLocked())
    assert.is_true(release())
  end)

  it("ends the hold in place as lost: releaser false, check raises E_LOST, tostring lost", h.async(function()
    local m, old = h.held(am.Mutex.new())
    local new = m:steal()
    assert.equal(LOST, check(old))
    assert.matches("^async_mutex%.Releaser %(lost%)", tostring(old))
    assert.matches("^async_mutex%.Releaser %(held%)", tostring(new))
    assert.is_false(old())                       -- gives back nothing
    assert.is_true(m:isLocked())                 -- the stealer still holds it
    assert.equal(LOST, check(old))               -- stays lost
    assert.is_false(old())
    assert.is_true(check(new))
    assert.is_true(new())
    assert.is_false(m:isLocked())
  end))

  it("a stolen hold's <close> releaser runs harmlessly", h.async(function()
    local m = am.Mutex.new()
    local new
    do
      local old <close> = m:acquire()
      new = m:steal()
    end
    assert.is_true(m:isLocked())
    assert.is_true(new())
  end))

  it("leaves the queue as it was: queued requests are served after the stealer, in order", h.async(function()
    local m, log = am.Mutex.new(), {}
    local old = m:acquire()
    local a = h.chain(log, "a", m)
    local b = h.chain(log, "b", m, 5)
    local release = m:steal(100)
    h.tick(3)
    assert.same({}, log)                         -- nobody got in past the stealer
    assert.equal(2, #am.query(m).pending)
    release()
    h.wait_until(function() return a.done and b.done end)
    assert.same({ "b", "a" }, log)               -- priority order, as queued
    assert.is_false(old())
  end))

  it("makes runExclusive raise E_LOST when its function returns", h.async(function()
    local m = am.Mutex.new()
    local r = { }
    r.co = h.spawn(function()
      r.ok, r.err = pcall(m.runExclusive, m, function()
        coroutine.yield()
        return "computed without the lock"
      end)
    end)
    local release = m:steal()
    coroutine.resume(r.co)
    assert.is_false(r.ok)
    assert.equal(am.E_LOST, r.err)
    assert.is_true(m:isLocked())                 -- its release gave nothing back
    release()
  end))

  it("ends a grant not yet delivered: that acquire raises E_LOST", h.async(function()
    local base = am.pending()
    local m, holder = h.held(am.Mutex.new())
    local w = h.acquirer(nil, "w", m)
    holder()                                     -- granted to w, not delivered
    local release = m:steal()
    h.wait_until(function() return w.done end)
    assert.is_false(w.ok)
    assert.equal(am.E_LOST, w.err)
    assert.is_true(m:isLocked())
    release()
    assert.is_false(m:isLocked())
    assert.equal(base, am.pending())
  end))

  it("does not call runExclusive's function for a grant not yet delivered", h.async(function()
    local m, holder = h.held(am.Mutex.new())
    local r = {}
    h.spawn(function()
      r.ok, r.err = pcall(m.runExclusive, m, function() r.ran = true end)
    end)
    holder()
    local release = m:steal()
    h.wait_until(function() return r.ok ~= nil end)
    assert.is_nil(r.ran)
    assert.equal(am.E_LOST, r.err)
    release()
  end))

  it("does not make lost a hold that an unscoped release ended before", h.async(function()
    local m, old = h.held(am.Mutex.new())
    m:release()                                  -- ends old: given back
    local mid = m:acquire()
    local new = m:steal()
    assert.is_false(check(old))
    assert.matches("%(released%)", tostring(old))
    assert.equal(LOST, check(mid))
    assert.is_false(old()); assert.is_false(mid())
    assert.is_true(new())
  end))

  -- A grant settled for a queued request and ended by an unscoped release
  -- before its delivery is not the hold in place: the later grant, taken
  -- at once, is, and the steal must end it (its releaser asks later).
  for _, kind in ipairs({ "Mutex", "RWLock" }) do
    it(kind .. ": ends the hold taken after an undelivered grant an unscoped release ended", h.async(function()
      local lock = am[kind].new()
      local take = kind == "Mutex" and "acquire" or "acquireWrite"
      local first = lock[take](lock)
      local w = h.requester(take, nil, "w", lock)
      lock:release()                             -- ends first: w granted, not delivered
      lock:release()                             -- ends w's grant before its delivery
      local mid = lock[take](lock)               -- free: taken at once, delivered
      local new = lock:steal()
      assert.equal(LOST, check(mid))
      assert.is_false(mid())
      h.wait_until(function() return w.done end)
      assert.equal(am.E_LOST, w.err)
      assert.is_true(lock:isLocked())
      assert.is_true(new())
      assert.is_false(lock:isLocked())
      assert.is_false(first())
    end))
  end

  it("keeps every stolen hold lost through later steals (last caller wins)", h.async(function()
    local m, first = h.held(am.Mutex.new())
    local second = m:steal()
    local third = m:steal()
    assert.is_true(third())
    local fourth = m:acquire()
    local fifth = m:steal()
    assert.equal(LOST, check(first))
    assert.equal(LOST, check(second))
    assert.is_false(check(third))                -- released by its own call
    assert.equal(LOST, check(fourth))
    assert.is_true(fifth())
  end))

  it("gives back nothing for a stolen hold whose releaser is called after the stealer released", h.async(function()
    local m, old = h.held(am.Mutex.new())
    m:steal()()                                  -- steal, then release
    local later = m:acquire()
    assert.is_false(old())                       -- not the later holder's
    assert.is_true(m:isLocked())
    assert.is_true(later())
  end))

  it("ends a leased hold, which reports its own lost error", h.async(function()
    local m = am.Mutex.new()
    local leased = am.withLease(m, 1000, "my lease"):acquire()
    local release = m:steal()
    assert.equal("raised: my lease", check(leased))
    assert.is_false(leased())
    release()
    h.tick(2)
    assert.same({}, h.active_handles())          -- its lease's timer ended
  end))

  it("ends a leased hold whose lease then runs out: lost, not released", h.async(function()
    local m = am.Mutex.new()
    local leased = am.withLease(m, 5):acquire()
    local release = m:steal()
    h.sleep(20)                                  -- its lease ends meanwhile
    assert.is_true(m:isLocked())                 -- the stealer's hold stays
    assert.equal(LOST, check(leased))
    assert.is_true(release())
  end))

  it("is the lock's own through withTimeout (it never waits)", h.async(function()
    local m, old = h.held(am.Mutex.new())
    local release = am.withTimeout(m, 10):steal()
    assert.equal(LOST, check(old))
    assert.is_true(release())
  end))

  it("is refused through tryAcquire, withLease and withSignal, changing nothing", h.async(function()
    local m, km = am.Mutex.new(), am.KeyedRWLock.new()
    local old = m:acquire()
    assert.equal("attempt to steal through tryAcquire (a steal takes the lock whoever holds it)",
      h.error_of(function() am.tryAcquire(m):steal() end))
    assert.equal("attempt to steal through withLease (a stolen hold has no lease)",
      h.error_of(function() am.withLease(am.withTimeout(m, 5), 100):steal() end))
    assert.equal("attempt to steal through withSignal (a steal never waits)",
      h.error_of(function() am.withSignal(km, am.signal()):stealRead("k") end))
    assert.equal("attempt to steal through tryAcquire (a steal takes the lock whoever holds it)",
      h.error_of(function() am.tryAcquire(am.Semaphore.new(1)):steal(1) end))
    assert.is_true(check(old))
    assert.equal(0, km:count())
    h.raises_at_caller { function() am.tryAcquire(m):steal() end, "attempt to steal through tryAcquire (a steal takes the lock whoever holds it)" }
    old()
  end))
end)

describe("steal's bookkeeping", function()
  it("keeps nothing for lost holds once their releasers were told", h.async(function()
    local m, rm = am.Mutex.new(), am.ReentrantMutex.new()
    local function cycles(n)
      for _ = 1, n do
        local a = m:acquire()
        local b = m:steal()
        assert.is_false(a()); assert.is_true(b())
        local co = h.spawn(function()
          local l1, l2 = rm:acquire(), rm:acquire()
          coroutine.yield()
          assert.is_false(l1()); assert.is_false(l2())
        end)
        local c = rm:steal()
        coroutine.resume(co)
        assert.is_true(c())
      end
    end
    cycles(200)
    h.gc()
    local before = collectgarbage("count")
    cycles(5000)
    h.gc()
    assert.is_true(collectgarbage("count") - before < 64, "grew by "
      .. (collectgarbage("count") - before) .. " KB")
  end))
end)

describe("semaphore:steal", function()
  it("ends every hold, gives their weight back, takes its own and returns the value before", h.async(function()
    local s = am.Semaphore.new(5)
    local _, a = s:acquire(2)
    local _, b = s:acquire(1)
    local value, release = s:steal(4)
    assert.equal(5, value)                       -- 2 + 2 + 1 given back
    assert.equal(1, s:getValue())
    assert.equal(LOST, check(a)); assert.equal(LOST, check(b))
    assert.is_false(a()); assert.is_false(b())
    assert.equal(1, s:getValue())                -- they gave back nothing
    assert.is_true(release())
    assert.equal(5, s:getValue())
  end))

  it("passes what the ended holds gave back beyond its weight to the queue's head", h.async(function()
    local s, log = am.Semaphore.new(3), {}
    local _, a = s:acquire(3)
    local w = h.chain(log, "w", s, 2)
    local _, release = s:steal(1)
    assert.same({ w.co }, { am.query(s).pending[1] and am.query(s).pending[1].owner or w.co })
    h.wait_until(function() return w.done end)
    assert.is_true(w.ok)
    assert.equal(2, s:getValue())                -- 3 - 1 (stealer); w gave its 2 back
    release()
    assert.is_false(a())
    assert.equal(3, s:getValue())
  end))

  it("counts what unscoped releases gave back once", h.async(function()
    local s = am.Semaphore.new(2)
    local _, a = s:acquire(2)
    s:release(2)                                 -- a's units given back
    local value, release = s:steal(2)
    assert.equal(2, value)
    assert.equal(0, s:getValue())
    assert.is_false(a())
    assert.equal(0, s:getValue())
    release()
    assert.equal(2, s:getValue())
  end))

  it("refuses a weight beyond the value with every hold ended, changing nothing", h.async(function()
    local s = am.Semaphore.new(2)
    local _, a = s:acquire(1)
    assert.equal("bad argument #1 to 'steal' (weight 3 is more than the semaphore's value with every hold ended (2))",
      h.error_of(function() s:steal(3) end))
    assert.is_true(check(a))
    assert.equal(1, s:getValue())
    a()
  end))
end)

describe("rwlock:steal and rwlock:stealRead", function()
  it("a write steal ends the readers", h.left_free(am.RWLock.new, function(rw)
    local r1, r2 = rw:acquireRead(), rw:acquireRead()
    local release = rw:steal()
    assert.is_true(rw:isWriteLocked())
    assert.equal(LOST, check(r1)); assert.equal(LOST, check(r2))
    assert.is_false(r1()); assert.is_false(r2())
    assert.is_true(rw:isWriteLocked())
    assert.is_true(release())
  end))

  it("a read steal ends the writer and the readers; queued readers at the head join it", h.async(function()
    local rw, wr = h.held(am.RWLock.new(), "acquireWrite")
    local reader = h.requester("acquireRead", nil, "r", rw)
    local release = rw:stealRead()
    assert.equal(LOST, check(wr))
    assert.is_false(wr())
    h.wait_until(function() return reader.done end)
    assert.is_true(reader.ok)
    assert.equal(2, rw:readers())
    local again = rw:stealRead()
    assert.equal(LOST, check(release)); assert.equal(LOST, check(reader.release))
    assert.equal(1, rw:readers())
    assert.is_false(release()); assert.is_false(reader.release())
    assert.equal(1, rw:readers())
    assert.is_true(again())
    assert.is_false(rw:isLocked())
  end))

  it("a stolen write cannot be downgraded", h.async(function()
    local rw, wr = h.held(am.RWLock.new(), "acquireWrite")
    local release = rw:steal()
    assert.equal("attempt to downgrade a write hold that has ended", h.error_of(function() wr:downgrade() end))
    release()
  end))
end)

describe("rm:steal", function()
  it("ends every level of another coroutine's hold; the stealer holds it at depth 1", h.left_free(am.ReentrantMutex.new, function(rm)
    local levels = {}
    local co = h.spawn(function()
      levels[1] = rm:acquire(); levels[2] = rm:acquire()
      coroutine.yield()
    end)
    local release = rm:steal()
    assert.is_true(rm:isHeldByMe())
    assert.equal(1, rm:depth())
    assert.equal(coroutine.running(), am.query(rm).held[1].owner)
    for _, l in ipairs(levels) do assert.equal(LOST, check(l)) end
    coroutine.resume(co)
    assert.is_false(levels[1]()); assert.is_false(levels[2]())
    assert.equal(1, rm:depth())
    local nested = rm:acquire()                  -- the stealer re-enters
    assert.equal(2, rm:depth())
    nested(); release()
  end))

  it("cannot be used by its holder to hold it twice", h.holding(am.ReentrantMutex.new, function(rm, release)
    assert.equal("attempt to steal a reentrant mutex that this coroutine holds (it would hold it twice)",
      h.error_of(function() rm:steal() end))
    assert.equal(1, rm:depth())
    assert.is_true(check(release))
  end))
end)

describe("keyed sets' steal", function()
  it("steals one key; the others are untouched", h.left_free(am.KeyedMutex.new, function(km)
    local a, b = km:acquire("a"), km:acquire("b")
    local release = km:steal("a")
    assert.equal(LOST, check(a))
    assert.is_true(check(b))
    release(); b(); a()
  end))

  it("on a key without a lock is a grant, and the key leaves the set when released", h.left_free(am.KeyedSemaphore.new, 3, function(ks)
    local value, release = ks:steal("k", 2)
    assert.equal(3, value)
    assert.equal(1, ks:getValue("k"))
    release()
  end))

  it("refuses a weight beyond the key's value without leaving a lock behind", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    assert.equal("bad argument #2 to 'steal' (weight 3 is more than the semaphore's value with every hold ended (2))",
      h.error_of(function() ks:steal("k", 3) end))
  end))

  it("KeyedRWLock: steal and stealRead per key", h.left_free(am.KeyedRWLock.new, function(krw)
    local r = krw:acquireRead("x")
    local w = krw:steal("x")
    assert.is_true(krw:isWriteLocked("x"))
    assert.equal(LOST, check(r))
    local s = krw:stealRead("x")
    assert.equal(LOST, check(w))
    assert.equal(1, krw:readers("x"))
    s(); r(); w()
  end))
end)

describe("am.query after a steal", function()
  it("shows the stealer's hold alone and the queue unchanged", h.async(function()
    local m, old = h.held(am.Mutex.new())
    local a = h.acquirer(nil, "a", m, 3)
    local release = m:steal()
    local q = am.query(m)
    assert.equal(1, #q.held)
    assert.equal("exclusive", q.held[1].mode)
    assert.equal(1, #q.pending)
    assert.equal(a.co, q.pending[1].owner)
    release()
    h.wait_until(function() return a.done end)
    a.release(); old()
    assert.same({ held = {}, pending = {} }, am.query(m))
  end))

  it("with debug mode on, names the stealer as the one holder", h.async(function()
    am.debug.enable()
    local s = am.Semaphore.new(3)
    local worker = h.spawn(function()
      local _, r = s:acquire(2)
      coroutine.yield()
      r()
    end)
    local _, release = s:steal(1)
    local held = am.query(s).held
    assert.equal(1, #held)
    assert.equal(coroutine.running(), held[1].owner)
    assert.equal(1, held[1].weight)
    coroutine.resume(worker)
    assert.equal(2, s:getValue())
    release()
    assert.equal(0, am.debug.count and am.debug.count() or 0)
  end))
end)

describe("debug mode and steal", function()
  -- A stolen holder no longer holds: were it counted, the deadlock search
  -- would see the worker holding `a` and refuse main's wait for `a` (held
  -- by y) as a cycle through `b`, which the worker waits for.
  it("does not count a stolen holder as holding: no false deadlock", h.async(function()
    am.debug.enable({ onReport = function() end })  -- (lockdep: a, b inverted)
    local a = am.Mutex.new()
    local b = am.Mutex.new()
    local rb = b:acquire()
    local worker = {}
    worker.co = h.spawn(function()
      local ra = a:acquire()
      worker.ok, worker.err = pcall(b.acquire, b)     -- waits for main's b
      worker.done = true
      if worker.ok then worker.err() end
      ra()                                            -- lost: false
    end)
    a:steal()()                                       -- take a, give it up
    local y = h.acquirer(nil, "y", a)                 -- y holds a
    local t = require("luv").new_timer()
    t:start(5, 0, function() t:close(); y.release() end)
    local ok, ra = pcall(a.acquire, a)                -- waits for y only
    assert.is_true(ok, tostring(ra))
    ra(); rb()
    h.wait_until(function() return worker.done end)
    assert.is_true(worker.ok)
  end))

  -- (debug mode credits a Semaphore's unscoped releases beyond its records
  -- to the next grants, which then get no record: docs/debug.md; a steal
  -- ends the holds that credit was for)
  it("records the stealer of a Semaphore as its holder, whatever unscoped releases gave back", h.async(function()
    am.debug.enable()
    local s = am.Semaphore.new(0)
    s:release(1)                                      -- credit: no record
    local _, release = s:steal(1)
    local held = am.query(s).held
    assert.equal(1, #held)
    assert.equal(coroutine.running(), held[1].owner)
    release()
  end))
end)

describe("steal's bad input", function()
  it("names the function and the argument", h.async(function()
    local m, s, rw = am.Mutex.new(), am.Semaphore.new(1), am.RWLock.new()
    local km = am.KeyedMutex.new()
    assert.equal("bad argument #1 to 'steal' (priority must be a number, got string)",
      h.error_of(function() m:steal("x") end))
    assert.equal("bad argument #1 to 'steal' (priority must not be NaN)",
      h.error_of(function() m:steal(0/0) end))
    assert.equal("bad argument #1 to 'steal' (weight must be a positive integer)",
      h.error_of(function() s:steal(0) end))
    assert.equal("bad argument #2 to 'steal' (priority must be a number, got table)",
      h.error_of(function() s:steal(1, {}) end))
    assert.equal("bad argument #1 to 'stealRead' (priority must be a number, got boolean)",
      h.error_of(function() rw:stealRead(true) end))
    assert.equal("bad argument #1 to 'steal' (key must not be nil)",
      h.error_of(function() km:steal(nil) end))
    assert.equal("bad argument #1 to 'steal' (async_mutex.Mutex expected, got table)",
      h.error_of(function() m.steal({}) end))
    assert.equal("bad argument #1 to 'steal' (async_mutex.Semaphore expected, got async_mutex.Mutex)",
      h.error_of(function() s.steal(m) end))
    assert.is_false(m:isLocked())
    assert.equal(1, s:getValue())
    assert.equal(0, km:count())
  end))

  it("raises at the caller's line", function()
    local m = am.Mutex.new()
    h.raises_at_caller { function() m:steal("x") end, "bad argument #1 to 'steal' (priority must be a number, got string)" }
  end)
end)

describe("steal and the loop", function()
  it("leaves nothing pending and no handle active", h.async(function()
    local base = am.pending()
    local m, old = h.held(am.Mutex.new())
    local waiters = {}
    for i = 1, 5 do waiters[i] = h.chain(nil, i, m) end
    local release = m:steal()
    release()
    h.wait_until(function()
      for _, w in ipairs(waiters) do if not w.done then return false end end
      return true
    end)
    assert.is_false(old())
    assert.equal(base, am.pending())
    h.tick(2)
    assert.is_false(m:isLocked())
    assert.same({}, h.active_handles())
  end))
end)
