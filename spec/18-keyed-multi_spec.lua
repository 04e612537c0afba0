-- Keyed locks, several keys at once: acquireAll and runExclusiveAll take a
-- set of keys all or nothing, in one canonical order, so that overlapping
-- sets never deadlock (docs/semantics.md, Keyed locks); through withTimeout
-- one deadline bounds the whole set.  Random interleavings of them under
-- load are in 33-keyed-stress_spec.lua.
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

local E = h.error_of

describe("acquireAll", function()
  it("takes every key of the set and returns one releaser, callable once and to-be-closed", h.left_free(am.KeyedMutex.new, function(km)
    local completed, res = h.without_yield(function() return km:acquireAll({ "a", 2, true }) end)
    assert.is_true(completed)
    local r = res[1]
    assert.equal(3, km:count())
    for _, k in ipairs({ "a", 2, true }) do assert.is_true(km:isLocked(k)) end
    assert.is_true(r())                           -- as every releaser: it ended the hold
    assert.equal(0, km:count())
    local again = km:acquire("a")
    assert.is_false(r())                          -- spent: does not free "a"
    assert.is_true(km:isLocked("a"))
    again()
    do
      local all <close> = km:acquireAll({ "x", "y" })
      assert.equal(2, km:count())
    end
  end))

  it("ignores duplicates, 1 and 1.0 included", h.async(function()
    local km = am.KeyedMutex.new()
    local r = km:acquireAll({ "a", 1, "a", 1.0, 1 })
    assert.same({ "number:1", "string:a" }, h.keys_of(km))
    r()
    assert.equal(0, km:count())
    local ks = am.KeyedSemaphore.new(2)
    local r2 = ks:acquireAll({ "a", "a" })         -- one permit, not two
    assert.equal(1, ks:getValue("a"))
    r2()
    assert.equal(2, ks:getValue("a"))
  end))

  it("takes the keys in canonical order, whatever order the caller gives", h.async(function()
    local km, ra = h.held(am.KeyedMutex.new(), "acquire", "a")
    local done = false
    h.spawn(function()
      local r = km:acquireAll({ "c", "b", "a" })   -- canonical: a, b, c
      done = true
      r()
    end)
    h.tick()
    assert.is_false(done)
    assert.is_false(km:isLocked("b"))              -- nothing after "a" taken yet
    assert.is_false(km:isLocked("c"))
    ra()
    h.tick()
    assert.is_true(done)
    assert.equal(0, km:count())
  end))

  it("orders booleans, then numbers, then strings, then other values", h.async(function()
    local km = am.KeyedMutex.new()
    local t = {}
    local function blocks_on(first, rest)
      local r = km:acquire(first)
      local done = false
      h.spawn(function()
        local keys = { t, "s", 10, true, -1.5, false }
        local ra = km:acquireAll(keys)
        done = true
        ra()
      end)
      h.tick()
      assert.is_false(done)
      for _, k in ipairs(rest) do
        assert.is_false(km:isLocked(k), "took " .. tostring(k) .. " before " .. tostring(first))
      end
      r()
      h.tick()
      assert.is_true(done)
      assert.equal(0, km:count())
    end
    blocks_on(false, { true, -1.5, 10, "s", t })
    blocks_on(-1.5, { 10, "s", t })
    blocks_on("s", { t })
  end))

  it("never deadlocks two callers giving the same keys in opposite orders", h.left_free(am.KeyedMutex.new, function(km)
    local finished = 0
    local function transfer(keys)
      for _ = 1, 5 do
        local r <close> = km:acquireAll(keys)
        h.sleep(1)
      end
      finished = finished + 1
    end
    h.spawn(transfer, { "a", "b" })
    h.spawn(transfer, { "b", "a" })
    h.spawn(transfer, { 1, "b" })
    h.spawn(transfer, { "a", 1 })
    h.wait_until(function() return finished == 4 end, 2000, "a deadlock")
  end))

  it("passes priority to every key (KeyedMutex) and weight and priority (KeyedSemaphore)", h.async(function()
    local km = am.KeyedMutex.new()
    local log = {}
    local r = km:acquireAll({ 1, 2 })
    local low = h.acquirer(log, "low", km, 1)       -- 1 comes first
    h.spawn(function()
      local ra = km:acquireAll({ 2, 1 }, 5)
      log[#log + 1] = "high"
      ra()
    end)
    r()
    h.tick(3)
    assert.same({ "high", "low" }, log)
    low.release()
    assert.equal(0, km:count())

    local ks = am.KeyedSemaphore.new(3)
    local ra = ks:acquireAll({ "x", "y" }, 2)
    assert.same({ 1, 1 }, { ks:getValue("x"), ks:getValue("y") })
    ra()
    assert.same({ 3, 3 }, { ks:getValue("x"), ks:getValue("y") })
    assert.equal(0, ks:count())
  end))

  it("holds nothing after a cancel while waiting for a later key", h.left_free(am.KeyedMutex.new, function(km)
    local r2 = km:acquire(2)
    local got
    h.spawn(function() got = table.pack(pcall(km.acquireAll, km, { 2, 1, 3 })) end)
    assert.is_true(km:isLocked(1))               -- 1 taken, waiting for 2
    assert.is_false(km:isLocked(3))
    km:cancel(2)
    h.tick()
    assert.same({ false, am.E_CANCELED }, { got[1], got[2] })
    assert.is_false(km:isLocked(1))
    assert.is_false(km:isLocked(3))
    assert.equal(1, km:count())
    r2()
  end))

  it("holds nothing after its coroutine is closed while waiting", h.async(function()
    local km = am.KeyedMutex.new()
    local base = am.pending()
    local r = km:acquire("b")
    local co = h.spawn(function() km:acquireAll({ "a", "b", "c" }) end)
    assert.is_true(km:isLocked("a"))
    assert.is_true(coroutine.close(co))
    assert.is_false(km:isLocked("a"))
    assert.same({ 0, 0 }, { km:waiting("b") })
    r()
    assert.equal(0, km:count())
    assert.equal(base, am.pending())
  end))

  it("releases every key when the coroutine holding them is closed", h.left_free(am.KeyedMutex.new, function(km)
    local co = h.spawn(function()
      local r <close> = km:acquireAll({ "a", "b" })
      coroutine.yield()
    end)
    assert.equal(2, km:count())
    coroutine.close(co)
  end))

  it("holds nothing after a request beyond maxPending on a later key", h.left_free(am.KeyedMutex.new, { maxPending = 1 }, function(km)
    local r = km:acquire(2)
    local x = h.acquirer(nil, "x", km, 2)
    local ok, err = pcall(function() km:acquireAll({ 1, 2 }) end)
    assert.same({ false, am.E_MAX_PENDING }, { ok, err })
    assert.is_false(km:isLocked(1))
    r(); h.tick(); x.release()
  end))

  it("holds nothing after a bad weight, and raises before taking anything", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local ok = pcall(function() ks:acquireAll({ "a", "b" }, 0) end)
    assert.is_false(ok)
  end))

  it("waits for a KeyedSemaphore's weight on each key", h.left_free(am.KeyedSemaphore.new, 2, function(ks)
    local _, r = ks:acquire("b", 1)
    local done = false
    h.spawn(function() local ra = ks:acquireAll({ "b", "a" }, 2); done = true; ra() end)
    h.tick()
    assert.is_false(done)
    assert.equal(0, ks:getValue("a"))             -- "a" comes first and is held
    r()
    h.tick()
    assert.is_true(done)
  end))
end)


