-- Debug mode's deadlock search at scale (docs/debug.md, Deadlocks).  It
-- starts from the requester and follows "waits for" backwards: who waits
-- for a lock a member holds, who would be queued behind the request.  It
-- walked every waiter ahead instead, each of whose place it looked up in
-- its queue again: 800 coroutines that each hold a lock and queue on one
-- mutex took 20 s of CPU (debug mode off: 4 ms).  Measured in instructions
-- (callgrind in a child process), never in time.  The search still finds
-- every deadlock a request closes, through every lock kind and through
-- queue order, and none that is not: random programs check both.
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

local under_asan = (os.getenv("LD_PRELOAD") or ""):find("asan")

-- N coroutines each take a Mutex of their own, then queue on one mutex
-- held by the main chunk, which then lets them through.
local CHILD = [[
local am = require "async_mutex"
local uv = require "luv"
local N, MODE = %d, %q
if MODE == "on" then am.debug.enable({ onReport = function(_, text) io.stderr:write(text, "\n") end }) end
local m = am.Mutex.new()
local gate = am.tryAcquire(m):acquire()
local done = 0
for _ = 1, N do
  am.spawn(function()
    local own = am.Mutex.new()
    local r1 = own:acquire()
    local r2 = m:acquire()
    r2(); r1()
    done = done + 1
  end)
end
gate()
uv.run()
assert(done == N and am.pending() == 0)
io.write("ok\n")
]]

