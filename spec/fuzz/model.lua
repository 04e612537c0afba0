-- An executable model of the contract of the single locks (docs/semantics.md,
-- with its port decisions P1-P6), for model-based random testing
-- (spec/fuzz/runner.lua).
--
-- Plain Lua, lists and loops, no cleverness: every rule below is written the
-- way docs/semantics.md states it, so that a reader can check the model
-- against the text section by section.  The model also plays the scripted "actors" (the
-- coroutines the runner spawns), so that it can predict the exact log of
-- events the real run produces, in order.
--
-- A world holds locks (Mutex, Semaphore or RWLock), actors, and the FIFO of
-- settlements that the module resumes on the next loop turn.  Time comes from
-- outside: the runner passes the luv loop time of every operation that may
-- start a timer and of every loop turn.
--
-- Log entries (strings, compared verbatim with the real run):
--   got ID V        acquire returned to actor ID with value V ("-" for a Mutex)
--   enter ID V      runExclusive called the body of actor ID with V ("-": no args)
--   done ID         runExclusive of actor ID returned the body's results
--   end ID [ERR]    a holding actor left its scope (ERR: the error it raised)
--   err ID ERR      the lock operation of actor ID raised ERR
--   unlocked ID     waitForUnlock of actor ID returned
--   died ID ERR     actor ID died with ERR while the runner resumed it
--   handler ERR     the module reported an error escaping a coroutine it resumed
-- ERR is a label: E_TIMEOUT, E_CANCELED, E_ALREADY_LOCKED, a custom error name,
-- or raise#ID for the error object actor ID raises from its body.
--
-- Where async-mutex leaves a question open, the model takes what a user
-- would expect (docs/semantics.md, Where async-mutex is silent):
-- * waitForUnlock waiters and acquirers settled by one release share the
--   FIFO of settlements (drain before each grant, as upstream);
-- * a timeout is settled before the grants its removal allows (P1);
-- * a coroutine closed while queued or waiting leaves at once and the lock
--   passes on; closed after its grant but before its resumption, it is never
--   resumed and the grant is given back the way its releaser would (so a
--   Mutex only while it is locked, P3); its other settlements are dropped;
-- * closing a coroutine that holds the lock inside runExclusive, or through a
--   `<close>` releaser, releases it; a plain releaser stays callable;
-- * a waiting coroutine resumed by someone else ("poke") goes on waiting;
-- * the settlements made while the module resumes a batch are resumed in the
--   same loop turn (opts.drain = "all"; "snapshot" defers them to the next).
--
-- An RWLock ("rw", docs/lockkinds.md, RWLock) is the same queue with another
-- "fits": its value is the number of readers, or -1 while a writer holds it;
-- an actor's weight is its mode, 1 to read and 2 to write (waitForUnlock
-- waits as a write).  Its unscoped release ends a write only.

local model = {}

local World = {}
World.__index = World

--- Creates a world.  lock_specs: list of {kind = "mutex"|"sema"|"rw", value = n,
-- cancel = label|nil}.  opts.drain: "all" (default: a loop turn also resumes
-- the settlements made while it resumes) or "snapshot" (only those queued
-- before the turn started).  opts.close_runex_releases: closing a coroutine suspended in a
-- runExclusive body releases the lock (default true).
function model.new(lock_specs, opts)
  opts = opts or {}
  local w = setmetatable({
    locks = {},
    actors = {},          -- id -> actor
    order = {},           -- actor ids in spawn order
    fifo = {},            -- settlements waiting for a loop turn
    log = {},
    tseq = 0,             -- timer creation counter (libuv start order)
    drain = opts.drain or "all",
    close_runex_releases = opts.close_runex_releases ~= false,
    violations = {},
  }, World)
  for i, spec in ipairs(lock_specs) do
    w.locks[i] = {
      index = i,
      kind = spec.kind,
      value = spec.kind == "mutex" and 1 or spec.kind == "rw" and 0 or spec.value,
      cancel = spec.cancel or "E_CANCELED",
      queue = {},         -- acquirers, priority descending, FIFO among equals
      waiters = {},       -- weight -> list of waitForUnlock waiters, same order
    }
  end
  return w
end

