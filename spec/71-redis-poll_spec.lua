-- async_mutex.redis's poll handle: made by luv (uv.new_poll), started and
-- stopped through luv's Lua API, its callback a C function of the client
-- (docs/redis.md, Connection).  luv owns the handle: uv.walk visits it and
-- luv's exit closes it.  On Linux it watches an epoll set holding the
-- socket, not the socket: a reset connection's poll error never reaches
-- luv, whose poll callback printed each on stderr up to luv 1.44.2-0
-- (Debian 12's); the read reports it, as a lost connection.  Cases that
-- could crash or print run in a child lua5.4 process.

local uv = require "luv"
local h = require "helpers"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

local server = redis_server.for_each_test(before_each, after_each)

local function child(body)
  local code = ([[
local uv = require "luv"
local redis = require "async_mutex.redis"
local PORT, PID = %d, %d
local c = redis.connect({ port = PORT, commandTimeout = math.huge })
local function go(fn) coroutine.wrap(fn)() end
local function sleep(ms)
  local co, t = coroutine.running(), uv.new_timer()
  t:start(ms, 0, function() t:close(); coroutine.resume(co) end)
  coroutine.yield()
end
%s
print("done")
]]):format(server.port, server.pid, body)
  return h.subprocess(code, 30)
end

-- A child's prelude: the client c, idle after a call, is collected by an
-- incremental cycle stepped by hand, and left there: its weak reference
-- cleared (the atomic step), its finalizer (which closes its handles) not
-- run yet.  The cycle's ballast keeps it from finishing.
local COLLECTED_UNFINALIZED = [[
collectgarbage("incremental")
go(function() assert(c:call("PING") == "PONG") end)
uv.run()
local weak = setmetatable({ c }, { __mode = "v" })
c = nil
collectgarbage("stop")                    -- steps by hand from here
local ballast = {}                        -- a cycle of many steps
for i = 1, 300000 do ballast[i] = { i } end
while weak[1] ~= nil do collectgarbage("step", 0) end
]]

describe("the poll handle of a connection", function()
  it("is a luv handle: uv.walk visits it while calls wait", h.async(function()
    local c = redis.connect({ port = server.port })
    assert.equal("PONG", c:call("PING"))
    local blocked = {}
    h.spawn(function()
      blocked.ok, blocked.err = pcall(c.call, c, "BLPOP", "spec71:none", 0)
    end)
    h.sleep(5)
    local polls = 0
    uv.walk(function(hd)
      if tostring(hd):match("^uv_poll") and hd:is_active() then polls = polls + 1 end
    end)
    assert.equal(1, polls)
    c:close()
    assert.is_false(blocked.ok)
    assert.equal(redis.E_UNAVAILABLE, blocked.err)
  end))

  it("keeps no loop running when no reply is due, so uv.run() returns", function()
    -- idle, the handle goes on watching (an end of file is seen when it
    -- comes) but is unref'd: uv.run() returns with it started; the next
    -- call refs it again, with no start or stop of its own
    local r = child([[
go(function() print(c:call("PING")) end)
uv.run()
local polls, referenced = 0, 0
uv.walk(function(hd)
  if tostring(hd):match("^uv_poll") and hd:is_active() then polls = polls + 1 end
  if hd:is_active() and hd:has_ref() then referenced = referenced + 1 end
end)
print(polls, referenced)
go(function() print(c:call("PING")) end)
uv.run()
print(uv.loop_alive())
]])
    h.clean_exit(r, "PONG\n1\t0\nPONG\nfalse\ndone\n")
  end)

  it("sees an idle connection's end when it comes, and closes its socket", function()
    -- the server closes the idle connection (CLIENT KILL from another
    -- client); the handle, watching while idle, reads the end of file at
    -- once: the socket is closed then, not at the next call, and the next
    -- call goes to a new connection
    local r = child([[
local other = redis.connect({ port = PORT })
local function sockets()
  local p = io.popen(("ls -l /proc/%d/fd"):format(uv.os_getpid()))
  local n = select(2, p:read("a"):gsub("socket:", ""))
  p:close()
  return n
end
go(function()
  local id = c:call("CLIENT", "ID")
  assert(other:call("PING") == "PONG")
  local before = sockets()
  assert(other:call("CLIENT", "KILL", "ID", id) == 1)
  sleep(50)                                 -- idle: the end of file comes
  print(before - sockets())
  print(c:call("PING"), c:call("CLIENT", "ID") ~= id)
  other:close()
end)
uv.run()
]])
    h.clean_exit(r, "1\nPONG\ttrue\ndone\n")
  end)

  it("stops watching an idle connection whose client is collected, its finalizer not yet run", function()
    -- the incremental collector clears the client's weak reference (which
    -- the handle's callback reaches it by) at its atomic step and runs the
    -- finalizer (which closes the handle) some steps later; meanwhile the
    -- server ends the idle connection: its end of file stays unread, and a
    -- handle still watching would wake the loop at every iteration until
    -- something allocates.  The loop's iterations are counted over 200 ms.
    local r = child(COLLECTED_UNFINALIZED .. [[
local open = 0
uv.walk(function(hd)
  if tostring(hd):match("^uv_poll") and not hd:is_closing() then open = open + 1 end
end)
local other = redis.connect({ port = PORT })
go(function()
  other:call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
  other:close()
end)
uv.run()
local iterations, check, t = 0, uv.new_check(), uv.new_timer()
check:start(function() iterations = iterations + 1 end)
check:unref()
t:start(200, 0, function() t:close(); check:close() end)
uv.run()
print(open, iterations < 50)
collectgarbage("restart")
collectgarbage()
uv.run()
ballast = nil
]])
    h.clean_exit(r, "1\ttrue\ndone\n")
  end)

  it("exits cleanly with a client collected whose finalizer has not run yet", function()
    -- the script ends while a collected client's finalizer is due (the
    -- cycle that collected it is not finished): lua_close runs it first,
    -- and it closes the client's handles then, when a guard made for
    -- those closes gets no finalizer; the spare guard completes them
    -- before luv finalizes the handles (before: a segfault in luv's exit)
    local r = child(COLLECTED_UNFINALIZED .. [[
collectgarbage("restart")
]])
    h.clean_exit(r, "done\n")
  end)

  it("reports a reset connection (a poll error) as E_UNAVAILABLE, printing nothing", function()
    -- 1,000 calls unanswered (the server stopped), then the server killed:
    -- the reset socket makes epoll report an error for the poll handle
    local r = child([[
local n, done, unavailable = 1000, 0, 0
go(function()
  assert(c:call("PING") == "PONG")
  os.execute("kill -STOP " .. PID)
  for _ = 1, n do
    go(function()
      local ok, err = pcall(c.call, c, "INCR", "counter")
      done = done + 1
      if not ok and err == redis.E_UNAVAILABLE then unavailable = unavailable + 1 end
    end)
  end
  sleep(10)
  os.execute("kill -KILL " .. PID)     -- stopped: its unread input makes a reset
end)
uv.run()
print(done, unavailable)
]])
    h.clean_exit(r, "1000\t1000\ndone\n")
  end)
end)
