-- The Redis locks' section of `make bench`: RedisMutex against node-redlock 5
-- (on ioredis; `make bench` installs it with npm ci in bench/redis_locks/node, otherwise
-- its rows are left out), with redlock's default retry delay (200 ms) and
-- with 10 ms, and the seed's recipe (SET NX PX, a compare-and-delete
-- script, 200 ms polling) on our own client, all against one redis-server started here on loopback,
-- unpinned, each side in its own processes, in one run (the ratios are what
-- counts on a shared machine).  BENCH_QUICK=1 runs a tenth of the work.
--
--   lua5.4 bench/redis_locks.lua        (from the checkout, after make)
--
-- Rows: uncontended cycles per second with one coroutine (task) and with 50
-- on distinct keys over one connection, with the Redis server's CPU time
-- per cycle and, for 50, how busy its one thread was (which side is bound
-- by the server and which by its own client); the cross-process hand-off latency
-- (release in process A to the grant in waiting process B, p50 / p99);
-- one key contended by 4 processes (acquisitions per second, Redis
-- commands per acquisition counted by the server, the longest wait); the
-- keys left in Redis after 100,000 distinct keys were churned by processes
-- killed at random; how late a lost lease is reported after its local end;
-- how fast acquire fails on a refused connection.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/.."
package.path = here .. "/?.lua;" .. root .. "/spec/?.lua;" .. package.path
local redis_server = require "redis_server"
local procs = require "procs"
local sh, json, parallel, percentile, handoffs = procs.sh, procs.json, procs.parallel, procs.percentile, procs.handoffs

local QUICK = os.getenv("BENCH_QUICK") == "1"
local SCALE = QUICK and 0.1 or 1
local LUA = arg[-1] or "lua5.4"
local ENV = "cd '" .. root .. "' && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
local WORKER = LUA .. " bench/redis_locks/worker.lua "
local NODE_DIR = here .. "/redis_locks/node"

local function rate(t) return t and t.ops / t.seconds end

local server = redis_server.start()
local port = server.port
-- Requests the clients sent, not the commands scripts run inside the
-- server (which INFO counts too): both sides only send these.
local REQUESTS = { eval = true, evalsha = true, subscribe = true, unsubscribe = true,
                   ["script|load"] = true, ping = true }
local function commands()
  local n = 0
  local stats = sh(("LD_PRELOAD= redis-cli -p %d info commandstats"):format(port))
  for name, calls in stats:gmatch("cmdstat_([%w|]+):calls=(%d+)") do
    if REQUESTS[name] then n = n + tonumber(calls) end
  end
  return n
end

local have_node = io.open(NODE_DIR .. "/node_modules/redlock/package.json") ~= nil
  and sh("command -v node") ~= ""
local NODE = "cd '" .. NODE_DIR .. "' && node bench.js "

local rows = {}
local function row(name, ours, default, tuned, unit, better, seed)
  rows[#rows + 1] = { name = name, ours = ours, default = default, tuned = tuned,
                      unit = unit, better = better, seed = seed }
end

io.stderr:write("bench/redis_locks: ", QUICK and "quick" or "full",
  have_node and "" or " (node-redlock not installed: its columns stay empty)", "\n")

-- The server's CPU time so far (user + system, seconds, from INFO cpu).
local function server_cpu()
  local info = sh(("LD_PRELOAD= redis-cli -p %d info cpu"):format(port))
  return tonumber(info:match("used_cpu_user:([%d.]+)")) + tonumber(info:match("used_cpu_sys:([%d.]+)"))
end

-- Runs one side's cycles; returns its rate and the server's CPU time per
-- cycle in microseconds (with 50 coroutines the server's one thread is the
-- bottleneck: 1e6 / that is the most one server can serve of this side).
local function cycles(cmd)
  local before = server_cpu()
  local t = json(sh(cmd))
  if not t then return nil end
  local cpu = server_cpu() - before
  return rate(t), cpu * 1e6 / t.ops, 100 * cpu / t.seconds
end

-- uncontended cycles
for _, conc in ipairs({ 1, 50 }) do
  local n = math.floor((conc == 1 and 20000 or 50000) * SCALE)
  local ours, ours_cpu, ours_busy = cycles(ENV .. WORKER .. ("cycles %d %d %d"):format(port, n, conc))
  local peer, peer_cpu, peer_busy
  if have_node then
    peer, peer_cpu, peer_busy = cycles(NODE .. ("cycles %d %d %d default"):format(port, n, conc))
  end
  local seed, seed_cpu
  if conc == 1 then seed, seed_cpu = cycles(ENV .. WORKER .. ("seed_cycles %d %d"):format(port, n)) end
  local what = conc == 1 and "1 coroutine" or ("%d coroutines"):format(conc)
  row(("cycles/s, %s%s"):format(what, conc == 1 and "" or ", distinct keys"), ours, peer, nil, "/s",
      "higher", seed)
  row("server CPU per cycle, us, " .. what, ours_cpu, peer_cpu, nil, "us", "lower", seed_cpu)
  if conc > 1 then
    -- near 100: the server's one thread is what limits that side
    row("server thread busy, % of the run, " .. what, ours_busy, peer_busy, nil, "%", "none")
  end