local function emit(w, s)
  w.log[#w.log + 1] = s
end

local function violation(w, msg)
  w.violations[#w.violations + 1] = msg
end

-- Insert after the last entry whose priority is >= the new one's.
local function insert_by_priority(list, e)
  local pos = 0
  for i = 1, #list do
    if list[i].prio >= e.prio then pos = i end
  end
  table.insert(list, pos + 1, e)
end

local function remove_from(list, e)
  for i = 1, #list do
    if list[i] == e then
      table.remove(list, i)
      return true
    end
  end
  return false
end

-- Can the lock grant `weight`, queue aside?  A Semaphore or Mutex: the
-- value covers it.  An RWLock: a read while no writer holds, a write while
-- nobody holds.
local function fits(lock, weight)
  if lock.kind == "rw" then
    if weight == 2 then return lock.value == 0 end
    return lock.value >= 0
  end
  return weight <= lock.value
end
model.fits = fits

-- docs/semantics.md, Grant rule: for acquire and waitForUnlock alike.
local function can_lock_now(lock, weight, prio)
  return (#lock.queue == 0 or lock.queue[1].prio < prio) and fits(lock, weight)
end
model.can_lock_now = can_lock_now

local function value_text(lock, v)
  if lock.kind ~= "sema" then return "-" end
  return tostring(v)
end

-- Queues a settlement for the next loop turn.
local function settle(w, actor, kind, value, label)
  if actor.state ~= "queued" and actor.state ~= "waiting" then
    violation(w, ("actor %d settled (%s) while %s"):format(actor.id, kind, actor.state))
  end
  actor.state = "ready"
  actor.entry = nil
  w.fifo[#w.fifo + 1] = { actor = actor, kind = kind, value = value, label = label }
end

local function check_mutex(w, lock)
  if lock.kind == "mutex" and lock.value ~= 0 and lock.value ~= 1 then
    violation(w, ("mutex %d has value %d (two holders)"):format(lock.index, lock.value))
  end
  if lock.kind == "rw" and lock.value < -1 then
    violation(w, ("rwlock %d has value %d (two writers)"):format(lock.index, lock.value))
  end
end

-- Ownership passes: value before the decrement is handed out.
local function grant(w, lock, actor)
  local prev = lock.value
  if lock.kind == "rw" then
    if actor.w == 2 and lock.value ~= 0 or lock.value < 0 then
      violation(w, ("rwlock %d granted mode %d at value %d"):format(lock.index, actor.w, lock.value))
    end
    lock.value = actor.w == 2 and -1 or lock.value + 1
  else
    lock.value = lock.value - actor.w
  end
  check_mutex(w, lock)
  actor.rel = { lock = lock, weight = actor.w, called = false }
  if lock.kind == "mutex" or lock.kind == "rw" and actor.w == 2 then
    lock.holder = actor.rel                  -- the grant that holds it
  end
  return prev
end

-- docs/semantics.md, waitForUnlock (and P6: over the registered weights, not
-- 1..value).  Before each queued dispatch, resolve the waitForUnlock waiters
-- that could lock now: all with weight <= value if the queue is empty, else
-- those with priority strictly greater than the head's.  Order: descending
-- weight, then list order.
local function drain(w, lock)
  local weights = {}
  for weight in pairs(lock.waiters) do weights[#weights + 1] = weight end
  table.sort(weights, function(a, b) return a > b end)
  local head = lock.queue[1]
  for _, weight in ipairs(weights) do
    if fits(lock, weight) then
      local keep = {}
      for _, e in ipairs(lock.waiters[weight]) do
        if head == nil or e.prio > head.prio then
          settle(w, e.actor, "unlocked")
        else
          keep[#keep + 1] = e
        end
      end
      lock.waiters[weight] = #keep > 0 and keep or nil
    end
  end
end

-- docs/semantics.md, Dispatch: drain, then grant strictly from the head while
-- it fits.
local function dispatch(w, lock)
  drain(w, lock)
  while #lock.queue > 0 and fits(lock, lock.queue[1].weight) do
    local e = table.remove(lock.queue, 1)
    local prev = grant(w, lock, e.actor)
    settle(w, e.actor, "grant", prev)
    drain(w, lock)
  end
end

-- A releaser: the first call releases.  A Mutex releaser only ends its own
-- grant: a no-op once m:release() unlocked the mutex (P3), even if someone
-- else holds it since.
local function release_rel(w, rel)
  if rel.called then return end
  rel.called = true
  local lock = rel.lock
  if lock.kind == "mutex" then
    if lock.value <= 0 and lock.holder == rel then
      lock.value = lock.value + 1
      dispatch(w, lock)
    end
  elseif lock.kind == "rw" then
    if rel.weight == 1 and lock.value > 0 then
      lock.value = lock.value - 1
      dispatch(w, lock)
    elseif rel.weight == 2 and lock.value == -1 and lock.holder == rel then
      lock.value = 0
      dispatch(w, lock)
    end
  else
    lock.value = lock.value + rel.weight
    dispatch(w, lock)
  end
end

-- An error leaves actor `a` (ctx: "sync" while the runner starts it, "runner"
-- while the runner resumes it, "deliver" while the module resumes it).
local function error_out(w, a, label, ctx)
  a.state = "done"
  if a.method == "runex" and a.plan == "raise_unprot" then
    if ctx == "deliver" then
      emit(w, "handler " .. label)
    else
      emit(w, ("died %d %s"):format(a.id, label))
    end
  else
    emit(w, ("err %d %s"):format(a.id, label))
  end
end

-- The actor's script after its lock operation succeeded with value v.
local function after_grant(w, a, v, ctx)
  local lock = w.locks[a.lock]
  if a.method == "acquire" or a.method == "tbc" then
    a.rel_visible = true
    emit(w, ("got %d %s"):format(a.id, value_text(lock, v)))
    a.state = "holding"
    return
  end
  -- runExclusive
  emit(w, ("enter %d %s"):format(a.id, value_text(lock, v)))
  if a.plan == "return" then
    release_rel(w, a.rel)
    a.state = "done"
    emit(w, ("done %d"):format(a.id))
  elseif a.plan == "raise" or a.plan == "raise_unprot" then
    release_rel(w, a.rel)
    error_out(w, a, "raise#" .. a.id, ctx)
  else                                -- "hold": the body waits for the runner
    a.state = "holding"
  end
end

-- Resumes the settlement s (a loop turn).
local function deliver(w, s)
  local a = s.actor
  if a.state ~= "ready" then
    violation(w, ("delivering to actor %d in state %s"):format(a.id, a.state))
    return
  end
  if s.kind == "grant" then
    after_grant(w, a, s.value, "deliver")
  elseif s.kind == "unlocked" then
    a.state = "done"
    emit(w, ("unlocked %d"):format(a.id))
  else
    error_out(w, a, s.label, "deliver")
  end
end

local function new_entry(w, a, now, timeout_ms, timeout_label)
  local e = { actor = a, weight = a.w, prio = a.p }
  if timeout_ms then
    w.tseq = w.tseq + 1
    e.due = now + timeout_ms
    e.tseq = w.tseq
    e.timeout_label = timeout_label
  end
  a.entry = e
  return e
end

--- Starts actor `op` (op.op == "spawn") at loop time `now`.
-- op: id, lock, method ("acquire"|"tbc"|"runex"|"wait"), w, p,
-- plan (runex: "return"|"raise"|"raise_unprot"|"hold"),
-- deco (nil | {kind = "t", ms = n, err = label|nil} | {kind = "try", err = label|nil}).
function World:spawn(op, now)
  local lock = self.locks[op.lock]
  local a = {
    id = op.id, lock = op.lock, method = op.method,
    w = lock.kind == "mutex" and 1 or lock.kind == "rw" and op.method == "wait" and 2
      or op.w, p = op.p,
    plan = op.plan, deco = op.deco, state = "new",
  }
  if self.actors[a.id] then
    violation(self, "duplicate actor id " .. a.id)
    return
  end
  self.actors[a.id] = a
  self.order[#self.order + 1] = a.id
  local deco = op.deco
  local timeout_ms, timeout_label
  if deco and deco.kind == "t" then
    timeout_ms, timeout_label = deco.ms, deco.err or "E_TIMEOUT"
  end
  if a.method == "wait" then
    if can_lock_now(lock, a.w, a.p) then
      a.state = "done"
      emit(self, ("unlocked %d"):format(a.id))
    elseif deco and deco.kind == "try" then           -- P2
      error_out(self, a, deco.err or "E_ALREADY_LOCKED", "sync")
    else
      local e = new_entry(self, a, now, timeout_ms, timeout_label)
      e.kind = "wait"
      lock.waiters[a.w] = lock.waiters[a.w] or {}
      insert_by_priority(lock.waiters[a.w], e)
      a.state = "waiting"
    end
    return
  end
  if can_lock_now(lock, a.w, a.p) then                -- fast path, no yield
    local prev = grant(self, lock, a)
    after_grant(self, a, prev, "sync")
  elseif deco and deco.kind == "try" then             -- P2: nothing queued
    error_out(self, a, deco.err or "E_ALREADY_LOCKED", "sync")
  else
    local e = new_entry(self, a, now, timeout_ms, timeout_label)
    e.kind = "acq"
    insert_by_priority(lock.queue, e)
    a.state = "queued"
  end
end

--- Runner resumes holding actor `id` to leave normally.
function World:finish(id)
  local a = self.actors[id]
  if a.method == "tbc" or a.method == "runex" then release_rel(self, a.rel) end
  a.state = "done"
  if a.method == "runex" then
    emit(self, ("done %d"):format(id))
  else
    emit(self, ("end %d"):format(id))
  end
end

--- Runner resumes holding actor `id` (tbc or runex) to raise raise#id.
function World:raise(id)
  local a = self.actors[id]
  release_rel(self, a.rel)
  local label = "raise#" .. id
  if a.method == "tbc" then
    a.state = "done"
    emit(self, ("end %d %s"):format(id, label))
  else
    error_out(self, a, label, "runner")
  end
end

--- coroutine.close of actor `id` (queued, waiting, ready or holding).
function World:close(id)
  local a = self.actors[id]
  local lock = self.locks[a.lock]
  if a.state == "queued" then
    remove_from(lock.queue, a.entry)
    a.entry = nil
    a.state = "closed"
    dispatch(self, lock)                  -- the lock passes on at once
  elseif a.state == "waiting" then
    remove_from(lock.waiters[a.w], a.entry)
    if #lock.waiters[a.w] == 0 then lock.waiters[a.w] = nil end
    a.entry = nil
    a.state = "closed"
  elseif a.state == "ready" then
    local s
    for i = 1, #self.fifo do
      if self.fifo[i].actor == a then s = table.remove(self.fifo, i) break end
    end
    a.state = "closed"
    if s and s.kind == "grant" then
      release_rel(self, a.rel)            -- never resumed: give the grant back
    end
  elseif a.state == "holding" then
    a.state = "closed"
    if a.method == "tbc" or (a.method == "runex" and self.close_runex_releases) then
      release_rel(self, a.rel)
    end
  end
end

--- The runner calls the releaser that actor `id` received.
function World:call_rel(id)
  release_rel(self, self.actors[id].rel)
end

--- Unscoped release: m:release() (no-op while unlocked, P3) / s:release(w).
function World:unscoped(li, weight)
  local lock = self.locks[li]
  if lock.kind == "mutex" then
    if lock.value <= 0 then
      lock.value = lock.value + 1
      dispatch(self, lock)
    end
  elseif lock.kind == "rw" then             -- rw:release() ends a write only
    if lock.value == -1 then
      lock.value = 0
      dispatch(self, lock)
    end
  else
    lock.value = lock.value + weight
    dispatch(self, lock)
  end
end

function World:set_value(li, v)
  local lock = self.locks[li]
  lock.value = v
  dispatch(self, lock)
end

--- cancel(): rejects every queued acquirer in queue order, then (P4)
-- re-evaluates the waitForUnlock waiters against the now empty queue.
function World:cancel(li)
  local lock = self.locks[li]
  local queue = lock.queue
  lock.queue = {}
  for _, e in ipairs(queue) do
    settle(self, e.actor, "err", nil, lock.cancel)
  end
  drain(self, lock)
end

--- One loop turn whose timers ran at loop time T: expired requests are
-- removed in libuv order (due time, then creation) and the queue re-dispatched
-- (P1); then the module resumes the settlements in FIFO order.
function World:turn(T)
  local due = {}
  for _, lock in ipairs(self.locks) do
    for _, e in ipairs(lock.queue) do
      if e.due and e.due <= T then due[#due + 1] = e end
    end
    for _, list in pairs(lock.waiters) do
      for _, e in ipairs(list) do
        if e.due and e.due <= T then due[#due + 1] = e end
      end
    end
  end
  table.sort(due, function(x, y)
    if x.due ~= y.due then return x.due < y.due end
    return x.tseq < y.tseq
  end)
  for _, e in ipairs(due) do
    local a = e.actor
    if a.entry == e then                   -- still waiting (not granted meanwhile)
      local lock = self.locks[a.lock]
      if e.kind == "acq" then
        remove_from(lock.queue, e)
        settle(self, a, "err", nil, e.timeout_label)
        dispatch(self, lock)
      else
        remove_from(lock.waiters[a.w], e)
        if #lock.waiters[a.w] == 0 then lock.waiters[a.w] = nil end
        settle(self, a, "err", nil, e.timeout_label)
      end
    end
  end
  if self.drain == "all" then
    while #self.fifo > 0 do
      deliver(self, table.remove(self.fifo, 1))
    end
  else
    local batch = self.fifo
    self.fifo = {}
    for _, s in ipairs(batch) do deliver(self, s) end
  end
end

-- Ops without a model counterpart: "gc" (a full collection) and "poke"
-- (user code resumes a coroutine that waits in the module: async-mutex has
-- no such thing; the user would expect it to be ignored, the coroutine going
-- on waiting: docs/semantics.md, Coroutines and the loop).

--- Whether op applies in the current state (ops whose target is in the
-- wrong state are skipped, identically in the model and the real run).
function World:applicable(op)
  local k = op.op
  if k == "spawn" then
    return self.locks[op.lock] ~= nil and self.actors[op.id] == nil
  elseif k == "finish" then
    local a = self.actors[op.id]
    return a ~= nil and a.state == "holding"
  elseif k == "raise" then
    local a = self.actors[op.id]
    return a ~= nil and a.state == "holding" and (a.method == "tbc" or a.method == "runex")
  elseif k == "close" then
    local a = self.actors[op.id]
    if not a then return false end
    local s = a.state
    return s == "queued" or s == "waiting" or s == "ready" or s == "holding"
  elseif k == "call_rel" then
    local a = self.actors[op.id]
    return a ~= nil and a.rel_visible == true
  elseif k == "poke" then
    local a = self.actors[op.id]
    if not a then return false end
    local s = a.state
    return s == "queued" or s == "waiting" or s == "ready"
  elseif k == "unscoped" or k == "cancel" then
    return self.locks[op.lock] ~= nil
  elseif k == "setValue" then
    local lock = self.locks[op.lock]
    return lock ~= nil and lock.kind == "sema"
  end
  return true                             -- gc, turn
end

--- Applies op (assumed applicable); `now` is the loop time (spawn, turn).
function World:apply(op, now)
  local k = op.op
  if k == "spawn" then self:spawn(op, now)
  elseif k == "finish" then self:finish(op.id)
  elseif k == "raise" then self:raise(op.id)
  elseif k == "close" then self:close(op.id)
  elseif k == "call_rel" then self:call_rel(op.id)
  elseif k == "unscoped" then self:unscoped(op.lock, op.w or 1)
  elseif k == "setValue" then self:set_value(op.lock, op.v)
  elseif k == "cancel" then self:cancel(op.lock)
  elseif k == "turn" then self:turn(now)
  end                                     -- gc, poke: nothing changes
  for _, lock in ipairs(self.locks) do check_mutex(self, lock) end
end

--- Number of coroutines the module holds: queued, waiting or ready.
function World:pending()
  local n = #self.fifo
  for _, lock in ipairs(self.locks) do
    n = n + #lock.queue
    for _, list in pairs(lock.waiters) do n = n + #list end
  end
  return n
end

--- True when some actor has not ended.
function World:busy()
  for _, id in ipairs(self.order) do
    local s = self.actors[id].state
    if s ~= "done" and s ~= "closed" then return true end
  end
  return false
end

--- The ops of one clean-up round: finish holders, call every releaser not
-- yet called, raise semaphores, free mutexes, one loop turn.  (No cancel, so
-- that a run can leave cancel out entirely.)
function World:cleanup_ops()
  local ops = {}
  for _, id in ipairs(self.order) do
    local a = self.actors[id]
    if a.state == "holding" then ops[#ops + 1] = { op = "finish", id = id } end
  end
  for _, id in ipairs(self.order) do
    local a = self.actors[id]
    if a.rel_visible and not a.rel.called then ops[#ops + 1] = { op = "call_rel", id = id } end
  end
  for i, lock in ipairs(self.locks) do
    if lock.kind == "sema" then
      ops[#ops + 1] = { op = "setValue", lock = i, v = 1000 }
    else
      ops[#ops + 1] = { op = "unscoped", lock = i }
    end
  end
  ops[#ops + 1] = { op = "turn", sleep = 0 }
  return ops
end

return model
