-- KeyedRWLock: an RWLock per key, created on demand and dropped when idle
-- (docs/lockkinds.md, KeyedRWLock).  Every rule of the single RWLock holds
-- per key (shared reads, exclusive writes, one queue per key, readers at the
-- head together, no starving, downgrade, release, cancel), the keyed rules
-- hold (keys of any type, idle keys freed, maxPending, introspection), and
-- the multi-key requests take every key in the mode asked for, in one
-- canonical order, all or nothing.
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

local no_more_pending = h.pending_baseline(before_each)

local reader, writer = h.reader, h.writer

describe("KeyedRWLock.new", function()
  it("creates an empty set: every key free, no reader, no writer", function()
    local kr = am.KeyedRWLock.new()
    assert.equal(0, kr:count())
    assert.is_false(kr:isLocked("a"))
    assert.is_false(kr:isWriteLocked("a"))
    assert.equal(0, kr:readers("a"))
    assert.same({ 0, 0 }, { kr:waiting("a") })
    assert.same({}, kr:keys())
    assert.matches("^async_mutex.KeyedRWLock %(0 keys in use%): ", tostring(kr))
    assert.equal(0, kr:count())                 -- asking made no lock
  end)

  it("accepts the keyed options: cancelError, maxPending, maxPendingError", h.async(function()
    local cerr, perr = {}, {}
    local kr = am.KeyedRWLock.new({ cancelError = cerr, maxPending = 1, maxPendingError = perr })
    local w = kr:acquireWrite("k")
    local a = reader(nil, "a", kr, "k")
    assert.same({ false, perr }, { pcall(kr.acquireRead, kr, "k") })
    kr:cancel("k")
    h.tick()
    assert.equal(cerr, a.err)
    w()
    assert.equal(0, kr:count())
  end))
end)

