-- Debug mode and a Semaphore released with release(w) rather than its
-- releaser (docs/debug.md, Owner records): async-mutex's own way (acquire,
-- then semaphore.release()), and a Semaphore used as a signal (one
-- coroutine acquires, another releases).  The grants such a release gives
-- back had records no releaser would ever end: they stayed holds for
-- ever, one more per acquire, and the deadlock search counted their units
-- as held by their coroutines.  Two workers in async-mutex's style raised
-- E_DEADLOCK: the one that released and asked again while the other's
-- grant was being delivered "held" its released unit.  The release now
-- ends records of its weight (the releasing coroutine's own first, then
-- the oldest), and what it gives back beyond them is taken by the next
-- grants instead of a record.
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

local rec = dr.recorder(before_each, after_each)

local function holds_of(lock) return #am.debug.holds(lock) end

--- Two workers that each take(), sleep and give() back three times:
-- returns the errors they met.
local function two_workers(take, give)
  local done, errs = 0, {}
  local function worker()
    for _ = 1, 3 do
      local ok, err = pcall(take)
      if not ok then errs[#errs + 1] = err; return end
      h.sleep(1)
      give()
    end
    done = done + 1
  end
  h.spawn(worker)
  h.spawn(worker)
  h.wait_until(function() return done + #errs == 2 end)
  return errs
end

describe("a Semaphore released by release() in async-mutex's style", function()
  it("two workers that each acquire, sleep and release() three times: no E_DEADLOCK, no hold left", h.async(function()
    local s = am.Semaphore.new(1)
    assert.same({}, two_workers(function() s:acquire() end, function() s:release() end))
    assert.equal(0, rec.count("deadlock"))
    assert.equal(0, holds_of(s))
  end))

  it("a holder shows in holds() until its release(), then no longer", h.async(function()
    local s = am.Semaphore.new(3)
    s:acquire(2)
    assert.equal(1, holds_of(s))
    s:release(2)
    assert.equal(0, holds_of(s))
  end))

  it("a release() by a coroutine that holds nothing of it ends the oldest hold: the rest stay", h.async(function()
    local s = am.Semaphore.new(3)
    local first = h.acquirer(nil, "first", s)
    local second = h.acquirer(nil, "second", s)
    assert.is_true(first.done and second.done)
    s:release()
    local left = am.debug.holds(s)
    assert.equal(1, #left)
    assert.equal(second.co, left[1].holder)
    second.release()                           -- its own record ends as before
    assert.equal(0, holds_of(s))
    first.release()                            -- a releaser still gives back
    assert.equal(4, s:getValue())
    assert.equal(0, holds_of(s))
  end))

  it("a forgotten release is still a hold: acquired, never released", h.async(function()
    local s = am.Semaphore.new(2)
    s:acquire()
    assert.equal(1, holds_of(s))
    s:acquire()                                -- (its releaser dropped too)
    assert.equal(2, holds_of(s))
    s:release(2)
  end))

  it("a KeyedSemaphore key released with release(key) in the same style", h.async(function()
    local ks = am.KeyedSemaphore.new(1)
    assert.same({}, two_workers(function() ks:acquire("k") end, function() ks:release("k") end))
    assert.equal(0, rec.count("deadlock"))
    assert.equal(0, holds_of(ks))
  end))
end)

describe("a Semaphore used as a signal", function()
  it("1,000 signals consumed by a waiting consumer leave no hold", h.async(function()
    local s = am.Semaphore.new(0)
    local got = 0
    h.spawn(function()
      for _ = 1, 1000 do s:acquire(); got = got + 1 end
    end)
    for i = 1, 1000 do
      s:release()                              -- the consumer's grant is not delivered yet
      if i % 100 == 0 then h.tick() end
    end
    h.wait_until(function() return got == 1000 end)
    assert.equal(0, holds_of(s))
  end))

  it("signals released before they are consumed leave no hold either", h.async(function()
    local s = am.Semaphore.new(0)
    s:release(500)
    for _ = 1, 500 do s:acquire() end
    assert.equal(0, holds_of(s))
  end))

  it("a consumer that took a signal and waits for a mutex is no holder of the signal", h.async(function()
    -- C took a signal, then waits for m, which R holds.  R waits for the
    -- next signal: P, sleeping, will send it.  Nobody waits for ever.
    local s, m = am.Semaphore.new(0), am.Mutex.new()
    local rm = m:acquire()                     -- R: this coroutine
    local C = {}
    C.co = h.spawn(function()
      s:acquire()
      local r = m:acquire()
      r(); C.done = true
    end)
    s:release()                                -- the first signal, to C
    h.wait_until(function() return coroutine.status(C.co) == "suspended" and am.pending() == 1 end)
    h.spawn(function() h.sleep(5); s:release() end)   -- P
    local ok, err = pcall(s.acquire, s)
    assert.is_true(ok, err)
    assert.equal(0, rec.count("deadlock"))
    rm()
    h.wait_until(function() return C.done end)
  end))
end)
