-- Debug mode: lock-order validation (lockdep; docs/debug.md, Lockdep).  Taking
-- class B while holding class A records the edge A -> B with both sites; the
-- first acquisition that closes a cycle of classes is reported once, as a
-- potential deadlock, although nothing hung.
local h = require "helpers"
local am = require "async_mutex"

local THIS = "spec/62%-debug%-lockdep_spec.lua"

local dr = require "debug_reports"
local line = dr.line

local rec = dr.recorder(before_each, after_each)

local function inversions() return rec.of_kind("inversion") end

-- In a new coroutine, takes each lock in order (nested), then releases all.
local function nested(...)
  local locks = { ... }
  local co = h.spawn(function()
    local held = {}
    for i, l in ipairs(locks) do
      local a, b = l:acquire()
      held[i] = b or a
    end
    for i = #held, 1, -1 do held[i]() end
  end)
  h.wait_until(function() return coroutine.status(co) == "dead" end)
end

describe("lockdep", function()
  it("reports ABBA across two coroutines that never collide, with the sites of both edges", h.async(function()
    local a = am.debug.name(am.Mutex.new(), "a")
    local b = am.debug.name(am.Mutex.new(), "b")
    local ab_a, ab_b, ba_b, ba_a
    h.spawn(function()
      local ra = a:acquire(); ab_a = line()
      local rb = b:acquire(); ab_b = line()
      rb(); ra()
    end)
    assert.same({}, inversions())
    h.spawn(function()
      local rb = b:acquire(); ba_b = line()
      local ra = a:acquire(); ba_a = line()
      ra(); rb()
    end)
    local inv = inversions()
    assert.equal(1, #inv)
    local text = inv[1].text
    assert.matches("lock order inversion", text)
    assert.matches('Mutex "a" %(acquired at ' .. THIS .. ":" .. ab_a .. '%)\n    %-> Mutex "b" %(acquired at '
      .. THIS .. ":" .. ab_b .. "%)", text)
    assert.matches('Mutex "b" %(acquired at ' .. THIS .. ":" .. ba_b .. '%)\n    %-> Mutex "a" %(acquired at '
      .. THIS .. ":" .. ba_a .. "%)", text)
    assert.equal(2, #inv[1].info.edges)
    assert.matches("lockdep: 2 classes, 2 edges", am.debug.report())
    assert.equal(0, #am.debug.holds())          -- nothing hung
  end))

  it("reports each cycle once", h.async(function()
    local a = am.debug.name(am.Mutex.new(), "a")
    local b = am.debug.name(am.Mutex.new(), "b")
    for _ = 1, 3 do
      nested(a, b)
      nested(b, a)
    end
    assert.equal(1, #inversions())
  end))

  it("reports a longer cycle across kinds: Mutex -> Semaphore -> RWLock -> Mutex", h.async(function()
    local m = am.debug.name(am.Mutex.new(), "m")
    local s = am.debug.name(am.Semaphore.new(3), "s")
    local rw = am.debug.name(am.RWLock.new(), "rw")
    nested(m, s)
    nested(s, rw)
    assert.same({}, inversions())
    nested(rw, m)
    local inv = inversions()
    assert.equal(1, #inv)
    assert.equal(3, #inv[1].info.edges)
    assert.matches('Semaphore "s"', inv[1].text)
    assert.matches('RWLock "rw"', inv[1].text)
  end))

  it("groups unnamed locks by creation site: one class for locks made on one line", h.async(function()
    local function new_account() return am.Mutex.new() end; local at = line()
    local x, y = new_account(), new_account()
    nested(x, y)
    local inv = inversions()
    assert.equal(1, #inv)
    assert.matches("two locks of one class taken nested", inv[1].text)
    assert.matches("Mutex created at " .. THIS .. ":" .. at, inv[1].text)
  end))

  it("keeps memory bounded by classes and edges: new locks of the same classes add none", h.async(function()
    for _ = 1, 50 do
      local a = am.Mutex.new()
      local b = am.Mutex.new()
      nested(a, b)
    end
    assert.matches("lockdep: 2 classes, 1 edges", am.debug.report())
  end))
end)

describe("lockdep, nested keys", function()
  it("reports two keys of one keyed lock taken by separate nested acquires", h.async(function()
    local k = am.debug.name(am.KeyedMutex.new(), "accounts")
    local first, second
    h.spawn(function()
      local r1 = k:acquire(1); first = line()
      local r2 = k:acquire(2); second = line()
      r2(); r1()
    end)
    local inv = inversions()
    assert.equal(1, #inv)
    assert.matches("two keys of one keyed lock taken by separate nested acquires %(use acquireAll%)", inv[1].text)
    assert.matches('KeyedMutex "accounts" key 1 %(acquired at ' .. THIS .. ":" .. first, inv[1].text)
    assert.matches('KeyedMutex "accounts" key 2 %(acquired at ' .. THIS .. ":" .. second, inv[1].text)
  end))

  it("reports two keys of a KeyedRWLock read by nested acquires", h.async(function()
    local k = am.KeyedRWLock.new()
    h.spawn(function()
      local r1 = k:acquireRead("a")
      local r2 = k:acquireWrite("b")
      r2(); r1()
    end)
    assert.equal(1, #inversions())
  end))

  it("does not report acquireAll or runExclusiveAll", h.async(function()
    local k = am.KeyedMutex.new()
    local ks = am.KeyedSemaphore.new(2)
    h.spawn(function()
      local all = k:acquireAll({ 3, 1, 2 })
      all()
      ks:runExclusiveAll({ "x", "y" }, function() end)
      local t = am.withTimeout(k, 1000):acquireAll({ "p", "q" })
      t()
      local krw = am.KeyedRWLock.new()
      krw:acquireAllRead({ "x", "y" })()
      krw:acquireAllWrite({ "x", "y" })()
    end)
    assert.same({}, inversions())
  end))
end)

describe("lockdep, no report", function()
  it("for one order kept by every coroutine", h.async(function()
    local a = am.Mutex.new()
    local b = am.Mutex.new()
    nested(a, b)
    nested(a, b)
    assert.same({}, inversions())
  end))

  it("for locks taken one after the other, in both orders", h.async(function()
    local a = am.Mutex.new()
    local b = am.Mutex.new()
    h.spawn(function()
      local ra = a:acquire(); ra()
      local rb = b:acquire(); rb()
      rb = b:acquire(); rb()
      ra = a:acquire(); ra()
    end)
    assert.same({}, inversions())
    assert.matches("lockdep: 0 classes, 0 edges", am.debug.report())
  end))

  it("for a tryAcquire in the reverse order (it never waits)", h.async(function()
    local a = am.Mutex.new()
    local b = am.Mutex.new()
    nested(a, b)
    h.spawn(function()
      local rb = b:acquire()
      local ra = am.tryAcquire(a):acquire()
      ra(); rb()
    end)
    assert.same({}, inversions())
  end))

  it("for locks of one creation site named apart and taken in one order", h.async(function()
    local function new_account(id) return am.debug.name(am.Mutex.new(), "account " .. id) end
    local x, y = new_account(1), new_account(2)
    nested(x, y)
    nested(x, y)
    assert.same({}, inversions())
  end))

  it("for a ReentrantMutex re-entered while holding it", h.async(function()
    local m = am.ReentrantMutex.new()
    nested(m, m, m)
    assert.same({}, inversions())
  end))
end)
