-- The bound of withTimeout on a Redis lock is checked between requests
-- (docs/redis-locks.md, "What cannot mean the same across processes"): a
-- request in flight ends with its reply, and once the bound has passed,
-- no further request goes out but the withdrawal.  Before, a first request
-- answered after the bound (a slow or paused server) was followed by the
-- subscription to the process's channel and a second acquire request
-- (acquire), or by the subscription to the lock's channel and a second
-- state request (waitForUnlock), each one more round trip, each up to a
-- commandTimeout, before the bound was looked at.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec129")

-- The calls of 'command' the server has taken (INFO commandstats).
local function calls(client, command)
  local stats = client:call("INFO", "commandstats")
  return tonumber(stats:match("cmdstat_" .. command .. ":calls=(%d+)")) or 0
end

-- Runs fn in a coroutine of its own, with the server paused for 'ms' from
-- just before fn's first request.  Returns what fn raised and the requests the server
-- took meanwhile (scripts, SUBSCRIBE), counted from 'probe'.
local function slow_first_request(probe, ms, fn)
  local scripts0, subs0 = R.scripts_run(probe), calls(probe, "subscribe")
  local done, err
  server:pause()                      -- the request waits in the server's socket
  h.spawn(function()
    local ok, e = pcall(fn)
    assert.is_false(ok)
    done, err = true, e
  end)
  local t = uv.new_timer()
  t:start(ms, 0, function() t:close(); server:resume() end)
  h.wait_until(function() return done end, 5000)
  h.sleep(50)                         -- the withdrawal, in the background
  probe:call("PING")
  return err, R.scripts_run(probe) - scripts0, calls(probe, "subscribe") - subs0
end

describe("withTimeout on a Redis lock whose first request is answered after the bound",
  function()
  it("acquire: raises the timeout with no request more but the withdrawal", h.async(function()
    local a, b, probe = server:client(), server:client(), server:client()
    local name = fresh_name()
    local ma, mb = am.RedisMutex.new(a, name), am.RedisMutex.new(b, name)
    local ra = ma:acquire()
    assert.is_true(mb:isLocked())            -- b connected, its eviction policy read
    local err, scripts, subs = slow_first_request(probe, 150, function()
      return am.withTimeout(mb, 40):acquire()
    end)
    assert.equal(am.E_TIMEOUT, err)
    assert.equal(2, scripts)                 -- the acquire, its withdrawal
    assert.equal(0, subs)
    assert.equal(0, R.queued(probe, name))
    assert.is_true(ra())
    a:close(); b:close(); probe:close()
  end, { deadline = 10000 }))

  it("waitForUnlock: raises the timeout with no request more", h.async(function()
    local a, b, probe = server:client(), server:client(), server:client()
    local name = fresh_name()
    local ma, mb = am.RedisMutex.new(a, name), am.RedisMutex.new(b, name)
    local ra = ma:acquire()
    assert.is_true(mb:isLocked())
    local err, scripts, subs = slow_first_request(probe, 150, function()
      return am.withTimeout(mb, 40):waitForUnlock()
    end)
    assert.equal(am.E_TIMEOUT, err)
    assert.equal(1, scripts)                 -- the state request
    assert.equal(0, subs)
    assert.is_true(ra())
    a:close(); b:close(); probe:close()
  end, { deadline = 10000 }))
end)
