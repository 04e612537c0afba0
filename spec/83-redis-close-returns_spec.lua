-- client:close() while the client's Redis locks are held or waited for
-- (docs/redis-locks.md, "Closing the client"): uv.run() returns as soon as
-- nothing else is pending, every waiter ends exactly once with
-- E_UNAVAILABLE, and the holds end here as a release that cannot reach
-- Redis.  Before, a hold's lease timer kept retrying its renewal on the
-- closed client until the lease ran out (uv.run() returned after ttl, 30 s
-- by default), and a waiter asleep in the Redis queue woke only at its
-- next renewal (waiterTimeout / 3) to find the client closed.
--
-- Each case runs in a child lua5.4 (its own loop, so uv.run() is measured
-- as a user's script sees it), which prints the ms from close() to the
-- return of uv.run() and how each coroutine ended.  The bound, 500 ms, is
-- far below the old delays (the defaults: ttl 30 s, waiterTimeout 3 s;
-- the waiters here use waiterTimeout 30 s, a renewal every 10 s).

local R = require "lock_redis"

local am, h, server = R.spec_file(setup, teardown)

local CHILD = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SOCK, CASE, NAME = ...
local ended = {}                     -- label -> how it ended ("ok" or the error)
local order = {}
local function spawn(label, fn)
  am.spawn(function()
    local ok, err = pcall(fn)
    if ended[label] then error("BUG: " .. label .. " ended twice") end
    -- (an E_UNAVAILABLE by the constant's text, whatever its reason)
    ended[label] = ok and "ok" or err == am.E_UNAVAILABLE and tostring(am.E_UNAVAILABLE)
      or tostring(err)
    order[#order + 1] = label
  end)
end
local function sleep(ms) am.sleep(ms) end
local closed_at
local function close(c) closed_at = uv.hrtime(); c:close() end
local function connect() return redis.connect { path = SOCK } end
local SLOW = { waiterTimeout = 30000 }   -- a waiter renews every 10 s

local cases = {}

-- one client holds the mutex and closes
function cases.holder()
  local c = connect()
  local m = am.RedisMutex.new(c, NAME)
  spawn("holder", function()
    local r = m:acquire()
    close(c)
    assert(r:check() == false, "the hold did not end at close")
    assert(r() == false, "the releaser ended it again")
  end)
end

-- a holder, a waiter of the same client in the Redis queue, and two
-- more at the lock's gate; the holder closes the client
function cases.same_client()
  local c = connect()
  local m = am.RedisMutex.new(c, NAME, SLOW)
  spawn("holder", function()
    local r <close> = m:acquire()
    sleep(50)
    close(c)
  end)
  for i = 1, 3 do
    spawn("waiter" .. i, function() sleep(10); m:acquire() end)
  end
end

-- two clients: the waiter's client is closed while it sleeps in the
-- Redis queue; then the holder releases and closes its own
function cases.waiter_client()
  local c1, c2 = connect(), connect()
  local m1, m2 = am.RedisMutex.new(c1, NAME), am.RedisMutex.new(c2, NAME, SLOW)
  spawn("holder", function()
    local r = m1:acquire()
    sleep(50)
    close(c2)
    assert(r() == true)
    c1:close()
  end)
  spawn("waiter", function() sleep(10); m2:acquire() end)
end

-- a semaphore held whole by one client, a waiter of another, a
-- waitForUnlock of each; the holder's client closes, then the other
function cases.semaphore()
  local c1, c2 = connect(), connect()
  local s1 = am.RedisSemaphore.new(c1, NAME, 3, SLOW)
  local s2 = am.RedisSemaphore.new(c2, NAME, 3, SLOW)
  spawn("holder", function()
    local _, r = s1:acquire(3)
    sleep(50)
    close(c1)
    assert(r() == false)
    c2:close()
  end)
  spawn("waiter", function() sleep(10); s2:acquire(2) end)
  spawn("unlock1", function() sleep(10); s1:waitForUnlock(1) end)
  spawn("unlock2", function() sleep(10); s2:waitForUnlock(1) end)
end

-- a keyed set: two keys held, a waiter on one of them (same client), a
-- waiter with a bound (withTimeout) on the other (another client)
function cases.keyed()
  local c1, c2 = connect(), connect()
  local k1 = am.KeyedRedisMutex.new(c1, NAME, SLOW)
  local k2 = am.KeyedRedisMutex.new(c2, NAME, SLOW)
  spawn("holder", function()
    local a, b = k1:acquire("a"), k1:acquire(7)
    sleep(50)
    close(c1)
    assert(a() == false and b() == false)
    c2:close()
  end)
  spawn("waiter_a", function() sleep(10); k1:acquire("a") end)
  spawn("waiter_7", function() sleep(10); am.withTimeout(k2, 60000):acquire(7) end)
end

-- two keys' waiters of one client start waiting together: the first
-- subscribes the process's channel, the second waits for it; the client
-- is closed before the server confirms (the next loop turn after the
-- SUBSCRIBE is sent)
function cases.subscribing()
  local c1, c2 = connect(), connect()
  local k1 = am.KeyedRedisMutex.new(c1, NAME, SLOW)
  local k2 = am.KeyedRedisMutex.new(c2, NAME, SLOW)
  local Client = getmetatable(c2).__index
  local subscribe = Client.subscribe
  Client.subscribe = function(self, ...)
    if self == c2 then
      local t = uv.new_timer()
      t:start(0, 0, function() t:close(); close(c2) end)
    end
    return subscribe(self, ...)
  end
  spawn("holder", function()
    local a, b = k1:acquire("a"), k1:acquire("b")
    sleep(100)
    a(); b()
    c1:close()
  end)
  -- both requests sent in one turn of the loop (two timers of 10 ms may
  -- fire in two turns, and the close could then come before waiter_b asks)
  am.spawn(function()
    sleep(10)
    spawn("waiter_a", function() k2:acquire("a") end)
    spawn("waiter_b", function() k2:acquire("b") end)
  end)
end

cases[CASE]()
uv.run()
local elapsed = closed_at and (uv.hrtime() - closed_at) / 1e6 or -1
local parts = {}
for _, label in ipairs(order) do parts[#parts + 1] = label .. "=" .. ended[label] end
table.sort(parts)
io.stdout:write(("%.1f\n%s\n"):format(elapsed, table.concat(parts, ",")))
]]

-- Runs a case; returns the ms from close() to uv.run()'s return and the
-- outcomes ("label=how", sorted, joined by commas).
local function run_case(case)
  local child = R.child(CHILD, { server.path, case, "spec83:" .. case })
  local rc, out, err = child:wait()
  assert.equal(0, rc, err)
  assert.equal("", err)
  local ms, outcomes = out:match("^(%S+)\n(.-)\n$")
  return tonumber(ms), outcomes
end

local BOUND = 500 * h.TIME_SCALE

local function check(case, expected)
  local ms, outcomes = run_case(case)
  assert.equal(expected, outcomes)
  assert.is_true(ms >= 0 and ms < BOUND, ("uv.run() returned %.1f ms after close()"):format(ms))
end

local UNAV = tostring(am.E_UNAVAILABLE)      -- (an error object: its text)

-- A client closed by a finalizer at lua_close (made before the lock was
-- taken, so it runs after luv has freed the lease's timer), while holding
-- and waited for by a coroutine and waitForUnlock of another client.
local AT_EXIT = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local c1 = redis.connect { path = %q }
local c2 = redis.connect { path = %q }
local guard = setmetatable({}, { __gc = function() c2:close(); c1:close() end })
local m1, m2 = am.RedisMutex.new(c1, "spec83:exit"), am.RedisMutex.new(c2, "spec83:exit")
am.spawn(function()
  local r = m1:acquire()
  -- (E_UNAVAILABLE when the close comes while a request is in flight,
  -- which under valgrind and load it may)
  am.spawn(function() pcall(m2.acquire, m2) end)
  am.spawn(function() pcall(m2.waitForUnlock, m2) end)
  am.sleep(100)
  uv.stop()
end)
uv.run()
io.stdout:write("stopped\n")
]]

-- ROUNDS rounds, each with two clients whose mutex, semaphore and keyed set
-- are taken, waited for (in the queue, at the gate, with withTimeout, in
-- waitForUnlock) and released at random, and both clients closed at a
-- random time: every coroutine ends once, with success or E_UNAVAILABLE,
-- and uv.run() returns.  Prints the slowest return after the close (ms),
-- then the problems (none: an empty line).
local RANDOM = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SOCK, SEED, ROUNDS = ...
math.randomseed(tonumber(SEED))
local random = math.random
local worst, problems = 0, {}
local function problem(s) problems[#problems + 1] = s end
for round = 1, tonumber(ROUNDS) do
  local name = "spec83:random:" .. round .. ":"
  local c = { redis.connect { path = SOCK }, redis.connect { path = SOCK } }
  local o = { waiterTimeout = 30000 }
  local started, ended, count = 0, {}, 0
  local function run(label, fn)
    started = started + 1
    am.spawn(function()
      local ok, err = pcall(fn)
      if ended[label] ~= nil then problem(label .. " ended twice") end
      ended[label] = ok or err
      count = count + 1
      if not ok and err ~= am.E_UNAVAILABLE then problem(label .. ": " .. tostring(err)) end
    end)
  end
  for j = 1, 2 do
    local m = am.RedisMutex.new(c[j], name .. "m", o)
    local s = am.RedisSemaphore.new(c[j], name .. "s", 2, o)
    local k = am.KeyedRedisMutex.new(c[j], name .. "k", o)
    for i = 1, 3 do
      run(("m%d.%d"):format(j, i), function()
        local r <close> = m:acquire()
        am.sleep(random(0, 15))
      end)
      run(("s%d.%d"):format(j, i), function()
        local _, r <close> = s:acquire(random(1, 2))
        am.sleep(random(0, 15))
      end)
      run(("k%d.%d"):format(j, i), function()
        local r <close> = am.withTimeout(k, 60000):acquire(i % 2)
        am.sleep(random(0, 15))
      end)
    end
    run("u" .. j, function() m:waitForUnlock() end)
  end
  local closed_at
  local t = uv.new_timer()
  t:start(random(0, 40), 0, function()
    t:close()
    closed_at = uv.hrtime()
    local first = random(1, 2)
    c[first]:close()
    c[3 - first]:close()
  end)
  uv.run()
  worst = math.max(worst, (uv.hrtime() - closed_at) / 1e6)
  if count ~= started then problem(("round %d: %d of %d ended"):format(round, count, started)) end
end
io.stdout:write(("%.1f\n%s\n"):format(worst, table.concat(problems, "; ")))
]]

