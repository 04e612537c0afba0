-- runExclusive(fn, ...): acquire, call fn (which may yield), release in all
-- cases, return all results or re-raise the same error value
-- (docs/semantics.md, Release and P3, on runExclusive).
local h = require "helpers"
local am = require "async_mutex"

describe("Mutex:runExclusive", function()
  it("calls fn without arguments while holding the lock, then releases it", h.left_free(am.Mutex.new, function(m)
    local nargs, locked
    m:runExclusive(function(...)
      nargs = select("#", ...)
      locked = m:isLocked()
    end)
    assert.equal(0, nargs)
    assert.is_true(locked)
  end))

  it("runs fn at once, without yielding, when the mutex is free", h.async(function()
    local m = am.Mutex.new()
    local completed, res = h.without_yield(function()
      return m:runExclusive(function() return "r" end)
    end)
    assert.is_true(completed)
    assert.equal("r", res[1])
  end))

  it("returns all of fn's results, nils included", h.async(function()
    local m = am.Mutex.new()
    local res = table.pack(m:runExclusive(function() return 1, nil, "three", nil end))
    assert.equal(4, res.n)
    assert.same({ 1, nil, "three", nil }, { res[1], res[2], res[3], res[4] })
    res = table.pack(m:runExclusive(function() end))
    assert.equal(0, res.n)
    local many = {}
    for i = 1, 200 do many[i] = i end
    res = table.pack(m:runExclusive(function() return table.unpack(many) end))
    assert.equal(200, res.n)
    assert.equal(200, res[200])
  end))

  it("lets fn yield and holds the lock across its yields", h.left_free(am.Mutex.new, function(m)
    local log = {}
    h.spawn(function()
      m:runExclusive(function()
        log[#log + 1] = "a in"
        h.sleep(10)
        log[#log + 1] = "a out"
      end)
    end)
    h.spawn(function()
      m:runExclusive(function() log[#log + 1] = "b" end)
    end)
    h.wait_until(function() return #log == 3 end)
    assert.same({ "a in", "a out", "b" }, log)
  end))

  it("lets fn use pcall around yields", h.left_free(am.Mutex.new, function(m)
    local res = m:runExclusive(function()
      local ok, err = pcall(function()
        h.sleep(2)
        error({ "inner" })
      end)
      return ok == false and err[1]
    end)
    assert.equal("inner", res)
  end))

  it("waits for the lock when it is held", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local ran = false
    h.spawn(function() m:runExclusive(function() ran = true end) end)
    h.tick()
    assert.is_false(ran)
    r()
    h.tick()
    assert.is_true(ran)
    assert.is_false(m:isLocked())
  end))

  it("re-raises the same error value, after releasing, when fn raises before yielding", h.left_free(am.Mutex.new, function(m)
    local e = {}
    local ok, err = pcall(m.runExclusive, m, function() error(e) end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.is_false(m:isLocked())
    ok, err = pcall(m.runExclusive, m, function() error("plain") end)
    assert.is_false(ok)
    -- exactly the position fn's error() added, nothing more
    assert.is_truthy(err:match("^[^:]+:%d+: plain$"), err)
    ok, err = pcall(m.runExclusive, m, function() error("level0", 0) end)
    assert.same({ false, "level0" }, { ok, err })
  end))

  it("re-raises the same error value, after releasing, when fn raises after yielding", h.left_free(am.Mutex.new, function(m)
    local e = setmetatable({}, { __name = "custom error" })
    local ok, err = pcall(m.runExclusive, m, function()
      h.sleep(2)
      error(e)
    end)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.is_false(m:isLocked())
    ok, err = pcall(m.runExclusive, m, function()
      h.tick()
      error("after yield", 0)
    end)
    assert.same({ false, "after yield" }, { ok, err })
  end))

  it("passes the lock on to the next waiter when fn raises", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    h.spawn(function()
      pcall(m.runExclusive, m, function()
        h.sleep(2)
        log[#log + 1] = "a fails"
        error("x")
      end)
    end)
    local b = h.acquirer(log, "b", m)
    h.wait_until(function() return b.done end)
    assert.same({ "a fails", "b" }, log)
    b.release()
  end))

  it("takes a priority as its second argument", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local log = {}
    h.spawn(function() m:runExclusive(function() log[#log + 1] = "low" end) end)
    h.spawn(function() m:runExclusive(function() log[#log + 1] = "high" end, 2) end)
    r()
    h.wait_until(function() return #log == 2 end)
    assert.same({ "high", "low" }, log)
  end))

  it("does not call fn when the acquisition is canceled, and raises the cancel error", h.async(function()
    local e = { "c" }
    local m = am.Mutex.new(e)
    local r = m:acquire()
    local got, called = h.cancel_exclusive_waiter(m)
    assert.is_false(got[1])
    assert.is_true(rawequal(e, got[2]))
    assert.is_false(called)
    r()
  end))

  it("can be nested over two locks", h.async(function()
    local m1, m2 = am.Mutex.new(), am.Mutex.new()
    local a, b = m1:runExclusive(function()
      return m2:runExclusive(function()
        h.tick()
        return m1:isLocked(), m2:isLocked()
      end)
    end)
    assert.same({ true, true }, { a, b })
    assert.is_false(m1:isLocked())
    assert.is_false(m2:isLocked())
  end))
end)

describe("Semaphore:runExclusive", function()
  it("calls fn with the value before the decrement", h.async(function()
    local s = am.Semaphore.new(5)
    local got, during
    s:runExclusive(function(...)
      got = table.pack(...)
      during = s:getValue()
    end, 2)
    assert.equal(1, got.n)
    assert.equal(5, got[1])
    assert.equal(3, during)
    assert.equal(5, s:getValue())
  end))

  it("defaults to weight 1 and takes a priority as its third argument", h.async(function()
    local s = am.Semaphore.new(0)
    local log = {}
    h.spawn(function() s:runExclusive(function(v) log[#log + 1] = "p0:" .. v end) end)
    h.spawn(function() s:runExclusive(function(v) log[#log + 1] = "p1:" .. v end, nil, 1) end)
    s:setValue(1)
    h.wait_until(function() return #log == 2 end)
    assert.same({ "p1:1", "p0:1" }, log)
    assert.equal(1, s:getValue())
  end))

  it("releases its weight and re-raises when fn raises", h.async(function()
    local s = am.Semaphore.new(3)
    local e = {}
    local ok, err = pcall(s.runExclusive, s, function() h.sleep(1); error(e) end, 3)
    assert.is_false(ok)
    assert.is_true(rawequal(e, err))
    assert.equal(3, s:getValue())
  end))

  it("returns all of fn's results", h.async(function()
    local s = am.Semaphore.new(1)
    local res = table.pack(s:runExclusive(function(v) h.tick(); return nil, v, nil end))
    assert.equal(3, res.n)
    assert.equal(1, res[2])
  end))
end)

-- A request that waited gets its grant in the wait's continuation, and
-- runs fn from there (src/core/engine/run.c): the same rules as a grant at once.
describe("runExclusive after a wait", function()
  it("releases when the coroutine is closed while fn is suspended", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local entered = false
    local co = coroutine.create(function()
      m:runExclusive(function() entered = true; coroutine.yield() end)
    end)
    assert(coroutine.resume(co))
    r()
    h.wait_until(function() return entered end)
    assert.is_true(m:isLocked())
    assert.is_true(coroutine.close(co))
    assert.is_false(m:isLocked())
  end))

  it("ignores a resume by anyone but the scheduler, and runs fn once when granted", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local calls, res = 0, nil
    local co = coroutine.create(function()
      res = table.pack(m:runExclusive(function() calls = calls + 1; return "a", nil end))
    end)
    assert(coroutine.resume(co))
    assert(coroutine.resume(co, "stray"))     -- still waiting
    assert.equal(0, calls)
    assert.equal("suspended", coroutine.status(co))
    r()
    h.wait_until(function() return res ~= nil end)
    assert.equal(1, calls)
    assert.same({ n = 2, "a", nil }, res)
    assert.is_false(m:isLocked())
  end))

  it("raises E_LOST once fn returns when a steal ended the hold, and drops fn's results", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local got, stolen
    h.spawn(function()
      got = { pcall(m.runExclusive, m, function() h.tick(); h.tick(); return "dropped" end) }
    end)
    r()
    h.tick()
    stolen = m:steal()
    h.wait_until(function() return got ~= nil end)
    assert.same({ false, am.E_LOST }, got)
    assert.is_true(m:isLocked())               -- the stealer's hold stands
    assert.is_true(stolen())
  end))

  it("raises a lease's lost error once fn returns when the lease ran out", h.left_free(am.Mutex.new, function(m)
    local lost = { "lost" }
    local lm = am.withLease(m, 20, lost)
    local r = m:acquire()
    local got
    h.spawn(function()
      got = { pcall(lm.runExclusive, lm, function(...) h.sleep(60); return select("#", ...) end) }
    end)
    r()
    h.wait_until(function() return got ~= nil end)
    assert.is_false(got[1])
    assert.is_true(rawequal(lost, got[2]))
  end))

  it("gives a Semaphore's fn its value, and releases the weight when fn raises", h.async(function()
    local s = am.Semaphore.new(0)
    local e = {}
    local got
    h.spawn(function()
      got = { pcall(s.runExclusive, s, function(v) h.tick(); error({ v = v, e = e }) end, 2) }
    end)
    s:setValue(3)
    h.wait_until(function() return got ~= nil end)
    assert.is_false(got[1])
    assert.equal(3, got[2].v)
    assert.is_true(rawequal(e, got[2].e))
    assert.equal(3, s:getValue())
  end))

  it("times out through withTimeout without calling fn", h.holding(am.Mutex.new, function(m)
    local called = false
    local ok, err = pcall(am.withTimeout(m, 5).runExclusive, am.withTimeout(m, 5),
      function() called = true end)
    assert.is_false(ok)
    assert.equal(am.E_TIMEOUT, err)
    assert.is_false(called)
  end))
end)
