-- RedisSemaphore, KeyedRedisMutex, and what the local API's decorators and
-- calls mean on Redis locks: withTimeout, tryAcquire, cancel,
-- waitForUnlock, closed coroutines (docs/redis-locks.md, "The API").

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec47")

local queued = R.queued

describe("RedisSemaphore", function()
  it("admits `limit` holders across processes and queues the next", h.async(function()
    local sa, sb, a, b, name = R.two_locks(server, fresh_name, am.RedisSemaphore, 3)
    local v1, r1 = sa:acquire()
    local v2, r2 = sb:acquire()
    local v3, r3 = sa:acquire()
    assert.same({ 3, 2, 1 }, { v1, v2, v3 })
    assert.equal(0, sa:getValue())
    assert.is_true(sb:isLocked())
    local got
    h.spawn(function()
      local v, r = sb:acquire()
      got = v
      r()
    end)
    h.wait_until(function() return queued(a, name) == 1 end)
    assert.is_nil(got)
    assert.is_true(r2())
    h.wait_until(function() return got ~= nil end)
    assert.equal(1, got)
    r1(); r3()
    a:call("PING")
    h.wait_until(function() return sa:getValue() == 3 end)
    a:close(); b:close()
  end))

  it("takes weights, in FIFO order: a heavy head blocks lighter requests behind it", h.async(function()
    local sa, sb, a, b, name = R.two_locks(server, fresh_name, am.RedisSemaphore, 4)
    local _, r1 = sa:acquire(3)
    local order = {}
    h.spawn(function()
      local _, r = sb:acquire(4)
      order[#order + 1] = "heavy"
      r()
    end)
    h.wait_until(function() return queued(a, name) == 1 end)
    local c = server:client()
    local sc = am.RedisSemaphore.new(c, name, 4)
    h.spawn(function()
      local _, r = sc:acquire(1)
      order[#order + 1] = "light"
      r()
    end)
    h.wait_until(function() return queued(a, name) == 2 end)
    r1()
    h.wait_until(function() return #order == 2 end)
    assert.same({ "heavy", "light" }, order)
    a:close(); b:close(); c:close()
  end))

  it("runExclusive passes the value and releases", h.async(function()
    local s, c = R.one_lock(server, fresh_name, am.RedisSemaphore, 2)
    assert.equal("2", s:runExclusive(function(v) return tostring(v) end))
    assert.equal(2, s:getValue())
    c:close()
  end))

  it("refuses bad arguments", with.client(function(c)
    local new = am.RedisSemaphore.new
    assert.equal("bad argument #3 to 'new' (limit must be a positive integer)",
      h.error_of(function() new(c, "x") end))
    assert.equal("bad argument #3 to 'new' (limit must be a positive integer)",
      h.error_of(function() new(c, "x", 0) end))
    assert.equal("bad argument #3 to 'new' (limit must be a positive integer)",
      h.error_of(function() new(c, "x", 1.5) end))
    assert.equal("bad argument #4 to 'new' (options must be a table, got number)",
      h.error_of(function() new(c, "x", 2, 5) end))
    local s = new(c, "x", 2)
    assert.equal("bad argument #1 to 'acquire' (weight must be a positive integer)",
      h.error_of(function() s:acquire(0) end))
    assert.equal("bad argument #1 to 'acquire' (weight must be a positive integer)",
      h.error_of(function() s:acquire("1") end))
    assert.equal("bad argument #1 to 'acquire' (weight must not exceed the semaphore's limit)",
      h.error_of(function() s:acquire(3) end))
    assert.equal("bad argument #2 to 'acquire' (priority must be a number, got table)",
      h.error_of(function() s:acquire(1, {}) end))
    assert.equal("bad argument #1 to 'getValue' (async_mutex.RedisSemaphore expected, got table)",
      h.error_of(function() s.getValue({}) end))
  end))
end)

describe("KeyedRedisMutex", function()
  it("is one Redis lock per key", with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, a, _, prefix)
    local r1 = ka:acquire("x")
    local r2 = kb:acquire("y")             -- another key: free
    local r3 = kb:acquire(7)
    assert.is_true(ka:isLocked("x"))
    assert.is_true(ka:isLocked(7))
    assert.is_false(ka:isLocked("z"))
    assert.equal(1, a:call("HLEN", prefix .. "x:h"))
    local got = false
    h.spawn(function()
      local r = kb:acquire("x")
      got = true
      r()
    end)
    h.wait_until(function() return queued(a, prefix .. "x") == 1 end)
    assert.is_false(got)
    r1()
    h.wait_until(function() return got end)
    r2(); r3()
  end))

  it("runExclusive takes the key; cancel(key) rejects only that key's waiters", with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, a, b, prefix)
    assert.equal(42, ka:runExclusive("k", function() return 42 end))
    local rx, ry = ka:acquire("x"), ka:acquire("y")
    local outcome = {}
    for _, key in ipairs({ "x", "y" }) do
      h.spawn(function()
        local ok, r = pcall(kb.acquire, kb, key)
        outcome[key] = ok and "granted" or r
        if ok then r() end
      end)
    end
    h.wait_until(function() return queued(a, prefix .. "x") == 1 and queued(a, prefix .. "y") == 1 end)
    kb:cancel("x")
    h.wait_until(function() return outcome.x ~= nil end)
    assert.equal(am.E_CANCELED, outcome.x)
    b:call("PING")                         -- the withdrawal (in the background) is done
    assert.equal(0, queued(a, prefix .. "x"))
    ry()
    h.wait_until(function() return outcome.y ~= nil end)
    assert.equal("granted", outcome.y)
    rx()
  end))

  it("refuses bad keys and prefixes", with.client(function(c)
    assert.equal("bad argument #2 to 'new' (key prefix must be a string, got nil)",
      h.error_of(function() am.KeyedRedisMutex.new(c) end))
    local k = am.KeyedRedisMutex.new(c, "p:")
    assert.equal("bad argument #1 to 'acquire' (key must be a string or a finite number, got nil)",
      h.error_of(function() k:acquire(nil) end))
    assert.equal("bad argument #1 to 'acquire' (key must be a string or a finite number, got table)",
      h.error_of(function() k:acquire({}) end))
    assert.equal("bad argument #1 to 'isLocked' (key must be a string or a finite number, got number)",
      h.error_of(function() k:isLocked(0 / 0) end))
    assert.equal("bad argument #2 to 'runExclusive' (function expected, got nil)",
      h.error_of(function() k:runExclusive("a") end))
  end))
