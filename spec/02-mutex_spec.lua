-- Mutex: new, acquire, the releaser, release, isLocked (docs/semantics.md,
-- Grant rule; Release and P3).
local h = require "helpers"
local am = require "async_mutex"

local function range(n)
  local t = {}
  for i = 1, n do t[i] = i end
  return t
end

describe("Mutex.new", function()
  it("creates an unlocked mutex", function()
    local m = am.Mutex.new()
    assert.is_false(m:isLocked())
  end)

  it("accepts a custom cancel error and still starts unlocked", function()
    assert.is_false(am.Mutex.new("custom"):isLocked())
    assert.is_false(am.Mutex.new({}):isLocked())
    assert.is_false(am.Mutex.new(nil):isLocked())
  end)
end)

describe("Mutex:acquire", function()
  it("returns a releaser at once, without yielding, when the mutex is free", h.left_free(am.Mutex.new, function(m)
    local completed, res = h.without_yield(function() return m:acquire() end)
    assert.is_true(completed)
    assert.equal(1, res.n)
    assert.is_true(m:isLocked())
    res[1]()
  end))

  it("returns a callable releaser", h.holding(am.Mutex.new, function(_, r)
    assert.is_truthy(type(r) == "function" or (getmetatable(r) and getmetatable(r).__call))
  end))

  it("makes a second acquirer wait until the holder releases", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    assert.is_false(b.done)
    h.tick(3)
    assert.is_false(b.done)
    r()
    h.tick()
    assert.is_true(b.done)
    assert.is_true(b.ok)
    assert.is_true(m:isLocked())
    b.release()
    assert.is_false(m:isLocked())
  end))

  it("grants waiters one at a time, in arrival order", h.left_free(am.Mutex.new, function(m)
    local log = {}
    local r = m:acquire()
    local ws = {}
    for i = 1, 5 do ws[i] = h.acquirer(log, i, m) end
    assert.same({}, log)
    r()
    for i = 1, 5 do
      h.tick()
      assert.same(range(i), log)
      h.tick()
      assert.same(range(i), log)             -- nobody else while i holds it
      ws[i].release()
    end
  end))

  it("holds the lock across yields of the holder", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    h.spawn(function()
      local r = m:acquire()
      log[#log + 1] = "a in"
      h.sleep(15)
      log[#log + 1] = "a out"
      r()
    end)
    local b = h.acquirer(log, "b", m)
    h.wait_until(function() return b.done end)
    assert.same({ "a in", "a out", "b" }, log)
    b.release()
  end))

  it("keeps a read-modify-write section atomic (the bank withdraw race)", h.async(function()
    local m = am.Mutex.new()
    local balance, results = 100, {}
    local function withdraw(amount)
      local release = m:acquire()
      local b = balance
      h.sleep(5)                               -- simulated I/O
      if b >= amount then
        balance = b - amount
        results[#results + 1] = true
      else
        results[#results + 1] = false
      end
      release()
    end
    h.spawn(withdraw, 80)
    h.spawn(withdraw, 80)
    h.wait_until(function() return #results == 2 end)
    assert.same({ true, false }, results)
    assert.equal(20, balance)
  end))

  it("treats a nil priority as 0", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    local r = m:acquire(nil)
    local a = h.acquirer(log, "a", m, -1)
    local b = h.acquirer(log, "b", m, nil)
    local c = h.acquirer(log, "c", m, 0)
    r()
    h.tick()
    b.release()
    h.tick()
    c.release()
    h.tick()
    a.release()
    assert.same({ "b", "c", "a" }, log)
  end))

  it("is not re-entrant: the holder's second acquire waits like any other", h.left_free(am.Mutex.new, function(m)
    local r1
    local second = false
    h.spawn(function()
      r1 = m:acquire()
      local r2 = m:acquire()
      second = true
      r2()
    end)
    h.tick(2)
    assert.is_false(second)
    r1()
    h.tick()
    assert.is_true(second)
  end))
end)

describe("the Mutex releaser", function()
  it("unlocks the mutex and hands it to the next waiter", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    r()
    h.tick()
    assert.is_true(b.done)
    b.release()
    assert.is_false(m:isLocked())
  end))

  it("only releases on its first call, later calls and arguments are ignored", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    local c = h.acquirer(nil, "c", m)
    r("ignored", 42)                           -- b now owns it
    r()                                        -- must not release b's hold
    r(1)
    h.tick(2)
    assert.is_true(m:isLocked())
    h.check_one_owner(m, b, c)
  end))

  it("can be called from another coroutine than the holder's", h.left_free(am.Mutex.new, function(m)
    local a = h.acquirer(nil, "a", m)
    assert.is_true(a.done)
    h.spawn(function() a.release() end)
  end))
end)

