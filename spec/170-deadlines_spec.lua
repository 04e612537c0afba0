-- A deadline never fires early (docs/api.md, Conventions, Time; docs/
-- semantics.md, Timeouts): every timed wait of the local locks counts from
-- the clock read at its call, not from the loop's time cached at the start
-- of the turn, which blocking work since leaves behind.  Elapsed times are
-- measured here with uv.hrtime(), a clock independent of that cache.
-- (Only lower bounds: how late a wait ends depends on the machine's load.)
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

local function now_ms() return uv.hrtime() / 1e6 end

--- Blocks for 'ms' of real time without letting the loop run (so that
-- uv.now() falls behind).
local function busy(ms)
  local t_end = now_ms() + ms
  while now_ms() < t_end do end
end

describe("a timed wait", function()
  it("lasts at least its limit, 1,000 times over, also right after blocking work", h.async(function()
    local m = am.Mutex.new()
    local hold_m = m:acquire()
    local s = am.Semaphore.new(0)
    local km = am.KeyedMutex.new()
    local hold_k = km:acquire("held")
    local LIMITS = { 0.5, 1, 2, 2.5, 5, 10, 20 }
    local kinds = {
      -- each makes one timed wait of 'ms' and returns when it ended
      function(ms) assert(not pcall(am.withTimeout(m, ms).acquire, am.withTimeout(m, ms))) end,
      function(ms)
        local d = am.withTimeout(m, ms)
        assert(not pcall(d.waitForUnlock, d))
      end,
      function(ms) am.sleep(ms) end,
      function(ms)
        local d = am.withTimeout(s, ms)
        assert(not pcall(d.acquire, d, 2))
      end,
      function(ms)
        local d = am.withTimeout(km, ms)
        assert(not pcall(d.acquire, d, "held"))
      end,
      function(ms)                               -- several keys, one limit
        local d = am.withTimeout(km, ms)
        assert(not pcall(d.acquireAll, d, { "a", "held", "z" }))
      end,
    }
    local N, ROUND = 1000, 100
    local early, done, n, blocked = {}, 0, 0, 0
    local worst = math.huge
    for round = 1, N // ROUND do
      for i = 1, ROUND do
        n = n + 1
        local k = n
        local ms = LIMITS[(k % #LIMITS) + 1]
        local wait = kinds[(k % #kinds) + 1]
        -- every other round, blocking work before each of its first waits
        if round % 2 == 0 and i <= 10 then
          busy(3)
          blocked = blocked + 1
        end
        coroutine.wrap(function()
          local t0 = now_ms()
          wait(ms)
          local elapsed = now_ms() - t0
          worst = math.min(worst, elapsed - ms)
          if elapsed < ms then
            early[#early + 1] = ("wait %d (kind %d) of %g ms ended after %.3f ms"):format(
              k, (k % #kinds) + 1, ms, elapsed)
          end
          done = done + 1
        end)()
      end
      h.wait_until(function() return done == n end, 5000)
    end
    assert.equal(N, done)
    assert.equal(50, blocked)
    assert.same({}, early)
    assert.is_true(worst >= 0)
    hold_m()
    hold_k()
  end, { deadline = 30000 }))

  it("of a lease: the hold is not lost before its lease, also right after blocking work",
    h.async(function()
      local early, done = {}, 0
      local N = 100
      for i = 1, N do
        local ms = 1 + (i % 4)
        local leased = am.withLease(am.Mutex.new(), ms)
        if i % 2 == 0 then busy(2) end
        coroutine.wrap(function()
          local t0 = now_ms()
          local release = leased:acquire()
          -- a waiter is let in when the lease ends (the hold lost)
          local r2 = leased:acquire()
          local elapsed = now_ms() - t0
          if elapsed < ms then early[#early + 1] = ("lease of %d ms lost after %.3f ms"):format(ms, elapsed) end
          assert.is_false(release())
          r2()
          done = done + 1
        end)()
      end
      h.wait_until(function() return done == N end, 5000)
      assert.same({}, early)
    end))
end)

describe("in a fresh process", function()
  it("withTimeout(m, 300) after blocking start-up work raises after 300 ms or more", function()
    local r = h.am_subprocess([[
      local function now_ms() return uv.hrtime() / 1e6 end
      local t_end = now_ms() + 50                 -- start-up work: the loop idle meanwhile
      while now_ms() < t_end do end
      local m = am.Mutex.new()
      local elapsed
      coroutine.wrap(function() m:acquire() end)()
      coroutine.wrap(function()
        local timed = am.withTimeout(m, 300)
        local t0 = now_ms()
        local ok, err = pcall(timed.acquire, timed)
        elapsed = now_ms() - t0
        assert(not ok and err == am.E_TIMEOUT)
      end)()
      uv.run()
      print(elapsed >= 300, elapsed)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.matches("^true\t", r.stdout)
  end)
end)
