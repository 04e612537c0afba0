-- Debug mode switched off or on from where its own Lua code runs: a "c"
-- hook at one of the calls the debug module makes (uv.new_timer, the
-- core's dbg_* readers), and finalizers that run at lua_close after the
-- module's state is gone (docs/debug.md, Switched from a hook).  What it
-- was doing stops quietly: no "error in a hook" on stderr, no report to
-- stderr when the user gave onReport, no error from disable() at exit, no
-- memory left behind.  Each case runs in a child process (h.reentry_child:
-- a crash, or anything on stderr, fails the test).
local h = require "helpers"

local function run(body) return h.reentry_child(body, 60) end

describe("debug mode switched off by a hook while its Lua code runs", function()
  it("as a grant starts the long-hold timer (uv.new_timer): the grant stands, no hook error", function()
    assert.equal("false false 0\n", run([[
      local m = am.Mutex.new()
      am.debug.enable({ holdWarning = 1000, onReport = function() end })
      coroutine.wrap(function()
        on_call(uv.new_timer, function() am.debug.disable() end)
        local r = m:acquire()
        debug.sethook()
        r()
      end)()
      uv.run()
      io.write(tostring(am.debug.isEnabled()), " ", tostring(m:isLocked()), " ", am.pending(), "\n")
    ]]))
  end)

  it("switched on again without holdWarning as a grant starts the timer: no hook error, no timer left", function()
    assert.equal("true 0 0\n", run([[
      local m = am.Mutex.new()
      am.debug.enable({ holdWarning = 1000, onReport = function() end })
      coroutine.wrap(function()
        on_call(uv.new_timer, function() am.debug.enable({ onReport = function() end }) end)
        local r = m:acquire()
        debug.sethook()
        r()
      end)()
      uv.run()
      io.write(tostring(am.debug.isEnabled()), " ", am.pending(), " ", active(), "\n")
    ]]))
  end)

  it("during a deadlock search: E_DEADLOCK still raised, the report not written to stderr", function()
    assert.equal("true 0 0\n", run([[
      am.debug.enable({ onReport = function() end })
      local m = am.Mutex.new()                -- named by its site: no tostring
      local deadlock
      coroutine.wrap(function()
        local r = m:acquire()
        on_call(tostring, function() am.debug.disable() end)   -- as the report is written
        local ok, err = pcall(m.acquire, m)
        debug.sethook()
        deadlock = not ok and err == am.E_DEADLOCK
        r()
      end)()
      uv.run()
      io.write(tostring(deadlock), " ", am.pending(), " ", #am.debug.holds(), "\n")
    ]]))
  end)

  it("during the long-hold check: the check stops, nothing written to stderr, no timer left running", function()
    assert.equal("0 0 0\n", run([[
      local core = require "async_mutex.core"
      local m = am.Mutex.new()
      local reports = 0
      am.debug.enable({ holdWarning = 5, onReport = function() reports = reports + 1 end })
      on_call(core.dbg_warned, function() am.debug.disable() end)  -- the loop's thread
      coroutine.wrap(function()
        local r = m:acquire()
        am.sleep(40)
        r()
      end)()
      uv.run()
      debug.sethook()
      io.write(reports, " ", am.pending(), " ", active(), "\n")
    ]]))
  end)
end)

describe("debug mode switched by a finalizer that runs at lua_close after the module's state", function()
  -- an object made before the module is required: its finalizer runs after
  -- the state's (finalizers run newest first)
  local PRELUDE = [[
    local am
    local last = setmetatable({}, { __gc = function()
      ACTION
    end })
    am = require "async_mutex"
    local uv = require "luv"
    am.debug.enable({ holdWarning = 50, onReport = function() end })
    local m = am.Mutex.new()
    am.spawn(function() local r = m:acquire(); am.sleep(1); r() end)
    uv.run()
    KEEP = m:isLocked()
  ]]
  local function case(action) return (PRELUDE:gsub("ACTION", action)) end

  it("disable() returns quietly", function()
    assert.equal("true nil\n", run(case([[
      local ok1, err1 = pcall(am.debug.disable)
      local ok2 = pcall(am.debug.disable)
      io.write(tostring(ok1 and ok2), " ", tostring(err1), "\n")
    ]])))
  end)

  it("enable() records nothing and leaves no memory behind (valgrind or LeakSanitizer)", function()
    assert.equal("true 0\n", h.memcheck_child(case([[
      local ok = pcall(am.debug.enable, { traceback = true })
      local m2 = am.Mutex.new()
      local co = coroutine.create(function() return am.tryAcquire(m2):acquire() end)
      coroutine.resume(co)
      io.write(tostring(ok), " ", #am.debug.holds(), "\n")
    ]]), 120))
  end)
end)
