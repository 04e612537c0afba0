-- A throw-away Sentinel set-up for the Sentinel specs: a master and its
-- replicas (spec/redis_server.lua's servers, started with --replicaof)
-- under sentinels (redis-server --sentinel, each with a config file of its
-- own, which it rewrites), all on free loopback ports.  Every process is
-- stopped by its PID (spec teardown, also when the spec fails).
--
--   local set = require("redis_sentinel").start { replicas = 2, sentinels = 3
--     [, password = "pw"] [, down_after = ms] [, failover_timeout = ms] }
--   set.master (a redis_server), set.replicas[i], set.sentinels[i]
--     (.port, .pid, :kill(), :launch()), set.name ("mymaster")
--   set:sentinel_list()  -- { {host =, port =}, ... } for redis.connect
--   set:named_port()     -- the master's port as a live sentinel names it
--   set.auth             -- redis-cli's arguments for the password, if any
--   set:stop()

local uv = require "luv"
local redis_server = require "redis_server"

local M = {}
local Set = {}
Set.__index = Set
local Sentinel = {}
Sentinel.__index = Sentinel

local sh = redis_server.sh           -- (without LD_PRELOAD: see there)

local read = redis_server.read

local function wait_for(pred, what, ms)
  for _ = 1, (ms or 10000) // 20 do
    if pred() then return end
    uv.sleep(20)
  end
  error("redis_sentinel: " .. what, 3)
end

function Sentinel:launch()
  os.remove(self.pidfile)
  local f = assert(io.open(self.conf, "w"))
  f:write(("port %d\nbind 127.0.0.1\ndaemonize yes\npidfile %s\nlogfile %s\ndir %s\n"
    .. "sentinel monitor %s 127.0.0.1 %d %d\n"
    .. "sentinel down-after-milliseconds %s %d\n"
    .. "sentinel failover-timeout %s %d\n%s"):format(
    self.port, self.pidfile, self.dir .. "/sentinel.log", self.dir,
    self.name, self.master_port, self.quorum, self.name, self.down_after,
    self.name, self.failover_timeout,
    self.password and ("sentinel auth-pass %s %s\n"):format(self.name, self.password) or ""))
  f:close()
  assert(sh(("redis-server %s --sentinel"):format(self.conf)), "cannot run redis-server --sentinel")
  wait_for(function()
    self.pid = redis_server.read_pid(self.pidfile)
    return self.pid ~= nil
  end, "no sentinel pid file")
  wait_for(function()
    return read(("redis-cli -p %d ping 2>/dev/null"):format(self.port)):find("PONG") ~= nil
  end, "sentinel not answering")
  return self
end

function Sentinel:kill()
  if not self.pid then return end
  sh(("kill -9 %d 2>/dev/null"):format(self.pid))
  local pid = self.pid
  wait_for(function()
    return not sh(("s=$(awk '/^State/ {print $2}' /proc/%d/status 2>/dev/null); "
      .. "[ -n \"$s\" ] && [ \"$s\" != Z ]"):format(pid))
  end, "sentinel still alive")
  self.pid = nil
end

--- Starts a master, `replicas` replicas and `sentinels` sentinels (quorum
-- 2 when there are 3 or more, else 1), and waits until every sentinel
-- sees every replica.
function M.start(opts)
  opts = opts or {}
  local set = setmetatable({ name = opts.name or "mymaster", replicas = {}, sentinels = {} }, Set)
  local ok, err = pcall(function()
    -- (a replica's first sync, and a demoted master's, starts at once:
    -- Redis 7 waits 5 s by default for more replicas to share a transfer)
    local sync = "--repl-diskless-sync-delay 0"
    if opts.password then
      -- (clients, replicas and sentinels all authenticate with it)
      sync = ("%s --requirepass %s --masterauth %s"):format(sync, opts.password, opts.password)
      set.auth = "--no-auth-warning -a " .. opts.password
    end
    set.master = redis_server.start(nil, sync)
    for i = 1, opts.replicas or 2 do
      set.replicas[i] = redis_server.start(nil, ("%s --replicaof 127.0.0.1 %d"):format(
        sync, set.master.port))
    end
    local n = opts.sentinels or 3
    for i = 1, n do
      local dir = read("mktemp -d /tmp/am-sentinel-XXXXXX"):gsub("%s+$", "")
      local s = setmetatable({
        dir = dir, conf = dir .. "/sentinel.conf", pidfile = dir .. "/sentinel.pid",
        port = redis_server.free_port(), name = set.name, master_port = set.master.port,
        quorum = n >= 3 and 2 or 1, down_after = opts.down_after or 1000,
        failover_timeout = opts.failover_timeout or 5000, password = opts.password,
      }, Sentinel)
      set.sentinels[i] = s
      s:launch()
    end
    -- every replica in sync with the master, and known to every sentinel
    wait_for(function()
      local info = read(("redis-cli %s -p %d info replication"):format(set.auth or "",
        set.master.port))
      local _, online = info:gsub("state=online", "")
      return online == #set.replicas
    end, "replicas not in sync")
    wait_for(function()
      for _, s in ipairs(set.sentinels) do
        local out = read(("redis-cli -p %d sentinel replicas %s"):format(s.port, set.name))
        local _, k = out:gsub("\nslave\n", "")
        local _, known = out:gsub("^name\n", "")
        if k + known < 1 and #set.replicas > 0 then return false end
        local _, ports = out:gsub("\nport\n", "")
        if ports < #set.replicas then return false end
      end
      return true
    end, "sentinels do not see the replicas")
  end)
  if not ok then
    set:stop()
    error(err, 2)
  end
  return set
end

--- The sentinels as redis.connect takes them.
function Set:sentinel_list()
  local list = {}
  for i, s in ipairs(self.sentinels) do list[i] = { host = "127.0.0.1", port = s.port } end
  return list
end

--- The master's port as a live sentinel names it.
function Set:named_port()
  for _, s in ipairs(self.sentinels) do
    if s.pid then
      local out = read(("redis-cli -p %d sentinel get-master-addr-by-name %s 2>/dev/null"):format(
        s.port, self.name))
      local port = tonumber(out:match("\n(%d+)"))
      if port then return port end
    end
  end
end

--- The server (master or replica) listening on `port`.
function Set:server(port)
  if self.master.port == port then return self.master end
  for _, r in ipairs(self.replicas) do
    if r.port == port then return r end
  end
end

--- Stops everything, by PID, and removes the directories.
function Set:stop()
  for _, s in ipairs(self.sentinels) do
    pcall(Sentinel.kill, s)
    sh("rm -rf " .. redis_server.shquote(s.dir))
  end
  for _, r in ipairs(self.replicas) do pcall(r.stop, r) end
  if self.master then pcall(self.master.stop, self.master) end
end

return M