describe("KeyedRWLock per key", function()
  it("shares reads of one key: granted at once, without yielding", h.async(function()
    local kr = am.KeyedRWLock.new()
    local rs = h.granted_at_once(4, function() return kr:acquireRead("k") end)
    assert.equal(4, kr:readers("k"))
    assert.is_true(kr:isLocked("k"))
    assert.is_false(kr:isWriteLocked("k"))
    assert.equal(1, kr:count())
    for i = 1, 4 do rs[i]() end
    assert.equal(0, kr:count())                 -- idle: freed
  end))

  it("writes one key alone: readers and writers of that key wait, other keys go on", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    assert.is_true(kr:isWriteLocked("k"))
    local r = reader(nil, "r", kr, "k")
    local w2 = writer(nil, "w2", kr, "k")
    local other = reader(nil, "o", kr, "other")
    local other_w = writer(nil, "ow", kr, "other2")
    h.tick()
    assert.is_false(r.done)
    assert.is_false(w2.done)
    assert.is_true(other.ok)
    assert.is_true(other_w.ok)
    assert.same({ 2, 0 }, { kr:waiting("k") })
    w()
    h.tick()
    assert.is_true(r.ok)                        -- arrival order: the reader first
    assert.is_false(w2.done)
    r.release()
    h.tick()
    assert.is_true(w2.ok)
    w2.release(); other.release(); other_w.release()
    assert.equal(0, kr:count())
  end))

  it("acquire and runExclusive write, so a KeyedRWLock stands where a KeyedMutex is expected", h.left_free(am.KeyedRWLock.new, function(kr)
    local w = kr:acquire("k")
    assert.is_true(kr:isWriteLocked("k"))
    w()
    assert.same({ "x" }, { kr:runExclusive("k", function()
      assert.is_true(kr:isWriteLocked("k"))
      return "x"
    end) })
  end))

  it("queues a reader behind a waiting writer while readers hold (no starving writers)", h.async(function()
    local log = {}
    local kr, r0 = h.held(am.KeyedRWLock.new(), "acquireRead", "k")
    local w = writer(log, "w", kr, "k")
    local r = reader(log, "r", kr, "k")
    h.tick(2)
    assert.same({}, log)
    r0()
    h.granted_in_turn(log, w, r)
    assert.equal(0, kr:count())
  end))

  it("grants every reader at the head of a key's queue in one step, woken from the loop", h.async(function()
    local log = {}
    local kr, w0 = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local q = {}
    for i = 1, 5 do q[i] = reader(log, "r" .. i, kr, "k") end
    q[6] = writer(log, "w", kr, "k")
    q[7] = reader(log, "r7", kr, "k")
    w0()
    assert.equal(5, kr:readers("k"))            -- granted in the release itself
    assert.same({}, log)                        -- resumed by the loop
    h.tick()
    assert.same({ "r1", "r2", "r3", "r4", "r5" }, log)
    for i = 1, 5 do q[i].release() end
    h.tick()
    assert.same({ "r1", "r2", "r3", "r4", "r5", "w" }, log)
    q[6].release()
    h.tick()
    q[7].release()
    assert.equal(0, kr:count())
  end))

  it("orders each key's queue by priority, FIFO among equals, and not across keys", h.async(function()
    local log = {}
    local kr = am.KeyedRWLock.new()
    local wa, wb = kr:acquireWrite("a"), kr:acquireWrite("b")
    local lo = writer(log, "a-lo", kr, "a", 0)
    local hi = reader(log, "a-hi", kr, "a", 5)
    local b = reader(log, "b-lo", kr, "b", -1)
    wa()
    h.tick()
    assert.same({ "a-hi" }, log)
    wb()
    h.tick()
    assert.same({ "a-hi", "b-lo" }, log)
    hi.release()
    h.tick()
    assert.same({ "a-hi", "b-lo", "a-lo" }, log)
    lo.release(); b.release()
    assert.equal(0, kr:count())
  end))

  it("treats 1 and 1.0 as one key and locks keys of any type", h.left_free(am.KeyedRWLock.new, function(kr)
    local t, co = {}, coroutine.create(function() end)
    local w = kr:acquireWrite(1)
    assert.is_true(kr:isWriteLocked(1.0))
    assert.is_false(kr:isLocked("1"))
    local rs = { kr:acquireRead(true), kr:acquireRead(t), kr:acquireRead(co), kr:acquireRead(2.5) }
    assert.equal(5, kr:count())
    assert.same({ "boolean:true", "number:1", "number:2.5", "table:" .. tostring(t),
      "thread:" .. tostring(co) }, h.keys_of(kr))
    w()
    for _, r in ipairs(rs) do r() end
  end))
end)

describe("KeyedRWLock: idle keys are freed", function()
  it("drops a key's lock as soon as nobody holds, waits for or waits to see it", h.async(function()
    local kr, r = h.held(am.KeyedRWLock.new(), "acquireRead", "k")
    local u = h.waiter(nil, "u", kr, "k")       -- waitForUnlock: waits as a write
    local w = writer(nil, "w", kr, "k")
    h.tick()
    assert.equal(1, kr:count())
    assert.same({ 1, 1 }, { kr:waiting("k") })
    r()
    assert.equal(1, kr:count())                 -- w granted, not yet resumed
    h.tick()
    assert.is_true(w.ok)
    assert.is_false(u.done)
    w.release()
    h.tick()
    assert.is_true(u.ok)
    assert.is_false(u.locked_then)
    assert.equal(0, kr:count())
    assert.same({}, kr:keys())
  end))

  it("after a downgrade and the read released, and after a timed-out writer", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local r = w:downgrade()
    assert.equal(1, kr:readers("k"))
    r()
    assert.equal(0, kr:count())
    local r2 = kr:acquireRead("k")
    local t = am.withTimeout(kr, 5)
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquireWrite, t, "k") })
    r2()
    assert.equal(0, kr:count())
    no_more_pending()
  end))

  it("after a queued coroutine is closed, and after a holder is closed", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local r = reader(nil, "r", kr, "k")
    h.tick()
    assert.is_true(coroutine.close(r.co))
    w()
    assert.equal(0, kr:count())
    local co = coroutine.create(function()
      local _ <close> = kr:acquireRead("k")
      coroutine.yield()
    end)
    assert(coroutine.resume(co))
    assert.equal(1, kr:count())
    assert.is_true(coroutine.close(co))
    assert.equal(0, kr:count())
    no_more_pending()
  end))

  it("keeps memory to the keys in use: 20,000 keys read and released leave none", h.async(function()
    local kr = am.KeyedRWLock.new()
    local n = h.load(20000)
    for i = 1, n do
      if i % 2 == 0 then kr:acquireRead(i)() else kr:acquireWrite("k" .. i)() end
    end
    assert.equal(0, kr:count())
    assert.same({}, kr:keys())
  end))
