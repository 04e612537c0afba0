-- The module side of a model-based test (spec/fuzz/runner.lua): one
-- generated sequence played on the real async_mutex, op by op.
--
-- A run creates the sequence's locks (and its decorated locks, on first use),
-- spawns one coroutine per actor that follows the script model.lua describes,
-- applies each op to the module, and turns the luv loop itself for "turn"
-- ops.  Everything the actors see goes into the run's event log, in the
-- format of the model's log (model.lua), so that the runner can compare the
-- two after every op; anything an actor sees that the model cannot express
-- (a second end to one wait, a resume while it waits on the runner) is a
-- violation.
--
--   local run = real.new(seq, am)
--   run:open()                   -- the locks; the module's error handler
--   local T, before = run:apply(op)  -- a "turn": its loop times, else nil
--   real.check_quiet()           -- at the end: uv.run() returns, nothing active
--   run:close()                  -- the previous error handler back
--
-- A failure of the run itself (an actor's coroutine collected while the model
-- says it waits, a turn without its probe) raises real.fail(msg).

local uv = require "luv"
local gen = require "fuzz.gen"

local real = {}

-- The actors' coroutines wait on the runner with WAIT and are resumed with
-- RUNNER_KEY; any other resume is a violation.
local RUNNER_KEY = setmetatable({}, { __name = "RUNNER_KEY" })
local WAIT = setmetatable({}, { __name = "WAIT" })
local SERR = "custom string error"         -- the label "serr": a string error

-- AM_FUZZ_CLOSE_DEAD=1: the runner closes an actor that died with an error
-- (what coroutine.wrap does), instead of leaving it dead and unclosed.
local CLOSE_DEAD = os.getenv("AM_FUZZ_CLOSE_DEAD") == "1"


-- {========================================================== failures

--- A failure of a sequence, raised as an object so that the runner tells it
-- from an error in the runner itself.
real.Failure = {}
real.Failure.__index = real.Failure

function real.fail(msg) error(setmetatable({ msg = msg }, real.Failure), 0) end
local fail = real.fail

--- One op as the text gen.serialize gives it, for reports.
function real.describe_op(op)
  if not op then return "(end of sequence)" end
  local s = gen.serialize({ seed = 0, locks = {}, ops = { op } })
  return s:match("ops = {\n    (.-),\n  },")
end

-- }==========================================================


