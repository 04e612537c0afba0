-- Model-based random testing: runs generated sequences against the real
-- async_mutex module and against spec/fuzz/model.lua, op by op.
--
-- The steps, each in a file of its own:
--   1. generate   gen.lua: a seeded sequence of ops on a few locks
--   2. module     real.lua: each op played on the real module
--   3. model      model.lua: the same op applied to the model
--   4. compare    below: event logs, lock states, pending count, coroutines
--   5. shrink     shrink.lua: a failing sequence cut down to a shortest one
-- and the process pool of `make fuzz` in driver.lua.
--
-- As a module (spec/90-model_spec.lua):
--   local runner = require "fuzz.runner"
--   local res = runner.run_many{ start = 1, count = 2000 }   -- res.ok, res.report
-- As a script (from the repository root, or anywhere):
--   lua5.4 spec/fuzz/runner.lua run [START [COUNT]]   seeds START..START+COUNT-1
--   lua5.4 spec/fuzz/runner.lua replay FILE           one sequence (gen.serialize)
--   lua5.4 spec/fuzz/runner.lua show SEED             print a sequence
--   lua5.4 spec/fuzz/runner.lua fuzz N [J [SEED]]     N sequences in J child processes
--                                                     (`make fuzz N=... J=... SEED=...`)
-- Environment: AM_FUZZ_IMPL=DIR tests the module of another tree (a patched
-- copy); AM_FUZZ_EXCLUDE=cancel,close leaves op kinds out (to look past a
-- known bug); AM_FUZZ_MAX_OPS bounds sequence length (default 40);
-- AM_FUZZ_DRAIN=snapshot models a module that resumes settlements made during
-- a batch on the next turn; AM_FUZZ_CLOSE_DEAD=1 closes actors that died
-- (as coroutine.wrap does); AM_FUZZ_CLOSE_RUNEX=keep models a module where
-- closing a coroutine inside runExclusive keeps the lock; AM_GC_STRESS=1 as
-- in spec/helpers.lua;
-- AM_FUZZ_HANG_S (driver, default 60) seconds without progress = a hang.
--
-- Determinism.  Every state change of the lock happens inside an operation
-- the runner performs, except timer expiries and the resumptions the module
-- defers to the loop.  The runner turns the loop itself, one
-- `uv.run("nowait")` per "turn" op, after starting a 0 ms probe timer whose
-- callback reads uv.now(): that is exactly the loop time at which libuv runs
-- every timer due in that turn, so the model knows which withTimeout
-- deadlines (due = uv.now() at the call + ms) have passed and fires them in
-- libuv's order (due time, then start order).  (The module counts a
-- deadline from the clock read at the call, which the model cannot see:
-- while a sequence runs, core.clock pins it to uv.now(), the loop's cached
-- time, as the model counts.  spec/170-deadlines_spec.lua checks the
-- clock itself.)  The idle phase resumes the settlements: an idle probe
-- reads its loop time and whether it came before the timers, for libuv
-- decides the order of the two phases (1.44: timers first; 1.45 and later:
-- idle first, timers last), and the model plays them in that order (real.lua,
-- "loop turns").  Real time only decides *which* deadlines pass (turn ops
-- sleep 0-6 ms to make some of them pass), never how the model and the
-- module disagree.
--
-- Checked after every op: the event log (who got what, values, errors, in
-- order), isLocked/getValue of every lock, am.pending(), each actor's
-- coroutine state, and that no actor was resumed while not waiting on the
-- module.  At the end of a sequence: every actor ended, uv.run() returns, no
-- handle is left active, am.pending() is back where it was; every few
-- sequences: each object a sequence created has been collected (locks,
-- decorators, coroutines, releasers, error values) and the Lua heap is flat.

local uv = require "luv"

-- The repository root: this file is ROOT/spec/fuzz/runner.lua.
local paths = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/paths.lua")
local root = paths.lua(debug.getinfo(1, "S").source)
paths.build_unless_ours(root)