end)

describe("KeyedRWLock:release, cancel, waitForUnlock", function()
  it("release(key) ends the key's write hold; the writer's releaser is then a no-op", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local other = kr:acquireWrite("o")
    kr:release("k")
    assert.is_false(kr:isLocked("k"))
    assert.is_true(kr:isWriteLocked("o"))
    local w2 = kr:acquireWrite("k")
    w()                                         -- not w2's grant
    assert.is_true(kr:isWriteLocked("k"))
    w2(); other()
    assert.equal(0, kr:count())
  end))

  it("release(key) does nothing while readers hold the key, or on a free key", h.left_free(am.KeyedRWLock.new, function(kr)
    kr:release("free")
    assert.equal(0, kr:count())
    local r = kr:acquireRead("k")
    kr:release("k")
    assert.equal(1, kr:readers("k"))
    r()
  end))

  it("cancel(key) rejects that key's queued readers and writers; cancel() every key's", h.left_free(am.KeyedRWLock.new, function(kr)
    local wa, wb = kr:acquireWrite("a"), kr:acquireWrite("b")
    local ra, wa2 = reader(nil, "ra", kr, "a"), writer(nil, "wa2", kr, "a")
    local rb = reader(nil, "rb", kr, "b")
    h.tick()
    kr:cancel("a")
    h.tick()
    assert.same({ false, am.E_CANCELED }, { ra.ok, ra.err })
    assert.same({ false, am.E_CANCELED }, { wa2.ok, wa2.err })
    assert.is_false(rb.done)
    kr:cancel()
    h.tick()
    assert.same({ false, am.E_CANCELED }, { rb.ok, rb.err })
    assert.is_true(kr:isWriteLocked("a"))       -- holders keep their keys
    wa(); wb()
  end))

  it("waitForUnlock(key) returns at once on a free key without making a lock", h.async(function()
    local kr = am.KeyedRWLock.new()
    assert.is_true((h.without_yield(function() kr:waitForUnlock("k") end)))
    assert.equal(0, kr:count())
    local r = kr:acquireRead("k")
    assert.is_false((h.without_yield(function() kr:waitForUnlock("k") end)))
    r()
    h.tick()
  end))
end)

describe("KeyedRWLock runShared and runExclusive", function()
  it("runShared(key, fn) reads the key, runExclusive(key, fn) writes it, results returned", h.left_free(am.KeyedRWLock.new, function(kr)
    assert.same({ 1, nil, 3 }, { kr:runShared("k", function()
      assert.equal(1, kr:readers("k"))
      return 1, nil, 3
    end) })
    assert.same({ true }, { kr:runExclusive("k", function() return kr:isWriteLocked("k") end) })
  end))

  it("readers of a key overlap, a writer of that key does not, and keys do not interfere", h.left_free(am.KeyedRWLock.new, function(kr)
    local inside = { a = h.occupancy(), b = h.occupancy() }
    local done = 0
    for i = 1, 24 do
      local key = i % 2 == 0 and "a" or "b"
      h.spawn(function()
        if i % 5 == 0 then
          kr:runExclusive(key, function()
            inside[key]:enter()
            assert(inside[key]:now() == 1, "a writer shared its key")
            h.tick()
            inside[key]:leave()
          end)
        else
          kr:runShared(key, function() inside[key]:enter(); h.tick(); inside[key]:leave() end)
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 24 end)
    assert.is_true(inside.a:most() > 1)
    assert.is_true(inside.b:most() > 1)
  end))

  it("release the key when fn raises and re-raise the error unchanged", h.left_free(am.KeyedRWLock.new, function(kr)
    local err = {}
    assert.same({ false, err }, { pcall(kr.runShared, kr, "k", function() error(err) end) })
    assert.same({ false, err }, { pcall(kr.runExclusive, kr, "k", function() error(err) end) })
  end))
end)

