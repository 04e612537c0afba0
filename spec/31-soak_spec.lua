-- Stress and soak: many coroutines contending, a million cycles with flat
-- memory, mass timeouts racing grants, mass cancel.
-- Sizes go through h.load (AM_STRESS_SCALE, AM_GC_STRESS); deadlines and
-- wait_until limits stretch by h.TIME_SCALE when the suite runs slowed down.
-- spec/16-stress_spec.lua already covers 100,000 waiters queued behind one
-- holder handing off without yielding, and timeout removal cost.
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

-- Parks the running coroutine for good after its outcome, so a second
-- resume by the module (a waiter settled twice) is seen: `extra` counts them.
local function parker()
  local p = { extra = 0, parked = {} }
  function p.park()
    local co = coroutine.running()
    p.parked[#p.parked + 1] = co
    coroutine.yield()
    p.extra = p.extra + 1                    -- only a stray resume gets here
  end
  function p.close_all()
    for i, co in ipairs(p.parked) do
      coroutine.close(co)
      p.parked[i] = nil
    end
  end
  return p
end

describe("contention", function()
  it("lets 100,000 coroutines arriving in waves through one mutex, one at a time, in arrival order", h.async(function()
    -- Unlike 16-stress (everyone queued, then released), workers arrive
    -- while the lock is being passed on, some holders yield to the loop
    -- while holding, and acquire, runExclusive and a withTimeout acquire
    -- are mixed.  Catches a lost or duplicated hand-off, a grant out of
    -- FIFO order, or two holders at once, under a long-running chain.
    local N = h.load(100000)
    local WAVE = 2000
    local base = am.pending()
    local m = am.Mutex.new()
    local wt = am.withTimeout(m, 600000)
    local inside, next_i, out_of_order, done = h.occupancy(), 1, 0, 0
    local function critical(i)
      inside:enter()
      if i ~= next_i then out_of_order = out_of_order + 1 end
      next_i = i + 1
      if i % 500 == 0 then h.tick() end        -- hold across a loop turn
      inside:leave()
      done = done + 1
    end
    local function worker(i)
      local k = i % 3
      if k == 0 then
        local r = m:acquire()
        critical(i)
        r()
      elseif k == 1 then
        m:runExclusive(function() critical(i) end)
      else
        local r = wt:acquire()
        critical(i)
        r()
      end
    end
    local hold = m:acquire()
    local spawned = 0
    local t0 = os.clock()
    h.spawn(function()
      while spawned < N do
        for _ = 1, math.min(WAVE, N - spawned) do
          spawned = spawned + 1
          coroutine.wrap(worker)(spawned)
        end
        if spawned == WAVE or spawned >= N then hold() end   -- open after the first wave
        h.tick()
      end
    end)
    h.wait_until(function() return done == N end, 30000, "all workers through")
    assert.equal(1, inside:most())           -- one at a time
    assert.equal(0, out_of_order)
    assert.is_false(m:isLocked())
    assert.equal(base, am.pending())
    assert.equal(0, h.count_handles("uv_timer_t", true))
    if not h.SLOW then
      assert.is_true(os.clock() - t0 < 10, ("%.1f s of CPU"):format(os.clock() - t0))
    end
  end, { deadline = 60000 }))
end)

-- The soak workload, as a chunk run both here and in a fresh process (RSS
-- means something only there: in this process, memory freed by earlier
-- tests is reused and hides a leak).  Arguments: TOTAL cycles, POINTS
-- measurements.  Runs uv.run() itself; returns a table of results.
--
-- Six groups of coroutines, one lock each, go round in strict alternation
-- (each releases to a waiting partner, then queues again), so most cycles
-- wait: each of those allocates a waiter, a registry reference and a
-- ready-list slot, and the timed ones a timer-heap slot.  The groups: Mutex
-- acquire; Mutex runExclusive; withTimeout Mutex acquire; weighted
-- Semaphore acquire with priorities; timed Semaphore acquire; acquirers
-- with a failing tryAcquire while a higher-priority waitForUnlock waiter
-- is resolved at every release.  Memory is measured after full
-- collections before the run, every TOTAL/POINTS cycles, and after it.
local SOAK = [==[
local TOTAL, POINTS = ...
local uv = require "luv"
local am = require "async_mutex"
local function rss_kb()
  local f = io.open("/proc/self/status", "r")
  if not f then return -1 end
  local text = f:read("a")
  f:close()
  return tonumber(text:match("VmRSS:%s*(%d+)%s*kB")) or -1
end
local EVERY = math.max(1, TOTAL // POINTS)
local res = { heap = {}, rss = {}, errors = {}, cycles = 0, waited = 0 }
local function measure()
  collectgarbage("collect"); collectgarbage("collect")
  res.heap[#res.heap + 1] = collectgarbage("count")
  res.rss[#res.rss + 1] = rss_kb()
end
local cycles, finished, workers, started, waited = 0, 0, 0, 0, 0
local function count()
  cycles = cycles + 1
  if cycles % EVERY == 0 then measure() end
end
local noop = function() end
local locks = {
  am.Mutex.new(), am.Mutex.new(), am.Mutex.new(),
  am.Semaphore.new(2), am.Semaphore.new(1), am.Mutex.new(),
}
local timed2 = am.withTimeout(locks[3], 600000)
local timed5 = am.withTimeout(locks[5], 600000)
local try6 = am.tryAcquire(locks[6])
local bodies = {
  function() local r = locks[1]:acquire(); r() end,
  function() locks[2]:runExclusive(noop) end,
  function() local r = timed2:acquire(); r() end,
  function(j) local _, r = locks[4]:acquire(2, j % 3); r() end,
  function(j) local _, r = timed5:acquire(1, j % 2); r() end,
  function()
    local r = locks[6]:acquire()
    assert(not pcall(try6.acquire, try6))
    r()
  end,
}
local function worker(body)
  local j = 0
  while cycles < TOTAL do
    j = j + 1
    started = started + 1                      -- a body waited if another
    local mine = started                       -- one started meanwhile
    body(j)
    if started ~= mine then waited = waited + 1 end
    count()
  end
  finished = finished + 1
end
local function unlock_watcher()
  while cycles < TOTAL do
    locks[6]:waitForUnlock(1)                  -- above the queued acquirers
    count()
  end
  finished = finished + 1
end
local prev = am.setErrorHandler(function(err) res.errors[#res.errors + 1] = tostring(err) end)
measure()
local holds = {}
coroutine.wrap(function()                      -- held, so that everyone queues first
  for i = 1, 6 do
    local a, b = locks[i]:acquire(i == 4 and 2 or nil)
    holds[i] = b or a                          -- a Semaphore returns value, releaser
  end
end)()
for _, body in ipairs(bodies) do
  for _ = 1, 2 do coroutine.wrap(worker)(body); workers = workers + 1 end
end
coroutine.wrap(unlock_watcher)(); workers = workers + 1
local t0 = os.clock()
for _, r in ipairs(holds) do r() end
uv.run()
res.cpu = os.clock() - t0
measure()
am.setErrorHandler(prev)
res.cycles, res.waited, res.all_finished = cycles, waited, finished == workers
res.unlocked = true
for _, lk in ipairs(locks) do res.unlocked = res.unlocked and not lk:isLocked() end
res.values = { locks[4]:getValue(), locks[5]:getValue() }
res.pending = am.pending()
return res
]==]

-- Max growth of t[i] over t[from], for i > from.
local function growth(t, from)
  local g = 0
  for i = from + 1, #t do g = math.max(g, t[i] - t[from]) end
  return g
end

local function list(t)
  local parts = {}
  for i, v in ipairs(t) do parts[i] = ("%.0f"):format(v) end
  return table.concat(parts, " ")
end

-- Checks a soak result; t[2] (after the first tenth: arrays grown to their
-- working size) is the reference.  A leak of one registry reference or one
-- small malloc per cycle shows as megabytes.
local function check_soak(res, total, base_pending, with_rss)
  assert.same({}, res.errors)
  assert.is_true(res.all_finished)
  assert.is_true(res.cycles >= total)
  assert.is_true(res.waited > res.cycles / 2,
    ("only %d of %d cycles waited"):format(res.waited, res.cycles))
  assert.is_true(res.unlocked)
  assert.same({ 2, 1 }, res.values)
  assert.equal(base_pending, res.pending)
  local g = growth(res.heap, 2)
  assert.is_true(g < 128,
    ("Lua heap grew by %.0f KB after warm-up (KB at each point: %s)"):format(g, list(res.heap)))
  if with_rss then
    local r = growth(res.rss, 2)
    assert.is_true(res.rss[1] > 0, "no VmRSS in /proc/self/status")
    assert.is_true(r < 2048,
      ("RSS grew by %d KB after warm-up (KB at each point: %s)"):format(r, list(res.rss)))
  end
  if os.getenv("AM_SOAK_VERBOSE") then
    io.stderr:write(("\n%d cycles (%d waited), %.2f s CPU\nheap KB: %s\nRSS KB: %s\n"):format(
      res.cycles, res.waited, res.cpu, list(res.heap), list(res.rss)))
  end
end

describe("soak", function()
  it("runs 1,000,000 acquire/release cycles in a fresh process with a flat Lua heap and RSS", function()
    local TOTAL = h.load(1000000)
    local out = h.subprocess(([[
      local res = load(%q)(%d, 10)
      local function nums(t) local o = {} for i, v in ipairs(t) do o[i] = ("%%.0f"):format(v) end return "{" .. table.concat(o, ",") .. "}" end
      io.write(("return { heap = %%s, rss = %%s, errors = {%%s}, cycles = %%d, waited = %%d, cpu = %%.3f, "
        .. "all_finished = %%s, unlocked = %%s, values = %%s, pending = %%d }"):format(
        nums(res.heap), nums(res.rss), #res.errors > 0 and ("%%q"):format(table.concat(res.errors, "\n")) or "",
        res.cycles, res.waited, res.cpu, tostring(res.all_finished), tostring(res.unlocked),
        nums(res.values), res.pending))
    ]]):format(SOAK, TOTAL), 120)
    local res = assert(load(h.clean_exit(out)))()
    -- the child inherits a sanitizer runtime (make asan): its quarantine of
    -- freed memory grows the RSS by design, so only the Lua heap counts there
    local sanitized = os.getenv("ASAN_OPTIONS") or (os.getenv("LD_PRELOAD") or ""):find("san", 1, true)
    check_soak(res, TOTAL, 0, not sanitized)
  end)

  it("runs the same cycles in this process (under valgrind and GC stress too) with a flat Lua heap", function()
    local TOTAL = h.load(1000000)
    local base = am.pending()
    uv.update_time()
    local res = assert(load(SOAK))(TOTAL, 10)
    check_soak(res, TOTAL, base, false)
    assert.same({}, h.active_handles())
  end)
end)

describe("timeouts en masse", function()
  it("settles 100,000 waiters whose deadlines pass at the same instant as racing releases, each exactly once", h.async(function()
   h.with_loop_clock(function()
    -- Every waiter is queued in the same loop turn, so all deadlines are
    -- the same instant T (counted from the loop's time: h.with_loop_clock).  Two releases are due at T as well: one from a
    -- timer started before the waiters queued (libuv runs timers due at
    -- the same time in start order, so it runs before the module's
    -- deadline timer and its grants win), one from a timer started after
    -- (every waiter has timed out by then).  Catches: a waiter granted and
    -- then also timed out (or the reverse), a grant left to a timed-out
    -- waiter (phantom owner: value lost), a waiter never settled, a
    -- waiter resumed twice, grants out of queue order, a timer left on.
    local N = h.load(100000)
    local T = 40
    local base = am.pending()
    local s = am.Semaphore.new(0)
    local wt = am.withTimeout(s, T)
    local K1, K2 = N // 4, N // 8
    local p = parker()
    local outcome, twice, granted, timedout, bad = {}, 0, 0, 0, 0
    local grant_order, releasers = {}, {}
    local first = uv.new_timer()
    first:start(T, 0, function() first:close(); s:release(K1) end)
    local function waiter(i)
      local ok, v, r = pcall(wt.acquire, wt, 1, i % 3)
      if outcome[i] then twice = twice + 1 end
      if ok then
        outcome[i] = "granted"
        granted = granted + 1
        grant_order[#grant_order + 1] = i
        releasers[#releasers + 1] = r
        if v < 1 then bad = bad + 1 end
      else
        outcome[i] = v
        if v == am.E_TIMEOUT then timedout = timedout + 1 else bad = bad + 1 end
      end
      p.park()
    end
    for i = 1, N do coroutine.wrap(waiter)(i) end
    local second = uv.new_timer()
    second:start(T, 0, function() second:close(); s:release(K2) end)
    assert.equal(base + N, am.pending())
    h.wait_until(function() return granted + timedout == N end, 20000, "every waiter settled")
    h.tick(2)
    assert.equal(0, twice)
    assert.equal(0, bad)
    assert.equal(0, p.extra)
    assert.equal(K1, granted)
    assert.equal(N - K1, timedout)
    -- the grants went to the head of the queue: priority 2, then 1, then 0, FIFO within
    local expected = {}
    for prio = 2, 0, -1 do
      for i = 1, N do
        if i % 3 == prio and #expected < K1 then expected[#expected + 1] = i end
      end
    end
    for k = 1, K1 do
      if grant_order[k] ~= expected[k] then
        error(("grant %d went to waiter %s, expected %s"):format(k, tostring(grant_order[k]), expected[k]))
      end
    end
    assert.equal(base, am.pending())
    assert.equal(K2, s:getValue())             -- nothing lost to a timed-out waiter
    assert.equal(0, h.count_handles("uv_timer_t", true))
    for _, r in ipairs(releasers) do r() end
    assert.equal(K1 + K2, s:getValue())
    p.close_all()
    local late = h.acquirer(nil, "late", wt, K1 + K2)
    assert.is_true(late.ok)
    late.release()
   end)
  end, { deadline = 60000 }))
end)

describe("cancel en masse", function()
  it("rejects 100,000 waiters with E_CANCELED exactly once each, in queue order, and leaves the holder and waitForUnlock waiters alone", h.async(function()
    -- acquire, runExclusive and withTimeout acquire mixed, with priorities.
    -- Catches: a waiter rejected twice or never, a rejection delivered out
    -- of queue order, runExclusive calling fn after a cancel, a timer of a
    -- canceled withTimeout waiter left on, cancel() revoking the holder
    -- or rejecting waitForUnlock waiters, and recursion or quadratic work
    -- in cancel (the deadline).
    local N = h.load(100000)
    local W = 10
    local base = am.pending()
    local m = am.Mutex.new()
    local wt = am.withTimeout(m, 600000)
    local hold = m:acquire()
    local p = parker()
    local order, outcome, twice, bad, called = {}, {}, 0, 0, 0
    local function prio(i) return (i * 7919) % 5 - 2 end
    local fn = function() called = called + 1 end
    local function waiter(i)
      local k = i % 3
      local ok, err
      if k == 0 then ok, err = pcall(m.acquire, m, prio(i))
      elseif k == 1 then ok, err = pcall(m.runExclusive, m, fn, prio(i))
      else ok, err = pcall(wt.acquire, wt, prio(i)) end
      if outcome[i] then twice = twice + 1 end
      outcome[i] = true
      if ok or err ~= am.E_CANCELED then bad = bad + 1 end
      order[#order + 1] = i
      p.park()
    end
    for i = 1, N do coroutine.wrap(waiter)(i) end
    local unlock = {}
    for i = 1, W do unlock[i] = h.waiter(nil, "u" .. i, m) end
    assert.equal(base + N + W, am.pending())
    assert.equal(1, h.count_handles("uv_timer_t", true))
    m:cancel()
    assert.equal(0, h.count_handles("uv_timer_t", true))   -- stopped at cancel time
    assert.is_true(m:isLocked())
    assert.equal(0, #order)                                -- deferred
    h.wait_until(function() return #order == N end, 20000, "every waiter rejected")
    h.tick(2)
    assert.equal(N, #order)
    assert.equal(0, twice)
    assert.equal(0, bad)
    assert.equal(0, called)
    assert.equal(0, p.extra)
    -- queue order: priority descending, arrival order within a priority
    local expected = {}
    for i = 1, N do expected[i] = i end
    table.sort(expected, function(a, b)
      if prio(a) ~= prio(b) then return prio(a) > prio(b) end
      return a < b
    end)
    for k = 1, N do
      if order[k] ~= expected[k] then
        error(("rejection %d went to waiter %d, expected %d"):format(k, order[k], expected[k]))
      end
    end
    assert.is_true(m:isLocked())
    for i = 1, W do assert.is_false(unlock[i].done) end
    assert.equal(base + W, am.pending())
    hold()
    h.tick()
    for i = 1, W do assert.is_true(unlock[i].ok) end
    assert.is_false(m:isLocked())
    assert.equal(base, am.pending())
    p.close_all()
    local after = h.acquirer(nil, "after", m)
    assert.is_true(after.ok)
    after.release()

    -- a Semaphore with weights and a custom cancel error: raised unchanged
    local E = { "custom cancel" }
    local s = am.Semaphore.new(1, E)
    local n2 = math.max(1, N // 10)
    local errs, held = 0, s:getValue()
    local _, hs = s:acquire(1)
    for i = 1, n2 do
      coroutine.wrap(function()
        local ok, err = pcall(s.acquire, s, 1 + i % 4, i % 2)
        if not ok and rawequal(err, E) then errs = errs + 1 end
      end)()
    end
    s:cancel()
    h.wait_until(function() return errs == n2 end, 20000)
    hs()
    assert.equal(held, s:getValue())
  end, { deadline = 60000 }))
end)