describe("client:close() with Redis locks held or waited for", function()
  it("at random times, ends every coroutine once and lets uv.run() return", h.async(function()
    local seed = os.time()
    local child = R.child(RANDOM, { server.path, seed, 80 })
    local rc, out, err = child:wait()
    assert.equal(0, rc, err)
    assert.equal("", err)
    local worst, problems = out:match("^(%S+)\n(.-)\n$")
    assert.equal("", problems, "seed " .. seed)
    assert.is_true(tonumber(worst) < 500 * h.TIME_SCALE,
      ("seed %d: uv.run() returned %s ms after a close"):format(seed, worst))
  end, { deadline = 120000 }))

  it("from a finalizer at lua_close, while held and waited for, reads no freed memory",
    h.async(function()
      local out = h.memcheck_child(AT_EXIT:format(server.path, server.path), 60)
      assert.equal("stopped\n", out)
    end, { deadline = 90000 }))

  -- { what the test says, the child's case, what its coroutines end with }
  for _, case in ipairs({
    { "lets uv.run() return at once when the client held a mutex (was: after ttl)",
      "holder", "holder=ok" },
    { "ends the client's waiters, in the Redis queue and at the gate, with E_UNAVAILABLE",
      "same_client", table.concat({ "holder=ok", "waiter1=" .. UNAV,
        "waiter2=" .. UNAV, "waiter3=" .. UNAV }, ",") },
    { "wakes a waiter of another client at once (was: at its next renewal)",
      "waiter_client", "holder=ok,waiter=" .. UNAV },
    { "ends semaphore waiters and waitForUnlock calls of both clients",
      "semaphore", table.concat({ "holder=ok", "unlock1=" .. UNAV,
        "unlock2=" .. UNAV, "waiter=" .. UNAV }, ",") },
    { "ends waiters that were subscribing, or waiting for the subscription, with E_UNAVAILABLE",
      "subscribing", "holder=ok,waiter_a=" .. UNAV .. ",waiter_b=" .. UNAV },
    { "ends every held key of a keyed set, and its waiters, decorated or not",
      "keyed", "holder=ok,waiter_7=" .. UNAV .. ",waiter_a=" .. UNAV },
  }) do
    local name, child_case, expected = table.unpack(case)
    it(name, h.async(function() check(child_case, expected) end, { deadline = 60000 }))
  end
end)
