-- ReentrantMutex: the coroutine holding it acquires it again without waiting,
-- one level per acquire, each with its own releaser; everyone else waits as
-- for a Mutex (docs/lockkinds.md, ReentrantMutex).
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

local no_more_pending = h.pending_baseline(before_each)

describe("ReentrantMutex.new", function()
  it("creates an unlocked mutex of depth 0", function()
    local m = am.ReentrantMutex.new()
    assert.is_false(m:isLocked())
    assert.equal(0, m:depth())
    assert.is_false(m:isHeldByMe())
    assert.matches("^async_mutex.ReentrantMutex %(unlocked, 0 waiting%)", tostring(m))
  end)

  it("accepts a custom cancel error", h.async(function()
    local m = am.ReentrantMutex.new("stop")
    local r = m:acquire()
    local a = h.acquirer(nil, "a", m)
    m:cancel()
    h.tick()
    assert.same({ false, "stop" }, { a.ok, a.err })
    assert.equal(1, m:depth())                  -- the holder keeps it
    r()
  end))
end)

describe("ReentrantMutex:acquire by its holder", function()
  it("is granted at once, without yielding, as one more level with its own releaser", h.async(function()
    local m, r1 = h.held(am.ReentrantMutex.new())
    local completed = h.without_yield(function() m:acquire()() end)
    assert.is_false(completed)                  -- another coroutine: it waits
    local r2 = m:acquire()                      -- the holder itself
    local r3 = m:acquire()
    assert.equal(3, m:depth())
    assert.is_true(m:isHeldByMe())
    assert.are_not.equal(r2, r3)
    assert.matches("%(locked, depth 3, 1 waiting%)", tostring(m))
    r1(); r2(); r3()
    assert.is_true(m:isLocked())                -- handed to the waiter
    h.tick()
    assert.is_false(m:isLocked())               -- which released it
  end))

  it("frees the lock only when every level is released, in any order", h.async(function()
    local m = am.ReentrantMutex.new()
    local rs = {}
    for i = 1, 4 do rs[i] = m:acquire() end
    for _, i in ipairs({ 3, 1, 4 }) do
      rs[i]()
      assert.is_true(m:isLocked())
    end
    rs[1](); rs[3]()                            -- a level releases once
    assert.equal(1, m:depth())
    rs[2]()
    assert.is_false(m:isLocked())
    assert.equal(0, m:depth())
  end))

  it("passes the queue: waiters of any priority do not block the holder", h.async(function()
    local m, r = h.held(am.ReentrantMutex.new())
    local hi = h.acquirer(nil, "hi", m, 100)
    local completed = h.without_yield(function() m:acquire(-5)() end)
    assert.is_false(completed)                  -- not the holder: queued
    local inner = m:acquire(-100)               -- the holder: at once
    inner(); r()
    h.tick()
    assert.is_true(hi.ok)
    hi.release()
    h.tick()
    assert.is_false(m:isLocked())
  end))

  it("makes nested runExclusive work and returns the inner results", h.left_free(am.ReentrantMutex.new, function(m)
    local function helper() return m:runExclusive(function() return m:depth() end) end
    assert.same({ 2, "outer" }, { m:runExclusive(function() return helper(), "outer" end) })
  end))

  it("releases only the inner level when a nested runExclusive raises", h.left_free(am.ReentrantMutex.new, function(m)
    m:runExclusive(function()
      local err = {}
      assert.same({ false, err }, { pcall(m.runExclusive, m, function() error(err) end) })
      assert.equal(1, m:depth())
      assert.is_true(m:isHeldByMe())
    end)
  end))

  it("counts the coroutine that was granted from the queue as the holder once it runs", h.async(function()
    local m, r = h.held(am.ReentrantMutex.new())
    local depth_seen
    local a = h.acquirer(nil, "a", m)
    a.after = function(x)
      local again = m:acquire()
      depth_seen = m:depth()
      again(); x.release()
    end
    r()
    assert.is_false(m:isHeldByMe())             -- granted, not yet resumed
    h.tick()
    assert.equal(2, depth_seen)
    assert.is_false(m:isLocked())
  end))

  it("does not let the previous holder barge in while the lock waits for the loop", h.async(function()
    local m, r = h.held(am.ReentrantMutex.new())
    local a = h.acquirer(nil, "a", m)
    r()
    assert.is_false(m:isHeldByMe())
    local got = false
    h.spawn(function() local x = m:acquire(); got = true; x() end)
    local barged = h.without_yield(function() m:acquire()() end)
    assert.is_false(barged)
    h.tick()
    assert.is_true(a.ok)
    assert.is_false(got)
    a.release()
    h.wait_until(function() return got end)
  end))
end)

