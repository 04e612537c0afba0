-- redis.versioned and a version field written by another program that is
-- no number (docs/optimistic.md, Versioned values on Redis): the server's
-- scripts run Lua 5.1, whose tonumber stops at a NUL, so "5\0abc" read as
-- version 5 and the next write overwrote it with 6.  A field with a NUL is
-- not a versioned value: every operation refuses it with WRONGTYPE and
-- writes nothing.  Against a real redis-server.

local h, redis, server = require("redis_server").spec_file(setup, teardown)

local NOT_VERSIONED = "WRONGTYPE key holds a hash that is not a versioned value"

local function message(err)
  return type(err) == "table" and err.message or tostring(err)
end

describe("a version field with a NUL", function()
  for _, form in ipairs({ "5\0abc", "1\0", "7\0" }) do
    it(("%q is not a versioned value: get, set, delete and update refuse it, nothing written"):format(form), h.async(function()
      local c = redis.connect({ path = server.path })
      local key = "nul:" .. form:gsub("%z", "0")
      c:call("HSET", key, "value", "v", "version", form)
      local v = redis.versioned(c, key)
      local ok, err = pcall(v.get, v)
      assert.is_false(ok)
      assert.equal(NOT_VERSIONED, message(err))
      ok, err = pcall(v.set, v, "w", tonumber(form:match("^%d+")))
      assert.is_false(ok)
      assert.equal(NOT_VERSIONED, message(err))
      ok, err = pcall(v.delete, v, tonumber(form:match("^%d+")))
      assert.is_false(ok)
      assert.equal(NOT_VERSIONED, message(err))
      ok, err = pcall(v.update, v, function() return "w" end)
      assert.is_false(ok)
      assert.equal(NOT_VERSIONED, message(err))
      assert.equal(form, c:call("HGET", key, "version"))
      assert.equal("v", c:call("HGET", key, "value"))
      c:close()
    end))
  end
end)
