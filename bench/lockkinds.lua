-- The lock kinds of docs/lockkinds.md (RWLock, ReentrantMutex, leases)
-- against a Mutex doing the same work.  `lua5.4 bench/lockkinds.lua`, from
-- the repository root with the module on the paths (`make bench` does it);
-- BENCH_QUICK=1 runs a tenth of the sizes.  Prints one Markdown table.
--
-- Rows:
-- * read-mostly: 1,000 coroutines, 95% reads and 5% writes, each hold
--   yielding once to the loop (am.sleep(0)): RWLock (reads shared) against
--   Mutex (every hold exclusive), a pure-Lua RW lock (bench/lua_rwlock.lua)
--   and, when Node and `npm ci` in bench/node are there, async-rwlock
--   1.1.1 (bench/node/rwlock.js).  CPU time (best of 3) and loop turns;
--   then holds of 1 ms (am.sleep(1)), in wall time.
-- * reader batch: 10,000 and 100,000 readers queued behind a writer,
--   released at once: loop turns until all have entered, CPU time.
-- * uncontended acquireRead + release, and ReentrantMutex nested acquire +
--   release, against a Mutex pair.
-- * leased acquire + release (a timer-heap entry each) against a Mutex pair.
-- * memory per waiting coroutine, beyond the coroutine, per kind.

local uv = require "luv"
local am = require "async_mutex"

local QUICK = os.getenv("BENCH_QUICK") == "1"
local SCALE = QUICK and 0.1 or 1
local function n_of(n) return math.max(1, math.floor(n * SCALE)) end

