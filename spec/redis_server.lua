-- A throw-away redis-server for the Redis specs: a real server, listening on
-- a free loopback port and on a unix socket in a temporary directory, with
-- no persistence.  Stopped by its PID (spec teardown), also when the spec
-- fails; faults are made with real signals (kill -9, SIGSTOP).
--
--   local server = require("redis_server").start()
--   server.port, server.path, server.pid
--   server:signal("STOP") / server:signal("CONT") / server:kill()
--   server:restart()    -- same port and socket, empty data
--   server:launch()     -- starts it again after kill()
--   server:stop()       -- kills it and removes its directory

local uv = require "luv"
-- (loaded with this file, so that helpers.run can close the clients a
-- failed test made: see track_clients there)
pcall(require, "async_mutex.redis")

local M = {}
local Server = {}
Server.__index = Server

-- Commands run without LD_PRELOAD: under `make asan` the sanitizer runtime
-- is preloaded into this process, and redis-server aborts with it.
local function sh(cmd)
  local ok = os.execute("LD_PRELOAD= ; " .. cmd)
  return ok == true or ok == 0
end

-- The output of a command (run as sh runs it).
local function read(cmd)
  local p = assert(io.popen("LD_PRELOAD= ; " .. cmd))
  local out = p:read("a")
  p:close()
  return out
end

local function shquote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
-- (for spec/redis_sentinel.lua and spec/redis_cluster_server.lua)
M.sh, M.read, M.shquote = sh, read, shquote

--- A loopback port nobody listens on right now.
function M.free_port()
  local tcp = uv.new_tcp()
  assert(tcp:bind("127.0.0.1", 0))
  local port = tcp:getsockname().port
  tcp:close()
  uv.run("nowait")
  return port
end

-- Polls every 10 ms for up to 20 s: a server starts in a few ms, but on a
-- machine loaded by valgrind beside gcstress 5 s was once not enough.
local function wait_for(pred, what)
  for _ = 1, 2000 do
    if pred() then return end
    uv.sleep(10)
  end
  error("redis_server: " .. what .. " after 20 s", 3)
end

--- The PID a daemonized redis-server wrote to `pidfile`, or nil while
-- there is none (also for redis_sentinel.lua's sentinels).
function M.read_pid(pidfile)
  local f = io.open(pidfile)
  if not f then return nil end
  local pid = tonumber(f:read("a"))
  f:close()
  return pid
end

function Server:launch()
  os.remove(self.path)
  os.remove(self.pidfile)
  local cmd = ("redis-server --port %d --bind 127.0.0.1 --unixsocket %s"
    .. " --save '' --appendonly no --daemonize yes --pidfile %s"
    .. " --logfile %s --dir %s %s"):format(self.port, shquote(self.path),
    shquote(self.pidfile), shquote(self.dir .. "/redis.log"), shquote(self.dir),
    self.extra or "")
  assert(sh(cmd), "redis_server: cannot run redis-server")
  wait_for(function() return sh("test -S " .. shquote(self.path)) end,
    "no socket " .. self.path)
  wait_for(function()
    self.pid = M.read_pid(self.pidfile)
    return self.pid ~= nil
  end, "no pid file")
  return self
end

--- Starts a server; `port` (optional) is the port to listen on, `extra`
-- (optional) more command-line options ("--requirepass secret").
function M.start(port, extra)
  local p = assert(io.popen("LD_PRELOAD= mktemp -d /tmp/am-redis-XXXXXX"))
  local dir = p:read("l")
  p:close()
  local self = setmetatable({
    dir = dir, path = dir .. "/redis.sock", pidfile = dir .. "/redis.pid",
    port = port or M.free_port(), extra = extra,
  }, Server)
  return self:launch()
end

--- Sends signal `sig` ("STOP", "CONT", "KILL", ...) to the server.
function Server:signal(sig)
  assert(self.pid, "redis_server: not running")
  sh(("kill -%s %d 2>/dev/null"):format(sig, self.pid))
end

--- Kills the server with SIGKILL and waits until it is gone.
function Server:kill()
  if not self.pid then return end
  self:signal("KILL")                 -- also ends a stopped process
  -- gone, or a zombie (a daemon's reaper may take its time)
  wait_for(function()
    return not sh(("s=$(awk '/^State/ {print $2}' /proc/%d/status 2>/dev/null); "
      .. "[ -n \"$s\" ] && [ \"$s\" != Z ]"):format(self.pid))
  end, "server still alive")
  self.pid = nil
end

--- Starts it again (after kill) on the same port and socket.
function Server:restart()
  self:kill()
  return self:launch()
end

--- A client of this server (redis.connect with `opts`): over TCP to its
-- port unless opts.path, or opts.port, names another place.
function Server:client(opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  if not o.path then o.port = o.port or self.port end
  return require("async_mutex.redis").connect(o)
end

--- Kills it and removes its directory.
function Server:stop()
  self:kill()
  sh("rm -rf " .. shquote(self.dir))
end

--- Calls PING on client 'c' every 'every_ms' ms from a coroutine of its
-- own, until the returned function is called; that function stops the
-- calls, waits until the last one is answered, and returns how many
-- were answered.
function M.pinging(c, every_ms)
  local h = require "helpers"
  local stop, n = false, 0
  h.spawn(function()
    while not stop do
      c:call("PING")
      n = n + 1
      h.sleep(every_ms)
    end
  end)
  return function()
    stop = true
    h.wait_until(function() return c:pending() == 0 end)
    return n
  end
end

--- The server of a whole spec file: started by its setup, stopped by its
-- teardown (also when a test failed).  'start' makes it (M.start unless
-- given).  Returns a stand-in that reaches the running server:
--   local server = redis_server.for_file(setup, teardown)
--   ... server.path, server:client() in the file's tests
function M.for_file(setup, teardown, start)
  local running
  setup(function() running = (start or M.start)() end)
  teardown(function() if running then running:stop() end end)
  return setmetatable({}, { __index = function(_, k)
    local v = assert(running, "the file's server runs from its setup on")[k]
    if type(v) ~= "function" then return v end
    return function(_, ...) return v(running, ...) end   -- server:method(...)
  end })
end

--- The cases of a spec file whose set-up is one client, client(), and
-- whose tear-down closes it once the body has returned (a failed case's
-- clients are closed by h.run): with.client(fn, opts) makes the body of an
-- `it` (h.async(..., opts)) that runs fn(c).
--   it("...", with.client(function(c) ... end))
function M.cases(client)
  local h = require "helpers"
  return {
    client = function(fn, opts)
      return h.async(function()
        local c = client()
        fn(c)
        c:close()
      end, opts)
    end,
  }
end

--- The head of a Redis client spec file in one line: the spec helpers,
-- the client module, the file's server (M.for_file), client(opts), a new
-- client of that server (server:client(opts)), and the cases of one such
-- client (M.cases):
--   local h, redis, server, client, with = require("redis_server").spec_file(setup, teardown)
function M.spec_file(setup, teardown)
  local server = M.for_file(setup, teardown)
  local function client(opts) return server:client(opts) end
  return require "helpers", require "async_mutex.redis", server, client, M.cases(client)
end

--- The same for each test: a new server started before each test and
-- stopped after it (before_each, after_each).
function M.for_each_test(before_each, after_each, start)
  return M.for_file(before_each, after_each, start)
end

return M
