-- Every key a Redis lock writes expires by itself once nothing live can
-- need it (docs/redis-locks.md, "Keys that expire"): N:h at the end of its
-- last lease, N:q, N:w and N:c at most two waiterTimeouts after the last
-- arrival or renewal (and never before a live waiter's deadline), N:free
-- after its watchers' waiterTimeout, N:n an hour after its last use.
-- Before, a holder or waiter killed on a lock that nobody used again left
-- N:h, N:q, N:w and N:c with no expiry: with KeyedRedisMutex over an
-- unbounded key space (user ids, order ids), memory grew without bound.

local am = require "async_mutex"
local h = require "helpers"
local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local server

setup(function() server = R.server() end)
teardown(function() if server then server:stop() end end)

local fresh_name = R.namer("spec121")

local function raw(client, name, script, ...)
  return client:eval(script, scripts.keys(name), { ... })
end

local function pttl(client, key) return client:call("PTTL", key) end

describe("the keys of a lock", function()
  it("expire with what they hold: a lease, the queue's deadlines, a waitForUnlock's mark",
    h.async(function()
      local c = server:client()
      local name = fresh_name()
      raw(c, name, scripts.acquire, "A", "1", "1", "500", "300", "ch", "wait")
      local t = pttl(c, name .. ":h")
      assert.is_true(t > 400 and t <= 500, "N:h: " .. t)
      raw(c, name, scripts.acquire, "B", "1", "1", "500", "300", "ch", "wait")
      for _, k in ipairs({ ":q", ":w", ":c" }) do
        t = pttl(c, name .. k)
        assert.is_true(t > 500 and t <= 600, k .. ": " .. t)     -- two waiterTimeouts
      end
      raw(c, name, scripts.state, "1", "1", "250")              -- a waitForUnlock's mark
      t = pttl(c, name .. ":free")
      assert.is_true(t > 150 and t <= 250, "N:free: " .. t)
      t = pttl(c, name .. ":n")
      assert.is_true(t > 3500000 and t <= 3600000, "N:n: " .. t)
      -- the release hands the lock to B: N:h then expires with B's first lease
      assert.equal(1, raw(c, name, scripts.release, "A", "1"))
      t = pttl(c, name .. ":h")
      assert.is_true(t > 200 and t <= 300, "N:h after the hand-off: " .. t)
      assert.equal(1, raw(c, name, scripts.renew, "B", "1", "500"))
      t = pttl(c, name .. ":h")
      assert.is_true(t > 400 and t <= 500, "N:h after B's renewal: " .. t)
      h.sleep(600)                           -- nobody renews anything
      local left = c:call("KEYS", name .. ":*")
      assert.equal(1, #left)
      assert.equal(name .. ":n", left[1])
      c:close()
    end))

  it("never expire before the longest lease or deadline they hold, whatever the options",
    h.async(function()
      local c = server:client()
      local name = fresh_name()
      -- a semaphore of 2: X with a long lease, then Y with a short one
      raw(c, name, scripts.acquire, "X", "2", "1", "100000", "300", "ch", "wait")
      raw(c, name, scripts.acquire, "Y", "2", "1", "100", "300", "ch", "wait")
      assert.is_true(pttl(c, name .. ":h") > 90000)
      assert.equal(1, raw(c, name, scripts.renew, "Y", "2", "100"))
      assert.is_true(pttl(c, name .. ":h") > 90000)
      -- X's release leaves N:h's expiry as it was (it only ever grows):
      -- at most ttl after the last grant or renewal
      assert.equal(1, raw(c, name, scripts.release, "X", "2"))
      local t = pttl(c, name .. ":h")
      assert.is_true(t > 90000 and t <= 100000, "N:h after X's release: " .. t)
      -- Y's weight fills nothing; a waiter of weight 2 queues behind it:
      -- first with a long waiterTimeout, then one with a short one
      raw(c, name, scripts.acquire, "long", "2", "2", "100000", "100000", "ch", "wait")
      raw(c, name, scripts.acquire, "short", "2", "2", "100000", "50", "ch", "wait")
      for _, k in ipairs({ ":q", ":w", ":c" }) do
        assert.is_true(pttl(c, name .. k) > 100000, k)
      end
      raw(c, name, scripts.acquire, "short", "2", "2", "100000", "50", "ch", "again")
      for _, k in ipairs({ ":q", ":w", ":c" }) do
        assert.is_true(pttl(c, name .. k) > 100000, k)
      end
      c:call("DEL", name .. ":h", name .. ":q", name .. ":w", name .. ":c", name .. ":n")
      c:close()
    end))

  it("keep fences increasing when the counter has expired", h.async(function()
    local c = server:client()
    local name = fresh_name()
    local m = am.RedisMutex.new(c, name)
    local r = m:acquire()
    local f1 = r.fence
    r()
    c:call("PEXPIRE", name .. ":n", "1")
    h.sleep(5)
    assert.equal(0, c:call("EXISTS", name .. ":n"))
    r = m:acquire()
    assert.is_true(r.fence > f1)
    r()
    c:close()
  end))
end)

-- One churning process: coroutines take the keys FROM..TO of a keyed set
-- (and, every 50 keys, a semaphore of 2 with weight 1 or 2) in turn,
-- holding each a few ms, some of them waitForUnlock, until killed.  Two
-- such processes share each range, so that they queue for each other.
-- Prints "k" after each key.
local CHURN = R.PROLOGUE .. [[
local PREFIX, FROM, TO, SEED = table.unpack(ARGS)
FROM, TO = tonumber(FROM), tonumber(TO)
math.randomseed(tonumber(SEED))
local o = { ttl = 200, waiterTimeout = 200 }
local k = am.KeyedRedisMutex.new(client, PREFIX, o)
main(function()
  local next_key = FROM
  local left = 4
  local done = coroutine.running()
  for _ = 1, 4 do
    am.spawn(function()
      while next_key <= TO do
        local key = next_key
        next_key = next_key + 1
        if key % 50 == 0 then
          local s = am.RedisSemaphore.new(client, PREFIX .. "s" .. key, 2, o)
          local _, r = s:acquire(math.random(2))
          am.sleep(math.random(0, 5))
          r()
        elseif key % 7 == 0 then
          pcall(k.waitForUnlock, am.withTimeout(k, 20), key)
        else
          local r = k:acquire(key)
          am.sleep(math.random(0, 3))
          r()
        end
        io.stdout:write("k\n")
        io.stdout:flush()
      end
      left = left - 1
      if left == 0 then coroutine.resume(done) end
    end)
  end
  coroutine.yield()
end)
]]

describe("100,000 keys churned with SIGKILLs (here 2,000: the rate of one process is the bound"
  .. " of make test's time; bench/redis_locks.lua runs 100,000)", function()
  it("leave only their counters once the leases and deadlines they held have passed",
    h.async(function()
      local s = R.server()                 -- its own: DBSIZE counts every key
      local c = s:client()
      local prefix = fresh_name() .. ":"
      local KEYS, RANGE = h.load(2000), 100
      local seed = os.time()
      math.randomseed(seed)
      local started = 0
      -- two pairs of processes at a time; each process of a pair is
      -- killed at a random time, or runs its range to the end
      local function pair(from)
        local to = math.min(from + RANGE - 1, KEYS)
        local kids = {}
        for i = 1, 2 do
          kids[i] = R.child(CHURN, { s.path, prefix, from, to, seed + from + i })
        end
        return kids
      end
      local running = {}
      local from = 1
      while from <= KEYS or next(running) do
        while from <= KEYS and #running < 2 do
          running[#running + 1] = pair(from)
          started = started + 1
          from = from + RANGE
        end
        h.sleep(math.random(20, 120))
        for i = #running, 1, -1 do
          local kids = running[i]
          local victim = kids[math.random(2)]
          if math.random() < 0.5 then victim:kill() end
          if kids[1].done and kids[2].done then table.remove(running, i) end
        end
      end
      for _, kids in ipairs(running) do
        for _, child in ipairs(kids) do child:kill() end
      end
      assert.is_true(started >= KEYS // RANGE)
      -- the bound: every lease (ttl 200) and every deadline (2 x 200) over
      h.sleep(2 * 200 + 100)
      -- (a SCAN removes the keys whose expiry has passed but that the
      -- server's active expiry cycle has not reached yet; DBSIZE counts them)
      local cursor, names, others = "0", {}, {}
      repeat
        local r = c:call("SCAN", cursor, "MATCH", prefix .. "*", "COUNT", "1000")
        cursor = r[1]
        for _, key in ipairs(r[2]) do
          if key:sub(-2) == ":n" then
            names[#names + 1] = key
            local t = pttl(c, key)
            assert.is_true(t > 0 and t <= 3600000, key .. ": " .. t)
          else
            others[#others + 1] = key
          end
        end
      until cursor == "0"
      table.sort(others)
      assert.same({}, { table.unpack(others, 1, math.min(#others, 20)) }, "seed " .. seed)
      assert.is_true(#names > 0, "no key was used")
      assert.equal(#names, c:call("DBSIZE"))
      c:close()
      s:stop()
    end, { deadline = 120000 }))
end)
