-- client:close() gives back in Redis what the client's locks had there
-- (docs/redis-locks.md, "Closing the client"): its holds, its places in the
-- Redis queues, and releases and withdrawals the close cut off, on a
-- connection of its own to the same server, bounded by the client's
-- commandTimeout; then uv.run() returns.  Before, a hold whose `<close>`
-- releaser was still pending at close() left the other processes waiting
-- for its lease (ttl, 30 s by default), and a waiter of the closed client
-- that reached the head of the queue was handed the lock and held it for
-- its first lease.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec124")

local function ms_since(t0) return (uv.hrtime() - t0) / 1e6 end

describe("client:close() with holds pending", function()
  it("gives back a mutex, a semaphore's weight and a keyed set's keys: the other process"
    .. " is granted at once (was: after ttl)", h.async(function()
    local ma, mb, a, b, name = R.two_locks(server, fresh_name, am.RedisMutex)
    local sa = am.RedisSemaphore.new(a, name .. "s", 3)
    local sb = am.RedisSemaphore.new(b, name .. "s", 3)
    local ka, kb = am.KeyedRedisMutex.new(a, name .. "k:"), am.KeyedRedisMutex.new(b, name .. "k:")
    local held = false
    local section = h.spawn(function()
      local r <close> = ma:acquire()
      local _, s <close> = sa:acquire(2)
      local k1 <close> = ka:acquire("x")
      local k2 <close> = ka:acquire(7)
      held = true
      am.sleep(60000)                      -- the section goes on; the client is closed
    end)
    h.wait_until(function() return held end)
    local got = {}
    h.spawn(function() got.m = mb:acquire() end)
    h.spawn(function() got.s = select(2, sb:acquire(3)) end)
    h.spawn(function() got.x = kb:acquire("x") end)
    h.spawn(function() got[7] = kb:acquire(7) end)
    h.wait_until(function() return R.queued(b, name) == 1 and R.queued(b, name .. "k:7") == 1 end)
    local t0 = uv.hrtime()
    a:close()
    h.wait_until(function() return got.m and got.s and got.x and got[7] end, 3000)
    local ms = ms_since(t0)
    assert.is_true(ms < 1000 * h.TIME_SCALE, ("granted %.0f ms after the close"):format(ms))
    for _, r in pairs(got) do assert.is_true(r()) end
    assert.is_true(coroutine.close(section))   -- its releasers: false, nothing sent
    b:close()
  end, { deadline = 10000 }))

  it("takes its waiters out of the Redis queue: the next process does not wait for them",
    h.async(function()
      local a, b, c = server:client(), server:client(), server:client()
      local name = fresh_name()
      local slow = { waiterTimeout = 30000 }
      local ra = am.RedisMutex.new(a, name):acquire()
      local mb = am.RedisMutex.new(b, name, slow)
      local outcome, rc
      h.spawn(function() outcome = select(2, pcall(mb.acquire, mb)) end)
      h.wait_until(function() return R.queued(a, name) == 1 end)
      h.spawn(function() rc = am.RedisMutex.new(c, name):acquire() end)
      h.wait_until(function() return R.queued(a, name) == 2 end)
      b:close()                              -- B's waiter ends; its place is given back
      h.wait_until(function() return outcome ~= nil end)
      assert.equal(am.E_UNAVAILABLE, outcome)
      -- (not B's waiterTimeout, 30 s: a helper's full suite beside a CI
      -- run took more than 2 s here once)
      h.wait_until(function() return R.queued(a, name) == 1 end, 10000)
      local t0 = uv.hrtime()
      assert.is_true(ra())
      h.wait_until(function() return rc ~= nil end, 3000)
      assert.is_true(ms_since(t0) < 1000 * h.TIME_SCALE)
      assert.is_true(rc())
      a:close(); c:close()
    end, { deadline = 20000 }))
end)

-- A child: a hold of the mutex NAME, the server SIGSTOPped by the parent
-- (which waits for "held"), then close(): uv.run() returns once the
-- give-back has had its commandTimeout (300 ms).  Prints the ms from
-- close() to uv.run()'s return.
local PAUSED = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SOCK, NAME = ...
local c = redis.connect { path = SOCK, commandTimeout = 300 }
local m = am.RedisMutex.new(c, NAME)
local closed_at
am.spawn(function()
  local r <close> = m:acquire()
  io.stdout:write("held\n")
  io.stdout:flush()
  am.sleep(300)                              -- the parent stops the server
  closed_at = uv.hrtime()
  c:close()
end)
uv.run()
io.stdout:write(("%.1f\n"):format((uv.hrtime() - closed_at) / 1e6))
]]

describe("the give-back of a closed client", function()
  it("is bounded by its commandTimeout when the server does not answer", h.async(function()
    local child = R.child(PAUSED, { server.path, fresh_name() })
    assert.is_true(child:wait_for("held\n", 5000))
    server:pause()
    local rc, out, err = child:wait()
    server:resume()
    assert.equal(0, rc, err)
    local ms = tonumber(out:match("held\n(%S+)\n"))
    assert.is_true(ms >= 250 and ms < 300 + 200 * h.TIME_SCALE,
      ("uv.run() returned %.1f ms after close()"):format(ms))
  end, { deadline = 15000 }))
end)