describe("KeyedRWLock multi-key requests", function()
  it("acquireAllRead reads every key; readers share them, writers of any of them wait", h.left_free(am.KeyedRWLock.new, function(kr)
    local all = kr:acquireAllRead({ "b", "a", "c" })
    assert.equal(1, kr:readers("a"))
    assert.equal(1, kr:readers("b"))
    assert.equal(1, kr:readers("c"))
    local all2 = kr:acquireAllRead({ "a", "c" })
    assert.equal(2, kr:readers("a"))
    local w = writer(nil, "w", kr, "c")
    h.tick()
    assert.is_false(w.done)
    all(); all2()
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))

  it("acquireAllWrite and acquireAll write every key", h.left_free(am.KeyedRWLock.new, function(kr)
    local all = kr:acquireAllWrite({ "x", "y" })
    assert.is_true(kr:isWriteLocked("x"))
    assert.is_true(kr:isWriteLocked("y"))
    all()
    local all2 = kr:acquireAll({ 2, 1 })
    assert.is_true(kr:isWriteLocked(1))
    assert.is_true(kr:isWriteLocked(2))
    all2()
  end))

  it("takes the keys in the canonical order whatever the order given (no deadlock)", h.async(function()
    -- Two writers with the keys in opposite orders, and readers in between:
    -- with the keys taken in one order, all of them finish.
    local kr = am.KeyedRWLock.new()
    local t = {}
    local order = {}
    local real = kr.acquireWrite
    local mt = getmetatable(kr).__index
    -- record the order in which each acquireAll takes its keys
    mt.acquireWrite = function(self, key, ...)
      order[#order + 1] = key
      return real(self, key, ...)
    end
    local ok, err = pcall(function()
      local release = kr:acquireAllWrite({ "b", t, true, 2, "a", 1, 2 })
      release()
    end)
    mt.acquireWrite = real
    assert(ok, err)
    assert.same({ true, 1, 2, "a", "b", t }, order)
    local done = 0
    for i = 1, 20 do
      local keys = i % 2 == 0 and { "p", "q", "r" } or { "r", "q", "p" }
      h.spawn(function()
        local rel = i % 3 == 0 and kr:acquireAllRead(keys) or kr:acquireAllWrite(keys)
        h.tick()
        rel()
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 20 end)
    assert.equal(0, kr:count())
  end))

  it("releases the keys taken when a later key cannot be had (timeout, tryAcquire, cancel)", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "b")
    local t = am.withTimeout(kr, 5)
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquireAllRead, t, { "a", "b", "c" }) })
    assert.is_false(kr:isLocked("a"))
    assert.equal(1, kr:count())
    local try = am.tryAcquire(kr)
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquireAllWrite, try, { "a", "b" }) })
    assert.is_false(kr:isLocked("a"))
    local c = h.requester("acquireAllRead", nil, "c", kr, { "a", "b" })
    h.tick()
    assert.equal(1, kr:readers("a"))            -- a taken, b waited for
    kr:cancel("b")
    h.tick()
    assert.same({ false, am.E_CANCELED }, { c.ok, c.err })
    assert.is_false(kr:isLocked("a"))
    w()
    assert.equal(0, kr:count())
    no_more_pending()
  end))

  it("tryAcquire's acquireAllRead shares keys that only readers hold", h.async(function()
    local kr, r = h.held(am.KeyedRWLock.new(), "acquireRead", "a")
    local try = am.tryAcquire(kr)
    local all = try:acquireAllRead({ "a", "b" })
    assert.equal(2, kr:readers("a"))
    all(); r()
    assert.equal(0, kr:count())
  end))

  it("runSharedAll and runExclusiveAll run fn holding every key, and release on error", h.left_free(am.KeyedRWLock.new, function(kr)
    assert.same({ 1, 1 }, { kr:runSharedAll({ "a", "b" }, function()
      return kr:readers("a"), kr:readers("b")
    end) })
    assert.same({ true, true }, { kr:runExclusiveAll({ "a", "b" }, function()
      return kr:isWriteLocked("a"), kr:isWriteLocked("b")
    end) })
    local err = {}
    assert.same({ false, err }, { pcall(kr.runSharedAll, kr, { "a" }, function() error(err) end) })
  end))

  it("on a withTimeout lock, the timeout bounds the whole acquisition", h.async(function()
    local kr, wa = h.held(am.KeyedRWLock.new(), "acquireWrite", "a")
    local t = am.withTimeout(kr, 30)
    h.spawn(function() h.sleep(10); wa() end)
    local rel = t:acquireAllRead({ "a", "b" })  -- a freed in time
    assert.equal(1, kr:readers("a"))
    rel()
    assert.equal(0, kr:count())
  end))