describe("runExclusiveAll", function()
  it("runs fn holding every key, returns all its results, and releases", h.left_free(am.KeyedMutex.new, function(km)
    local nargs
    local res = table.pack(km:runExclusiveAll({ "b", "a" }, function(...)
      nargs = select("#", ...)
      assert.is_true(km:isLocked("a") and km:isLocked("b"))
      h.sleep(1)
      return nil, 2, nil
    end))
    assert.equal(0, nargs)
    assert.equal(3, res.n)
    assert.same({ nil, 2, nil }, { res[1], res[2], res[3] })
  end))

  it("releases every key and re-raises fn's error unchanged", h.left_free(am.KeyedSemaphore.new, 1, function(ks)
    local e = {}
    local ok, err = pcall(ks.runExclusiveAll, ks, { 1, 2 }, function() h.sleep(1); error(e) end, 1, 3)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
  end))

  it("refuses a non-callable fn and takes nothing", h.left_free(am.KeyedMutex.new, function(km)
    assert.equal("bad argument #2 to 'runExclusiveAll' (function expected, got nil)",
      E(function() km:runExclusiveAll({ "a" }) end))
  end))
end)


describe("acquireAll through withTimeout", function()
  it("bounds the whole of acquireAll, not each key", h.async(function()
    local km = am.KeyedMutex.new()
    local wt = am.withTimeout(km, 60)
    local r1, r2 = km:acquire(1), km:acquire(2)
    -- a timeout per key would succeed: 1 after 40 ms, 2 after 50 more
    h.spawn(function() h.sleep(40); r1() end)
    h.spawn(function() h.sleep(90); r2() end)
    local t0 = uv.now()
    local ok, err = pcall(function() wt:acquireAll({ 1, 2 }) end)
    local elapsed = uv.now() - t0
    assert.same({ false, am.E_TIMEOUT }, { ok, err })
    assert.is_true(elapsed >= 55, "timed out after " .. elapsed .. " ms")
    assert.is_false(km:isLocked(1))              -- key 1 was given back
    h.wait_until(function() return km:count() == 0 end)
  end))

  it("acquireAll succeeds within the time and times out with nothing held", h.left_free(am.KeyedMutex.new, function(km)
    local wt = am.withTimeout(km, 30)
    local r = km:acquire("c")
    h.spawn(function() h.sleep(5); r() end)
    local ra = wt:acquireAll({ "c", "a", "b" })
    assert.equal(3, km:count())
    local ok, err = pcall(function() wt:acquireAll({ "z", "b" }) end)
    assert.same({ false, am.E_TIMEOUT }, { ok, err })
    assert.is_false(km:isLocked("z"))
    assert.equal(3, km:count())
    ra()
  end))
end)


