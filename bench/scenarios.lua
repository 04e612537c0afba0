-- The benchmark scenarios, one per process, printing one JSON line.
--
--   lua5.4 bench/scenarios.lua IMPL SCENARIO [N [M]] [before | fresh | shape=S]
--
-- IMPL is `ours` (require "async_mutex": run from the repository root with
-- LUA_PATH="src/?.lua;src/?/init.lua;;" LUA_CPATH="build/?.so;;"), `lua` (the
-- hand-written pure-Lua mutex, bench/lua_mutex.lua) or `floor` (no lock: the
-- same coroutines wait through bench/floor.lua instead).  bench/node/
-- scenarios.js mirrors this file function by function.  bench/run.lua runs
-- them all and prints the table.
--
-- Equal work: a timed loop that starts waiters creates their coroutines
-- itself, as Node's creates its async functions (which cannot be created
-- apart from being started).  `before` (timeout, cancel, priority) creates
-- the coroutines before the clock starts instead, to time the lock alone:
-- that figure is compared with the other Lua peers only, never with Node.
-- `shape=S` (IMPL floor, pairs and handoff; build/bench/api_floor.so built
-- first, as bench/tools/api_floor.c says) runs ours's loop on a lock that
-- makes only the calls the API's shape requires (docs/bench.md, "What the
-- API shape costs"): S = fresh_bare, fresh, checked or waited (pairs),
-- acquire or acquire_bare (handoff).

local here = arg[0]:match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path

local uv = require "luv"           -- on the main thread, before any coroutine

local USAGE = "usage: scenarios.lua ours|lua|floor SCENARIO [N [M]] [before | fresh | wait | shape=S]"
local impl_name, scenario = arg[1], arg[2]
local am, floor
if impl_name == "ours" then am = require "async_mutex"
elseif impl_name == "lua" then am = require "lua_mutex"
elseif impl_name == "floor" then floor = require "floor"
else error(USAGE) end

