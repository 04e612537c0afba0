-- Keyed locks, one key at a time: KeyedMutex and KeyedSemaphore keep one
-- lock per key, and every rule of the single locks applies per key, never
-- across keys (docs/semantics.md, Keyed locks); maxPending bounds each key's
-- queue.  Multi-key requests are in 18-keyed-multi_spec.lua; count, waiting,
-- keys and the lifetime of a key's lock in 19-keyed-introspection_spec.lua;
-- load and memory in 33-keyed-stress_spec.lua.
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

local E = h.error_of

describe("KeyedMutex.new and KeyedSemaphore.new", function()
  it("accept an options table with nil fields, or nothing", h.async(function()
    assert.equal(0, am.KeyedMutex.new({}):count())
    assert.equal(0, am.KeyedMutex.new(nil):count())
    assert.equal(0, am.KeyedSemaphore.new(2, {}):count())
    assert.equal(0, am.KeyedMutex.new({ maxPending = 0 }):count())
    assert.equal(0, am.KeyedMutex.new({ maxPending = 3.0 }):count())
  end))

  it("start every key of a KeyedSemaphore at the given value, negative included", h.async(function()
    local ks = am.KeyedSemaphore.new(3)
    assert.equal(3, ks:getValue("x"))
    assert.equal(3, ks:getValue(42))
    assert.is_false(ks:isLocked("x"))
    local neg = am.KeyedSemaphore.new(-1)
    assert.equal(-1, neg:getValue("x"))
    assert.is_true(neg:isLocked("x"))
    assert.equal(0, neg:count())
  end))
end)


