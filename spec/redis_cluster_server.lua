-- A throw-away Redis Cluster for the cluster specs: `n` masters (real
-- redis-server processes, spec/redis_server.lua, with --cluster-enabled),
-- joined by `redis-cli --cluster create`.  Each node is stopped by its PID
-- (spec teardown), also when the spec fails.
--
--   local cluster = require("redis_cluster_server").start(3)
--   cluster.nodes[i]      -- a redis_server: port, pid, signal, kill, stop
--   cluster.seeds         -- { {host =, port =}, ... } for redis.connect
--   cluster:stop()

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

--- Starts n masters and makes them one cluster; waits until every node
-- says cluster_state:ok and knows every slot.
function M.start(n)
  local self = setmetatable({ nodes = {}, seeds = {} }, Cluster)
  local taken = {}
  local ok, err = pcall(function()
    local addrs = {}
    for i = 1, n do
      local node = redis_server.start(cluster_port(taken), "--cluster-enabled yes"
        .. " --cluster-config-file nodes.conf --cluster-node-timeout 2000")
      self.nodes[i] = node
      self.seeds[i] = { host = "127.0.0.1", port = node.port }
      addrs[i] = "127.0.0.1:" .. node.port
    end
    local out = read("redis-cli --cluster create " .. table.concat(addrs, " ")
      .. " --cluster-yes 2>&1")
    assert(out:find("All 16384 slots covered", 1, true), "redis-cli --cluster create: " .. out)
    for _ = 1, 1000 do
      local good = true
      for i = 1, n do
        local info = self:cli(i, "cluster info")
        if not info:find("cluster_state:ok", 1, true)
            or not info:find("cluster_slots_assigned:16384", 1, true)
            or not info:find("cluster_known_nodes:" .. n, 1, true) then
          good = false
        end
      end
      if good then return end
      uv.sleep(10)
    end
    error("redis_cluster_server: cluster not ok after 10 s")
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

--- Kills every node and removes their directories.
function Cluster:stop()
  for _, node in ipairs(self.nodes) do node:stop() end
  self.nodes = {}
end

return M
