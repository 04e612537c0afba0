-- Optimistic concurrency on Redis against the two other ways to do a
-- read-modify-write there: Redis's own optimistic transaction (WATCH, GET,
-- MULTI, SET, EXEC on a connection of its own per coroutine) and a lock
-- (SET key NX PX, then GET and SET, then a compare-and-delete script), and
-- the module's am.RedisMutex where this checkout has it.
-- Each run: 4 processes x 50 coroutines (and, for round trips alone, x 1),
-- each incrementing counters drawn at random from K keys, K = 1 (every
-- writer on one hot key) up to 1,000.
-- Reports the wall time per increment and the retries per increment of
-- each approach, checks that no increment was lost, and writes the section
-- "optimistic" of its own results file, bench/results/optimistic.json
-- (bench/results.lua's format), and from it the chart docs/optimistic.svg
-- (bench/chart.lua; gnuplot).
--
--   lua5.4 bench/optimistic.lua            (from the repository root, with
--                                           `make bench`'s LUA_PATH/LUA_CPATH)
--   BENCH_QUICK=1 lua5.4 bench/optimistic.lua    (1 and 1,000 keys, fewer
--                                           increments: a smoke run, ~25 s)
--   BENCH_ROUNDS=N                          (rounds; default 3, quick 1)
--
-- Each approach retries with the same loop, am.optimistic with its default
-- backoff (1 ms doubling to 100 ms, full jitter), and no bound on attempts:
-- a refused versioned write, an aborted EXEC and a lock held by someone else
-- are all "try again later".  A redis-server is started on a free loopback
-- port for the run and stopped at the end.  Timing is wall-clock from a
-- start signal all workers wait for (uv.hrtime, the same monotonic clock in
-- every process) to the last worker's end: the work is spread over 5
-- processes and a server on 2 cores, so CPU time would miss most of it.

local uv = require "luv"

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/bench$") or (here == "bench" and ".") or here .. "/.."

local PROCS = 4
local QUICK = os.getenv("BENCH_QUICK") == "1"
-- The cases: { keys, coroutines per process, increments per coroutine }.
-- 4 x 50 writers pipeline their calls on each process's connection, so the
-- CPU (of the server and of the clients) limits them; 4 x 1 writers wait
-- for each reply, so round trips do.
local CASES = QUICK and {
  { 1, 50, 10 }, { 1000, 50, 50 }, { 1000, 1, 200 },
} or {
  { 1, 50, 10 }, { 10, 50, 20 }, { 100, 50, 50 }, { 1000, 50, 100 },
  { 1, 1, 250 }, { 1000, 1, 500 },
}
-- rounds through every approach and key set; each figure is the best round
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS") or "") or (QUICK and 1 or 3)
local APPROACHES = { "optimistic", "watch", "lock" }
local LABELS = { optimistic = "versioned:update", watch = "WATCH/MULTI/EXEC",
  lock = "SET NX lock", redismutex = "RedisMutex" }
-- The module's own Redis lock, where this checkout has it.
local HAS_REDIS_MUTEX = (function()
  local ok, am = pcall(require, "async_mutex")
  return ok and type(am.RedisMutex) == "table"
end)()
if HAS_REDIS_MUTEX then APPROACHES[#APPROACHES + 1] = "redismutex" end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

--- Runs fn in a coroutine and the loop until it is idle; returns fn's results.
local function run(fn, ...)
  local res
  coroutine.wrap(function(...) res = table.pack(fn(...)) end)(...)
  uv.run()
  return table.unpack(res, 1, res.n)
end

--- Suspends the running coroutine for ms milliseconds.
local function sleep(ms)
  local co = coroutine.running()
  local t = uv.new_timer()
  t:start(ms, 0, function() t:close(); assert(coroutine.resume(co)) end)
  coroutine.yield()
end


-- {========================================================== a worker
-- lua5.4 bench/optimistic.lua worker PORT APPROACH KEYS COROUTINES PER RUN
-- Prints "started_ns ended_ns increments attempts".

local function worker(port, approach, keys, coroutines, per, runid)
  local am = require "async_mutex"
  local redis = require "async_mutex.redis"
  port, keys, per = tonumber(port), tonumber(keys), tonumber(per)
  coroutines = tonumber(coroutines)
  local shared = redis.connect({ port = port })
  local prefix = ("bench:%s:%s:"):format(runid, approach)
  local forever = { maxAttempts = math.huge }
  local attempts, increments = 0, 0

  local increment = {}

  function increment.optimistic(_, key)
    redis.versioned(shared, key):update(function(value)
      attempts = attempts + 1
      return (tonumber(value) or 0) + 1
    end, forever)
  end

  -- WATCH is a property of the connection: each coroutine has its own.
  function increment.watch(c, key)
    am.optimistic(function()
      attempts = attempts + 1
      c:call("WATCH", key)
      local v = tonumber(c:call("GET", key)) or 0
      c:call("MULTI")
      c:call("SET", key, v + 1)
      return c:call("EXEC") ~= nil             -- nil: aborted, the key changed
    end, forever)
  end

  local UNLOCK = [[
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
]]
  local token_count = 0
  function increment.lock(_, key)
    token_count = token_count + 1
    local token = ("%d:%d"):format(uv.os_getpid(), token_count)
    local lock = "lock:" .. key
    am.optimistic(function()
      attempts = attempts + 1
      return shared:call("SET", lock, token, "NX", "PX", 10000) ~= nil
    end, forever)
    local v = tonumber(shared:call("GET", key)) or 0
    shared:call("SET", key, v + 1)
    shared:eval(UNLOCK, { lock }, { token })
  end

  -- am.RedisMutex: a FIFO queue in Redis, hand-off by pub/sub, no retries
  local mutexes = {}
  function increment.redismutex(_, key)
    local m = mutexes[key]
    if not m then
      m = am.RedisMutex.new(shared, "benchlock:" .. key)
      mutexes[key] = m
    end
    attempts = attempts + 1
    local release <close> = m:acquire()
    local v = tonumber(shared:call("GET", key)) or 0
    shared:call("SET", key, v + 1)
  end

  local started, ended
  run(function()
    -- the start signal: every worker polls it, so they all begin together
    shared:call("INCR", prefix .. "ready")
    while shared:call("GET", prefix .. "go") == nil do sleep(1) end
  end)
  started = uv.hrtime()
  local conns = {}
  for _ = 1, coroutines do
    coroutine.wrap(function()
      local c = shared
      if approach == "watch" then
        c = redis.connect({ port = port })
        conns[#conns + 1] = c
      end
      for _ = 1, per do
        increment[approach](c, prefix .. math.random(keys))
        increments = increments + 1
      end
      ended = uv.hrtime()
    end)()
  end
  uv.run()
  for _, c in ipairs(conns) do c:close() end
  shared:close()
  uv.run()
  print(("%d %d %d %d"):format(started, ended, increments, attempts))
end

if arg[1] == "worker" then return worker(table.unpack(arg, 2)) end

-- }==========================================================


-- {========================================================== the driver
package.path = here .. "/?.lua;" .. package.path
local results = require "results"
local redis = require "async_mutex.redis"

-- Its own results file (bench/results.lua's format, this section alone),
-- from which bench/chart.lua draws the chart; a smoke run writes beside it.
local JSON = root .. (QUICK and "/bench/results/optimistic-quick.json"
  or "/bench/results/optimistic.json")
local SVG = root .. (QUICK and "/bench/results/optimistic-quick.svg" or "/docs/optimistic.svg")
local LUA = arg[-1] or "lua5.4"

local function progress(...) io.stderr:write(...); io.stderr:flush() end

local function free_port()
  local tcp = uv.new_tcp()
  assert(tcp:bind("127.0.0.1", 0))
  local port = tcp:getsockname().port
  tcp:close()
  uv.run("nowait")
  return port
end

local dir = sh("mktemp -d /tmp/am-bench-optimistic-XXXXXX"):gsub("\n$", "")
local port = free_port()
assert(select(2, sh(("redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no"
  .. " --daemonize yes --pidfile %s/redis.pid --logfile %s/redis.log --dir %s"
  .. " --maxclients 10000"):format(port, dir, dir, dir))), "cannot start redis-server")
local function stop_server()
  sh(("kill $(cat %s/redis.pid) 2>/dev/null; rm -rf %s"):format(dir, dir))
end

local client = redis.connect({ port = port })
assert(run(function()
  for _ = 1, 500 do                       -- until the server answers (5 s)
    local ok, pong = pcall(client.call, client, "PING")
    if ok then return pong end
    sleep(10)
  end
end) == "PONG", "redis-server does not answer")

--- One run: PROCS workers of `approach` for a case; returns
-- { ms, us (per increment), retries (per increment), lost }.
local function measure(approach, case, runid)
  local keys, coroutines, per = case[1], case[2], case[3]
  local prefix = ("bench:%s:%s:"):format(runid, approach)
  local workers = {}
  for i = 1, PROCS do
    workers[i] = assert(io.popen(("%s %s/optimistic.lua worker %d %s %d %d %d %s"):format(
      LUA, here, port, approach, keys, coroutines, per, runid)))
  end
  run(function()
    while tonumber(client:call("GET", prefix .. "ready") or 0) < PROCS do sleep(1) end
    client:call("SET", prefix .. "go", "1")
  end)
  local first, last, increments, attempts = math.huge, 0, 0, 0
  for i = 1, PROCS do
    local out = workers[i]:read("a")
    assert(workers[i]:close(), approach .. " worker failed")
    local s, e, n, a = out:match("^(%d+) (%d+) (%d+) (%d+)\n$")
    assert(s, "worker output: " .. out)
    first, last = math.min(first, tonumber(s)), math.max(last, tonumber(e))
    increments, attempts = increments + tonumber(n), attempts + tonumber(a)
  end
  -- no increment lost: the counters add up to the increments made
  local total = run(function()
    local sum = 0
    for k = 1, keys do
      local key = prefix .. k
      local v = approach == "optimistic" and client:call("HGET", key, "value")
        or client:call("GET", key)
      sum = sum + (tonumber(v) or 0)
    end
    return sum
  end)
  local ms = (last - first) / 1e6
  return { ms = ms, us = ms * 1000 / increments, retries = attempts / increments - 1,
    lost = increments - total }
end

--- The 1-minute load average (Linux), or nil.
local function loadavg()
  local f = io.open("/proc/loadavg")
  if not f then return nil end
  local l = tonumber(f:read("a"):match("^(%S+)"))
  f:close()
  return l
end

local t0 = os.time()
local load_before = loadavg()
local runid = tostring(uv.hrtime())
local section = {
  name = "optimistic", driver = "bench/optimistic.lua", quick = QUICK, clock = "wall",
  date = os.date("%Y-%m-%d %H:%M"),
  title = ("Read-modify-write of a Redis counter: %d processes x C coroutines x N "
    .. "increments of counters drawn from K keys; best of %d round%s"):format(PROCS,
    ROUNDS, ROUNDS == 1 and "" or "s"),
  peers = {}, rows = {}, notes = {}, targets = {},
  ratios = {
    { label = "WATCH/update", num = "watch", den = "optimistic" },
    { label = "lock/update", num = "lock", den = "optimistic" },
    HAS_REDIS_MUTEX and { label = "RedisMutex/update", num = "redismutex", den = "optimistic" }
      or nil,
  },
  units = { us = "wall time per increment" },
}
for _, a in ipairs(APPROACHES) do section.peers[#section.peers + 1] = { id = a, label = LABELS[a] } end

local lost = 0
local best = {}                            -- best[case][approach] = run
for round = 1, ROUNDS do
  for _, case in ipairs(CASES) do
    best[case] = best[case] or {}
    for _, approach in ipairs(APPROACHES) do
      progress(("  round %d: %-10s %4d keys, %d x %2d writers ... "):format(round, approach,
        case[1], PROCS, case[2]))
      local r = measure(approach, case, ("%s:%d:%d:%d"):format(runid, round, case[1], case[2]))
      progress(("%.0f ms, %.1f us per increment, %.2f retries per increment%s\n"):format(
        r.ms, r.us, r.retries, r.lost ~= 0 and (", LOST " .. r.lost) or ""))
      lost = lost + math.abs(r.lost)
      local b = best[case][approach]
      if not b or r.us < b.us then best[case][approach] = r end
    end
  end
end
for _, case in ipairs(CASES) do
  local time, retries = {}, {}
  for _, approach in ipairs(APPROACHES) do
    time[approach], retries[approach] = best[case][approach].us, best[case][approach].retries
  end
  local scenario = ("%d key%s, %d writers"):format(case[1], case[1] == 1 and "" or "s",
    PROCS * case[2])
  local params = ("%d x %d x %d"):format(PROCS, case[2], case[3])
  section.rows[#section.rows + 1] = results.add_ratios(section, {
    scenario = scenario, params = params, metric = "per increment",
    unit = "us", cost = true, chart = true, values = time })
  section.rows[#section.rows + 1] = {
    scenario = scenario, params = params, metric = "retries per increment",
    unit = "x", values = retries }
end
client:close()
uv.run()
stop_server()
section.load = { before = load_before, after = loadavg() }

local t1000                               -- 1,000 keys, 200 writers
for _, row in ipairs(section.rows) do
  if row.cost and row.scenario == "1000 keys, 200 writers" then t1000 = row end
end
local function target(name, ratio, want)
  section.targets[#section.targets + 1] = {
    verdict = ratio and ratio >= want and "met" or "missed", name = name,
    detail = ("%s (want >= %.1fx)"):format(results.fmt_ratio(ratio), want) }
end
target("1,000 keys: update vs a SET NX lock", t1000.ratios["lock/update"], 2)
if HAS_REDIS_MUTEX then
  target("1,000 keys: update vs RedisMutex", t1000.ratios["RedisMutex/update"], 2)
end
target("1,000 keys: update vs WATCH/MULTI", t1000.ratios["WATCH/update"], 1.5)
if lost > 0 then section.notes[#section.notes + 1] = ("%d increments LOST"):format(lost) end

if section.load.before and section.load.after then
  print(("Load average (1 min) before the run %.2f, after %.2f."):format(
    section.load.before, section.load.after))
end
print(section.title .. ":")
print(results.markdown(section))
print()
print("Targets:")
for _, t in ipairs(section.targets) do print(("  %-7s %s: %s"):format(t.verdict, t.name, t.detail)) end
results.save(JSON, section)
local _, drawn = sh(("%s %s/chart.lua %s %s 2>&1"):format(LUA, here, JSON, SVG))
print(("Results written to %s; chart %s%s"):format(JSON, SVG, drawn and "" or " NOT drawn (gnuplot?)"))
progress(("bench/optimistic: done in %d s\n"):format(os.time() - t0))
os.exit(lost == 0)
-- }==========================================================
