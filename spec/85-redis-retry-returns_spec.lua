-- A subscription that ends while its connection is down and a new attempt
-- waits for the back-off (docs/redis.md, "Pub/sub"): the pending retry is
-- dropped with the last channel, so uv.run() returns at once.  Before,
-- the retry's timer stayed armed until the back-off ran out (up to
-- reconnectDelayMax, 2 s by default) and kept the loop running for a
-- retry that had nothing left to subscribe: the "uv.run() took about 2 s
-- to return once", seen in a program using the Redis locks.  The same through the Redis locks, whose
-- waiters subscribe to their process's channel and end (E_UNAVAILABLE)
-- when the server is gone.
--
-- Each case runs in a child lua5.4 that kills the server itself (SIGKILL,
-- by its pidfile) at a known point and prints the ms from the end of the
-- last subscription's user to the return of uv.run(); the server is
-- started again afterwards.  reconnectDelay is 3000 ms, so the old delay
-- was 1.5-3 s; the bound is 500 ms.

local R = require "lock_redis"

local _, h, server = R.spec_file(setup, teardown)

local CHILD = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SOCK, PIDFILE, CASE, NAME = ...
local OPTS = { path = SOCK, reconnectDelay = 3000, reconnectDelayMax = 3000 }
local function kill_server()
  local f = assert(io.open(PIDFILE))
  local pid = f:read("n")
  f:close()
  assert(uv.kill(pid, "sigkill"))
end
local ended_at, outcome

local cases = {}

-- a plain subscription, ended while a re-subscribe waits for the back-off
function cases.subscription()
  local c = redis.connect(OPTS)
  am.spawn(function()
    local s = c:subscribe(NAME, function() end)
    kill_server()
    am.sleep(300)                  -- lost, retried at once (refused), now waiting
    s:unsubscribe()
    ended_at, outcome = uv.hrtime(), "unsubscribed"
  end)
end

-- a lock's waiter (subscribed) ends with E_UNAVAILABLE once the server is
-- gone; the holder has released (it cannot reach Redis: true)
function cases.lock_waiter()
  local c1, c2 = redis.connect(OPTS), redis.connect(OPTS)
  local m1 = am.RedisMutex.new(c1, NAME)
  local m2 = am.RedisMutex.new(c2, NAME, { waiterTimeout = 600 })
  am.spawn(function()
    local r = m1:acquire()
    am.sleep(50)
    kill_server()
    am.sleep(50)
    assert(r() == true)
  end)
  am.spawn(function()
    am.sleep(10)
    local ok, err = pcall(m2.acquire, m2)
    assert(not ok)
    -- (an E_UNAVAILABLE says why: by the constant's text, whatever the reason)
    ended_at, outcome = uv.hrtime(), err == am.E_UNAVAILABLE and tostring(am.E_UNAVAILABLE)
      or tostring(err)
  end)
end

cases[CASE]()
uv.run()
io.stdout:write(("%.1f\n%s\n"):format((uv.hrtime() - ended_at) / 1e6, outcome))
]]

local BOUND = 500 * h.TIME_SCALE

local function run_case(case)
  local child = R.child(CHILD, { server.path, server.pidfile, case, "spec85:" .. case })
  local rc, out, err = child:wait()
  server:kill()                         -- reaped, pidfile gone
  server:start()
  assert.equal(0, rc, err)
  assert.equal("", err)
  local ms, outcome = out:match("^(%S+)\n(.-)\n$")
  return tonumber(ms), outcome
end

describe("a subscription ended while its connection waits for the back-off", function()
  it("lets uv.run() return at once (was: when the retry's back-off ran out)",
    h.async(function()
      local ms, outcome = run_case("subscription")
      assert.equal("unsubscribed", outcome)
      assert.is_true(ms < BOUND, ("uv.run() returned %.1f ms after unsubscribe"):format(ms))
    end, { deadline = 30000 }))

  it("through a Redis lock's waiter that ends with E_UNAVAILABLE", h.async(function()
    local ms, outcome = run_case("lock_waiter")
    assert.equal("redis server unavailable", outcome)
    assert.is_true(ms < BOUND, ("uv.run() returned %.1f ms after the waiter ended"):format(ms))
  end, { deadline = 30000 }))
end)
