-- One timeout means one timeout (docs/redis-locks.md, "What cannot mean the
-- same across processes"): against a server that accepts connections and
-- never answers, or a SIGSTOPped one, acquire and tryAcquire raise
-- E_UNAVAILABLE within one commandTimeout (+20 ms), and the withdrawal of
-- the request that got no answer goes on in the background.  Before, the
-- caller waited for that withdrawal too, on a fresh connection: two
-- commandTimeouts (10 s with the default 5000).

local R = require "lock_redis"
local redis = require "async_mutex.redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec122")

local TIMEOUT = 300
local SLACK = 20 * h.TIME_SCALE

-- Runs fn() (which must raise E_UNAVAILABLE) and returns how long it took
-- in ms.
local function unavailable_after(fn)
  uv.update_time()
  local t0 = uv.hrtime()
  local ok, err = pcall(fn)
  local ms = (uv.hrtime() - t0) / 1e6
  assert.is_false(ok)
  assert.is_true(err == am.E_UNAVAILABLE, tostring(err))
  return ms
end

-- (the client's timer counts from the later of the last reply and the
-- request sent with nothing in flight, in whole ms: never more than 1 ms
-- early)
local function within_one(ms, what)
  assert.is_true(ms >= TIMEOUT - 1 and ms < TIMEOUT + SLACK,
    ("%s raised E_UNAVAILABLE after %.1f ms (commandTimeout %d)"):format(what, ms, TIMEOUT))
end

describe("against a server that accepts and never answers", function()
  it("acquire and tryAcquire raise E_UNAVAILABLE within one commandTimeout", h.async(function()
    local port, stop = h.tcp_server()           -- reads, never answers
    finally(stop)              -- (also when it fails: no handle left to the next cases)
    local c = redis.connect { host = "127.0.0.1", port = port, commandTimeout = TIMEOUT }
    local m = am.RedisMutex.new(c, fresh_name())
    within_one(unavailable_after(function() m:acquire() end), "acquire")
    within_one(unavailable_after(function() am.tryAcquire(m):acquire() end), "tryAcquire")
    local s = am.RedisSemaphore.new(c, fresh_name(), 2)
    within_one(unavailable_after(function() s:acquire(2) end), "a semaphore's acquire")
    h.sleep(TIMEOUT + 100)             -- the background withdrawals end too
    c:close()
    stop()
  end))
end)

describe("against a SIGSTOPped server", function()
  it("acquire and tryAcquire raise E_UNAVAILABLE within one commandTimeout, while the"
    .. " withdrawal of their request is in flight", h.async(function()
    local c = server:client({ commandTimeout = TIMEOUT })
    local other, name = R.one_client(server, fresh_name)
    local o = { ttl = 2000 }
    local m = am.RedisMutex.new(c, name, o)
    assert.is_false(m:isLocked())        -- connected, the eviction policy read
    server:pause()
    finally(function() server:resume() end)   -- (also when it fails: the next cases need it)
    within_one(unavailable_after(function() m:acquire() end), "acquire")
    assert.equal(1, c:pending())         -- the withdrawal, not waited for
    within_one(unavailable_after(function() am.tryAcquire(m):acquire() end), "tryAcquire")
    local k = am.KeyedRedisMutex.new(c, name .. ":", o)
    within_one(unavailable_after(function() am.withTimeout(k, 60000):acquire("x") end),
      "a keyed set's acquire through withTimeout")
    server:resume()
    -- requests the server takes only now may be granted after their
    -- withdrawal (another connection's): the lease ends them then
    h.wait_until(function()
      return other:call("EXISTS", name .. ":h", name .. ":x:h") == 0
    end, 5000)
    c:close(); other:close()
  end, { deadline = 15000 }))
end)

describe("after blocking work", function()
  -- The command timer stops only once a batch of replies is handled: a
  -- caller resumed by a reply that works for a while, then calls, found
  -- it still running, counting from that reply.  The call failed early
  -- (40 ms after it was sent, with commandTimeout 300) and said "no reply
  -- within 300 ms".
  local function spin(ms)
    local t = uv.hrtime()
    while uv.hrtime() - t < ms * 1e6 do end
  end

  -- fn() with the server paused: resumed also when fn fails (the next
  -- cases need it)
  local function paused(fn)
    server:pause()
    local ok, err = pcall(fn)
    server:resume()
    if not ok then error(err, 0) end
  end

  it("a call made in the callback of a reply waits its whole commandTimeout", h.async(function()
    local c = server:client({ commandTimeout = TIMEOUT })
    assert.equal("PONG", c:call("PING"))      -- resumed by the reply: the timer runs
    spin(TIMEOUT * 0.8)
    paused(function() within_one(unavailable_after(function() c:call("PING") end), "a call") end)
    c:close()
  end))

  it("so does a lock's request, after a release and blocking work", h.async(function()
    local c = server:client({ commandTimeout = TIMEOUT })
    local m = am.RedisMutex.new(c, fresh_name(), { ttl = 2000 })
    assert.is_true(m:acquire()())
    spin(TIMEOUT * 0.8)
    paused(function() within_one(unavailable_after(function() m:acquire() end), "acquire") end)
    c:close()
  end))

  it("so does a subscription's confirmation", h.async(function()
    local c = server:client({ commandTimeout = TIMEOUT })
    c:subscribe(fresh_name(), function() end)   -- resumed by the confirmation
    spin(TIMEOUT * 0.8)
    paused(function()
      within_one(unavailable_after(function() c:subscribe(fresh_name(), function() end) end),
        "a subscribe")
    end)
    c:close()
  end))
end)
