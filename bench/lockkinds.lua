-- The lock kinds of docs/lockkinds.md (RWLock, ReentrantMutex, leases)
-- against a Mutex doing the same work.  `lua5.4 bench/lockkinds.lua`, from
-- the repository root with the module on the paths (`make bench` does it);
-- BENCH_QUICK=1 runs a tenth of the sizes.  Prints one Markdown table.
--
-- Rows:
-- * read-mostly: 1,000 coroutines, 95% reads and 5% writes, each hold
--   yielding once to the loop: RWLock (reads shared) against Mutex (every
--   hold exclusive).  CPU time and loop turns.
-- * reader batch: 10,000 readers queued behind a writer, released at once:
--   loop turns until all have entered, CPU time.
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

-- Counts loop turns with an idle handle while fn's coroutines run.
local function run_loop(start)
  local turns = 0
  local idle = uv.new_idle()
  idle:start(function() turns = turns + 1 end)
  local t0 = os.clock()
  start()
  local check = uv.new_check()
  local done = false
  check:start(function()
    if done() then idle:stop(); check:stop() end
  end)
  done = nil
  return function(finished)
    done = finished
    uv.run()
    idle:close(); check:close()
    uv.run()
    return os.clock() - t0, turns
  end
end

-- read-mostly: `rounds` acquisitions by each of `nco` coroutines.
local function read_mostly(kind, nco, rounds)
  local lock = kind == "rw" and am.RWLock.new() or am.Mutex.new()
  local finished = 0
  local go = run_loop(function()
    for i = 1, nco do
      am.spawn(function()
        for r = 1, rounds do
          local write = (i * 31 + r * 17) % 20 == 0          -- 5% writes
          local release
          if kind == "rw" and not write then release = lock:acquireRead()
          else release = lock:acquire() end
          am.sleep(0)                                         -- yields once
          release()
        end
        finished = finished + 1
      end)
    end
  end)
  return go(function() return finished == nco end)
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
  { "KeyedRWLock reader (one key)", am.KeyedRWLock.new, kwr, krd },
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
local cpu_m, turns_m = read_mostly("mutex", N, ROUNDS)
local cpu_rw, turns_rw = read_mostly("rw", N, ROUNDS)
row(("read-mostly, %d coroutines x %d holds, 95%% reads: Mutex"):format(N, ROUNDS),
  ("%.3f s CPU, %d loop turns"):format(cpu_m, turns_m))
row("read-mostly: RWLock", ("%.3f s CPU, %d loop turns"):format(cpu_rw, turns_rw),
  ("%.1fx the Mutex's throughput in CPU time, %.1fx in loop turns (target 5x)"):format(
    cpu_m / cpu_rw, turns_m / turns_rw))

local B = n_of(10000)
local cpu_b, turns_b, entered = reader_batch(B)
row(("reader batch: %d readers behind a writer"):format(B),
  ("%.3f s CPU, %d loop turn(s), %d entered"):format(cpu_b, turns_b, entered),
  "all granted in one dispatch (O(k)); resumed 1,024 a loop turn (the scheduler's batch, which lets I/O in)")

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
  local p = assert(io.popen(("%s %s mem %d"):format(lua, arg[0], i)))
  local b = tonumber(p:read("a"))
  p:close()
  row("memory per waiting coroutine: " .. r[1], ("%.0f B"):format(b),
    r[1]:find("withTimeout") and "beyond the coroutine; a timed wait reads the clock "
      .. "through Lua, which leaves a 64 B CallInfo cached in the coroutine"
      or "beyond the coroutine (target 128 B)")
end

print("| lock kinds" .. (QUICK and " (BENCH_QUICK: a tenth)" or "") .. " | figure | note |")
print("|---|---|---|")
for _, r in ipairs(rows) do print(r) end
