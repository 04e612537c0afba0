-- Three corners of the Redis client and locks found by a user's review:
-- an error object escaping a coroutine the client resumed is reported by
-- its __tostring (docs/redis.md; as the core does, spec 26), not as
-- "(error object is a table value)"; a keyed set's lock name prefix .. key
-- is refused empty as RedisMutex's name is (docs/redis-locks.md, "Usage
-- errors"); redis.connect() with no options means the defaults (docs/api.md,
-- redis.connect).
local R = require "lock_redis"
local redis = require "async_mutex.redis"
local rcore = require "async_mutex.redis_core"

local am, h, server, _, with = R.spec_file(setup, teardown)

describe("an error object escaping a coroutine the Redis client resumed", function()
  -- (coroutines of the script's own: a task's error is its task's to
  -- report, spec 26; these the client's resume reports)
  local function child(body)
    return h.am_subprocess(([[
      local redis = require "async_mutex.redis"
      local c = redis.connect({ path = %q })
      %s
      uv.run()
      c:close()
      uv.run()
      print("went on")
    ]]):format(server.path, body))
  end

  it("is reported by its __tostring: a Redis error reply's message", function()
    local r = child([[
      coroutine.wrap(function()
        c:call("DEL", "spec58:k")
        c:call("SET", "spec58:k", "x")
        c:call("LPUSH", "spec58:k", "y")
      end)()
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("went on\n", r.stdout)
    assert.matches("async_mutex.redis: error in a resumed coroutine: WRONGTYPE Operation against a key"
      .. " holding the wrong kind of value\nstack traceback:\n", r.stderr, 1, true)
    assert.not_matches("error object is a", r.stderr)
  end)

  it("is reported by its __tostring, a number as a number, else by its type", function()
    local r = child([[
      local function object(tostr)
        return setmetatable({}, { __tostring = tostr })
      end
      coroutine.wrap(function() c:call("PING"); error(object(function() return "mine" end), 0) end)()
      coroutine.wrap(function() c:call("PING"); error({}, 0) end)()
      coroutine.wrap(function() c:call("PING"); error(object(function() error("no text") end), 0) end)()
      coroutine.wrap(function() c:call("PING"); error(object(function() return 1 end), 0) end)()
      coroutine.wrap(function() c:call("PING"); error(42, 0) end)()
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("went on\n", r.stdout)
    assert.matches("async_mutex.redis: error in a resumed coroutine: mine\nstack traceback:\n",
      r.stderr, 1, true)
    -- a number as lua5.4 prints it (as the core, spec 56)
    assert.matches("async_mutex.redis: error in a resumed coroutine: 42\nstack traceback:\n",
      r.stderr, 1, true)
    local _, tables = r.stderr:gsub(
      "async_mutex%.redis: error in a resumed coroutine: %(error object is a table value%)\n", "")
    assert.equal(3, tables, r.stderr)
  end)

  it("is reported, never raised inside the loop, when the client's Lua resumed it and its __tostring raises",
     function()
    -- the coroutine waits for its subscription's confirmation, which the
    -- client's Lua side resumes (redis.lua, resume_reporting): there a
    -- tostring(err) raised inside a luv callback and ended the process
    local r = child([[
      local bad = setmetatable({}, { __tostring = function() error("no text") end })
      coroutine.wrap(function()
        c:subscribe("spec58:ch", function() end)
        uv.new_timer():start(50, 0, function() c:close() end)
        error(bad, 0)
      end)()
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("went on\n", r.stdout)
    assert.matches("async_mutex.redis: error in a resumed coroutine: (error object is a table value)\n",
      r.stderr, 1, true)
    assert.not_matches("no text", r.stderr)
  end)
end)

describe("KeyedRedisMutex with an empty prefix", function()
  local EMPTY = "key must not be empty when the prefix is empty"
    .. " (a lock name must be a non-empty string)"

  it("refuses an empty key, as RedisMutex refuses an empty name, at the caller's line",
    with.client(function(c)
      local k = am.KeyedRedisMutex.new(c, "")
      h.raises_at_caller({ function() k:acquire("") end,
        "bad argument #1 to 'acquire' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() k:runExclusive("", function() end) end,
        "bad argument #1 to 'runExclusive' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() k:waitForUnlock("") end,
        "bad argument #1 to 'waitForUnlock' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() k:isLocked("") end,
        "bad argument #1 to 'isLocked' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() k:release("") end,
        "bad argument #1 to 'release' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() k:cancel("") end,
        "bad argument #1 to 'cancel' (" .. EMPTY .. ")" })
      h.raises_at_caller({ function() am.withTimeout(k, 10):acquire("") end,
        "bad argument #1 to 'acquire' (" .. EMPTY .. ")" })
      assert.equal("bad argument #2 to 'new' (lock name must be a non-empty string, got string)",
        h.error_of(function() am.RedisMutex.new(c, "") end))
      -- nothing was asked of Redis under the name ""
      assert.equal(0, c:call("EXISTS", ":n", ":h", ":q"))
    end))

  it("takes any non-empty key (the key is the whole name), and an empty key after a prefix",
    with.client(function(c)
      local k = am.KeyedRedisMutex.new(c, "")
      local r = k:acquire("spec58:whole")
      assert.is_true(k:isLocked("spec58:whole"))
      assert.is_true(r())
      local p = am.KeyedRedisMutex.new(c, "spec58:p")
      local rp = p:acquire("")
      assert.is_true(p:isLocked(""))
      assert.is_true(rp())
      local r0 = k:acquire(0)                -- a number is never empty
      assert.is_true(r0())
    end))
end)

describe("redis.connect with no options", function()
  it("means every default: 127.0.0.1, port 6379", function()
    for _, c in ipairs({ redis.connect(), redis.connect(nil) }) do
      local st = rcore.state(c)
      assert.equal("127.0.0.1", st.host)
      assert.equal(6379, st.port)
      assert.is_nil(st.path)
      c:close()
    end
  end)

  it("still refuses a value that is not a table", function()
    h.raises_at_caller({ function() redis.connect(true) end,
      "bad argument #1 to 'connect' (table expected, got boolean)" })
    h.raises_at_caller({ function() redis.connect("127.0.0.1") end,
      "bad argument #1 to 'connect' (table expected, got string)" })
  end)
end)
