-- Hand-off never recurses and removal never scans: large numbers of waiters.
local h = require "helpers"
local am = require "async_mutex"

describe("hand-off under load", function()
  it("lets 100,000 coroutines queued behind a holder each acquire and release without yielding", h.async(function()
    local N = h.load(100000)
    local m, r = h.held(am.Mutex.new())
    local n, order_ok = 0, true
    local base = am.pending()
    local function worker(i)
      local rel = m:acquire()
      n = n + 1
      if n ~= i then order_ok = false end
      rel()
    end
    for i = 1, N do coroutine.wrap(worker)(i) end
    assert.equal(base + N, am.pending())
    r()
    h.wait_until(function() return n == N end, 20000, "all workers through")
    assert.is_true(order_ok)
    assert.is_false(m:isLocked())
    assert.equal(base, am.pending())
  end, { deadline = 30000 }))

  it("lets 30,000 runExclusive calls queued behind a holder all run", h.async(function()
    local N = h.load(30000)
    local m, r = h.held(am.Mutex.new())
    local n = 0
    local function worker() m:runExclusive(function() n = n + 1 end) end
    for _ = 1, N do coroutine.wrap(worker)() end
    r()
    h.wait_until(function() return n == N end, 20000)
    assert.is_false(m:isLocked())
  end, { deadline = 30000 }))

  it("lets 30,000 weighted Semaphore acquirers through, one release granting many", h.async(function()
    local N = h.load(30000)
    local s = am.Semaphore.new(0)
    local n, max_value = 0, 0
    local function worker(w)
      local v, rel = s:acquire(w)
      if v > max_value then max_value = v end
      n = n + 1
      rel()
    end
    for i = 1, N do coroutine.wrap(worker)(1 + i % 3) end
    s:setValue(5)
    h.wait_until(function() return n == N end, 20000)
    assert.equal(5, s:getValue())
    assert.is_true(max_value <= 5)
  end, { deadline = 30000 }))

  it("removes timed-out waiters without scanning the queue", h.async(function()
    -- 40,000 withTimeout waiters whose deadlines pass in reverse queue order
    -- (the latest queued first): a removal that walks the queue from its head
    -- would visit ~9*10^8 entries; compare with the forward order.
    local N = h.load(40000)
    local function run(reverse)
      local m, r = h.held(am.Mutex.new())
      local wts = {}
      for k = 0, 9 do wts[k] = am.withTimeout(m, 5 + k) end
      local done = 0
      for i = 1, N do
        local k = math.floor((i - 1) * 10 / N)          -- 0..9 in queue order
        local wt = wts[reverse and (9 - k) or k]
        coroutine.wrap(function()
          pcall(wt.acquire, wt)
          done = done + 1
        end)()
      end
      local c0 = os.clock()
      h.wait_until(function() return done == N end, 10000)
      local cpu = os.clock() - c0
      r()
      return cpu
    end
    local forward = run(false)
    local reverse = run(true)
    if h.SLOW then return end                  -- timings mean nothing there
    assert.is_true(reverse < forward * 2 + 0.2,
      ("reverse-order expiry took %.3f s of CPU against %.3f s forward"):format(reverse, forward))
  end, { deadline = 30000 }))
end)