--- Instructions the child runs (callgrind's "Collected" count).
local function instructions(n, mode)
  return h.instructions(CHILD:format(n, mode), 120)
end

describe("coroutines that each hold a lock and queue on one mutex", function()
  local it_or_pending = under_asan and pending or it
  it_or_pending("cost with debug mode on at most 5 times the instructions off, and grow linearly (2,000 and 4,000, callgrind)", function()
    local off = instructions(2000, "off")
    local on = instructions(2000, "on")
    local on2 = instructions(4000, "on")
    -- measured: 3.6x, and 1.95x from 2,000 to 4,000 (main before: 2,000
    -- did not end within the 120 s allowed)
    assert.is_true(on <= 5 * off, ("on %d, off %d instructions"):format(on, off))
    assert.is_true(on2 <= 2.3 * on, ("4,000: %d, 2,000: %d instructions"):format(on2, on))
  end)
end)

describe("deadlocks still found", function()
  local rec = dr.recorder(before_each, after_each)

  -- Coroutines that each take their first lock, wait to be resumed, then
  -- request their second; step(i) resumes the i-th.
  local function crossing(...)
    local plans, t = { ... }, {}
    for i, p in ipairs(plans) do
      t[i] = {}
      t[i].co = h.spawn(function()
        local first = table.pack(p[1]())
        coroutine.yield()
        local res = table.pack(pcall(p[2]))
        t[i].ok, t[i].err = res[1], not res[1] and res[2] or nil
        if res[1] then (res[3] or res[2])() end
        t[i].done = true;
        (first[2] or first[1])()
      end)
    end
    return t
  end

  it("a cycle through a Semaphore, an RWLock, a key of a KeyedRWLock and a ReentrantMutex at two levels", h.async(function()
    local s, rw = am.Semaphore.new(1), am.RWLock.new()
    local k, rm = am.KeyedRWLock.new(), am.ReentrantMutex.new()
    -- 1: s then a read of rw; 2: a write of rw then key x; 3: a read of x
    -- then rm; 4: rm (two levels) then s
    local t = crossing(
      { function() return s:acquire() end, function() return rw:acquireRead() end },
      { function() return rw:acquireWrite() end, function() return k:acquireWrite("x") end },
      { function() return k:acquireRead("x") end, function() return rm:acquire() end },
      { function() local r1 = rm:acquire(); local r2 = rm:acquire()
          return function() r2(); r1() end end,
        function() return s:acquire() end })
    for i = 1, 3 do assert(coroutine.resume(t[i].co)) end
    assert.equal(0, rec.count("deadlock"))
    assert(coroutine.resume(t[4].co))          -- closes it
    assert.equal(am.E_DEADLOCK, t[4].err)
    assert.equal(4, #rec.first("deadlock").info.cycle)
    h.wait_until(function() return t[1].done and t[2].done and t[3].done end)
    assert.is_true(t[1].ok and t[2].ok and t[3].ok)
  end))

  it("a cycle closed through queue order alone: a request of a high priority that a waiter behind it would let in", h.async(function()
    -- s (2 units): H holds one, O (outside, not waiting) the other.  W
    -- waits for one unit (O's will come) and holds x; H waits for x.  R
    -- asks for both units at a higher priority than W: served first, it
    -- needs H's unit, H needs x, W waits behind R.  Nobody waited for R
    -- before its request, except W once it is queued.
    local s, x, z = am.Semaphore.new(2), am.Mutex.new(), am.Mutex.new()
    local O = h.acquirer(nil, "O", s)
    local H = {}
    H.co = h.spawn(function()
      local _, rs = s:acquire()
      coroutine.yield()
      local rx = x:acquire()
      rx(); rs(); H.done = true
    end)
    local W = {}
    W.co = h.spawn(function()
      local rx = x:acquire()
      coroutine.yield()
      local _, rs = s:acquire(1, 0)
      rs(); rx(); W.done = true
    end)
    assert(coroutine.resume(H.co))             -- H waits for x (W)
    assert(coroutine.resume(W.co))             -- W waits for a unit (O's)
    assert.equal(0, rec.count("deadlock"))
    local rz = z:acquire()                     -- R holds something: searched
    assert.equal(am.E_DEADLOCK, select(2, pcall(s.acquire, s, 2, 5)))
    assert.equal(3, #rec.first("deadlock").info.cycle)
    rz()
    O.release()
    h.wait_until(function() return W.done and H.done end)
  end))

  it("a cycle closed by a request of a coroutine that holds nothing, queued ahead of a waiter by priority", h.async(function()
    -- s (2 units): W holds one and waits for another at priority 1 (the
    -- other holder, O, not waiting, will give one back).  R, holding
    -- nothing, asks for both at priority 2: served before W, it needs W's
    -- unit, and W waits behind it.  (Found by the random programs below:
    -- a requester that held nothing was never searched.)
    local s = am.Semaphore.new(2)
    local O = h.acquirer(nil, "O", s)
    local W = {}
    W.co = h.spawn(function()
      local _, r1 = s:acquire()
      coroutine.yield()
      local _, r2 = s:acquire(1, 1)
      r2(); r1(); W.done = true
    end)
    assert(coroutine.resume(W.co))             -- W waits for O's unit
    local R = h.requester("acquire", nil, "R", s, 2, 2)
    assert.is_true(R.done)
    assert.equal(am.E_DEADLOCK, R.err)
    assert.equal(2, #rec.first("deadlock").info.cycle)
    O.release()
    h.wait_until(function() return W.done end)
  end))

  it("a cycle of 2,000 coroutines, each holding a Mutex and waiting for the next one's", h.async(function()
    local n = h.load(2000)
    local locks, t = {}, {}
    for i = 1, n do locks[i] = am.Mutex.new() end
    for i = 1, n do
      t[i] = {}
      t[i].co = h.spawn(function()
        local r = locks[i]:acquire()
        coroutine.yield()
        local ok, r2 = pcall(locks[i % n + 1].acquire, locks[i % n + 1])
        t[i].err = not ok and r2 or nil
        if ok then r2() end
        r()
        t[i].done = true
      end)
    end
    for i = n, 2, -1 do assert(coroutine.resume(t[i].co)) end   -- a chain
    assert.equal(0, rec.count("deadlock"))
    assert(coroutine.resume(t[1].co))          -- closes the ring
    assert.equal(am.E_DEADLOCK, t[1].err)
    assert.equal(n, #rec.first("deadlock").info.cycle)
    h.wait_until(function()
      for i = 1, n do if not t[i].done then return false end end
      return true
    end)
  end))
end)

-- {========================================================== random programs
-- A program: coroutines, each with a list of operations on shared locks
-- of every kind (acquire at a weight, mode and priority; waitForUnlock;
-- release one of its holds, in any order), releasing what it still holds
-- at its end or when a request raises E_DEADLOCK; checked both ways
-- (spec/debug_programs.lua).

local dp = require "debug_programs"

local KINDS = { "Mutex", "Semaphore", "RWLock", "ReentrantMutex", "KeyedMutex" }

local function gen_program(rnd)
  return dp.program(rnd, { 3, 5 }, { 3, 5 }, { 3, 7 }, function() return KINDS[rnd(#KINDS)] end,
    function(o, nlocks)
      if o > 1 and rnd(4) == 1 then return { "release", rnd(1000) } end
      local l = rnd(nlocks)
      return { rnd(6) == 1 and "unlock" or "acquire", l, rnd(2), rnd(0, 2), rnd(2) == 1 and "x" or "y" }
    end)
end

local function make_lock(kind)
  if kind == "Semaphore" then return am.Semaphore.new(2) end
  return am[kind].new()
end

--- Runs program 'p' with 'seed' choosing the steps.  With debug mode on
-- ('debug_until' nil), or on until step 'debug_until' (then off).  Returns
-- the steps at which E_DEADLOCK was raised, the coroutines left waiting
-- (by index), and the coroutines' records (t.step: the step that last ran
-- it).
local function run_program(p, seed, debug_until)
  return dp.run(p, seed, debug_until, make_lock, function(op, held, locks)
    if op[1] == "release" then
      if #held > 0 then
        local r = table.remove(held, op[2] % #held + 1)
        r()
      end
      return
    end
    local lock, kind = locks[op[2]], p.locks[op[2]]
    local weight, prio, key = op[3], op[4], op[5]
    local res
    if op[1] == "unlock" then
      if kind == "Semaphore" then res = table.pack(pcall(lock.waitForUnlock, lock, weight, prio))
      elseif kind == "KeyedMutex" then res = table.pack(pcall(lock.waitForUnlock, lock, key, prio))
      else res = table.pack(pcall(lock.waitForUnlock, lock, prio)) end
    elseif kind == "Semaphore" then res = table.pack(pcall(lock.acquire, lock, weight, prio))
    elseif kind == "RWLock" then
      res = table.pack(pcall(weight == 1 and lock.acquireRead or lock.acquireWrite, lock, prio))
    elseif kind == "KeyedMutex" then res = table.pack(pcall(lock.acquire, lock, key, prio))
    else res = table.pack(pcall(lock.acquire, lock, prio)) end
    if not res[1] then
      if res[2] ~= am.E_DEADLOCK and not tostring(res[2]):find("reentrant mutex that this coroutine holds") then
        error(res[2], 0)
      end
      return res[2] == am.E_DEADLOCK and "deadlock" or "end"
    end
    if op[1] ~= "unlock" then held[#held + 1] = res[res.n] end
  end, function(r) r() end)
end

describe("random programs over every lock kind", function()
  local n = h.load(1000)
  it(("%d programs: every deadlock raised at a request, and each one raised is real"):format(n), h.async(function()
    local deadlocks = dp.check_both_ways(n, function(seed) return seed * 7919 end, gen_program, run_program)
    assert.is_true(deadlocks > n // 10, ("only %d deadlocks in %d programs"):format(deadlocks, n))
  end, { deadline = 120000 }))
end)

-- }==========================================================
