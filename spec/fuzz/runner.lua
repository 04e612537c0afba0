-- Model-based random testing: runs generated sequences against the real
-- async_mutex module and against spec/fuzz/model.lua, step by step.
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
-- libuv's order (due time, then start order).  Then the idle phase resumes the
-- settlements.  Real time only decides *which* deadlines pass (turn ops sleep
-- 0-6 ms to make some of them pass), never how the model and the module
-- disagree.
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
local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/fuzz/[^/]*$") or "."

if not package.path:find(root .. "/spec/?.lua", 1, true) then
  package.path = ("%s/src/?.lua;%s/src/?/init.lua;%s/spec/?.lua;"):format(root, root, root)
    .. package.path
end
-- A build of this checkout already on the path is the one under test
-- (`make asan` puts build/asan first): two builds loaded at once would
-- share one scheduler.  Otherwise (an installed copy, or none) build/.
do
  local found = package.searchpath("async_mutex.core", package.cpath)
  local ours = found and (not found:match("^/") or found:sub(1, #root + 1) == root .. "/")
  if not ours then
    package.cpath = ("%s/build/?.so;"):format(root) .. package.cpath
  end
end

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

local runner = { root = root }

local RUNNER_KEY = setmetatable({}, { __name = "RUNNER_KEY" })
local WAIT = setmetatable({}, { __name = "WAIT" })
local SERR = "custom string error"

-- AM_FUZZ_CLOSE_DEAD=1: the runner closes an actor that died with an error
-- (what coroutine.wrap does), instead of leaving it dead and unclosed.
local CLOSE_DEAD = os.getenv("AM_FUZZ_CLOSE_DEAD") == "1"

-- Objects created by sequences, to be collected once a sequence is over.
local registry = setmetatable({}, { __mode = "k" })

-- The probe timer (see "Determinism" above), created on first use and
-- closed by run_many, so that no handle of ours outlives a run.
local probe
local probe_time
local function probe_cb() probe_time = uv.now() end
local function close_probe()
  if probe then
    probe:close()
    probe = nil
    uv.run("nowait")                         -- let the close complete
  end
end

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

-- Failure raised inside a sequence run.
local Failure = {}
Failure.__index = Failure
local function fail(msg) error(setmetatable({ msg = msg }, Failure), 0) end

local function describe_op(op)
  if not op then return "(end of sequence)" end
  local s = gen.serialize({ seed = 0, locks = {}, ops = { op } })
  return s:match("ops = {\n    (.-),\n  },")
end

--- Runs one sequence.  Returns true, stats or false, failure
-- (failure.msg, failure.step, failure.op).
function runner.run_sequence(seq, opts)
  opts = opts or {}
  local am = module()
  local w = model.new(seq.locks, opts.model or model_opts())
  local log = {}
  local labels = setmetatable({}, { __mode = "k" })
  local errs = setmetatable({}, { __mode = "v" })
  local actors = {}                        -- id -> record (strong)
  local cos = setmetatable({}, { __mode = "v" })  -- id -> coroutine (weak)
  local violations = {}
  local locks, decos = {}, {}
  local tag = "seed " .. tostring(seq.seed)
  local step, cur_op = 0, nil
  local stats = { ops = 0, skipped = 0 }

  local function violation(msg) violations[#violations + 1] = msg end
  local function emit(s) log[#log + 1] = s end

  local function err_obj(label)
    if label == nil then return nil end
    if label == "serr" then return SERR end
    local e = errs[label]
    if not e then
      e = setmetatable({}, { __name = label })
      errs[label] = e
      labels[e] = label
      registry[e] = tag .. " error " .. label
    end
    return e
  end

  local function label(e)
    if e == am.E_TIMEOUT then return "E_TIMEOUT" end
    if e == am.E_CANCELED then return "E_CANCELED" end
    if e == am.E_ALREADY_LOCKED then return "E_ALREADY_LOCKED" end
    if e == SERR then return "serr" end
    if (type(e) == "table" or type(e) == "userdata") and labels[e] then return labels[e] end
    return (("?%s:%s"):format(type(e), tostring(e)):gsub("%s+", "_"))
  end

  local function deco_of(li, d)
    if not d then return locks[li] end
    local key = d.kind .. ":" .. tostring(d.ms) .. ":" .. tostring(d.err)
    decos[li] = decos[li] or {}
    local obj = decos[li][key]
    if not obj then
      local e = err_obj(d.err)
      if d.kind == "t" then
        if e ~= nil then obj = am.withTimeout(locks[li], d.ms, e)
        else obj = am.withTimeout(locks[li], d.ms) end
      else
        if e ~= nil then obj = am.tryAcquire(locks[li], e)
        else obj = am.tryAcquire(locks[li]) end
      end
      decos[li][key] = obj
      registry[obj] = tag .. " decorator " .. key
    end
    return obj
  end

  local function callable(f)
    if type(f) == "function" then return true end
    local mt = getmetatable(f)
    return type(mt) == "table" and mt.__call ~= nil
  end

  -- Builds the coroutine body of actor `rec` (see model.lua for the script).
  local function actor_body(rec, obj, args)
    local id, sema = rec.id, rec.sema
    local function wait_runner()
      rec.phase = "runner"
      rec.held = coroutine.running()        -- the runner anchors its holders
      while true do
        local key, cmd = coroutine.yield(WAIT)
        if key == RUNNER_KEY then
          rec.phase, rec.held = "running", nil
          return cmd
        end
        violation(("actor %d was resumed while it was waiting on the runner"):format(id))
      end
    end
    local function vtext(v)
      if not sema then return "-" end
      return tostring(v)
    end
    local function returned_from_module()
      if rec.phase ~= "module" then
        violation(("actor %d returned from the module in phase %s"):format(id, rec.phase))
      end
      rec.phase = "running"
      rec.outcomes = rec.outcomes + 1
      if rec.outcomes > 1 then violation(("actor %d ended its wait twice"):format(id)) end
    end
    local method = rec.method

    if method == "acquire" or method == "tbc" then
      return function()
        rec.phase = "module"
        local r = table.pack(pcall(obj.acquire, obj, table.unpack(args, 1, args.n)))
        returned_from_module()
        if not r[1] then
          emit(("err %d %s"):format(id, label(r[2])))
          rec.phase = "dead"
          return
        end
        local v, rel, shape_ok
        if sema then
          v, rel = r[2], r[3]
          shape_ok = r.n == 3 and math.type(v) == "integer" and callable(rel)
        else
          rel = r[2]
          shape_ok = r.n == 2 and callable(rel)
        end
        rec.rel = rel
        if rel ~= nil and type(rel) ~= "string" then registry[rel] = tag .. " releaser " .. id end
        local bad = shape_ok and "" or (" BADRESULT n=" .. r.n)
        if method == "acquire" then
          emit(("got %d %s%s"):format(id, vtext(v), bad))
          wait_runner()
          emit(("end %d"):format(id))
        else
          local ok, e = pcall(function()
            local guard <close> = rel       -- luacheck: ignore guard
            emit(("got %d %s%s"):format(id, vtext(v), bad))
            local cmd = wait_runner()
            if cmd == "raise" then error(rec.raise_obj, 0) end
          end)
          if ok then emit(("end %d"):format(id)) else emit(("end %d %s"):format(id, label(e))) end
        end
        rec.phase = "dead"
      end
    elseif method == "runex" then
      local plan = rec.plan
      local function body(...)
        rec.phase = "running"
        local n, v = select("#", ...), ...
        local args_ok
        if sema then args_ok = n == 1 and math.type(v) == "integer"
        else args_ok = n == 0 end
        emit(("enter %d %s%s"):format(id, vtext(v), args_ok and "" or (" BADARGS n=" .. n)))
        if plan == "return" then return id, nil, "r" end
        if plan == "raise" or plan == "raise_unprot" then error(rec.raise_obj, 0) end
        local cmd = wait_runner()
        if cmd == "raise" then error(rec.raise_obj, 0) end
        return id, nil, "r"
      end
      return function()
        rec.phase = "module"
        if plan == "raise_unprot" then
          obj.runExclusive(obj, body, table.unpack(args, 1, args.n))
          emit(("done %d UNEXPECTED"):format(id))
          rec.phase = "dead"
          return
        end
        local r = table.pack(pcall(obj.runExclusive, obj, body, table.unpack(args, 1, args.n)))
        if rec.phase == "module" then returned_from_module() end
        if r[1] then
          local good = r.n == 4 and r[2] == id and r[3] == nil and r[4] == "r"
          emit(("done %d%s"):format(id, good and "" or (" BADRESULT n=" .. r.n)))
        else
          emit(("err %d %s"):format(id, label(r[2])))
        end
        rec.phase = "dead"
      end
    else -- wait
      return function()
        rec.phase = "module"
        local ok, e = pcall(obj.waitForUnlock, obj, table.unpack(args, 1, args.n))
        returned_from_module()
        if ok then emit(("unlocked %d"):format(id)) else emit(("err %d %s"):format(id, label(e))) end
        rec.phase = "dead"
      end
    end
  end

  local function lock_args(li, op)
    local sema = seq.locks[li].kind == "sema"
    if sema then
      local wt, p = op.w, op.p
      if op.nilargs then
        if wt == 1 then wt = nil end
        if p == 0 then p = nil end
      end
      return { n = 2, wt, p }
    else
      local p = op.p
      if op.nilargs and p == 0 then return { n = 0 } end
      return { n = 1, p }
    end
  end

  -- Real side of each op.
  local function real_spawn(op)
    local sema = seq.locks[op.lock].kind == "sema"
    local rec = {
      id = op.id, method = op.method, plan = op.plan, sema = sema,
      phase = "new", outcomes = 0, raise_obj = setmetatable({}, { __name = "raise" }),
    }
    labels[rec.raise_obj] = "raise#" .. op.id
    actors[op.id] = rec
    local obj = deco_of(op.lock, op.deco)
    local args = lock_args(op.lock, op)
    local co = coroutine.create(actor_body(rec, obj, args))
    cos[op.id] = co
    registry[co] = tag .. " actor " .. op.id
    local ok, e = coroutine.resume(co)
    if not ok then
      emit(("died %d %s"):format(op.id, label(e)))
      rec.phase = "dead"
      if CLOSE_DEAD then coroutine.close(co) end
    end
  end

  local function resume_holder(id, cmd)
    local rec = actors[id]
    local co = rec.held
    if not co then fail(("actor %d is not waiting on the runner (phase %s)"):format(id, rec.phase)) end
    local ok, e = coroutine.resume(co, RUNNER_KEY, cmd)
    if not ok then
      emit(("died %d %s"):format(id, label(e)))
      rec.phase, rec.held = "dead", nil
      if CLOSE_DEAD then coroutine.close(co) end
    end
  end

  local function via(li, op)
    if op.via then return deco_of(li, op.via) end
    return locks[li]
  end

  local function real_apply(op)
    local k = op.op
    if k == "spawn" then
      real_spawn(op)
    elseif k == "finish" or k == "raise" then
      resume_holder(op.id, k)
    elseif k == "close" then
      local rec = actors[op.id]
      local co = cos[op.id]
      if not co then fail(("the coroutine of actor %d was collected while it was %s"):format(
        op.id, w.actors[op.id].state)) end
      local ok, e = coroutine.close(co)
      if not ok then emit(("closefail %d %s"):format(op.id, label(e))) end
      rec.held = nil
      rec.phase = "dead"
    elseif k == "call_rel" then
      local ok, e = pcall(actors[op.id].rel)
      if not ok then emit(("relfail %d %s"):format(op.id, label(e))) end
    elseif k == "unscoped" then
      local obj = via(op.lock, op)
      local ok, e
      if seq.locks[op.lock].kind == "sema" then
        ok, e = pcall(obj.release, obj, op.w or 1)
      else
        ok, e = pcall(obj.release, obj)
      end
      if not ok then emit(("opfail release %s"):format(label(e))) end
    elseif k == "setValue" then
      local obj = via(op.lock, op)
      local ok, e = pcall(obj.setValue, obj, op.v)
      if not ok then emit(("opfail setValue %s"):format(label(e))) end
    elseif k == "cancel" then
      local obj = via(op.lock, op)
      local ok, e = pcall(obj.cancel, obj)
      if not ok then emit(("opfail cancel %s"):format(label(e))) end
    elseif k == "gc" then
      collectgarbage("collect")
    elseif k == "poke" then
      local co = cos[op.id]
      if not co then fail(("the coroutine of actor %d was collected while it was %s"):format(
        op.id, w.actors[op.id].state)) end
      local ok, e = coroutine.resume(co, "poke")
      if not ok then emit(("pokefail %d %s"):format(op.id, label(e))) end
    elseif k == "turn" then
      if op.sleep and op.sleep > 0 then uv.sleep(op.sleep) end
      probe_time = nil
      probe = probe or uv.new_timer()
      probe:start(0, 0, probe_cb)
      uv.run("nowait")
      if not probe_time then fail("the probe timer did not fire in a loop turn") end
      return probe_time
    end
  end

  local pending0 = type(am.pending) == "function" and am.pending() or nil
  local mlog_seen, rlog_seen = 0, 0

  local function compare()
    -- 1. the event log
    if #log ~= #w.log or (function()
      for i = rlog_seen + 1, #log do if log[i] ~= w.log[i] then return true end end
      return false
    end)() then
      local exp, got = {}, {}
      for i = mlog_seen + 1, #w.log do exp[#exp + 1] = "    " .. w.log[i] end
      for i = rlog_seen + 1, #log do got[#got + 1] = "    " .. log[i] end
      fail(("events differ\n  model:\n%s\n  module:\n%s"):format(
        #exp > 0 and table.concat(exp, "\n") or "    (none)",
        #got > 0 and table.concat(got, "\n") or "    (none)"))
    end
    mlog_seen, rlog_seen = #w.log, #log
    -- 2. violations
    if #w.violations > 0 then fail("model invariant: " .. w.violations[1]) end
    if #violations > 0 then fail(violations[1]) end
    -- 3. lock state
    for li, spec in ipairs(seq.locks) do
      local lock, m = locks[li], w.locks[li]
      local ok, locked = pcall(lock.isLocked, lock)
      if not ok then fail(("lock %d: isLocked raised %s"):format(li, tostring(locked))) end
      if locked ~= (m.value <= 0) then
        fail(("lock %d: isLocked() is %s, the model says %s (value %d)"):format(
          li, tostring(locked), tostring(m.value <= 0), m.value))
      end
      if spec.kind == "sema" then
        local v = lock:getValue()
        if v ~= m.value then
          fail(("lock %d: getValue() is %s, the model says %d"):format(li, tostring(v), m.value))
        end
      end
    end
    -- 4. pending
    if pending0 then
      local p = am.pending() - pending0
      if p ~= w:pending() then
        fail(("am.pending() grew by %d, the model has %d coroutines queued or ready"):format(
          p, w:pending()))
      end
    end
    -- 5. each actor's coroutine
    for _, id in ipairs(w.order) do
      local ma, rec, co = w.actors[id], actors[id], cos[id]
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

  local function do_op(op)
    step = step + 1
    cur_op = op
    if not w:applicable(op) then
      stats.skipped = stats.skipped + 1
      return
    end
    stats.ops = stats.ops + 1
    local now = uv.now()
    local T = real_apply(op)
    w:apply(op, T or now)
    compare()
  end

  local prev_handler
  local function body()
    for li, spec in ipairs(seq.locks) do
      local e = err_obj(spec.cancel ~= "E_CANCELED" and spec.cancel or nil)
      local lock
      if spec.kind == "mutex" then
        if e ~= nil then lock = am.Mutex.new(e) else lock = am.Mutex.new() end
      else
        if e ~= nil then lock = am.Semaphore.new(spec.value, e) else lock = am.Semaphore.new(spec.value) end
      end
      locks[li] = lock
      registry[lock] = tag .. " lock " .. li
    end
    if type(am.setErrorHandler) == "function" then
      prev_handler = am.setErrorHandler(function(e)
        emit("handler " .. label(e))
      end)
    end
    compare()
    for _, op in ipairs(seq.ops) do do_op(op) end
    -- clean up, driven by the model, still compared step by step
    local rounds = 0
    while w:busy() do
      rounds = rounds + 1
      if rounds > #w.order + 10 then fail("actors still alive after the clean-up rounds") end
      for _, op in ipairs(w:cleanup_ops()) do do_op(op) end
    end
    cur_op = nil
    -- uv.run() must return: nothing of ours keeps the loop alive
    local hung = false
    local guard = uv.new_timer()
    guard:start(3000, 0, function() hung = true; uv.stop() end)
    guard:unref()
    uv.run()
    local active = {}
    uv.walk(function(h)
      if h ~= guard and h ~= probe and not h:is_closing() and h:is_active() then
        active[#active + 1] = tostring(h)
      end
    end)
    guard:close()
    uv.run("nowait")
    if hung then fail("uv.run() did not return after the sequence") end
    if #active > 0 then fail("handles left active: " .. table.concat(active, ", ")) end
    if pending0 and am.pending() ~= pending0 then
      fail(("am.pending() is %d after the sequence, %d before"):format(am.pending(), pending0))
    end
  end

  local ok, e = xpcall(body, function(x)
    if getmetatable(x) == Failure then return x end
    return setmetatable({ msg = "error in the runner: " .. debug.traceback(tostring(x), 2) }, Failure)
  end)
  if prev_handler ~= nil or type(am.setErrorHandler) == "function" then
    am.setErrorHandler(prev_handler)
  end
  if not ok then
    e.step = step
    e.op = cur_op
    e.seed = seq.seed
    return false, e
  end
  return true, stats
end

--- Full collections; returns the descriptions of registered objects still
-- alive (a leak), and clears the registry.
function runner.leak_check()
  collectgarbage("collect")
  collectgarbage("collect")
  local alive = {}
  for _, what in pairs(registry) do alive[#alive + 1] = what end
  table.sort(alive)
  for k in pairs(registry) do registry[k] = nil end
  return alive
end

-- Runs `seq` in a fresh interpreter; true when it passes.
local function lua_cmd()
  return os.getenv("LUA") or "lua5.4"
end
local self_path = root .. "/spec/fuzz/runner.lua"
local REPLAY_TIMEOUT = 30                      -- seconds: a hang counts as a failure

function runner.replay_subprocess(seq)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(gen.serialize(seq), "\n")
  f:close()
  local ok = os.execute(("timeout -s KILL %d %s %s replay %s >/dev/null 2>&1"):format(
    REPLAY_TIMEOUT, lua_cmd(), self_path, name))
  os.remove(name)
  return ok == true
end

--- Delta debugging over the op list: the shortest sub-list (1-minimal) for
-- which fails(seq) holds.
function runner.shrink(seq, fails, log)
  local function with(ops)
    return { seed = seq.seed, locks = seq.locks, ops = ops }
  end
  local ops = seq.ops
  local tries = 0
  local function test(cand)
    tries = tries + 1
    return fails(with(cand))
  end
  local n = 2
  while #ops >= 2 do
    local size = math.ceil(#ops / n)
    local reduced = false
    for i = 1, n do
      local lo, hi = (i - 1) * size + 1, math.min(i * size, #ops)
      if lo > #ops then break end
      local cand = {}
      for j = 1, #ops do
        if j < lo or j > hi then cand[#cand + 1] = ops[j] end
      end
      if #cand < #ops and test(cand) then
        ops = cand
        n = math.max(n - 1, 2)
        reduced = true
        if log then log(("  shrink: %d ops"):format(#ops)) end
        break
      end
    end
    if not reduced then
      if n >= #ops then break end
      n = math.min(n * 2, #ops)
    end
  end
  -- one-at-a-time removal until nothing more can go
  local changed = true
  while changed do
    changed = false
    local i = 1
    while i <= #ops and #ops > 1 do
      local cand = {}
      for j = 1, #ops do if j ~= i then cand[#cand + 1] = ops[j] end end
      if test(cand) then
        ops = cand
        changed = true
      else
        i = i + 1
      end
    end
  end
  -- simplify each op: drop optional fields
  for i = 1, #ops do
    for _, field in ipairs({ "deco", "via", "nilargs", "sleep" }) do
      if ops[i][field] ~= nil then
        local cand = {}
        for j = 1, #ops do cand[j] = ops[j] end
        local copy = {}
        for k, v in pairs(ops[i]) do copy[k] = v end
        copy[field] = nil
        cand[i] = copy
        if test(cand) then ops = cand end
      end
    end
  end
  return with(ops), tries
end

local function format_failure(seq, failure)
  return ("seed %s: step %d, op %s\n  %s"):format(
    tostring(seq.seed), failure.step or 0, describe_op(failure.op), failure.msg:gsub("\n", "\n  "))
end

--- Shrinks a sequence that fails, replaying candidates in fresh processes.
-- A failure that depends on timing may not show on every run: the number of
-- attempts per candidate adapts to how many the whole sequence needed.
-- Returns the report lines.
function runner.shrink_report(seq)
  local attempts
  for k = 1, 5 do
    if not runner.replay_subprocess(seq) then attempts = k break end
  end
  if not attempts then
    return { "the sequence passes when replayed alone (5 attempts): it needs the "
      .. "sequences run before it in the same process, or a timing that did not recur" }
  end
  local per = attempts == 1 and 1 or math.min(5, 2 * attempts)
  local small, tries = runner.shrink(seq, function(s)
    for _ = 1, per do
      if not runner.replay_subprocess(s) then return true end
    end
    return false
  end)
  local text = gen.serialize(small)
  local file = ("%s/build/fuzz-seed-%s.lua"):format(root, tostring(seq.seed))
  os.execute(("mkdir -p '%s/build'"):format(root))
  local f = io.open(file, "w")
  if f then f:write(text, "\n"); f:close() end
  return {
    ("shortest reproducing sequence (%d of %d ops, %d tries%s):"):format(
      #small.ops, #seq.ops, tries, per > 1 and (", flaky: " .. per .. " attempts each") or ""),
    text,
    ("replay: lua5.4 spec/fuzz/runner.lua replay %s"):format(f and file or "FILE"),
  }
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

--- Runs seeds start..start+count-1.  Returns { ok, sequences, ops, seconds,
-- report }.  opts.leak_every: sequences between leak checks (default 100).
local run_many
function runner.run_many(opts)
  local res = run_many(opts)
  close_probe()
  return res
end

function run_many(opts)
  local start, count = opts.start or 1, opts.count or 1000
  local leak_every = opts.leak_every or 100
  local t0 = uv.hrtime()
  local total_ops, done = 0, 0
  local mem_base
  for seed = start, start + count - 1 do
    if opts.progress then opts.progress(seed) end
    local seq = gen.sequence(seed, opts.gen or runner.gen_opts())
    local ok, res = runner.run_sequence(seq, opts)
    if not ok then
      if opts.on_failure then opts.on_failure(seed) end
      return { ok = false, sequences = done, ops = total_ops,
               seconds = (uv.hrtime() - t0) / 1e9, seed = seed,
               report = runner.report(seq, res, opts) }
    end
    total_ops = total_ops + res.ops
    done = done + 1
    if done % leak_every == 0 or seed == start + count - 1 then
      local alive = runner.leak_check()
      if #alive > 0 then
        local first = math.huge
        for _, what in ipairs(alive) do
          first = math.min(first, tonumber(what:match("^seed (%-?%d+)")) or math.huge)
        end
        if opts.on_failure then opts.on_failure(seed) end
        local out = { "LEAK: objects still alive after their sequence ended:\n  "
          .. table.concat(alive, "\n  ", 1, math.min(#alive, 20)) }
        if first ~= math.huge and opts.shrink ~= false then
          out[#out + 1] = ("FAILURE seed %d leaks (replay checks for leaks too)"):format(first)
          for _, line in ipairs(runner.shrink_report(gen.sequence(first, opts.gen or runner.gen_opts()))) do
            out[#out + 1] = line
          end
        end
        return { ok = false, sequences = done, ops = total_ops,
                 seconds = (uv.hrtime() - t0) / 1e9, seed = seed,
                 report = table.concat(out, "\n") }
      end
      local kb = collectgarbage("count")
      if not mem_base then
        mem_base = kb
      elseif kb - mem_base > (opts.mem_slack_kb or 512) then
        return { ok = false, sequences = done, ops = total_ops,
                 seconds = (uv.hrtime() - t0) / 1e9, seed = seed,
                 report = ("LEAK: the Lua heap grew from %.0f KB to %.0f KB"):format(mem_base, kb) }
      end
    end
  end
  return { ok = true, sequences = done, ops = total_ops, seconds = (uv.hrtime() - t0) / 1e9 }
end

runner.describe_op = describe_op
runner.format_failure = format_failure

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
    close_probe()
    if ok then
      local alive = runner.leak_check()
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
    return require("fuzz.driver").main(argv, runner)
  end
  io.stderr:write("usage: runner.lua run [START [COUNT]] | replay FILE | show SEED | fuzz N [J]\n")
  return 2
end

if not pcall(debug.getlocal, 4, 1) then        -- run as a script, not required
  os.exit(main(arg))
end

return runner
