-- Debug mode and the Redis locks (docs/debug.md, "Deadlocks": it does not
-- watch the Redis locks, and sees the user's own local locks used inside
-- their sections).  The local locks a Redis lock uses itself (its gate, a
-- waiter's bell, the hub's subscription gate, src/async_mutex/redis_lock_*.lua)
-- are marked internal and invisible to it: ordinary contended use reported
-- lock-order inversions between a bell and a gate, and left each bell's
-- grant as a hold of a dead coroutine (a leak: 174 holds and 638 KB of heap
-- after 4 x 100 contended acquisitions, 1606 holds after 4 x 1000).
local R = require "lock_redis"
local dr = require "debug_reports"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec57")
teardown(function() am.debug.disable() end)

-- n rounds of each of 'workers' coroutines taking the locks in 'order'
-- (each held across sleeps, so that the others queue), all given back by
-- <close>; returns once every coroutine ended.
local function contend(workers, n, locks, sleeps)
  local done = 0
  for _ = 1, workers do
    h.spawn(function()
      for _ = 1, n do
        local ra <close> = locks[1]:acquire()
        if sleeps then am.sleep(sleeps[1]) end
        if locks[2] then
          local rb <close> = locks[2]:acquire()
          if sleeps then am.sleep(sleeps[2]) end
        end
      end
      done = done + 1
    end)
  end
  h.wait_until(function() return done == workers end, 60000, "the workers")
end

local function heap_kb()
  collectgarbage(); collectgarbage()
  return collectgarbage("count")
end

describe("debug mode with Redis locks", function()
  after_each(function() am.debug.disable() end)

  it("reports nothing and keeps no hold after contended use of two RedisMutex", h.async(function()
    local reports = dr.enable()
    local a, c = R.one_lock(server, fresh_name, am.RedisMutex)
    local b = am.RedisMutex.new(c, fresh_name())
    contend(3, 3, { a, b }, { 2, 1 })
    collectgarbage(); collectgarbage()
    assert.same({}, reports)
    assert.same({}, am.debug.holds())
    local text = am.debug.report()
    assert.matches("^async_mutex debug report %(debug mode on, clock %d+ ms%): 0 holds\n", text)
    assert.matches("lockdep: 0 classes, 0 edges$", text)
    assert.not_matches("redis_lock[%w_]*%.lua", text)
    c:close()
  end, { deadline = 60000 }))

  it("keeps the holds count and the heap bounded over many contended acquisitions",
    h.async(function()
      dr.enable()
      local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
      contend(4, 25, { m }, { 1 })
      assert.same({}, am.debug.holds())
      local base = heap_kb()
      contend(4, 150, { m }, { 1 })      -- 500 contended acquisitions more
      assert.same({}, am.debug.holds())
      local grown = heap_kb() - base
      -- before: about 1.6 KB per acquisition (800 KB here)
      assert.is_true(grown < 200, ("heap grew by %.0f KB"):format(grown))
      c:close()
    end, { deadline = 120000 }))

  it("hides the keyed set's and the semaphore's gates, and waitForUnlock's bell",
    h.async(function()
      local reports = dr.enable()
      local c = server:client()
      local k = am.KeyedRedisMutex.new(c, fresh_name() .. ":")
      local s = am.RedisSemaphore.new(c, fresh_name(), 1)
      local done = 0
      for i = 1, 3 do
        h.spawn(function()
          for _ = 1, 3 do
            local r1 <close> = k:acquire("x")
            am.sleep(1)
            local _, r2 <close> = s:acquire()
            am.sleep(1)
          end
          if i == 1 then s:waitForUnlock() end
          done = done + 1
        end)
      end
      h.wait_until(function() return done == 3 end, 60000, "the workers")
      collectgarbage(); collectgarbage()
      assert.same({}, reports)
      assert.same({}, am.debug.holds())
      c:close()
    end, { deadline = 60000 }))

  it("still watches the user's own local locks inside Redis-lock sections", h.async(function()
    local reports = dr.enable()
    local rm, c = R.one_lock(server, fresh_name, am.RedisMutex)
    local x, y = am.Mutex.new(), am.Mutex.new()
    am.debug.name(x, "spec57 x")
    am.debug.name(y, "spec57 y")
    local seen
    do
      local r <close> = rm:acquire()
      local rx <close> = x:acquire()
      seen = am.debug.holds()
      local ry <close> = y:acquire()     -- x then y
    end
    do
      local r <close> = rm:acquire()
      local ry <close> = y:acquire()
      local rx <close> = x:acquire()     -- y then x: an inversion
    end
    assert.equal(1, #seen)
    assert.equal(x, seen[1].lock)
    assert.matches("57%-redis%-debug%-internals_spec%.lua:%d+", seen[1].site)
    local inv = dr.of_kind(reports, "inversion")
    assert.equal(1, #inv)
    assert.matches("spec57 x", inv[1].text)
    assert.matches("spec57 y", inv[1].text)
    assert.not_matches("redis_lock[%w_]*%.lua", inv[1].text)
    assert.same({}, am.debug.holds())
    c:close()
  end))
end)