end)

describe("withTimeout on a Redis lock", function()
  it("raises E_TIMEOUT when not granted in time, and leaves the Redis queue", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local tb = am.withTimeout(am.RedisMutex.new(b, name), 50)
    assert.same({ false, am.E_TIMEOUT }, { pcall(tb.acquire, tb) })
    b:call("PING")                         -- the withdrawal has reached the server
    assert.equal(0, queued(a, name))
    assert.is_true(ra())
    a:call("PING")
    assert.is_false(tb:isLocked())         -- the timed-out request got nothing
  end))

  it("grants within the time, and raises a custom error when given one", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local e = {}
    local tb = am.withTimeout(am.RedisMutex.new(b, name), 2000, e)
    local got
    h.spawn(function() got = tb:acquire() end)
    h.wait_until(function() return queued(a, name) == 1 end)
    ra()
    h.wait_until(function() return got ~= nil end)
    got()
    local short = am.withTimeout(am.RedisMutex.new(b, name), 0, e)
    local rb = am.RedisMutex.new(a, name):acquire()
    assert.same({ false, e }, { pcall(short.runExclusive, short, function() end) })
    rb()
  end))

  it("refuses a bad timeout at the caller's line", with.one_lock(am.RedisMutex, function(m)
    assert.equal("bad argument #2 to 'withTimeout' (timeout must be a non-negative number)",
      h.error_of(function() am.withTimeout(m, -1) end))
    local ok, err = pcall(function() am.withTimeout(m, "x") end)
    assert.is_false(ok)
    assert.matches("^[^:]*47%-redis%-kinds_spec%.lua:%d+: bad argument #2 to 'withTimeout'", err)
  end))

  it("bounds the wait in the local queue too", with.one_lock(am.RedisMutex, function(m)
    local r = m:acquire()
    local t = am.withTimeout(m, 30)
    assert.same({ false, am.E_TIMEOUT }, { pcall(t.acquire, t) })   -- queued behind r locally
    r()
  end))
end)

describe("tryAcquire on a Redis lock", function()
  it("fails at once when another process holds it, and queues nothing", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local tb = am.tryAcquire(am.RedisMutex.new(b, name))
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(tb.acquire, tb) })
    assert.equal(0, queued(a, name))
    ra()
    a:call("PING")
    local rb = tb:acquire()
    assert.is_true(rb())
  end))

  it("works on semaphores and keyed sets", with.client(function(c)
    local s = am.tryAcquire(am.RedisSemaphore.new(c, fresh_name(), 1))
    local _, r = s:acquire()
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(s.acquire, s) })
    r()
    local k = am.tryAcquire(am.KeyedRedisMutex.new(c, fresh_name()), "busy")
    local rk = k:acquire("a")
    assert.same({ false, "busy" }, { pcall(k.acquire, k, "a") })
    rk()
  end))
end)

describe("cancel on a Redis lock", function()
  it("rejects this process's waiters, local and in Redis, and keeps the holder", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local mb = am.RedisMutex.new(b, name, { cancelError = "stop" })
    local outcomes = {}
    for i = 1, 3 do
      h.spawn(function()
        outcomes[i] = select(2, pcall(mb.acquire, mb))
      end)
    end
    h.wait_until(function() return queued(a, name) == 1 end)
    mb:cancel()
    h.wait_until(function() return #outcomes == 3 end)
    assert.same({ "stop", "stop", "stop" }, outcomes)
    b:call("PING")
    assert.equal(0, queued(a, name))
    assert.is_true(ra:check())
    ra()
  end))
end)

describe("waitForUnlock on a Redis lock", function()
  it("returns once the other process releases, taking nothing", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local mb = am.RedisMutex.new(b, name)
    local done = false
    h.spawn(function()
      mb:waitForUnlock()
      done = true
    end)
    h.sleep(20)
    assert.is_false(done)
    ra()
    h.wait_until(function() return done end)
    assert.is_false(mb:isLocked())
  end))

  it("returns at once on a free lock; through tryAcquire it fails on a held one", with.two_clients(function(a, b, name)
    local mb = am.RedisMutex.new(b, name)
    mb:waitForUnlock()
    local ra = am.RedisMutex.new(a, name):acquire()
    local t = am.tryAcquire(mb)
    assert.same({ false, am.E_ALREADY_LOCKED }, { pcall(t.waitForUnlock, t) })
    ra()
  end))
end)

describe("a coroutine closed while it waits in Redis", function()
  it("leaves the Redis queue", with.two_clients(function(a, b, name)
    local ra = am.RedisMutex.new(a, name):acquire()
    local mb = am.RedisMutex.new(b, name)
    local co = h.spawn(function() mb:acquire() end)
    h.wait_until(function() return queued(a, name) == 1 end)
    assert.is_true(coroutine.close(co))
    b:call("PING")
    assert.equal(0, queued(a, name))
    ra()
    local rb = mb:acquire()                -- the local gate was given back too
    rb()
  end))
end)
