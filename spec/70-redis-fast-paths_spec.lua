-- The Redis locks' short paths (docs/redis-locks.md, "In Redis"; docs/redis.md,
-- "Calls"): what the scripts skip in the common cases must not change what
-- they answer, and output written in chunks must keep its order.  The
-- scripts are run here directly, with tokens of our own, so that the cases
-- the locks only meet under load (a lease that ended in Redis before anyone
-- removed it) can be made at will.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec70")

local release = R.release_script

-- acquire(c, name, token, ttl [, mode]): the acquire script for weight 1 of
-- a mutex, with a channel nobody listens on.
local acquire = R.acquire_script

describe("the acquire script's short path (a lock with no holder and no queue)", function()
  it("grants with a fence, the lease end and the value a full grant gives", with.one_client(function(c, name)
    local r = acquire(c, name, "t1", 30000)
    assert.equal(1, r[1])
    assert.equal(1, r[3])                       -- the room left before the grant
    local fence = math.tointeger(tonumber(r[2]))
    assert.is_true(fence > 0)
    assert.same({ "t1" }, { table.unpack(c:call("HKEYS", name .. ":h"), 1, 1) })
    local ends = c:call("HGET", name .. ":h", "t1"):match("^(%d+) 1 " .. r[2] .. " 1$")
    local t = c:call("TIME")
    ends = tonumber(ends)
    local server_ms = tonumber(t[1]) * 1000 + tonumber(t[2]) // 1000
    assert.is_true(ends > server_ms + 29000 and ends <= server_ms + 30000)
    assert.equal(1, release(c, name, "t1"))
  end))

  it("queues a newcomer behind a waiter whose holder's lease ended unnoticed", with.one_client(function(c, name)
    assert.equal(1, acquire(c, name, "holder", 500)[1])
    assert.equal(0, acquire(c, name, "waiter", 30000)[1])     -- queued
    h.sleep(600)                             -- the holder's lease ends; no script ran
    assert.equal(0, acquire(c, name, "newcomer", 30000)[1])   -- behind the waiter
    assert.is_truthy(c:call("HGET", name .. ":h", "waiter"))
    assert.is_nil(c:call("HGET", name .. ":h", "holder"))
    assert.equal(1, c:call("ZCARD", name .. ":q"))
  end))

  it("draws fences above the last one after the counter was lost", with.one_client(function(c, name)
    local last = 0
    for i = 1, 3 do
      local r = acquire(c, name, "t" .. i, 30000)
      local fence = math.tointeger(tonumber(r[2]))
      assert.is_true(fence > last)
      last = fence
      assert.equal(1, release(c, name, "t" .. i))
      if i == 2 then c:call("DEL", name .. ":n") end  -- expired, or a restart lost it
    end
  end))
end)

describe("the release script's short path (a holder, nobody queued)", function()
  it("ends a hold whose lease is still running, and says so", with.one_client(function(c, name)
    acquire(c, name, "t1", 30000)
    assert.equal(1, release(c, name, "t1"))
    assert.equal(0, c:call("EXISTS", name .. ":h"))
    assert.equal(0, release(c, name, "t1"))              -- once
  end))

  it("answers 0 for a lease that ended in Redis, even before anyone removed it", with.one_client(function(c, name)
    -- (a semaphore's: another holder's longer lease keeps its N:h past this
    -- one's end, docs/redis-locks.md, "Keys that expire"; a mutex's N:h
    -- expires with its one lease, and its release is one HDEL: spec 298)
    acquire(c, name, "t1", 10, nil, { limit = 2 })
    -- kept past its lease, as the other holder's would keep it
    c:call("PERSIST", name .. ":h")
    h.sleep(30)
    assert.is_truthy(c:call("HGET", name .. ":h", "t1"))      -- still there
    assert.equal(0, release(c, name, "t1", 2))
    assert.equal(0, c:call("EXISTS", name .. ":h"))
  end))

  it("ends a mutex's lease with its N:h: nothing is left for a release after it", with.one_client(function(c, name)
    acquire(c, name, "t1", 10)
    assert.equal(tonumber(c:call("HGET", name .. ":h", "t1"):match("^(%d+)")),
                 c:call("PEXPIRETIME", name .. ":h"))
    h.sleep(30)
    assert.equal(0, c:call("EXISTS", name .. ":h"))
    assert.equal(0, release(c, name, "t1"))
  end))

  it("publishes on the lock's free channel when a waitForUnlock marked it", with.one_client(function(c, name)
    local heard = 0
    local sub = c:subscribe(name .. ":free", function() heard = heard + 1 end)
    acquire(c, name, "t1", 30000)
    c:call("SET", name .. ":free", "1", "PX", "3000")     -- what M.state marks
    release(c, name, "t1")
    for _ = 1, 100 do
      if heard > 0 then break end
      h.sleep(1)
    end
    assert.equal(1, heard)
    assert.equal(0, c:call("EXISTS", name .. ":free"))   -- the mark is used up
    -- unmarked, the next release publishes nothing
    acquire(c, name, "t2", 30000)
    release(c, name, "t2")
    h.sleep(20)
    assert.equal(1, heard)
    sub:unsubscribe()
  end))
end)

