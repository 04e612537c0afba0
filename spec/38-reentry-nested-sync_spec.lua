-- Re-entry into the module from a debug hook run by one of the luv calls
-- that start, stop or replace its idle handle and timer (am_sync,
-- src/scheduler.c): the call back is completed, and the handles are
-- brought in line with the queues once, by the outer call
-- (docs/semantics.md, Re-entry; docs/internals.md, Rules the code keeps).
-- Found by the re-entrancy fuzzer (spec/fuzz/reentrancy.lua) with call
-- hooks and uv.walk closing the module's handles: two replacements of one
-- closed idle handle, nested, left one new handle active and known to no
-- one, and uv.run() never returned.  Each case runs in a child process
-- with a time limit, so that a hang or a crash fails the test.
local h = require "helpers"

-- Runs 'body' (Lua source) in a child lua5.4 after a prelude defining
-- close_all() (uv.walk closing every handle) and on_call(fn, action) (a
-- "c" hook on the running coroutine that runs 'action' once, at the first
-- call of 'fn') and active() (how many handles are active); returns the
-- child's stdout.
local function run(body)
  local res = h.subprocess([[
    local am = require "async_mutex"
    local uv = require "luv"
    local function close_all()
      uv.walk(function(hd) if not hd:is_closing() then hd:close() end end)
    end
    local function on_call(fn, action)
      local armed = true
      debug.sethook(function()
        if armed and debug.getinfo(2, "f").func == fn then
          armed = false
          action()
        end
      end, "c")
    end
    -- the module's handles left active (uv.run() would not return)
    local function active()
      local n = 0
      uv.walk(function(hd) if hd:is_active() and not hd:is_closing() then n = n + 1 end end)
      return n
    end
  ]] .. body, 20)
  assert.equal("", res.stderr)
  assert.equal(0, res.rc, "the child hung or crashed: " .. tostring(res.how))
  return res.stdout
end

describe("a debug hook run while the module replaces its closed idle handle", function()
  it("that makes another wake-up due (a release) from the is_closing check: one handle, uv.run() returns, both waiters run", function()
    assert.equal("2 0 0 false false\n", run([[
      local m1, m2 = am.Mutex.new(), am.Mutex.new()
      local r1 = coroutine.wrap(function() return m1:acquire() end)()
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      local got = 0
      coroutine.wrap(function() m1:acquire()(); got = got + 1 end)()
      coroutine.wrap(function() m2:acquire()(); got = got + 1 end)()
      close_all()                            -- the idle handle among them
      uv.run()                               -- the closes complete
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
    assert.equal("2 0 0\n", run([[
      local m1, m2 = am.Mutex.new(), am.Mutex.new()
      local r1 = coroutine.wrap(function() return m1:acquire() end)()
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      local got = 0
      coroutine.wrap(function() m1:acquire()(); got = got + 1 end)()
      coroutine.wrap(function() m2:acquire()(); got = got + 1 end)()
      close_all()
      uv.run()
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
