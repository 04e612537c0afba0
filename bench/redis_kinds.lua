-- The Redis lock kinds' section of `make bench` (docs/redis-locks.md,
-- "Benchmark of the kinds"): RedlockMutex against node-redlock 5 (on
-- ioredis, bench/redis_locks/node: `make bench` installs it with npm ci;
-- without it its columns stay empty) over 3 and over 5 redis-servers, with
-- redlock's defaults (retry 200 ms, jitter 100 ms) and a 10 ms retry; and
-- RedisRWLock read-mostly (95 % reads) against RedisMutex.  The servers are
-- started here on loopback (the 3-server rows use the first 3 of the 5),
-- every side runs in its own processes, unpinned, in one run: only the
-- ratios measured in the run mean something on a shared machine, whose
-- load average is printed.  BENCH_QUICK=1 runs a tenth of the work;
-- BENCH_ONLY=rw runs the RedisRWLock rows alone (one server, no wait for
-- the Redlock's ttl), BENCH_ONLY=redlock the others.
--
--   lua5.4 bench/redis_kinds.lua        (from the checkout, after make)
--
-- Rows: uncontended cycles per second with one coroutine (task) and with
-- 50 on distinct names; the cross-process hand-off (release in process A
-- to the grant in waiting process B, p50 / p99); one name contended by 4
-- processes (acquisitions per second, the longest wait); RedisRWLock and
-- RedisMutex from 4 processes of 4 coroutines, each section holding the
-- lock for one yield or for 1 ms, the two kinds in alternating rounds.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/.."
package.path = here .. "/?.lua;" .. root .. "/spec/?.lua;" .. package.path
local redis_server = require "redis_server"
local procs = require "procs"
local sh, json, load_avg = procs.sh, procs.json, procs.load_avg
local parallel, percentile, handoffs = procs.parallel, procs.percentile, procs.handoffs
local uv = require "luv"

local QUICK = os.getenv("BENCH_QUICK") == "1"
local ONLY = os.getenv("BENCH_ONLY")
if ONLY and ONLY ~= "rw" and ONLY ~= "redlock" then
  error("BENCH_ONLY: rw or redlock expected, got " .. ONLY, 0)
end
local RW, REDLOCK = ONLY ~= "redlock", ONLY ~= "rw"
local SCALE = QUICK and 0.1 or 1
local LUA = arg[-1] or "lua5.4"
local ENV = "cd '" .. root .. "' && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
local WORKER = LUA .. " bench/redis_kinds/worker.lua "
local NODE_DIR = here .. "/redis_locks/node"

local have_node = io.open(NODE_DIR .. "/node_modules/redlock/package.json") ~= nil
  and sh("command -v node") ~= ""
local NODE = "cd '" .. NODE_DIR .. "' && node bench.js "

local load_start = load_avg()
io.stderr:write("bench/redis_kinds: ", QUICK and "quick" or "full", ", load ", load_start,
  have_node and "" or " (node-redlock not installed: its columns stay empty)", "\n")

local servers = {}
for i = 1, REDLOCK and 5 or 1 do servers[i] = redis_server.start() end
local t_started = uv.hrtime()
local function ports(n)
  local t = {}
  for i = 1, n do t[i] = servers[i].port end
  return table.concat(t, ",")
end

local rows = {}
local function row(name, ours, default, tuned, unit, better)
  rows[#rows + 1] = { name = name, ours = ours, default = default, tuned = tuned, unit = unit,
                      better = better }
end

-- RedisRWLock against RedisMutex, first: the Redlock rows wait for the
-- servers to be up for their ttl (30 s) meanwhile.  The two kinds take
-- turns, in 5 rounds of a second each (one in quick mode), the first of
-- them alternating: the machine's load drifts over a run, and a kind
-- measured for 5 s after the other met a different machine (the ratio of
-- two such runs moved from 1.7x to 5.8x).
if RW then
  local ms = math.floor(4000 * SCALE) + 1000
  local rounds = QUICK and 1 or 5
  local function contend(kind, hold)
    local cmds = {}
    for i = 1, 4 do
      cmds[i] = ENV .. WORKER .. ("%s %d %d %d 4 %d"):format(kind, servers[1].port,
        ms // rounds, i, hold)
    end
    local total = 0
    for _, out in ipairs(parallel(cmds)) do
      local t = json(out)
      total = total + (t and t.count or 0)
    end
    return total
  end
  for _, hold in ipairs({ 0, 1 }) do
    local rw, mutex = 0, 0
    for r = 1, rounds do
      if r % 2 == 1 then
        rw = rw + contend("rw_contend", hold)
        mutex = mutex + contend("mutex_contend", hold)
      else
        mutex = mutex + contend("mutex_contend", hold)
        rw = rw + contend("rw_contend", hold)
      end
    end
    local seconds = rounds * (ms // rounds) / 1000
    row(("RedisRWLock, 95 %% reads, 4 x 4 coroutines, hold %s: acquisitions/s"):format(
      hold == 0 and "one yield" or "1 ms"), rw / seconds, mutex / seconds, nil, "/s", "higher")
  end
end

-- the servers count for a Redlock once up for its ttl (30 s, and up to a
-- second more: whole seconds of uptime)
local wait = 32 - (uv.hrtime() - t_started) / 1e9
if REDLOCK and wait > 0 then
  io.stderr:write(("bench/redis_kinds: %.0f s until the servers are up for the Redlock's ttl\n")
    :format(wait))
  uv.sleep(math.floor(wait * 1000))
end

for _, n in ipairs(REDLOCK and { 3, 5 } or {}) do
  local p = ports(n)
  local label = ("%d servers"):format(n)
  for _, conc in ipairs({ 1, 50 }) do
    local count = math.floor((conc == 1 and 5000 or 20000) * SCALE)
    local ours = json(sh(ENV .. WORKER .. ("redlock_cycles %s %d %d"):format(p, count, conc)))
    local peer = have_node and json(sh(NODE .. ("cycles %s %d %d default"):format(p, count, conc)))
    row(("%s: cycles/s, %d %s%s"):format(label, conc, conc == 1 and "coroutine" or "coroutines",
      conc == 1 and "" or ", distinct names"), ours and ours.ops / ours.seconds,
      peer and peer.ops / peer.seconds, nil, "/s", "higher")
  end
  do
    local count = math.floor(1000 * SCALE)
    local ours = handoffs(parallel({
      ENV .. WORKER .. ("redlock_pingpong %s %d A"):format(p, count),
      ENV .. WORKER .. ("redlock_pingpong %s %d B"):format(p, count) }))
    local def, tuned = {}, {}
    if have_node then
      local nd = QUICK and 10 or 40
      def = handoffs(parallel({ NODE .. ("pingpong %s %d A default"):format(p, nd),
                                NODE .. ("pingpong %s %d B default"):format(p, nd) }))
      tuned = handoffs(parallel({ NODE .. ("pingpong %s %d A 10"):format(p, count // 4),
                                  NODE .. ("pingpong %s %d B 10"):format(p, count // 4) }))
    end
    row(label .. ": hand-off p50, ms", percentile(ours, 0.5), percentile(def, 0.5),
        percentile(tuned, 0.5), "ms", "lower")
    row(label .. ": hand-off p99, ms", percentile(ours, 0.99), percentile(def, 0.99),
        percentile(tuned, 0.99), "ms", "lower")
  end
  do
    local ms = math.floor(4000 * SCALE) + 1000
    local function contend(cmd_of)
      local cmds = {}
      for i = 1, 4 do cmds[i] = cmd_of(i) end
      local total, max_wait, least, most = 0, 0, math.huge, 0
      for _, out in ipairs(parallel(cmds)) do
        local t = json(out) or { count = 0, max_wait_ms = 0 }
        total = total + t.count
        max_wait = math.max(max_wait, t.max_wait_ms)
        least, most = math.min(least, t.count), math.max(most, t.count)
      end
      return total / (ms / 1000), max_wait, least, most
    end
    local o_rate, o_wait, o_least, o_most = contend(function(i)
      return ENV .. WORKER .. ("redlock_contend %s %d %d"):format(p, ms, i) end)
    local d_rate, d_wait, d_least, d_most, t_rate, t_wait, t_least, t_most
    if have_node then
      d_rate, d_wait, d_least, d_most = contend(function(i)
        return NODE .. ("contend %s %d %d default"):format(p, ms, i) end)
      t_rate, t_wait, t_least, t_most = contend(function(i)
        return NODE .. ("contend %s %d %d 10"):format(p, ms, i) end)
    end
    row(label .. ": one name, 4 processes: acquisitions/s", o_rate, d_rate, t_rate, "/s", "higher")
    row(label .. ": one name, 4 processes: longest wait, ms", o_wait, d_wait, t_wait, "ms", "lower")
    row(label .. ": one name, 4 processes: fewest / most of one process", o_least .. " / " .. o_most,
        d_least and (d_least .. " / " .. d_most), t_least and (t_least .. " / " .. t_most), "", "none")
  end
end

for _, s in ipairs(servers) do s:stop() end

local function fmt(v)
  if not v then return "-" end          -- nil or false: no peer (node not installed)
  if type(v) == "string" then return v end
  if v >= 100 then return ("%.0f"):format(v) end
  return ("%.2f"):format(v)
end
print(("load average at the start: %s; at the end: %s"):format(load_start, load_avg()))
print(("| %-66s | %12s | %22s | %22s |"):format("Redis lock kinds", "async_mutex",
  "peer (default)", "redlock (10 ms retry)"))
print("|" .. ("-"):rep(68) .. "|" .. ("-"):rep(14) .. "|" .. ("-"):rep(24) .. "|" .. ("-"):rep(24) .. "|")
for _, r in ipairs(rows) do
  local function ratio(peer)
    if r.better == "none" or type(peer) ~= "number" or type(r.ours) ~= "number"
        or peer <= 0 or r.ours <= 0 then
      return fmt(peer)
    end
    local x = r.better == "higher" and r.ours / peer or peer / r.ours
    return ("%s (%.1fx)"):format(fmt(peer), x)
  end
  print(("| %-66s | %12s | %22s | %22s |"):format(r.name, fmt(r.ours), ratio(r.default),
    ratio(r.tuned)))
end
print("(peer: RedisMutex on the RedisRWLock rows, node-redlock 5 with its defaults on the others;"
  .. " x: how many times better async_mutex is on that row, in this run)")
