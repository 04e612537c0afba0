-- Random programs that check debug mode's deadlock search both ways, for
-- the specs 141 and 150 (docs/debug.md, Deadlocks):
--
--   local dp = require "debug_programs"
--   local rnd = dp.lcg(seed)                 -- seeded integers: rnd(a), rnd(a, b)
--   local t = dp.actor(cos, function(t) ... end)   -- a coroutine of a program
--   local stuck = dp.drive(cos, rnd, debug_until)  -- runs it to its end
--   local p = dp.program(rnd, {2, 5}, {2, 6}, {2, 8}, lock_entry, op)   -- a random one
--   return dp.run(p, seed, debug_until, make_lock, do_op, release)   -- a run_program's end
--   dp.check_both_ways(n, seed_of, gen_program, run_program)
--
-- A program is coroutines, each a list of operations on shared locks.  Its
-- runner makes each coroutine with actor(): the body calls t.step_in()
-- before each operation (it yields; the driver says go), records the
-- steps that raised E_DEADLOCK in its own list, and sets t.done at its
-- end.  drive() runs one step of a ready coroutine chosen at random at a
-- time, then lets the loop deliver grants; debug mode goes off at step
-- 'debug_until'.  What is left waiting when no coroutine can move is
-- closed (its locks are dropped with it); drive returns their indices.
--  * Debug mode on: every program ends with every coroutine done (one left
--    waiting was in a deadlock no request raised for).
--  * Each E_DEADLOCK raised is real: the program is run again, identically
--    up to that request, then with debug mode off from it on: the request
--    waits, the others run as far as they can, and it is never granted.
local h = require "helpers"
local am = require "async_mutex"
local assert = require "luassert"

local M = {}

--- A seeded generator of integers, the same on every run: rnd(a) in
-- 1..a, rnd(a, b) in a..b (an LCG's high bits: its low bits repeat with
-- short periods).
function M.lcg(seed)
  local state = seed
  return function(a, b)
    state = (state * 1103515245 + 12345) % 2147483648
    local x = state // 65536
    if b then return a + x % (b - a + 1) end
    return x % a + 1
  end
end

--- A coroutine of a program, appended to 'cos' and run to its first
-- step: body(t) calls t.step_in() before each operation.
function M.actor(cos, body)
  local t = { ready = false, done = false }
  function t.step_in()
    t.ready = true
    coroutine.yield()                          -- the driver says go
    t.ready = false
  end
  t.co = coroutine.create(function() body(t) end)
  cos[#cos + 1] = t
  assert(coroutine.resume(t.co))
  return t
end

--- Runs the coroutines 'cos' until none is ready (steps chosen by 'rnd',
-- debug mode off from step 'debug_until'), sets each one's t.step (the
-- step that last ran it); closes those left waiting and returns their
-- indices.
function M.drive(cos, rnd, debug_until)
  local step = 0
  while true do
    local ready = {}
    for _, t in ipairs(cos) do if t.ready then ready[#ready + 1] = t end end
    if #ready == 0 then break end
    step = step + 1
    if debug_until and step == debug_until then am.debug.disable() end
    local t = ready[rnd(#ready)]
    t.step = step
    local ok, err = coroutine.resume(t.co)
    if not ok then error(err, 0) end
    h.tick(2)
  end
  local stuck = {}
  for c, t in ipairs(cos) do if not t.done then stuck[#stuck + 1] = c end end
  for _, t in ipairs(cos) do
    if not t.done then coroutine.close(t.co) end
  end
  h.tick(2)
  return stuck
end

--- A random program of `rnd` (M.lcg): {locks = ..., cos = ...}, with
-- rnd(locks[1], locks[2]) locks, each lock_entry() (what run's make_lock
-- takes), and rnd(cos[1], cos[2]) coroutines of rnd(ops[1], ops[2])
-- operations each, the o-th op(o, number of locks).
function M.program(rnd, locks, cos, ops, lock_entry, op)
  local p = { locks = {}, cos = {} }
  for i = 1, rnd(locks[1], locks[2]) do p.locks[i] = lock_entry() end
  for c = 1, rnd(cos[1], cos[2]) do
    local list = {}
    for o = 1, rnd(ops[1], ops[2]) do list[o] = op(o, #p.locks) end
    p.cos[c] = list
  end
  return p
end

--- Runs program `p` (p.locks: what make_lock(entry) makes each lock from;
-- p.cos: a list of operation lists) under drive, with `seed` choosing the
-- steps and debug mode off from step `debug_until` (nil: on throughout).
-- Each coroutine runs its operations through do_op(op, held, locks, t),
-- `locks` the program's locks, `held` its list of holds, released with
-- release(hold), last first, when it ends; do_op returns "deadlock" when
-- its request raised E_DEADLOCK (the step is recorded and the coroutine
-- ends), "end" when the coroutine ends for another reason, else nil.
-- Returns what check_both_ways' run_program returns.
function M.run(p, seed, debug_until, make_lock, do_op, release)
  local locks, cos, raised = {}, {}, {}
  for i, entry in ipairs(p.locks) do locks[i] = make_lock(entry) end
  for _, ops in ipairs(p.cos) do
    M.actor(cos, function(t)
      local held = {}
      for _, op in ipairs(ops) do
        t.step_in()
        local stop = do_op(op, held, locks, t)
        if stop == "deadlock" then raised[#raised + 1] = t.step end
        if stop then break end
      end
      for i = #held, 1, -1 do release(held[i]) end
      t.done = true
    end)
  end
  return raised, M.drive(cos, M.lcg(seed), debug_until), cos
end

--- n programs, gen_program(lcg(seed_of(seed))) each, checked both ways
-- (above).  run_program(p, seed, debug_until) returns the steps that
-- raised E_DEADLOCK, the coroutines left waiting and the coroutines.
-- Returns how many deadlocks were raised.
function M.check_both_ways(n, seed_of, gen_program, run_program)
  local deadlocks = 0
  for seed = 1, n do
    local p = gen_program(M.lcg(seed_of(seed)))
    am.debug.enable({ onReport = function() end })
    local raised, stuck = run_program(p, seed)
    am.debug.disable()
    assert.same({}, stuck, ("seed %d: coroutines left waiting with debug mode on"):format(seed))
    deadlocks = deadlocks + #raised
    for _, at in ipairs(raised) do
      am.debug.enable({ onReport = function() end })
      local _, stuck_off, cos = run_program(p, seed, at)
      am.debug.disable()
      local requester
      for c, t in ipairs(cos) do if t.step == at then requester = c end end
      local found = false
      for _, c in ipairs(stuck_off) do if c == requester then found = true end end
      assert.is_true(found, ("seed %d: E_DEADLOCK at step %d, but with debug mode off the request was granted")
        :format(seed, at))
    end
    assert.equal(0, am.pending(), ("seed %d: waiters left"):format(seed))
  end
  return deadlocks
end

return M
