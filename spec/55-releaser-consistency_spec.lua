-- A review of releasers across the lock kinds (docs/semantics.md, Release
-- and P3; Leases and lost holds; Keyed locks): a releaser's call, check(),
-- tostring and debug mode's records agree on whether its hold is in place,
-- and a releaser that did nothing says so.
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

local function state_of(r) return tostring(r):match("%((%a+)%)") end

describe("a KeyedSemaphore releaser whose key's lock left the set", function()
  -- "A releaser acts on the lock that made its grant: once that lock has
  -- left the set (after unscoped releases ended its grants), calling the
  -- releaser no longer changes the key" (Keyed locks): it did nothing, so
  -- its call returns false, and check()/tostring say released.
  it("returns false, and check() and tostring say released", h.async(function()
    local ks = am.KeyedSemaphore.new(2)
    local _, r = ks:acquire("x")
    ks:release("x")                       -- ends the grant: the key is idle
    assert.equal(0, ks:count())
    assert.is_false(r:check())
    assert.equal("released", state_of(r))
    assert.is_false(r())
    assert.is_false(r())
    assert.equal(0, ks:count())
    assert.equal(2, ks:getValue("x"))
  end))

  it("through withLease too: its lease just ends, not lost", h.async(function()
    local ks = am.withLease(am.KeyedSemaphore.new(1), 20)
    local _, r = ks:acquire("x")
    ks:release("x")
    assert.is_false(r:check())
    am.sleep(40)                           -- the lease runs out: not a loss
    assert.is_false(r:check())
    assert.is_false(r())
    assert.equal(0, ks:count())
  end))

  it("still returns true while the key's lock is in the set", h.async(function()
    local ks = am.KeyedSemaphore.new(2)
    local _, r1 = ks:acquire("x")
    local _, r2 = ks:acquire("x")
    ks:release("x")                       -- one grant's worth back: still in use
    assert.equal(1, ks:count())
    assert.is_true(r1:check())
    assert.is_true(r1())
    assert.equal(0, ks:count())           -- idle: r2's lock left the set
    assert.is_false(r2:check())
    assert.is_false(r2())
  end))

  it("is no holder in debug mode's report", h.async(function()
    dr.in_debug_mode({}, function()
      local ks = am.KeyedSemaphore.new(1)
      local _, r = ks:acquire("x")
      ks:release("x")
      assert.same({}, am.debug.holds(ks))
      assert.is_false(r())
    end)
  end))
end)

describe("debug mode's long holds after ks:release(key) ended a hold", function()
  it("reports none: the key's lock left the set, and no hold is left", h.async(function()
    dr.in_debug_mode({ holdWarning = 20 }, function(reports)
      local ks = am.KeyedSemaphore.new(1)
      local _, r = ks:acquire("x")
      ks:release("x")
      am.sleep(80)                           -- four checks of long holds
      assert.same({}, reports)
      assert.same({}, am.debug.holds())
      assert.is_false(r())
    end)
  end))
end)

describe("lockdep after ks:release(key) ended a coroutine's only hold", function()
  it("records no nesting: the coroutine held nothing when it took the next lock", h.async(function()
    dr.in_debug_mode({}, function(reports)
      local ks, m = am.KeyedSemaphore.new(1), am.Mutex.new()
      local _ = ks:acquire("x")
      ks:release("x")                        -- holds nothing now
      local rm = m:acquire()                 -- no edge ks -> m
      rm()
      local rm2 = m:acquire()                -- m -> ks: no inversion
      local _, rk = ks:acquire("y")
      rk()
      rm2()
      assert.same({}, reports)
    end)
  end))
end)

describe("a MultiReleaser one of whose keys raises as it is given back", function()
  -- A key's release raises 'semaphore value overflow' when it would take
  -- the value past math.maxinteger (Release and P3); the other keys are
  -- still given back, then the error propagates: nothing stays held, and
  -- the waiters of the other keys get their turn.
  it("gives back every other key, then raises", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    local release = ks:acquireAll({ "a", "b" })
    ks:release("b", math.maxinteger)      -- b's value at the top: its grant
                                          -- cannot be given back
    local waited = false
    am.spawn(function() local _, r = ks:acquire("a"); waited = true; r() end)
    local ok, err = pcall(release)
    assert.is_false(ok)
    assert.matches("semaphore value overflow", err)
    am.sleep(1)
    assert.is_true(waited)                -- granted a, and gave it back
    assert.equal(1, ks:getValue("a"))
    assert.is_false(release())            -- spent
  end))

  it("through <close> too", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    local ok, err = pcall(function()
      local release <close> = ks:acquireAll({ "a", "b" })
      ks:release("b", math.maxinteger)
    end)
    assert.is_false(ok)
    assert.matches("semaphore value overflow", err)
    assert.equal(1, ks:getValue("a"))
  end))
end)