end)

describe("KeyedRWLock decorators", function()
  it("withTimeout bounds acquireRead, acquireWrite, acquire and waitForUnlock per key", h.async(function()
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local t = am.withTimeout(kr, 5, "late")
    for _, m in ipairs({ "acquireRead", "acquireWrite", "acquire", "waitForUnlock" }) do
      assert.same({ false, "late" }, { pcall(t[m], t, "k") })
    end
    local r = t:acquireRead("other")            -- other keys: at once
    r()
    w()
    assert.equal(0, kr:count())
    no_more_pending()
  end))

  it("tryAcquire decides at once, sharing reads and refusing behind a writer", h.left_free(am.KeyedRWLock.new, function(kr)
    local try = am.tryAcquire(kr)
    local completed, res = h.without_yield(function() return try:acquireRead("k") end)
    assert.is_true(completed)
    local r2 = try:acquireRead("k")
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquireWrite, try, "k") })
    local w = writer(nil, "w", kr, "k")
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquireRead, try, "k") })
    res[1](); r2()
    h.tick()
    assert.is_true(w.ok)
    w.release()
    try:acquireWrite("absent")()                -- a free key: at once
  end))

  it("withLease ends a read or write hold of a key that outlasts its lease", h.left_free(am.KeyedRWLock.new, function(kr)
    local leased = am.withLease(kr, 10)
    local r = leased:acquireRead("k")
    local w = writer(nil, "w", kr, "k")
    h.wait_until(function() return w.done end)  -- the read lease ran out
    assert.is_true(w.ok)
    assert.is_false(r())
    assert.equal(am.E_LOST, select(2, pcall(r.check, r)))
    w.release()
    local lw = leased:acquireWrite("k")
    assert.is_true(lw:check())
    assert.is_true(lw())
    assert.equal(false, lw:check())
    assert.equal(0, kr:count())
    -- the lease is counted on the clock, h.sleep on the loop's time, which
    -- the lines above (slow under GC stress) may have left behind the clock
    require("luv").update_time()
    local err = select(2, pcall(leased.runShared, leased, "k", function() h.sleep(30) end))
    assert.equal(am.E_LOST, err)
  end))

  it("decorators compose and keep the set's other methods", h.async(function()
    local kr = am.KeyedRWLock.new()
    local d = am.withTimeout(am.withLease(kr, 1000), 50)
    local r = d:acquireRead("k")
    assert.equal(1, d:readers("k"))
    assert.is_true(d:isLocked("k"))
    assert.is_false(d:isWriteLocked("k"))
    assert.equal(1, d:count())
    assert.same({ 0, 0 }, { d:waiting("k") })
    assert.same({ "k" }, d:keys())
    assert.same({ 5 }, { d:runShared("k", function() return 5 end) })
    assert.is_true(r())
    assert.same({ 6 }, { d:runExclusiveAll({ "a", "b" }, function() return 6 end) })
    assert.equal(0, d:count())
  end))
