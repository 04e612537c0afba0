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
-- A world holds locks (Mutex, Semaphore, RWLock, ReentrantMutex or
-- KeyedRWLock), actors, leases, and the FIFO of
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
--   rel ID B        the runner called actor ID's leased releaser; it returned B
--   check ID R      the runner called actor ID's releaser:check(): true, false,
--                   or the label of the error it raised
--   nest ID N       actor ID acquired its ReentrantMutex again: N levels held
--   unnest ID       actor ID left its newest nested level
--   nestfail ID ERR actor ID's re-entry raised ERR (its signal was aborted)
-- ERR is a label: E_TIMEOUT, E_CANCELED, E_ALREADY_LOCKED, E_LOST, a custom error name,
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
--
-- A KeyedRWLock ("krw", docs/lockkinds.md, KeyedRWLock) is an RWLock per key
-- ("sublocks"), made when a request needs one and dropped as soon as it is
-- idle; the runner compares count() and each key's state.
--
-- A ReentrantMutex ("re", docs/lockkinds.md, ReentrantMutex) is a mutex whose
-- holder is the actor its grant was delivered to (at once for a fast-path
-- grant, at the resumption for a queued one); that actor may "nest" (acquire
-- again: granted at once, one more level, held by a to-be-closed releaser)
-- and "unnest" (leave the newest level).  Every level ends once; the lock
-- is free when all have.  Finishing, raising or closing an actor leaves its
-- nested levels first, newest first.
--
-- A lease (deco.lease = {ms, from, err}: docs/lockkinds.md, Leases) gives a
-- grant a deadline in the timer queue, counted from the grant's delivery
-- (or from the request): at the first turn past it a hold still in place is
-- lost: given back as its releaser would give it back; that releaser then
-- returns false ("rel ID false": the runner logs the result of a leased
-- releaser's call), check() raises the lost error, and a runExclusive
-- holding it raises the lost error when its body returns.  "check ID R"
-- logs releaser:check() (true, false, or the error's label) for any actor.
--
-- A steal (method "steal": docs/semantics.md, Steal) is granted at once:
-- every hold in place of its lock ends lost, as a lease's end makes it (a
-- grant settled and not yet delivered too: its acquire raises the lost
-- error), the value becomes what it would be with all of them given back
-- (a Semaphore: plus `held`, the weight its grants hold, less what unscoped
-- releases gave back), the stealer holds it as an acquire's grant, and the
-- lock dispatches.
--
-- An abort signal (deco.sig = i: docs/semantics.md, Abort signals) is one of
-- the sequence's signals, made on first use; "abort" (op.sig, op.err) aborts
-- it once, with the label op.err or E_CANCELED.  A request made with an
-- aborted signal fails at once with its reason, before any other rule (a
-- ReentrantMutex holder's re-entry too: "nestfail ID ERR"); an abort takes
-- every queued request of the signal out of its queue, in the order they
-- were queued, then settles each with the reason and dispatches its lock.

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
    lseq = 0,             -- signalled entries queued so far (a signal's order)
    signals = {},         -- index -> {aborted = bool, reason = label}
    drain = opts.drain or "all",
    close_runex_releases = opts.close_runex_releases ~= false,
    violations = {},
  }, World)
  w.timers = {}          -- leases in the timer queue: {due, tseq, rel}
  for i, spec in ipairs(lock_specs) do
    w.locks[i] = {
      index = i,
      kind = spec.kind,
      value = (spec.kind == "mutex" or spec.kind == "re") and 1
        or (spec.kind == "rw" or spec.kind == "krw") and 0 or spec.value,
      cancel = spec.cancel or "E_CANCELED",
      queue = {},         -- acquirers, priority descending, FIFO among equals
      waiters = {},       -- weight -> list of waitForUnlock waiters, same order
      gen = 0,            -- "re": grants so far (a releaser's token)
      held = 0,           -- "sema": weight its grants hold (steal)
      levels = 0,         -- "re": levels held
      subs = {},          -- "krw": key -> RWLock of that key
    }
  end
  return w
end

-- The RWLock of `key` in keyed lock `kl`, made when `create` and missing.
local function sublock(kl, key, create)
  local sub = kl.subs[key]
  if not sub and create then
    sub = { index = kl.index, kind = "rw", value = 0, cancel = kl.cancel,
            queue = {}, waiters = {}, parent = kl, key = key }
    kl.subs[key] = sub
  end
  return sub
end
model.sublock = sublock

-- A keyed lock's sublock leaves its set as soon as it is idle.
local function settle_sub(lock)
  if lock.parent and lock.parent.subs[lock.key] == lock and lock.value == 0
      and #lock.queue == 0 and next(lock.waiters) == nil then
    lock.parent.subs[lock.key] = nil
  end
end

-- The locks that hold state: the plain ones and every keyed lock's sublocks.
local function each_lock(w, fn)
  for _, lock in ipairs(w.locks) do
    if lock.kind == "krw" then
      for _, sub in pairs(lock.subs) do fn(sub) end
    else
      fn(lock)
    end
  end
end
model.each_lock = each_lock

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
  if lock.kind == "re" then return lock.value > 0 end
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
  if (lock.kind == "mutex" or lock.kind == "re") and lock.value ~= 0 and lock.value ~= 1 then
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
  elseif lock.kind == "re" then
    lock.value = 0
    lock.gen = lock.gen + 1
    lock.levels = 1
  else
    lock.value = lock.value - actor.w
    if lock.kind == "sema" then lock.held = lock.held + actor.w end
  end
  check_mutex(w, lock)
  actor.rel = { lock = lock, weight = actor.w, called = false, gen = lock.gen,
                actor = actor }
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
  settle_sub(lock)
end

-- Gives the grant of releaser `rel` back.  A Mutex releaser only ends its
-- own grant: a no-op once m:release() unlocked the mutex (P3), even if
-- someone else holds it since; a ReentrantMutex's ends one level of its
-- hold.
local function give_back(w, rel)
  local lock = rel.lock
  if lock.kind == "re" then
    if lock.value <= 0 and rel.gen == lock.gen then
      lock.levels = lock.levels - 1
      if lock.levels <= 0 then
        lock.value, lock.owner = 1, nil
        dispatch(w, lock)
      end
    end
  elseif lock.kind == "mutex" then
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
    lock.held = math.max(0, lock.held - rel.weight)
    dispatch(w, lock)
  end
end

-- Whether the hold of `rel` is in place (releaser:check()): not given back
-- by its call, not lost, and not ended by an unscoped release: a mutex's
-- or a write's holder is the grant that holds it, a ReentrantMutex's hold
-- is its generation; a semaphore's holds and reads have no owner to end.
local function holds(rel)
  if rel.called or rel.lost then return false end
  local lock = rel.lock
  if lock.kind == "mutex" then return lock.value <= 0 and lock.holder == rel end
  if lock.kind == "rw" and rel.weight == 2 then return lock.value == -1 and lock.holder == rel end
  if lock.kind == "re" then return lock.value <= 0 and rel.gen == lock.gen end
  return true
end

-- A releaser's call: the first one releases and returns whether it ended
-- the hold (false when an unscoped release ended it already); later calls,
-- and any call once its lease ran out, return false.
local function release_rel(w, rel)
  if rel.called or rel.lost then return false end
  local live = holds(rel)
  rel.called = true
  give_back(w, rel)
  return live
end

-- A lease of releaser `rel` starts at loop time `now`, ending at `ends`: an
-- entry of the timer queue, due then (or at once if `ends` has passed).
local function start_lease(w, rel, now, ends)
  w.tseq = w.tseq + 1
  w.timers[#w.timers + 1] = { due = ends > now and ends or now, tseq = w.tseq, rel = rel }
end

-- The lease of `rel` ran out while the hold is in place: lost, given back.
local function lose(w, rel)
  rel.lost = true
  give_back(w, rel)
end

-- Leaves the newest nested level of a ReentrantMutex actor.
local function unnest(w, a)
  release_rel(w, table.remove(a.nested))
end

local function unnest_all(w, a)
  while a.nested and #a.nested > 0 do unnest(w, a) end
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
  local lock = a.L
  if lock.kind == "re" then lock.owner = a end   -- its holder from now on
  if a.method == "acquire" or a.method == "tbc" or a.method == "steal" then
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

-- Resumes the settlement s (a loop turn at loop time T).
local function deliver(w, s, T)
  local a = s.actor
  if a.state ~= "ready" then
    violation(w, ("delivering to actor %d in state %s"):format(a.id, a.state))
    return
  end
  if s.kind == "grant" then
    if a.lease then                       -- the lease starts now (or ran)
      local ms = a.lease.ms
      start_lease(w, a.rel, T, a.lease.from and a.req_time + ms or T + ms)
    end
    after_grant(w, a, s.value, "deliver")
  elseif s.kind == "unlocked" then
    a.state = "done"
    emit(w, ("unlocked %d"):format(a.id))
  else
    error_out(w, a, s.label, "deliver")
  end
end

-- The label of what a lost hold of actor `a` raises.
local function lost_label(a)
  return a.lease and a.lease.err or "E_LOST"
end

-- docs/semantics.md, Steal: actor `a` steals `lock`.
local function steal(w, lock, a)
  local function lose_if_held(rel)
    if rel and rel.lock == lock and not rel.called and holds(rel) then rel.lost = true end
  end
  for _, id in ipairs(w.order) do
    local b = w.actors[id]
    lose_if_held(b.rel)
    for _, rel in ipairs(b.nested or {}) do lose_if_held(rel) end
  end
  for _, s in ipairs(w.fifo) do           -- settled, not delivered
    if s.kind == "grant" and s.actor.L == lock then
      s.kind, s.label = "err", lost_label(s.actor)
    end
  end
  if lock.kind == "sema" then
    lock.value, lock.held = lock.value + lock.held, 0
  elseif lock.kind == "rw" then
    lock.value = 0
  else
    lock.value, lock.owner, lock.levels = 1, nil, 0
  end
  lock.holder = nil
  local prev = grant(w, lock, a)
  after_grant(w, a, prev, "sync")
  dispatch(w, lock)
end

-- Signal `i` of the world, made on first use.
local function signal_of(w, i)
  local s = w.signals[i]
  if not s then
    s = { aborted = false }
    w.signals[i] = s
  end
  return s
end

-- The reason of the aborted signal of actor `a`'s request, or nil.
local function aborted_reason(w, a)
  local i = a.deco and a.deco.sig
  if i == nil then return nil end
  local s = signal_of(w, i)
  return s.aborted and s.reason or nil
end

local function new_entry(w, a, now, timeout_ms, timeout_label)
  local e = { actor = a, weight = a.w, prio = a.p }
  if a.deco and a.deco.sig then           -- joins its signal's list, last
    w.lseq = w.lseq + 1
    e.sig, e.lseq = a.deco.sig, w.lseq
  end
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
  if lock.kind == "krw" then lock = sublock(lock, op.key, true) end
  local a = {
    id = op.id, lock = op.lock, method = op.method, L = lock, key = op.key,
    w = (lock.kind == "mutex" or lock.kind == "re") and 1
      or lock.kind == "rw" and op.method == "wait" and 2 or op.w, p = op.p,
    plan = op.plan, deco = op.deco, state = "new", req_time = now,
    lease = op.deco and op.deco.lease,
  }
  if self.actors[a.id] then
    violation(self, "duplicate actor id " .. a.id)
    return
  end
  self.actors[a.id] = a
  self.order[#self.order + 1] = a.id
  if a.method == "steal" then return steal(self, lock, a) end
  local reason = aborted_reason(self, a)
  if reason then                                      -- fails before all else
    error_out(self, a, reason, "sync")
    settle_sub(lock)
    return
  end
  local deco = op.deco
  local timeout_ms, timeout_label
  if deco and deco.kind == "t" then
    timeout_ms, timeout_label = deco.ms, deco.err or "E_TIMEOUT"
  end
  if a.method == "wait" then
    if can_lock_now(lock, a.w, a.p) then
      a.state = "done"
      emit(self, ("unlocked %d"):format(a.id))
      settle_sub(lock)
    elseif deco and deco.kind == "try" then           -- P2
      error_out(self, a, deco.err or "E_ALREADY_LOCKED", "sync")
      settle_sub(lock)
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
    if a.lease then start_lease(self, a.rel, now, now + a.lease.ms) end
    after_grant(self, a, prev, "sync")
  elseif deco and deco.kind == "try" then             -- P2: nothing queued
    error_out(self, a, deco.err or "E_ALREADY_LOCKED", "sync")
    settle_sub(lock)
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
  unnest_all(self, a)
  if a.method == "runex" and a.rel.lost then      -- checked when fn returns
    error_out(self, a, lost_label(a), "runner")
    return
  end
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
  unnest_all(self, a)
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
  local lock = a.L
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
    settle_sub(lock)
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
    unnest_all(self, a)
    if a.method == "tbc" or (a.method == "runex" and self.close_runex_releases) then
      release_rel(self, a.rel)
    end
  end
end

--- The runner calls the releaser that actor `id` received (and logs what a
-- leased one returned).
function World:call_rel(id)
  local a = self.actors[id]
  local res = release_rel(self, a.rel)
  if a.lease then emit(self, ("rel %d %s"):format(id, tostring(res))) end
end

--- The runner calls releaser:check() of actor `id`.
function World:check(id)
  local a = self.actors[id]
  if a.rel.lost then
    emit(self, ("check %d %s"):format(id, lost_label(a)))
  else
    emit(self, ("check %d %s"):format(id, tostring(holds(a.rel))))
  end
end

--- Holding actor `id`, which holds its ReentrantMutex, acquires it again.
function World:nest(id)
  local a = self.actors[id]
  local lock = a.L
  local reason = aborted_reason(self, a)
  if reason then                          -- a request too: fails at once
    emit(self, ("nestfail %d %s"):format(id, reason))
    return
  end
  lock.levels = lock.levels + 1
  a.nested = a.nested or {}
  a.nested[#a.nested + 1] = { lock = lock, weight = 1, called = false, gen = lock.gen }
  emit(self, ("nest %d %d"):format(id, lock.levels))
end

--- Holding actor `id` leaves its newest nested level.
function World:unnest(id)
  unnest(self, self.actors[id])
  emit(self, ("unnest %d"):format(id))
end

--- Unscoped release: m:release() (no-op while unlocked, P3) / s:release(w).
function World:unscoped(li, weight, key)
  local lock = self.locks[li]
  if lock.kind == "krw" then                -- krw:release(key): that key's write
    lock = sublock(lock, key, false)
    if not lock then return end
  end
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
    lock.held = math.max(0, lock.held - weight)
    dispatch(self, lock)
  end
end

function World:set_value(li, v)
  local lock = self.locks[li]
  lock.value = v
  dispatch(self, lock)
end

--- cancel(): rejects every queued acquirer in queue order, then (P4)
-- re-evaluates the waitForUnlock waiters against the now empty queue.  A
-- keyed lock's cancel(key) cancels that key.  (Its cancel() cancels every
-- key in the order of its map, which the model cannot know: the generator
-- always names a key; spec 53 covers cancel().)
local function cancel_lock(self, lock)
  local queue = lock.queue
  lock.queue = {}
  for _, e in ipairs(queue) do
    settle(self, e.actor, "err", nil, lock.cancel)
  end
  drain(self, lock)
  settle_sub(lock)
end

function World:cancel(li, key)
  local lock = self.locks[li]
  if lock.kind ~= "krw" then return cancel_lock(self, lock) end
  if key ~= nil then
    local sub = sublock(lock, key, false)
    if sub then cancel_lock(self, sub) end
    return
  end
  violation(self, "cancel() of a keyed lock without a key: its order is the map's")
end

--- s:abort(): signal `i` aborts with `label` (E_CANCELED when nil), once.
-- Every request queued with it leaves its queue before any lock
-- dispatches; then, in the order they were queued, each is settled with
-- the reason and its lock dispatched (a waitForUnlock's lock re-evaluated).
function World:abort(i, label)
  local s = signal_of(self, i)
  if s.aborted then return end
  s.aborted, s.reason = true, label or "E_CANCELED"
  local hit = {}
  each_lock(self, function(lock)
    for _, e in ipairs(lock.queue) do
      if e.sig == i then hit[#hit + 1] = e end
    end
    for _, list in pairs(lock.waiters) do
      for _, e in ipairs(list) do
        if e.sig == i then hit[#hit + 1] = e end
      end
    end
  end)
  table.sort(hit, function(x, y) return x.lseq < y.lseq end)
  for _, e in ipairs(hit) do
    local a, lock = e.actor, e.actor.L
    if e.kind == "acq" then
      remove_from(lock.queue, e)
    else
      remove_from(lock.waiters[a.w], e)
      if #lock.waiters[a.w] == 0 then lock.waiters[a.w] = nil end
    end
  end
  for _, e in ipairs(hit) do
    local lock = e.actor.L
    settle(self, e.actor, "err", nil, s.reason)
    if e.kind == "acq" then dispatch(self, lock) else settle_sub(lock) end
  end
end

-- The timer phase of a loop turn, at loop time T: expired requests are
-- removed in libuv order (due time, then creation) and the queue
-- re-dispatched (P1).
local function run_timers(self, T)
  local due = {}
  each_lock(self, function(lock)
    for _, e in ipairs(lock.queue) do
      if e.due and e.due <= T then due[#due + 1] = e end
    end
    for _, list in pairs(lock.waiters) do
      for _, e in ipairs(list) do
        if e.due and e.due <= T then due[#due + 1] = e end
      end
    end
  end)
  local timers = {}                        -- leases not yet due stay
  for _, e in ipairs(self.timers) do
    if not (e.rel.called or e.rel.lost) then  -- else released in time: gone
      if e.due <= T then due[#due + 1] = e
      else timers[#timers + 1] = e end
    end
  end
  self.timers = timers
  table.sort(due, function(x, y)
    if x.due ~= y.due then return x.due < y.due end
    return x.tseq < y.tseq
  end)
  for _, e in ipairs(due) do
    local a = e.actor
    if e.rel then                          -- a lease ran out
      if holds(e.rel) then lose(self, e.rel)
      elseif not e.rel.lost then e.rel.called = true end   -- ended by an unscoped release: spent
    elseif a.entry == e then               -- still waiting (not granted meanwhile)
      local lock = a.L
      if e.kind == "acq" then
        remove_from(lock.queue, e)
        settle(self, a, "err", nil, e.timeout_label)
        dispatch(self, lock)
      else
        remove_from(lock.waiters[a.w], e)
        if #lock.waiters[a.w] == 0 then lock.waiters[a.w] = nil end
        settle(self, a, "err", nil, e.timeout_label)
        settle_sub(lock)
      end
    end
  end
end

-- The idle phase of a loop turn, at loop time T: the module resumes the
-- settlements in FIFO order.
local function run_idle(self, T)
  if self.drain == "all" then
    while #self.fifo > 0 do
      deliver(self, table.remove(self.fifo, 1), T)
    end
  else
    local batch = self.fifo
    self.fifo = {}
    for _, s in ipairs(batch) do deliver(self, s, T) end
  end
end

--- One loop turn whose timers ran at loop time T.  `before`: nil when the
-- idle phase came after the timers (libuv 1.44: a turn times out what is
-- due, then resumes everything settled, timeouts included); else the loop
-- time of the idle phase, which came first (libuv >= 1.45: the turn resumes
-- what was settled before it, then times out what is due, resumed by the
-- next turn).  docs/semantics.md promises no order of the two phases.
function World:turn(T, before)
  if before then run_idle(self, before) end
  run_timers(self, T)
  if not before then run_idle(self, T) end
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
    local lock = self.locks[op.lock]
    if op.method == "steal" and lock ~= nil and lock.kind == "sema"
        and op.w > lock.value + lock.held then
      return false          -- a usage error (docs/api.md): not drawn
    end
    return lock ~= nil and self.actors[op.id] == nil
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
  elseif k == "call_rel" or k == "check" then
    local a = self.actors[op.id]
    return a ~= nil and a.rel_visible == true
  elseif k == "nest" then
    local a = self.actors[op.id]
    return a ~= nil and a.state == "holding" and a.L.kind == "re" and a.L.owner == a
      and a.L.value == 0
  elseif k == "unnest" then
    local a = self.actors[op.id]
    return a ~= nil and a.state == "holding" and a.nested ~= nil and #a.nested > 0
  elseif k == "poke" then
    local a = self.actors[op.id]
    if not a then return false end
    local s = a.state
    return s == "queued" or s == "waiting" or s == "ready"
  elseif k == "unscoped" then
    local lock = self.locks[op.lock]
    return lock ~= nil and lock.kind ~= "re" and (lock.kind ~= "krw") == (op.key == nil)
  elseif k == "cancel" then
    return self.locks[op.lock] ~= nil
  elseif k == "setValue" then
    local lock = self.locks[op.lock]
    return lock ~= nil and lock.kind == "sema"
  end
  return true                             -- gc, turn
end

--- Applies op (assumed applicable); `now` is the loop time (spawn, turn),
-- `before` the loop time of an idle phase that came before a turn's timers.
function World:apply(op, now, before)
  local k = op.op
  if k == "spawn" then self:spawn(op, now)
  elseif k == "finish" then self:finish(op.id)
  elseif k == "raise" then self:raise(op.id)
  elseif k == "close" then self:close(op.id)
  elseif k == "call_rel" then self:call_rel(op.id)
  elseif k == "check" then self:check(op.id)
  elseif k == "nest" then self:nest(op.id)
  elseif k == "unnest" then self:unnest(op.id)
  elseif k == "unscoped" then self:unscoped(op.lock, op.w or 1, op.key)
  elseif k == "setValue" then self:set_value(op.lock, op.v)
  elseif k == "cancel" then self:cancel(op.lock, op.key)
  elseif k == "abort" then self:abort(op.sig, op.err)
  elseif k == "turn" then self:turn(now, before)
  end                                     -- gc, poke: nothing changes
  each_lock(self, function(lock)
    check_mutex(self, lock)
    settle_sub(lock)
  end)
end

--- Number of coroutines the module holds: queued, waiting or ready.
function World:pending()
  local n = #self.fifo
  each_lock(self, function(lock)
    n = n + #lock.queue
    for _, list in pairs(lock.waiters) do n = n + #list end
  end)
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
    elseif lock.kind == "krw" then
      local keys = {}
      for key in pairs(lock.subs) do keys[#keys + 1] = key end
      table.sort(keys)
      for _, key in ipairs(keys) do ops[#ops + 1] = { op = "unscoped", lock = i, key = key } end
    elseif lock.kind ~= "re" then             -- a ReentrantMutex has no release()
      ops[#ops + 1] = { op = "unscoped", lock = i }
    end
  end
  ops[#ops + 1] = { op = "turn", sleep = 0 }
  return ops
end

return model
