-- The Redis locks' option `replicas = N` (docs/redis-locks.md, "Scaling
-- out"): a grant is confirmed by WAIT on N replicas before acquire returns
-- it; one not confirmed in time is given back and raised (E_UNAVAILABLE,
-- with the reason), never used.  Renewals and releases are confirmed too.
-- Real servers: a master with one replica, and a master with none.

local am = require "async_mutex"
local h = require "helpers"
local R = require "lock_redis"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

-- The WAIT commands a server received, from its MONITOR-free counter.
local function waits(admin)
  local info = admin:call("INFO", "commandstats")
  return tonumber(info:match("cmdstat_wait:calls=(%d+)")) or 0
end

describe("a Redis lock with replicas = N", function()
  local master, replica, lonely
  setup(function()
    -- (the replica's first sync starts at once: Redis 7 waits 5 s by
    -- default for more replicas to share a transfer)
    master = redis_server.start(nil, "--repl-diskless-sync-delay 0")
    replica = redis_server.start(nil, "--replicaof 127.0.0.1 " .. master.port)
    lonely = redis_server.start()
    -- in sync, and counted by the master's WAIT (it counts a replica once
    -- the replica's first acknowledgement came, after its link is up)
    h.run(function()
      local m = redis.connect { port = master.port }
      h.wait_until(function() return m:call("WAIT", "1", "50") >= 1 end, 15000,
        "the replica in sync")
      m:close()
    end, { deadline = 20000 })
  end)
  teardown(function()
    for _, s in ipairs({ master, replica, lonely }) do if s then s:stop() end end
  end)

  it("confirms grants, renewals and releases by WAIT, and hands off between clients",
    h.async(function()
      -- WAIT's timeout is min(commandTimeout / 2, ttl / 4): 500 ms with
      -- commandTimeout 1000, which a replica missed on a loaded machine
      -- (GC stress and valgrind side by side; 4 times in a day of test runs
      -- beside each other): a latency bound, 2 s here, stretched there
      local S = h.TIME_SCALE
      local a = redis.connect { port = master.port, commandTimeout = 4000 * S }
      local b = redis.connect { port = master.port, commandTimeout = 4000 * S }
      local admin = redis.connect { port = master.port }
      local _ <close> = h.closing(a, b, admin)
      local before = waits(admin)
      local ma = am.RedisMutex.new(a, "spec202", { replicas = 1, ttl = 8000 * S,
                                                   renewInterval = 50 })
      local mb = am.RedisMutex.new(b, "spec202", { replicas = 1 })
      R.renewed_hand_off(ma, mb, 20)
      -- a grant, 2 renewals, a release; a hand-off grant (asked again,
      -- then WAIT), its release
      assert.is_true(waits(admin) - before >= 6)
      local rr = redis.connect { port = replica.port }
      local _rr <close> = h.closing(rr)
      assert.equal(0, rr:call("EXISTS", "spec202:h"))
      a:close(); b:close(); admin:close(); rr:close()
    end))

  it("gives a grant back and raises E_UNAVAILABLE when too few replicas confirm it",
    h.async(function()
      local c = redis.connect { port = lonely.port, commandTimeout = 1000 }
      local _ <close> = h.closing(c)
      local m = am.RedisMutex.new(c, "spec202:lonely", { replicas = 1 })
      local ok, err = pcall(m.acquire, m)
      assert.is_false(ok)
      assert.is_true(err == redis.E_UNAVAILABLE)
      assert.equal("grant not confirmed: 0 of 1 replicas within 500 ms", err.reason)
      h.wait_until(function() return c:call("EXISTS", "spec202:lonely:h") == 0 end,
        2000, "the grant given back")
      assert.is_false(m:isLocked())
      -- a semaphore and a keyed set, alike
      local s = am.RedisSemaphore.new(c, "spec202:sem", 2, { replicas = 2 })
      ok, err = pcall(s.acquire, s)
      assert.is_false(ok)
      assert.equal("grant not confirmed: 0 of 2 replicas within 500 ms", err.reason)
      local k = am.KeyedRedisMutex.new(c, "spec202:k:", { replicas = 1 })
      ok, err = pcall(k.acquire, k, "a")
      assert.is_false(ok)
      assert.equal("grant not confirmed: 0 of 1 replicas within 500 ms", err.reason)
      -- without the option the same server grants
      local plain = am.RedisMutex.new(c, "spec202:lonely")
      plain:acquire()()
      c:close()
    end))

  -- WAIT counts the writes of its own connection: on a new one (the
  -- server ended the script's after its reply, and WAIT's call connected
  -- again) it counts none, and confirmed at once a grant that may be on
  -- no replica.
  it("takes no WAIT on a later connection than its script's as a confirmation",
    h.async(function()
      local c = redis.connect { port = master.port, commandTimeout = 1000 * h.TIME_SCALE }
      local admin = redis.connect { port = master.port }
      local _ <close> = h.closing(c, admin)
      local id = c:call("CLIENT", "ID")
      local Client = getmetatable(c).__index
      local call, killed = Client.call, false
      finally(function() Client.call = call end)
      Client.call = function(self, cmd, ...)
        if self == c and cmd == "WAIT" and not killed then
          killed = true                           -- the script's connection ends
          assert.equal(1, admin:call("CLIENT", "KILL", "ID", id))
          h.sleep(50)
        end
        return call(self, cmd, ...)
      end
      local m = am.RedisMutex.new(c, "spec202:epoch", { replicas = 1 })
      local ok, err = pcall(m.acquire, m)
      assert.is_true(killed)
      assert.is_false(ok)
      assert.is_true(err == redis.E_UNAVAILABLE, tostring(err))
      assert.equal("grant not confirmed: the connection that made the write ended before"
        .. " its WAIT", err.reason)
      h.wait_until(function() return admin:call("EXISTS", "spec202:epoch:h") == 0 end,
        2000, "the grant given back")
      -- the next grant is made and confirmed on one connection
      m:acquire()()
      c:close(); admin:close()
    end))

  -- The kinds built on the Redis locks' machinery (redis_lock_base.lua)
  -- take the option with the same rules (docs/redis-locks.md, "Scaling
  -- out", which locks).
  it("every kind built on the Redis locks confirms its grants, and gives back those not confirmed",
    h.async(function()
      local c = redis.connect { port = master.port }
      local admin = redis.connect { port = master.port }
      local lonely_c = redis.connect { port = lonely.port, commandTimeout = 1000 }
      local _ <close> = h.closing(c, admin, lonely_c)
      local REPLICAS = { replicas = 1 }
      local NOT = "grant not confirmed: 0 of 1 replicas within 500 ms"
      -- each: a grant on the master with a replica (confirmed: WAITs
      -- counted), then the same kind on the server with none (refused,
      -- given back: the keys gone, the lock free)
      local kinds = {
        { "RedisRWLock write", function(cl, n)
            return am.RedisRWLock.new(cl, n, REPLICAS):acquireWrite() end },
        { "RedisRWLock read", function(cl, n)
            return am.RedisRWLock.new(cl, n, REPLICAS):acquireRead() end },
        { "RedisReentrantMutex", function(cl, n)
            return am.RedisReentrantMutex.new(cl, n, REPLICAS):acquire() end },
        { "KeyedRedisMutex:acquireAll", function(cl, n)
            return am.KeyedRedisMutex.new(cl, n .. ":", REPLICAS):acquireAll({ "a", "b", "c" }) end },
        { "KeyedRedisRWLock:acquireAllWrite", function(cl, n)
            return am.KeyedRedisRWLock.new(cl, n .. ":", REPLICAS):acquireAllWrite({ "a", "b" }) end },
      }
      for i, kind in ipairs(kinds) do
        local name = "spec202:kind" .. i
        local before = waits(admin)
        local release = kind[2](c, name)
        assert.is_true(waits(admin) - before >= 1, kind[1] .. ": its grant confirmed")
        before = waits(admin)
        assert.is_true(release())
        assert.is_true(waits(admin) - before >= 1, kind[1] .. ": its release confirmed")
        local ok, err = pcall(kind[2], lonely_c, name)
        assert.is_false(ok, kind[1])
        assert.is_true(err == redis.E_UNAVAILABLE, kind[1])
        assert.equal(NOT, err.reason, kind[1])
        -- given back: nothing of the grant left in Redis (only the
        -- counters of fences may stay)
        h.wait_until(function()
          for _, key in ipairs(lonely_c:call("KEYS", name .. "*")) do
            if lonely_c:call("TYPE", key) ~= "string" then return false end
          end
          return true
        end, 2000, kind[1] .. ": the grant given back")
      end
      c:close(); admin:close(); lonely_c:close()
    end))

  it("a renewal not confirmed extends nothing: the hold is lost when its lease ends",
    h.async(function()
      local c = redis.connect { port = master.port, commandTimeout = 100 }
      local _ <close> = h.closing(c)
      local lost = {}
      local m = am.RedisMutex.new(c, "spec202:renew", { replicas = 1, ttl = 400,
        renewInterval = 100, onLost = function(info) lost[#lost + 1] = info.reason end })
      local release = m:acquire()
      replica:signal("STOP")                         -- WAIT now times out
      local ok, err = pcall(function()
        h.wait_until(function() return #lost == 1 end, 2000, "the hold lost")
        assert.same({ "expired" }, lost)
        local held, e = pcall(release.check, release)
        assert.is_false(held)
        assert.is_true(e == am.E_LOST)
      end)
      replica:signal("CONT")
      c:close()
      assert(ok, err)
    end))

  it("refuses a bad value, and a client that is not async_mutex.redis's", function()
    local c = redis.connect { port = master.port }
    local _ <close> = h.closing(c)
    local fake = { eval = function() end, subscribe = function() end }
    h.raises_at_caller { function() am.RedisMutex.new(c, "x", { replicas = 0 }) end,
      "bad argument #3 to 'new' (options.replicas must be an integer >= 1)" }
    h.raises_at_caller { function() am.RedisMutex.new(c, "x", { replicas = 1.5 }) end,
      "bad argument #3 to 'new' (options.replicas must be an integer >= 1)" }
    h.raises_at_caller { function() am.RedisSemaphore.new(c, "x", 2, { replicas = "1" }) end,
      "bad argument #4 to 'new' (options.replicas must be an integer >= 1)" }
    h.raises_at_caller { function() am.KeyedRedisMutex.new(fake, "x", { replicas = 1 }) end,
      "bad argument #3 to 'new' (options.replicas needs an async_mutex.redis client)" }
    h.raises_at_caller { function() am.RedisRWLock.new(c, "x", { replicas = 0 }) end,
      "bad argument #3 to 'new' (options.replicas must be an integer >= 1)" }
    h.raises_at_caller { function() am.RedisReentrantMutex.new(fake, "x", { replicas = 1 }) end,
      "bad argument #3 to 'new' (options.replicas needs an async_mutex.redis client)" }
    -- a quorum of independent masters: docs/redis-locks.md, "Scaling out"
    local c2 = redis.connect { port = lonely.port }
    local _c2 <close> = h.closing(c2)
    h.raises_at_caller { function() am.RedlockMutex.new({ c, c2 }, "x", { replicas = 1 }) end,
      "bad argument #3 to 'new' (options.replicas is not for RedlockMutex"
        .. " (its servers are independent masters: the quorum keeps a grant))" }
    c:close(); c2:close()
  end)
end)
