-- The acquire script's queueing short path (docs/redis-locks.md, "In
-- Redis"): a new waiter on a mutex whose one holder's lease is running is
-- queued before the prelude is set up, without expiring dead waiters
-- first.  It must queue exactly as the full path does (arrival number,
-- deadline, record, the time to the lease's end), keep FIFO order, leave
-- a holder whose lease ended to the full path, and never let a dead
-- waiter it left queued be granted.  The scripts are run directly, with
-- tokens of our own, as in spec 70.

local h = require "helpers"
local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local server, fresh_name = R.file_server(setup, teardown, "spec74")

local release, server_ms = R.release_script, R.server_ms

-- acquire(c, name, token, ttl, wait_ms, channel [, limit, weight]): the
-- acquire script in "wait" mode
local function acquire(c, name, token, ttl, wait_ms, channel, limit, weight)
  return R.acquire_script(c, name, token, ttl, "wait",
    { limit = limit, weight = weight, wait = wait_ms, channel = channel or "spec74:nobody" })
end

describe("a new waiter behind a mutex's live holder", function()
  it("is queued with an arrival number, a deadline and its record, and told when the lease ends",
    h.async(function()
      local c, name = R.one_client(server, fresh_name)
      assert.equal(1, acquire(c, name, "holder", 30000, 3000)[1])
      local before = math.tointeger(tonumber(c:call("GET", name .. ":n")))
      local t0 = server_ms(c)
      local r = acquire(c, name, "waiter", 30000, 3000, "spec74:chan")
      local t1 = server_ms(c)
      assert.equal(0, r[1])
      assert.equal(3, r.n)
      assert.is_true(r[2] > 29000 and r[2] <= 30000)     -- ms to the lease's end
      local arrival = math.tointeger(tonumber(c:call("ZSCORE", name .. ":q", "waiter")))
      assert.is_true(arrival > before)                   -- drawn from the counter
      assert.equal(arrival, math.tointeger(tonumber(c:call("GET", name .. ":n"))))
      -- and answered: every grant before the request has a fence up to it,
      -- every later one a larger fence (docs/redis-locks.md, "Waiting
      -- without polling")
      assert.equal(arrival, math.tointeger(tonumber(r[3])))
      local deadline = tonumber(c:call("ZSCORE", name .. ":w", "waiter"))
      assert.is_true(deadline >= t0 + 3000 and deadline <= t1 + 3000)
      assert.equal("1 3000 spec74:chan", c:call("HGET", name .. ":c", "waiter"))
      -- the first lease of a hand-off is min(ttl, waiterTimeout)
      acquire(c, name, "short", 500, 3000)
      assert.equal("1 500 spec74:nobody", c:call("HGET", name .. ":c", "short"))
      c:close()
    end))

  it("answers as the full path does for the same request", h.async(function()
    -- the full path runs for a limit other than 1: a semaphore of 2 held
    -- whole by one holder queues a waiter of weight 1 the same way
    local c = server:client()
    local short, full = fresh_name(), fresh_name()
    acquire(c, short, "holder", 30000, 3000)
    acquire(c, full, "holder", 30000, 3000, nil, "2", "2")
    local rs = acquire(c, short, "w", 30000, 3000, "spec74:chan")
    local rf = acquire(c, full, "w", 30000, 3000, "spec74:chan", "2", "1")
    assert.equal(rf[1], rs[1])
    assert.equal(rf.n, rs.n)
    assert.is_true(math.abs(rf[2] - rs[2]) <= 50)
    assert.equal(c:call("HGET", full .. ":c", "w"), c:call("HGET", short .. ":c", "w"))
    for _, key in ipairs({ ":q", ":w" }) do
      assert.equal(c:call("ZCARD", full .. key), c:call("ZCARD", short .. key))
    end
    c:close()
  end))

  it("is granted in arrival order, each by one message", h.async(function()
    local c, name = R.one_client(server, fresh_name)
    local got = {}
    local sub = c:subscribe(name .. ":chan", function(m) got[#got + 1] = m:match("^(%S+)") end)
    acquire(c, name, "holder", 30000, 3000)
    for i = 1, 5 do
      assert.equal(0, acquire(c, name, "w" .. i, 30000, 3000, name .. ":chan")[1])
    end
    local holder = "holder"
    for i = 1, 5 do
      assert.equal(1, release(c, name, holder))
      holder = "w" .. i
      assert.is_truthy(c:call("HGET", name .. ":h", holder))
    end
    for _ = 1, 200 do
      if #got >= 5 then break end
      h.sleep(1)
    end
    assert.same({ "w1", "w2", "w3", "w4", "w5" }, got)
    assert.equal(1, release(c, name, holder))
    assert.equal(0, c:call("EXISTS", name .. ":h", name .. ":q", name .. ":w", name .. ":c"))
    sub:unsubscribe()
    c:close()
  end))

  it("is granted at once when the holder's lease has ended (the full path)", h.async(function()
    local c, name = R.one_client(server, fresh_name)
    acquire(c, name, "holder", 20, 3000)
    -- kept past its lease, as another holder's longer lease keeps a
    -- semaphore's N:h (docs/redis-locks.md, "Keys that expire")
    c:call("PERSIST", name .. ":h")
    h.sleep(40)                              -- ended in Redis, still recorded
    assert.is_truthy(c:call("HGET", name .. ":h", "holder"))
    local r = acquire(c, name, "newcomer", 30000, 3000)
    assert.equal(1, r[1])
    assert.is_nil(c:call("HGET", name .. ":h", "holder"))
    assert.equal(0, release(c, name, "holder"))
    assert.equal(1, release(c, name, "newcomer"))
    c:close()
  end))

  it("never lets a dead waiter it left queued be granted", h.async(function()
    local c, name = R.one_client(server, fresh_name)
    acquire(c, name, "holder", 30000, 3000)
    acquire(c, name, "dead", 30000, 10)      -- renews nothing: dead after 10 ms
    -- the queue's keys kept past its deadline, as a waiter with a longer
    -- waiterTimeout keeps them (docs/redis-locks.md, "Keys that expire")
    for _, k in ipairs({ ":q", ":w", ":c" }) do c:call("PERSIST", name .. k) end
    h.sleep(30)
    -- queued by the short path: the dead waiter is not expired here
    assert.equal(0, acquire(c, name, "live", 30000, 30000)[1])
    assert.is_truthy(c:call("ZSCORE", name .. ":q", "dead"))
    assert.equal(1, release(c, name, "holder"))
    assert.is_nil(c:call("HGET", name .. ":h", "dead"))
    assert.is_truthy(c:call("HGET", name .. ":h", "live"))
    assert.is_nil(c:call("ZSCORE", name .. ":q", "dead"))
    assert.is_nil(c:call("ZSCORE", name .. ":w", "dead"))
    assert.is_nil(c:call("HGET", name .. ":c", "dead"))
    assert.equal(1, release(c, name, "live"))
    c:close()
  end))
end)