describe("acquireAll through tryAcquire", function()
  it("acquireAll takes every free key at once, or raises at once holding nothing", h.left_free(am.KeyedMutex.new, function(km)
    local ta = am.tryAcquire(km)
    local completed, res = h.without_yield(function() return ta:acquireAll({ 3, 1, 2 }) end)
    assert.is_true(completed)
    assert.equal(3, km:count())
    res[1]()
    local r = km:acquire(3)
    completed, res = h.try_now(function() ta:acquireAll({ 3, 1, 2 }) end)
    assert.is_true(completed)
    assert.same({ false, am.E_ALREADY_LOCKED }, { res[1], res[2] })
    assert.is_false(km:isLocked(1))
    assert.is_false(km:isLocked(2))
    assert.equal(1, km:count())
    local ran = false
    completed, res = h.try_now(function() ta:runExclusiveAll({ 4, 3 }, function() ran = true end) end)
    assert.is_true(completed)
    assert.same({ false, am.E_ALREADY_LOCKED }, { res[1], res[2] })
    assert.is_false(ran)
    r()
  end))
end)


describe("bad key sets", function()
  it("refuses bad key sets to acquireAll and runExclusiveAll with the exact message", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "held")
    local function msg(f) return "bad argument #1 to '" .. f .. "' " end
    assert.equal(msg("acquireAll") .. "(key set must not be empty)", E(function() km:acquireAll({}) end))
    assert.equal(msg("acquireAll") .. "(table of keys expected, got string)", E(function() km:acquireAll("a") end))
    assert.equal(msg("acquireAll") .. "(table of keys expected, got nil)", E(function() km:acquireAll() end))
    assert.equal(msg("acquireAll") .. "(key #2 must not be nil)", E(function() km:acquireAll({ "a", nil, "b" }) end))
    assert.equal(msg("acquireAll") .. "(key #3 must not be NaN)", E(function() km:acquireAll({ "a", "b", 0 / 0 }) end))
    assert.equal(msg("acquireAll") .. "(key set must not be empty)",
      E(function() am.tryAcquire(km):acquireAll({}) end))
    assert.equal(msg("acquireAll") .. "(key set must not be empty)",
      E(function() am.withTimeout(km, 10):acquireAll({}) end))
    assert.equal(msg("runExclusiveAll") .. "(key set must not be empty)",
      E(function() km:runExclusiveAll({}, function() end) end))
    -- a bad key after a good (and free) one: nothing is taken
    E(function() km:acquireAll({ "free", "held", 0 / 0 }) end)
    assert.same({ "string:held" }, h.keys_of(km))
    r()
    assert.equal(0, km:count())
  end))
end)
