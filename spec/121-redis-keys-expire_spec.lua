-- Every key a Redis lock writes expires by itself once nothing live can
-- need it (docs/redis-locks.md, "Keys that expire"): N:h at the end of its
-- last lease, N:q, N:w and N:c at most two waiterTimeouts after the last
-- arrival or renewal (and never before a live waiter's deadline), N:free
-- after its watchers' waiterTimeout, N:n an hour after its last use.
-- Before, a holder or waiter killed on a lock that nobody used again left
-- N:h, N:q, N:w and N:c with no expiry: with KeyedRedisMutex over an
-- unbounded key space (user ids, order ids), memory grew without bound.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec121")
local churn_server = R.file_server(setup, teardown)   -- (the churn's own: DBSIZE counts every key)

local raw = R.eval_script

local function pttl(client, key) return client:call("PTTL", key) end

describe("the keys of a lock", function()
  it("expire with what they hold: a lease, the queue's deadlines, a waitForUnlock's mark",
    with.one_client(function(c, name)
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
    end))

  it("never expire before the longest lease or deadline they hold, whatever the options",
    with.one_client(function(c, name)
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
    end))

  it("keep fences increasing when the counter has expired", with.one_client(function(c, name)
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
  end))
end)

-- The churn is the benchmark's own (bench/redis_locks/worker.lua, mode
-- churn, one row of bench/redis_locks.lua): ranges of keys of a
-- KeyedRedisMutex (every 50th a RedisSemaphore, every 7th a bounded
-- waitForUnlock) taken by two processes each, two ranges at a time, each
-- running pair with a process SIGKILLed at random every 20-120 ms; then,
-- after the bound (ttl 200, waiterTimeout 200: 400 ms), the keys counted by
-- SCAN.  The driver runs in a child, which spawns the churning processes.
local CHURN = [[dofile("bench/redis_locks/worker.lua")]]

describe("100,000 keys churned with SIGKILLs (here 2,000: make test's time; bench/redis_locks.lua"
  .. " runs 100,000)", function()
  it("leave only their counters once the leases and deadlines they held have passed",
    h.async(function()
      local s = churn_server
      local c = s:client()
      -- (at least 5 ranges; the driver kills a process of the first pair once
      -- it was granted a key)
      local child = R.child(CHURN, { "churn", s.port, math.max(h.load(2000), 1000) })
      local rc, out, err = child:wait()
      assert.equal(0, rc, err)
      local t = {}
      for k, v in out:gmatch('"([%w_]+)": ([%d.]+)') do t[k] = tonumber(v) end
      assert.is_true(t.kills > 0 and t.counters > 0, out)
      assert.equal(0, t.others, out)             -- nothing but counters
      assert.equal(t.counters, t.after_scan, out)
      -- each counter expires an hour after its last draw
      local cursor, n = "0", 0
      repeat
        local r = c:call("SCAN", cursor, "COUNT", "1000")
        cursor = r[1]
        for _, key in ipairs(r[2]) do
          assert.equal(":n", key:sub(-2))
          local ms = pttl(c, key)
          assert.is_true(ms > 0 and ms <= 3600000, key .. ": " .. ms)
          n = n + 1
        end
      until cursor == "0"
      assert.equal(t.counters, n)
      assert.equal(n, c:call("DBSIZE"))
      c:close()
    end, { deadline = 120000 }))
end)
