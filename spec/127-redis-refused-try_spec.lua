-- A try on a Redis lock asks the server once (docs/redis-locks.md, "What
-- cannot mean the same across processes"): a refused try was never
-- queued, so there is nothing to withdraw.  Before, every refused try also
-- sent the release script in the background (a withdrawal of a token the
-- server never had): two scripts per refusal, a server's work doubled for
-- a program that polls a busy lock with tryAcquire.

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec127")

-- The scripts run by the server while fn() runs and the loop turns after
-- it (anything sent in the background has been taken: a PING on the same
-- client comes after it).
local function scripts_during(probe, client, fn)
  local before = R.scripts_run(probe)
  fn()
  client:call("PING")
  h.sleep(20)
  client:call("PING")
  return R.scripts_run(probe) - before
end

describe("a refused tryAcquire on a Redis lock", function()
  it("sends one request: mutex, semaphore, keyed set", with.two_locks(am.RedisMutex, function(ma, mb, a, b, name)
    local sa, sb = am.RedisSemaphore.new(a, name .. "s", 2), am.RedisSemaphore.new(b, name .. "s", 2)
    local ka, kb = am.KeyedRedisMutex.new(a, name .. ":"), am.KeyedRedisMutex.new(b, name .. ":")
    local ra = ma:acquire()
    local _, rs = sa:acquire(2)
    local rk = ka:acquire("x")
    assert.is_true(mb:isLocked())            -- b connected, eviction policy read
    local cases = {
      { "mutex", function() return am.tryAcquire(mb):acquire() end },
      { "semaphore", function() return am.tryAcquire(sb):acquire(1) end },
      { "keyed set", function() return am.tryAcquire(kb):acquire("x") end },
      { "runExclusive", function() return am.tryAcquire(mb):runExclusive(function() end) end },
    }
    for _, case in ipairs(cases) do
      local n = scripts_during(a, b, function()
        local ok, err = pcall(case[2])
        assert.is_false(ok)
        assert.equal(am.E_ALREADY_LOCKED, err)
      end)
      assert.equal(1, n, case[1])
    end
    -- nothing of b is left in Redis
    assert.equal(0, R.queued(a, name))
    assert.is_true(ra())
    assert.is_true(rs())
    assert.is_true(rk())
    -- and a try that is granted is one request too, its release another
    local n = scripts_during(a, b, function()
      local r = am.tryAcquire(mb):acquire()
      assert.is_true(r())
    end)
    assert.equal(2, n)
  end))
end)
