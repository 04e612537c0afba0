-- RedisMutex: the Mutex API on a lock kept in Redis (docs/redis-locks.md).
-- Several clients stand for several processes: each client has its own
-- channel and its own place in the Redis queue.  Every test runs against
-- the real redis-server this file starts.

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec44")

local queued = R.queued

describe("RedisMutex.new", function()
  it("makes a lock that is free in Redis", with.one_lock(am.RedisMutex, function(m)
    assert.is_false(m:isLocked())
    assert.matches("^async_mutex.RedisMutex %(spec44:%d+%)$", tostring(m))
  end))

  it("refuses bad arguments with errors naming them", with.client(function(c)
    local new = am.RedisMutex.new
    assert.equal("bad argument #1 to 'new' (redis client expected, got nil)",
      h.error_of(function() new(nil, "x") end))
    assert.equal("bad argument #1 to 'new' (redis client expected, got table)",
      h.error_of(function() new({}, "x") end))
    assert.equal("bad argument #2 to 'new' (lock name must be a non-empty string, got number)",
      h.error_of(function() new(c, 42) end))
    assert.equal("bad argument #2 to 'new' (lock name must be a non-empty string, got string)",
      h.error_of(function() new(c, "") end))
    assert.equal("bad argument #3 to 'new' (options must be a table, got string)",
      h.error_of(function() new(c, "x", "fast") end))
    assert.equal("bad argument #3 to 'new' (options.ttl must be an integer >= 10)",
      h.error_of(function() new(c, "x", { ttl = 1.5 }) end))
    assert.equal("bad argument #3 to 'new' (options.ttl must be an integer >= 10)",
      h.error_of(function() new(c, "x", { ttl = 5 }) end))
    assert.equal("bad argument #3 to 'new' (options.waiterTimeout must be an integer >= 10)",
      h.error_of(function() new(c, "x", { waiterTimeout = "1" }) end))
    assert.equal("bad argument #3 to 'new' (options.renewInterval must be an integer >= 0)",
      h.error_of(function() new(c, "x", { renewInterval = -1 }) end))
    assert.equal("bad argument #3 to 'new' (options.renewInterval must be below options.ttl)",
      h.error_of(function() new(c, "x", { ttl = 100, renewInterval = 100 }) end))
    assert.equal("bad argument #3 to 'new' (options.onLost must be callable)",
      h.error_of(function() new(c, "x", { onLost = true }) end))
  end))

  it("reports argument errors at the caller's line", with.client(function(c)
    local ok, err = pcall(function() am.RedisMutex.new(c, 1) end)
    assert.is_false(ok)
    assert.matches("^[^:]*44%-redis%-mutex_spec%.lua:%d+: bad argument #2", err)
  end))
end)

describe("RedisMutex:acquire", function()
  it("returns a releaser with a fencing token, and holds the lock in Redis", with.one_client(function(c, name)
    local m = am.RedisMutex.new(c, name)
    local release = m:acquire()
    assert.equal("integer", math.type(release.fence))
    assert.is_true(m:isLocked())
    assert.equal(1, c:call("HLEN", name .. ":h"))
    assert.is_true(release:check())
    assert.is_true(release())
    assert.is_false(release())
    assert.is_false(release:check())
    assert.is_false(m:isLocked())
  end))

  it("gives every grant a fresh 128-bit token, unknown to other grants", with.one_client(function(c, name)
    local m = am.RedisMutex.new(c, name)
    local seen = {}
    for _ = 1, 20 do
      local release = m:acquire()
      local tokens = c:call("HKEYS", name .. ":h")
      assert.equal(1, #tokens)
      local random = tokens[1]:match(":(%x+)$")
      assert.equal(32, #random)
      assert.is_nil(seen[random])
      seen[random] = true
      release()
    end
  end))

  it("hands out fencing tokens that strictly increase", with.two_locks(am.RedisMutex, function(ma, mb)
    R.fences_increase(50, 0, function(i) return (i % 2 == 0 and ma or mb):acquire() end)
  end))

  it("refuses to wait outside a coroutine, and bad priorities", with.one_lock(am.RedisMutex, function(m)
    assert.equal("attempt to acquire a Redis lock" .. h.CANNOT_YIELD,
      h.cannot_yield_error(function() m:acquire() end))
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)",
      h.error_of(function() m:acquire("high") end))
    assert.equal("bad argument #1 to 'acquire' (priority must not be NaN)",
      h.error_of(function() m:acquire(0 / 0) end))
    assert.equal("bad argument #1 to 'acquire' (async_mutex.RedisMutex expected, got nil)",
      h.error_of(function() m.acquire() end))
  end))
end)

