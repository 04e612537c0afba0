-- What a task costs (docs/bench.md; docs/internals.md, Tasks), and
-- whether tasks slowed anything else: `lua5.4 bench/tasks.lua`, from the
-- repository root after `make` (`make bench` runs it).  Prints Markdown.
--
-- Rows (bench/scenarios.lua, each run in a process of its own, best of 3):
-- * spawn: am.spawn of a function that returns at once (a task started and
--   ended), against the floor: coroutine.create + resume of the same
--   function, what am.spawn did before it made tasks;
-- * spawn + wait: each task first queues for a held mutex, then all are
--   handed the mutex in turn (the floor: floor.wait);
-- * memory: the Lua heap per task waiting for a mutex beyond a coroutine of
--   ours making the same wait, and the handle an ended task leaves;
-- * callgrind: instructions per spawn and per spawn + wait (runs of n and
--   2n).
--
-- BENCH_BASE=/path/to/another/checkout (built with `make`) runs instead an
-- A/B comparison: the scenarios of `make bench` that tasks could slow
-- (hand-off, chain, timeouts, cancel, priorities, semaphore, uncontended
-- pairs) and the spawn rows, on this checkout's module (A) and that one's
-- (B), alternating, best of BENCH_ROUNDS (default 5) each, with this
-- checkout's bench/scenarios.lua for both; then callgrind counts of both.
-- BENCH_QUICK=1: a tenth of the sizes.

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/bench$") or (here == "bench" and ".") or here .. "/.."
local LUA = arg[-1] or "lua5.4"
local QUICK = os.getenv("BENCH_QUICK") == "1"
local BASE = os.getenv("BENCH_BASE")
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS") or "") or (BASE and 5 or 3)
local function size(n) return QUICK and math.max(1, n // 10) or n end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  return out
end

root = sh("cd " .. quote(root) .. " && pwd"):match("[^\n]+")  -- absolute: used from BENCH_BASE too

--- Runs bench/scenarios.lua (this checkout's) with the module of checkout
-- 'dir'; returns the decoded JSON line (flat: numbers, strings, booleans).
local function scenario(dir, args, prefix)
  local out = sh(("cd %s && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
    .. "%s%s %s %s"):format(quote(dir), prefix or "", LUA, quote(root .. "/bench/scenarios.lua"),
    args))
  local line = out:match("({[^\n]*})%s*$")
  if not line then error(("scenarios.lua %s failed in %s:\n%s"):format(args, dir, out)) end
  local r = {}
  for k, v in line:gmatch('"([%w_]+)":([^,}]+)') do
    r[k] = tonumber(v) or (v == "true" and true) or (v == "false" and false) or v:gsub('^"(.*)"$', "%1")
  end
  return r
end

--- Instructions per operation of 'args_of(n)' in checkout 'dir': callgrind
-- at n and 2n, the difference over n.
local function per_op(dir, args_of, n)
  local function total(m)
    local file = os.tmpname()
    sh(("cd %s && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
      .. "valgrind --tool=callgrind --callgrind-out-file=%s %s %s %s"):format(quote(dir),
      quote(file), LUA, quote(root .. "/bench/scenarios.lua"), args_of(m)))
    local f = io.open(file)
    local text = f and f:read("a") or ""
    if f then f:close() end
    os.remove(file)
    return tonumber(text:match("\nsummary: (%d+)") or text:match("\ntotals: (%d+)"))
  end
  local a, b = total(n), total(2 * n)
  return a and b and (b - a) / n
end

local has_valgrind = sh("command -v valgrind") ~= ""

local function fmt(v, unit)
  if v == nil then return "" end
  if unit == "ns" then return ("%.0f ns"):format(v) end
  if unit == "B" then return ("%.0f B"):format(v) end
  if unit == "ms" then return ("%.1f ms"):format(v) end
  return ("%.0f"):format(v)
end

local N = size(100000)

if not BASE then
  -- {======================================================== the task rows
  local best = {}
  local function keep(name, r, key)
    if not best[name] or r[key] < best[name][key] then best[name] = r end
  end
  for _ = 1, ROUNDS do
    keep("spawn ours", scenario(root, "ours spawn " .. N), "ns")
    keep("spawn floor", scenario(root, "floor spawn " .. N), "ns")
    keep("wait ours", scenario(root, "ours spawn " .. N .. " wait"), "ns")
    keep("wait floor", scenario(root, "floor spawn " .. N .. " wait"), "ns")
  end
  local mem = scenario(root, "ours task_memory " .. N)
  print("| tasks | ours | floor | ours/floor |")
  print("|---|---|---|---|")
  local function line(name, a, b, unit)
    print(("| %s | %s | %s | %s |"):format(name, fmt(a, unit), fmt(b, unit),
      (a and b) and ("%.2f"):format(a / b) or ""))
  end
  line(("am.spawn: a task started and ended (%d)"):format(N), best["spawn ours"].ns,
    best["spawn floor"].ns, "ns")
  line(("am.spawn: a task that waits for a mutex once (%d, handed on)"):format(N),
    best["wait ours"].ns, best["wait floor"].ns, "ns")
  line("heap per waiting task, beyond a coroutine making the same wait", mem.beyond_b, nil, "B")
  line("heap of an ended task's handle", mem.handle_b, nil, "B")
  if has_valgrind then
    local n = size(20000)
    line("instructions per spawn (callgrind)",
      per_op(root, function(m) return "ours spawn " .. m end, n),
      per_op(root, function(m) return "floor spawn " .. m end, n))
    line("instructions per spawn + wait (callgrind)",
      per_op(root, function(m) return "ours spawn " .. m .. " wait" end, n // 2),
      per_op(root, function(m) return "floor spawn " .. m .. " wait" end, n // 2))
  end
  print(("\n(CPU time, best of %d processes; the floor: coroutine.create + resume,"
    .. " floor.wait)"):format(ROUNDS))
  -- }========================================================
  return
end

-- {========================================================== A/B
local N1M, N100K, N10K = size(1000000), size(100000), size(10000)
local JOBS = {
  { "uncontended acquire + release", "ours uncontended " .. N1M, "acquire_ns", "ns" },
  { "hand-off (1000 co x 100)", ("ours handoff %d 100"):format(size(1000)), "ns", "ns" },
  { "chain (100k queued)", "ours chain " .. N100K, "ms", "ms" },
  { "timeouts 10k x 50 ms: spawn + enqueue", "ours timeout " .. N10K .. " 50", "enqueue_ms", "ms" },
  { "timeouts 10k: enqueue, coroutines made before", "ours timeout " .. N10K .. " 50 before",
    "enqueue_ms", "ms" },
  { "timeouts 100k: spawn + enqueue + expiry", "ours timeout " .. N100K .. " 50", "work_ms", "ms" },
  { "cancel 100k: spawn + enqueue", "ours cancel " .. N100K, "enqueue_ms", "ms" },
  { "cancel 100k: cancel -> last raised", "ours cancel " .. N100K, "cancel_ms", "ms" },
  { "priorities 10k: spawn + enqueue per waiter", "ours priority " .. N10K, "enqueue_ns", "ns" },
  { "priorities 10k: drain per waiter", "ours priority " .. N10K, "drain_ns", "ns" },
  { "semaphore 10k", "ours semaphore " .. N10K .. " 16", "ms", "ms" },
  { "am.spawn: started and ended", "ours spawn " .. N100K, "ns", "ns" },
  { "am.spawn: waits once", "ours spawn " .. N100K .. " wait", "ns", "ns" },
}
local A, B = {}, {}
for round = 1, ROUNDS do
  io.stderr:write(("round %d of %d\n"):format(round, ROUNDS))
  for i, job in ipairs(JOBS) do
    -- alternate which goes first, so neither always runs after the other
    local order = (round + i) % 2 == 0 and { { A, root }, { B, BASE } } or { { B, BASE }, { A, root } }
    for _, side in ipairs(order) do
      local r = scenario(side[2], job[2])
      local v = r[job[3]]
      if not side[1][i] or v < side[1][i] then side[1][i] = v end
    end
  end
end
print(("A: %s\nB: %s\n"):format(root, BASE))
print("| scenario | A | B | A/B |")
print("|---|---|---|---|")
for i, job in ipairs(JOBS) do
  print(("| %s | %s | %s | %.3f |"):format(job[1], fmt(A[i], job[4]), fmt(B[i], job[4]), A[i] / B[i]))
end
if has_valgrind then
  print("\n| instructions per operation (callgrind) | A | B | A/B |")
  print("|---|---|---|---|")
  for _, c in ipairs({
    { "uncontended pair", function(m) return "ours pairs " .. m end, size(50000) },
    { "hand-off (10 coroutines)", function(m) return ("ours handoff 10 %d"):format(m // 10) end,
      size(20000) },
    { "timed waiter (enqueue + expiry)", function(m) return ("ours timeout %d 5"):format(m) end,
      size(5000) },
    { "am.spawn, started and ended", function(m) return "ours spawn " .. m end, size(20000) },
    { "am.spawn, waits once", function(m) return "ours spawn " .. m .. " wait" end, size(10000) },
  }) do
    local a, b = per_op(root, c[2], c[3]), per_op(BASE, c[2], c[3])
    print(("| %s | %.0f | %.0f | %.3f |"):format(c[1], a, b, a / b))
  end
end
print(("\n(CPU time, best of %d processes each, A and B alternating)"):format(ROUNDS))
-- }==========================================================
