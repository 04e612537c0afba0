-- The options of a client that follows a master through Sentinel
-- (`sentinels`, `master`, `sentinelPassword`, `sentinelUsername`; README,
-- "Scaling out"): every bad one is refused by redis.connect at the
-- caller's line, with the exact message, before any name is looked up or
-- any connection is made.

local h = require "helpers"
local redis = require "async_mutex.redis"

local OPT = "bad argument #1 to 'connect' "
local S = { { host = "127.0.0.1", port = 26379 } }

describe("redis.connect's sentinel options", function()
  it("refuses each bad one at the caller's line, with the exact message", function()
    local cases = {
      { function() redis.connect({ master = "mymaster" }) end, OPT .. "(master needs sentinels)" },
      { function() redis.connect({ sentinels = S }) end, OPT .. "(sentinels needs master)" },
      { function() redis.connect({ sentinels = S, master = "m", host = "127.0.0.1" }) end,
        OPT .. "(sentinels excludes host, port and path)" },
      { function() redis.connect({ sentinels = S, master = "m", port = 6379 }) end,
        OPT .. "(sentinels excludes host, port and path)" },
      { function() redis.connect({ sentinels = S, master = "m", path = "/tmp/r.sock" }) end,
        OPT .. "(sentinels excludes host, port and path)" },
      { function() redis.connect({ sentinels = S, master = "" }) end,
        OPT .. "(master must be a non-empty string)" },
      { function() redis.connect({ sentinels = S, master = 1 }) end,
        OPT .. "(master must be a non-empty string)" },
      { function() redis.connect({ sentinels = {}, master = "m" }) end,
        OPT .. "(sentinels must be a non-empty list of {host =, port =})" },
      { function() redis.connect({ sentinels = "127.0.0.1:26379", master = "m" }) end,
        OPT .. "(sentinels must be a non-empty list of {host =, port =})" },
      { function() redis.connect({ sentinels = setmetatable({}, { __len = function() return 1 end }), master = "m" }) end,
        OPT .. "(sentinels must be a non-empty list of {host =, port =})" },
      { function() redis.connect({ sentinels = { S[1], "127.0.0.1" }, master = "m" }) end,
        OPT .. "(sentinels[2] must be a table {host =, port =}, got string)" },
      { function() redis.connect({ sentinels = { { hots = "x", port = 1 } }, master = "m" }) end,
        OPT .. "(sentinels[1]: unknown option 'hots'; did you mean 'host'? options: host, port)" },
      { function() redis.connect({ sentinels = { { port = 26379 } }, master = "m" }) end,
        OPT .. "(sentinels[1].host must be a string, got nil)" },
      { function() redis.connect({ sentinels = { { host = "h" } }, master = "m" }) end,
        OPT .. "(sentinels[1].port must be an integer from 1 to 65535)" },
      { function() redis.connect({ sentinels = { { host = "h", port = 0 } }, master = "m" }) end,
        OPT .. "(sentinels[1].port must be an integer from 1 to 65535)" },
      { function() redis.connect({ sentinels = { { host = "h", port = 65536 } }, master = "m" }) end,
        OPT .. "(sentinels[1].port must be an integer from 1 to 65535)" },
      { function() redis.connect({ sentinels = { { host = "h", port = "26379" } }, master = "m" }) end,
        OPT .. "(sentinels[1].port must be an integer from 1 to 65535)" },
      { function() redis.connect({ sentinels = { { host = "h", port = 1.5 } }, master = "m" }) end,
        OPT .. "(sentinels[1].port must be an integer from 1 to 65535)" },
      { function() redis.connect({ sentinels = S, master = "m", sentinelPassword = 1 }) end,
        OPT .. "(sentinelPassword must be a string, got number)" },
      { function() redis.connect({ sentinels = S, master = "m", sentinelUsername = "u" }) end,
        OPT .. "(sentinelUsername needs a sentinelPassword)" },
      { function() redis.connect({ sentinelPassword = "p" }) end,
        OPT .. "(sentinelPassword needs sentinels)" },
      { function() redis.connect({ sentinelUsername = "u" }) end,
        OPT .. "(sentinelUsername needs sentinels)" },
      { function() redis.connect({ sentinels = S, master = "m", commandTimeout = 0 }) end,
        OPT .. "(commandTimeout must be a positive number (math.huge: no timeout))" },
    }
    for _, case in ipairs(cases) do h.raises_at_caller(case) end
  end)

  it("takes a whole float as a port, and makes no connection before the first call", function()
    local c = redis.connect({ sentinels = { { host = "127.0.0.1", port = 26379.0 } }, master = "m" })
    assert.equal("async_mutex.redis.Client", getmetatable(c).__name)
    c:close()
    c = redis.connect({ port = 6379.0 })          -- (refused before, as 6379.0 // 1 is a float)
    c:close()
  end)

  it("raises E_UNAVAILABLE for a sentinel whose name does not resolve", function()
    local ok, err = pcall(redis.connect, { master = "m",
      sentinels = { { host = "nonexistent.invalid", port = 26379 } } })
    assert.is_false(ok)
    assert.is_true(err == redis.E_UNAVAILABLE)
    assert.matches("^name not resolved: nonexistent%.invalid %(.+%)$", err.reason)
  end)
end)
