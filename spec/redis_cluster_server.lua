-- A throw-away Redis Cluster for the cluster specs: `n` masters (real
-- redis-server processes, spec/redis_server.lua, with --cluster-enabled),
-- joined by `redis-cli --cluster create`.  Each node is stopped by its PID
-- (spec teardown), also when the spec fails.
--
--   local cluster = require("redis_cluster_server").start(3)
--   cluster.nodes[i]      -- a redis_server: port, pid, signal, kill, stop
--   cluster.seeds         -- { {host =, port =}, ... } for redis.connect
--   cluster:stop()
--
-- With replicas: start(3, { replicas = 1 [, node_timeout = ms] }) starts
-- 3 x (1 + replicas) nodes, `--cluster-replicas` of them per master, and
-- waits until every replica is in sync (its master's WAIT counts it).
--   cluster:master_of(slot)   -- index of the node that serves slot now
--   cluster:replica_of(i)     -- index of a replica of node i (nil: none)

local uv = require "luv"
local redis_server = require "redis_server"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

local read = redis_server.read

-- A port that is free, and whose cluster bus port (port + 10000) is too.
local function cluster_port(taken)
  for _ = 1, 100 do
    local p = redis_server.free_port()
    if p < 55000 and not taken[p] and not taken[p + 10000] then
      local tcp = uv.new_tcp()
      local ok = tcp:bind("127.0.0.1", p + 10000)
      tcp:close()
      uv.run("nowait")
      if ok then
        taken[p], taken[p + 10000] = true, true
        return p
      end
    end
  end
  error("redis_cluster_server: no free port pair")
end

--- Output of redis-cli against node i.
function Cluster:cli(i, args)
  return read(("redis-cli -p %d %s 2>&1"):format(self.nodes[i].port, args))
end

--- Starts n masters (and opts.replicas replicas of each) and makes them
-- one cluster; waits until every node says cluster_state:ok and knows
-- every slot and node, and every replica is in sync.
function M.start(n, opts)
  opts = opts or {}
  local per = opts.replicas or 0
  local self = setmetatable({ nodes = {}, seeds = {} }, Cluster)
  local taken = {}
  local ok, err = pcall(function()
    local addrs, total = {}, n * (1 + per)
    for i = 1, total do
      -- (a replica's first sync at once: Redis 7 waits 5 s by default for
      -- more replicas to share a transfer; any node may become a master)
      local node = redis_server.start(cluster_port(taken), "--cluster-enabled yes"
        .. " --cluster-config-file nodes.conf --cluster-node-timeout "
        .. (opts.node_timeout or 2000) .. " --repl-diskless-sync-delay 0")
      self.nodes[i] = node
      self.seeds[i] = { host = "127.0.0.1", port = node.port }
      addrs[i] = "127.0.0.1:" .. node.port
    end
    local out = read("redis-cli --cluster create " .. table.concat(addrs, " ")
      .. (per > 0 and " --cluster-replicas " .. per or "") .. " --cluster-yes 2>&1")
    assert(out:find("All 16384 slots covered", 1, true), "redis-cli --cluster create: " .. out)
    for _ = 1, 2000 do
      local good = true
      for i = 1, total do
        local info = self:cli(i, "cluster info")
        if not info:find("cluster_state:ok", 1, true)
            or not info:find("cluster_slots_assigned:16384", 1, true)
            or not info:find("cluster_known_nodes:" .. total, 1, true) then
          good = false
        elseif per > 0 and self:role(i) == "master"
            and tonumber(self:cli(i, "wait " .. per .. " 10")) ~= per then
          good = false
        end
      end
      if good then return end
      uv.sleep(10)
    end
    error("redis_cluster_server: cluster not ok after 20 s")
  end)
  if not ok then
    self:stop()
    error(err, 2)
  end
  return self
end

--- The node id of node i.
function Cluster:id(i)
  return (self:cli(i, "cluster myid"):gsub("%s+$", ""))
end

--- "master" or "slave": what node i says it is (ROLE).
function Cluster:role(i)
  return self:cli(i, "role"):match("^(%a+)")
end

-- The index of the node at port.
local function index_of(self, port)
  for i, node in ipairs(self.nodes) do
    if node.port == tonumber(port) then return i end
  end
end

-- CLUSTER NODES as a live node sees it: { {port =, id =, master = bool,
-- of = master id or "-", ranges = { {from, to}, ... }, failed = bool} }.
function Cluster:table()
  for i, node in ipairs(self.nodes) do
    if node.pid then
      local list = {}
      for line in self:cli(i, "cluster nodes"):gmatch("[^\n]+") do
        local f = {}
        for w in line:gmatch("%S+") do f[#f + 1] = w end
        if #f >= 8 then
          local e = { id = f[1], port = tonumber(f[2]:match(":(%d+)@")),
            master = f[3]:find("master", 1, true) ~= nil,
            failed = f[3]:find("fail", 1, true) ~= nil, of = f[4], ranges = {} }
          for k = 9, #f do
            local a, b = f[k]:match("^(%d+)%-(%d+)$")
            if not a then a = f[k]:match("^(%d+)$") b = a end
            if a then e.ranges[#e.ranges + 1] = { tonumber(a), tonumber(b) } end
          end
          list[#list + 1] = e
        end
      end
      if #list > 0 then return list end
    end
  end
  error("redis_cluster_server: no live node")
end

--- The index of the master that serves slot (as a live node sees it).
function Cluster:master_of(slot)
  for _, e in ipairs(self:table()) do
    if e.master and not e.failed then
      for _, r in ipairs(e.ranges) do
        if slot >= r[1] and slot <= r[2] then return index_of(self, e.port) end
      end
    end
  end
end

--- The index of a replica of node i (nil: none).
function Cluster:replica_of(i)
  local list = self:table()
  local id
  for _, e in ipairs(list) do
    if e.port == self.nodes[i].port then id = e.id end
  end
  for _, e in ipairs(list) do
    if e.of == id and not e.failed then return index_of(self, e.port) end
  end
end

--- Kills every node and removes their directories.
function Cluster:stop()
  for _, node in ipairs(self.nodes) do node:stop() end
  self.nodes = {}
end

--- A cluster client of this cluster (redis.connect with its seeds and
-- `opts`).
function Cluster:connect(opts)
  local o = { cluster = self.seeds }
  for k, v in pairs(opts or {}) do o[k] = v end
  return require("async_mutex.redis").connect(o)
end

--- The cluster of a whole spec file (as redis_server.for_file): started
-- by its setup (M.start(n, opts)), stopped by its teardown, which first
-- kills the child processes (spec/lock_redis.lua's R.child) a failed test
-- left in `children`, the list returned second, which the tests fill.
--   local cluster, children = redis_cluster_server.for_file(setup, teardown, 3)
function M.for_file(setup, teardown, n, opts)
  local children = {}
  teardown(function()
    for _, child in ipairs(children) do child:kill() end   -- (a failed test's)
  end)
  return redis_server.for_file(setup, teardown, function() return M.start(n, opts) end), children
end

return M
