-- am.query on the Redis locks (docs/redis-locks.md, "Query"): the holders
-- and the queue as the server has them, in the local query's shape.
-- Several clients stand for several processes (each has its own client
-- id and place in the Redis queue); the server is this file's own.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec226")

-- The client id of a token ("<client id>:<random>").
local function client_of(token) return token:match("^([^:]+):") end

describe("am.query(redisMutex)", function()
  it("lists the holder and the queue in order, with owners and fences", h.async(function()
    local name = fresh_name()
    local cs, ms = {}, {}
    for i = 1, 3 do
      cs[i] = server:client()
      ms[i] = am.RedisMutex.new(cs[i], name, { ttl = 5000 })
    end
    assert.same({ held = {}, pending = {} }, am.query(ms[1]))
    local held = ms[1]:acquire()
    local tasks = {}
    for i = 2, 3 do
      tasks[i] = am.spawn(function() local r = ms[i]:acquire(); am.sleep(10); return r() end)
      h.wait_until(function() return R.queued(cs[1], name) == i - 1 end, 5000)
    end
    local q = am.query(ms[1])
    assert.equal(1, #q.held)
    local e = q.held[1]
    assert.equal("exclusive", e.mode)
    assert.equal(held.token, e.owner)
    assert.equal(held.fence, e.fence)
    assert.is_true(e.mine)
    assert.equal(client_of(held.token), e.client)
    assert.is_true(e.ttl > 0 and e.ttl <= 5000)
    assert.is_nil(e.weight)
    assert.equal(2, #q.pending)
    for i = 1, 2 do
      assert.equal("exclusive", q.pending[i].mode)
      assert.is_false(q.pending[i].mine)
    end
    -- in their order: the client of the second lock first
    local q2 = am.query(ms[2])
    assert.is_true(q2.pending[1].mine)
    assert.is_false(q2.pending[2].mine)
    assert.equal(q.pending[1].owner, q2.pending[1].owner)
    -- after the release: the head holds, one waits
    assert.is_true(held())
    -- (the snapshot that saw it: the head's hold is 10 ms, which a second
    -- query under valgrind came after)
    local q3
    h.wait_until(function() q3 = am.query(ms[2]); return #q3.pending == 1 end, 5000)
    assert.equal(q.pending[1].owner, q3.held[1].owner)
    assert.is_true(q3.held[1].mine)
    assert.is_true(q3.held[1].fence > held.fence)
    assert.equal(q.pending[2].owner, q3.pending[1].owner)
    assert.is_true(tasks[2]:join()); assert.is_true(tasks[3]:join())
    assert.same({ held = {}, pending = {} }, am.query(ms[3]))
    for i = 1, 3 do cs[i]:close() end
  end))

  it("leaves out a hold whose lease ran out, and serves the queue as it reads",
    h.async(function()
      local name = fresh_name()
      local c1, c2 = server:client(), server:client()
      -- no watchdog: the lease ends in Redis 200 ms after the grant
      local m1 = am.RedisMutex.new(c1, name, { ttl = 200, renewInterval = 0 })
      local m2 = am.RedisMutex.new(c2, name)
      local old = m1:acquire()
      local waiter = am.spawn(function() return m2:acquire() end)
      h.wait_until(function() return R.queued(c1, name) == 1 end, 5000)
      local before = am.query(m1)
      assert.equal(1, #before.held); assert.equal(1, #before.pending)
      h.sleep(250)
      local q = am.query(m1)
      -- the old lease is gone, and the query's expiry handed the lock on
      assert.equal(1, #q.held)
      assert.equal(before.pending[1].owner, q.held[1].owner)
      assert.same({}, q.pending)
      local r = waiter:join()
      assert.is_false(old())
      assert.is_true(r())
      c1:close(); c2:close()
    end))

  it("is reached through a decorated lock", with.one_lock(am.RedisMutex, function(m)
    local r = m:acquire()
    assert.equal(r.token, am.query(am.withTimeout(m, 10)).held[1].owner)
    assert.equal(r.token, am.query(am.tryAcquire(m)).held[1].owner)
    assert.is_true(r())
  end))

  it("refuses bad arguments and misuse with exact messages", h.async(function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    local km = am.KeyedRedisMutex.new(c, fresh_name())
    assert.equal("bad argument #2 to 'query' (no key expected: a RedisMutex has no keys)",
      h.error_of(function() am.query(m, "k") end))
    assert.equal("bad argument #2 to 'query' (key expected: a Redis lock set is queried"
      .. " one key at a time)", h.error_of(function() am.query(km) end))
    assert.equal("bad argument #1 to 'query' (key expected: a Redis lock set is queried"
      .. " one key at a time)", h.error_of(function() km:query() end))
    assert.equal("bad argument #1 to 'query' (key must be a string or a finite number,"
      .. " got table)", h.error_of(function() km:query({}) end))
    assert.equal("bad argument #1 to 'query' (async_mutex.KeyedRedisMutex expected, got table)",
      h.error_of(function() km.query({}, "k") end))
    h.raises_at_caller({ function() am.query(m, "k") end,
      "bad argument #2 to 'query' (no key expected: a RedisMutex has no keys)" })
    h.raises_at_caller({ function() km:query() end,
      "bad argument #1 to 'query' (key expected: a Redis lock set is queried one key at a time)" })
    local rl = am.RedlockMutex.new({ c }, fresh_name())
    assert.equal("attempt to query a Redlock mutex (its holds and queues are on several"
      .. " independent servers)", h.error_of(function() am.query(rl) end))
    -- the local locks' query is unchanged
    assert.equal("bad argument #1 to 'query' (async_mutex lock expected, got no value)",
      h.error_of(function() am.query() end))
    c:close()
    assert.equal("attempt to use a closed redis client", h.error_of(function() am.query(m) end))
  end))

  it("needs a coroutine", function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    assert.equal("attempt to query a Redis lock outside a coroutine",
      h.error_of(function() am.query(m) end))
    c:close()
    uv.run("nowait")
  end)
end)

describe("am.query(redisSemaphore)", function()
  it("gives each hold and waiter its weight", h.async(function()
    local s1, s2, c1, c2, name = R.two_locks(server, fresh_name, am.RedisSemaphore, 3)
    local _, a = s1:acquire(2)
    local _, b = s1:acquire(1)
    local waiter = am.spawn(function() local _, r = s2:acquire(3); return r end)
    h.wait_until(function() return R.queued(c1, name) == 1 end, 5000)
    local q = am.query(s2)
    assert.equal(2, #q.held)
    assert.same({ "weighted", 2, a.token }, { q.held[1].mode, q.held[1].weight, q.held[1].owner })
    assert.same({ "weighted", 1, b.token }, { q.held[2].mode, q.held[2].weight, q.held[2].owner })
    assert.equal(1, #q.pending)
    assert.same({ "weighted", 3, true }, { q.pending[1].mode, q.pending[1].weight,
                                           q.pending[1].mine })
    assert.is_true(a())
    assert.equal(1, #am.query(s1).held)
    assert.is_true(b())
    local r = waiter:join()
    assert.same({ 3 }, { am.query(s1).held[1].weight })
    assert.is_true(r())
    c1:close(); c2:close()
  end))
end)

describe("km:query(key) on a KeyedRedisMutex", function()
  it("answers per key", with.client(function(c)
    local km = am.KeyedRedisMutex.new(c, fresh_name() .. ":")
    local a = km:acquire("a")
    assert.equal(a.token, km:query("a").held[1].owner)
    assert.equal(a.token, am.query(km, "a").held[1].owner)
    assert.same({ held = {}, pending = {} }, km:query("b"))
    assert.same({ held = {}, pending = {} }, km:query(7))
    assert.is_true(a())
    assert.same({ held = {}, pending = {} }, km:query("a"))
  end))
end)

describe("am.query on the readers-writer and reentrant kinds", function()
  it("names reads shared and writes exclusive", with.two_locks(am.RedisRWLock, function(rw1, rw2, c1, _, name)
    local r1, r2 = rw1:acquireRead(), rw1:acquireRead()
    local writer = am.spawn(function() return rw2:acquireWrite() end)
    h.wait_until(function() return R.queued(c1, name) == 1 end, 5000)
    local q = am.query(rw1)
    assert.same({ "shared", "shared" }, { q.held[1].mode, q.held[2].mode })
    assert.same({ r1.token, r2.token }, { q.held[1].owner, q.held[2].owner })
    assert.equal("exclusive", q.pending[1].mode)
    assert.is_nil(q.held[1].weight)
    assert.is_true(r1()); assert.is_true(r2())
    local w = writer:join()
    assert.equal("exclusive", am.query(rw1).held[1].mode)
    assert.is_true(w())
    -- a KeyedRedisRWLock, per key
    local krw = am.KeyedRedisRWLock.new(c1, fresh_name() .. ":")
    local kr = krw:acquireRead("k")
    assert.equal("shared", krw:query("k").held[1].mode)
    assert.is_true(kr())
  end))

  it("gives a reentrant hold of this process its depth", with.one_lock(am.RedisReentrantMutex, function(rm)
    local l1, l2 = rm:acquire(), rm:acquire()
    local q = am.query(rm)
    assert.equal(1, #q.held)
    assert.same({ "exclusive", 2, true }, { q.held[1].mode, q.held[1].depth, q.held[1].mine })
    assert.is_true(l2()); assert.is_true(l1())
    assert.same({}, am.query(rm).held)
  end))
end)