-- {========================================================== leaks

-- Objects created by sequences, to be collected once a sequence is over:
-- object -> "seed N what".
local registry = setmetatable({}, { __mode = "k" })

--- Full collections; returns the descriptions of registered objects still
-- alive (a leak), and clears the registry.
function real.leak_check()
  collectgarbage("collect")
  collectgarbage("collect")
  local alive = {}
  for _, what in pairs(registry) do alive[#alive + 1] = what end
  table.sort(alive)
  for k in pairs(registry) do registry[k] = nil end
  return alive
end

-- }==========================================================


-- {========================================================== loop turns

-- A turn is one uv.run("nowait") after starting a 0 ms probe timer, whose
-- callback reads uv.now(): the loop time at which libuv runs every timer due
-- in that turn (see "Determinism" in runner.lua), and an idle probe, which
-- reads the loop time of the turn's idle phase, where the module resumes
-- what it settled (docs/semantics.md, Coroutines and the loop), and whether
-- that phase came before the timers.  libuv's order of the two is its own:
-- 1.44 runs the timers first in a turn, 1.45 and later the idle handles
-- first and the timers last (after the poll); the model plays the turn in
-- the order the loop ran it.  (Our idle probe, started last, runs before
-- the module's idle handle in the same phase, at the same loop time.)  The
-- probes are created on first use and closed by real.close_probe, so that
-- no handle of ours outlives a run.
local probe, idle_probe
local probe_time, idle_time
local function probe_cb() probe_time = uv.now() end
local function idle_cb()
  idle_probe:stop()
  idle_time = { at = uv.now(), first = probe_time == nil }
end

function real.close_probe()
  if probe then
    probe:close()
    idle_probe:close()
    probe, idle_probe = nil, nil
    uv.run("nowait")                         -- let the close complete
  end
end

-- Sleeps `sleep` ms of real time (so that some deadlines pass), turns the
-- loop once; returns the loop time its timers ran at and, when its idle
-- phase ran before them, the loop time of that phase.
local function turn(sleep)
  if sleep and sleep > 0 then uv.sleep(sleep) end
  probe_time, idle_time = nil, nil
  probe = probe or uv.new_timer()
  idle_probe = idle_probe or uv.new_idle()
  probe:start(0, 0, probe_cb)
  idle_probe:start(idle_cb)
  uv.run("nowait")
  if not probe_time then fail("the probe timer did not fire in a loop turn") end
  if not idle_time then fail("the idle probe did not run in a loop turn") end
  return probe_time, idle_time.first and idle_time.at or nil
end

-- }==========================================================


-- {========================================================== events
-- What the actors see, as the runner compares it: the event log, the
-- violations, and the labels of the error values.  An actor's coroutine
-- keeps only this (and its own lock) alive, not the whole run: a coroutine
-- a failed sequence leaves in the module holds on to little.

local Events = {}
Events.__index = Events

function Events:emit(s) self.log[#self.log + 1] = s end
function Events:violation(msg) self.violations[#self.violations + 1] = msg end

--- The label of an error value raised by the module (model.lua's ERR).
function Events:label(e)
  local am = self.am
  if e == am.E_TIMEOUT then return "E_TIMEOUT" end
  if e == am.E_CANCELED then return "E_CANCELED" end
  if e == am.E_ALREADY_LOCKED then return "E_ALREADY_LOCKED" end
  if e == am.E_LOST then return "E_LOST" end
  if e == SERR then return "serr" end
  if (type(e) == "table" or type(e) == "userdata") and self.labels[e] then return self.labels[e] end
  return (("?%s:%s"):format(type(e), tostring(e)):gsub("%s+", "_"))
end

-- }==========================================================


local Run = {}
Run.__index = Run

--- A run of `seq` on the module `am`.
function real.new(seq, am)
  local events = setmetatable({
    am = am,
    tag = "seed " .. tostring(seq.seed),     -- for the leak check
    log = {},
    violations = {},
    labels = setmetatable({}, { __mode = "k" }),  -- error value -> label
  }, Events)
  return setmetatable({
    seq = seq,
    am = am,
    events = events,
    log = events.log,                        -- the event log
    violations = events.violations,
    errs = setmetatable({}, { __mode = "v" }),    -- label -> error value
    actors = {},                             -- id -> record (strong)
    cos = setmetatable({}, { __mode = "v" }),     -- id -> coroutine (weak)
    locks = {},                              -- lock index -> lock
    decos = {},                              -- lock index -> key -> decorated lock
    signals = {},                            -- index -> abort signal
  }, Run)
end


-- {========================================================== error values

--- The error value of `label` ("serr": a string; other labels: a table made
-- on first use, registered for the leak check); nil for nil.
function Run:error_value(label)
  if label == nil then return nil end
  if label == "serr" then return SERR end
  local e = self.errs[label]
  if not e then
    e = setmetatable({}, { __name = label })
    self.errs[label] = e
    self.events.labels[e] = label
    registry[e] = self.events.tag .. " error " .. label
  end
  return e
end

-- }==========================================================


-- {========================================================== locks

--- Creates the sequence's locks and routes the module's reports of errors
-- escaping the coroutines it resumes into the log.
function Run:open()
  local am = self.am
  for li, spec in ipairs(self.seq.locks) do
    local e = self:error_value(spec.cancel ~= "E_CANCELED" and spec.cancel or nil)
    local lock
    if spec.kind == "mutex" then
      if e ~= nil then lock = am.Mutex.new(e) else lock = am.Mutex.new() end
    elseif spec.kind == "rw" then
      if e ~= nil then lock = am.RWLock.new(e) else lock = am.RWLock.new() end
    elseif spec.kind == "re" then
      if e ~= nil then lock = am.ReentrantMutex.new(e) else lock = am.ReentrantMutex.new() end
    elseif spec.kind == "krw" then
      if e ~= nil then lock = am.KeyedRWLock.new({ cancelError = e }) else lock = am.KeyedRWLock.new() end
    else
      if e ~= nil then lock = am.Semaphore.new(spec.value, e) else lock = am.Semaphore.new(spec.value) end
    end
    self.locks[li] = lock
    registry[lock] = self.events.tag .. " lock " .. li
  end
  if type(am.setErrorHandler) == "function" then
    local events = self.events
    self.prev_handler = am.setErrorHandler(function(e)
      events:emit("handler " .. events:label(e))
    end)
  end
end

--- Gives the module its previous error handler back.
function Run:close()
  local am = self.am
  if self.prev_handler ~= nil or type(am.setErrorHandler) == "function" then
    am.setErrorHandler(self.prev_handler)
  end
end

--- Lock `li`, decorated as `d` says (nil: the plain lock); one decorated
-- lock per lock and decoration, made on first use.
function Run:decorated(li, d)
  if not d then return self.locks[li] end
  local am = self.am
  local lease = d.lease
  local key = d.kind .. ":" .. tostring(d.ms) .. ":" .. tostring(d.err)
    .. (lease and (":lease:%s:%s:%s"):format(lease.ms, tostring(lease.from), tostring(lease.err)) or "")
    .. (d.sig and (":sig:%d:%s"):format(d.sig, d.so and "out" or "in") or "")
  self.decos[li] = self.decos[li] or {}
  local obj = self.decos[li][key]
  if not obj then
    local e = self:error_value(d.err)
    local base = self.locks[li]
    if d.sig and not d.so then base = am.withSignal(base, self:signal(d.sig)) end
    if d.kind == "t" then
      if e ~= nil then obj = am.withTimeout(base, d.ms, e)
      else obj = am.withTimeout(base, d.ms) end
    elseif d.kind == "try" then
      if e ~= nil then obj = am.tryAcquire(base, e)
      else obj = am.tryAcquire(base) end
    else
      obj = base
    end
    if d.sig and d.so then obj = am.withSignal(obj, self:signal(d.sig)) end
    if lease then                           -- the lease decorates the decorated lock
      local opts = lease.from and { fromRequest = true } or nil
      obj = am.withLease(obj, lease.ms, self:error_value(lease.err), opts)
    end
    self.decos[li][key] = obj
    registry[obj] = self.events.tag .. " decorator " .. key
  end
  return obj
end

--- Abort signal `i` of the sequence, made on first use.
function Run:signal(i)
  local s = self.signals[i]
  if not s then
    s = self.am.signal()
    self.signals[i] = s
    registry[s] = self.events.tag .. " signal " .. i
  end
  return s
end

--- The arguments of a request on lock `li` (weight and priority, or
-- priority), nil for the defaults when op.nilargs says so.
function Run:request_args(li, op)
  local kind = self.seq.locks[li].kind
  if kind == "krw" then                    -- the key first
    if op.nilargs and op.p == 0 then return { n = 1, op.key } end
    return { n = 2, op.key, op.p }
  end
  if kind == "sema" then
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

-- }==========================================================


-- {========================================================== actors
-- An actor is a record (id, method, plan, phase, outcomes, ...) and a
-- coroutine running one of the bodies below.  Its phase says where it is:
-- "module" (in a lock operation), "runner" (holding, waiting for the
-- runner's finish or raise), "running", "dead".

local function callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

local function value_text(rec, v)
  if not rec.sema then return "-" end
  return tostring(v)
end

-- The holding actor waits for the runner's next command.
local function wait_command(ev, rec)
  rec.phase = "runner"
  rec.held = coroutine.running()             -- the runner anchors its holders
  while true do
    local key, cmd = coroutine.yield(WAIT)
    if key == RUNNER_KEY then
      rec.phase, rec.held = "running", nil
      return cmd
    end
    ev:violation(("actor %d was resumed while it was waiting on the runner"):format(rec.id))
  end
end

-- A ReentrantMutex holder's nested level: acquired again (at once), held by
-- a to-be-closed releaser until the runner says "unnest" (returned), or
-- "finish" or "raise" (passed down, leaving every level on the way).
-- A re-entry that raised (its signal aborted) makes no level: the next
-- command is the current level's.
local nest_level
local function serve(ev, rec, cmd)
  while cmd == "nest" do
    local ok, rel = pcall(rec.obj.acquire, rec.obj)
    if ok then
      cmd = nest_level(ev, rec, rel)
      if cmd == "unnest" then cmd = wait_command(ev, rec) end
    else
      ev:emit(("nestfail %d %s"):format(rec.id, ev:label(rel)))
      cmd = wait_command(ev, rec)
    end
  end
  return cmd
end

function nest_level(ev, rec, rel)
  local _ <close> = rel
  ev:emit(("nest %d %d"):format(rec.id, rec.lock:depth()))
  local cmd = serve(ev, rec, wait_command(ev, rec))
  if cmd == "unnest" then
    rel()
    ev:emit(("unnest %d"):format(rec.id))
  end
  return cmd
end

-- The holding actor waits for the runner; returns its command (finish or
-- raise), its nested levels left.
local function wait_runner(ev, rec)
  local cmd = serve(ev, rec, wait_command(ev, rec))
  if cmd == "unnest" then
    ev:violation(("actor %d was told to unnest with no nested level"):format(rec.id))
  end
  return cmd
end

-- The actor's lock operation returned (or raised): once per wait.
local function returned_from_module(ev, rec)
  if rec.phase ~= "module" then
    ev:violation(("actor %d returned from the module in phase %s"):format(rec.id, rec.phase))
  end
  rec.phase = "running"
  rec.outcomes = rec.outcomes + 1
  if rec.outcomes > 1 then ev:violation(("actor %d ended its wait twice"):format(rec.id)) end
end

-- acquire / tbc: takes the lock, logs "got", holds until the runner says;
-- tbc holds through a to-be-closed releaser, which the runner may make raise.
local function acquire_body(ev, rec, obj, args)
  local id = rec.id
  return function()
    rec.phase = "module"
    local r = table.pack(pcall(obj[rec.acquire], obj, table.unpack(args, 1, args.n)))
    returned_from_module(ev, rec)
    if not r[1] then
      ev:emit(("err %d %s"):format(id, ev:label(r[2])))
      rec.phase = "dead"
      return
    end
    local v, rel, shape_ok
    if rec.sema then
      v, rel = r[2], r[3]
      shape_ok = r.n == 3 and math.type(v) == "integer" and callable(rel)
    else
      rel = r[2]
      shape_ok = r.n == 2 and callable(rel)
    end
    rec.rel = rel
    if rel ~= nil and type(rel) ~= "string" then registry[rel] = ev.tag .. " releaser " .. id end
    local bad = shape_ok and "" or (" BADRESULT n=" .. r.n)
    if rec.method == "acquire" or rec.method == "steal" then
      ev:emit(("got %d %s%s"):format(id, value_text(rec, v), bad))
      wait_runner(ev, rec)
      ev:emit(("end %d"):format(id))
    else
      local ok, e = pcall(function()
        local guard <close> = rel           -- luacheck: ignore guard
        ev:emit(("got %d %s%s"):format(id, value_text(rec, v), bad))
        local cmd = wait_runner(ev, rec)
        if cmd == "raise" then error(rec.raise_obj, 0) end
      end)
      if ok then ev:emit(("end %d"):format(id)) else ev:emit(("end %d %s"):format(id, ev:label(e))) end
    end
    rec.phase = "dead"
  end
end

-- runex: runExclusive with a body that returns, raises, or holds until the
-- runner says; "raise_unprot" lets the error escape the actor's coroutine.
local function runex_body(ev, rec, obj, args)
  local id, plan = rec.id, rec.plan
  local function body(...)
    rec.phase = "running"
    local n, v = select("#", ...), ...
    local args_ok
    if rec.sema then args_ok = n == 1 and math.type(v) == "integer"
    else args_ok = n == 0 end
    ev:emit(("enter %d %s%s"):format(id, value_text(rec, v), args_ok and "" or (" BADARGS n=" .. n)))
    if plan == "return" then return id, nil, "r" end
    if plan == "raise" or plan == "raise_unprot" then error(rec.raise_obj, 0) end
    local cmd = wait_runner(ev, rec)
    if cmd == "raise" then error(rec.raise_obj, 0) end
    return id, nil, "r"
  end
  -- runExclusive(fn, ...) or, keyed, runExclusive(key, fn, ...)
  local call = { n = args.n + 1 }
  if rec.keyed then
    call[1], call[2] = args[1], body
    for i = 2, args.n do call[i + 1] = args[i] end
  else
    call[1] = body
    for i = 1, args.n do call[i + 1] = args[i] end
  end
  return function()
    rec.phase = "module"
    if plan == "raise_unprot" then
      obj[rec.run](obj, table.unpack(call, 1, call.n))
      ev:emit(("done %d UNEXPECTED"):format(id))
      rec.phase = "dead"
      return
    end
    local r = table.pack(pcall(obj[rec.run], obj, table.unpack(call, 1, call.n)))
    if rec.phase == "module" then returned_from_module(ev, rec) end
    if r[1] then
      local good = r.n == 4 and r[2] == id and r[3] == nil and r[4] == "r"
      ev:emit(("done %d%s"):format(id, good and "" or (" BADRESULT n=" .. r.n)))
    else
      ev:emit(("err %d %s"):format(id, ev:label(r[2])))
    end
    rec.phase = "dead"
  end
end

-- wait: waitForUnlock, logs "unlocked" or the error.
local function wait_body(ev, rec, obj, args)
  local id = rec.id
  return function()
    rec.phase = "module"
    local ok, e = pcall(obj.waitForUnlock, obj, table.unpack(args, 1, args.n))
    returned_from_module(ev, rec)
    if ok then ev:emit(("unlocked %d"):format(id)) else ev:emit(("err %d %s"):format(id, ev:label(e))) end
    rec.phase = "dead"
  end
end

local BODIES = { acquire = acquire_body, tbc = acquire_body, runex = runex_body, wait = wait_body,
                 steal = acquire_body }

-- An actor that died with an error while the runner resumed it.
function Run:died(id, co, e)
  self.events:emit(("died %d %s"):format(id, self.events:label(e)))
  self.actors[id].phase, self.actors[id].held = "dead", nil
  if CLOSE_DEAD then coroutine.close(co) end
end

function Run:spawn(op)
  local kind = self.seq.locks[op.lock].kind
  local sema = kind == "sema"
  local rw = kind == "rw" or kind == "krw"
  local read = rw and op.w == 1               -- an RWLock: op.w is the mode
  local rec = {
    id = op.id, method = op.method, plan = op.plan, sema = sema, keyed = kind == "krw",
    acquire = op.method == "steal" and (read and "stealRead" or "steal")
      or not rw and "acquire" or read and "acquireRead" or "acquireWrite",
    run = read and "runShared" or "runExclusive",
    phase = "new", outcomes = 0, raise_obj = setmetatable({}, { __name = "raise" }),
    leased = op.deco ~= nil and op.deco.lease ~= nil,
    lock = self.locks[op.lock],
  }
  self.events.labels[rec.raise_obj] = "raise#" .. op.id
  self.actors[op.id] = rec
  local obj = self:decorated(op.lock, op.deco)
  rec.obj = obj
  local args = self:request_args(op.lock, op)
  local co = coroutine.create(BODIES[op.method](self.events, rec, obj, args))
  self.cos[op.id] = co
  registry[co] = self.events.tag .. " actor " .. op.id
  local ok, e = coroutine.resume(co)
  if not ok then self:died(op.id, co, e) end
end

-- Resumes holding actor `id` with `cmd` ("finish" or "raise").
function Run:resume_holder(id, cmd)
  local rec = self.actors[id]
  local co = rec.held
  if not co then fail(("actor %d is not waiting on the runner (phase %s)"):format(id, rec.phase)) end
  local ok, e = coroutine.resume(co, RUNNER_KEY, cmd)
  if not ok then self:died(id, co, e) end
end

-- The coroutine of actor `id`, which the model says is alive (state).
function Run:coroutine_of(id, state)
  local co = self.cos[id]
  if not co then
    fail(("the coroutine of actor %d was collected while it was %s"):format(id, state))
  end
  return co
end

-- }==========================================================


-- {========================================================== ops
-- One function per op kind (gen.lua lists them); `state` is the model's
-- state of the op's actor, for messages.  "turn" returns the loop time.

local OPS = {}

OPS.spawn = function(run, op) run:spawn(op) end

OPS.finish = function(run, op) run:resume_holder(op.id, "finish") end
OPS.raise = function(run, op) run:resume_holder(op.id, "raise") end

OPS.close = function(run, op, state)
  local rec = run.actors[op.id]
  local ok, e = coroutine.close(run:coroutine_of(op.id, state))
  if not ok then run.events:emit(("closefail %d %s"):format(op.id, run.events:label(e))) end
  rec.held = nil
  rec.phase = "dead"
end

OPS.call_rel = function(run, op)
  local rec = run.actors[op.id]
  local ok, e = pcall(rec.rel)
  if not ok then run.events:emit(("relfail %d %s"):format(op.id, run.events:label(e)))
  elseif rec.leased then run.events:emit(("rel %d %s"):format(op.id, tostring(e))) end
end

OPS.check = function(run, op)
  local rel = run.actors[op.id].rel
  local ok, e = pcall(rel.check, rel)
  run.events:emit(("check %d %s"):format(op.id, ok and tostring(e) or run.events:label(e)))
end

OPS.nest = function(run, op) run:resume_holder(op.id, "nest") end
OPS.unnest = function(run, op) run:resume_holder(op.id, "unnest") end

OPS.unscoped = function(run, op)
  local obj = run:decorated(op.lock, op.via)
  local ok, e
  if run.seq.locks[op.lock].kind == "sema" then
    ok, e = pcall(obj.release, obj, op.w or 1)
  elseif op.key ~= nil then
    ok, e = pcall(obj.release, obj, op.key)
  else
    ok, e = pcall(obj.release, obj)
  end
  if not ok then run.events:emit(("opfail release %s"):format(run.events:label(e))) end
end

OPS.setValue = function(run, op)
  local obj = run:decorated(op.lock, op.via)
  local ok, e = pcall(obj.setValue, obj, op.v)
  if not ok then run.events:emit(("opfail setValue %s"):format(run.events:label(e))) end
end

OPS.cancel = function(run, op)
  local obj = run:decorated(op.lock, op.via)
  local ok, e = pcall(obj.cancel, obj, op.key)
  if not ok then run.events:emit(("opfail cancel %s"):format(run.events:label(e))) end
end

OPS.abort = function(run, op)
  local s, e = run:signal(op.sig), run:error_value(op.err)
  local ok, err
  if e ~= nil then ok, err = pcall(s.abort, s, e) else ok, err = pcall(s.abort, s) end
  if not ok then run.events:emit(("opfail abort %s"):format(run.events:label(err))) end
end

OPS.gc = function() collectgarbage("collect") end

OPS.poke = function(run, op, state)
  local ok, e = coroutine.resume(run:coroutine_of(op.id, state), "poke")
  if not ok then run.events:emit(("pokefail %d %s"):format(op.id, run.events:label(e))) end
end

OPS.turn = function(_, op) return turn(op.sleep) end

--- Applies `op` to the module; returns the loop times of a "turn" (turn()
-- above).  `state`: the model's state of the op's actor (for messages).
function Run:apply(op, state)
  return OPS[op.op](self, op, state)
end

-- }==========================================================


--- At the end of a sequence: uv.run() returns (nothing of ours keeps the
-- loop alive) and no handle is left active.
function real.check_quiet()
  local hung = false
  local guard = uv.new_timer()
  guard:start(3000, 0, function() hung = true; uv.stop() end)
  guard:unref()
  uv.run()
  local active = {}
  uv.walk(function(h)
    if h ~= guard and h ~= probe and h ~= idle_probe and not h:is_closing() and h:is_active() then
      active[#active + 1] = tostring(h)
    end
  end)
  guard:close()
  uv.run("nowait")
  if hung then fail("uv.run() did not return after the sequence") end
  if #active > 0 then fail("handles left active: " .. table.concat(active, ", ")) end
end

return real
