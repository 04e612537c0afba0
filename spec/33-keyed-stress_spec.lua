-- Keyed locks under load: memory follows the keys in use, not the keys
-- ever seen; multi-key requests in opposite orders never deadlock under many
-- random interleavings (docs/semantics.md, Keyed locks).  The rules one by
-- one are in 17-19.
--
-- AM_VERBOSE=1 prints the measured figures on stderr.
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

-- Under AM_GC_STRESS=1 (a collection step at nearly every allocation) the
-- counts are cut, and the time limit is not checked.
local STRESS = h.SLOW                  -- GC stress, asan, valgrind
local VERBOSE = os.getenv("AM_VERBOSE") == "1"

local function report(fmt, ...)
  if VERBOSE then io.stderr:write(fmt:format(...), "\n") end
end

--- Bytes in use by Lua after a full collection.
local function heap()
  h.gc()
  return math.floor(collectgarbage("count") * 1024)
end

-- Memory may differ from the baseline by this much (table slots, string
-- interning), far below the ~100 bytes a key left behind would cost per key.
local TOLERANCE = 32 * 1024


describe("memory of keyed locks", function()
  it("returns to its baseline after 1,000,000 distinct keys each locked and released", h.async(function()
    local N = STRESS and 10000 or 1000000
    local BATCH = 100                               -- keys held at once
    local km = am.KeyedMutex.new()
    local rs = {}
    -- warm up: the set's table and the registry grow to a batch once
    for i = 1, BATCH do rs[i] = km:acquire(-i) end
    for i = 1, BATCH do rs[i](); rs[i] = nil end
    local before = heap()
    local t0 = uv.hrtime()
    for base = 0, N - 1, BATCH do
      for i = 1, BATCH do rs[i] = km:acquire(base + i) end
      if base % 100000 == 0 then assert.equal(BATCH, km:count()) end
      for i = 1, BATCH do rs[i](); rs[i] = nil end
    end
    local seconds = (uv.hrtime() - t0) / 1e9
    assert.equal(0, km:count())
    assert.same({}, km:keys())
    local after = heap()
    report("keyed memory: %d keys in %.2f s; %d bytes before, %d after", N, seconds, before, after)
    assert.is_true(math.abs(after - before) < TOLERANCE,
      ("memory went from %d to %d bytes"):format(before, after))
  end, { deadline = 30000 }))

  it("returns to its baseline after 200,000 KeyedSemaphore keys with weights", h.async(function()
    local N = STRESS and 2000 or 200000
    local ks = am.KeyedSemaphore.new(3)
    local _, r = ks:acquire("warm", 2); r()
    local before = heap()
    for i = 1, N do
      local v, r1 = ks:acquire(i, 2)
      local _, r2 = ks:acquire(i)
      assert(v == 3 and ks:getValue(i) == 0)
      r2(); r1()
    end
    assert.equal(0, ks:count())
    local after = heap()
    report("keyed semaphore memory: %d keys; %d bytes before, %d after", N, before, after)
    assert.is_true(math.abs(after - before) < TOLERANCE,
      ("memory went from %d to %d bytes"):format(before, after))
  end, { deadline = 30000 }))

  it("does not keep the keys themselves once they are idle", h.left_free(am.KeyedMutex.new, function(km)
    local seen = setmetatable({}, { __mode = "k" })
    for i = 1, 1000 do
      local key = { i }
      seen[key] = true
      local r = km:acquire(key)
      if i % 2 == 0 then
        local w = h.acquirer(nil, "w", km, key)
        r()
        h.tick()
        w.release()
      else
        r()
      end
    end
    h.gc()
    assert.is_nil(next(seen), "an idle key is still referenced")
  end))

  -- Every way a key's lock becomes idle must let it go: hand-over to a
  -- waiter, waitForUnlock waiters, cancel, timeout, a failed tryAcquire, a
  -- closed coroutine, acquireAll.
  local paths = {
    handover = function(km, key)
      local r = km:acquire(key)
      local w = h.acquirer(nil, "w", km, key)
      r()
      return function() w.release() end
    end,
    wait_for_unlock = function(km, key)
      local r = km:acquire(key)
      h.spawn(function() km:waitForUnlock(key) end)
      return r
    end,
    cancel = function(km, key)
      local r = km:acquire(key)
      h.spawn(function() pcall(km.acquire, km, key) end)
      km:cancel(key)
      return r
    end,
    timeout = function(km, key)
      local r = km:acquire(key)
      h.spawn(function() pcall(am.withTimeout(km, 0).acquire, am.withTimeout(km, 0), key) end)
      return r
    end,
    try = function(km, key)
      local r = km:acquire(key)
      pcall(function() am.tryAcquire(km):acquire(key) end)
      return r
    end,
    close = function(km, key)
      local r = km:acquire(key)
      local co = h.spawn(function() km:acquire(key) end)
      coroutine.close(co)
      return r
    end,
    acquire_all = function(km, key)
      local r = km:acquire(key)
      local co = h.spawn(function() km:acquireAll({ key, -key }) end)
      return function() r(); coroutine.close(co) end
    end,
  }
  for _, name in ipairs({ "handover", "wait_for_unlock", "cancel", "timeout", "try",
                          "close", "acquire_all" }) do
    it("returns to its baseline after 20,000 keys idle again by way of " .. name, h.async(function()
      local N = STRESS and 2000 or 20000
      local km = am.KeyedMutex.new()
      local base = am.pending()
      local function round(from, to)
        local finish = {}
        for i = from, to do finish[#finish + 1] = paths[name](km, i) end
        h.tick(2)
        for i = 1, #finish do finish[i]() end
        h.tick(2)
        assert.equal(0, km:count())
        assert.equal(base, am.pending())
      end
      round(1, 1000)                               -- warm up: one round as big
      local before = heap()
      for from = 1001, N, 1000 do round(from, from + 999) end
      local after = heap()
      report("keyed memory, %s: %d bytes before, %d after", name, before, after)
      assert.is_true(math.abs(after - before) < TOLERANCE,
        ("memory went from %d to %d bytes"):format(before, after))
    end, { deadline = 30000 }))
  end
end)


-- Random interleavings of multi-key requests: tasks lock random subsets of
-- a few keys, given in random orders (duplicates too), with random
-- priorities, timeouts, tries, cancels and coroutine.close, and random
-- yields.  Any deadlock leaves tasks suspended: wait_until fails.
local KEYS = { 1, 2, 3, "a", "b", true, 2.5 }

local function random_keys()
  local n = math.random(1, 4)
  local keys = {}
  for i = 1, n do keys[i] = KEYS[math.random(#KEYS)] end
  if math.random() < 0.5 then keys[#keys + 1] = keys[1] end     -- a duplicate
  return keys
end

local function random_pause()
  local r = math.random(4)
  if r == 1 then h.tick() elseif r == 2 then h.sleep(math.random(0, 1)) end
end

--- The seeds to run: n of them from first, or a few under GC stress.
local function seeds(first, n)
  local list = {}
  for i = 1, STRESS and math.min(n, 3) or n do list[i] = first + i - 1 end
  return list
end

--- One seeded round: returns how many acquisitions succeeded.  With
-- 'disturb', requests may also time out, fail a try, be canceled or have
-- their coroutine closed (which would also break a deadlock); without, every
-- request is a plain one that must be granted.
local function round(seed, lock, capacity, disturb)
  math.randomseed(seed)
  local NTASKS, NOPS = 24, 4
  local used = h.occupancy(capacity)   -- weight held right now, per key
  local tasks, finished, granted = {}, 0, 0
  local wt = am.withTimeout(lock, 3)
  local ta = am.tryAcquire(lock)

  local function task(t)
    for _ = 1, NOPS do
      random_pause()
      local keys = random_keys()
      local weight = capacity > 1 and math.random(1, capacity) or nil
      local priority = math.random(-1, 2)
      local how = math.random(10)
      local via = (not disturb) and lock or (how <= 2) and wt or (how == 3) and ta or lock
      local dedup, mine = {}, {}
      for _, k in ipairs(keys) do if not dedup[k] then dedup[k] = true; mine[#mine + 1] = k end end
      t.in_lock = true
      local ok, release
      if lock.getValue then
        ok, release = pcall(via.acquireAll, via, keys, weight, priority)
      else
        ok, release = pcall(via.acquireAll, via, keys, priority)
      end
      t.in_lock = false
      if ok then
        granted = granted + 1
        local rel <close> = release
        -- closes before the releaser: the marks go before the keys do
        local unmark <close> = setmetatable({}, { __close = function()
          for _, k in ipairs(mine) do used:leave(k, weight) end
        end })
        for _, k in ipairs(mine) do used:enter(k, weight) end   -- raises over capacity
        random_pause()
      else
        assert(disturb, "a plain request failed: " .. tostring(release))
        assert(release == am.E_TIMEOUT or release == am.E_ALREADY_LOCKED
          or release == am.E_CANCELED or release == am.E_MAX_PENDING, tostring(release))
      end
    end
  end

  for i = 1, NTASKS do
    local t = {}
    tasks[i] = t
    t.co = h.spawn(function()
      task(t)
      t.done = true
      finished = finished + 1
    end)
  end
  -- a disturber: cancels a key now and then, and closes tasks waiting in the lock
  local stop = not disturb
  local disturber = h.spawn(function()
    while not stop do
      h.sleep(1)
      if math.random() < 0.3 then lock:cancel(KEYS[math.random(#KEYS)]) end
      local t = tasks[math.random(NTASKS)]
      if not t.done and t.in_lock and math.random() < 0.2
          and coroutine.status(t.co) == "suspended" then
        assert(coroutine.close(t.co))
        t.done = true
        finished = finished + 1
      end
    end
  end)
  h.wait_until(function() return finished == NTASKS end, 5000,
    "seed " .. seed .. ": tasks still waiting (a deadlock?)")
  stop = true
  h.wait_until(function() return coroutine.status(disturber) == "dead" end)
  if not disturb then assert.equal(NTASKS * NOPS, granted) end
  for _, k in ipairs(KEYS) do
    assert(used:now(k) == 0, "seed " .. seed .. ": key still marked")
  end
  assert.equal(0, lock:count())
  return granted
end

describe("multi-key requests under random interleavings", function()
  it("never deadlock nor over-grant a KeyedMutex (40 seeds)", h.async(function()
    local total = 0
    local t0 = uv.hrtime()
    for _, seed in ipairs(seeds(1, 40)) do total = total + round(seed, am.KeyedMutex.new(), 1, false) end
    report("random KeyedMutex rounds: %d grants in %.2f s", total, (uv.hrtime() - t0) / 1e9)
  end, { deadline = 60000 }))

  it("never deadlock nor over-grant a KeyedSemaphore with weights (20 seeds)", h.async(function()
    for _, seed in ipairs(seeds(101, 20)) do round(seed, am.KeyedSemaphore.new(2), 2, false) end
  end, { deadline = 60000 }))

  it("hold nothing after timeouts, failed tries, cancels and closed coroutines (30 seeds)", h.async(function()
    local base = am.pending()
    local total = 0
    for _, seed in ipairs(seeds(201, 15)) do total = total + round(seed, am.KeyedMutex.new(), 1, true) end
    for _, seed in ipairs(seeds(301, 15)) do total = total + round(seed, am.KeyedSemaphore.new(3), 3, true) end
    assert.is_true(total > (STRESS and 200 or 1000), "only " .. total .. " grants")
    assert.equal(base, am.pending())
  end, { deadline = 60000 }))

  it("hold nothing after requests refused beyond maxPending (10 seeds)", h.async(function()
    local total = 0
    for _, seed in ipairs(seeds(401, 10)) do
      total = total + round(seed, am.KeyedMutex.new({ maxPending = 2 }), 1, true)
    end
    assert.is_true(total > (STRESS and 50 or 200), "only " .. total .. " grants")
  end, { deadline = 60000 }))
end)
