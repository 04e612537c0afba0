-- Debug mode's deadlock search (docs/debug.md, Deadlocks) checked both
-- ways on random programs wider than spec 141's: every lock kind with its
-- keyed forms (KeyedSemaphore, KeyedRWLock, acquireAll and acquireAllRead
-- over two or three keys), Semaphores of values 1 to 3 with weights up to
-- the value, priorities -1 to 2 (fractions too), timed requests
-- (withTimeout, never reached), tries, waitForUnlock, RWLock downgrades,
-- and grants given back in async-mutex's way (the releaser dropped,
-- release() later: Mutex, Semaphore, KeyedMutex, KeyedSemaphore).
--  * Debug mode on: every program ends with every coroutine done (a
--    coroutine left waiting was in a deadlock no request raised for).
--  * Each E_DEADLOCK is real: run again with debug mode off from that
--    request on, the request is never granted.
-- The Semaphores given back by release() failed both ways: units so
-- released still counted as held (spec 146).
local h = require "helpers"
local am = require "async_mutex"
local dp = require "debug_programs"

local KINDS = { "Mutex", "Semaphore", "RWLock", "ReentrantMutex", "KeyedMutex",
                "KeyedSemaphore", "KeyedRWLock" }
local PRIOS = { 0, 0, 0, 1, 2, -1, 0.5 }

-- A program: locks (kind, value), and per coroutine its operations:
-- { "release", n } | { "downgrade", n } | { what, lock, weight, priority,
-- key, decorator, style } with what "acquire", "unlock" or "all",
-- decorator "plain", "timed" or "try", style 1: given back by release().
local function gen_program(rnd)
  return dp.program(rnd, { 2, 5 }, { 2, 6 }, { 2, 8 },
    function() return { kind = KINDS[rnd(#KINDS)], value = rnd(1, 3) } end,
    function(o, nlocks)
      local r = rnd(20)
      if o > 1 and r <= 4 then return { "release", rnd(1000) } end
      if o > 1 and r == 5 then return { "downgrade", rnd(1000) } end
      local d, w = rnd(12), rnd(10)
      return { w == 1 and "unlock" or w == 2 and "all" or "acquire", rnd(nlocks), rnd(3),
               PRIOS[rnd(#PRIOS)], rnd(2) == 1 and "x" or "y",
               d == 1 and "timed" or d == 2 and "try" or "plain", rnd(2) }
    end)
end

local function make_lock(spec)
  if spec.kind == "Semaphore" then return am.Semaphore.new(spec.value) end
  if spec.kind == "KeyedSemaphore" then return am.KeyedSemaphore.new(spec.value) end
  return am[spec.kind].new()
end

local function decorate(lock, deco)
  if deco == "timed" then return am.withTimeout(lock, 1e7) end
  if deco == "try" then return am.tryAcquire(lock) end
  return lock
end

--- The request an operation makes: its function and arguments.
local function request(op, spec, lock)
  local kind, weight, prio, key = spec.kind, op[3], op[4], op[5]
  if kind:find("Semaphore") then weight = (weight - 1) % spec.value + 1 end
  local keyed = kind:find("^Keyed") ~= nil
  if op[1] == "unlock" then
    if kind == "Semaphore" then return lock.waitForUnlock, { weight, prio }, weight end
    if kind == "KeyedSemaphore" then return lock.waitForUnlock, { key, weight, prio }, weight end
    if keyed then return lock.waitForUnlock, { key, prio }, weight end
    return lock.waitForUnlock, { prio }, weight
  end
  if op[1] == "all" and keyed then
    local keys = op[7] == 1 and { "x", "y" } or { "y", "x", "z" }
    local fn = kind == "KeyedRWLock" and weight == 1 and lock.acquireAllRead or lock.acquireAll
    if kind == "KeyedSemaphore" then return fn, { keys, weight, prio }, weight end
    return fn, { keys, prio }, weight
  end
  if kind == "Semaphore" then return lock.acquire, { weight, prio }, weight end
  if kind == "KeyedSemaphore" then return lock.acquire, { key, weight, prio }, weight end
  if kind == "RWLock" then return weight == 1 and lock.acquireRead or lock.acquireWrite, { prio }, weight end
  if kind == "KeyedRWLock" then
    return weight == 1 and lock.acquireRead or lock.acquireWrite, { key, prio }, weight
  end
  if keyed then return lock.acquire, { key, prio }, weight end
  return lock.acquire, { prio }, weight
end

--- release() in async-mutex's way for a plain acquire of 'lock', or nil.
local function unscoped(kind, lock, key, weight)
  if kind == "Mutex" then return function() lock:release() end end
  if kind == "Semaphore" then return function() lock:release(weight) end end
  if kind == "KeyedMutex" then return function() lock:release(key) end end
  if kind == "KeyedSemaphore" then return function() lock:release(key, weight) end end
end

--- Runs program 'p' (steps chosen by 'seed'), debug mode on until step
-- 'debug_until' (nil: throughout).  Returns the steps that raised
-- E_DEADLOCK, the coroutines left waiting, and the coroutines' records.
local function run_program(p, seed, debug_until)
  return dp.run(p, seed, debug_until, make_lock, function(op, held, locks)
    if op[1] == "release" then
      if #held > 0 then table.remove(held, op[2] % #held + 1).r() end
    elseif op[1] == "downgrade" then
      local hd = held[1] and held[op[2] % #held + 1]
      if hd and hd.write then
        local ok, rr = pcall(function() return hd.r:downgrade() end)
        if ok then hd.r, hd.write = rr, false end
      end
    else
      local spec = p.locks[op[2]]
      local lock = decorate(locks[op[2]], op[6])
      local fn, args, weight = request(op, spec, lock)
      local res = table.pack(pcall(fn, lock, table.unpack(args)))
      if not res[1] then
        local e = res[2]
        if e == am.E_DEADLOCK then
          return "deadlock"
        elseif e ~= am.E_ALREADY_LOCKED and not tostring(e):find("reentrant mutex that this coroutine holds") then
          error(e, 0)
        end
      elseif op[1] ~= "unlock" then
        local hd = { r = res[res.n], write = op[1] == "acquire" and spec.kind:find("RWLock") ~= nil and weight ~= 1 }
        if op[1] == "acquire" and op[6] == "plain" and op[7] == 1 then
          hd.r = unscoped(spec.kind, locks[op[2]], op[5], weight) or hd.r
          if hd.r ~= res[res.n] then hd.write = false end
        end
        held[#held + 1] = hd
      end
    end
  end, function(hd) hd.r() end)
end

describe("random programs over every lock kind, keyed forms and release() included", function()
  local n = h.load(2000)
  it(("%d programs: every deadlock raised at a request, and each one raised is real"):format(n), h.async(function()
    local deadlocks = dp.check_both_ways(n, function(seed) return seed * 7919 + 1 end, gen_program, run_program)
    assert.is_true(deadlocks > n // 10, ("only %d deadlocks in %d programs"):format(deadlocks, n))
  end, { deadline = 240000 }))
end)
