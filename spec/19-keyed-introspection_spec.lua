-- What a keyed set shows of its keys (tostring, count, waiting, keys) and
-- the lifetime behind it: a key has a lock while it is held, waited on, or
-- off its initial value, and never two (docs/semantics.md, Keyed locks).
local h = require "helpers"
local am = require "async_mutex"

describe("tostring of a keyed set", function()
  it("make empty sets whose tostring names the type and the keys in use", h.async(function()
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(3)
    assert.matches("^async_mutex%.KeyedMutex %(0 keys in use%): 0x%x+$", tostring(km))
    assert.matches("^async_mutex%.KeyedSemaphore %(0 keys in use%): 0x%x+$", tostring(ks))
    local r1, r2 = km:acquire("a"), km:acquire("b")
    assert.matches("^async_mutex%.KeyedMutex %(2 keys in use%)", tostring(km))
    r1(); r2()
    assert.equal(0, km:count())
    assert.same({}, km:keys())
  end))
end)


describe("count, waiting and keys", function()
  it("count the keys held or waited on, and drop a key as soon as it is idle", h.async(function()
    local km = am.KeyedMutex.new()
    assert.equal(0, km:count())
    local r1 = km:acquire("a")
    local r2 = km:acquire(2)
    local w = h.acquirer(nil, "w", km, "a")
    local u = h.waiter(nil, "u", km, 2)
    assert.equal(2, km:count())
    assert.same({ "number:2", "string:a" }, h.keys_of(km))
    assert.same({ 1, 0 }, { km:waiting("a") })
    assert.same({ 0, 1 }, { km:waiting(2) })
    assert.same({ 0, 0 }, { km:waiting("unknown") })
    r1()                                        -- handed over to w
    assert.equal(2, km:count())
    r2()                                        -- u resolved: 2 is idle
    assert.equal(1, km:count())
    assert.same({ "string:a" }, h.keys_of(km))
    h.tick()
    assert.is_true(u.ok)
    w.release()
    assert.equal(0, km:count())
    assert.same({}, km:keys())
  end))

  it("keys() returns a new array each time", h.async(function()
    local km, r = h.held(am.KeyedMutex.new(), "acquire", "a")
    local k1, k2 = km:keys(), km:keys()
    assert.are_not.equal(k1, k2)
    k1[1] = "changed"
    assert.same({ "a" }, km:keys())
    r()
  end))

  it("waiting(key) returns exactly two numbers", h.async(function()
    local km = am.KeyedMutex.new()
    assert.equal(2, select("#", km:waiting("x")))
  end))
end)


describe("the same key is never served by two locks", function()
  it("keeps a held key's lock through full collections", h.async(function()
    local km = am.KeyedMutex.new()
    for round = 1, 20 do
      local key = (round % 2 == 0) and ("k" .. round) or { round }
      local holder = h.acquirer(nil, "holder", km, key)
      assert.is_true(holder.ok)
      h.gc()
      local w = h.acquirer(nil, "w", km, key)
      h.gc()
      h.tick()
      assert.is_false(w.done, "a second lock served the key in round " .. round)
      assert.is_true(km:isLocked(key))
      holder.release()
      h.gc()
      h.tick()
      assert.is_true(w.ok)
      local x = h.acquirer(nil, "x", km, key)
      h.gc()
      assert.is_false(x.done)
      w.release()
      h.tick()
      assert.is_true(x.ok)
      x.release()
      assert.equal(0, km:count())
    end
  end, { deadline = 30000 }))  -- 80 full collections of the suite's heap:
                               -- over 5 s on a loaded 2-core machine

  it("keeps a waited-on key's lock when nobody but the set refers to it", h.left_free(am.KeyedMutex.new, function(km)
    -- the holder's releaser lives only in a suspended coroutine
    local release_now = false
    local co = h.spawn(function()
      local r <close> = km:acquire("k")
      while not release_now do h.sleep(1) end
    end)
    local u = h.waiter(nil, "u", km, "k")
    h.gc()
    local w = h.acquirer(nil, "w", km, "k")
    h.gc()
    h.sleep(3)
    assert.is_false(w.done)
    assert.is_false(u.done)
    release_now = true
    h.wait_until(function() return coroutine.status(co) == "dead" end)
    h.tick()
    assert.is_true(w.ok)
    assert.is_false(u.done)                      -- not before the queued w
    w.release()
    h.tick()
    assert.is_true(u.ok)
  end))

  it("no update is lost when many coroutines read-modify-write one key with collections in between", h.left_free(am.KeyedMutex.new, function(km)
    local stock = { a = 0, b = 0 }
    local done = 0
    for i = 1, 40 do
      h.spawn(function()
        local key = (i % 2 == 0) and "a" or "b"
        local r <close> = km:acquire(key)
        local v = stock[key]
        if i % 7 == 0 then collectgarbage("collect") end
        h.sleep(i % 3)
        stock[key] = v + 1
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 40 end, 3000)
    assert.same({ a = 20, b = 20 }, stock)
  end))
end)


-- A KeyedSemaphore key is held while a grant is out, whatever its value:
-- one that starts at 0 (a gate opened by release) or that was raised above
-- its initial value can be held with its value back at the initial one.
describe("a held KeyedSemaphore key keeps its lock", function()
  it("keeps the permit a holder gives back on a key that starts at 0", h.async(function()
    local ks = am.KeyedSemaphore.new(0)
    local s = am.Semaphore.new(0)                  -- the single-lock rule
    local consumer = h.acquirer(nil, "consumer", ks, "x")
    local single = h.acquirer(nil, "single", s)
    ks:release("x")
    s:release()
    h.tick()
    assert.is_true(consumer.ok)
    assert.is_true(single.ok)
    assert.equal(1, ks:count())                    -- held
    consumer.release()
    single.release()
    assert.equal(s:getValue(), ks:getValue("x"))   -- 1: the permit is back
    local completed = h.without_yield(function() return ks:acquire("x") end)
    assert.is_true(completed)
  end))

  it("does not serve a key by a second lock after the value came back to its initial one", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    ks:release("y")                                -- 2 permits for y
    local _, r1 = ks:acquire("y")                  -- held, value 1
    assert.is_false((pcall(function() am.tryAcquire(ks):acquire("y", 2) end)))
    assert.equal(1, ks:count())                    -- still held by r1
    local _, r2 = ks:acquire("y")                  -- the second permit
    local w = h.acquirer(nil, "w", ks, "y")
    assert.is_false(w.done)
    r1()                                           -- gives a permit to w
    h.tick()
    assert.is_true(w.ok)
    w.release(); r2()
  end))
end)
