-- redis.versioned at the bounds of its versions, against a real
-- redis-server (docs/optimistic.md, Versioned values on Redis).  A version
-- is any integer up to 2^63 - 1 (what set takes); the server's scripts run
-- in Lua 5.1, whose numbers are doubles, exact up to 2^53 only.  They
-- compared and added versions as doubles: from 9007199254740992 (2^53) on
-- a write left the version as it was, and a second writer holding the same
-- stale version was accepted (a lost update).  Now they keep a version a
-- decimal string: exact up to 2^63 - 1, which is read but has no
-- successor (a write there is refused with an error); a version field
-- above it is not a versioned value.
-- Also: update whose fn closes the client raises at update's caller.

local THIS = "spec/145%-versioned%-bounds_spec.lua"

local h, redis, server = require("redis_server").spec_file(setup, teardown)

local function client()
  return redis.connect({ path = server.path })
end

local with = require("redis_server").cases(client)

local fresh_key = require("lock_redis").namer("versioned-bounds")

-- A key whose version field reads 'version' (as if that many writes had
-- been made), with value "v".
local function at_version(c, version)
  local key = fresh_key()
  c:call("HSET", key, "value", "v", "version", ("%d"):format(version))
  return redis.versioned(c, key), key
end

local TWO_53 = 9007199254740992             -- 2^53, an integer
local MAX = math.maxinteger                 -- 2^63 - 1

describe("versions past 2^53", function()
  it("each write adds exactly 1, and a stale version is refused at every step", with.client(function(c)
    local v, key = at_version(c, TWO_53 - 2)
    local version = TWO_53 - 2
    for _ = 1, 5 do                           -- 2^53 - 1 ... 2^53 + 3
      local new = v:set("x" .. version, version)
      assert.equal(version + 1, new)
      assert.equal("integer", math.type(new))
      assert.is_false(v:set("stale", version))   -- the lost update before
      local value, read = v:get()
      assert.equal("x" .. version, value)
      assert.equal(version + 1, read)
      version = new
    end
    assert.equal(("%d"):format(TWO_53 + 3), c:call("HGET", key, "version"))
  end))

  it("two writers that read 2^53: one wins, the other is refused", with.client(function(c)
    local v = at_version(c, TWO_53)
    local _, read = v:get()
    assert.equal(TWO_53, read)
    assert.equal(TWO_53 + 1, v:set("first", read))
    assert.is_false(v:set("second", read))
    assert.same({ "first", TWO_53 + 1 }, { v:get() })
  end))

  it("delete past 2^53 leaves a tombstone one version on, refusing the version before", with.client(function(c)
    local v = at_version(c, TWO_53 + 1)
    assert.equal(TWO_53 + 2, v:delete(TWO_53 + 1))
    assert.is_false(v:set("late", TWO_53 + 1))
    assert.same({ nil, TWO_53 + 2 }, { v:get() })
    assert.equal(TWO_53 + 2, v:delete(TWO_53 + 2))   -- nothing to delete: as is
    assert.equal(TWO_53 + 3, v:set("again", TWO_53 + 2))
  end))

  it("update counts exactly past 2^53, coroutines racing on one connection", with.client(function(c)
    local v = at_version(c, TWO_53 - 10)
    c:call("HSET", v.key, "value", "0")
    local n, done = 20, 0
    for _ = 1, n do
      h.spawn(function()
        v:update(function(value) return tonumber(value) + 1 end, { maxAttempts = math.huge })
        done = done + 1
      end)
    end
    h.wait_until(function() return done == n end)
    assert.same({ tostring(n), TWO_53 - 10 + n }, { v:get() })
  end))

  it("carries across every digit (10^18 - 1 to 10^18)", with.client(function(c)
    local v, key = at_version(c, 999999999999999999)
    assert.equal(1000000000000000000, v:set("w", 999999999999999999))
    assert.equal("1000000000000000000", c:call("HGET", key, "version"))
  end))
end)

describe("the last version, 2^63 - 1", function()
  it("is reached and read exactly; a write or deletion there is refused with an error, changing nothing", with.client(function(c)
    local v, key = at_version(c, MAX - 1)
    assert.equal(MAX, v:set("last", MAX - 1))
    assert.same({ "last", MAX }, { v:get() })
    for _, op in ipairs({ function() v:set("x", MAX) end, function() v:delete(MAX) end,
                          function() v:update(function() return "x" end) end }) do
      local ok, err = pcall(op)
      assert.is_false(ok)
      assert.equal("ERR", err.code)
      assert.equal("ERR versioned value at its last version (2^63 - 1): no write can follow it", err.message)
    end
    assert.same({ "last", ("%d"):format(MAX) }, { c:call("HGET", key, "value"), c:call("HGET", key, "version") })
    assert.is_false(v:set("stale", MAX - 1))  -- a stale version is still a conflict
  end))

  it("a version field above it is not a versioned value (WRONGTYPE), for every method", with.client(function(c)
    for _, field in ipairs({ "9223372036854775808", "99999999999999999999", "18446744073709551616" }) do
      local key = fresh_key()
      c:call("HSET", key, "value", "v", "version", field)
      local v = redis.versioned(c, key)
      for _, op in ipairs({ function() v:get() end, function() v:set("x", MAX) end,
                            function() v:delete(MAX) end }) do
        local ok, err = pcall(op)
        assert.is_false(ok)
        assert.equal("WRONGTYPE", err.code)
      end
      assert.equal(field, c:call("HGET", key, "version"))
    end
  end))

  it("other forms of a version below 2^53 read as before ('007', '5.0', '1e3')", with.client(function(c)
    for _, case in ipairs({ { "007", 7 }, { "5.0", 5 }, { "1e3", 1000 }, { "0", 0 } }) do
      local key = fresh_key()
      c:call("HSET", key, "value", "v", "version", case[1])
      local v = redis.versioned(c, key)
      assert.same({ "v", case[2] }, { v:get() })
      assert.equal(case[2] + 1, v:set("w", case[2]))
      assert.equal(tostring(case[2] + 1), c:call("HGET", key, "version"))
    end
  end))
end)

describe("versioned:update whose fn closes the client", function()
  it("raises 'attempt to use a closed redis client' at update's caller, writing nothing", h.async(function()
    local c = client()
    local key = fresh_key()
    local v = redis.versioned(c, key)
    local calls = 0
    local ok, err = pcall(function()
      v:update(function() calls = calls + 1; c:close(); return "x" end)
    end); local at = debug.getinfo(1, "l").currentline - 1
    assert.is_false(ok)
    assert.matches("^" .. THIS .. ":" .. at .. ": ", err)
    assert.equal("attempt to use a closed redis client", h.strip_pos(err))
    assert.equal(1, calls)
    local c2 = client()
    assert.equal(0, c2:call("EXISTS", key))
    c2:close()
  end))

  it("the same when the client is closed while update sleeps between attempts", h.async(function()
    local c = client()
    local v = redis.versioned(c, fresh_key())
    local calls = 0
    local ok, err = pcall(function()
      v:update(function(_, version)
        calls = calls + 1
        v:set("other", version)               -- a conflict: update sleeps, then tries again
        return "x"
      end, { sleep = function(ms) c:close(); h.sleep(ms) end })
    end); local at = debug.getinfo(1, "l").currentline - 5
    assert.is_false(ok)
    assert.matches("^" .. THIS .. ":" .. at .. ": ", err)
    assert.equal("attempt to use a closed redis client", h.strip_pos(err))
    assert.equal(1, calls)
  end))
end)