describe("the release script's mutex hand-off (a holder, a live head queued)", function()
  -- queue(c, name, token, wait_ms, channel): the acquire script, queued
  local function queue(c, name, token, wait_ms, channel)
    return acquire(c, name, token, 30000, "wait", { wait = wait_ms, channel = channel })
  end

  local function heard_on(c, channel)
    local got = {}
    local sub = c:subscribe(channel, function(message) got[#got + 1] = message end)
    return got, sub
  end

  local function settle(got, n)
    for _ = 1, 200 do
      if #got >= n then return end
      h.sleep(1)
    end
  end

  it("grants the head as dispatch would: fence, first lease, one message", with.one_client(function(c, name)
    local got, sub = heard_on(c, name .. ":chan")
    local r = acquire(c, name, "holder", 30000)
    local fence = math.tointeger(tonumber(r[2]))
    assert.equal(0, queue(c, name, "head", 3000, name .. ":chan")[1])
    assert.equal(0, queue(c, name, "second", 3000, name .. ":chan")[1])
    assert.equal(1, release(c, name, "holder"))
    local g = c:call("HGET", name .. ":h", "head")
    local ends, f2 = g:match("^(%d+) 1 (%d+) 1$")
    assert.is_truthy(f2)
    assert.is_true(math.tointeger(tonumber(f2)) > fence)
    assert.same({ "head" }, { table.unpack(c:call("HKEYS", name .. ":h"), 1, 1) })
    assert.is_nil(c:call("HGET", name .. ":h", "holder"))
    -- the first lease of a hand-off: min(ttl, waiterTimeout)
    local t = c:call("TIME")
    ends = tonumber(ends)
    local server_ms = tonumber(t[1]) * 1000 + tonumber(t[2]) // 1000
    assert.is_true(ends > server_ms + 2000 and ends <= server_ms + 3000)
    assert.is_nil(c:call("ZSCORE", name .. ":q", "head"))
    assert.is_nil(c:call("ZSCORE", name .. ":w", "head"))
    assert.is_nil(c:call("HGET", name .. ":c", "head"))
    assert.same({ "second" }, { table.unpack(c:call("ZRANGE", name .. ":q", 0, -1), 1, 1) })
    settle(got, 1)
    assert.same({ "head " .. f2 .. " 1" }, got)
    -- the next hand-off, to "second", the same way
    assert.equal(1, release(c, name, "head"))
    assert.is_truthy(c:call("HGET", name .. ":h", "second"))
    assert.equal(0, c:call("EXISTS", name .. ":q"))
    settle(got, 2)
    assert.equal(2, #got)
    sub:unsubscribe()
  end))

  it("skips a dead head (the full path), and a dead waiter behind a live one later", with.one_client(function(c, name)
    acquire(c, name, "holder", 30000)
    queue(c, name, "dead", 10, "spec70:nobody")
    queue(c, name, "live", 30000, "spec70:nobody")
    queue(c, name, "dead2", 10, "spec70:nobody")
    queue(c, name, "last", 30000, "spec70:nobody")
    h.sleep(30)                         -- both short-lived waiters are dead now
    assert.equal(1, release(c, name, "holder"))
    assert.is_truthy(c:call("HGET", name .. ":h", "live"))
    assert.is_nil(c:call("HGET", name .. ":h", "dead"))
    assert.is_nil(c:call("ZSCORE", name .. ":q", "dead"))
    assert.equal(1, release(c, name, "live"))
    assert.is_nil(c:call("HGET", name .. ":h", "dead2"))
    assert.is_truthy(c:call("HGET", name .. ":h", "last"))
    assert.equal(0, c:call("EXISTS", name .. ":q", name .. ":w", name .. ":c"))
  end))

  it("is for mutexes only: a semaphore's release dispatches every head that fits", with.one_client(function(c, name)
    local function sem(token, weight)
      return acquire(c, name, token, 30000, "wait", { limit = 2, weight = weight })
    end
    assert.equal(1, sem("a", 2)[1])
    assert.equal(0, sem("b", 1)[1])
    assert.equal(0, sem("c", 1)[1])
    assert.equal(1, c:eval(scripts.release, scripts.keys(name), { "a", "2" }))
    assert.is_truthy(c:call("HGET", name .. ":h", "b"))
    assert.is_truthy(c:call("HGET", name .. ":h", "c"))
  end))
end)

describe("RedisMutex on the short paths", function()
  it("keeps fences increasing and one holder over 200 cycles of 20 coroutines", with.one_lock(am.RedisMutex, function(m)
    local inside, last, done = 0, 0, 0
    local me = coroutine.running()
    for _ = 1, 20 do
      am.spawn(function()
        for _ = 1, 10 do
          local held = m:acquire()
          inside = inside + 1
          assert.equal(1, inside)
          assert.is_true(held.fence > last)
          last = held.fence
          inside = inside - 1
          assert.is_true(held())
        end
        done = done + 1
        if done == 20 then coroutine.resume(me) end
      end)
    end
    coroutine.yield()
    assert.is_false(m:isLocked())
  end))
end)

describe("cancel() while the first request of an acquire is in flight", function()
  it("rejects the request once Redis queued it, and takes it out of the queue", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local mb = am.RedisMutex.new(b, name, { cancelError = "stop" })
    local outcome
    h.spawn(function() outcome = select(2, pcall(mb.acquire, mb)) end)
    assert.equal(1, b:pending())          -- the acquire request, not answered yet
    mb:cancel()
    h.wait_until(function() return outcome ~= nil end)
    assert.equal("stop", outcome)
    b:call("PING")                        -- the withdrawal (in the background) is done
    assert.equal(0, a:call("ZCARD", name .. ":q"))
    assert.is_true(ra())
  end))
end)

describe("a client whose Redis locks were used, then dropped", function()
  it("is collected: the timers kept for reuse hold no lock and no client", with.one_client(function(a, name)
    local weak = setmetatable({}, { __mode = "v" })
    do
      local b = server:client()
      local ma, mb = am.RedisMutex.new(a, name), am.RedisMutex.new(b, name)
      local ra = ma:acquire()
      local rb
      h.spawn(function() rb = mb:acquire() end)   -- b waits: subscribes, is handed the lock
      h.wait_until(function() return R.queued(a, name) == 1 end)
      assert.is_true(ra())
      h.wait_until(function() return rb ~= nil end)
      assert.is_true(rb())                           -- b's lease timer goes back to the pool
      h.sleep(5)                                     -- b's hub unsubscribes
      weak[1], weak[2] = b, mb
    end
    for _ = 1, 4 do collectgarbage() end
    assert.is_nil(weak[2])
    assert.is_nil(weak[1])
  end))
end)

describe("calls made while replies are delivered", function()
  it("are written in chunks and answered in order", with.client(function(c)
    local pad = string.rep("x", 200)
    local n, done, bad = 200, 0, 0
    local me = coroutine.running()
    for i = 1, n do
      am.spawn(function()
        c:call("PING")
        -- these calls are made inside the callback that delivers the PONGs:
        -- 200 x 200 bytes, written 2 KB at a time before it ends
        for k = 1, 3 do
          if c:call("ECHO", pad .. i .. ":" .. k) ~= pad .. i .. ":" .. k then bad = bad + 1 end
        end
        done = done + 1
        if done == n then coroutine.resume(me) end
      end)
    end
    coroutine.yield()
    assert.equal(0, bad)
    assert.equal(0, c:pending())
  end))
end)