describe("KeyedMutex:acquire", function()
  it("grants a free key at once, without yielding", h.left_free(am.KeyedMutex.new, function(km)
    local completed, res = h.without_yield(function() return km:acquire("a") end)
    assert.is_true(completed)
    assert.is_true(km:isLocked("a"))
    assert.equal(1, km:count())
    res[1]()
    assert.is_false(km:isLocked("a"))
  end))

  it("makes a second caller with an equal key wait until the holder releases", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "item-1")
    local w = h.acquirer(nil, "w", km, "item-1")
    h.tick(2)
    assert.is_false(w.done)
    assert.same({ 1, 0 }, { km:waiting("item-1") })
    r()
    assert.is_false(w.done)                 -- wake-ups are deferred
    h.tick()
    assert.is_true(w.ok)
    assert.is_true(km:isLocked("item-1"))
    w.release()
    assert.equal(0, km:count())
  end))

  it("never blocks callers with different keys (1,000 keys held at once)", h.left_free(am.KeyedMutex.new, function(km)
    local rs = h.granted_at_once(1000, function(i) return km:acquire("k" .. i) end)
    assert.equal(1000, km:count())
    assert.equal(1000, #km:keys())
    for i = 1, 1000 do rs[i]() end
  end))

  it("serves the waiters of one key in FIFO order, one at a time", h.left_free(am.KeyedMutex.new, function(km)
    local log, inside, done = {}, h.occupancy(), 0
    local function worker(name)
      local r = km:acquire("k")
      inside:enter()
      log[#log + 1] = name
      h.sleep(1)
      inside:leave()
      r()
      done = done + 1
    end
    for i = 1, 6 do h.spawn(worker, i) end
    h.wait_until(function() return done == 6 end)
    assert.same({ 1, 2, 3, 4, 5, 6 }, log)
    assert.equal(1, inside:most())
  end))

  it("treats 1 and 1.0 as the same key, and 1 and '1' as different keys", h.left_free(am.KeyedMutex.new, function(km)
    local r = km:acquire(1)
    assert.is_true(km:isLocked(1.0))
    local w = h.acquirer(nil, "w", km, 1.0)
    assert.is_false(w.done)
    local completed, res = h.without_yield(function() return km:acquire("1") end)
    assert.is_true(completed)
    res[1]()
    r()
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))

  it("locks booleans, tables (by identity), functions, coroutines and userdata", h.left_free(am.KeyedMutex.new, function(km)
    local t1, t2 = { id = 1 }, { id = 1 }          -- equal contents, distinct keys
    local f = function() end
    local co = coroutine.create(f)
    local ud = am.Mutex.new()
    local keys = { true, false, t1, t2, f, co, ud, io.stdout, 0.5, -7, "" }
    local rs = h.granted_at_once(#keys, function(i) return km:acquire(keys[i]) end)
    assert.equal(#keys, km:count())
    for _, k in ipairs(keys) do
      local ok, err = h.try_now(function() am.tryAcquire(km):acquire(k) end)
      assert.is_true(ok)
      assert.equal(am.E_ALREADY_LOCKED, err[2])
    end
    for i = 1, #keys do rs[i]() end
  end))

  it("passes ownership at release: a newcomer of any priority queues behind the waiter", h.left_free(am.KeyedMutex.new, function(km)
    h.newcomer_behind_waiter(km, function()
      assert.is_true(km:isLocked("k"))        -- already a's
    end, "k")
  end))

  it("raises outside a coroutine even when the key is free, and leaves no trace", function()
    local km = am.KeyedMutex.new()
    local ok, err = pcall(km.acquire, km, "free")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("coroutine", 1, true), err)
    assert.equal(0, km:count())
    assert.is_false(km:isLocked("free"))
    ok, err = pcall(km.waitForUnlock, km, "free")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("coroutine", 1, true), err)
    local ks = am.KeyedSemaphore.new(2)
    assert.is_false((pcall(ks.acquire, ks, "free")))
    assert.equal(2, ks:getValue("free"))
    assert.equal(0, ks:count())
  end)
end)


describe("priorities per key", function()
  it("serve a key's higher priorities first, FIFO among equals", h.left_free(am.KeyedMutex.new, function(km)
    local log = {}
    local r = km:acquire("k")
    local ws = {
      h.acquirer(log, "low", km, "k", -1),
      h.acquirer(log, "mid1", km, "k", 5),
      h.acquirer(log, "top", km, "k", 10),
      h.acquirer(log, "mid2", km, "k", 5),
      h.acquirer(log, "zero", km, "k"),
    }
    r()
    for _ = 1, #ws do
      h.tick()
      for _, w in ipairs(ws) do
        if w.done and not w.released then w.released = true; w.release() end
      end
    end
    h.tick()
    assert.same({ "top", "mid1", "mid2", "zero", "low" }, log)
  end))

  it("do not reach across keys: a high priority on one key does not jump another key's queue", h.left_free(am.KeyedMutex.new, function(km)
    local log = {}
    local ra, rb = km:acquire("a"), km:acquire("b")
    local a1 = h.acquirer(log, "a1", km, "a", 0)
    local b1 = h.acquirer(log, "b1", km, "b", 0)
    local b2 = h.acquirer(log, "b2", km, "b", 50)     -- first on b, not on a
    ra()
    h.tick()
    assert.same({ "a1" }, log)
    assert.is_false(b2.done)
    rb()
    h.tick()
    assert.same({ "a1", "b2" }, log)
    a1.release(); b2.release()
    h.tick()
    assert.is_true(b1.ok)
    b1.release()
  end))
end)


describe("KeyedSemaphore:acquire", function()
  it("returns the key's value before the decrement, and a releaser of the weight", h.left_free(am.KeyedSemaphore.new, 5, function(ks)
    local v1, r1 = ks:acquire("a", 2)
    local v2, r2 = ks:acquire("a")
    assert.same({ 5, 3 }, { v1, v2 })
    assert.equal(2, ks:getValue("a"))
    assert.equal(5, ks:getValue("b"))
    r1()
    r1()                                         -- once only
    assert.equal(4, ks:getValue("a"))
    r2()
    assert.equal(5, ks:getValue("a"))
  end))

  it("limits the weight in use per key, not across keys", h.left_free(am.KeyedSemaphore.new, 3, function(ks)
    local _, ra = ks:acquire("a", 2)
    local w = h.acquirer(nil, "w", ks, "a", 2)
    assert.is_false(w.done)
    local completed, res = h.without_yield(function() return ks:acquire("b", 3) end)
    assert.is_true(completed)
    assert.equal(3, res[1])
    assert.equal(0, ks:getValue("b"))
    assert.equal(1, ks:getValue("a"))
    ra()
    h.tick()
    assert.is_true(w.ok)
    assert.equal(3, w.value)
    w.release(); res[2]()
  end))

  it("blocks lighter requests behind a heavy head on the same key only", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local _, ra = ks:acquire("a", 1)                -- a: 1 left
    local heavy = h.acquirer(nil, "heavy", ks, "a", 2)
    local light = h.acquirer(nil, "light", ks, "a", 1)
    assert.is_false(heavy.done)
    assert.is_false(light.done)                     -- head-of-line blocking
    local completed = h.without_yield(function() return ks:acquire("b", 1) end)
    assert.is_true(completed)
    ra()
    h.served_in_turn(heavy, light)
    ks:release("b")
  end))

  it("lets a strictly higher priority on the key skip a heavy head", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local _, r = ks:acquire("a", 1)
    local heavy = h.acquirer(nil, "heavy", ks, "a", 2, 0)
    local completed, res = h.without_yield(function() return ks:acquire("a", 1, 1) end)
    assert.is_true(completed)
    res[2]()
    r()
    h.tick()
    assert.is_true(heavy.ok)
    heavy.release()
  end))

  it("treats nil weight and priority as their defaults", h.async(function()
    local ks = am.KeyedSemaphore.new(2)
    local v, r = ks:acquire("a", nil, nil)
    assert.equal(2, v)
    assert.equal(1, ks:getValue("a"))
    r()
  end))
end)


