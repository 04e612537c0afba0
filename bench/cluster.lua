-- Keyed Redis locks on distinct keys: a Redis Cluster of 3 masters against
-- one redis-server (docs/redis-locks.md, "On a cluster"), same client load
-- (PROCS processes of COROS coroutines, each cycle an acquire and a release
-- on a key of its own, never contended).  The servers are started here on
-- loopback; the two setups alternate, ROUNDS times each, in one run: only
-- ratios measured in the run mean something on a shared machine, whose
-- load average is printed.  Server CPU is read from /proc (utime + stime
-- of each redis-server) around each round.  BENCH_QUICK=1: a tenth.
--
--   lua5.4 bench/cluster.lua        (from the checkout, after make)
--
-- Printed: cycles/s of each setup; server CPU per cycle (µs); each
-- master's share of the cluster's server CPU; and the rate the servers
-- could sustain with one core each (cycles per second of the busiest
-- server's CPU), which the 2-core machine cannot show directly; then the
-- hand-off latency between two processes on one lock (p50, p99).

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
local single = redis_server.start()
local cluster = redis_cluster_server.start(3)
local ok, err = pcall(function()
  local cports = {}
  for i, n in ipairs(cluster.nodes) do cports[i] = n.port end
  local setups = {
    { name = "one server", mode = "single", ports = tostring(single.port), servers = { single } },
    { name = "cluster, 3 masters", mode = "cluster", ports = table.concat(cports, ","),
      servers = cluster.nodes },
  }
  for _, s in ipairs(setups) do s.cycles, s.secs, s.cpu = 0, 0, {} end
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
  print(("%d processes x %d coroutines, %d rounds of %.1f s each, alternating; load %s")
    :format(PROCS, COROS, ROUNDS, MS / 1000, procs.load_avg()))
  print("| setup | cycles/s | client CPU per cycle | server CPU per cycle | CPU share of each server"
    .. " | one core per server |")
  print("|---|---|---|---|---|---|")
  local rates = {}
  for k, s in ipairs(setups) do
    local total, busiest, shares = 0, 0, {}
    for i = 1, #s.servers do
      total = total + s.cpu[i]
      if s.cpu[i] > busiest then busiest = s.cpu[i] end
    end
    for i = 1, #s.servers do shares[i] = ("%.2f"):format(s.cpu[i] / total) end
    rates[k] = s.cycles / s.secs
    print(("| %s | %.0f | %.1f µs | %.1f µs | %s | %.0f cycles/s |"):format(s.name, rates[k],
      s.client / s.cycles * 1e6, total / s.cycles * 1e6, table.concat(shares, " / "), s.cycles / busiest))
  end
  print(("cluster / one server: %.2f"):format(rates[2] / rates[1]))
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
  print(("hand-off p50, cluster / one server: %.2f"):format(
    procs.percentile(lat[2], 0.5) / procs.percentile(lat[1], 0.5)))
end)
single:stop()
cluster:stop()
if not ok then error(err, 0) end