describe("ReentrantMutex and other coroutines", function()
  it("makes another coroutine wait as for a Mutex, in priority then arrival order", h.async(function()
    local log = {}
    local m, r = h.held(am.ReentrantMutex.new())
    local a = h.chain(log, "a", m)
    local b = h.chain(log, "b", m, 1)
    local c = h.chain(log, "c", m)
    h.tick(2)
    assert.same({}, log)
    r()
    h.wait_until(function() return #log == 3 end)
    assert.same({ "b", "a", "c" }, log)
    assert.is_true(a.ok and b.ok and c.ok)
  end))

  it("counts a coroutine the holder spawns as another coroutine: it waits for the holder", h.async(function()
    local m, outer = h.held(am.ReentrantMutex.new())
    local child_got = false
    local child = h.spawn(function()
      local r = m:acquire()
      child_got = true
      r()
    end)
    h.tick(2)
    assert.is_false(child_got)
    assert.equal("suspended", coroutine.status(child))
    outer()
    h.wait_until(function() return child_got end)
  end))

  it("ends exactly the releaser's own level when it is called from another coroutine", h.left_free(am.ReentrantMutex.new, function(m)
    local r1, r2 = m:acquire(), m:acquire()
    h.spawn(function() r2() end)
    assert.equal(1, m:depth())
    assert.is_true(m:isHeldByMe())
    h.spawn(function() r2(); r1() end)           -- r2 again: nothing
  end))

  it("releases every level when the holder's coroutine is closed with <close> releasers", h.left_free(am.ReentrantMutex.new, function(m)
    local co = h.spawn(function()
      local _ <close> = m:acquire()
      local _ <close> = m:acquire()
      coroutine.yield()
    end)
    assert.equal(2, m:depth())
    assert.is_true(coroutine.close(co))
  end))

  it("answers isHeldByMe for the running coroutine only", h.holding(am.ReentrantMutex.new, function(m)
    local other
    h.spawn(function() other = m:isHeldByMe() end)
    assert.is_false(other)
    assert.is_true(m:isHeldByMe())
  end))
end)

describe("ReentrantMutex:waitForUnlock", function()
  it("waits for the lock to be free for another coroutine", h.async(function()
    local m = am.ReentrantMutex.new()
    local r1, r2 = m:acquire(), m:acquire()
    local u = h.waiter(nil, "u", m)
    r1()
    h.tick()
    assert.is_false(u.done)
    r2()
    h.tick()
    assert.is_true(u.ok)
    assert.is_false(u.locked_then)
  end))

  it("raises for the holder, which would wait for itself", h.async(function()
    local m, r = h.held(am.ReentrantMutex.new())
    assert.equal("attempt to wait for a reentrant mutex that this coroutine holds "
      .. "(it would wait for itself)", E(function() m:waitForUnlock() end))
    assert.equal(1, m:depth())
    r()
    m:waitForUnlock()                           -- free now: returns at once
  end))
end)

describe("ReentrantMutex with withTimeout and tryAcquire", function()
  it("re-enters for its holder at once through either decorator", h.async(function()
    local m, r = h.held(am.ReentrantMutex.new())
    local t = am.tryAcquire(m):acquire()
    local w = am.withTimeout(m, 0):acquire()
    assert.equal(3, m:depth())
    t(); w(); r()
    assert.is_false(m:isLocked())
  end))

  it("refuses others with the exact errors", h.async(function()
    local m = am.ReentrantMutex.new()
    local release = h.holder(m)
    local try, timed = am.tryAcquire(m), am.withTimeout(m, 5)
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(try.acquire, try) })
    assert.same({ false, am.E_TIMEOUT }, { pcall(timed.acquire, timed) })
    local got
    h.spawn(function() got = { am.withTimeout(m, 1000):runExclusive(function() return 9 end, 1) } end)
    release()
    h.wait_until(function() return got end)
    assert.same({ 9 }, got)
    no_more_pending()
  end))
end)

describe("ReentrantMutex bad input", function()
  it("rejects a bad priority, a non-callable fn and a wrong self", h.async(function()
    local m = am.ReentrantMutex.new()
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got table)",
      E(function() m:acquire({}) end))
    assert.equal("bad argument #1 to 'waitForUnlock' (priority must not be NaN)",
      E(function() m:waitForUnlock(0 / 0) end))
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got nil)",
      E(function() m:runExclusive() end))
    assert.equal("bad argument #2 to 'runExclusive' (priority must be a number, got string)",
      E(function() m:runExclusive(function() end, "x") end))
    assert.equal("bad argument #1 to 'depth' (async_mutex.ReentrantMutex expected, got async_mutex.Mutex)",
      E(function() m.depth(am.Mutex.new()) end))
    assert.is_false(m:isLocked())
    no_more_pending()
  end))

  it("refuses to wait outside a coroutine", function()
    local m = am.ReentrantMutex.new()
    local release = h.holder(m)
    assert.equal("attempt to acquire a reentrant mutex outside a coroutine",
      E(function() m:acquire() end))
    release()
    assert.is_false(m:isLocked())
  end)
end)