-- The numbers after SCENARIO in order, and the words among them as flags.
local nums, flags = {}, {}
for i = 3, #arg do
  local v = tonumber(arg[i])
  if v then nums[#nums + 1] = v
  elseif arg[i] == "before" or arg[i] == "fresh" or arg[i] == "wait" then flags[arg[i]] = true
  elseif arg[i]:match("^shape=[%w_]+$") and floor then flags.shape = arg[i]:sub(7)
  else error(USAGE) end
end
-- shape=S: the API shape's floor (bench/tools/api_floor.c), a lock whose
-- acquire is S, run by ours's loop (the same bytecode)
local api_floor = flags.shape
  and assert(package.loadlib("build/bench/api_floor.so", "luaopen_api_floor"))()
if api_floor then floor = nil end     -- ours's loops, on the floor's lock
local SHAPES = { pairs = { fresh_bare = true, fresh = true, checked = true,
                           waited = true },
                 handoff = { acquire = true, acquire_bare = true } }
local function shape_lock(scenario_name)
  assert(SHAPES[scenario_name][flags.shape], USAGE)
  local lock = api_floor.new()
  local methods = getmetatable(lock).__index
  methods.acquire = methods[flags.shape]
  if scenario_name == "handoff" then api_floor.start(uv.new_idle()) end
  return lock
end

-- The clock, in nanoseconds: BENCH_CLOCK=cpu (the default) is the process's
-- CPU time (os.clock: the loop never sleeps in a timed interval, except the
-- 50 ms of scenario 4, which CPU time leaves out), robust to other processes
-- competing for the cores; BENCH_CLOCK=wall is uv.hrtime.
local CLOCK = os.getenv("BENCH_CLOCK") == "wall" and "wall" or "cpu"
local clock = os.clock
local now = CLOCK == "wall" and uv.hrtime or function() return clock() * 1e9 end
local create, resume = coroutine.create, coroutine.resume

-- Prints a flat JSON object (numbers, strings, booleans).
local function emit(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    if type(v) == "string" then v = string.format("%q", v)
    elseif type(v) == "number" then
      v = math.type(v) == "integer" and tostring(v) or string.format("%.6g", v)
    else v = tostring(v) end
    out[#out + 1] = string.format("%q:%s", k, v)
  end
  out[#out + 1] = string.format("%q:%q", "clock", CLOCK)
  io.write("{", table.concat(out, ","), "}\n")
end

-- Starts fn(...) in a new coroutine now; it runs until its first wait.
local function spawn(fn, ...)
  local co = create(fn)
  local ok, err = resume(co, ...)
  if not ok then error(debug.traceback(co, err), 0) end
  return co
end

-- Starts n waiters running fn(arg_of()) and returns the time this took: each
-- is created in the timed loop (the work Node's loop does: an async function
-- is created by starting it) unless `before` is set, when the coroutines are
-- all created before the clock starts (creation costs about 1-3 us here:
-- malloc and page faults), so that the loop times the lock's enqueue alone.
-- Returns the time, then the time creation took before the clock (or nil).
-- The loop's clock is brought up to date just before, so that timers started
-- in the loop count from then (scenario 4).
local function start_all(n, fn, before, arg_of)
  local cos, t_create
  if before then
    local t0 = now()
    cos = {}
    for i = 1, n do cos[i] = create(fn) end
    t_create = now() - t0
  end
  uv.update_time()
  local t0 = now()
  if cos then
    for i = 1, n do
      local co = cos[i]
      local ok, err = resume(co, arg_of and arg_of())
      if not ok then error(debug.traceback(co, err), 0) end
    end
  else
    for _ = 1, n do spawn(fn, arg_of and arg_of()) end
  end
  return now() - t0, t_create
end

-- How the coroutines of a scenario were made, for its JSON line.
local function made(before) return before and "before" or "in the timed loop" end

-- Takes `lock` (uncontended) and returns what acquire returned.
local function hold(lock, ...)
  local a, b
  spawn(function(...) a, b = lock:acquire(...) end, ...)
  return a, b
end

-- The same pseudo-random sequence in Lua and JS (Park-Miller).
local function lcg(seed)
  local x = seed
  return function(m)
    x = x * 48271 % 2147483647
    return x % m + 1
  end
end

local function full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function rss_bytes()
  local f = io.open("/proc/self/status")
  local kb = f:read("a"):match("VmRSS:%s*(%d+)")
  f:close()
  return tonumber(kb) * 1024
end

local function ms(ns) return ns / 1e6 end

local S = {}

-- 1. Uncontended acquire + release, n times, and runExclusive (best of 3).
-- The floor does the same calls with no lock: a method call on a value with a
-- metatable and a call of what it returned (two C functions); and a method
-- call plus pcall(noop).  The floor also times the least an acquire/release
-- pair must do besides its lock work: make a fresh callable object (in one C
-- call) and call it.
function S.uncontended(n)
  n = n or 1000000
  local m = floor and "x" or am.Mutex.new()
  local best_acq, best_run, best_fresh = math.huge, math.huge, math.huge
  local function noop() end
  local maker = { new = setmetatable }
  local releaser_mt = { __call = rawlen, __close = rawlen }
  spawn(function()
    for _ = 1, 3 do
      local t0 = now()
      if floor then            -- the same shapes with no lock: C calls
        local nop = coroutine.isyieldable
        for _ = 1, n do
          local _ = m:len()
          nop()
        end
        best_acq = math.min(best_acq, now() - t0)
        t0 = now()
        for _ = 1, n do
          local _ = m:len()
          pcall(noop)
        end
        best_run = math.min(best_run, now() - t0)
        -- and with what any acquire must hand out: a fresh object that can
        -- be called and closed (a releaser), made by one C call, then called
        t0 = now()
        for _ = 1, n do
          local release = maker.new({}, releaser_mt)
          release()
        end
        best_fresh = math.min(best_fresh, now() - t0)
      else
        for _ = 1, n do
          local release = m:acquire()
          release()
        end
        best_acq = math.min(best_acq, now() - t0)
        t0 = now()
        for _ = 1, n do
          m:runExclusive(noop)
        end
        best_run = math.min(best_run, now() - t0)
      end
    end
  end)
  uv.run()
  emit { scenario = "uncontended", n = n,
         acquire_ns = best_acq / n, run_ns = best_run / n,
         fresh_releaser_ns = floor and best_fresh / n or nil }
end

-- 2. Hand-off: a holder takes the mutex, ncoro coroutines each do ncycles
-- acquire/release cycles, the holder releases; every acquire waits.  With
-- the flag `fresh`, the floor runs twice: bare waits, then waits that each
-- also do the least a lock adds to a wait besides its lock work: hand out a fresh object that
-- can be called and closed (a releaser: P3 forbids reusing one), made by
-- one C call, then called.  (Ours also holds its waiter to-be-closed
-- across the wait, for coroutine.close; this floor leaves that out.)
local function handoff_run(ncoro, ncycles, fresh)
  local total = ncoro * ncycles
  local waited, done, t_end = 0, 0, nil
  -- An acquire waited iff a release happened meanwhile: one that returns
  -- at once lets nobody run.  Counting costs every implementation (and the
  -- floor) the same two upvalue reads, unlike asking the lock.
  local releases = 0
  local m, release_holder
  if api_floor then m = shape_lock("handoff")
  elseif not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
  end
  local maker = { new = setmetatable }
  local releaser_mt = { __call = rawlen, __close = rawlen }
  local function worker()
    for _ = 1, ncycles do
      local before = releases
      if fresh then
        floor.wait()
        if releases ~= before then waited = waited + 1 end
        local release = maker.new({}, releaser_mt)
        release()
      elseif floor then
        floor.wait()
        if releases ~= before then waited = waited + 1 end
      else
        local release = m:acquire()
        if releases ~= before then waited = waited + 1 end
        release()
      end
      releases = releases + 1
    end
    done = done + 1
    if done == ncoro then t_end = now() end
  end
  for _ = 1, ncoro do spawn(worker) end
  local t0 = now()
  if release_holder then release_holder() end
  releases = releases + 1
  uv.run()
  assert(done == ncoro, "not all workers finished")
  return (t_end - t0) / total, 100 * waited / total
end

function S.handoff(ncoro, ncycles)
  ncoro, ncycles = ncoro or 1000, ncycles or 100
  local ns, waited_pct = handoff_run(ncoro, ncycles, false)
  local fresh_ns
  if floor and flags.fresh then
    full_gc()
    fresh_ns = handoff_run(ncoro, ncycles, true)
  end
  emit { scenario = "handoff", coroutines = ncoro, cycles = ncycles,
         waited_pct = waited_pct, ns = ns, per_s = 1e9 / ns,
         fresh_releaser_ns = fresh_ns }
end

-- 3. A chain: n coroutines queued behind a holder, each acquires and releases
-- with no yield in between; from the holder's release until the last is done.
function S.chain(n)
  n = n or 100000
  local done, t_end = 0, nil
  local m, release_holder
  if not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
  end
  local function worker()
    if floor then
      floor.wait()
    else
      local release = m:acquire()
      release()
    end
    done = done + 1
    if done == n then t_end = now() end
  end
  for _ = 1, n do spawn(worker) end
  local t0 = now()
  if release_holder then release_holder() end
  uv.run()
  assert(done == n, "not all workers finished")
  emit { scenario = "chain", n = n, ms = ms(t_end - t0) }
end

-- 4. n waiters on a held lock through withTimeout(lock, timeout): all expire.
-- enqueue: the starting loop; expire: from the first raise to the last.
function S.timeout(n, timeout)
  n, timeout = n or 100000, timeout or 50
  local raised, t_first, t_last = 0, nil, nil
  local m, release_holder, tm
  if not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
    tm = am.withTimeout(m, timeout)
  end
  local function worker()
    if floor then
      floor.wait()
    else
      local ok, err = pcall(tm.acquire, tm)
      assert(not ok and err == am.E_TIMEOUT, err)
    end
    raised = raised + 1
    if raised == 1 then t_first = now() end
    if raised == n then t_last = now() end
  end
  local t_enq, t_create = start_all(n, worker, flags.before)
  local t_enqueued = now()
  uv.run()
  assert(raised == n, "not all waiters raised")
  -- The holder is not released: async-mutex would then grant and release its
  -- 100,000 phantom requests (its issue #54), which is not what is measured.
  assert(floor or release_holder)
  emit { scenario = "timeout", n = n, timeout_ms = timeout, made = made(flags.before),
         create_ms = t_create and ms(t_create), enqueue_ms = ms(t_enq),
         expire_ms = ms(t_last - t_first), work_ms = ms(t_enq + t_last - t_first),
         total_ms = ms(t_enq + t_last - t_enqueued) }
end

-- 5. n waiters, then cancel(): from cancel() until the last one has raised.
function S.cancel(n)
  n = n or 100000
  local raised, t_last = 0, nil
  local m, release_holder
  if not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
  end
  local function worker()
    if floor then
      floor.wait()
    else
      local ok, err = pcall(m.acquire, m)
      assert(not ok and err == am.E_CANCELED, err)
    end
    raised = raised + 1
    if raised == n then t_last = now() end
  end
  local t_enq, t_create = start_all(n, worker, flags.before)
  local t1 = now()
  if m then m:cancel() end
  uv.run()
  assert(raised == n, "not all waiters raised")
  if release_holder then release_holder() end
  emit { scenario = "cancel", n = n, made = made(flags.before),
         create_ms = t_create and ms(t_create), enqueue_ms = ms(t_enq),
         cancel_ms = ms(t_last - t1) }
end

-- 6. n waiters with random priorities 1..1000 behind a holder, then drained
-- (each acquires and releases); checks that they ran in priority order.
function S.priority(n)
  n = n or 100000
  local rand = lcg(42)
  local done, t_last, last_prio, inversions = 0, nil, math.huge, 0
  local m, release_holder
  if not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
  end
  local function worker(prio)
    if floor then
      floor.wait()
    else
      local release = m:acquire(prio)
      if prio > last_prio then inversions = inversions + 1 end
      last_prio = prio
      release()
    end
    done = done + 1
    if done == n then t_last = now() end
  end
  local t_enq, t_create = start_all(n, worker, flags.before, function() return rand(1000) end)
  local t1 = now()
  if release_holder then release_holder() end
  uv.run()
  assert(done == n and inversions == 0, "priority order broken")
  emit { scenario = "priority", n = n, made = made(flags.before),
         create_ns = t_create and t_create / n, enqueue_ns = t_enq / n,
         drain_ns = (t_last - t1) / n }
end

-- 7. A Semaphore of `value`; n coroutines acquire random weights 1..8 behind a
-- holder of the whole value, and release at once; from the holder's release.
function S.semaphore(n, value)
  n, value = n or 10000, value or 16
  local rand = lcg(7)
  local done, t_last = 0, nil
  local s, release_holder
  if not floor then
    s = am.Semaphore.new(value)
    local _
    _, release_holder = hold(s, value)
  end
  local function worker(weight)
    if floor then
      floor.wait()
    else
      local _, release = s:acquire(weight)
      release()
    end
    done = done + 1
    if done == n then t_last = now() end
  end
  for _ = 1, n do spawn(worker, rand(8)) end
  local t0 = now()
  if release_holder then release_holder() end
  uv.run()
  assert(done == n, "not all workers finished")
  if s then assert(s:getValue() == value) end
  emit { scenario = "semaphore", n = n, value = value, ms = ms(t_last - t0) }
end

-- 8. Memory: n coroutines waiting on a held mutex (floor: n bare suspended
-- coroutines), Lua heap after a full GC and RSS, per coroutine.
function S.memory(n)
  n = n or 100000
  local m, body
  if floor then
    body = function() coroutine.yield() end
  else
    m = am.Mutex.new()
    hold(m)
    body = function()
      local release = m:acquire()
      release()
    end
  end
  local cos = {}
  for i = 1, n do cos[i] = false end        -- the anchor array, preallocated
  full_gc()
  local heap0, rss0 = collectgarbage("count") * 1024, rss_bytes()
  for i = 1, n do cos[i] = spawn(body) end
  full_gc()
  local heap1, rss1 = collectgarbage("count") * 1024, rss_bytes()
  assert(floor or m:isLocked())
  emit { scenario = "memory", n = n, heap_b = (heap1 - heap0) / n,
         rss_b = (rss1 - rss0) / n, rss_mb = rss1 / 2 ^ 20 }
end

-- For callgrind: n uncontended acquire/release pairs, nothing else (the floor:
-- the same two C calls with no lock).  bench/run.lua subtracts a run of n
-- from a run of 2n, so that start-up and set-up cancel.
function S.pairs(n)
  n = n or 100000
  local m = api_floor and shape_lock("pairs") or floor and "x" or am.Mutex.new()
  local nop = coroutine.isyieldable
  spawn(function()
    for _ = 1, n do
      if floor then
        local _ = m:len()
        nop()
      else
        local release = m:acquire()
        release()
      end
    end
  end)
  uv.run()
  emit { scenario = "pairs", n = n }
end

-- For callgrind: n calls of m:runExclusive(noop) in one coroutine, as
-- `pairs` makes its pairs (issue 32's target: at most 1.7 times a pair).
function S.runs(n)
  n = n or 100000
  local m = am.Mutex.new()
  local function noop() end
  spawn(function()
    for _ = 1, n do m:runExclusive(noop) end
  end)
  uv.run()
  emit { scenario = "runs", n = n }
end

-- 9. Spawn: n coroutines started and ended at once (ours: am.spawn, a task;
-- floor: coroutine.create + resume, what am.spawn did before it made tasks);
-- with `wait`, each first queues for a held mutex (the floor: floor.wait),
-- and the time runs from the first start until the last has ended.
function S.spawn(n)
  n = n or 100000
  local wait = flags.wait
  local m, release_holder
  if wait and not floor then
    m = am.Mutex.new()
    release_holder = hold(m)
  end
  local done, t_end = 0, nil
  local function f()
    if wait then
      if floor then floor.wait() else m:acquire()() end
    end
    done = done + 1
    if done == n then t_end = now() end
  end
  full_gc()
  local t0 = now()
  if floor then
    for _ = 1, n do
      local co = create(f)
      resume(co)
    end
  else
    local spawn_task = am.spawn
    for _ = 1, n do spawn_task(f) end
  end
  if release_holder then release_holder() end
  uv.run()
  assert(done == n, "not all finished")
  emit { scenario = "spawn", n = n, wait = wait or false, ns = (t_end - t0) / n }
end

-- 10. Memory of a task: the Lua heap per task beyond its coroutine (ours
-- only): n tasks waiting for a held mutex against n coroutines of ours
-- making the same wait (coroutine.create + resume), each set in the same
-- process after a full collection; and the handle an ended task leaves.
function S.task_memory(n)
  assert(not floor, "task_memory: ours only")
  n = n or 100000
  local m = am.Mutex.new()
  hold(m)
  local function body() m:acquire() end
  local function heap_per(start)
    local keep = {}
    for i = 1, n do keep[i] = false end
    full_gc()
    local before = collectgarbage("count")
    for i = 1, n do keep[i] = start() end
    full_gc()
    local per = (collectgarbage("count") - before) * 1024 / n
    return per, keep
  end
  local bare, bares = heap_per(function() return spawn(body) end)
  local task, tasks = heap_per(function() return am.spawn(body) end)
  local handle = heap_per(function() return am.spawn(function() end) end)
  for i = 1, n do coroutine.close(bares[i]) end
  if type(tasks[1]) ~= "thread" then
    for i = 1, n do tasks[i]:cancel() end
  end
  emit { scenario = "task_memory", n = n, bare_b = bare, task_b = task,
         beyond_b = task - bare, handle_b = handle }
end

local f = S[scenario] or error("unknown scenario " .. tostring(scenario))
-- Only the scenarios with a timed enqueue loop take `before`.
if flags.before and not (scenario == "timeout" or scenario == "cancel" or scenario == "priority") then
  error(scenario .. ": no coroutines made in a timed loop; `before` does not apply")
end
f(nums[1], nums[2])