describe("runExclusive on a keyed lock", function()
  it("holds the key while fn runs and yields, and returns all of fn's results", h.left_free(am.KeyedMutex.new, function(km)
    local nargs
    local res = table.pack(km:runExclusive("k", function(...)
      nargs = select("#", ...)
      assert.is_true(km:isLocked("k"))
      h.sleep(2)
      return 1, nil, "three", nil
    end))
    assert.equal(0, nargs)                      -- KeyedMutex: fn()
    assert.equal(4, res.n)
    assert.same({ 1, nil, "three", nil }, { res[1], res[2], res[3], res[4] })
  end))

  it("passes the key's value to fn on a KeyedSemaphore, with weight and priority", h.left_free(am.KeyedSemaphore.new, 4, function(ks)
    local seen
    ks:runExclusive("k", function(v) seen = { v, ks:getValue("k") } end, 3, 7)
    assert.same({ 4, 1 }, seen)
  end))

  it("excludes equal keys and lets different keys run together", h.left_free(am.KeyedMutex.new, function(km)
    local inside, done = h.occupancy(), 0
    local function job(key)
      km:runExclusive(key, function()
        inside:enter(key)
        h.sleep(2)
        inside:leave(key)
      end)
      done = done + 1
    end
    for i = 1, 12 do h.spawn(job, i % 3) end
    h.wait_until(function() return done == 12 end)
    assert.same({ 1, 1, 1 }, { inside:most(0), inside:most(1), inside:most(2) })
  end))

  it("releases the key and re-raises fn's error value unchanged", h.left_free(am.KeyedMutex.new, function(km)
    local e = {}
    local ok, err = pcall(km.runExclusive, km, "k", function() h.sleep(1); error(e) end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.is_false(km:isLocked("k"))
  end))

  it("does not call fn when the request is canceled", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "k")
    local called, got = false, nil
    h.spawn(function()
      got = table.pack(pcall(km.runExclusive, km, "k", function() called = true end))
    end)
    km:cancel("k")
    h.tick()
    assert.same({ false, am.E_CANCELED }, { got[1], got[2] })
    assert.is_false(called)
    r()
    assert.equal(0, km:count())
  end))

  it("refuses a non-callable fn and leaves the key free", h.async(function()
    local km = am.KeyedMutex.new()
    assert.equal("bad argument #2 to 'runExclusive' (function expected, got number)",
      E(function() km:runExclusive("k", 5) end))
    assert.equal(0, km:count())
    local ks = am.KeyedSemaphore.new(1)
    assert.equal("bad argument #2 to 'runExclusive' (function expected, got nil)",
      E(function() ks:runExclusive("k") end))
    assert.equal(1, ks:getValue("k"))
  end))
end)


describe("waitForUnlock on a keyed lock", function()
  it("returns at once, without yielding or creating a lock, when the key is free", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "other")
    local completed = h.without_yield(function() km:waitForUnlock("free") end)
    assert.is_true(completed)
    assert.same({ "string:other" }, h.keys_of(km))
    r()
  end))

  it("waits while the key is held, without locking it, and counts as a waiter", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "k")
    local w = h.waiter(nil, "w", km, "k")
    local x = h.waiter(nil, "x", km, "k", 3)
    assert.is_false(w.done)
    assert.same({ 0, 2 }, { km:waiting("k") })
    r()
    h.tick()
    assert.is_true(w.ok)
    assert.is_true(x.ok)
    assert.is_false(w.locked_then)
    assert.is_false(km:isLocked("k"))
    assert.equal(0, km:count())                 -- the waiters left with the lock
  end))

  it("resolves a waiter whose priority beats the key's queue head before the grant", h.left_free(am.KeyedMutex.new, function(km)
    local log = {}
    local r = km:acquire("k")
    local a = h.acquirer(log, "acquirer", km, "k", 1)
    local lo = h.waiter(log, "waiter 1", km, "k", 1)      -- not strictly greater
    local hi = h.waiter(log, "waiter 2", km, "k", 2)
    r()
    h.tick()
    assert.is_true(hi.done)
    assert.is_true(a.ok)
    assert.is_false(lo.done)
    a.release()
    h.tick()
    assert.is_true(lo.done)
  end))

  it("waits for the weight on a KeyedSemaphore key", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local _, r = ks:acquire("k", 1)
    local heavy = h.waiter(nil, "heavy", ks, "k", 2)
    local light = h.waiter(nil, "light", ks, "k", 1)
    h.tick()
    assert.is_false(heavy.done)
    assert.is_true(light.done)
    local completed = h.without_yield(function() ks:waitForUnlock("other", 2) end)
    assert.is_true(completed)
    r()
    h.tick()
    assert.is_true(heavy.ok)
  end))
end)


