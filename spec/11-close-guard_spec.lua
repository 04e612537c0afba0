-- The releaser is a to-be-closed value: `local r <close> = m:acquire()`
-- (docs/semantics.md, Release and P3).
local h = require "helpers"
-- luacheck: ignore 211/r  (a <close> variable is used by going out of scope)
local am = require "async_mutex"

describe("the releaser as a <close> variable", function()
  it("has a __close metamethod (it can be declared <close>)", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    local mt = getmetatable(r)
    assert.is_not_nil(mt)
    assert.is_not_nil(mt.__close)
    r()
  end))

  it("releases a Mutex at the end of the scope", h.left_free(am.Mutex.new, function(m)
    do
      local r <close> = m:acquire()
      assert.is_true(m:isLocked())
    end
  end))

  it("releases a Semaphore's weight at the end of the scope", h.async(function()
    local s = am.Semaphore.new(5)
    do
      local v <const>, r <close> = s:acquire(3)
      assert.equal(5, v)
      assert.equal(2, s:getValue())
    end
    assert.equal(5, s:getValue())
  end))

  it("releases when an error leaves the scope", h.left_free(am.Mutex.new, function(m)
    local e = {}
    local ok, err = pcall(function()
      local r <close> = m:acquire()
      error(e)
    end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))          -- the error passes through unchanged
  end))

  it("releases when an error after a yield leaves the scope", h.async(function()
    local s = am.Semaphore.new(1)
    local ok = pcall(function()
      local _, r <close> = s:acquire()
      h.sleep(2)
      error("boom")
    end)
    assert.is_false(ok)
    assert.equal(1, s:getValue())
  end))

  it("releases at each iteration of a loop, including on break", h.left_free(am.Mutex.new, function(m)
    for i = 1, 3 do
      local r <close> = m:acquire()
      assert.is_true(m:isLocked())
      if i == 2 then break end
    end
  end))

  it("releases when the holding coroutine is closed with coroutine.close", h.left_free(am.Mutex.new, function(m)
    local co = coroutine.create(function()
      local r <close> = m:acquire()
      coroutine.yield("holding")
    end)
    assert.same({ true, "holding" }, { coroutine.resume(co) })
    assert.is_true(m:isLocked())
    local b = h.acquirer(nil, "b", m)
    assert.is_true(coroutine.close(co))
    assert.is_true(m:isLocked())               -- handed to b
    h.tick()
    assert.is_true(b.done)
    b.release()
  end))

  it("hands the lock to the next waiter, deferred, at the end of the scope", h.async(function()
    local m = am.Mutex.new()
    local b
    do
      local r <close> = m:acquire()
      b = h.acquirer(nil, "b", m)
    end
    assert.is_true(m:isLocked())
    assert.is_false(b.done)
    h.tick()
    assert.is_true(b.done)
    b.release()
  end))

  it("does not release a second time at scope exit after an explicit call", h.async(function()
    local m = am.Mutex.new()
    local b, c
    do
      local r <close> = m:acquire()
      b = h.acquirer(nil, "b", m)
      c = h.acquirer(nil, "c", m)
      r()                                      -- b owns it now
    end                                        -- must not release b's hold
    h.tick(2)
    assert.is_true(m:isLocked())
    h.check_one_owner(m, b, c)
  end))

  it("does not release a Semaphore twice either", h.async(function()
    local s = am.Semaphore.new(2)
    do
      local _, r <close> = s:acquire(2)
      r()
      assert.equal(2, s:getValue())
    end
    assert.equal(2, s:getValue())
  end))

  -- A waited acquire hands out its waiter as the releaser: the same rules.
  it("releases a waited grant once at scope exit, and on coroutine.close", h.async(function()
    local m = am.Mutex.new()
    local s = am.Semaphore.new(2)
    local hold_m, hold_s = m:acquire(), select(2, s:acquire(2))
    local log = {}
    local scoped = coroutine.wrap(function()
      do
        local r <close> = m:acquire()          -- waits
        log[#log + 1] = "scoped got it, locked: " .. tostring(m:isLocked())
        r()                                    -- released once here...
        log[#log + 1] = tostring(m:isLocked())
      end                                      -- ...and not again here
      local _, r <close> = s:acquire(2)        -- waits
      log[#log + 1] = "scoped got 2"
      coroutine.yield()
    end)
    scoped()
    local co = coroutine.create(function()
      local r <close> = m:acquire()            -- resumed below: uncontended
      log[#log + 1] = "co got it"
      coroutine.yield()
    end)
    hold_m()
    h.tick()
    assert.same({ "scoped got it, locked: true", "false" }, log)
    assert.is_false(m:isLocked())
    assert.is_true(coroutine.resume(co))       -- uncontended: not waited
    assert.is_true(m:isLocked())
    local waiting = coroutine.create(function()
      local r <close> = m:acquire()            -- waits for co
      log[#log + 1] = "waiting got it"
      coroutine.yield()
    end)
    coroutine.resume(waiting)
    assert.is_true(coroutine.close(co))        -- co's release hands it on
    h.tick()
    assert.equal("waiting got it", log[#log])
    assert.is_true(m:isLocked())
    assert.is_true(coroutine.close(waiting))   -- a waited grant, closed
    assert.is_false(m:isLocked())
    hold_s()
    h.tick()
    assert.equal("scoped got 2", log[#log])
    assert.equal(0, s:getValue())
    scoped()                                   -- ends: its scope releases 2
    assert.equal(2, s:getValue())
  end))

  it("works with a releaser obtained through withTimeout and tryAcquire", h.left_free(am.Mutex.new, function(m)
    do
      local r <close> = am.withTimeout(m, 50):acquire()
      assert.is_true(m:isLocked())
    end
    assert.is_false(m:isLocked())
    do
      local r <close> = am.tryAcquire(m):acquire()
      assert.is_true(m:isLocked())
    end
  end))
end)
