-- A deadline of the Redis locks never passes early (docs/redis-locks.md,
-- "Deadlines"): 1,000 timed waits (withTimeout on a RedisMutex's acquire and
-- waitForUnlock, a RedisSemaphore, a KeyedRedisMutex, a second coroutine
-- bounded at the lock's gate) and lost-lease reports, many right after
-- blocking work in the same loop turn: each raises E_TIMEOUT (or reports
-- the loss) no sooner than its limit after the call, by the monotonic
-- clock.  Before, the deadline was taken from the loop's time, which
-- stands still while a callback runs: after 10 ms of blocking work, a
-- 20 ms bound ended after 10 ms.
--
-- The bound at the gate is the core lock's timer (src/core/scheduler/scheduler.c): it
-- is brought up to date before it starts, but it counts in whole ms of
-- the loop's clock, so that one case relies on the core's own deadline.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec125")

local hrtime = uv.hrtime

-- Blocks the loop for ms milliseconds (busy), as a computation would.
local function block(ms)
  local t = hrtime()
  while hrtime() - t < ms * 1e6 do end
end

local function drift(ttl) return ttl // 100 + 2 end

-- Runs COROS coroutines of EACH timed waits each, of the kinds chosen by
-- pick(); returns the waits that ended early, and how many there were.
local function timed_waits(COROS, EACH, pick)
  local holder, waiter, name = R.two_clients(server, fresh_name)
  -- held by another client for the whole test: every wait times out
  local held = {}
  for i = 1, COROS do
    held[#held + 1] = am.RedisMutex.new(holder, name .. ":m" .. i):acquire()
  end
  held[#held + 1] = select(2, am.RedisSemaphore.new(holder, name .. ":s", 2):acquire(2))
  local kh = am.KeyedRedisMutex.new(holder, name .. ":k:")
  for i = 1, COROS do held[#held + 1] = kh:acquire(i) end
  local early, waits, left = {}, 0, COROS
  local done = coroutine.running()
  local function check(what, limit, t0)
    local ms = (hrtime() - t0) / 1e6
    waits = waits + 1
    if ms < limit then early[#early + 1] = ("%s: %.3f ms for %.3f"):format(what, ms, limit) end
  end
  local function timed_out(ok, err)
    assert(not ok and err == am.E_TIMEOUT, tostring(err))
  end
  for i = 1, COROS do
    am.spawn(function()
      local m = am.RedisMutex.new(waiter, name .. ":m" .. i)
      local s = am.RedisSemaphore.new(waiter, name .. ":s", 2)
      local k = am.KeyedRedisMutex.new(waiter, name .. ":k:")
      for _ = 1, EACH do
        local limit = math.random(1, 30) + (math.random() < 0.3 and math.random() or 0)
        local kind = pick()
        -- half of them right after blocking work in this loop turn
        if math.random() < 0.5 then block(math.random(1, 12)) end
        local t0 = hrtime()
        if kind == "acquire" then
          local w = am.withTimeout(m, limit)
          timed_out(pcall(w.acquire, w))
          check("RedisMutex:acquire", limit, t0)
        elseif kind == "waitForUnlock" then
          local w = am.withTimeout(m, limit)
          timed_out(pcall(w.waitForUnlock, w))
          check("RedisMutex:waitForUnlock", limit, t0)
        elseif kind == "semaphore" then
          local w = am.withTimeout(s, limit)
          timed_out(pcall(w.acquire, w, 1))
          check("RedisSemaphore:acquire", limit, t0)
        elseif kind == "keyed" then
          local w = am.withTimeout(k, limit)
          timed_out(pcall(w.acquire, w, i))
          check("KeyedRedisMutex:acquire", limit, t0)
        elseif kind == "gate" then
          -- a second coroutine, bounded at the gate while the first
          -- waits in Redis (its own bound, longer)
          local first = am.withTimeout(m, limit + 20)
          local first_done = false
          am.spawn(function()
            local t1 = hrtime()
            timed_out(pcall(first.acquire, first))
            check("RedisMutex:acquire (in Redis, a coroutine at the gate)", limit + 20, t1)
            first_done = true
          end)
          block(math.random(0, 5))
          t0 = hrtime()
          local w = am.withTimeout(m, limit)
          timed_out(pcall(w.acquire, w))
          check("RedisMutex:acquire (at the gate)", limit, t0)
          while not first_done do am.sleep(5) end
        else
          -- a lease that is never renewed: reported lost no sooner than
          -- its local end (ttl minus the drift allowance)
          local ttl = 10 + math.random(0, 30)
          local lost_at
          local own = am.RedisMutex.new(waiter, name .. ":own" .. i,
            { ttl = ttl, renewInterval = 0, onLost = function() lost_at = hrtime() end })
          local r = own:acquire()
          while not lost_at do am.sleep(2) end
          assert(r() == false)
          waits = waits + 1
          local ms = (lost_at - t0) / 1e6
          if ms < ttl - drift(ttl) then
            early[#early + 1] = ("onLost: %.3f ms for a lease of %d"):format(ms, ttl)
          end
        end
      end
      left = left - 1
      if left == 0 then coroutine.resume(done) end
    end)
  end
  coroutine.yield()
  for _, r in ipairs(held) do assert.is_true(r()) end
  holder:close(); waiter:close()
  return early, waits
end

describe("1,000 timed waits on Redis locks, many right after blocking work", function()
  it("never end before their limit (withTimeout, waitForUnlock, lost leases)", h.async(function()
    local seed = os.time()
    math.randomseed(seed)
    local kinds = { "acquire", "waitForUnlock", "semaphore", "keyed", "lease" }
    local early, waits = timed_waits(20, math.max(1, h.load(1000) // 20),
      function() return kinds[math.random(#kinds)] end)
    assert.is_true(waits >= h.load(1000))
    assert.equal("", table.concat(early, "; "), "seed " .. seed)
  end, { deadline = 120000 }))

  it("bounded at the lock's gate (the core lock's timer) never end before their limit",
    h.async(function()
      local seed = os.time()
      math.randomseed(seed)
      local early, waits = timed_waits(10, math.max(1, h.load(200) // 10), function() return "gate" end)
      assert.is_true(waits >= h.load(200))
      assert.equal("", table.concat(early, "; "), "seed " .. seed)
    end, { deadline = 60000 }))
end)