-- AM_FUZZ_IMPL=DIR: test the module built in another tree (DIR/src for the
-- Lua layer, DIR/build for core.so), e.g. a patched copy.
do
  local impl = os.getenv("AM_FUZZ_IMPL")
  if impl and impl ~= "" then
    package.path = ("%s/src/?.lua;%s/src/?/init.lua;"):format(impl, impl) .. package.path
    package.cpath = ("%s/build/?.so;"):format(impl) .. package.cpath
  end
end

local gen = require "fuzz.gen"
local model = require "fuzz.model"
local real = require "fuzz.real"
local shrink = require "fuzz.shrink"

local runner = { root = root }

local fail = real.fail
local describe_op = real.describe_op

local loaded_am
local function module()
  if not loaded_am then loaded_am = require "async_mutex" end
  return loaded_am
end

local function model_opts()
  return {
    drain = os.getenv("AM_FUZZ_DRAIN") or "all",
    close_runex_releases = os.getenv("AM_FUZZ_CLOSE_RUNEX") ~= "keep",
  }
end

--- Generator options from the environment: AM_FUZZ_EXCLUDE=cancel,close
-- leaves those op kinds out (to look past a known bug), AM_FUZZ_MAX_OPS.
function runner.gen_opts()
  local exclude = {}
  for k in (os.getenv("AM_FUZZ_EXCLUDE") or ""):gmatch("[%w_]+") do exclude[k] = true end
  return { exclude = exclude, max_ops = tonumber(os.getenv("AM_FUZZ_MAX_OPS") or "") }
end