describe("isLocked and release by key", function()
  it("reports each key on its own", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "a")
    assert.is_true(km:isLocked("a"))
    assert.is_false(km:isLocked("b"))
    r()
    assert.is_false(km:isLocked("a"))
  end))

  it("KeyedMutex:release(key) frees that key only, handing it to its next waiter", h.async(function()
    local km, _ = h.held(am.KeyedMutex.new(), "acquire", "a")
    local _b = km:acquire("b")
    local w = h.acquirer(nil, "w", km, "a")
    km:release("a")
    assert.is_true(km:isLocked("b"))
    h.tick()
    assert.is_true(w.ok)
    km:release("a")
    km:release("b")
    assert.is_false(km:isLocked("a"))
    assert.equal(0, km:count())
  end))

  it("KeyedMutex:release(key) on a free key does nothing (a key never has two owners)", h.async(function()
    local km = am.KeyedMutex.new()
    km:release("k")
    km:release("k")
    assert.equal(0, km:count())
    local r = km:acquire("k")
    local w = h.acquirer(nil, "w", km, "k")
    h.tick()
    assert.is_false(w.done)
    r()
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))

  it("a releaser is spent once: an old one does not free the key's next holder", h.async(function()
    local km, r1 = h.held(am.KeyedMutex.new(), "acquire", "k")
    r1()
    local r2 = km:acquire("k")
    local w = h.acquirer(nil, "w", km, "k")
    r1()
    h.tick()
    assert.is_false(w.done)
    assert.is_true(km:isLocked("k"))
    r2()
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))

  it("a releaser whose holding was ended by release(key) does not free the next holder", h.async(function()
    local km, r1 = h.held(am.KeyedMutex.new(), "acquire", "k")
    km:release("k")                           -- unscoped: the key is free
    assert.equal(0, km:count())
    local r2 = km:acquire("k")
    local w = h.acquirer(nil, "w", km, "k")
    r1()                                        -- must not release r2's holding
    h.tick()
    assert.is_false(w.done)
    assert.is_true(km:isLocked("k"))
    r2()
    h.tick()
    assert.is_true(w.ok)
    w.release()
    assert.equal(0, km:count())
  end))

  it("KeyedSemaphore:release(key, w) adds to the key's value; the key stays until it is back", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    local _, r = ks:acquire("k")
    local w = h.acquirer(nil, "w", ks, "k", 2)
    ks:release("k", 2)                          -- value 0 + 2: w granted
    h.tick()
    assert.is_true(w.ok)
    assert.equal(2, w.value)
    assert.equal(0, ks:getValue("k"))
    ks:release("idle", 3)
    assert.equal(4, ks:getValue("idle"))
    assert.same({ "string:idle", "string:k" }, h.keys_of(ks))
    local v, r2 = ks:acquire("idle", 3)
    assert.equal(4, v)
    r2()
    r(); w.release()
  end))

  it("rejects a bad weight to KeyedSemaphore:release and changes nothing", h.left_free(am.KeyedSemaphore.new, 1, function(ks)
    assert.equal("bad argument #2 to 'release' (weight must be a positive integer)",
      E(function() ks:release("k", 0) end))
    assert.equal("bad argument #2 to 'release' (weight must be a positive integer)",
      E(function() ks:release("k", 1.5) end))
    assert.equal(1, ks:getValue("k"))
  end))
end)


describe("cancel on a keyed lock", function()
  it("cancel(key) rejects that key's queued acquirers with exactly am.E_CANCELED", h.left_free(am.KeyedMutex.new, function(km)
    local ra, rb = km:acquire("a"), km:acquire("b")
    local a1 = h.acquirer(nil, "a1", km, "a")
    local a2 = h.acquirer(nil, "a2", km, "a", 9)
    local b1 = h.acquirer(nil, "b1", km, "b")
    km:cancel("a")
    assert.same({ 0, 0 }, { km:waiting("a") })
    assert.same({ 1, 0 }, { km:waiting("b") })
    h.tick()
    assert.equal(am.E_CANCELED, a1.err)
    assert.equal(am.E_CANCELED, a2.err)
    assert.is_false(b1.done)
    assert.is_true(km:isLocked("a"))           -- the holder keeps it
    ra()
    assert.is_false(km:isLocked("a"))
    rb()
    h.tick()
    assert.is_true(b1.ok)
    b1.release()
  end))

  it("cancel() rejects the queued acquirers of every key and keeps the holders", h.left_free(am.KeyedMutex.new, function(km)
    local rs, ws = {}, {}
    for i = 1, 5 do
      rs[i] = km:acquire(i)
      ws[i] = { h.acquirer(nil, "x", km, i), h.acquirer(nil, "y", km, i, -1) }
    end
    local lone = km:acquire("no waiters")
    km:cancel()
    h.tick()
    for i = 1, 5 do
      assert.equal(am.E_CANCELED, ws[i][1].err)
      assert.equal(am.E_CANCELED, ws[i][2].err)
      assert.same({ 0, 0 }, { km:waiting(i) })
      assert.is_true(km:isLocked(i))
    end
    assert.equal(6, km:count())
    for i = 1, 5 do rs[i]() end
    lone()
  end))

  it("cancel of a key without a lock, or of an empty set, does nothing", h.left_free(am.KeyedMutex.new, function(km)
    km:cancel("nothing")
    km:cancel()
  end))

  it("raises the custom cancelError unchanged", h.async(function()
    local e = setmetatable({}, { __tostring = function() return "shutting down" end })
    local ks = am.KeyedSemaphore.new(1, { cancelError = e })
    local _, r = ks:acquire("k")
    local w = h.acquirer(nil, "w", ks, "k")
    ks:cancel()
    h.tick()
    assert.is_true(rawequal(e, w.err))
    r()
  end))

  it("does not reject waitForUnlock waiters, and re-evaluates them (P4)", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    local heavy = h.acquirer(nil, "heavy", ks, "k", 2)     -- can never be granted
    local w = h.waiter(nil, "w", ks, "k", 1)               -- waits behind it
    h.tick()
    assert.is_false(w.done)
    assert.same({ 1, 1 }, { ks:waiting("k") })
    ks:cancel("k")
    h.tick()
    assert.equal(am.E_CANCELED, heavy.err)
    assert.is_true(w.ok)
    assert.equal(0, ks:count())                 -- idle: gone
  end))
