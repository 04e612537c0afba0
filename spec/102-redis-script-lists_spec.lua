-- A script's keys and args as lists (docs/redis.md, Re-entry): their
-- length is read once, checked, and only then is the stack reserved for
-- them.  Before, client:eval read a list's length with `#` in Lua and
-- core.script again with luaL_len in C, and cast the sum to an int: a
-- __len that answered 1, then 2^31, made it push past the end of the
-- stack (the process crashed).  client:eval copies a list that has a
-- metatable into a plain one, so what it checked is what it sends.

local h = require "helpers"
local redis_server = require "redis_server"

local server = redis_server.for_file(setup, teardown)

-- A list whose length changes at each read: 1, then `then_len`.
local LYING = [[
local function lying(then_len)
  local reads = 0
  return setmetatable({ "k1" }, { __len = function()
    reads = reads + 1
    return reads == 1 and 1 or then_len
  end })
end
]]

-- Runs 'body' in a child (h.am_subprocess: am and uv loaded) after the
-- client's modules (redis, core), LYING, and `c`, a client of the server;
-- the child must end cleanly (no stderr, exit code 0).  Returns its stdout.
local function child(body)
  local res = h.am_subprocess(([[
local redis = require "async_mutex.redis"
local core = require "async_mutex.redis_core"
%s
local c = redis.connect({ port = %d })
]]):format(LYING, server.port) .. body, 30)
  return h.clean_exit(res)
end

describe("a list whose __len answers differently each time", function()
  it("is read once by client:eval: what it checked is what it sends", function()
    assert.equal("1 1\nk1\n", child([[
am.spawn(function()
  print(c:eval("return #KEYS .. ' ' .. #ARGV", lying(2 ^ 31), lying(2 ^ 31)))
  print(c:eval("return KEYS[1]", lying(2), {}))
  c:close()
end)
uv.run()
]]))
  end)

  it("is read once by core.script (the Redis locks' path), and refused out of range, "
    .. "with nothing sent", function()
      local out = child([[
local function of_len(n) return setmetatable({}, { __len = function() return n end }) end
am.spawn(function()
  print(pcall(core.script, c, "EVAL", "return 1", lying(2 ^ 31)))   -- read once: 1
  print(pcall(core.script, c, "EVAL", "return 1", of_len(2 ^ 31)))
  print(pcall(core.script, c, "EVAL", "return 1", {}, of_len(2 ^ 40)))
  print(pcall(core.script, c, "EVAL", "return 1", of_len(-1)))
  print(c:pending(), c:call("PING"))
  c:close()
end)
uv.run()
]])
      local fn = "'async_mutex.redis_core.script'"
      assert.equal("true\t1\n"
        .. "false\tbad argument #4 to " .. fn .. " (too many keys)\n"
        .. "false\tbad argument #5 to " .. fn .. " (too many args)\n"
        .. "false\tbad argument #4 to " .. fn .. " (too many keys)\n"
        .. "0\tPONG\n", out)
    end)

  it("as many keys as the stack takes: a clear error, not a crash", function()
    assert.equal("false\tstack overflow (too many arguments)\n", child([[
local big = setmetatable({}, { __len = function() return 10000000 end })
am.spawn(function()
  print(pcall(core.script, c, "EVAL", "return 1", big))
  c:close()
end)
uv.run()
]]))
  end)
end)
