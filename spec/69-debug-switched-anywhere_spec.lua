-- Debug mode switched at any instruction of its own Lua code (a count
-- hook of count 1, swept over every position) and by finalizers that run
-- while enable() itself allocates (docs/debug.md, Switched from a hook).
-- Whatever runs in between, the last call stands and C and Lua agree: on
-- with its records, or off; nothing on stderr, nothing left in the
-- registry.  And the copies debug mode makes of its records and of a
-- queue while finalizers take locks, queue or close waiters (docs/debug.md,
-- Copies made while finalizers run): nothing missed, no freed memory read.
-- Each case runs in a child process (h.reentry_child: a crash, or anything
-- on stderr, fails the test; memory cases under valgrind or ASan).
local h = require "helpers"

local function run(body) return h.reentry_child(body, 120) end

-- 'body' in a child under valgrind or ASan (h.memcheck_child)
local function run_checked(body)
  return h.memcheck_child('local am = require "async_mutex"\nlocal uv = require "luv"\n'
    .. body, 300)
end

-- child source: on_stack(f), whether f is a caller of the running code
-- (a finalizer's or a hook's way to act inside one function only)
local ON_STACK = [[
local function on_stack(f)
  for level = 2, 50 do
    local info = debug.getinfo(level, "f")
    if not info then return false end
    if info.func == f then return true end
  end
  return false
end
]]

describe("debug mode switched off by a count hook at any instruction", function()
  -- 'scenario' runs in a coroutine with a count hook that calls ACTION once,
  -- at the k-th instruction, for every k until a run ends before it fires
  local SWEEP = [[
    local fired, runs = 0, 0
    for k = 1, 100000 do
      local armed, n = true, 0
      ENABLE
      local done = false
      coroutine.wrap(function()
        debug.sethook(function()
          n = n + 1
          if armed and n == k then armed = false; fired = fired + 1; ACTION end
        end, "", 1)
        SCENARIO
        debug.sethook()
        done = true
      end)()
      uv.run()
      runs = runs + 1
      if not done then error("run " .. k .. " did not finish") end
      if armed then break end             -- ran to the end before k
    end
    am.debug.disable()
    io.write(tostring(fired > 10), " ", tostring(fired + 1 == runs), " ", am.pending(), "\n")
  ]]
  local function sweep(enable, scenario, action)
    return run((SWEEP:gsub("ENABLE", enable):gsub("SCENARIO", scenario):gsub("ACTION", action)))
  end

  it("through a grant and release with holdWarning: no hook error", function()
    assert.equal("true true 0\n", sweep(
      [[am.debug.enable({ holdWarning = 1000, onReport = function() end })
        local m = am.Mutex.new()]],
      [[local r = m:acquire(); r()]],
      [[am.debug.disable()]]))
  end)

  it("through a grant switched on again without holdWarning: no hook error", function()
    assert.equal("true true 0\n", sweep(
      [[am.debug.enable({ holdWarning = 1000, onReport = function() end })
        local m = am.Mutex.new()]],
      [[local r = m:acquire(); r()]],
      [[am.debug.enable({ onReport = function() end })]]))
  end)

  it("through a deadlock found and reported: nothing written to stderr", function()
    assert.equal("true true 0\n", sweep(
      [[am.debug.enable({ onReport = function() end })
        local m = am.Mutex.new()]],
      -- (switched off before the search decides, the request waits as it
      -- would with debug mode off: for itself, until its timeout)
      [[local r = m:acquire()
        local d = am.withTimeout(m, 1)
        local ok, err = pcall(d.acquire, d)
        r()
        assert(not ok and (err == am.E_DEADLOCK or err == am.E_TIMEOUT), tostring(err))]],
      [[am.debug.disable()]]))
  end)
end)

