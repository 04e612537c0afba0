-- Re-entry from debug hooks: the module calls luv through Lua (uv.hrtime,
-- idle:start, timer:start), where a "c" hook runs, and the hook may call
-- the module back.  It only does so once its queues are consistent
-- (docs/semantics.md, Re-entry).  Each case runs in a child process, so
-- that a crash fails the test.
local h = require "helpers"

-- Each case: 'body' in a child lua5.4 after the re-entry prelude
-- (h.reentry_child: on_call, raise_at, close_all, active), with a 60 s
-- limit; its stdout.
local function run(body) return h.reentry_child(body, 60) end

-- The scene of the first cases: m held by `holder`, then a withTimeout(m,
-- 20) acquire in a coroutine with a call hook (on_call) at the function %s
-- that runs %s; `got`: whether the acquire was granted (then released).
local TIMED_ACQUIRE_OF_HELD = [[
      local m = am.Mutex.new()
      local holder
      coroutine.wrap(function() holder = m:acquire() end)()
      local got
      coroutine.wrap(function()
        on_call(%s, function() %s end)
        local d = am.withTimeout(m, 20)
        local ok, r = pcall(d.acquire, d)
        debug.sethook()
        got = ok
        if ok then r() end
      end)()
]]

describe("a debug hook", function()
  it("that releases the mutex from the clock read (uv.hrtime) of a withTimeout acquire: granted at once, no timer left", function()
    assert.equal("true false 0 0\n", run(TIMED_ACQUIRE_OF_HELD:format("uv.hrtime", "m:release()") .. [[
      local timers = 0
      uv.walk(function(hd) if hd:get_type() == "timer" and hd:is_active() then timers = timers + 1 end end)
      uv.run()
      io.write(tostring(got), " ", tostring(m:isLocked()), " ", am.pending(), " ", timers, "\n")
    ]]))
  end)

  it("that releases the mutex from the timer:start of a withTimeout acquire: the waiter is granted, its releaser works", function()
    assert.equal("true false 0\n", run(TIMED_ACQUIRE_OF_HELD:format("uv.timer_start", "holder()") .. [[
      uv.run()
      io.write(tostring(got), " ", tostring(m:isLocked()), " ", am.pending(), "\n")
    ]]))
  end)

  it("that starts a waitForUnlock of a new weight from idle:start during setValue: each waiter ends once", function()
    assert.equal("4 1\n5 0\n", run([[
      local s = am.Semaphore.new(0)
      local done = {}
      for w = 1, 4 do
        coroutine.wrap(function() s:waitForUnlock(w); done[#done + 1] = w end)()
      end
      coroutine.wrap(function()
        on_call(uv.idle_start, function()
          coroutine.wrap(function() s:waitForUnlock(11); done[#done + 1] = 11 end)()
        end)
        s:setValue(10)
        debug.sethook()
      end)()
      uv.run()
      io.write(#done, " ", am.pending(), "\n")
      s:setValue(20)
      uv.run()
      io.write(#done, " ", am.pending(), "\n")
    ]]))
  end)

  it("that cancels from timer:stop while a grant removes the last deadline: every waiter ends once", function()
    assert.equal("granted canceled 0\n", run([[
      local m = am.Mutex.new()
      local holder
      coroutine.wrap(function() holder = m:acquire() end)()
      local out = {}
      coroutine.wrap(function()
        local d = am.withTimeout(m, 5000)
        local ok = pcall(d.acquire, d)
        out[1] = ok and "granted" or "refused"
        m:release()
      end)()
      coroutine.wrap(function()
        local ok, err = pcall(m.acquire, m)
        out[2] = ok and "granted" or (err == am.E_CANCELED and "canceled" or tostring(err))
      end)()
      coroutine.wrap(function()
        on_call(uv.timer_stop, function() m:cancel() end)
        holder()
        debug.sethook()
      end)()
      uv.run()
      io.write(out[1], " ", tostring(out[2]), " ", am.pending(), "\n")
    ]]))
  end)
end)