end)

describe("KeyedRWLock releasers", function()
  it("downgrade a key's write hold: the readers at the head of that key join", h.async(function()
    local log = {}
    local kr, w = h.held(am.KeyedRWLock.new(), "acquireWrite", "k")
    local a = reader(log, "a", kr, "k")
    local w2 = writer(log, "w2", kr, "k")
    h.tick()
    local r = w:downgrade()
    assert.equal(2, kr:readers("k"))
    h.tick()
    assert.same({ "a" }, log)
    r(); a.release()
    h.tick()
    assert.same({ "a", "w2" }, log)
    w2.release()
    assert.equal(0, kr:count())
  end))

  it("release once, as <close> variables too, and refuse to upgrade", h.left_free(am.KeyedRWLock.new, function(kr)
    do
      local r <close> = kr:acquireRead("k")
      assert.is_true(r())
      assert.is_false(r())
      assert.equal("attempt to upgrade a read hold: not offered (two upgraders would deadlock); "
        .. "release it, then acquireWrite", E(function() r:upgrade() end))
    end
  end))
end)

describe("KeyedRWLock maxPending", function()
  it("bounds the acquirers queued per key, readers and writers alike", h.left_free(am.KeyedRWLock.new, { maxPending = 2 }, function(kr)
    local w = kr:acquireWrite("k")
    local a, b = reader(nil, "a", kr, "k"), writer(nil, "b", kr, "k")
    assert.same({ false, am.E_MAX_PENDING }, { pcall(kr.acquireRead, kr, "k") })
    assert.same({ false, am.E_MAX_PENDING }, { pcall(kr.acquireWrite, kr, "k") })
    local other = kr:acquireRead("other")       -- per key
    w()
    h.tick()
    a.release()
    h.tick()
    b.release(); other()
  end))

  it("never refuses a read granted at once, even beside a full queue", h.left_free(am.KeyedRWLock.new, { maxPending = 1 }, function(kr)
    local r = kr:acquireRead("k")
    local w = writer(nil, "w", kr, "k")
    local hi = kr:acquireRead("k", 1)           -- above the writer: at once
    assert.equal(2, kr:readers("k"))
    r(); hi()
    h.tick()
    w.release()
  end))
end)

