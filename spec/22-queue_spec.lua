-- The queues' structure (src/core/queue/queue.c): one FIFO list per distinct priority
-- or timeout duration, found by a hash and ordered by a heap.  These tests
-- drive many distinct keys through insertions and removals from the middle
-- (timeouts, coroutine.close) and check every outcome against a plain
-- sorted-list reference.
local h = require "helpers"
local am = require "async_mutex"

-- Park-Miller, so that every run sees the same sequence.
local function rng(seed)
  local x = seed
  return function(m)
    x = x * 48271 % 2147483647
    return x % m + 1
  end
end

-- The queue order: higher priority first, then arrival.
local function by_priority(a, b)
  if a.p ~= b.p then return a.p > b.p end
  return a.i < b.i
end

-- Releases the holder and checks that the waiters {p = priority, i = name}
-- still queued are granted in queue order, each logging its name.
local function expect_grants(waiters, release, log)
  table.sort(waiters, by_priority)
  local expected = {}
  for k, x in ipairs(waiters) do expected[k] = x.i end
  release()
  h.wait_until(function() return #log == #expected end, 10000)   -- a long chain
  assert.same(expected, log)
end

describe("queues with many distinct keys", function()
  -- waiters other specs left behind, on purpose, count in am.pending()
  local no_more_pending = h.pending_baseline(before_each)
  it("grant in priority order after removals from the middle of many buckets", h.async(function()
    local rand = rng(2024)
    local m, release = h.held(am.Mutex.new())
    local log, waiters, survivors = {}, {}, {}
    -- 300 distinct priorities (fractions, negatives, infinities, both zeros)
    local prios = { 0, -0.0, math.huge, -math.huge }
    for k = 1, 296 do prios[#prios + 1] = (k - 150) / 7 end
    for i = 1, 1500 do
      local p = prios[rand(#prios)]
      waiters[i] = { p = p, i = i, w = h.chain(log, i, m, p) }
    end
    -- close a third of them, spread over every bucket, some buckets entirely
    for i = 1, 1500 do
      local x = waiters[i]
      if rand(3) == 1 or x.p == -math.huge then
        coroutine.close(x.w.co)
      else
        survivors[#survivors + 1] = x
      end
    end
    -- and add more behind them into buckets that were emptied and dropped
    for i = 1501, 1700 do
      local p = (i % 2 == 0) and -math.huge or prios[rand(#prios)]
      local x = { p = p, i = i, w = h.chain(log, i, m, p) }
      survivors[#survivors + 1] = x
    end
    expect_grants(survivors, release, log)
    assert.is_false(m:isLocked())
    no_more_pending()
  end, { deadline = 60000 }))   -- 1,700 coroutines: ~12 s under `make gcstress`, 20+ loaded

  it("find every bucket again after many were dropped, made and dropped", h.async(function()
    local rand = rng(99)
    local m, release = h.held(am.Mutex.new())
    local log, live = {}, {}
    local n = 0
    local function add(p)
      n = n + 1
      live[n] = { p = p, i = n, w = h.chain(log, n, m, p) }
    end
    -- rounds of: fill 1000 keys sparsely, then close most waiters, so that
    -- buckets are dropped from a crowded hash (and the hash shrinks) while
    -- others stay, then the same keys come back
    for _ = 1, 3 do
      for _ = 1, 1500 do add(rand(1000) * 1.5) end
      for i, x in pairs(live) do
        if rand(4) ~= 1 then
          coroutine.close(x.w.co)
          live[i] = nil
        end
      end
    end
    local survivors = {}
    for _, x in pairs(live) do survivors[#survivors + 1] = x end
    expect_grants(survivors, release, log)
    no_more_pending()
  end, { deadline = 60000 }))   -- 4,500 coroutines: ~20 s under `make gcstress`

  it("treat 0 and -0 as one priority, FIFO", h.async(function()
    local m, release = h.held(am.Mutex.new())
    local log = {}
    h.chain(log, "a", m, 0)
    h.chain(log, "b", m, -0.0)
    h.chain(log, "c", m)
    h.chain(log, "d", m, -0.0)
    release()
    h.wait_until(function() return #log == 4 end)
    assert.same({ "a", "b", "c", "d" }, log)
  end))

  -- (deadlines from the loop's time, as 'expected' counts them: the clock
  -- read at each request would order them by microseconds)
  it("expire many distinct timeouts in deadline order, then arrival order", h.async(function()
   h.with_loop_clock(function()
    local rand = rng(77)
    local m, release = h.held(am.Mutex.new())
    local log, expected = {}, {}
    local t0 = require("luv").now()
    -- 400 waiters over 60 distinct durations, enqueued over a few loop turns
    -- so that some deadlines tie across durations
    local n = 0
    for turn = 1, 4 do
      local now = require("luv").now() - t0
      for _ = 1, 100 do
        n = n + 1
        local ms = 5 + rand(60)
        local tm = am.withTimeout(m, ms, "timeout " .. n)
        local w = h.acquirer(log, n, tm)
        expected[#expected + 1] = { due = now + ms, i = n, w = w }
      end
      if turn < 4 then h.sleep(2) end
    end
    h.wait_until(function() return #log == n end, 5000)
    table.sort(expected, function(a, b)
      if a.due ~= b.due then return a.due < b.due end
      return a.i < b.i
    end)
    local order = {}
    for k, x in ipairs(expected) do
      order[k] = x.i
      assert.is_false(x.w.ok)
      assert.equal("timeout " .. x.i, x.w.err)
    end
    assert.same(order, log)
    release()
    assert.is_false(m:isLocked())
   end)
  end))

  it("expire timeouts whose deadlines round to one value in arrival order", h.async(function()
    local uv = require "luv"
    local s = am.Semaphore.new(1)
    local ms_a, ms_b = 0.3, 0.1 + 0.2        -- differ in the last bit only
    assert.is_true(ms_a ~= ms_b and uv.now() + ms_a == uv.now() + ms_b)
    local log = {}
    local a = h.acquirer(log, "a", am.withTimeout(s, ms_a, "late a"), 2)   -- blocks b
    local b = h.acquirer(log, "b", am.withTimeout(s, ms_b, "late b"), 1)
    h.wait_until(function() return #log == 2 end)
    -- a expires first (it came first), and its removal lets b in at once
    assert.same({ "a", "b" }, log)
    assert.equal("late a", a.err)
    assert.is_true(b.ok)
    b.release()
    assert.equal(1, s:getValue())
  end))

  it("leave the timer queue when granted, closed or timed out, in any bucket", h.async(function()
    local rand = rng(5)
    local s = am.Semaphore.new(0)
    local granted, timed_out, closed = 0, 0, 0
    local waiters = {}
    for i = 1, 600 do
      local tm = am.withTimeout(s, 20 + rand(200), "late")
      waiters[i] = h.acquirer(nil, i, tm, 1, rand(5))
    end
    for i = 1, 600, 3 do
      coroutine.close(waiters[i].co)
      closed = closed + 1
    end
    s:setValue(150)              -- grants 150 of the 400 left, by priority
    h.wait_until(function()
      local done = 0
      for i = 1, 600 do if waiters[i].done then done = done + 1 end end
      return done == 400
    end, 5000)
    for i = 1, 600 do
      local w = waiters[i]
      if w.ok then granted = granted + 1; w.release()
      elseif w.done then
        assert.equal("late", w.err)
        timed_out = timed_out + 1
      end
    end
    assert.equal(200, closed)
    assert.equal(150, granted)
    assert.equal(250, timed_out)
    assert.equal(150, s:getValue())
    no_more_pending()
  end))
end)
