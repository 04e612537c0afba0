-- Queue order: priorities (higher first, FIFO among equals), weights and
-- head-of-line blocking, the immediate-grant rule (docs/semantics.md, Grant
-- rule; Dispatch).
local h = require "helpers"
local am = require "async_mutex"

describe("priority order", function()
  it("grants a Mutex to higher priorities first and FIFO within a priority", h.left_free(am.Mutex.new, function(m)
    local log = {}
    local r = m:acquire()
    h.chain(log, "a0", m, 0)
    h.chain(log, "b5", m, 5)
    h.chain(log, "c0", m)                      -- default priority 0
    h.chain(log, "d5", m, 5)
    h.chain(log, "e-1", m, -1)
    h.chain(log, "f2.5", m, 2.5)
    h.chain(log, "g-0.5", m, -0.5)
    h.chain(log, "hinf", m, math.huge)
    h.chain(log, "i-inf", m, -math.huge)
    r()
    h.wait_until(function() return #log == 9 end)
    assert.same({ "hinf", "b5", "d5", "f2.5", "a0", "c0", "g-0.5", "e-1", "i-inf" }, log)
  end))

  it("grants a Semaphore to higher priorities first and FIFO within a priority", h.async(function()
    local s = am.Semaphore.new(0)
    local log = {}
    h.chain(log, "a", s, 1, 0)
    h.chain(log, "b", s, 1, 2)
    h.chain(log, "c", s, 1, 1)
    h.chain(log, "d", s, 1, 2)
    s:setValue(1)
    h.wait_until(function() return #log == 4 end)
    assert.same({ "b", "d", "c", "a" }, log)
    assert.equal(1, s:getValue())
  end))

  it("keeps this order for many random priorities", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local log, expected = {}, {}
    local seed = 12345
    for i = 1, 200 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local p = seed % 7 - 3
      expected[i] = { p = p, i = i }
      h.chain(log, i, m, p)
    end
    table.sort(expected, function(x, y)
      if x.p ~= y.p then return x.p > y.p end
      return x.i < y.i
    end)
    for k, e in ipairs(expected) do expected[k] = e.i end
    r()
    h.wait_until(function() return #log == 200 end)
    assert.same(expected, log)
  end))

  it("lets a newcomer with a higher priority than the whole queue become its head", h.async(function()
    local m = am.Mutex.new()
    local log = {}
    local r = m:acquire()
    h.chain(log, "a", m, 0)
    h.chain(log, "b", m, 0)
    h.chain(log, "c", m, 1)
    r()
    h.wait_until(function() return #log == 3 end)
    assert.same({ "c", "a", "b" }, log)
  end))
end)

describe("weights", function()
  it("grants several waiters of one release in priority order, with their grant-time values", h.async(function()
    local s = am.Semaphore.new(0)
    local log = {}
    local a = h.acquirer(log, "a", s, 2, 0)
    local b = h.acquirer(log, "b", s, 1, 0)
    local c = h.acquirer(log, "c", s, 1, 1)
    s:setValue(4)
    assert.equal(0, s:getValue())
    h.tick()
    assert.same({ "c", "a", "b" }, log)       -- resumed in grant order
    assert.same({ 4, 3, 1 }, { c.value, a.value, b.value })
    a.release(); b.release(); c.release()
    assert.equal(4, s:getValue())
  end))

  it("dispatches strictly from the head: a heavy head blocks lighter requests behind it", h.async(function()
    local s = am.Semaphore.new(0)
    local a = h.acquirer(nil, "a", s, 3)
    local b = h.acquirer(nil, "b", s, 1)
    s:release(2)
    assert.equal(2, s:getValue())
    h.tick(2)
    assert.is_false(a.done)
    assert.is_false(b.done)
    s:release(1)
    assert.equal(0, s:getValue())
    h.tick()
    assert.is_true(a.done)
    assert.equal(3, a.value)
    assert.is_false(b.done)
    a.release()
    h.tick()
    assert.is_true(b.done)
    b.release()
    assert.equal(3, s:getValue())
  end))

  it("queues an equal-priority request behind a blocked head even when the value would cover it", h.async(function()
    local s = am.Semaphore.new(2)
    local a = h.acquirer(nil, "a", s, 3)
    local b = h.acquirer(nil, "b", s, 1)
    assert.is_false(a.done)
    assert.is_false(b.done)                    -- head-of-line blocking
    assert.equal(2, s:getValue())
    s:setValue(3)                              -- a takes all 3, b still waits
    h.served_in_turn(a, b)
  end))

  it("lets a request skip the queue only with a strictly higher priority than its head", h.async(function()
    local s = am.Semaphore.new(2)
    local a = h.acquirer(nil, "a", s, 3, 0)
    local b = h.acquirer(nil, "b", s, 1, 0)
    local c = h.acquirer(nil, "c", s, 1, 1)
    local d = h.acquirer(nil, "d", s, 1, 0.5)
    assert.is_false(a.done)
    assert.is_false(b.done)
    assert.is_true(c.done)                     -- immediate, no yield
    assert.equal(2, c.value)
    assert.is_true(d.done)
    assert.equal(1, d.value)
    assert.equal(0, s:getValue())
    local e = h.acquirer(nil, "e", s, 1, 5)    -- higher priority but no value left
    assert.is_false(e.done)
    c.release()
    h.tick()
    assert.is_true(e.done)                     -- e became the head
    assert.is_false(a.done)
    d.release(); e.release()
    s:cancel()
  end))

  it("makes a heavy request with the top priority the head, blocking everyone behind it", h.async(function()
    local s = am.Semaphore.new(1)
    local a = h.acquirer(nil, "a", s, 2, 5)
    local b = h.acquirer(nil, "b", s, 1, 0)
    assert.is_false(a.done)
    assert.is_false(b.done)
    local c = h.acquirer(nil, "c", s, 1, 10)   -- beats the head's priority: immediate
    assert.is_true(c.done)
    assert.equal(0, s:getValue())
    s:release(2)
    h.tick()
    assert.is_true(a.done)
    assert.equal(2, a.value)
    assert.is_false(b.done)
    c.release()
    h.tick()
    assert.is_true(b.done)
    a.release(); b.release()
    assert.equal(3, s:getValue())
  end))

  it("applies the same immediate-grant rule to a Mutex with priorities", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local a = h.acquirer(nil, "a", m, 0)
    r()                                        -- a granted, queue empty, locked
    local b = h.acquirer(nil, "b", m, 100)
    assert.is_false(b.done)                    -- no value left, whatever the priority
    h.tick()
    assert.is_true(a.done)
    a.release()
    h.tick()
    assert.is_true(b.done)
    b.release()
  end))
end)
