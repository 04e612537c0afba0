-- Keyed Redis locks on distinct keys: a Redis Cluster of 3 masters (and
-- one of a single master, below) against one redis-server
-- (docs/redis-locks.md, "A cluster against one server"), same client load
-- (PROCS processes of COROS coroutines, each cycle an acquire and a release
-- on a key of its own, never contended).  The servers are started here on
-- loopback; the setups alternate, ROUNDS times each, in one run: only
-- ratios measured in the run mean something on a shared machine, whose
-- load average is printed.  Server CPU is read from /proc (utime + stime
-- of each redis-server) around each round.  BENCH_QUICK=1: a tenth.
--
--   lua5.4 bench/cluster.lua        (from the checkout, after make)
--
-- Printed: cycles/s of each setup; client and server CPU per cycle (µs);
-- the servers' own time per script (EVALSHA's usec and calls in INFO
-- commandstats); each master's share of the cluster's server CPU; and the
-- rate the servers could sustain with one core each (cycles per second of
-- the busiest server's CPU), which the 2-core machine cannot show
-- directly; then the hand-off latency between two processes on one lock
-- (p50, p99); then each target (docs/redis-locks.md, "On a cluster") met
-- or missed.  `make bench` runs it.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/.."
package.path = here .. "/?.lua;" .. root .. "/spec/?.lua;" .. package.path
local redis_server = require "redis_server"
local redis_cluster_server = require "redis_cluster_server"
local procs = require "procs"

local QUICK = os.getenv("BENCH_QUICK") == "1"
local MS = QUICK and 500 or 3000
local ROUNDS = QUICK and 1 or 3
local PROCS, COROS = 2, 50
local LUA = arg[-1] or "lua5.4"
local ENV = "cd '" .. root .. "' && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "

local TICK = tonumber(procs.sh("getconf CLK_TCK")) or 100

-- CPU seconds (user + system) of process pid so far.
local function cpu(pid)
  local f = assert(io.open("/proc/" .. pid .. "/stat"))
  local s = f:read("a")
  f:close()
  local fields = {}
  for x in s:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = x end
  return (tonumber(fields[12]) + tonumber(fields[13])) / TICK
end

io.stderr:write("bench/cluster: ", QUICK and "quick" or "full", ", load ", procs.load_avg(), "\n")
-- A cluster of one master that serves every slot: the cluster client and
-- a cluster-enabled server, on one connection as with one server; beside
-- the other two it tells what the cluster mode costs from what spreading
-- the calls over 3 connections and 3 servers costs.
local function lone_master()
  local port
  repeat port = redis_server.free_port() until port < 55000     -- (bus: port + 10000)
  local srv = redis_server.start(port, "--cluster-enabled yes --cluster-config-file nodes.conf")
  procs.sh(("redis-cli -p %d CLUSTER ADDSLOTSRANGE 0 16383"):format(port))
  for _ = 1, 100 do
    if procs.sh(("redis-cli -p %d CLUSTER INFO"):format(port)):find("cluster_state:ok", 1, true) then
      return srv
    end
    procs.sh("sleep 0.05")
  end
  srv:stop()
  error("bench/cluster: a cluster of one master not ready after 5 s")
end

local single = redis_server.start()
local cluster = redis_cluster_server.start(3)
local lone = lone_master()
local ok, err = pcall(function()
  local cports = {}
  for i, n in ipairs(cluster.nodes) do cports[i] = n.port end
  local setups = {
    { name = "one server", mode = "single", ports = tostring(single.port), servers = { single } },
    { name = "cluster, 3 masters", mode = "cluster", ports = table.concat(cports, ","),
      servers = cluster.nodes },
    { name = "cluster, 1 master", mode = "cluster", ports = tostring(lone.port), servers = { lone } },
  }
  for _, s in ipairs(setups) do
    s.cycles, s.secs, s.cpu = 0, 0, {}
    for _, srv in ipairs(s.servers) do procs.sh(("redis-cli -p %d CONFIG RESETSTAT"):format(srv.port)) end
  end
  for _ = 1, ROUNDS do
    for _, s in ipairs(setups) do
      local before = {}
      for i, srv in ipairs(s.servers) do before[i] = cpu(srv.pid) end
      local cmds = {}
      for p = 1, PROCS do
        cmds[p] = ENV .. LUA .. (" bench/cluster/worker.lua %s %s %d %d p%d"):format(
          s.mode, s.ports, COROS, MS, p)
      end
      local outs = procs.parallel(cmds)
      for i, srv in ipairs(s.servers) do
        s.cpu[i] = (s.cpu[i] or 0) + cpu(srv.pid) - before[i]
      end
      for _, out in ipairs(outs) do
        local j = assert(procs.json(out), "a worker failed")
        s.cycles = s.cycles + j.cycles
        s.client = (s.client or 0) + j.cpu
      end
      s.secs = s.secs + MS / 1000
    end
  end
  -- the servers' own time per script (µs): EVALSHA's calls and usec
  for _, s in ipairs(setups) do
    local calls, usec = 0, 0
    for _, srv in ipairs(s.servers) do
      local info = procs.sh(("redis-cli -p %d INFO commandstats"):format(srv.port))
      local c, u = info:match("cmdstat_evalsha:calls=(%d+),usec=(%d+)")
      calls, usec = calls + (tonumber(c) or 0), usec + (tonumber(u) or 0)
    end
    s.script_us = calls > 0 and usec / calls or 0 / 0
  end
  print(("%d processes x %d coroutines, %d rounds of %.1f s each, alternating; load %s")
    :format(PROCS, COROS, ROUNDS, MS / 1000, procs.load_avg()))
  print("| setup | cycles/s | client CPU per cycle | server CPU per cycle | server time per script"
    .. " | CPU share of each server | one core per server |")
  print("|---|---|---|---|---|---|---|")
  local rates, projected, shares_ok = {}, {}, true
  for k, s in ipairs(setups) do
    local total, busiest, shares = 0, 0, {}
    for i = 1, #s.servers do
      total = total + s.cpu[i]
      if s.cpu[i] > busiest then busiest = s.cpu[i] end
    end
    for i = 1, #s.servers do
      local share = s.cpu[i] / total
      shares[i] = ("%.2f"):format(share)
      if #s.servers > 1 and math.abs(share - 1 / #s.servers) > 0.05 then shares_ok = false end
    end
    rates[k], projected[k] = s.cycles / s.secs, s.cycles / busiest
    print(("| %s | %.0f | %.1f µs | %.1f µs | %.1f µs | %s | %.0f cycles/s |"):format(s.name,
      rates[k], s.client / s.cycles * 1e6, total / s.cycles * 1e6, s.script_us,
      table.concat(shares, " / "), projected[k]))
  end
  print(("cluster / one server: %.2f (1 master: %.2f)"):format(rates[2] / rates[1],
    rates[3] / rates[1]))
  -- the hand-off between two processes (release in A to the grant in B)
  local lat = {}
  for _ = 1, ROUNDS do
    for k, s in ipairs(setups) do
      local cmds = {}
      for p = 1, 2 do
        cmds[p] = ENV .. LUA .. (" bench/cluster/worker.lua %s %s 0 %d h%d"):format(
          s.mode, s.ports, QUICK and 50 or 200, p)
      end
      for _, ms in ipairs(procs.handoffs(procs.parallel(cmds))) do
        lat[k] = lat[k] or {}
        lat[k][#lat[k] + 1] = ms
      end
    end
  end
  for k, s in ipairs(setups) do
    table.sort(lat[k])
    print(("hand-off, %s: p50 %.3f ms, p99 %.3f ms (%d)"):format(s.name,
      procs.percentile(lat[k], 0.5), procs.percentile(lat[k], 0.99), #lat[k]))
  end
  local handoff = procs.percentile(lat[2], 0.5) / procs.percentile(lat[1], 0.5)
  print(("hand-off p50, cluster / one server: %.2f"):format(handoff))
  -- the targets: on this 2-core machine the client processes and every
  -- server share the cores, so the cycles/s ratio is bounded by the total
  -- CPU per cycle; the servers' rate with one core each is the projection
  local function target(ok, what) print(("%s: %s"):format(ok and "met" or "MISSED", what)) end
  target(rates[2] >= rates[1], ("cycles/s, cluster >= one server (%.2fx)"):format(rates[2] / rates[1]))
  target(shares_ok, "each master's share of the servers' CPU within 1/3 +- 0.05")
  target(projected[2] >= projected[1], ("one core per server, cluster >= one server (%.2fx)")
    :format(projected[2] / projected[1]))
  target(handoff <= 1.2, ("hand-off p50, cluster <= 1.2x one server (%.2fx)"):format(handoff))
end)
single:stop()
cluster:stop()
lone:stop()
if not ok then error(err, 0) end