end)


describe("the releaser of a keyed lock", function()
  it("is callable, once, and to-be-closed", h.left_free(am.KeyedMutex.new, function(km)
    do
      local r <close> = km:acquire("k")
      assert.is_true(km:isLocked("k"))
      assert.matches("^async_mutex%.Releaser %(held%)", tostring(r))
    end
    assert.is_false(km:isLocked("k"))
  end))

  it("releases when an error leaves the scope", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local e = {}
    local ok, err = pcall(function()
      local _, r <close> = ks:acquire("k", 2)
      h.sleep(1)
      error(e)
    end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.equal(2, ks:getValue("k"))
  end))

  it("releases when the holding coroutine is closed", h.left_free(am.KeyedMutex.new, function(km)
    local co = h.spawn(function()
      local r <close> = km:acquire("k")
      coroutine.yield()
    end)
    assert.is_true(km:isLocked("k"))
    assert.is_true(coroutine.close(co))
    assert.is_false(km:isLocked("k"))
  end))

  it("a coroutine closed while queued never gets the key; the next one does", h.async(function()
    local km = am.KeyedMutex.new()
    local base = am.pending()
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    local b = h.acquirer(nil, "b", km, "k")
    assert.same({ 2, 0 }, { km:waiting("k") })
    assert.is_true(coroutine.close(a.co))
    assert.same({ 1, 0 }, { km:waiting("k") })
    r()
    h.tick()
    assert.is_false(a.done)
    assert.is_true(b.ok)
    b.release()
    assert.equal(0, km:count())
    assert.equal(base, am.pending())
  end))

  it("a coroutine closed while it is the only waiter of a key lets the key go", h.left_free(am.KeyedSemaphore.new, 1, function(ks)
    local w = h.acquirer(nil, "w", ks, "k", 2)          -- more than a key ever has
    assert.equal(1, ks:count())
    assert.is_true(coroutine.close(w.co))
  end))
end)