describe("RedisMutex hand-off between processes", function()
  it("passes the lock to a waiting process when the holder releases", with.two_locks(am.RedisMutex, function(ma, mb, a, _, name)
    local ra = ma:acquire()
    local got
    h.spawn(function()
      local rb = mb:acquire()
      got = rb.fence
      rb()
    end)
    h.wait_until(function() return queued(a, name) == 1 end)
    assert.is_nil(got)
    ra()
    h.wait_until(function() return got ~= nil end)
    assert.is_true(got > ra.fence)
    h.wait_until(function() return not ma:isLocked() end)
  end))

  it("grants waiting processes in the order they reached the Redis queue", h.async(function()
    local clients, locks = {}, {}
    local name = fresh_name()
    for i = 1, 5 do
      clients[i] = server:client()
      locks[i] = am.RedisMutex.new(clients[i], name)
    end
    local first = locks[1]:acquire()
    local order = {}
    for i = 5, 2, -1 do            -- queue 5, 4, 3, 2: not the clients' order
      h.spawn(function()
        local release = locks[i]:acquire()
        order[#order + 1] = i
        h.sleep(2)
        release()
      end)
      h.wait_until(function() return queued(clients[1], name) == 6 - i end)
    end
    first()
    h.wait_until(function() return #order == 4 end)
    assert.same({ 5, 4, 3, 2 }, order)
    for i = 1, 5 do clients[i]:close() end
  end))

  it("serves this process's coroutines by priority, one place in Redis between them", with.two_locks(am.RedisMutex, function(ma, mb, a, _, name)
    local rb = mb:acquire()
    local order = {}
    for _, p in ipairs({ 0, 5, 1 }) do
      h.spawn(function()
        local release = ma:acquire(p)
        order[#order + 1] = p
        release()
      end)
    end
    h.wait_until(function() return queued(a, name) == 1 end)
    h.tick(3)
    assert.equal(1, queued(a, name))    -- three waiters, one place
    rb()
    h.wait_until(function() return #order == 3 end)
    -- the first coroutine queued in Redis before the others came; the
    -- local queue then orders the rest by priority
    assert.same({ 0, 5, 1 }, order)
  end))

  it("wakes every waiter by its message, even one read before the reply that queued it", h.async(function()
    -- waiterTimeout of 10 minutes: no safety-net request within the
    -- test's deadline, so each of the 400 hand-offs must come by pub/sub
    local name = fresh_name()
    local clients, done = {}, 0
    for i = 1, 2 do
      clients[i] = server:client()
      local m = am.RedisMutex.new(clients[i], name, { waiterTimeout = 600000 })
      h.spawn(function()
        for _ = 1, 200 do
          local release = m:acquire()    -- no yield while held: the other
          release()                      -- process is granted at once
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 2 end, 20000)
    for i = 1, 2 do clients[i]:close() end
  end, { deadline = 30000 }))

  it("never lets two holders in: 4 clients x 2 coroutines x 100 sections", h.async(function()
    local name = fresh_name()
    local inside, max_inside, done, last_fence, ordered = 0, 0, 0, 0, true
    local clients = {}
    for i = 1, 4 do
      clients[i] = server:client()
      local m = am.RedisMutex.new(clients[i], name)
      for _ = 1, 2 do
        h.spawn(function()
          for _ = 1, 100 do
            local release <close> = m:acquire()
            inside = inside + 1
            max_inside = math.max(max_inside, inside)
            if release.fence <= last_fence then ordered = false end
            last_fence = release.fence
            h.tick(1)
            inside = inside - 1
            release()
            done = done + 1
          end
        end)
      end
    end
    h.wait_until(function() return done == 800 end, 20000)
    assert.equal(1, max_inside)
    assert.is_true(ordered)
    for i = 1, 4 do clients[i]:close() end
  end, { deadline = 30000 }))
end)

describe("RedisMutex:runExclusive", function()
  it("returns the function's results and releases", with.one_lock(am.RedisMutex, function(m)
    local a, b, cc = m:runExclusive(function()
      assert.is_true(m:isLocked())
      return 1, nil, "x"
    end)
    assert.same({ 1, nil, "x" }, { a, b, cc })
    assert.is_false(m:isLocked())
  end))

  it("releases when the function raises, and raises the same value", with.one_lock(am.RedisMutex, function(m)
    local e = {}
    local ok, err = pcall(m.runExclusive, m, function() error(e) end)
    assert.is_false(ok)
    assert.equal(e, err)
    assert.is_false(m:isLocked())
  end))

  it("refuses a non-callable function before acquiring", with.one_lock(am.RedisMutex, function(m)
    assert.equal("bad argument #1 to 'runExclusive' (function expected, got number)",
      h.error_of(function() m:runExclusive(1) end))
    assert.is_false(m:isLocked())
  end))
end)

describe("RedisMutex releasers", function()
  it("release at the end of a <close> scope", with.one_lock(am.RedisMutex, function(m)
    do
      local release <close> = m:acquire()
      assert.is_true(m:isLocked())
    end
    assert.is_false(m:isLocked())
  end))

  it("m:release() ends this process's hold, once", with.one_lock(am.RedisMutex, function(m)
    local release = m:acquire()
    assert.is_true(m:release())
    assert.is_false(m:release())
    assert.is_false(release())
    assert.is_false(m:isLocked())
  end))
end)
