-- Debug mode's cost (docs/debug.md): the uncontended pair, the
-- hand-off and the 100k chain of bench/scenarios.lua, with debug mode off,
-- on, and on with tracebacks; and 10,000 coroutines that each hold a lock
-- of their own and queue on one mutex (every request would wait while its
-- coroutine holds something: each runs lockdep, and the deadlock search).
-- `lua5.4 bench/debug.lua` from the repository root with the module on the
-- paths (`make bench` does it); BENCH_QUICK=1 runs a tenth of the sizes.
-- Each figure is the best of 3 processes (CPU time, os.clock); prints one
-- Markdown table with the ratio to debug off.  Targets: on, without
-- tracebacks, at most 3x off; the held-and-queued scenario at most 5x.
--
--   lua5.4 bench/debug.lua                   (the table)
--   lua5.4 bench/debug.lua one MODE SCENARIO N   (one run: ns per operation)

local QUICK = os.getenv("BENCH_QUICK") == "1"
local SCALE = QUICK and 0.1 or 1
local LUA = os.getenv("LUA") or "lua5.4"

local MODES = {
  off = nil,
  on = {},
  traceback = { traceback = true },
}

-- {========================================================== one run

local function one(mode, scenario, n)
  local uv = require "luv"
  local am = require "async_mutex"
  if mode ~= "off" then am.debug.enable(MODES[mode]) end
  local m = am.Mutex.new()
  local t0, t1
  if scenario == "pair" then
    am.spawn(function()
      t0 = os.clock()
      for _ = 1, n do
        local release = m:acquire()
        release()
      end
      t1 = os.clock()
    end)
    uv.run()
  elseif scenario == "handoff" then
    -- 10 coroutines, n // 10 cycles each; every acquire waits (a holder
    -- takes the mutex first and releases it once all are queued)
    local ncoro = 10
    local holder = am.tryAcquire(m):acquire()
    for _ = 1, ncoro do
      am.spawn(function()
        for _ = 1, n // ncoro do
          local release = m:acquire()
          release()
        end
      end)
    end
    t0 = os.clock()
    holder()
    uv.run()
    t1 = os.clock()
  elseif scenario == "chain" then
    -- n coroutines queued behind a holder, each acquires and releases with
    -- no yield in between
    local holder = am.tryAcquire(m):acquire()
    for _ = 1, n do
      am.spawn(function()
        local release = m:acquire()
        release()
      end)
    end
    t0 = os.clock()
    holder()
    uv.run()
    t1 = os.clock()
  elseif scenario == "queued" then
    -- n coroutines, each takes a Mutex of its own (made by it), then
    -- queues on m, held here; then m goes round: per coroutine, from its
    -- spawn to its end
    local holder = am.tryAcquire(m):acquire()
    t0 = os.clock()
    for _ = 1, n do
      am.spawn(function()
        local own = am.Mutex.new()
        local release_own = own:acquire()
        local release = m:acquire()
        release()
        release_own()
      end)
    end
    holder()
    uv.run()
    t1 = os.clock()
  else
    error("unknown scenario " .. tostring(scenario))
  end
  assert(not m:isLocked())
  io.write(("%.1f\n"):format((t1 - t0) * 1e9 / n))
end

if arg[1] == "one" then
  one(arg[2], arg[3], tonumber(arg[4]))
  return
end

-- }==========================================================


-- {========================================================== the table

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local function best_of(mode, scenario, n, rounds)
  local best
  for _ = 1, rounds do
    local out, ok = sh(("%s bench/debug.lua one %s %s %d"):format(LUA, mode, scenario, n))
    local ns = tonumber(out:match("[%d.]+"))
    assert(ok and ns, ("bench/debug.lua one %s %s %d failed:\n%s"):format(mode, scenario, n, out))
    best = best and math.min(best, ns) or ns
  end
  return best
end

-- name, what, size, target (on / off)
local SCENARIOS = {
  { "pair", "uncontended acquire + release", math.floor(200000 * SCALE), 3 },
  { "handoff", "hand-off (10 coroutines)", math.floor(200000 * SCALE), 3 },
  { "chain", "chain of 100k waiters, per link", math.floor(100000 * SCALE), 3 },
  { "queued", "10k coroutines holding a lock queued on one mutex, per coroutine",
    math.floor(10000 * SCALE), 5 },
}

print("| scenario | debug off (ns/op) | on (ns/op) | on / off | on + traceback (ns/op) | traceback / off |")
print("|---|---|---|---|---|---|")
local missed = {}
for _, s in ipairs(SCENARIOS) do
  local off = best_of("off", s[1], s[3], 3)
  local on = best_of("on", s[1], s[3], 3)
  local tb = best_of("traceback", s[1], s[3], 3)
  if on / off > s[4] then missed[#missed + 1] = ("%s (%.2fx)"):format(s[1], on / off) end
  print(("| %s | %.0f | %.0f | %.2fx | %.0f | %.2fx |"):format(s[2], off, on, on / off, tb, tb / off))
end
print()
print(("Targets: debug on without tracebacks at most 3x off (the queued coroutines: 5x): %s."):format(
  #missed == 0 and "met" or "missed by " .. table.concat(missed, ", ")))

-- }==========================================================
