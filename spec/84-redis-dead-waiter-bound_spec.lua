-- How long a waiter that dies (SIGKILL, as in specs 46 and 78) holds up
-- the live waiter behind it, when the two use different waiterTimeout
-- options (docs/redis-locks.md, "Waiting without polling"): its deadline
-- in N:w is its own (T_D after its last renewal), but it is skipped only
-- when a script runs after that deadline, and with no other request the
-- script that runs is the live waiter's, at its own period (T_L / 3).
--
-- * A semaphore's dead head that does not fit blocks the waiter behind
--   it (strict FIFO) even where there is room: that waiter is granted at
--   its first request after the dead one's deadline, up to T_L / 3 after
--   it (T_D + T_L / 3 after the dead one's last renewal: 4/3 T when both
--   are T), and never before it.
-- * A mutex released while its dead head's deadline has not passed hands
--   it to the dead process for its first lease, min(ttl, T_D); the live
--   waiter learns of the lease's end at its first request after the
--   grant: it is granted max(min(ttl, T_D), up to T_L / 3) after the
--   release, and never before the first lease ends.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server = R.spec_file(setup, teardown)

local queued = R.queued
local SLACK = 250 * h.TIME_SCALE     -- round trips and scheduling, generous

-- A child that waits for ARGS[1] with waiterTimeout ARGS[2]: a mutex, or
-- (ARGS[3] = limit) a semaphore, asking for the whole limit.
local WAITER = R.PROLOGUE .. [[
main(function()
  local limit = tonumber(ARGS[3])
  local o = { waiterTimeout = tonumber(ARGS[2]) }
  if limit then
    am.RedisSemaphore.new(client, ARGS[1], limit, o):acquire(limit)
  else
    am.RedisMutex.new(client, ARGS[1], o):acquire()
  end
  io.stdout:write("granted\n")
end)
]]

-- The server's clock, in ms.
local function server_ms(c)
  local t = c:call("TIME")
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- The deadline (server ms) of the waiter 'token' of 'name' (nil: gone).
local function deadline_of(c, name, token)
  return tonumber(c:call("ZSCORE", name .. ":w", token))
end

-- A fresh lock name per attempt.
local attempts = 0
local function fresh(kind, t_dead, t_live)
  attempts = attempts + 1
  return ("spec84:%s:%d:%d:%d"):format(kind, t_dead, t_live, attempts)
end

-- Starts a live waiter (its own client) that records its grant time;
-- returns a function giving that time (hrtime ns, or nil).  That function
-- also keeps the waiter's client and coroutine reachable: nothing else
-- refers to them, and a collection (AM_GC_STRESS) would otherwise drop
-- them while the waiter is still connecting, and the waiter with them.
local function live_waiter(name, t_live, limit)
  local got
  local c2 = server:client()
  local o = { waiterTimeout = t_live }
  local co = h.spawn(function()
    local _, r
    if limit then
      _, r = am.RedisSemaphore.new(c2, name, limit, o):acquire(1)
    else
      r = am.RedisMutex.new(c2, name, o):acquire()
    end
    got = uv.hrtime()
    r()
    c2:close()
  end)
  return function()
    local _, _ = c2, co
    return got
  end
end

-- Queues a WAITER child for 'name' behind the lock held here, and a live
-- waiter behind it; then kills the child once it has renewed its place
-- (so that its deadline is one of a renewal, as for a process that dies
-- at any time).  Returns the dead waiter's token and the live waiter's
-- grant time function.
local function dead_ahead_of_live(c, name, t_dead, t_live, limit)
  local child = R.child(WAITER, { server.path, name, t_dead, limit })
  h.wait_until(function() return queued(c, name) == 1 end, 10000)
  local token = c:call("ZRANGE", name .. ":q", 0, 0)[1]
  local got = live_waiter(name, t_live, limit)
  h.wait_until(function() return queued(c, name) == 2 end, 10000)
  local first = deadline_of(c, name, token)
  h.wait_until(function() return deadline_of(c, name, token) ~= first end, 10000)
  child:kill()
  local _, out = child:wait()
  assert.equal("", out)                 -- it was never granted
  return token, got
end

-- Semaphore case: how long after the dead head's deadline the live
-- waiter was granted (ms; negative: before it); nil when the head was
-- gone before its deadline could be read (a machine too loaded).
local function semaphore_lag(t_dead, t_live)
  local c = server:client()
  local name = fresh("sem", t_dead, t_live)
  local _, release = am.RedisSemaphore.new(c, name, 2):acquire(1)
  local token, got = dead_ahead_of_live(c, name, t_dead, t_live, 2)
  -- the dead head's last deadline, against the server's clock then
  local t0 = uv.hrtime()
  local s0 = server_ms(c)
  local deadline = deadline_of(c, name, token)
  h.wait_until(got, (t_dead + t_live + 2000) * h.TIME_SCALE, "the live waiter's grant")
  assert.is_true(release())
  c:close()
  if not deadline then return nil end
  return (got() - t0) / 1e6 - (deadline - s0)
end

-- Mutex case: how long after the release, which hands the lock to the
-- dead process, the live waiter was granted (ms); nil when the release
-- came after the dead one's deadline (a machine too loaded).
local function mutex_wait(t_dead, t_live)
  local c = server:client()
  local name = fresh("mutex", t_dead, t_live)
  local release = am.RedisMutex.new(c, name):acquire()
  local token, got = dead_ahead_of_live(c, name, t_dead, t_live)
  local t0 = uv.hrtime()
  assert.is_true(release())
  local holder = c:call("HKEYS", name .. ":h")[1]   -- a mutex: one record at most
  h.wait_until(got, (t_dead + t_live + 2000) * h.TIME_SCALE, "the live waiter's grant")
  c:close()
  if holder ~= token then return nil end
  return (got() - t0) / 1e6
end

-- Runs measure(t_dead, t_live) until it measures something (3 tries).
local function measured(measure, t_dead, t_live)
  for _ = 1, 3 do
    local v = measure(t_dead, t_live)
    if v then return v end
  end
  error("nothing measured in 3 tries: the dead waiter was skipped before its deadline was read")
end

describe("a waiter killed while queued, with mixed waiterTimeouts", function()
  it("blocks a semaphore's next waiter until its deadline, and at most T_L/3 after it",
    h.async(function()
      for _, case in ipairs({ { 1200, 1200 }, { 1200, 3000 }, { 3000, 600 } }) do
        local t_dead, t_live = case[1], case[2]
        local lag = measured(semaphore_lag, t_dead, t_live)
        local what = ("T_D %d, T_L %d: granted %.1f ms after the dead head's deadline"):format(
          t_dead, t_live, lag)
        assert.is_true(lag > -20, what)   -- never before it (clock reads: 20 ms)
        assert.is_true(lag < t_live / 3 + SLACK, what)
      end
    end, { deadline = 120000 }))

  it("granted a mutex at the release holds the next waiter for its first lease, or T_L/3",
    h.async(function()
      for _, case in ipairs({ { 1200, 1200 }, { 900, 6000 }, { 1500, 600 } }) do
        local t_dead, t_live = case[1], case[2]
        local waited = measured(mutex_wait, t_dead, t_live)
        local what = ("T_D %d, T_L %d: granted %.1f ms after the release"):format(
          t_dead, t_live, waited)
        assert.is_true(waited >= t_dead - 2, what)   -- the dead one's first lease
        assert.is_true(waited < math.max(t_dead, t_live / 3) + SLACK, what)
      end
    end, { deadline = 120000 }))
end)