-- {========================================================== 4. compare
-- A trial is one sequence under way: the module's run, the model's world,
-- and how far the comparison got (log entries already compared, the step).

-- The event logs: the entries added since the last comparison.
local function compare_logs(t)
  local log, wlog = t.run.log, t.w.log
  local differ = #log ~= #wlog
  for i = t.rlog_seen + 1, #log do
    if differ then break end
    differ = log[i] ~= wlog[i]
  end
  if differ then
    local exp, got = {}, {}
    for i = t.mlog_seen + 1, #wlog do exp[#exp + 1] = "    " .. wlog[i] end
    for i = t.rlog_seen + 1, #log do got[#got + 1] = "    " .. log[i] end
    fail(("events differ\n  model:\n%s\n  module:\n%s"):format(
      #exp > 0 and table.concat(exp, "\n") or "    (none)",
      #got > 0 and table.concat(got, "\n") or "    (none)"))
  end
  t.mlog_seen, t.rlog_seen = #wlog, #log
end

-- What the model and the actors found wrong on their own.
local function compare_violations(t)
  if #t.w.violations > 0 then fail("model invariant: " .. t.w.violations[1]) end
  if #t.run.violations > 0 then fail(t.run.violations[1]) end
end

-- A KeyedRWLock: count(), and each key's isLocked, readers, isWriteLocked
-- and waiting against the model's RWLock of that key (a free key: none).
local KEYS = { "a", "b" }
local function compare_keyed(li, lock, m)
  local n = 0
  for _ in pairs(m.subs) do n = n + 1 end
  if lock:count() ~= n then
    fail(("lock %d: count() is %d, the model has %d keys in use"):format(li, lock:count(), n))
  end
  for _, key in ipairs(KEYS) do
    local sub = model.sublock(m, key, false)
    local value = sub and sub.value or 0
    local queued, waiters = 0, 0
    if sub then
      queued = #sub.queue
      for _, list in pairs(sub.waiters) do waiters = waiters + #list end
    end
    local q, u = lock:waiting(key)
    if lock:isLocked(key) ~= (value ~= 0) or lock:readers(key) ~= math.max(value, 0)
        or lock:isWriteLocked(key) ~= (value == -1) or q ~= queued or u ~= waiters then
      fail(("lock %d key %s: isLocked %s, readers %d, isWriteLocked %s, waiting %d %d; "
        .. "the model says value %d, waiting %d %d"):format(li, key, tostring(lock:isLocked(key)),
        lock:readers(key), tostring(lock:isWriteLocked(key)), q, u, value, queued, waiters))
    end
  end
end

-- isLocked() and getValue() of every lock.
local function compare_locks(t)
  for li, spec in ipairs(t.seq.locks) do
    local lock, m = t.run.locks[li], t.w.locks[li]
    if spec.kind == "krw" then
      compare_keyed(li, lock, m)
      goto continue
    end
    local ok, locked = pcall(lock.isLocked, lock)
    if not ok then fail(("lock %d: isLocked raised %s"):format(li, tostring(locked))) end
    local m_locked = m.value <= 0
    if spec.kind == "rw" then m_locked = m.value ~= 0 end
    if locked ~= m_locked then
      fail(("lock %d: isLocked() is %s, the model says %s (value %d)"):format(
        li, tostring(locked), tostring(m_locked), m.value))
    end
    if spec.kind == "rw" then
      local readers, written = lock:readers(), lock:isWriteLocked()
      if readers ~= math.max(m.value, 0) or written ~= (m.value == -1) then
        fail(("lock %d: readers() %d and isWriteLocked() %s, the model says value %d"):format(
          li, readers, tostring(written), m.value))
      end
    end
    if spec.kind == "sema" then
      local v = lock:getValue()
      if v ~= m.value then
        fail(("lock %d: getValue() is %s, the model says %d"):format(li, tostring(v), m.value))
      end
    end
    if spec.kind == "re" then
      local depth = m.value <= 0 and m.levels or 0
      if lock:depth() ~= depth or lock:isHeldByMe() then
        fail(("lock %d: depth() is %d (isHeldByMe %s), the model says %d"):format(
          li, lock:depth(), tostring(lock:isHeldByMe()), depth))
      end
    end
    ::continue::
  end
end

-- am.pending(): the coroutines the module holds, queued, waiting or ready.
local function compare_pending(t)
  if t.pending0 then
    local p = t.am.pending() - t.pending0
    if p ~= t.w:pending() then
      fail(("am.pending() grew by %d, the model has %d coroutines queued or ready"):format(
        p, t.w:pending()))
    end
  end
end

-- Each actor's coroutine is where the model says it is.
local function compare_actors(t)
  local w, run = t.w, t.run
  for _, id in ipairs(w.order) do
    local ma, rec, co = w.actors[id], run.actors[id], run.cos[id]
    local s = ma.state
    if s == "queued" or s == "waiting" or s == "ready" then
      if not co then fail(("actor %d (%s) was collected"):format(id, s)) end
      if coroutine.status(co) ~= "suspended" or rec.phase ~= "module" then
        fail(("actor %d: the model says %s, the coroutine is %s in phase %s"):format(
          id, s, coroutine.status(co), rec.phase))
      end
    elseif s == "holding" then
      if rec.phase ~= "runner" then
        fail(("actor %d: the model says holding, the actor is in phase %s"):format(id, rec.phase))
      end
    else
      if co and coroutine.status(co) ~= "dead" then
        fail(("actor %d: the model says %s, the coroutine is %s (phase %s)"):format(
          id, s, coroutine.status(co), rec.phase))
      end
    end
  end
end

local function compare(t)
  compare_logs(t)
  compare_violations(t)
  compare_locks(t)
  compare_pending(t)
  compare_actors(t)
end

-- }==========================================================


-- {========================================================== one sequence

-- One op: skipped where the model says it does not apply (identically on
-- both sides), else played on the module (2), applied to the model at the
-- loop time the module saw (3), and compared (4).
local function step(t, op)
  t.step = t.step + 1
  t.op = op
  local w = t.w
  if not w:applicable(op) then
    t.stats.skipped = t.stats.skipped + 1
    return
  end
  t.stats.ops = t.stats.ops + 1
  local now = uv.now()                       -- the loop time of a request
  local actor = op.id and w.actors[op.id]
  local T, before = t.run:apply(op, actor and actor.state)
  w:apply(op, T or now, before)
  compare(t)
end

-- Rounds of clean-up ops, chosen by the model and compared like the others,
-- until every actor has ended.
local function clean_up(t)
  local w = t.w
  local rounds = 0
  while w:busy() do
    rounds = rounds + 1
    if rounds > #w.order + 10 then fail("actors still alive after the clean-up rounds") end
    for _, op in ipairs(w:cleanup_ops()) do step(t, op) end
  end
  t.op = nil
end

-- The whole trial, under xpcall.
local function play(t)
  t.run:open()
  compare(t)
  for _, op in ipairs(t.seq.ops) do step(t, op) end
  clean_up(t)
  real.check_quiet()
  if t.pending0 and t.am.pending() ~= t.pending0 then
    fail(("am.pending() is %d after the sequence, %d before"):format(t.am.pending(), t.pending0))
  end
end

-- An error in play that is not a failure of the sequence: a runner bug.
local function as_failure(x)
  if getmetatable(x) == real.Failure then return x end
  return setmetatable({ msg = "error in the runner: " .. debug.traceback(tostring(x), 2) },
    real.Failure)
end

--- Runs one sequence.  Returns true, stats or false, failure
-- (failure.msg, failure.step, failure.op).
function runner.run_sequence(seq, opts)
  opts = opts or {}
  local am = module()
  local t = {
    seq = seq, am = am,
    w = model.new(seq.locks, opts.model or model_opts()),   -- 3. the model
    run = real.new(seq, am),                                 -- 2. the module
    pending0 = type(am.pending) == "function" and am.pending() or nil,
    mlog_seen = 0, rlog_seen = 0,
    step = 0, op = nil,
    stats = { ops = 0, skipped = 0 },
  }
  local core = require "async_mutex.core"
  local clock = core.clock(function() return uv.now() * 1e6 end)
  local ok, e = xpcall(play, as_failure, t)
  core.clock(clock)
  t.run:close()
  if not ok then
    e.step = t.step
    e.op = t.op
    e.seed = seq.seed
    return false, e
  end
  return true, t.stats
end

-- }==========================================================


-- {========================================================== 5. shrink

runner.leak_check = real.leak_check

-- How shrink.lua replays and simplifies our sequences.
local SHRINK = {
  script = root .. "/spec/fuzz/runner.lua",
  replay_cmd = "lua5.4 spec/fuzz/runner.lua replay",
  serialize = gen.serialize,
  root = root,
  name = "fuzz",
  simplify = { "deco", "via", "nilargs", "sleep" },
}

--- Shrinks a sequence that fails, replaying candidates in fresh processes.
-- Returns the report lines.
function runner.shrink_report(seq)
  return shrink.report(seq, SHRINK)
end

local function format_failure(seq, failure)
  return ("seed %s: step %d, op %s\n  %s"):format(
    tostring(seq.seed), failure.step or 0, describe_op(failure.op), failure.msg:gsub("\n", "\n  "))
end

--- Reports a failing sequence: the failure, then the shrunk sequence.
function runner.report(seq, failure, opts)
  opts = opts or {}
  local out = { "FAILURE " .. format_failure(seq, failure) }
  if opts.shrink ~= false then
    for _, line in ipairs(runner.shrink_report(seq)) do out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

-- }==========================================================


-- {========================================================== many sequences

-- The report of objects that outlived their sequence: the objects, then the
-- earliest leaking seed replayed (replay checks for leaks too) and shrunk.
local function leak_report(alive, opts)
  local first = math.huge
  for _, what in ipairs(alive) do
    first = math.min(first, tonumber(what:match("^seed (%-?%d+)")) or math.huge)
  end
  local out = { "LEAK: objects still alive after their sequence ended:\n  "
    .. table.concat(alive, "\n  ", 1, math.min(#alive, 20)) }
  if first ~= math.huge and opts.shrink ~= false then
    out[#out + 1] = ("FAILURE seed %d leaks (replay checks for leaks too)"):format(first)
    for _, line in ipairs(runner.shrink_report(gen.sequence(first, opts.gen or runner.gen_opts()))) do
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n")
end

--- Runs seeds start..start+count-1: 1. generate, then run_sequence.  Returns
-- { ok, sequences, ops, seconds, report }.  opts.leak_every: sequences
-- between leak checks (default 100).
local run_many
function runner.run_many(opts)
  local res = run_many(opts)
  real.close_probe()
  return res
end

function run_many(opts)
  local start, count = opts.start or 1, opts.count or 1000
  local leak_every = opts.leak_every or 100
  local t0 = uv.hrtime()
  local total_ops, done = 0, 0
  local mem_base
  -- report: a string, or a function making it after the time is taken
  local function result(ok, seed, report)
    local res = { ok = ok, sequences = done, ops = total_ops,
                  seconds = (uv.hrtime() - t0) / 1e9, seed = seed }
    if type(report) == "function" then res.report = report() else res.report = report end
    return res
  end
  for seed = start, start + count - 1 do
    if opts.progress then opts.progress(seed) end
    local seq = gen.sequence(seed, opts.gen or runner.gen_opts())        -- 1. generate
    local ok, res = runner.run_sequence(seq, opts)
    if not ok then
      if opts.on_failure then opts.on_failure(seed) end
      return result(false, seed, function() return runner.report(seq, res, opts) end)
    end
    total_ops = total_ops + res.ops
    done = done + 1
    if done % leak_every == 0 or seed == start + count - 1 then
      local alive = real.leak_check()
      if #alive > 0 then
        if opts.on_failure then opts.on_failure(seed) end
        return result(false, seed, leak_report(alive, opts))
      end
      local kb = collectgarbage("count")
      if not mem_base then
        mem_base = kb
      elseif kb - mem_base > (opts.mem_slack_kb or 512) then
        return result(false, seed,
          ("LEAK: the Lua heap grew from %.0f KB to %.0f KB"):format(mem_base, kb))
      end
    end
  end
  return result(true)
end

runner.describe_op = describe_op
runner.format_failure = format_failure

-- }==========================================================


-- Command line ------------------------------------------------------------

local function main(argv)
  local cmd = argv[1]
  if os.getenv("AM_GC_STRESS") == "1" then       -- as spec/helpers.lua does
    collectgarbage("incremental", 1, 1000)
  end
  if cmd == "show" then
    print(gen.serialize(gen.sequence(tonumber(argv[2]))))
    return 0
  elseif cmd == "replay" then
    local seq = assert(loadfile(argv[2]))()
    local ok, res = runner.run_sequence(seq)
    real.close_probe()
    if ok then
      local alive = real.leak_check()
      if #alive > 0 then
        print("LEAK: " .. table.concat(alive, ", "))
        return 1
      end
      print(("ok: %d ops (%d skipped)"):format(res.ops, res.skipped))
      return 0
    end
    print("FAILURE " .. format_failure(seq, res))
    return 1
  elseif cmd == "run" then
    local start = tonumber(argv[2]) or 1
    local count = tonumber(argv[3]) or 1000
    io.stdout:setvbuf("line")
    local res = runner.run_many({
      start = start, count = count,
      progress = (argv[4] == "progress" or os.getenv("AM_FUZZ_PROGRESS"))
        and function(seed) io.stdout:write("S ", seed, "\n") end,
      on_failure = argv[4] == "progress" and function(seed) io.stdout:write("F ", seed, "\n") end,
    })
    if res.ok then
      print(("OK %d sequences %d ops %.2f s"):format(res.sequences, res.ops, res.seconds))
      return 0
    end
    print(res.report)
    print(("FAILED after %d sequences %d ops %.2f s"):format(res.sequences, res.ops, res.seconds))
    return 1
  elseif cmd == "fuzz" then
    return require("fuzz.driver").main(argv, {
      script = SHRINK.script,
      crash_report = function(seed)
        return runner.shrink_report(gen.sequence(seed, runner.gen_opts()))
      end,
    })
  end
  io.stderr:write("usage: runner.lua run [START [COUNT]] | replay FILE | show SEED | fuzz N [J]\n")
  return 2
end

if not pcall(debug.getlocal, 4, 1) then        -- run as a script, not required
  os.exit(main(arg))
end

return runner
