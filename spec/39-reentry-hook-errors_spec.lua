-- A debug hook that raises inside a call to the module (at one of the luv
-- calls it makes): the error reaches the caller, and nothing is left half
-- done: no anchored coroutine, pending() back where it was, no key left in
-- a keyed set, the handles still started and stopped as needed.  And a hook
-- run inside a keyed request before it decides (the clock read of a leased
-- request, debug mode's request hook) that drops the key's lock and takes
-- the key: the request decides on the key's lock as it is then, and waits
-- (found by spec/fuzz/reentrancy.lua: it was granted on the dropped lock, a
-- second holder of the key).  docs/semantics.md, Re-entry; docs/internals.md,
-- Decide, then commit; docs/api.md, Conventions.  Each case runs in a child
-- process with a time limit, so that a hang or a crash fails the test.
local h = require "helpers"

-- Each case: 'body' in a child lua5.4 after the re-entry prelude
-- (h.reentry_child: on_call, raise_at, close_all, active); its stdout.
local run = h.reentry_child

-- The keyed cases' child code, after that prelude: drop_and_take(km), the
-- hook's action (km's idle lock made for "a" leaves the set, and "a" is
-- taken in a coroutine of its own; returns that holder's release), and
-- the outcome, written by outcome(ok, co, km, other, after_run): whether
-- co's resume succeeded, "a" is held by the other, co waits, what is
-- pending and in the set; then, once other released and the loop ran
-- (after_run() after it), "ok" if co ended and nothing is left.
local KEYED = [[
local function drop_and_take(km)
  km:cancel()
  local other
  coroutine.wrap(function() other = km:acquire("a") end)()
  return other
end
local function outcome(ok, co, km, other, after_run)
  io.write(tostring(ok), " ", tostring(other ~= nil), " ", coroutine.status(co) == "suspended" and 1 or 0,
    " ", am.pending(), " ", km:count(), " ")
  other()
  uv.run()
  if after_run then after_run() end
  io.write(coroutine.status(co) == "dead" and km:count() == 0 and am.pending() == 0 and "ok" or "stuck", "\n")
end
]]

describe("a debug hook that raises inside a module call", function()
  it("at the clock read (uv.hrtime) of a withTimeout acquire: the error reaches the caller, nothing stays pending", function()
    assert.equal("hook failed 0 0 false 0\n", run([[
      local m = am.Mutex.new()
      local r = coroutine.wrap(function() return m:acquire() end)()
      local err = coroutine.wrap(function()
        raise_at(uv.hrtime)
        local _, e = pcall(function() return am.withTimeout(m, 50):acquire() end)
        return e
      end)()
      local was = am.pending()
      r()
      uv.run()
      io.write(tostring(err), " ", was, " ", am.pending(), " ", tostring(m:isLocked()), " ",
        active(), "\n")
    ]]))
  end)

  it("at the clock read (uv.hrtime) of a withTimeout keyed acquire: the key's lock made for it leaves the set", function()
    assert.equal("hook failed 0 0 0\n", run([[
      local ks = am.KeyedSemaphore.new(1)
      local err = coroutine.wrap(function()
        raise_at(uv.hrtime)
        local _, e = pcall(function() return am.withTimeout(ks, 50):acquire("k", 2) end)
        return e
      end)()
      uv.run()
      io.write(tostring(err), " ", am.pending(), " ", ks:count(), " ", #ks:keys(), "\n")
    ]]))
  end)

  it("at the idle handle's start in a release: the release is made, the waiter runs, and later needs start the handle", function()
    assert.equal("hook failed true 2 0 0\n", run([[
      local m1, m2 = am.Mutex.new(), am.Mutex.new()
      local r1 = coroutine.wrap(function() return m1:acquire() end)()
      local got = 0
      coroutine.wrap(function() m1:acquire()(); got = got + 1 end)()
      local ok, err = coroutine.wrap(function()
        raise_at(uv.idle_start)
        return pcall(r1)
      end)()
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      coroutine.wrap(function() m2:acquire()(); got = got + 1 end)()
      r2()
      uv.run()
      io.write(tostring(err), " ", tostring(not ok), " ", got, " ", am.pending(), " ", active(), "\n")
    ]]))
  end)
end)

describe("a debug hook run inside a keyed request before it decides", function()
  it("at the clock read of a leased request, dropping the key's new lock (cancel) and taking the key: the request waits, one holder", function()
    assert.equal("true true 1 1 1 ok\n", run(KEYED .. [[
      local km = am.KeyedMutex.new()
      local other
      local co = coroutine.create(function()
        debug.sethook(function()
          if debug.getinfo(2, "f").func == uv.hrtime then
            debug.sethook()
            other = drop_and_take(km)
          end
        end, "c")
        local r = am.withLease(km, 1000):acquire("a")
        r()
      end)
      local ok = coroutine.resume(co)
      -- 'other' holds "a"; the leased request must wait behind it
      outcome(ok, co, km, other)
    ]]))
  end)

  it("in debug mode's request hook, dropping the key's new lock and taking the key: the request waits, one holder", function()
    assert.equal("true true 1 1 1 ok\n", run(KEYED .. [[
      am.debug.enable({ onReport = function() end })
      local km, m = am.KeyedMutex.new(), am.Mutex.new()
      local other
      local co = coroutine.create(function()
        local held = m:acquire()             -- holding something: the hook runs Lua
        local armed = true
        debug.sethook(function()
          if armed and debug.getinfo(2, "S").what == "Lua" then
            armed = false
            debug.sethook()
            other = drop_and_take(km)
          end
        end, "c")
        local r = km:acquire("a")
        r()
        held()
      end)
      local ok = coroutine.resume(co)
      outcome(ok, co, km, other, am.debug.disable)
    ]]))
  end)
end)
