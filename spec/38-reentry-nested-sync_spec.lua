-- Re-entry into the module from a debug hook run by one of the luv calls
-- that start, stop or replace its idle handle and timer (am_sync,
-- src/core/scheduler/scheduler.c): the call back is completed, and the handles are
-- brought in line with the queues once, by the outer call
-- (docs/semantics.md, Re-entry; docs/internals.md, Rules the code keeps).
-- Found by the re-entrancy fuzzer (spec/fuzz/reentrancy.lua) with call
-- hooks and uv.walk closing the module's handles: two replacements of one
-- closed idle handle, nested, left one new handle active and known to no
-- one, and uv.run() never returned.  Each case runs in a child process
-- with a time limit, so that a hang or a crash fails the test.
local h = require "helpers"

-- Each case: 'body' in a child lua5.4 after the re-entry prelude
-- (h.reentry_child: on_call, raise_at, close_all, active); its stdout.
local run = h.reentry_child

-- The scene of the first cases: m1 and m2 held (released by r1, r2), a
-- waiter on each (counted in `got` once it ran), the module's handles
-- closed, the closes completed.
local TWO_HELD_HANDLES_CLOSED = [[
      local m1, m2 = am.Mutex.new(), am.Mutex.new()
      local r1 = coroutine.wrap(function() return m1:acquire() end)()
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      local got = 0
      coroutine.wrap(function() m1:acquire()(); got = got + 1 end)()
      coroutine.wrap(function() m2:acquire()(); got = got + 1 end)()
      close_all()                            -- the idle handle among them
      uv.run()                               -- the closes complete
]]

describe("a debug hook run while the module replaces its closed idle handle", function()
  it("that makes another wake-up due (a release) from the is_closing check: one handle, uv.run() returns, both waiters run", function()
    assert.equal("2 0 0 false false\n", run(TWO_HELD_HANDLES_CLOSED .. [[
      coroutine.wrap(function()
        on_call(uv.is_closing, function() r2() end)
        r1()                                 -- a wake-up due: replace the handle
        debug.sethook()
      end)()
      uv.run()
      io.write(got, " ", am.pending(), " ", active(), " ", tostring(m1:isLocked()), " ",
        tostring(m2:isLocked()), "\n")
    ]]))
  end)

  it("that closes the handles again and makes a wake-up due from the new handle's start: it runs, nothing is left active", function()
    assert.equal("2 0 0\n", run(TWO_HELD_HANDLES_CLOSED .. [[
      coroutine.wrap(function()
        on_call(uv.idle_start, function() close_all(); r2() end)
        r1()
        debug.sethook()
      end)()
      uv.run()
      io.write(got, " ", am.pending(), " ", active(), "\n")
    ]]))
  end)

  it("that makes a wake-up due from the idle handle's stop: it still runs", function()
    assert.equal("1 0 0 false\n", run([[
      local m1, m2 = am.Mutex.new(), am.Mutex.new()
      local r1 = coroutine.wrap(function() return m1:acquire() end)()
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      local got = 0
      local co1 = coroutine.create(function() m1:acquire()(); got = got + 1 end)
      coroutine.resume(co1)
      coroutine.wrap(function() m2:acquire()(); got = got + 1 end)()
      r1()                                   -- co1 granted: the idle handle starts
      -- (its waiter's __close runs on co1: the hook goes there)
      debug.sethook(co1, function()
        if debug.getinfo(2, "f").func == uv.idle_stop then
          debug.sethook(co1)
          r2()
        end
      end, "c")
      coroutine.close(co1)                   -- nothing due: the handle stops
      uv.run()
      io.write(got, " ", am.pending(), " ", active(), " ", tostring(m1:isLocked()), "\n")
    ]]))
  end)
end)
