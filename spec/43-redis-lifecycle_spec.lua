-- async_mutex.redis: a client ended in any order, then the script ends
-- (docs/redis.md, "Closing and exiting").  Each case runs in a child
-- lua5.4 process against a real redis-server, so that a crash at exit
-- (lua_close finalizing luv's handles and the client) fails the test with
-- the child's exit status instead of killing busted.

local h = require "helpers"
local redis_server = require "redis_server"

local server = redis_server.for_file(setup, teardown)

-- Runs `body` in a child after connecting `c` to the server; the child
-- prints "done" as its last line, then its script ends (lua_close).
local function child(body)
  local code = ([[
local uv = require "luv"
local redis = require "async_mutex.redis"
local PORT, PATH = %d, %q
local c = redis.connect({ port = PORT })
local function go(fn) coroutine.wrap(fn)() end
%s
print("done")
]]):format(server.port, server.path, body)
  return h.subprocess(code, 30)
end

local function clean_exit(r, out)
  h.clean_exit(r, (out or "") .. "done\n")
end

describe("redis client lifecycle at exit", function()
  it("close() from main code after uv.run, then the script ends", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
c:close()
]]), "PONG\n")
  end)

  it("close() called twice, from main code and again in a coroutine", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
c:close()
c:close()
go(function() c:close() end)
print(pcall(c.call, c, "PING"))
]]), "PONG\nfalse\tattempt to use a closed redis client\n")
  end)

  it("close() twice, then the loop runs: none of the client's handles left", function()
    clean_exit(child([[
local function count()
  local n = 0
  uv.walk(function(hd) if not hd:is_closing() then n = n + 1 end end)
  return n
end
local before = count()      -- the module's own (inactive) handles
go(function() print(c:call("PING")) end)
uv.run()
c:close(); c:close()
uv.run()
print(count() - before)
]]), "PONG\n0\n")
  end)

  it("the client never closed: collected at lua_close with its connection open", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
]]), "PONG\n")
  end)

  it("the client unreferenced and collected, then the script ends", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
c = nil
collectgarbage(); collectgarbage()
]]), "PONG\n")
  end)

  it("close() with calls in flight, from main code, the loop never run again", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
for i = 1, 3 do
  go(function()
    local ok, err = pcall(c.call, c, "SET", "k" .. i, "v")
    print(i, ok, err == redis.E_UNAVAILABLE)
  end)
end
c:close()
]]), "PONG\n1\tfalse\ttrue\n2\tfalse\ttrue\n3\tfalse\ttrue\n")
  end)

  it("calls in flight, never closed, the script ends", function()
    clean_exit(child([[
go(function() print(c:call("PING")) end)
uv.run()
go(function() c:call("SET", "k", "v") print("never") end)
]]), "PONG\n")
  end)

  it("close() inside a subscribe callback, then the script ends", function()
    clean_exit(child([[
local pub = redis.connect({ path = PATH })
go(function()
  c:subscribe("ch", function(msg)
    print("got", msg)
    c:close()
    c:close()
  end)
  pub:call("PUBLISH", "ch", "hello")
end)
uv.run()
pub:close()
]]), "got\thello\n")
  end)

  it("close() from main code with a subscription active, the loop never run again", function()
    clean_exit(child([[
go(function()
  c:subscribe("ch", function() end)
  print("subscribed")
end)
uv.run("once")
uv.run("once")
c:close()
]]), "subscribed\n")
  end)

  it("a subscription waiting for its confirmation when the script ends", function()
    clean_exit(child([[
go(function() c:subscribe("ch", function() end) print("never") end)
]]))
  end)

  it("close() inside a coroutine resumed by a reply, then the script ends", function()
    clean_exit(child([[
go(function() print(c:call("PING")); c:close() end)
uv.run()
]]), "PONG\n")
  end)
  -- { the test's name, the lock's name, what the script does last }
  for _, case in ipairs({
    { "a RedisMutex released from main code, then the script ends", "spec43:", "c:close()\n" },
    { "a RedisMutex released from main code, the client left open", "spec43b:", "" },
  }) do
    it(case[1], function()
      clean_exit(child([[
local am = require "async_mutex"
local m = am.RedisMutex.new(c, "]] .. case[2] .. [[" .. PORT)
local release
go(function() release = m:acquire() print("acquired") end)
while not release do uv.run("once") end
release()
]] .. case[3]), "acquired\n")
    end)
  end
  it("close() then os.exit(0, true) inside a coroutine the loop resumed", function()
    local r = child([[
go(function() print(c:call("PING")); c:close(); os.exit(0, true) end)
uv.run()
]])
    h.clean_exit(r, "PONG\n")
  end)
end)