describe("a finalizer that switches debug mode while enable() allocates", function()
  -- a ring of garbage whose finalizers act once the given function is on
  -- the stack, with the collector stepping at every allocation
  local RING = ON_STACK .. [[
    local core = require "async_mutex.core"
    local armed, fired = false, 0
    local function ring()
      setmetatable({}, { __gc = function()
        if armed and on_stack(TARGET) then armed = false; fired = fired + 1; ACTION end
        ring()
      end })
    end
    for _ = 1, 200 do ring() end
  ]]
  local function case(target, action, body, runner)
    return (runner or run)(RING:gsub("TARGET", target):gsub("ACTION", action) .. body)
  end

  -- A holds L1 and requests L2 (held, waiters at six priorities) at a
  -- priority above theirs: they would wait behind A, so the deadlock search
  -- reads L2's queue (core.dbg_queue) while a finalizer queues a waiter of
  -- a new priority (a new bucket) or closes a waiting coroutine (its bucket
  -- freed).  L2's holder waits for L3 (held by the chunk): with a holder
  -- that waits for nothing, C clears A's request without a search
  -- (src/core/debug/debug_deadlock.c, alone_and_fits).
  local QUEUE = [[
    local L1, L2, L3 = am.Mutex.new(), am.Mutex.new(), am.Mutex.new()
    local hold2
    local hold3 = am.tryAcquire(L3):acquire()
    coroutine.wrap(function() hold2 = L2:acquire(); L3:acquire()() end)()
    local served = 0
    function wait_on(p)
      local co = coroutine.create(function()
        local ok, r = pcall(L2.acquire, L2, p)
        if ok then served = served + 1; r() end
      end)
      coroutine.resume(co)
      return co
    end
    waiters = {}
    for p = 1, 6 do waiters[#waiters + 1] = wait_on(p) end
    collectgarbage("incremental", 1, 100, 0)  -- a step at every allocation
    for _ = 1, 300 do
      if fired >= 30 then break end
      coroutine.wrap(function()
        local r1 = L1:acquire()
        while #waiters < 6 do waiters[#waiters + 1] = wait_on(#waiters + 1) end
        per, armed = 0, true
        local d = am.withTimeout(L2, 1)
        local ok, err = pcall(d.acquire, d, 1000)   -- would wait: the search runs
        armed = false
        assert(not ok and err == am.E_TIMEOUT, tostring(err))
        r1()
      end)()
      uv.run()
    end
    collectgarbage("generational")
    hold2()
    hold3()
    uv.run()
    io.write(tostring(fired > 0), " ", am.pending(), "\n")
  ]]

  it("a lock taken by a finalizer while holds() copies the records: every hold held before is in the result", function()
    assert.equal("true 0 0\n", run(ON_STACK .. [==[
local core = require "async_mutex.core"
am.debug.enable({ onReport = function() end })
local armed, fired, extra = false, 0, {}
local spare = am.Mutex.new()
local function ring()
  setmetatable({}, { __gc = function()
    if armed and on_stack(core.dbg_records) then
      armed = false; fired = fired + 1
      local co = coroutine.wrap(function() extra[#extra + 1] = am.tryAcquire(spare):acquire() end)
      co()
    end
    ring()
  end })
end
for _ = 1, 200 do ring() end
local locks, rels = {}, {}
for i = 1, 8 do locks[i] = am.Mutex.new() end
local missed = 0
collectgarbage("incremental", 1, 100, 0)
for attempt = 1, 200 do
  for i = 1, 8 do
    coroutine.wrap(function() rels[i] = locks[i]:acquire() end)()
  end
  rels[1]()                       -- a free slot below the others

  armed = true
  local hs = am.debug.holds()
  armed = false

  local seen = {}
  for _, h in ipairs(hs) do seen[h.lock] = true end
  for i = 2, 8 do if not seen[locks[i]] then missed = missed + 1 end end
  for i = 2, 8 do rels[i]() end
  for _, r in ipairs(extra) do r() end
  extra = {}
end
io.write(tostring(fired > 0), " ", missed, " ", core.dbg_count(), "\n")
    ]==]))
  end)

  it("a waiter of a new priority queued by a finalizer while the deadlock search copies a queue: no overrun", function()
    assert.equal("true 0\n", case("core.dbg_queue", "per = per + 1; armed = per < 12; waiters[#waiters + 1] = wait_on(100 + fired)",
      "am.debug.enable({ onReport = function() end })\n" .. QUEUE, run_checked))
  end)

  it("a waiting coroutine closed by a finalizer while the deadlock search copies a queue: no freed bucket read", function()
    assert.equal("true 0\n", case("core.dbg_queue", "per = per + 1; armed = per < 6; local co = table.remove(waiters, 1); if co then coroutine.close(co) end",
      "am.debug.enable({ onReport = function() end })\n" .. QUEUE, run_checked))
  end)

  it("enable() nested in enable()'s C allocations: disable() leaves no hook table in the registry", function()
    assert.equal("true 0 true\n", case("core.debug", "am.debug.enable({ traceback = true })", [[
      local reg = debug.getregistry()
      local function refs()                   -- registry references in use
        local n = 0
        for k, v in pairs(reg) do
          if math.type(k) == "integer" and k > 2 and type(v) ~= "number" then n = n + 1 end
        end
        return n
      end
      local before = refs()
      collectgarbage("incremental", 1, 100, 0)  -- a step at every allocation
      for _ = 1, 2000 do
        if fired > 0 then break end
        armed = true
        am.debug.enable({ onReport = function() end })
        armed = false
        am.debug.disable()
      end
      collectgarbage("generational")
      collectgarbage()
      local m = am.Mutex.new()
      local held
      coroutine.wrap(function() local r = m:acquire(); held = #am.debug.holds(); r() end)()
      io.write(tostring(fired > 0), " ", refs() - before, " ", tostring(held == 0), "\n")
    ]]))
  end)

  it("disable() from a finalizer while enable() builds its hook table: enable() came last and stands, C and Lua agree", function()
    assert.equal("true true 1\n", case("am.debug.enable", "am.debug.disable()", [[
      local m = am.Mutex.new()
      local ok_all, recorded = true, 0
      collectgarbage("incremental", 1, 100, 0)  -- a step at every allocation
      for _ = 1, 2000 do
        if fired > 0 then break end
        am.debug.disable()
        armed = true
        am.debug.enable({ onReport = function() end })
        armed = false
      end
      collectgarbage("generational")
      ok_all = am.debug.isEnabled()
      coroutine.wrap(function() local r = m:acquire(); recorded = #am.debug.holds(); r() end)()
      am.debug.disable()
      io.write(tostring(fired > 0), " ", tostring(ok_all), " ", recorded, "\n")
    ]]))
  end)
end)
