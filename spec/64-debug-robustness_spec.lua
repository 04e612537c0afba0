-- Debug mode survives what the module survives (docs/debug.md): coroutines
-- closed while holding or waiting, locks collected, finalizers that use locks
-- while its hooks run, switching it on and off with holds and waiters in
-- place.  Nothing is lost: every waiter ends once, no lock is held twice.
local h = require "helpers"
local am = require "async_mutex"

local pending0
before_each(function()
  pending0 = am.pending()                     -- what earlier files left waiting
  am.debug.enable({ onReport = function() end })
end)
after_each(function() am.debug.disable() end)

describe("debug mode and many holds of one lock", function()
  -- in a child process: the bug this guards against wrote past the Lua
  -- stack (heap corruption), which would take the whole run down
  it("a semaphore's 5,000 holds released oldest first (its records' chain walked to the end) keep the stack in bounds",
    function()
      local res = h.am_subprocess([[
        am.debug.enable({ onReport = function() end })
        am.spawn(function()
          local s = am.Semaphore.new(5000)
          local releases = {}
          for i = 1, 5000 do releases[i] = select(2, s:acquire()) end
          assert(#am.debug.holds(s) == 5000)
          for i = 1, 5000 do assert(releases[i]() == true) end
          assert(#am.debug.holds(s) == 0 and s:getValue() == 5000)
          print("ok")
        end)
        uv.run()
      ]], 120)
      h.clean_exit(res, "ok\n")
    end)
end)

describe("debug mode and coroutine.close", function()
  it("a holder closed while suspended: its <close> releaser ends the record, the waiter gets the lock", h.async(function()
    local m = am.Mutex.new()
    local holder = h.spawn(function()
      local r <close> = m:acquire()
      coroutine.yield()                       -- suspended, never resumed
    end)
    local w = h.acquirer(nil, "w", m)
    coroutine.close(holder)
    h.tick()
    assert.is_true(w.ok)
    local list = am.debug.holds()
    assert.equal(1, #list)
    assert.equal(w.co, list[1].holder)
    w.release()
    assert.same({}, am.debug.holds())
  end))

  it("a waiter closed while queued leaves the queue and the graph", h.async(function()
    local a = am.Mutex.new()
    local b = am.Mutex.new()
    local rb = b:acquire()
    local t1 = h.spawn(function()
      local ra <close> = a:acquire()
      local r = b:acquire(); r()
    end)
    coroutine.close(t1)                       -- releases a, leaves b's queue
    assert.is_false(a:isLocked())
    local ra = a:acquire()                    -- no deadlock: t1 waits no more
    ra(); rb()
    assert.equal(pending0, am.pending())
  end))

  it("a coroutine closed inside a hook's report handler", h.async(function()
    local m = am.Mutex.new()
    local victim
    am.debug.enable({ onReport = function() coroutine.close(victim) end })
    local r = m:acquire()
    victim = h.spawn(function()
      local rv <close> = m:acquire()          -- queued
    end)
    assert.equal(am.E_DEADLOCK, select(2, pcall(m.acquire, m)))   -- report closes victim
    assert.equal("dead", coroutine.status(victim))
    assert.is_true(m:isLocked())
    r()
    assert.is_false(m:isLocked())
    assert.equal(pending0, am.pending())
  end))
end)

describe("debug mode and the collector", function()
  it("keeps no lock alive once it is free and unreferenced", h.async(function()
    local probe = setmetatable({}, { __mode = "k" })
    do
      local m = am.debug.name(am.Mutex.new(), "gone")
      local k = am.KeyedMutex.new()
      local s = am.Semaphore.new(2)
      local rw = am.RWLock.new()
      probe[m], probe[k], probe[s], probe[rw] = true, true, true, true
      local r1 = m:acquire()
      local r2 = k:acquire("x")
      local r3 = k:acquire("y")               -- nested keys: a lockdep report
      local _, r4 = s:acquire()
      local r5 = rw:acquireRead()
      r5(); r4(); r3(); r2(); r1()
      local t = h.spawn(function() local r = m:acquire(); r() end)
      assert(t)
    end
    h.gc()
    assert.is_nil(next(probe))
  end))

  it("finalizers that release and acquire while the hooks allocate", h.left_free(am.Mutex.new, function(m)
    local inside, max_inside = 0, 0
    local function section()
      local r = m:acquire()
      inside = inside + 1
      max_inside = math.max(max_inside, inside)
      inside = inside - 1
      r()
    end
    local held = {}
    for i = 1, 50 do
      -- garbage whose finalizer takes and gives back the lock (tryAcquire:
      -- a finalizer cannot wait)
      setmetatable({}, { __gc = function()
        local ok, r = pcall(function() return am.tryAcquire(m):acquire() end)
        if ok then r() end
      end })
      held[i] = h.spawn(section)
    end
    collectgarbage()
    h.wait_until(function()
      for _, co in ipairs(held) do if coroutine.status(co) ~= "dead" then return false end end
      return true
    end)
    assert.equal(1, max_inside)
    assert.same({}, am.debug.holds())
  end))
end)

describe("debug mode switched with holds and waiters in place", function()
  it("disabled mid-wait, the waiters are served and nothing is recorded", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    local ws = {}
    for i = 1, 5 do ws[i] = h.chain(nil, "w" .. i, m) end
    am.debug.disable()
    r()
    h.wait_until(function() return not m:isLocked() end)
    for i = 1, 5 do assert.is_true(ws[i].ok) end
    assert.same({}, am.debug.holds())
  end))

  it("enabled mid-wait, grants delivered later are recorded", h.async(function()
    am.debug.disable()
    local m = am.Mutex.new()
    local r = m:acquire()
    local w = h.acquirer(nil, "w", m)
    am.debug.enable({ onReport = function() end })
    r()
    h.tick()
    assert.equal(w.co, am.debug.holds()[1].holder)
    w.release()
    assert.same({}, am.debug.holds())
  end))

end)