local rows = {}
local function row(name, value, note)
  rows[#rows + 1] = ("| %s | %s | %s |"):format(name, value, note or "")
end

-- The pure-Lua RW lock (bench/lua_rwlock.lua), from this script's directory.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local LuaRWLock = require "lua_rwlock"

-- read-mostly: `rounds` holds by each of `nco` coroutines, 5% of them
-- writes, each hold yielding once to the loop (am.sleep(ms)), on lock
-- `kind` ("mutex": every hold exclusive; "rw": reads shared; "lua_rw": the
-- pure-Lua RW lock).  Returns the CPU time (os.clock) from the first spawn
-- until the last coroutine is done, the wall time, and, when `count`, the
-- loop turns (an idle handle counts them; off when timing, as its callback
-- costs a turn's worth of CPU).
local function read_mostly(kind, nco, rounds, ms, count)
  local lock = kind == "rw" and am.RWLock.new() or kind == "lua_rw" and LuaRWLock.new()
    or am.Mutex.new()
  local finished = 0
  local turns, idle = 0, nil
  if count then
    idle = uv.new_idle()
    idle:start(function()
      turns = turns + 1
      if finished == nco then idle:stop() end
    end)
  end
  uv.update_time()
  local t0, w0 = os.clock(), uv.hrtime()
  local t1, w1
  for i = 1, nco do
    am.spawn(function()
      for r = 1, rounds do
        local write = (i * 31 + r * 17) % 20 == 0          -- 5% writes
        local release
        if kind == "mutex" then release = lock:acquire()
        elseif write then release = lock:acquireWrite()
        else release = lock:acquireRead() end
        am.sleep(ms)                                        -- yields once
        release()
      end
      finished = finished + 1
      if finished == nco then t1, w1 = os.clock(), uv.hrtime() end
    end)
  end
  uv.run()
  if idle then idle:close(); uv.run() end
  assert(finished == nco)
  return t1 - t0, (w1 - w0) / 1e9, turns
end

-- Best of 3 (CPU), and the loop turns of one more run.
local function read_mostly_best(kind, nco, rounds, ms)
  local cpu, wall = math.huge, math.huge
  for _ = 1, 3 do
    local c, w = read_mostly(kind, nco, rounds, ms)
    cpu, wall = math.min(cpu, c), math.min(wall, w)
  end
  local _, _, turns = read_mostly(kind, nco, rounds, ms, true)
  return cpu, wall, turns
end

-- The same on Node (bench/node/rwlock.js: best of 3 rounds in one
-- process); nil when Node or its packages are missing (`npm ci` in
-- bench/node).
local function node_read_mostly(kind, nco, rounds)
  local js = here .. "/node/rwlock.js"
  local f = io.open(here .. "/node/node_modules/async-rwlock/package.json")
  if not f then return nil end
  f:close()
  local p = io.popen(("node %s readmostly %s %d %d 2>/dev/null"):format(js, kind, nco, rounds))
  local out = p and p:read("a") or ""
  if p then p:close() end
  return tonumber(out:match('"cpu_s":([%d.eE+-]+)')), tonumber(out:match('"first_cpu_s":([%d.eE+-]+)'))
end

-- reader batch: n readers behind a writer.
local function reader_batch(n)
  local rw = am.RWLock.new()
  local entered = 0
  local release_w
  am.spawn(function() release_w = rw:acquireWrite() end)
  for _ = 1, n do
    am.spawn(function() local r = rw:acquireRead(); entered = entered + 1; r() end)
  end
  local turns = 0
  local idle = uv.new_idle()
  idle:start(function()
    turns = turns + 1
    if entered == n then idle:stop() end
  end)
  local t0 = os.clock()
  release_w()
  uv.run()
  local cpu = os.clock() - t0
  idle:close(); uv.run()
  return cpu, turns, entered
end

-- ns per pair of fn() in a coroutine, best of 3.
local function pair_ns(fn, n)
  local best = math.huge
  for _ = 1, 3 do
    local t
    am.spawn(function()
      local t0 = os.clock()
      for _ = 1, n do fn() end
      t = os.clock() - t0
    end)
    uv.run()
    best = math.min(best, t)
  end
  return best / n * 1e9
end

-- Bytes per waiting coroutine beyond an idle suspended coroutine.  The
-- coroutines of both measures make the same Lua calls down to the wait
-- (`local r = wait() r()`, `wait` tail-calling `f(x)`, which tail-calls a
-- C function): one yields in the lock's request, the other in
-- coroutine.yield.  So the figure is what the module adds (its waiter,
-- its anchor), not the frames of the calling code, which any wait costs.
local function yield_in(_) return coroutine.yield() end
local function memory_per_waiter(make_wait, n)
  collectgarbage("collect"); collectgarbage("collect")
  local base0 = collectgarbage("count")
  local cos = {}
  local bare = function() return yield_in(nil) end
  for i = 1, n do
    cos[i] = coroutine.create(function() local r = bare() r() end)
    coroutine.resume(cos[i])
  end
  collectgarbage("collect")
  local per_co = (collectgarbage("count") - base0) * 1024 / n
  for i = 1, n do coroutine.close(cos[i]) end
  cos = nil                                                   -- luacheck: ignore
  collectgarbage("collect"); collectgarbage("collect")
  local lock, release = make_wait()
  local ws = {}
  collectgarbage("collect")
  local b0 = collectgarbage("count")
  for i = 1, n do
    ws[i] = coroutine.create(function() local r = lock() r() end)
    coroutine.resume(ws[i])
  end
  collectgarbage("collect")
  local per_waiter = (collectgarbage("count") - b0) * 1024 / n
  release()
  uv.run()
  return per_waiter - per_co
end

-- Memory: each row in a process of its own, so that it pays for the
-- module's anchors of its waiting coroutines (slots that are made once and
-- reused) as a program's first wait of that many does.
local W = n_of(20000)
local function held(lock, acquire)
  local co = coroutine.create(function() local r = acquire(lock) coroutine.yield() r() end)
  coroutine.resume(co)
  return function() coroutine.resume(co) end
end
local function acq(l) return l:acquire() end
local function wr(l) return l:acquireWrite() end
local function rd(l) return l:acquireRead() end
local function kwr(l) return l:acquireWrite("k") end
local function krd(l) return l:acquireRead("k") end
local MEM_ROWS = {
  { "Mutex", am.Mutex.new, acq, acq },
  { "RWLock writer", am.RWLock.new, wr, wr },
  { "RWLock reader", am.RWLock.new, wr, rd },
  { "ReentrantMutex", am.ReentrantMutex.new, acq, acq },
  { "KeyedRWLock reader (one key)", function() return am.KeyedRWLock.new() end, kwr, krd },
  { "withLease Mutex", function() return am.withLease(am.Mutex.new(), 60000) end, acq, acq },
  { "withTimeout Mutex", function() return am.withTimeout(am.Mutex.new(), 60000) end, acq, acq },
}
local function mem_bytes(i)
  local name, new, hold, wait = table.unpack(MEM_ROWS[i])
  return name, memory_per_waiter(function()
    local lock = new()
    local release = held(lock, hold)
    return function() return wait(lock) end, release
  end, W)
end
if arg[1] == "mem" then                    -- a child: one row
  local _, b = mem_bytes(tonumber(arg[2]))
  print(b)
  os.exit(0)
end
local N = n_of(1000)
local ROUNDS = QUICK and 2 or 10
local cpu_m, _, turns_m = read_mostly_best("mutex", N, ROUNDS, 0)
local cpu_rw, _, turns_rw = read_mostly_best("rw", N, ROUNDS, 0)
local cpu_lrw, _, turns_lrw = read_mostly_best("lua_rw", N, ROUNDS, 0)
local node_rw, node_rw_first = node_read_mostly("rwlock", N, ROUNDS)
local node_m = node_read_mostly("mutex", N, ROUNDS)
row(("read-mostly, %d coroutines x %d holds, 5%% writes, each hold yielding once (am.sleep(0)): Mutex"):format(
  N, ROUNDS),
  ("%.1f ms CPU, %d loop turns"):format(cpu_m * 1e3, turns_m), "best of 3")
row("read-mostly: RWLock", ("%.1f ms CPU, %d loop turns"):format(cpu_rw * 1e3, turns_rw),
  ("%.2fx the Mutex's throughput in CPU time, %.1fx in loop turns (target 5x)"):format(
    cpu_m / cpu_rw, turns_m / turns_rw))
row("read-mostly: pure-Lua RW lock (bench/lua_rwlock.lua)", ("%.1f ms CPU, %d loop turns"):format(
  cpu_lrw * 1e3, turns_lrw), ("RWLock: %.2fx its throughput"):format(cpu_lrw / cpu_rw))
if node_rw then
  row("read-mostly: async-rwlock 1.1.1 on Node (bench/node/rwlock.js)", ("%.1f ms CPU"):format(node_rw * 1e3),
    ("RWLock: %.1fx its throughput (target 10x); best of 3 rounds in one process, "
      .. "the first (JIT cold) %.1f ms: %.1fx; a setImmediate per hold"):format(
      node_rw / cpu_rw, node_rw_first * 1e3, node_rw_first / cpu_rw))
  row("read-mostly: async-mutex 0.5.0 Mutex on Node", ("%.1f ms CPU"):format(node_m * 1e3),
    ("Mutex: %.1fx its throughput"):format(node_m / cpu_m))
else
  row("read-mostly: async-rwlock on Node", "skipped", "no node, or no `npm ci` in bench/node")
end
-- Holds that last as long as I/O does (1 ms of loop time): wall clock.
local NW, RW_ROUNDS = n_of(1000), QUICK and 1 or 2
local _, wall_m1 = read_mostly("mutex", NW, RW_ROUNDS, 1)
local _, wall_rw1 = read_mostly("rw", NW, RW_ROUNDS, 1)
row(("read-mostly, %d coroutines x %d holds of 1 ms (am.sleep(1)): Mutex"):format(NW, RW_ROUNDS),
  ("%.2f s wall"):format(wall_m1), "every hold waits for the one before it")
row("read-mostly, holds of 1 ms: RWLock", ("%.2f s wall"):format(wall_rw1),
  ("%.1fx the Mutex's throughput in wall time: readers' holds overlap"):format(wall_m1 / wall_rw1))

local B = n_of(10000)
local cpu_b, turns_b, entered = reader_batch(B)
local cpu_b10, turns_b10 = reader_batch(10 * B)
row(("reader batch: %d readers behind a writer, released at once"):format(B),
  ("%.1f ms CPU, %d loop turn(s), %d entered"):format(cpu_b * 1e3, turns_b, entered),
  "all granted in one dispatch, resumed in one loop iteration")
row(("reader batch: %d readers"):format(10 * B),
  ("%.1f ms CPU, %d loop turn(s)"):format(cpu_b10 * 1e3, turns_b10),
  ("%.1fx the time of %d: O(k)"):format(cpu_b10 / cpu_b, B))

local P = n_of(1000000)
local m, rw, rm = am.Mutex.new(), am.RWLock.new(), am.ReentrantMutex.new()
local lm = am.withLease(am.Mutex.new(), 60000)
local mutex_ns = pair_ns(function() m:acquire()() end, P)
local read_ns = pair_ns(function() rw:acquireRead()() end, P)
local write_ns = pair_ns(function() rw:acquireWrite()() end, P)
-- nested: the coroutine holds one level; each pair is one more level
local nested_ns = math.huge
for _ = 1, 3 do
  am.spawn(function()
    local outer = rm:acquire()
    local t0 = os.clock()
    for _ = 1, P do rm:acquire()() end
    nested_ns = math.min(nested_ns, (os.clock() - t0) / P * 1e9)
    outer()
  end)
  uv.run()
end
local lease_ns = pair_ns(function() lm:acquire()() end, n_of(200000))
row("uncontended Mutex acquire + release", ("%.0f ns"):format(mutex_ns))
row("uncontended RWLock acquireRead + release", ("%.0f ns"):format(read_ns),
  ("%.2fx a Mutex pair (target 1.2x)"):format(read_ns / mutex_ns))
row("uncontended RWLock acquireWrite + release", ("%.0f ns"):format(write_ns),
  ("%.2fx a Mutex pair"):format(write_ns / mutex_ns))
row("ReentrantMutex nested acquire + release", ("%.0f ns"):format(nested_ns),
  ("%.2fx a Mutex pair (target 1.2x)"):format(nested_ns / mutex_ns))
row("withLease acquire + release (a timer-heap entry)", ("%.0f ns"):format(lease_ns),
  ("%.2fx a Mutex pair"):format(lease_ns / mutex_ns))

local lua = arg[-1] or "lua5.4"
for i, r in ipairs(MEM_ROWS) do
  local p = assert(io.popen(("%s %s mem %d 2>/dev/null"):format(lua, arg[0], i)))
  local b = tonumber(p:read("a"))
  p:close()
  row("memory per waiting coroutine: " .. r[1], b and ("%.0f B"):format(b) or "n/a",
    r[1]:find("withTimeout") and "beyond the coroutine; a timed wait reads the clock "
      .. "through Lua, which leaves a 64 B CallInfo cached in the coroutine"
      or "beyond the coroutine (target 128 B)")
end

print("| lock kinds" .. (QUICK and " (BENCH_QUICK: a tenth)" or "") .. " | figure | note |")
print("|---|---|---|")
for _, r in ipairs(rows) do print(r) end
