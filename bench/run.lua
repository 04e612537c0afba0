-- Runs every benchmark in one invocation and prints one table: scenario,
-- parameters, our figure, each peer's figure, and the ratios; then the
-- instruction counts (callgrind) and the project's targets, met or missed.
-- Writes the same figures as the sections "local" and "keyed" of a results
-- file (bench/results.lua), for bench/chart.lua and bench/table.lua.
--
--   make bench                 (builds the module first, then draws the chart)
--   lua5.4 bench/run.lua       (from anywhere; uses ./build as it is)
--
-- BENCH_JSON names the results file (default bench/results/latest.json, or
-- bench/results/quick.json with BENCH_QUICK=1, so that a smoke run never
-- replaces the published figures).
--
-- Peers, each scenario in its own process (bench/scenarios.lua IMPL ...):
--   ours   require "async_mutex" from src/ and build/
--   lua    bench/lua_mutex.lua, the hand-written pure-Lua mutex on luv
--   floor  bench/floor.lua, bare coroutine yield/resume through an idle handle
--   node   async-mutex 0.5.0 on Node (bench/node), when `node` is installed
-- Times are the CPU time of each process unless BENCH_CLOCK=wall (see
-- scenarios.lua).  Progress goes to stderr, the table to stdout.  Set BENCH_QUICK=1 to run
-- every scenario at a tenth of its size (a smoke test; ratios not meaningful).

local LUA = arg[-1] or "lua5.4"
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/bench$") or (here == "bench" and ".") or here .. "/.."
package.path = here .. "/?.lua;" .. package.path
local results = require "results"

