-- Numbers at their bounds in the Redis locks (docs/redis-locks.md, "In
-- Redis": every number in the scripts is an integer below 2^53, written
-- with %d).  A ttl or waiterTimeout beyond what the server's doubles and a
-- C long hold made a lease end in the past (two holders) or a waiter's
-- record unreadable (a waiter lost); both are refused with a clear error.
-- A semaphore's weights and room up to 2^53 are written digit for digit in
-- the records the scripts read back (Lua 5.1's tostring would give 1e+15).

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec77")

local MAX_MS = 1 << 40         -- the largest ttl / waiterTimeout
local MAX_LIMIT = 1 << 53      -- the largest semaphore limit

describe("Redis lock options at their bounds", function()
  it("refuses a ttl, waiterTimeout or limit beyond them, naming the argument", with.client(function(c)
    for _, field in ipairs { "ttl", "waiterTimeout" } do
      for _, v in ipairs { MAX_MS + 1, math.maxinteger } do
        local ok, err = pcall(am.RedisMutex.new, c, fresh_name(), { [field] = v })
        assert.is_false(ok)
        assert.equal(("bad argument #3 to 'new' (options.%s must be an integer <= %d)")
          :format(field, MAX_MS), err)
      end
    end
    local ok, err = pcall(am.RedisSemaphore.new, c, fresh_name(), MAX_LIMIT + 1)
    assert.is_false(ok)
    assert.equal(("bad argument #3 to 'new' (limit must be at most %d)"):format(MAX_LIMIT), err)
    ok, err = pcall(am.KeyedRedisMutex.new, c, fresh_name(), { ttl = math.maxinteger })
    assert.is_false(ok)
    assert.matches("options.ttl must be an integer <= " .. MAX_MS, err, 1, true)
  end))

  it("holds and hands off with ttl = waiterTimeout = the bound, never two holders",
    with.one_client(function(c, name)
      local opts = { ttl = MAX_MS, waiterTimeout = MAX_MS }
      local a, b, t = am.RedisMutex.new(c, name, opts), am.RedisMutex.new(c, name, opts),
        am.RedisMutex.new(c, name, opts)
      local release = a:acquire()
      local now = tonumber(c:call("TIME")[1]) * 1000
      local ends = tonumber(c:call("HVALS", name .. ":h")[1]:match("^%d+"))
      assert.is_true(ends > now + MAX_MS - 60000)        -- the lease ends in 34 years
      assert.has_error(function() am.tryAcquire(t):acquire() end, am.E_ALREADY_LOCKED)
      local w = h.acquirer(nil, "b", b)                  -- queued by the short path
      h.wait_until(function() return R.queued(c, name) == 1 end)
      assert.equal("1 " .. MAX_MS .. " ", c:call("HGET", name .. ":c",
        c:call("ZRANGE", name .. ":q", 0, 0)[1]):match("^%d+ %d+ "))
      release()
      h.wait_until(function() return w.done end, 2000, "the waiter's grant")
      assert.is_true(w.ok)
      assert.has_error(function() am.tryAcquire(t):acquire() end, am.E_ALREADY_LOCKED)
      w.release()
    end))
end)

describe("a semaphore's large weights in the scripts' records", function()
  local function acquire(c, name, token, limit, weight, channel)
    return c:eval(scripts.acquire, scripts.keys(name),
      { token, tostring(limit), tostring(weight), "30000", "3000",
        channel or "spec77:nobody", "wait" })
  end

  it("are written digit for digit, read back and dispatched", with.one_client(function(c, name)
    local limit, big = MAX_LIMIT, 1 << 50
    local r = acquire(c, name, "holder", limit, limit)
    assert.equal(1, r[1])
    assert.equal(limit, math.tointeger(r[3]))
    assert.equal(0, acquire(c, name, "waiter", limit, big, "spec77:chan")[1])
    assert.equal(big .. " 3000 spec77:chan", c:call("HGET", name .. ":c", "waiter"))
    assert.equal(1, c:eval(scripts.release, scripts.keys(name),
      { "holder", tostring(limit) }))
    assert.matches("^%d+ " .. big .. " %d+ " .. limit .. "$", c:call("HGET", name .. ":h", "waiter"))
    -- and the waiter, asking again, learns it holds (value: the room it found)
    r = c:eval(scripts.acquire, scripts.keys(name),
      { "waiter", tostring(limit), tostring(big), "30000", "3000", "spec77:chan", "again" })
    assert.equal(1, r[1])
    assert.equal(limit, math.tointeger(r[3]))
  end))
end)