describe("maxPending", function()
  it("raises am.E_MAX_PENDING at once, without queuing, beyond that many acquirers per key", h.left_free(am.KeyedMutex.new, { maxPending = 2 }, function(km)
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    local b = h.acquirer(nil, "b", km, "k", 5)
    local completed, res = h.try_now(function() km:acquire("k") end)
    assert.is_true(completed)                      -- no yield
    assert.is_false(res[1])
    assert.equal(am.E_MAX_PENDING, res[2])         -- the value itself, level 0
    assert.equal("too many pending requests for this key", am.E_MAX_PENDING)
    assert.same({ 2, 0 }, { km:waiting("k") })
    -- a high priority does not get around it either
    completed, res = h.try_now(function() km:acquire("k", 100) end)
    assert.is_true(completed)
    assert.equal(am.E_MAX_PENDING, res[2])
    -- other keys have their own bound
    local rs = { km:acquire("other") }
    rs[2] = h.acquirer(nil, "o1", km, "other")
    rs[3] = h.acquirer(nil, "o2", km, "other")
    assert.same({ 2, 0 }, { km:waiting("other") })
    r()
    h.tick()
    assert.is_true(b.ok)                           -- the queue moved on: room for one
    local c = h.acquirer(nil, "c", km, "k")
    assert.is_false(c.done)
    assert.same({ 2, 0 }, { km:waiting("k") })
    b.release(); h.tick(); a.release(); h.tick(); c.release()
    rs[1](); h.tick(); rs[2].release(); h.tick(); rs[3].release()
  end))

  it("never refuses a request that is granted at once", h.left_free(am.KeyedSemaphore.new, 3, { maxPending = 1 }, function(ks)
    local _, r = ks:acquire("k", 1)
    local heavy = h.acquirer(nil, "heavy", ks, "k", 3)        -- 1 queued
    local completed, res = h.try_now(function() return ks:acquire("k", 1, 1) end)
    assert.is_true(completed)
    assert.is_true(res[1])                       -- priority 1 skips the heavy head
    res[3]()
    r()
    h.tick()
    assert.is_true(heavy.ok)
    heavy.release()
  end))

  it("does not count timed-out waiters", h.left_free(am.KeyedMutex.new, { maxPending = 2 }, function(km)
    local r = km:acquire("k")
    local wt = am.withTimeout(km, 10)
    local t1 = h.acquirer(nil, "t1", wt, "k")
    local t2 = h.acquirer(nil, "t2", wt, "k")
    assert.equal(am.E_MAX_PENDING, select(2, pcall(function() km:acquire("k") end)))
    h.sleep(30)
    h.tick()                                     -- their resumes are deferred
    assert.equal(am.E_TIMEOUT, t1.err)
    assert.equal(am.E_TIMEOUT, t2.err)
    assert.same({ 0, 0 }, { km:waiting("k") })
    local a = h.acquirer(nil, "a", km, "k")
    local b = h.acquirer(nil, "b", km, "k")
    assert.is_false(a.done)
    assert.is_false(b.done)                      -- queued, not refused
    r(); h.tick(); a.release(); h.tick(); b.release()
  end))

  it("does not count canceled waiters", h.left_free(am.KeyedMutex.new, { maxPending = 1 }, function(km)
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    km:cancel("k")
    local b = h.acquirer(nil, "b", km, "k")      -- at once, before a was resumed
    assert.is_false(b.done)
    assert.same({ 1, 0 }, { km:waiting("k") })
    h.tick()
    assert.equal(am.E_CANCELED, a.err)
    km:cancel()
    local c = h.acquirer(nil, "c", km, "k")
    assert.is_false(c.done)
    h.tick()
    assert.equal(am.E_CANCELED, b.err)
    r(); h.tick(); c.release()
  end))

  it("does not count waiters whose coroutine was closed", h.left_free(am.KeyedMutex.new, { maxPending = 1 }, function(km)
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    coroutine.close(a.co)
    local b = h.acquirer(nil, "b", km, "k")
    assert.is_false(b.done)
    r(); h.tick(); b.release()
  end))

  it("does not count waitForUnlock waiters, and does not bound them", h.left_free(am.KeyedMutex.new, { maxPending = 1 }, function(km)
    local r = km:acquire("k")
    local us = {}
    for i = 1, 3 do us[i] = h.waiter(nil, "u", km, "k") end
    assert.same({ 0, 3 }, { km:waiting("k") })
    local a = h.acquirer(nil, "a", km, "k")
    assert.is_false(a.done)
    r(); h.tick(); a.release(); h.tick()
    for i = 1, 3 do assert.is_true(us[i].ok) end
  end))

  it("is unbounded at 0, the default", h.async(function()
    for _, km in ipairs({ am.KeyedMutex.new(), am.KeyedMutex.new({ maxPending = 0 }) }) do
      local r = km:acquire("k")
      local ws = {}
      for i = 1, 200 do ws[i] = h.acquirer(nil, i, km, "k") end
      assert.same({ 200, 0 }, { km:waiting("k") })
      km:cancel()
      r()
      h.tick()
      for i = 1, 200 do assert.equal(am.E_CANCELED, ws[i].err) end
    end
  end))

  it("raises a custom maxPendingError unchanged", h.async(function()
    local e = { "busy" }
    local ks = am.KeyedSemaphore.new(1, { maxPending = 1, maxPendingError = e })
    local _, r = ks:acquire("k")
    local a = h.acquirer(nil, "a", ks, "k")
    local ok, err = pcall(function() ks:acquire("k", 1) end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    r(); h.tick(); a.release()
  end))

  it("applies to withTimeout requests at once (not after the timeout), not to tryAcquire", h.left_free(am.KeyedMutex.new, { maxPending = 1 }, function(km)
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    local wt = am.withTimeout(km, 1000)
    local completed, res = h.try_now(function() wt:acquire("k") end)
    assert.is_true(completed)
    assert.equal(am.E_MAX_PENDING, res[2])
    completed, res = h.try_now(function() am.tryAcquire(km):acquire("k") end)
    assert.is_true(completed)
    assert.equal(am.E_ALREADY_LOCKED, res[2])
    r(); h.tick(); a.release()
  end))

  it("applies to runExclusive, which then does not call fn", h.async(function()
    local km = am.KeyedMutex.new({ maxPending = 1 })
    local r = km:acquire("k")
    local a = h.acquirer(nil, "a", km, "k")
    local called = false
    local ok, err = pcall(km.runExclusive, km, "k", function() called = true end)
    assert.same({ false, am.E_MAX_PENDING }, { ok, err })
    assert.is_false(called)
    r(); h.tick(); a.release()
  end))
end)


describe("withTimeout on a keyed lock", function()
  it("raises E_TIMEOUT for a held key, removes the request, and leaves other keys alone", h.left_free(am.KeyedMutex.new, function(km)
    local wt = am.withTimeout(km, 20)
    local r = km:acquire("k")
    local t0 = uv.now()
    local ok, err = pcall(function() wt:acquire("k") end)
    assert.same({ false, am.E_TIMEOUT }, { ok, err })
    assert.is_true(uv.now() - t0 >= 19)
    assert.same({ 0, 0 }, { km:waiting("k") })
    local completed, res = h.without_yield(function() return wt:acquire("other") end)
    assert.is_true(completed)
    res[1]()
    r()
    assert.is_false(km:isLocked("k"))            -- no phantom owner (P1)
  end))

  it("grants within the time and raises a custom error unchanged", h.left_free(am.KeyedSemaphore.new, 1, function(ks)
    local e = {}
    local wt = am.withTimeout(ks, 50, e)
    local _, r = ks:acquire("k")
    h.spawn(function() h.sleep(5); r() end)
    local v, r2 = wt:acquire("k")
    assert.equal(1, v)
    local ok, err = pcall(function() wt:acquire("k") end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    r2()
  end))

  it("bounds waitForUnlock and runExclusive per key", h.left_free(am.KeyedMutex.new, function(km)
    local wt = am.withTimeout(km, 10)
    local r = km:acquire("k")
    local ok, err = pcall(function() wt:waitForUnlock("k") end)
    assert.same({ false, am.E_TIMEOUT }, { ok, err })
    local called = false
    ok, err = pcall(function() wt:runExclusive("k", function() called = true end) end)
    assert.same({ false, am.E_TIMEOUT }, { ok, err })
    assert.is_false(called)
    assert.same({ 0, 0 }, { km:waiting("k") })
    assert.equal(7, wt:runExclusive("free", function() return 7 end))
    r()
  end))

  it("forwards isLocked, release, cancel, getValue, count, waiting and keys", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    local wt = am.withTimeout(ks, 1000)
    local _, r = wt:acquire("k")
    local w = h.acquirer(nil, "w", ks, "k")
    assert.is_true(wt:isLocked("k"))
    assert.equal(0, wt:getValue("k"))
    assert.equal(1, wt:count())
    assert.same({ 1, 0 }, { wt:waiting("k") })
    assert.same({ "k" }, wt:keys())
    wt:cancel("k")
    h.tick()
    assert.equal(am.E_CANCELED, w.err)
    wt:release("k")
    assert.equal(0, wt:count())
    r()                                         -- that holding was already ended
  end))
end)


describe("tryAcquire on a keyed lock", function()
  it("takes a free key without yielding, and refuses a held one at once with no trace", h.left_free(am.KeyedMutex.new, function(km)
    local ta = am.tryAcquire(km)
    local completed = h.without_yield(function() return ta:acquire("k") end)
    assert.is_true(completed)
    local w = h.acquirer(nil, "w", km, "k")
    local res
    completed, res = h.try_now(function() ta:acquire("k") end)
    assert.is_true(completed)
    assert.same({ false, am.E_ALREADY_LOCKED }, { res[1], res[2] })
    assert.same({ 1, 0 }, { km:waiting("k") })
    km:release("k")
    h.tick()
    assert.is_true(w.ok)
    w.release()
  end))

  it("leaves no lock behind when refusing a weight a fresh key cannot cover", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local ta = am.tryAcquire(ks, "busy")
    local completed, res = h.try_now(function() ta:acquire("k", 3) end)
    assert.is_true(completed)
    assert.same({ false, "busy" }, { res[1], res[2] })
    completed, res = h.try_now(function() ta:waitForUnlock("k", 3) end)
    assert.is_true(completed)
    assert.same({ false, "busy" }, { res[1], res[2] })
  end))

  it("waitForUnlock returns when the key could be taken now, raises otherwise", h.left_free(am.KeyedMutex.new, function(km)
    local ta = am.tryAcquire(km)
    assert.is_true((h.without_yield(function() ta:waitForUnlock("k") end)))
    local r = km:acquire("k")
    local completed, res = h.try_now(function() ta:waitForUnlock("k") end)
    assert.is_true(completed)
    assert.same({ false, am.E_ALREADY_LOCKED }, { res[1], res[2] })
    assert.same({ 0, 0 }, { km:waiting("k") })
    r()
  end))
end)