local QUICK = os.getenv("BENCH_QUICK") == "1"
-- cpu: the process's CPU time (robust to other processes on the machine);
-- wall: elapsed time.  The scenarios read BENCH_CLOCK themselves.
local CLOCK = os.getenv("BENCH_CLOCK") == "wall" and "wall" or "cpu"
local function size(n) return QUICK and math.max(1, n // 10) or n end
local JSON = os.getenv("BENCH_JSON") or
  (root .. (QUICK and "/bench/results/quick.json" or "/bench/results/latest.json"))

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function progress(...)
  io.stderr:write(...)
  io.stderr:flush()
end

-- Decodes the JSON object a scenario prints (the last one wins).
local function decode(out)
  local result
  for line in out:gmatch("[^\n]+") do
    if line:match("^{.*}$") then
      local ok, r = pcall(results.decode, line)
      result = ok and r or nil
    end
  end
  return result
end

-- The peers that can run here ----------------------------------------------

local notes = {}
local LUA_ENV = "LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
local impls = { "ours", "lua", "floor", "node" }
local available = { lua = true, floor = true }

do
  local out, ok = sh("cd " .. quote(root) .. " && " .. LUA_ENV .. LUA ..
    " -e 'local am = require \"async_mutex\"; assert(am.Mutex and am.Semaphore)'")
  available.ours = ok
  if not ok then
    notes[#notes + 1] = "ours: not run, `require \"async_mutex\"` failed (run `make` first): "
      .. (out:match("[^\n]+") or "")
  end
end

local NODE_DIR = root .. "/bench/node"
do
  local _, has_node = sh("command -v node")
  if not has_node then
    notes[#notes + 1] = "Node column skipped: `node` is not installed " ..
      "(apt-get install nodejs npm, then run again)."
  else
    local installed = io.open(NODE_DIR .. "/node_modules/async-mutex/package.json")
    local version = installed and installed:read("a"):match('"version"%s*:%s*"([^"]+)"')
    if installed then installed:close() end
    local ok = version == "0.5.0"
    if not ok then
      progress("installing async-mutex 0.5.0 with npm ci ...\n")
      local out
      out, ok = sh("cd " .. quote(NODE_DIR) ..
        " && npm ci --no-audit --no-fund --loglevel=error")
      if not ok then
        notes[#notes + 1] = "Node column skipped: `npm ci` failed in bench/node: " ..
          (out:match("[^\n]+") or "")
      end
    end
    available.node = ok
  end
end

-- Running the scenarios -------------------------------------------------------

local function command(impl, scenario, args)
  if impl == "node" then
    local flags = CLOCK == "cpu" and "--expose-gc --single-threaded-gc" or "--expose-gc"
    return "cd " .. quote(NODE_DIR) .. " && node " .. flags .. " scenarios.js " ..
      scenario .. " " .. args
  end
  return "cd " .. quote(root) .. " && " .. LUA_ENV .. LUA ..
    " bench/scenarios.lua " .. impl .. " " .. scenario .. " " .. args
end

local failures = {}

-- Runs `scenario args` on `impl` `reps` times; keeps the run with the lowest
-- value of `key` (machines are noisy: the best run is the least disturbed).
local function run(impl, scenario, args, reps, key)
  if not available[impl] then return nil end
  progress(("  %-5s %-11s %-20s"):format(impl, scenario, args))
  local best
  for _ = 1, reps or 1 do
    local out = sh(command(impl, scenario, args))
    local r = decode(out)
    if not r then
      failures[#failures + 1] = ("%s %s %s failed:\n%s"):format(impl, scenario, args,
        out:sub(-800))
      progress(" FAILED\n")
      return nil
    end
    if key and type(r[key]) ~= "number" then
      failures[#failures + 1] = ("%s %s %s: no %s in %s"):format(impl, scenario, args, key, out)
      progress(" FAILED\n")
      return nil
    end
    if not best or (key and r[key] < best[key]) then best = r end
  end
  progress(" done\n")
  return best
end

-- Runs one scenario on every peer: returns { ours = r, lua = r, ... }.
local function loadavg()
  local f = io.open("/proc/loadavg")
  local v = f and f:read("l"):match("^(%S+)")
  if f then f:close() end
  return tonumber(v)
end
local load_before = loadavg()
local t_start = os.time()
progress("bench: one process per scenario and peer", QUICK and " (BENCH_QUICK)" or "", "\n")

local N1M, N100K, N10K = size(1000000), size(100000), size(10000)
-- Each job: result name, scenario, arguments, runs of the Lua peers, the
-- key whose lowest value picks the best run, runs of Node.  Repeated runs
-- are spread over rounds through all the jobs rather than made back to
-- back, so a burst of load from a neighbour spoils one run of several
-- scenarios rather than every run of one.  The `before` jobs create their
-- coroutines before the clock (the lock alone): Node has no such run, and
-- their figures are never compared with Node's.
local JOBS = {
  { "uncontended", "uncontended", tostring(N1M), 3, "acquire_ns", 1 },
  { "handoff", "handoff", ("%d 100 fresh"):format(size(1000)), 3, "ns", 3 },
  { "chain", "chain", tostring(N100K), 3, "ms", 1 },
  { "timeout10k", "timeout", N10K .. " 50", 3, "work_ms", 3 },
  { "timeout10k_before", "timeout", N10K .. " 50 before", 3, "work_ms", 0 },
  { "timeout100k", "timeout", N100K .. " 50", 3, "work_ms", 1 },
  { "timeout100k_before", "timeout", N100K .. " 50 before", 3, "work_ms", 0 },
  { "cancel", "cancel", tostring(N100K), 3, "cancel_ms", 1 },
  { "cancel_before", "cancel", N100K .. " before", 3, "enqueue_ms", 0 },
  { "priority10k", "priority", tostring(N10K), 3, "enqueue_ns", 3 },
  { "priority10k_before", "priority", N10K .. " before", 3, "enqueue_ns", 0 },
  { "priority100k", "priority", tostring(N100K), 3, "enqueue_ns", 1 },
  { "priority100k_before", "priority", N100K .. " before", 3, "enqueue_ns", 0 },
  { "semaphore", "semaphore", N10K .. " 16", 3, "ms", 3 },
  { "memory", "memory", tostring(N100K), 1, nil, 1 },
}
local R, failed = {}, {}
for round = 1, 3 do
  for _, job in ipairs(JOBS) do
    local name, scenario, args, reps, key, node_reps = table.unpack(job, 1, 6)
    local res = R[name] or {}
    R[name] = res
    for _, impl in ipairs(impls) do
      local id = name .. " " .. impl
      if round <= (impl == "node" and node_reps or reps) and not failed[id] then
        local r = run(impl, scenario, args, 1, key)
        if r == nil then failed[id] = available[impl]
        elseif not res[impl] or (key and r[key] < res[impl][key]) then res[impl] = r end
      end
    end
  end
end
R.memory.node_bare = run("node", "memory", N100K .. " bare")

-- callgrind: instructions for one pair / one hand-off, from runs of n and 2n.
local CG = {}
local has_valgrind = select(2, sh("command -v valgrind"))
if not has_valgrind then
  notes[#notes + 1] = "callgrind skipped: valgrind is not installed (apt-get install valgrind)."
else
  local function instructions(impl, scenario, args)
    local file = os.tmpname()
    local cmd = "cd " .. quote(root) .. " && " .. LUA_ENV ..
      "valgrind --tool=callgrind --callgrind-out-file=" .. quote(file) .. " " ..
      LUA .. " bench/scenarios.lua " .. impl .. " " .. scenario .. " " .. args
    local out = sh(cmd)
    local f = io.open(file)
    local text = f and f:read("a") or ""
    if f then f:close() end
    os.remove(file)
    local total = tonumber(text:match("\nsummary: (%d+)") or text:match("\ntotals: (%d+)"))
    if not total then
      failures[#failures + 1] = ("callgrind %s %s %s failed:\n%s"):format(impl,
        scenario, args, out:sub(-800))
    end
    return total
  end
  local function per_op(impl, scenario, make_args, n)
    if not available[impl] then return nil end
    progress(("  %-5s callgrind %-9s"):format(impl, scenario))
    local a = instructions(impl, scenario, make_args(n))
    local b = instructions(impl, scenario, make_args(2 * n))
    progress(" done\n")
    return a and b and (b - a) / n
  end
  local NP, NH = size(50000), size(20000)
  for _, impl in ipairs { "ours", "lua", "floor" } do
    CG[impl] = {
      pair = per_op(impl, "pairs", function(n) return tostring(n) end, NP),
      handoff = per_op(impl, "handoff", function(n) return ("10 %d"):format(n // 10) end, NH),
    }
  end
  -- the floor with fresh releasers runs after a bare run in the same process
  local both = per_op("floor", "handoff", function(n) return ("10 %d fresh"):format(n // 10) end, NH)
  CG.floor.handoff_fresh = both and CG.floor.handoff and both - CG.floor.handoff
end

-- The rows ------------------------------------------------------------------------

local function get(res, impl, key)
  local r = res and res[impl]
  return r and r[key]
end

local function ratio(a, b)                 -- a / b, or nil
  if a == nil or b == nil or b == 0 then return nil end
  return a / b
end

local fmt, fmt_ratio = results.fmt, results.fmt_ratio

local function read_first(cmd)
  return (sh(cmd):match("[^\n]+") or "?")
end

local section = {
  name = "local", driver = "bench/run.lua",
  title = "async_mutex against a pure-Lua mutex, the floor and async-mutex on Node",
  clock = CLOCK, quick = QUICK,
  peers = { { id = "ours", label = "ours", color = "#0b5394" },
            { id = "lua", label = "pure Lua", color = "#e69138" },
            { id = "floor", label = "floor", color = "#999999" },
            { id = "node", label = "Node async-mutex", color = "#6aa84f" } },
  -- peer / ours: higher is better for us; ours / floor: our cost over the floor's
  ratios = { { label = "Lua/ours", num = "lua", den = "ours" },
             { label = "Node/ours", num = "node", den = "ours" },
             { label = "ours/floor", num = "ours", den = "floor" } },
  units = { ns = "Time per operation", ms = "Time per run of the scenario",
            B = "Memory per waiting coroutine, beyond a bare one" },
  rows = {}, notes = notes, targets = {},
}

-- One row.  values: { ours =, lua =, floor =, node = }; opts.cost: lower is
-- better, the ratio columns apply; opts.chart: bench/chart.lua draws it,
-- labelled opts.label.
local function row(scenario, params, metric, unit, values, opts)
  opts = opts or {}
  section.rows[#section.rows + 1] = results.add_ratios(section, {
    scenario = scenario, params = params, metric = metric, unit = unit,
    values = values, cost = opts.cost or false, chart = opts.chart or nil,
    label = opts.label })
end
local COST, CHART = { cost = true }, function(label) return { cost = true, chart = true, label = label } end

local function pick(res, key)
  return { ours = get(res, "ours", key), lua = get(res, "lua", key),
           floor = get(res, "floor", key), node = get(res, "node", key) }
end

-- The lock alone (coroutines made before the clock): the Lua peers only.
-- Node has no such figure, and no Node figure is ever set beside one.
local function lock_only(res, key)
  local v = pick(res, key)
  v.node = nil
  return v
end

-- Total time at the big size over total time at the small size.
local function growth(big, small, key, per_item)
  local k = per_item and N100K / N10K or 1
  local v = {}
  for _, impl in ipairs(impls) do
    local r = ratio(get(big, impl, key), get(small, impl, key))
    v[impl] = r and r * k
  end
  return v
end

local BEFORE = ", coroutines made beforehand"
row("1 uncontended", N1M .. " x", "acquire + release", "ns", pick(R.uncontended, "acquire_ns"),
    CHART("1 uncontended\nacquire + release"))
row("1 uncontended", N1M .. " x", "runExclusive(noop)", "ns", pick(R.uncontended, "run_ns"),
    CHART("1 uncontended\nrunExclusive"))
row("1 uncontended", N1M .. " x", "floor + a fresh releaser object", "ns",
    { floor = get(R.uncontended, "floor", "fresh_releaser_ns") })
local handoff_params = ("%d co x 100 cycles"):format(size(1000))
row("2 hand-off", handoff_params, "per hand-off", "ns", pick(R.handoff, "ns"),
    CHART(("2 hand-off\n%d coroutines"):format(size(1000))))
row("2 hand-off", handoff_params, "floor + a fresh releaser per wait", "ns",
    { floor = get(R.handoff, "floor", "fresh_releaser_ns") })
row("2 hand-off", handoff_params, "acquires that waited", "%", pick(R.handoff, "waited_pct"))
row("3 chain", N100K .. " queued", "release -> last through", "ms", pick(R.chain, "ms"),
    CHART(("3 chain\n%d queued"):format(N100K)))
for _, t in ipairs { { R.timeout10k, R.timeout10k_before, N10K },
                     { R.timeout100k, R.timeout100k_before, N100K } } do
  local params = t[3] .. " x 50 ms"
  if t[3] == N100K then
    row("4 timeouts", params, "spawn + enqueue", "ms", pick(t[1], "enqueue_ms"), COST)
    row("4 timeouts", params, "first -> last raise", "ms", pick(t[1], "expire_ms"), COST)
  end
  row("4 timeouts", params, "work = spawn + enqueue + expiry", "ms", pick(t[1], "work_ms"),
      t[3] == N100K and CHART(("4 timeouts, %d\nspawn + enqueue + expiry"):format(N100K)) or COST)
  if t[3] == N100K then
    row("4 timeouts", params, "enqueue" .. BEFORE, "ms", lock_only(t[2], "enqueue_ms"), COST)
  end
  row("4 timeouts", params, "enqueue + expiry" .. BEFORE, "ms", lock_only(t[2], "work_ms"), COST)
end
local sizes = ("%d / %d"):format(N100K, N10K)
row("4 timeouts", sizes, "work time growth", "x", growth(R.timeout100k, R.timeout10k, "work_ms"))
local g = growth(R.timeout100k_before, R.timeout10k_before, "work_ms")
g.node = nil
row("4 timeouts", sizes, "work time growth" .. BEFORE, "x", g)
row("5 cancel", N100K .. " waiters", "spawn + enqueue", "ms", pick(R.cancel, "enqueue_ms"), COST)
row("5 cancel", N100K .. " waiters", "cancel() -> last raise", "ms", pick(R.cancel, "cancel_ms"),
    CHART(("5 cancel\n%d waiters"):format(N100K)))
row("5 cancel", N100K .. " waiters", "enqueue" .. BEFORE, "ms", lock_only(R.cancel_before, "enqueue_ms"),
    COST)
for _, t in ipairs { { R.priority10k, R.priority10k_before, N10K },
                     { R.priority100k, R.priority100k_before, N100K } } do
  local params = t[3] .. ", prio 1..1000"
  local big = t[3] == N100K
  row("6 priorities", params, "spawn + enqueue per waiter", "ns", pick(t[1], "enqueue_ns"),
      big and CHART(("6 priorities, %d\nspawn + enqueue"):format(N100K)) or COST)
  if big then
    row("6 priorities", params, "drain per waiter", "ns", pick(t[1], "drain_ns"),
        CHART(("6 priorities, %d\ndrain"):format(N100K)))
  end
  row("6 priorities", params, "enqueue per waiter" .. BEFORE, "ns", lock_only(t[2], "enqueue_ns"), COST)
end
row("6 priorities", sizes, "enqueue time growth", "x",
  growth(R.priority100k, R.priority10k, "enqueue_ns", true))
g = growth(R.priority100k_before, R.priority10k_before, "enqueue_ns", true)
g.node = nil
row("6 priorities", sizes, "enqueue time growth" .. BEFORE, "x", g)
row("7 semaphore", N10K .. " co, w 1..8 of 16", "release -> last through", "ms", pick(R.semaphore, "ms"),
    CHART(("7 semaphore\n%d waiters"):format(N10K)))

-- Memory beyond a bare suspended coroutine (Node: an async function awaiting
-- a promise never settled), which the floor measures: both sides subtract
-- the cost of their own task.
local mem = R.memory
local function beyond(key)
  local bare = get(mem, "floor", key)
  return {
    ours = bare and get(mem, "ours", key) and get(mem, "ours", key) - bare,
    lua = bare and get(mem, "lua", key) and get(mem, "lua", key) - bare,
    node = mem.node and mem.node_bare and mem.node[key] - mem.node_bare[key],
  }
end
local function bare(key)
  return { floor = get(mem, "floor", key), node = mem.node_bare and mem.node_bare[key] }
end
local mem_params = N100K .. " waiters"
row("8 memory", mem_params, "heap per waiter beyond a bare coroutine", "B", beyond("heap_b"),
    CHART("8 memory\nheap per waiter"))
row("8 memory", mem_params, "RSS per waiter beyond a bare coroutine", "B", beyond("rss_b"),
    CHART("8 memory\nRSS per waiter"))
row("8 memory", mem_params, "heap of a bare suspended coroutine", "B", bare("heap_b"))
row("8 memory", mem_params, "RSS of the process", "MB", pick(mem, "rss_mb"))
if has_valgrind then
  local function cg(key)
    return { ours = CG.ours and CG.ours[key], lua = CG.lua and CG.lua[key],
             floor = CG.floor and CG.floor[key] }
  end
  row("callgrind", "n vs 2n runs", "instr. per uncontended pair", "Ir", cg("pair"), COST)
  row("callgrind", "10 co, n vs 2n", "instr. per hand-off", "Ir", cg("handoff"), COST)
  row("callgrind", "10 co, n vs 2n", "floor + a fresh releaser per wait", "Ir",
      { floor = CG.floor and CG.floor.handoff_fresh })
end

section.legend = {
  CLOCK == "cpu"
    and "Times are CPU time of the process (BENCH_CLOCK=cpu; Node with --single-threaded-gc);"
      .. " BENCH_CLOCK=wall for elapsed time."
    or "Times are elapsed (wall-clock) time (BENCH_CLOCK=wall).",
  "Ratios: peer / ours (higher is better for us); ours/floor: our cost over the floor's.",
  "floor: bare coroutine.yield/resume through one luv idle handle, no lock; in 1, the same",
  "two C calls (method + returned function) with no lock; in 4, no timers; in 8, a bare",
  "suspended coroutine (Node: an async function awaiting a never-settled promise).",
  "Equal work: a ratio against a peer times the same work on both sides. \"spawn\" rows create",
  "each waiter in the timed loop (Lua: coroutine.create + resume; Node: calling the async",
  "function), on every side. Rows \"coroutines made beforehand\" time the lock alone (coroutines",
  "created before the clock) and are compared with the pure-Lua mutex and the floor only.",
}

-- The header ------------------------------------------------------------------------

local cpu = read_first("grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'")
section.date = os.date("%Y-%m-%d %H:%M")
section.machine = {
  cpu = cpu, cores = tonumber(read_first("nproc")),
  lua = read_first(LUA .. " -v"):match("^Lua [%d.]+") or LUA,
  luv = read_first(LUA .. " -e 'print(require(\"luv\").version_string())'"),
  node = available.node and read_first("node --version") or nil,
}
section.sizes = QUICK and "BENCH_QUICK: sizes / 10" or "full"
local m = section.machine
print(("async_mutex benchmarks, %s, %s x %s cores, %s, luv %s, %s%s"):format(section.date,
  m.cpu, m.cores, m.lua, m.luv, m.node and ("Node " .. m.node) or "no Node",
  QUICK and " (BENCH_QUICK: sizes / 10)" or ""))

-- Targets ----------------------------------------------------------------------

local function target(name, value, ok, detail)
  local verdict = value == nil and "not measured" or (ok and "met" or "MISSED")
  section.targets[#section.targets + 1] = { verdict = verdict, name = name, detail = detail }
end
local function vs(res, key, impl)
  return ratio(get(res, impl, key), get(res, "ours", key))
end
-- A ratio target; where the floor itself cannot reach it (peer / floor <
-- want), no lock can: say so, with the figure that shows it.
-- 'fresh': the floor's key for the same work plus the object every grant
-- must hand out, a tighter bound where there is one.
local function check_ratio(name, res, key, peer, want, what, fresh)
  local r = vs(res, key, peer)
  local detail = ("%s = %s (want >= %dx)"):format(what, fmt_ratio(r), want)
  local bound = ratio(get(res, peer, key), get(res, "floor", key))
  local fresh_bound = fresh and ratio(get(res, peer, key), get(res, "floor", fresh))
  if r and bound and bound < want then
    detail = detail .. (("; out of reach here: the floor (no lock) is only %s"):format(
      fmt_ratio(bound)))
  elseif r and fresh_bound and fresh_bound < want then
    detail = detail .. (("; out of reach here: the floor making a fresh releaser " ..
      "object (no lock) is only %s"):format(fmt_ratio(fresh_bound)))
  end
  target(name, r, r and r >= want, detail)
end

check_ratio("uncontended vs Node", R.uncontended, "acquire_ns", "node", 30, "Node/ours",
            "fresh_releaser_ns")
check_ratio("uncontended vs pure Lua", R.uncontended, "acquire_ns", "lua", 5, "Lua/ours",
            "fresh_releaser_ns")
check_ratio("runExclusive vs Node", R.uncontended, "run_ns", "node", 20, "Node/ours")
check_ratio("hand-off vs Node", R.handoff, "ns", "node", 15, "Node/ours", "fresh_releaser_ns")
do
  local r = ratio(get(R.handoff, "ours", "ns"), get(R.handoff, "floor", "ns"))
  local fresh = ratio(get(R.handoff, "floor", "fresh_releaser_ns"), get(R.handoff, "floor", "ns"))
  local detail = ("ours/floor = %s per resume (want <= 1.5x); callgrind: %s"):format(
    fmt_ratio(r), fmt_ratio(CG.ours and CG.floor and ratio(CG.ours.handoff, CG.floor.handoff)))
  if r and r > 1.5 and fresh and fresh > 1.5 then
    detail = detail .. ("; out of reach here: the floor handing out a fresh releaser " ..
      "per wait (no lock) is already %s"):format(fmt_ratio(fresh))
  end
  target("hand-off vs floor", r, r and r <= 1.5, detail)
  local w = get(R.handoff, "ours", "waited_pct")
  target("hand-off: every acquire waits", w, w == 100, ("%s waited"):format(fmt(w, "%")))
end
check_ratio("100k chain vs Node", R.chain, "ms", "node", 20, "Node/ours")
check_ratio("100k timeouts vs Node", R.timeout100k, "work_ms", "node", 10,
  "Node/ours (spawn + enqueue + expiry)")
do
  local g100 = ratio(get(R.timeout100k_before, "ours", "work_ms"),
                     get(R.timeout10k_before, "ours", "work_ms"))
  target("timeouts growth", g100, g100 and g100 <= 12,
    ("100k/10k = %s (want <= 12x; coroutines made beforehand)"):format(fmt_ratio(g100)))
end
check_ratio("cancel of 100k vs Node", R.cancel, "cancel_ms", "node", 5, "Node/ours")
do
  local big, small = get(R.priority100k_before, "ours", "enqueue_ns"),
                     get(R.priority10k_before, "ours", "enqueue_ns")
  local gp = big and small and ratio(big * N100K, small * N10K)
  target("priority insertion growth", gp, gp and gp <= 12,
    ("time 100k/10k = %s (want <= 12x; coroutines made beforehand)"):format(fmt_ratio(gp)))
end
do
  local b = beyond("heap_b").ours
  target("memory per waiter", b, b and b <= 128,
    ("%s B beyond a bare coroutine (want <= 128 B); RSS: %s B"):format(fmt(b, "B"),
      fmt(beyond("rss_b").ours, "B")))
end

-- Keyed locks: ours against a map of Mutexes kept by hand.
local keyed
do
  local n = size(1000000)
  progress("  keyed locks\n")
  local out, ok = sh("cd " .. quote(root) .. " && " .. LUA_ENV .. LUA .. " bench/keyed.lua " .. n)
  local k = ok and decode(out)
  if not k then
    failures[#failures + 1] = "keyed locks: the run failed:\n" .. tostring(out):sub(-800)
  else
    keyed = {
      name = "keyed", driver = "bench/run.lua", date = section.date, machine = section.machine,
      clock = "cpu", quick = QUICK,
      title = ("Keyed locks: KeyedMutex against a Lua table of Mutex by key, kept by hand "
        .. "(dropped when unlocked)"),
      peers = { { id = "keyed", label = "KeyedMutex" }, { id = "hand", label = "by hand" } },
      ratios = { { label = "hand/keyed", num = "hand", den = "keyed" } },
      rows = {}, notes = {}, targets = {},
    }
    local live = math.min(n, 100000)
    for _, m_ in ipairs { { "distinct keys", n .. " keys", "lock + unlock", "ns", "distinct_ns" },
                          { "one key", n .. " x", "lock + unlock", "ns", "same_ns" },
                          { "live keys", live .. " keys held",
                            "memory per live key, with its releaser", "B", "live_b" } } do
      keyed.rows[#keyed.rows + 1] = results.add_ratios(keyed, {
        scenario = m_[1], params = m_[2], metric = m_[3], unit = m_[4], cost = true,
        values = { keyed = k["keyed_" .. m_[5]], hand = k["hand_" .. m_[5]] } })
    end
  end
end

-- The report ----------------------------------------------------------------------

local load_after = loadavg()
section.load = { before = load_before, after = load_after }
if keyed then keyed.load = section.load end
if load_before and load_after then
  print(("Load average (1 min) before the run %.2f, after %.2f: this run itself keeps one of %s cores busy;")
    :format(load_before, load_after, m.cores))
  print("more than that means other processes competed with it (CPU time is less affected than")
  print("elapsed time, but shared caches still are).")
end
print()
print(results.markdown(section))
print()
for _, l in ipairs(section.legend) do print(l) end
for _, n in ipairs(notes) do print("NOTE: " .. n) end
if keyed then
  print()
  print(keyed.title .. ":")
  print(results.markdown(keyed))
end
print()
print("Targets (ours):")
for _, t in ipairs(section.targets) do
  print(("  %-12s %s: %s"):format(t.verdict, t.name, t.detail))
end
if #failures > 0 then
  print()
  print("FAILED RUNS:")
  for _, f in ipairs(failures) do print(f) end
end
section.failures = failures
results.save(JSON, section)
if keyed then results.save(JSON, keyed) end
print()
print("Results written to " .. JSON)
progress(("bench: done in %d s\n"):format(os.time() - t_start))
os.exit(#failures == 0)
