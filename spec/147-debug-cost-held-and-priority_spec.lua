-- Debug mode's cost where it grew as the square (docs/debug.md, Lockdep
-- and Deadlocks), in instructions (callgrind in a child process), never in
-- time:
--  * lockdep read every record of the requester at each acquire, as a
--    table each: a coroutine taking n locks one by one (acquireAll of n
--    keys, n mutexes nested) paid for n^2 / 2 records.  acquireAll of
--    2,000 keys ran 9.8 G instructions (debug mode off: 53 M), 2,000 nested
--    mutexes 61 G (off: 21 M).  It now counts the classes a coroutine holds
--    from the records made since it last looked, while none ended.
--  * a request of a higher priority than a long queue (the queue would
--    wait behind it) was searched in Lua, which copied the whole queue and
--    every waiter's records: 2,000 such requests after 2,000 waiters ran
--    64 G instructions (off: 62 M).  C now clears it when no holder of the
--    lock waits for anything: those behind it cannot keep it waiting.
local h = require "helpers"

local under_asan = (os.getenv("LD_PRELOAD") or ""):find("asan")

local CHILD = [[
local am = require "async_mutex"
local uv = require "luv"
local N, MODE, SC = %d, %q, %q
if MODE == "on" then am.debug.enable({ onReport = function() end }) end
if SC == "keys" then                      -- acquireAll of N keys
  local km = am.KeyedMutex.new()
  am.spawn(function()
    local keys = {}
    for i = 1, N do keys[i] = i end
    km:acquireAll(keys)()
  end)
elseif SC == "nested" then                -- N mutexes (one class) nested
  local ms = {}
  for i = 1, N do ms[i] = am.Mutex.new() end
  am.spawn(function()
    local rs = {}
    for i = 1, N do rs[i] = ms[i]:acquire() end
    for i = N, 1, -1 do rs[i]() end
  end)
else                                      -- N waiters, then N ahead of them
  local m = am.Mutex.new()
  local go = false
  am.spawn(function()                     -- the holder sleeps meanwhile
    local r = m:acquire()
    while not go do am.sleep(1) end
    r()
  end)
  for _ = 1, N do am.spawn(function() m:acquire(0)() end) end
  for _ = 1, N do am.spawn(function()
    local r = am.Mutex.new():acquire()    -- each holds a lock: searched
    m:acquire(1)()
    r()
  end) end
  go = true
end
uv.run()
assert(am.pending() == 0)
io.write("ok\n")
]]

--- Instructions the child runs (callgrind's "Collected" count).
local function instructions(n, mode, scenario)
  return h.instructions(CHILD:format(n, mode, scenario), 120)
end

--- on(n), on(2n), off(n): debug mode on costs at most 'times' the
-- instructions off and grows linearly.
local function linear(scenario, times)
  local off = instructions(2000, "off", scenario)
  local on = instructions(2000, "on", scenario)
  local on2 = instructions(4000, "on", scenario)
  assert.is_true(on <= times * off, ("on %d, off %d instructions"):format(on, off))
  assert.is_true(on2 <= 2.3 * on, ("4,000: %d, 2,000: %d instructions"):format(on2, on))
end

local it_or_pending = under_asan and pending or it

describe("a coroutine that takes many locks one by one", function()
  -- measured: 4.0x off, 4,000 1.98 times 2,000 (main before: 187x)
  it_or_pending("acquireAll of 2,000 and 4,000 keys: at most 6 times the instructions off, linear", function()
    linear("keys", 6)
  end)

  -- measured: 5.4x off, 1.90 (main before: 2,900x)
  it_or_pending("2,000 and 4,000 mutexes of one class taken nested: at most 8 times off, linear", function()
    linear("nested", 8)
  end)
end)

describe("requests of a higher priority than a long queue", function()
  -- measured: 2.6x off, 1.93 (main before: 1,036x)
  it_or_pending("2,000 and 4,000 waiters, as many requests ahead of them, the holder sleeping: at most 5 times off, linear", function()
    linear("jumpers", 5)
  end)
end)

describe("lockdep for a coroutine that holds many locks: the same reports", function()
  local dr = require "debug_reports"
  local am = require "async_mutex"
  local rec = dr.recorder(before_each, after_each)

  -- n mutexes named apart (a class each), taken in order
  local function named(prefix, n)
    local t = {}
    for i = 1, n do t[i] = am.debug.name(am.Mutex.new(), prefix .. i) end
    return t
  end

  it("20 held, then one taken in an order that inverts an earlier one: reported", h.async(function()
    local ms = named("m", 20)
    local rs = {}
    for i = 1, 20 do rs[i] = ms[i]:acquire() end
    for i = 20, 1, -1 do rs[i]() end
    assert.equal(0, rec.count("inversion"))
    local r20 = ms[20]:acquire()
    local r5 = ms[5]:acquire()                 -- m20 -> m5 against m5 -> m20
    r5(); r20()
    assert.equal(1, rec.count("inversion"))
    assert.truthy(rec.first("inversion").text:find("lock order inversion", 1, true))
  end))

  it("an edge only from what is held at the request: 20 held, 10 of them given back, then a new lock", h.async(function()
    local ms, z = named("n", 20), am.debug.name(am.Mutex.new(), "z")
    local rs = {}
    for i = 1, 20 do rs[i] = ms[i]:acquire() end
    for i = 11, 20 do rs[i]() end              -- n11..n20 no longer held
    local rz = z:acquire()                     -- edges n1..n10 -> z only
    rz()
    for i = 1, 10 do rs[i]() end
    rz = z:acquire()                           -- z -> n15: no cycle
    local r15 = ms[15]:acquire()
    r15(); rz()
    assert.equal(0, rec.count("inversion"))
    rz = z:acquire()                           -- z -> n5: closes n5 -> z
    local r5 = ms[5]:acquire()
    r5(); rz()
    assert.equal(1, rec.count("inversion"))
  end))

  it("12 keys of one keyed lock taken one by one: reported once; acquireAll of 12: not", h.async(function()
    local km = am.KeyedMutex.new()
    local rs = {}
    for i = 1, 12 do rs[i] = km:acquire(i) end
    for i = 12, 1, -1 do rs[i]() end
    assert.equal(1, rec.count("inversion"))
    assert.truthy(rec.first("inversion").text:find("two keys of one keyed lock", 1, true))
    local k2 = am.KeyedMutex.new()
    local keys = {}
    for i = 1, 12 do keys[i] = i end
    k2:acquireAll(keys)()
    assert.equal(1, rec.count("inversion"))
  end))

  it("a lock requested again by a coroutine holding it among 12: no report of two of one class", h.async(function()
    local s = am.Semaphore.new(20)
    local ms = named("p", 11)
    local rs = {}
    for i = 1, 11 do rs[i] = ms[i]:acquire() end
    local _, r1 = s:acquire()
    local _, r2 = s:acquire()                  -- s again: the same lock
    r2(); r1()
    for i = 11, 1, -1 do rs[i]() end
    assert.equal(0, rec.count("inversion"))
  end))
end)
