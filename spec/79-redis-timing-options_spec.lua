-- The timing options of redis.connect at their limits (docs/redis.md,
-- docs/api.md "redis.connect options"): a value no timer can hold (a
-- finite number above 2^40 ms) is refused at the caller's line naming
-- connect and the option, and a fractional pingInterval is a valid one,
-- rounded up to whole ms, as the other timeouts are: the subscriber's
-- health check must neither raise inside subscribe nor stop working.

local h, redis, server = require("redis_server").spec_file(setup, teardown)

local check = h.raises_at_caller
local OPT = "bad argument #1 to 'connect' "

describe("redis.connect timing options", function()
  it("refuse a bad pingInterval at the caller's line", function()
    local POS = "(pingInterval must be a positive number (math.huge: no ping))"
    for _, v in ipairs({ 0, -1, 0 / 0, "15000", -math.huge }) do
      check({ function() redis.connect({ pingInterval = v }) end, OPT .. POS })
    end
  end)

  it("refuse finite values above 2^40 ms, which no timer can hold", function()
    for _, name in ipairs({ "pingInterval", "commandTimeout", "connectTimeout" }) do
      for _, v in ipairs({ 2 ^ 40 + 1, 1e300 }) do
        check({ function() redis.connect({ [name] = v }) end,
          OPT .. "(" .. name .. " must be at most 2^40 (math.huge: "
            .. (name == "pingInterval" and "no ping" or "no timeout") .. "))" })
      end
    end
    for _, name in ipairs({ "reconnectDelay", "reconnectDelayMax" }) do
      check({ function() redis.connect({ [name] = 1e300 }) end,
        OPT .. "(" .. name .. " must be at most 2^40)" })
    end
  end)

  it("accept 2^40 ms as a limit that never fires in a test", h.async(function()
    local c = redis.connect({ path = server.path, pingInterval = 2 ^ 40,
      commandTimeout = 2 ^ 40, connectTimeout = 2 ^ 40 })
    local got
    local s = c:subscribe("spec79:big", function(m) got = m end)
    assert.equal(1, c:call("PUBLISH", "spec79:big", "m"))
    h.wait_until(function() return got == "m" end)
    s:unsubscribe()
    c:close()
  end))

  it("take a fractional pingInterval: subscribe works and PINGs go out", h.async(function()
    local c = redis.connect({ path = server.path, pingInterval = 1.5 })
    local watcher = redis.connect({ path = server.path })
    local got = {}
    local s = c:subscribe("spec79:frac", function(m) got[#got + 1] = m end)
    local function pings()
      return tonumber(watcher:call("INFO", "commandstats"):match("cmdstat_ping:calls=(%d+)") or 0)
    end
    local before = pings()
    h.wait_until(function() return pings() >= before + 3 end)
    assert.equal(1, c:call("PUBLISH", "spec79:frac", "after pings"))
    h.wait_until(function() return #got == 1 end)
    assert.same({ "after pings" }, got)
    s:unsubscribe()
    c:close()
    watcher:close()
  end))
end)

-- The health check's timer at exit (docs/redis.md, "Closing and exiting"):
-- a subscriber left unclosed is finalized at lua_close, after luv may have
-- finalized that timer; touching it then was a segfault.
describe("the subscriber's ping timer at lua_close", function()
  it("subscribed, unsubscribed, the client never closed: the script ends cleanly", function()
    local r = h.subprocess(([[
local uv = require "luv"
local redis = require "async_mutex.redis"
local c = redis.connect({ path = %q, pingInterval = 100 })
coroutine.wrap(function() c:subscribe("spec79:exit", function() end):unsubscribe() end)()
uv.run()
print("done")
]]):format(server.path), 30)
    h.clean_exit(r, "done\n")
  end)
end)