describe("KeyedRWLock bad input", function()
  it("refuses a nil or NaN key, naming the method, and changes nothing", h.left_free(am.KeyedRWLock.new, function(kr)
    for _, m in ipairs({ "acquireRead", "acquireWrite", "acquire", "waitForUnlock", "isLocked",
                         "isWriteLocked", "readers", "release", "waiting" }) do
      assert.equal(("bad argument #1 to '%s' (key must not be nil)"):format(m),
        E(function() kr[m](kr) end))
      assert.equal(("bad argument #1 to '%s' (key must not be NaN)"):format(m),
        E(function() kr[m](kr, 0 / 0) end))
    end
    assert.equal("bad argument #1 to 'runShared' (key must not be nil)",
      E(function() kr:runShared(nil, function() end) end))
  end))

  it("refuses bad priorities and functions, naming the method and argument", h.async(function()
    local kr = am.KeyedRWLock.new()
    assert.equal("bad argument #2 to 'acquireRead' (priority must be a number, got table)",
      E(function() kr:acquireRead("k", {}) end))
    assert.equal("bad argument #2 to 'acquireWrite' (priority must not be NaN)",
      E(function() kr:acquireWrite("k", 0 / 0) end))
    assert.equal("bad argument #2 to 'runShared' (function expected, got number)",
      E(function() kr:runShared("k", 1) end))
    assert.equal("bad argument #3 to 'runShared' (priority must be a number, got string)",
      E(function() kr:runShared("k", function() end, "x") end))
    assert.equal("bad argument #3 to 'runExclusive' (priority must be a number, got string)",
      E(function() kr:runExclusive("k", function() end, "x") end))
    assert.equal("bad argument #2 to 'acquireAllRead' (priority must be a number, got string)",
      E(function() kr:acquireAllRead({ "k" }, "x") end))
    assert.equal("bad argument #2 to 'acquireAllWrite' (priority must be a number, got string)",
      E(function() kr:acquireAllWrite({ "k" }, "x") end))
    assert.equal("bad argument #2 to 'runSharedAll' (function expected, got nil)",
      E(function() kr:runSharedAll({ "k" }) end))
    assert.equal("bad argument #3 to 'runSharedAll' (priority must be a number, got string)",
      E(function() kr:runSharedAll({ "k" }, function() end, "x") end))
    local t = am.withTimeout(kr, 10)
    assert.equal("bad argument #2 to 'acquireRead' (priority must be a number, got table)",
      E(function() t:acquireRead("k", {}) end))
    assert.equal("bad argument #2 to 'acquireAllRead' (priority must be a number, got table)",
      E(function() t:acquireAllRead({ "k" }, {}) end))
    assert.equal(0, kr:count())
    no_more_pending()
  end))

  it("refuses bad key sets to the multi-key requests", h.left_free(am.KeyedRWLock.new, function(kr)
    assert.equal("bad argument #1 to 'acquireAllRead' (table of keys expected, got string)",
      E(function() kr:acquireAllRead("k") end))
    assert.equal("bad argument #1 to 'acquireAllWrite' (key set must not be empty)",
      E(function() kr:acquireAllWrite({}) end))
    assert.equal("bad argument #1 to 'runSharedAll' (key #2 must not be NaN)",
      E(function() kr:runSharedAll({ 1, 0 / 0 }, function() end) end))
    assert.equal("bad argument #1 to 'acquireAll' (key #1 must not be nil)",
      E(function() kr:acquireAll({ nil, 1 }) end))
  end))

  it("refuses a self that is not a KeyedRWLock, and bad options", h.async(function()
    local kr = am.KeyedRWLock.new()
    assert.equal("bad argument #1 to 'acquireRead' (async_mutex.KeyedRWLock expected, got async_mutex.KeyedMutex)",
      E(function() kr.acquireRead(am.KeyedMutex.new(), "k") end))
    assert.equal("bad argument #1 to 'acquireAllRead' (async_mutex.KeyedRWLock expected, got async_mutex.RWLock)",
      E(function() kr.acquireAllRead(am.RWLock.new(), { "k" }) end))
    assert.equal("bad argument #1 to 'new' (maxPending must be a non-negative integer)",
      E(function() am.KeyedRWLock.new({ maxPending = 1.5 }) end))
    assert.equal("bad argument #1 to 'new' (table expected, got number)",
      E(function() am.KeyedRWLock.new(3) end))
  end))

  it("refuses to wait outside a coroutine, even on a free key, and leaves no lock", function()
    local kr = am.KeyedRWLock.new()
    assert.equal("attempt to acquire a readers-writer lock outside a coroutine",
      E(function() kr:acquireRead("k") end))
    assert.equal("attempt to acquire a readers-writer lock outside a coroutine",
      E(function() kr:acquireAllWrite({ "k" }) end))
    assert.equal("attempt to wait for a readers-writer lock outside a coroutine",
      E(function() kr:waitForUnlock("k") end))
    assert.equal(0, kr:count())
    no_more_pending()
  end)

  it("reports bad-input errors at the caller's line", h.async(function()
    local kr = am.KeyedRWLock.new()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() kr:acquireAllRead({ "k" }, {}) end)
    assert.is_false(ok)
    assert.matches(":" .. line .. ": bad argument #2 to 'acquireAllRead'", err)
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() kr:runShared("k", function() end, {}) end)
    assert.matches(":" .. line .. ": bad argument #3 to 'runShared'", err)
  end))
end)
