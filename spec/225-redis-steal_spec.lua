-- lock:steal on the Redis locks (docs/redis-locks.md, "Steal"): a forced
-- takeover with a new fence, in one script.  The holds in place end in
-- Redis at once; their holders are told (onLost, check() raises E_LOST,
-- their releaser returns false and changes nothing in Redis); the queue
-- keeps its order.  Holders in other processes are child lua5.4 processes
-- that write markers to their stdout; the server is this file's own.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec225")

-- The tokens that hold `name` in Redis (its N:h hash).
local function holders(c, name)
  local all = c:call("HGETALL", name .. ":h")
  local t = {}
  for i = 1, all.n or #all, 2 do t[#t + 1] = all[i] end
  return t
end

-- A child that holds the RedisMutex NAME (options ttl TTL, renewInterval
-- RENEW, waiterTimeout WAIT), after waiting for it when QUEUE is "queue"
-- (so that it listens on its hand-off channel).  Its markers go to the
-- file LOG (one write(2) each, O_APPEND, as the fault specs' do): "queued",
-- "held FENCE", then, checking its hold every 10 ms until it is lost,
-- "lost REASON MS CHECK RELEASE": what onLost said, the ms since "held",
-- what check() raised, what its releaser returned.
local HOLDER = R.PROLOGUE .. [[
local name, ttl, renew, wait = ARGS[1], tonumber(ARGS[2]), tonumber(ARGS[3]), tonumber(ARGS[4])
local queue, f = ARGS[5] == "queue", assert(io.open(ARGS[6], "a"))
f:setvbuf("no")
main(function()
  local reason
  local m = am.RedisMutex.new(client, name, { ttl = ttl, renewInterval = renew,
    waiterTimeout = wait, onLost = function(info) reason = info.reason end })
  if queue then f:write("queued\n") end
  local release = m:acquire()
  local t0 = uv.hrtime()
  f:write(("held %d\n"):format(release.fence))
  while not reason do am.sleep(10) end
  local ok, err = pcall(release.check, release)
  f:write(("lost %s %d %s %s\n"):format(reason, (uv.hrtime() - t0) // 1e6,
    ok and "ok" or tostring(err), tostring(release())))
end)
]]

-- A new marker file for a HOLDER child (in the server's directory, removed
-- with it).
local function marker_file()
  return server.dir .. "/markers" .. fresh_name():match("%d+$")
end

local function markers(path)
  local f = io.open(path)
  if not f then return "" end
  local text = f:read("a")
  f:close()
  return text
end

-- The stealer's own marker ("stole FENCE"), between the holder's.
local function mark(path, text)
  local f = assert(io.open(path, "a"))
  f:write(text)
  f:close()
end

-- Until the marker file has `pattern`.
local function printed(path, pattern)
  h.wait_until(function() return markers(path):find(pattern) ~= nil end, 10000, pattern)
end

describe("RedisMutex:steal", function()
  it("ends the hold of another process at once and gives a larger fence", h.async(function()
    local name = fresh_name()
    local c = server:client()
    -- (no watchdog message path: the child took the lock at once, so it
    -- learns it at its next renewal, every 100 ms)
    local log = marker_file()
    local child = R.child(HOLDER, { server.path, name, 30000, 100, 3000, "now", log })
    printed(log, "held %d+\n")
    local old = math.tointeger(tonumber(markers(log):match("held (%d+)")))
    local m = am.RedisMutex.new(c, name)
    local release = m:steal()
    mark(log, ("stole %d\n"):format(release.fence))
    assert.is_true(release.fence > old)
    -- at once in Redis: the stealer's token alone
    assert.same({ release.token }, holders(c, name))
    local rc, _, err = child:wait()
    assert.equal(0, rc, err)
    -- held, then stolen and told (the told may come before the stealer's
    -- marker: its renewal can follow the script before our reply is read)
    local text = markers(log)
    assert.matches("^held %d+\n", text)
    assert.matches("\nstole %d+\n", text)
    local reason, _, check, rel = text:match("\nlost (%S+) (%d+) (.-) (%S+)\n")
    assert.equal("refused", reason)          -- its renewal found the hold gone
    assert.equal(am.E_LOST, check)
    assert.equal("false", rel)
    -- its release changed nothing: the stealer still holds
    assert.same({ release.token }, holders(c, name))
    assert.is_true(release.check(release))
    assert.is_true(release())
    assert.is_false(m:isLocked())
    c:close()
  end))

  it("tells a holder that listens on its channel by a message, before any renewal",
    h.async(function()
      local name = fresh_name()
      local c = server:client()
      local m = am.RedisMutex.new(c, name)
      local first = m:acquire()
      -- the child queues behind us (and subscribes), then is handed the
      -- lock; its first renewal is 10 s away (ttl and waiterTimeout 30 s)
      local log = marker_file()
      local child = R.child(HOLDER, { server.path, name, 30000, 10000, 30000, "queue", log })
      printed(log, "queued\n")
      h.wait_until(function() return R.queued(c, name) == 1 end, 5000, "the child queued")
      assert.is_true(first())
      printed(log, "held %d+\n")
      local release = m:steal()
      mark(log, ("stole %d\n"):format(release.fence))
      local rc, _, err = child:wait()
      assert.equal(0, rc, err)
      local old = math.tointeger(tonumber(markers(log):match("held (%d+)")))
      assert.is_true(release.fence > old)
      local text = markers(log)
      assert.matches("^queued\nheld %d+\n", text)
      assert.matches("\nstole %d+\n", text)
      local reason, ms, check, rel = text:match("\nlost (%S+) (%d+) (.-) (%S+)\n")
      assert.equal("stolen", reason)
      assert.is_true(tonumber(ms) < 9000, "told by the message, not the renewal: " .. ms)
      assert.equal(am.E_LOST, check)
      assert.equal("false", rel)
      assert.same({ release.token }, holders(c, name))
      assert.is_true(release())
      c:close()
    end))

  it("ends a hold of the same process at once: onLost, check(), releaser, runExclusive",
    h.async(function()
      local name = fresh_name()
      local c = server:client()
      local told = {}
      local m = am.RedisMutex.new(c, name, { onLost = function(i) told[#told + 1] = i end })
      local old = m:acquire()
      local ran
      local runner = am.spawn(function()
        return pcall(m.runExclusive, m, function() ran = true; am.sleep(50); return "x" end)
      end)
      local release = m:steal()           -- (the runner waits at the gate meanwhile)
      assert.equal(1, #told)
      assert.equal("stolen", told[1].reason)
      assert.equal(old.fence, told[1].fence)
      assert.equal(old, told[1].releaser)
      assert.equal(am.E_LOST, h.error_of(function() old:check() end))
      assert.is_false(old())
      assert.matches("lost%)$", tostring(old))
      assert.is_true(release.fence > old.fence)
      assert.same({ release.token }, holders(c, name))
      -- the runner, queued at this process's gate, is served after the stealer
      h.sleep(20)
      assert.is_nil(ran)
      assert.is_true(release())
      local ok, res = runner:join()
      assert.is_true(ok)
      assert.is_true(ran)
      assert.equal("x", res)
      -- a runExclusive whose hold is stolen raises E_LOST when its body returns
      local r2 = am.spawn(function()
        return pcall(m.runExclusive, m, function() am.sleep(100); return "y" end)
      end)
      h.wait_until(function() return m:isLocked() end, 2000)
      local c2 = server:client()
      local release2 = am.RedisMutex.new(c2, name):steal()
      local ok2, err2 = r2:join()
      assert.is_false(ok2)
      assert.equal(am.E_LOST, err2)
      assert.is_true(release2())
      c2:close()
      c:close()
    end))

  it("leaves the queue in its order; the stealer's release serves its head", h.async(function()
    local name = fresh_name()
    local clients, locks = {}, {}
    for i = 1, 4 do
      clients[i] = server:client()
      locks[i] = am.RedisMutex.new(clients[i], name)
    end
    local log = {}
    local first = locks[1]:acquire()
    local tasks = {}
    for i = 2, 3 do
      tasks[i] = am.spawn(function()
        local r = locks[i]:acquire()
        log[#log + 1] = i
        am.sleep(10)
        r()
      end)
      h.wait_until(function() return R.queued(clients[1], name) == i - 1 end, 5000)
    end
    local release = locks[4]:steal()
    assert.is_false(first())
    assert.equal(2, R.queued(clients[1], name))
    h.sleep(30)
    assert.same({}, log)                   -- nobody passed the stealer
    assert.is_true(release())
    tasks[2]:join(); tasks[3]:join()
    assert.same({ 2, 3 }, log)
    for i = 1, 4 do clients[i]:close() end
  end))

  it("on a free lock is a plain grant", with.one_lock(am.RedisMutex, function(m)
    local release = m:steal(5)
    assert.is_true(m:isLocked())
    assert.is_true(release())
    assert.is_false(m:isLocked())
  end))

  it("through withTimeout is the lock's own", with.one_lock(am.RedisMutex, function(m)
    local held = m:acquire()
    local release = am.withTimeout(m, 10):steal()
    assert.is_false(held())
    assert.is_true(release())
  end))

  it("refuses bad arguments and misuse with exact messages", h.async(function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    local s = am.RedisSemaphore.new(c, fresh_name(), 3)
    local km = am.KeyedRedisMutex.new(c, fresh_name())
    assert.equal("bad argument #1 to 'steal' (priority must be a number, got string)",
      h.error_of(function() m:steal("x") end))
    assert.equal("bad argument #1 to 'steal' (async_mutex.RedisMutex expected, got table)",
      h.error_of(function() m.steal({}) end))
    assert.equal("bad argument #1 to 'steal' (weight must be a positive integer)",
      h.error_of(function() s:steal(0) end))
    assert.equal("bad argument #1 to 'steal' (weight must not exceed the semaphore's limit)",
      h.error_of(function() s:steal(4) end))
    assert.equal("bad argument #2 to 'steal' (priority must be a number, got table)",
      h.error_of(function() s:steal(1, {}) end))
    assert.equal("bad argument #1 to 'steal' (key must be a string or a finite number, got nil)",
      h.error_of(function() km:steal(nil) end))
    assert.equal("attempt to steal through tryAcquire (a steal takes the lock whoever holds it)",
      h.error_of(function() am.tryAcquire(m):steal() end))
    h.raises_at_caller({ function() am.tryAcquire(m):steal() end,
      "attempt to steal through tryAcquire (a steal takes the lock whoever holds it)" })
    h.raises_at_caller({ function() m:steal("x") end,
      "bad argument #1 to 'steal' (priority must be a number, got string)" })
    local rm = am.RedisReentrantMutex.new(c, fresh_name())
    local lv = rm:acquire()
    assert.equal("attempt to steal a reentrant mutex that this coroutine holds"
      .. " (it would hold it twice)", h.error_of(function() rm:steal() end))
    assert.is_true(lv())
    local rl = am.RedlockMutex.new({ c }, fresh_name())
    assert.equal("attempt to steal a Redlock mutex (its hold is on several independent"
      .. " servers: no one atomic step can end it everywhere)",
      h.error_of(function() rl:steal() end))
    assert.is_false(m:isLocked())
    c:close()
    assert.equal("attempt to use a closed redis client", h.error_of(function() m:steal() end))
  end))

  it("needs a coroutine", function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    assert.equal("attempt to steal a Redis lock outside a coroutine",
      h.error_of(function() m:steal() end))
    c:close()
    uv.run("nowait")
  end)
end)

describe("RedisSemaphore:steal", function()
  it("ends every hold, takes its weight, returns the limit, and serves the head that fits",
    h.async(function()
      local s1, s2, c1, c2, name = R.two_locks(server, fresh_name, am.RedisSemaphore, 3)
      local _, a = s1:acquire(2)
      local _, b = s1:acquire(1)
      local got
      local waiter = am.spawn(function()
        local _, r = s2:acquire(1)
        got = r
        return r
      end)
      h.wait_until(function() return R.queued(c1, name) == 1 end, 5000)
      local value, release = s2:steal(2)
      assert.equal(3, value)
      assert.is_false(a()); assert.is_false(b())
      -- the queued weight 1 fits beside the steal's 2: granted by the steal
      local r = waiter:join()
      assert.is_true(r.fence > release.fence)
      assert.equal(0, s1:getValue())
      assert.is_true(release()); assert.is_true(got())
      assert.equal(3, s1:getValue())
      c1:close(); c2:close()
    end))
end)

describe("KeyedRedisMutex:steal", function()
  it("steals one key and leaves the others", with.two_keyed_locks(am.KeyedRedisMutex, function(k1, k2)
    local a, b = k1:acquire("a"), k1:acquire("b")
    local release = k2:steal("a")
    assert.is_true(release.fence > a.fence)
    assert.is_false(a())
    assert.is_true(k1:isLocked("b"))
    assert.is_true(b())
    assert.is_true(release())
  end))
end)

describe("RedisRWLock:steal and stealRead", function()
  it("a write steal ends every reader", h.async(function()
    local name = fresh_name()
    local c = server:client()
    local rw = am.RedisRWLock.new(c, name)
    local r1, r2 = rw:acquireRead(), rw:acquireRead()
    local w = rw:steal()
    assert.is_false(r1()); assert.is_false(r2())
    assert.is_true(rw:isWriteLocked())
    -- a write hold: rw:release() ends it, and it can be downgraded
    local rd = w:downgrade()
    assert.equal(1, rw:readers())
    assert.is_true(rd())
    c:close()
  end))

  it("a read steal ends the writer, and the readers at the head join it", with.two_locks(am.RedisRWLock, function(rw1, rw2, c1, _, name)
    local w = rw1:acquireWrite()
    local reader = am.spawn(function() return rw2:acquireRead() end)
    h.wait_until(function() return R.queued(c1, name) == 1 end, 5000)
    local r = rw1:stealRead()
    assert.is_false(w())
    local r2 = reader:join()
    assert.equal(2, rw1:readers())
    assert.is_true(r()); assert.is_true(r2())
  end))

  it("per key on a KeyedRedisRWLock", with.client(function(c)
    local krw = am.KeyedRedisRWLock.new(c, fresh_name() .. ":")
    local r = krw:acquireRead("k")
    local w = krw:steal("k")
    assert.is_false(r())
    assert.is_true(krw:isWriteLocked("k"))
    assert.is_true(krw:release("k"))
    local sr = krw:stealRead("k")
    assert.equal(1, krw:readers("k"))
    assert.is_true(sr())
    assert.is_false(w())
  end))
end)

describe("RedisReentrantMutex:steal", function()
  it("ends every level of another coroutine's hold; the stealer holds at depth 1",
    with.one_lock(am.RedisReentrantMutex, function(rm)
      local l1, l2
      local go = am.Semaphore.new(0)
      local holder = am.spawn(function()
        l1 = rm:acquire(); l2 = rm:acquire()
        go:acquire()
        return rm:depth(), pcall(l2.check, l2)
      end)
      h.wait_until(function() return l2 ~= nil end, 5000)
      local top = rm:steal()
      assert.equal(1, rm:depth())
      assert.is_true(rm:isHeldByMe())
      go:release()
      local depth, ok, err = holder:join()
      assert.equal(1, depth)              -- (the stealer's, seen from the holder)
      assert.is_false(ok); assert.equal(am.E_LOST, err)
      assert.is_false(l1()); assert.is_false(l2())
      assert.is_true(top())
      assert.equal(0, rm:depth())
    end))
end)

describe("steal with replicas", function()
  it("is confirmed by WAIT as a grant: not confirmed, it is given back", h.async(function()
    local name = fresh_name()
    local c = server:client({ commandTimeout = 400 })
    local m = am.RedisMutex.new(c, name, { replicas = 1 })
    local err = h.error_of(function() m:steal() end)
    assert.equal(am.E_UNAVAILABLE, err)
    assert.matches("^grant not confirmed: 0 of 1 replicas within %d+ ms$", err.reason)
    h.wait_until(function() return #holders(c, name) == 0 end, 2000, "given back")
    c:close()
  end))

  it("with a replica that confirms, holds", h.async(function()
    local name = fresh_name()
    local replica = R.server()
    local ok, err = pcall(function()
      -- (its first sync at once: Redis 7 waits 5 s for more replicas)
      server:cli("CONFIG SET repl-diskless-sync-delay 0")
      replica:cli(("REPLICAOF 127.0.0.1 %d"):format(server.port))
      local c = server:client()
      h.wait_until(function() return c:call("WAIT", "1", "50") >= 1 end, 15000,
        "the replica in sync")
      local m = am.RedisMutex.new(c, name, { replicas = 1 })
      local held = m:acquire()
      local release = m:steal()
      assert.is_false(held())
      assert.is_true(release())
      c:close()
    end)
    replica:stop()
    assert(ok, err)
  end, { deadline = 30000 }))
end)

describe("steal on a cluster client", function()
  local cluster = require("redis_cluster_server").for_file(setup, teardown, 3)

  it("takes the lock in its slot and tells a holder of another client by its shard channel",
    h.async(function()
      local a, b = cluster:connect(), cluster:connect()
      local _ <close> = h.closing(a, b)
      local name = fresh_name()
      local told = {}
      local ma = am.RedisMutex.new(a, name, { onLost = function(i) told[#told + 1] = i.reason end })
      local mb = am.RedisMutex.new(b, name)
      local first = mb:acquire()
      -- a queues (and listens on its shard channel), then is handed the lock
      local holder = am.spawn(function() return ma:acquire() end)
      h.wait_until(function() return #am.query(mb).pending == 1 end, 5000)
      assert.is_true(first())
      local held = holder:join()
      local release = mb:steal()
      assert.is_true(release.fence > held.fence)
      -- told by the steal's SPUBLISH ("stolen"; a renewal would say "refused")
      h.wait_until(function() return told[1] ~= nil end, 3000, "the holder told")
      assert.same({ "stolen" }, told)
      assert.is_false(held())
      local q = am.query(ma)
      assert.equal(1, #q.held)
      assert.equal(release.token, q.held[1].owner)
      assert.is_false(q.held[1].mine)
      assert.is_true(release())
      assert.same({ held = {}, pending = {} }, am.query(ma))
    end, { deadline = 15000 }))
end)