end

-- cross-process hand-off
do
  local n = math.floor(2000 * SCALE)
  local ours = handoffs(parallel({
    ENV .. WORKER .. ("pingpong %d %d A"):format(port, n),
    ENV .. WORKER .. ("pingpong %d %d B"):format(port, n) }))
  local def, tuned = {}, {}
  if have_node then
    local nd = QUICK and 10 or 40
    def = handoffs(parallel({ NODE .. ("pingpong %d %d A default"):format(port, nd),
                              NODE .. ("pingpong %d %d B default"):format(port, nd) }))
    tuned = handoffs(parallel({ NODE .. ("pingpong %d %d A 10"):format(port, n // 4),
                                NODE .. ("pingpong %d %d B 10"):format(port, n // 4) }))
  end
  local ns = QUICK and 10 or 40
  local seed = handoffs(parallel({ ENV .. WORKER .. ("seed_pingpong %d %d A"):format(port, ns),
                                   ENV .. WORKER .. ("seed_pingpong %d %d B"):format(port, ns) }))
  row("hand-off p50, ms", percentile(ours, 0.5), percentile(def, 0.5), percentile(tuned, 0.5), "ms", "lower",
      percentile(seed, 0.5))
  row("hand-off p99, ms", percentile(ours, 0.99), percentile(def, 0.99), percentile(tuned, 0.99), "ms", "lower",
      percentile(seed, 0.99))
end

-- one key, 4 processes
do
  local ms = math.floor(5000 * SCALE) + 1000
  local function contend(cmd_of)
    local before = commands()
    local t0 = os.time()
    local cmds = {}
    for i = 1, 4 do cmds[i] = cmd_of(i) end
    local outs = parallel(cmds)
    local total, max_wait = 0, 0
    for _, out in ipairs(outs) do
      local t = json(out) or { count = 0, max_wait_ms = 0 }
      total = total + t.count
      max_wait = math.max(max_wait, t.max_wait_ms)
    end
    local _ = t0
    local cmds_used = commands() - before
    return total / (ms / 1000), cmds_used / math.max(1, total), max_wait
  end
  local o_rate, o_req, o_wait = contend(function(i)
    return ENV .. WORKER .. ("contend %d %d %d"):format(port, ms, i) end)
  local t_rate, t_req, t_wait
  if have_node then
    t_rate, t_req, t_wait = contend(function(i)
      return NODE .. ("contend %d %d %d 10"):format(port, ms, i) end)
  end
  row("4 processes, one key: acquisitions/s", o_rate, nil, t_rate, "/s", "higher")
  row("4 processes: Redis commands per acquisition", o_req, nil, t_req, "", "lower")
  row("4 processes: longest wait, ms", o_wait, nil, t_wait, "ms", "lower")
end

-- keys left behind: 100,000 distinct keys churned by 4 processes killed at
-- random (docs/redis-locks.md, "Keys that expire")
do
  local n = math.floor(100000 * SCALE)
  local t = json(sh(ENV .. WORKER .. ("churn %d %d"):format(port, n)))
  local what = ("%d keys churned with SIGKILLs"):format(n)
  row(what .. ": other keys left", t and t.others, nil, nil, "", "lower")
  row(what .. ": counters left (1 h)", t and t.counters, nil, nil, "", "none")
  row(what .. ": expired, unreclaimed", t and t.unreclaimed, nil, nil, "", "none")
end

-- failures
do
  local lost = json(sh(ENV .. WORKER .. ("lost %d"):format(port)))
  row("lost lease reported after its local end, ms (max of 5)", lost and lost.lost_late_ms_max, nil, nil, "ms", "lower")
  local free = redis_server.free_port()
  local refused = json(sh(ENV .. WORKER .. ("refused %d"):format(free)))
  row("refused connection reported in, ms", refused and refused.refused_ms, nil, nil, "ms", "lower")
end

server:stop()

local function fmt(v)
  if not v then return "-" end
  if v >= 100 then return ("%.0f"):format(v) end
  return ("%.2f"):format(v)
end
print(("| %-58s | %12s | %18s | %18s | %18s |"):format("Redis locks", "async_mutex",
  "redlock (200 ms)", "redlock (10 ms)", "seed (SET NX PX)"))
print("|" .. ("-"):rep(60) .. "|" .. ("-"):rep(14) .. "|" .. ("-"):rep(20) .. "|" .. ("-"):rep(20)
  .. "|" .. ("-"):rep(20) .. "|")
for _, r in ipairs(rows) do
  local function ratio(peer)
    if r.better == "none" or not (peer and r.ours and peer > 0 and r.ours > 0) then return fmt(peer) end
    local x = r.better == "higher" and r.ours / peer or peer / r.ours
    return ("%s (%.1fx)"):format(fmt(peer), x)
  end
  print(("| %-58s | %12s | %18s | %18s | %18s |"):format(r.name, fmt(r.ours), ratio(r.default),
    ratio(r.tuned), ratio(r.seed)))
end
print("(x: how many times better async_mutex is on that row, in this run)")