describe("Mutex:release", function()
  it("unlocks a mutex acquired without keeping the releaser", h.left_free(am.Mutex.new, function(m)
    m:acquire()
    assert.is_true(m:isLocked())
    m:release()
  end))

  it("hands the mutex to the next waiter", h.left_free(am.Mutex.new, function(m)
    m:acquire()
    local b = h.acquirer(nil, "b", m)
    m:release()
    assert.is_true(m:isLocked())
    h.tick()
    assert.is_true(b.done)
    m:release()
  end))

  it("is a no-op on an unlocked mutex, so the mutex never admits two owners (P3)", h.async(function()
    local m = am.Mutex.new()
    m:release()
    m:release()
    assert.is_false(m:isLocked())
    h.check_one_owner(m, h.acquirer(nil, "a", m), h.acquirer(nil, "b", m))
  end))

  it("followed by the releaser of the same acquisition does not make the mutex available twice (P3)", h.async(function()
    local m, r = h.held(am.Mutex.new())
    m:release()
    r()                                        -- upstream pushes the value to 2 here
    assert.is_false(m:isLocked())
    h.check_one_owner(m, h.acquirer(nil, "a", m), h.acquirer(nil, "b", m))
  end))

  it("never admits two owners, even when a granted but unresumed waiter is closed afterwards (P3)", h.async(function()
    -- docs/semantics.md (Coroutines and the loop) says what becomes of the
    -- undelivered grant; this asks only that there are never two owners
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    r()                                        -- b granted, not yet resumed
    m:release()                                -- unscoped: releases b's grant
    coroutine.close(b.co)                      -- b never runs
    local c = h.acquirer(nil, "c", m)
    local d = h.acquirer(nil, "d", m)
    h.tick()
    assert.is_false(c.done and d.done, "two coroutines hold the mutex at once")
    if c.done then c.release() end
    h.tick()
    if d.done then d.release() end
    assert.is_false(b.done)
  end))

  it("ends the hold its releaser shows: tostring says released, also once someone else holds it", h.async(function()
    local m, r = h.held(am.Mutex.new())
    assert.matches("^async_mutex%.Releaser %(held%)", tostring(r))
    m:release()
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(r))
    local r2 = m:acquire()                     -- a later grant: not r's
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(r))
    assert.matches("^async_mutex%.Releaser %(held%)", tostring(r2))
    r2()
    local km, rk = h.held(am.KeyedMutex.new(), "acquire", "k")
    km:release("k")
    assert.matches("^async_mutex%.Releaser %(released%)", tostring(rk))
  end))

  it("called twice in a row passes the mutex through two queued waiters (#27)", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    local r = m:acquire()
    local b = h.acquirer(log, "b", m)
    local c = h.acquirer(log, "c", m)
    m:release()                                -- b owns it
    m:release()                                -- b's hold released, c owns it
    assert.is_true(m:isLocked())
    h.tick()
    assert.same({ "b", "c" }, log)
    assert.is_true(m:isLocked())
    c.release()
    assert.is_false(m:isLocked())
    b.release()                                -- no-op: unlocked (P3)
    r()                                        -- no-op: unlocked (P3)
    assert.is_false(m:isLocked())
    h.check_one_owner(m, h.acquirer(nil, "d", m), h.acquirer(nil, "e", m))
  end))
end)

describe("Mutex:isLocked", function()
  it("is false when free, true while held, false again after release", h.left_free(am.Mutex.new, function(m)
    assert.is_false(m:isLocked())
    local r = m:acquire()
    assert.is_true(m:isLocked())
    r()
  end))
end)