describe("bad input to keyed locks", function()
  local NIL = "(key must not be nil)"
  local NAN = "(key must not be NaN)"

  it("refuses a nil or NaN key with the exact message, and changes nothing", h.async(function()
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(2)
    local base = am.pending()
    assert.equal("bad argument #1 to 'acquire' " .. NIL, E(function() km:acquire(nil) end))
    assert.equal("bad argument #1 to 'acquire' " .. NIL, E(function() km:acquire() end))
    assert.equal("bad argument #1 to 'acquire' " .. NAN, E(function() km:acquire(0 / 0) end))
    assert.equal("bad argument #1 to 'acquire' " .. NIL, E(function() ks:acquire(nil, 1) end))
    assert.equal("bad argument #1 to 'acquire' " .. NAN, E(function() ks:acquire(0 / 0) end))
    assert.equal("bad argument #1 to 'waitForUnlock' " .. NIL, E(function() km:waitForUnlock() end))
    assert.equal("bad argument #1 to 'isLocked' " .. NIL, E(function() km:isLocked() end))
    assert.equal("bad argument #1 to 'isLocked' " .. NAN, E(function() ks:isLocked(0 / 0) end))
    assert.equal("bad argument #1 to 'getValue' " .. NIL, E(function() ks:getValue() end))
    assert.equal("bad argument #1 to 'release' " .. NIL, E(function() km:release() end))
    assert.equal("bad argument #1 to 'release' " .. NAN, E(function() ks:release(0 / 0) end))
    assert.equal("bad argument #1 to 'waiting' " .. NIL, E(function() km:waiting() end))
    assert.equal("bad argument #1 to 'cancel' " .. NAN, E(function() km:cancel(0 / 0) end))
    assert.equal("bad argument #1 to 'runExclusive' " .. NIL,
      E(function() km:runExclusive(nil, function() end) end))
    assert.equal("bad argument #1 to 'acquire' " .. NIL, E(function() am.withTimeout(km, 5):acquire(nil) end))
    assert.equal("bad argument #1 to 'acquire' " .. NAN, E(function() am.tryAcquire(ks):acquire(0 / 0) end))
    assert.equal(0, km:count())
    assert.equal(0, ks:count())
    assert.equal(base, am.pending())
  end))

  it("checks the key before anything else, even outside a coroutine", function()
    local km = am.KeyedMutex.new()
    assert.equal("bad argument #1 to 'acquire' " .. NIL, E(function() km:acquire(nil) end))
  end)

  it("refuses bad options with the exact message", function()
    local NEG = "(maxPending must be a non-negative integer)"
    assert.equal("bad argument #1 to 'new' " .. NEG, E(function() am.KeyedMutex.new({ maxPending = -1 }) end))
    assert.equal("bad argument #1 to 'new' " .. NEG, E(function() am.KeyedMutex.new({ maxPending = 1.5 }) end))
    assert.equal("bad argument #1 to 'new' " .. NEG, E(function() am.KeyedMutex.new({ maxPending = "2" }) end))
    assert.equal("bad argument #1 to 'new' " .. NEG, E(function() am.KeyedMutex.new({ maxPending = 0 / 0 }) end))
    assert.equal("bad argument #2 to 'new' " .. NEG, E(function() am.KeyedSemaphore.new(1, { maxPending = -1 }) end))
    assert.equal("bad argument #1 to 'new' (table expected, got string)",
      E(function() am.KeyedMutex.new("x") end))
    assert.equal("bad argument #2 to 'new' (table expected, got number)",
      E(function() am.KeyedSemaphore.new(1, 5) end))
    assert.equal("bad argument #1 to 'new' (number expected, got no value)",
      E(function() am.KeyedSemaphore.new() end))
    assert.equal("bad argument #1 to 'new' (number has no integer representation)",
      E(function() am.KeyedSemaphore.new(1.5) end))
  end)

  it("refuses bad weights and priorities with the exact message", h.async(function()
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(2)
    local W = "(weight must be a positive integer)"
    assert.equal("bad argument #2 to 'acquire' " .. W, E(function() ks:acquire("k", 0) end))
    assert.equal("bad argument #2 to 'acquire' " .. W, E(function() ks:acquire("k", 1.5) end))
    assert.equal("bad argument #2 to 'waitForUnlock' " .. W, E(function() ks:waitForUnlock("k", -1) end))
    assert.equal("bad argument #2 to 'acquire' (priority must be a number, got string)",
      E(function() km:acquire("k", "high") end))
    assert.equal("bad argument #3 to 'acquire' (priority must be a number, got table)",
      E(function() ks:acquire("k", 1, {}) end))
    assert.equal(0, km:count())
    assert.equal(0, ks:count())
  end))

  it("refuses calls without a keyed lock as self", h.async(function()
    local km = am.KeyedMutex.new()
    local m = am.Mutex.new()
    assert.is_false((pcall(km.acquire, m, "k")))
    assert.is_false((pcall(km.count, {})))
    assert.is_false((pcall(km.acquireAll, m, { "k" })))
    assert.is_false(m:isLocked())
  end))
end)
