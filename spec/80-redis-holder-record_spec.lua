-- A holder of a Redis lock is one record in the hash N:h, token -> "end
-- weight fence value" (docs/redis-locks.md, "In Redis").  What the merged
-- record must keep of the guarantees ("Guarantees"): a lease that ended is
-- no hold, even while its record is still there; a release or a renewal
-- after it touches nothing of the next holder; and a process of the older
-- layout (N:h a zset beside N:g) fails loudly instead of granting.  The
-- scripts are run directly, with tokens of our own, as in spec 70.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec80")

local release, server_ms = R.release_script, R.server_ms

-- acquire(c, name, token, ttl [, mode]): the acquire script, a mutex
local acquire = R.acquire_script

local renew = R.renew_script

-- The holders' tokens, sorted.
local holders = R.holder_tokens

describe("a holder's record whose lease ended", function()
  it("is no hold: the next acquire removes it and is granted", with.one_client(function(c, name)
    local r = acquire(c, name, "old", 20)
    assert.equal(1, r[1])
    -- kept past its lease, as another holder's longer lease keeps a
    -- semaphore's N:h (docs/redis-locks.md, "Keys that expire")
    c:call("PERSIST", name .. ":h")
    h.sleep(40)
    assert.same({ "old" }, holders(c, name))          -- still recorded
    local r2 = acquire(c, name, "new", 30000)
    assert.equal(1, r2[1])
    assert.is_true(math.tointeger(tonumber(r2[2])) > math.tointeger(tonumber(r[2])))
    assert.same({ "new" }, holders(c, name))
  end))

  it("gives a release that comes after it 0, and the next holder's record stays as it was",
    with.one_client(function(c, name)
      acquire(c, name, "old", 20)
      h.sleep(40)
      -- before any other script ran: the record is there, its lease is over
      assert.equal(0, release(c, name, "old"))
      assert.same({}, holders(c, name))
      acquire(c, name, "old2", 20)
      h.sleep(40)
      assert.equal(1, acquire(c, name, "new", 30000)[1])
      local record = c:call("HGET", name .. ":h", "new")
      assert.equal(0, release(c, name, "old2"))
      assert.equal(0, renew(c, name, "old2", 30000))
      assert.equal(record, c:call("HGET", name .. ":h", "new"))
      assert.same({ "new" }, holders(c, name))
      assert.equal(1, release(c, name, "new"))
    end))

  it("is no hold for a renewal either: 0, and nothing written", with.one_client(function(c, name)
    acquire(c, name, "old", 20)
    h.sleep(40)
    assert.equal(0, renew(c, name, "old", 30000))
    assert.same({}, holders(c, name))
    assert.equal(0, c:call("EXISTS", name .. ":h"))
  end))

  it("is a lost hold for RedisMutex: onLost, a false release, the next holder kept",
    with.two_clients(function(c, c2, name)
      local lost
      local m = am.RedisMutex.new(c, name,
        { ttl = 60, renewInterval = 0, onLost = function(info) lost = info.reason end })
      local releaser = m:acquire()
      h.wait_until(function() return lost ~= nil end, 2000, "onLost")
      assert.equal("expired", lost)
      local other = am.RedisMutex.new(c2, name)
      local r2 = other:acquire()
      local record = c:call("HGET", name .. ":h", holders(c, name)[1])
      assert.is_false(releaser())
      assert.equal(record, c:call("HGET", name .. ":h", holders(c, name)[1]))
      assert.is_true(r2:check())
      assert.is_true(r2())
    end))
end)

describe("the record", function()
  it("is 'end weight fence value', its end the lease's end in server ms", with.one_client(function(c, name)
    local r = acquire(c, name, "t", 30000)
    local e, w, f, v = c:call("HGET", name .. ":h", "t"):match("^(%d+) (%d+) (%d+) (%d+)$")
    assert.equal("1", w)
    assert.equal(r[2], f)
    assert.equal("1", v)
    local now = server_ms(c)
    assert.is_true(tonumber(e) > now + 29000 and tonumber(e) <= now + 30000)
  end))
end)

describe("a lock name shared with a process of the older layout", function()
  -- the older layout kept N:h as a zset of lease ends beside a hash N:g
  local function wrongtype(fn, ...)
    local ok, err = pcall(fn, ...)
    assert.is_false(ok)
    assert.equal("table", type(err))
    assert.matches("WRONGTYPE", err.message)
  end

  it("makes every script of this layout fail with WRONGTYPE, granting nothing", with.one_client(function(c, name)
    c:call("ZADD", name .. ":h", tostring(server_ms(c) + 30000), "older")
    c:call("HSET", name .. ":g", "older", "1 5 1")
    wrongtype(acquire, c, name, "t", 30000)
    wrongtype(acquire, c, name, "t", 30000, "try")
    wrongtype(release, c, name, "older")
    wrongtype(renew, c, name, "older", 30000)
    wrongtype(c.eval, c, scripts.state, scripts.keys(name), { "1" })
    assert.equal("zset", c:call("TYPE", name .. ":h"))
    assert.equal(1, c:call("ZCARD", name .. ":h"))
    assert.equal(0, c:call("EXISTS", name .. ":q"))
  end))

  it("makes the older layout's first read of a holder (ZSCORE, ZRANGE) fail", with.one_client(function(c, name)
    acquire(c, name, "t", 30000)
    wrongtype(c.call, c, "ZSCORE", name .. ":h", "t")
    wrongtype(c.call, c, "ZRANGE", name .. ":h", 0, -1, "WITHSCORES")
  end))
end)
