-- Usage errors of the Lua-written APIs (the Redis client, versioned values,
-- am.optimistic) are raised at the user's line, as spec 37 asserts for the
-- locks: "file:line: " of the line that called the module, whatever the
-- module calls in between (eval calls call, a versioned value's methods call
-- the client), with the exact message docs/api.md lists.  A misspelt option
-- is an error too, never a default silently kept.
local am = require "async_mutex"

local h, redis, server = require("redis_server").spec_file(setup, teardown)

local function f() end

local check = h.raises_at_caller

-- Misuse outside a coroutine (busted's main thread) and of a closed client.
local function misuse(c, closed)
  local v, w = redis.versioned(c, "spec28:v"), redis.versioned(closed, "spec28:w")
  local CLOSED = "attempt to use a closed redis client"
  return {
    { function() c:call("PING") end, "attempt to call redis outside a coroutine" },
    { function() c:eval("return 1") end, "attempt to call redis outside a coroutine" },
    { function() c:subscribe("ch", f) end, "attempt to subscribe outside a coroutine" },
    { function() v:get() end, "attempt to get a versioned value outside a coroutine" },
    { function() v:set("x", 0) end, "attempt to set a versioned value outside a coroutine" },
    { function() v:delete(0) end, "attempt to delete a versioned value outside a coroutine" },
    { function() v:update(tostring) end,
      "attempt to update a versioned value outside a coroutine" },
    { function() am.optimistic(f) end, "attempt to run an optimistic update outside a coroutine" },
    { function() closed:call("PING") end, CLOSED },
    { function() closed:eval("return 1") end, CLOSED },
    { function() closed:subscribe("ch", f) end, CLOSED },
    { function() w:get() end, CLOSED },
    { function() w:set("x", 0) end, CLOSED },
    { function() w:delete(0) end, CLOSED },
    { function() w:update(tostring) end, CLOSED },
  }
end

-- Bad arguments, in a coroutine.
local function bad_arguments(c)
  local v = redis.versioned(c, "spec28:v")
  local s = { unsubscribe = f }
  local OPT = "bad argument #1 to 'connect' "
  -- an unknown option is answered with the options connect takes
  local CONNECT_OPTIONS = "commandTimeout, connectTimeout, db, host, master, password, path, pingInterval, port, reconnectDelay, reconnectDelayMax, sentinelPassword, sentinelUsername, sentinels, username"
  return {
    { function() redis.connect(true) end, OPT .. "(table expected, got boolean)" },
    { function() redis.connect({ port = "6379" }) end,
      OPT .. "(port must be an integer from 1 to 65535)" },
    { function() redis.connect({ host = 1 }) end, OPT .. "(host must be a string, got number)" },
    { function() redis.connect({ commandTimeout = 0 / 0 }) end,
      OPT .. "(commandTimeout must be a positive number (math.huge: no timeout))" },
    { function() redis.connect({ commandTimeout = 0 }) end,
      OPT .. "(commandTimeout must be a positive number (math.huge: no timeout))" },
    { function() redis.connect({ connectTimeout = 0 }) end,
      OPT .. "(connectTimeout must be a positive number (math.huge: no timeout))" },
    { function() redis.connect({ reconnectDelay = -1 }) end,
      OPT .. "(reconnectDelay must be a non-negative finite number)" },
    { function() redis.connect({ reconnectDelayMax = math.huge }) end,
      OPT .. "(reconnectDelayMax must be a non-negative finite number)" },
    { function() redis.connect({ path = "/tmp/redis.sock", port = 6379 }) end,
      OPT .. "(path excludes host and port)" },
    { function() redis.connect({ db = 1.5 }) end, OPT .. "(db must be a non-negative integer)" },
    { function() redis.connect({ commandTimout = math.huge }) end,
      OPT .. "(unknown option 'commandTimout'; did you mean 'commandTimeout'? options: "
        .. CONNECT_OPTIONS .. ")" },
    { function() redis.connect({ [1] = "127.0.0.1" }) end,
      OPT .. "(unknown option '1'; options: " .. CONNECT_OPTIONS .. ")" },
    { function() c.call("PING") end,
      "bad argument #1 to 'call' (async_mutex.redis.Client expected, got string)" },
    { function() c:call("SET", {}, 1) end,
      "bad argument #2 to 'call' (string or number expected, got table)" },
    { function() c:call("SET", "k", 0 / 0) end, "bad argument #3 to 'call' (number must not be NaN)" },
    { function() c.eval("return 1") end,
      "bad argument #1 to 'eval' (async_mutex.redis.Client expected, got string)" },
    { function() c:eval(nil) end, "bad argument #1 to 'eval' (string expected, got nil)" },
    { function() c:eval("return 1", "k") end,
      "bad argument #2 to 'eval' (table of keys expected, got string)" },
    { function() c:eval("return 1", {}, { true }) end,
      "bad argument #3 to 'eval' (args[1] must be a string or number, got boolean)" },
    { function() c:eval("return 1", {}, { "a", 0 / 0 }) end,
      "bad argument #3 to 'eval' (args[2] must not be NaN)" },
    { function() c:eval("return 1", { 0 / 0 }, {}) end,
      "bad argument #2 to 'eval' (keys[1] must not be NaN)" },
    { function() c:subscribe(1, f) end, "bad argument #1 to 'subscribe' (string expected, got number)" },
    { function() c:subscribe("ch") end, "bad argument #2 to 'subscribe' (function expected, got nil)" },
    { function() c.pending() end,
      "bad argument #1 to 'pending' (async_mutex.redis.Client expected, got no value)" },
    { function() getmetatable(v).__index.get(s) end,
      "bad argument #1 to 'get' (async_mutex.redis.Versioned expected, got table)" },
    { function() v:set(nil, 0) end, "bad argument #1 to 'set' (string or finite number expected, got nil)" },
    { function() v:set("x", -1) end, "bad argument #2 to 'set' (version must be a non-negative integer)" },
    { function() v:delete("0") end, "bad argument #1 to 'delete' (version must be a non-negative integer)" },
    { function() v:update() end, "bad argument #1 to 'update' (function expected, got no value)" },
    { function() redis.versioned(c, 1) end, "bad argument #2 to 'versioned' (string expected, got number)" },
    { function() am.optimistic(f, { maxAttempt = 3 }) end,
      "bad argument #2 to 'optimistic' (unknown option 'maxAttempt'; did you mean 'maxAttempts'?"
        .. " options: baseDelay, conflictError, maxAttempts, maxDelay, random, sleep)" },
  }
end

describe("usage errors of the Redis client, versioned values and am.optimistic", function()
  it("are positioned at the user's line outside a coroutine, and on a closed client", function()
    local c = redis.connect({ path = server.path })
    local closed = redis.connect({ path = server.path })
    closed:close()
    for _, case in ipairs(misuse(c, closed)) do check(case) end
    c:close()
  end)

  it("are positioned at the user's line for every bad argument, sending nothing",
    h.async(function()
      local c = redis.connect({ path = server.path })
      local watcher = redis.connect({ path = server.path })
      local before = watcher:call("INFO", "stats"):match("total_commands_processed:(%d+)")
      for _, case in ipairs(bad_arguments(c)) do check(case) end
      local after = watcher:call("INFO", "stats"):match("total_commands_processed:(%d+)")
      -- only the watcher's first INFO was processed in between
      assert.equal(tonumber(before) + 1, tonumber(after))
      assert.equal(0, c:pending())
      c:close()
      watcher:close()
    end))

  it("leave the client usable: the next call goes through", h.async(function()
    local c = redis.connect({ path = server.path })
    local v = redis.versioned(c, "spec28:usable")
    assert.is_false(pcall(function() c:eval(nil) end))
    assert.is_false(pcall(function() v:set(nil, 0) end))
    assert.equal(1, c:eval("return 1"))
    assert.equal(1, v:set("x", 0))
    assert.same({ "x", 1 }, { v:get() })
    c:close()
  end))
end)
