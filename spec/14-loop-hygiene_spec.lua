-- The module and luv's loop: uv.run() returns when nothing is pending, no
-- handle or timer is left behind, uv.walk() works, exit is clean
-- (docs/semantics.md, Coroutines and the loop).
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

describe("the luv loop", function()
  it("delivers a wake-up for a release made from main code, then uv.run() returns", function()
    local m = am.Mutex.new()
    local got = false
    local release = h.holder(m)
    coroutine.wrap(function()
      local r = m:acquire()
      got = true
      r()
    end)()
    release()                                  -- from the main thread
    assert.is_false(got)
    local idle, ms = h.run_loop(2000)
    assert.is_true(idle, "uv.run() did not return by itself")
    assert.is_true(got)
    assert.is_true(ms < 500 * h.TIME_SCALE)
    assert.same({}, h.active_handles())
  end)

  it("returns from uv.run() at once while waiters sit on a held lock", function()
    local m = am.Mutex.new()
    local release = h.holder(m)
    local got = false
    coroutine.wrap(function() m:acquire()(); got = true end)()
    local idle, ms = h.run_loop(2000)
    assert.is_true(idle)
    assert.is_true(ms < 500 * h.TIME_SCALE)
    assert.is_false(got)
    release()
    assert.is_true(h.run_loop(2000))
    assert.is_true(got)
  end)

  it("keeps no active handle once the granted coroutines have been resumed", h.async(function()
    local s = am.Semaphore.new(0)
    for _ = 1, 3 do h.acquirer(nil, "x", s) end
    s:setValue(3)
    h.tick()
    assert.same({}, h.active_handles())
  end))

  it("keeps no timer running after a withTimeout grant", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local a = h.acquirer(nil, "a", am.withTimeout(m, 10000))
    assert.equal(1, h.count_handles("uv_timer_t", true))  -- waiting: one timer
    r()
    assert.equal(0, h.count_handles("uv_timer_t", true))  -- stopped at grant time
    h.tick()
    assert.is_true(a.ok)
    a.release()
    assert.same({}, h.active_handles())
  end))

  it("keeps no timer running after a withTimeout cancel or expiry", h.holding(am.Mutex.new, function(m)
    local a = h.acquirer(nil, "a", am.withTimeout(m, 10000))
    m:cancel()
    assert.equal(0, h.count_handles("uv_timer_t", true))
    h.tick()
    assert.equal(am.E_CANCELED, a.err)
    local b = h.acquirer(nil, "b", am.withTimeout(m, 2))
    h.wait_until(function() return b.done end, 1000)
    assert.equal(am.E_TIMEOUT, b.err)
    assert.same({}, h.active_handles())
  end))

  it("does not spin the CPU while waiters wait", h.holding(am.Mutex.new, function(m)
    for _ = 1, 10 do h.acquirer(nil, "x", m) end
    h.acquirer(nil, "t", am.withTimeout(m, 5000))
    local c0 = os.clock()
    h.sleep(100)
    local cpu = (os.clock() - c0) * 1000
    assert.is_true(h.SLOW or cpu < 50, ("used %.1f ms of CPU in 100 ms of waiting"):format(cpu))
    m:cancel()
  end))

  it("lets uv.walk() visit every handle while grants, waiters and timers are pending", h.async(function()
    local m, r = h.held(am.Mutex.new())
    h.acquirer(nil, "a", m)
    h.acquirer(nil, "b", am.withTimeout(m, 1000))
    r()                                        -- a granted, not yet resumed
    local n = 0
    uv.walk(function(hd)
      n = n + 1
      assert.is_string(tostring(hd))
      hd:is_active()
    end)
    assert.is_true(n >= 1)
    m:cancel()
    h.tick()
    m:release()
  end))
end)

describe("a separate process", function()
  local prelude = [[
    local uv = require "luv"
    local am = require "async_mutex"
    local m, s = am.Mutex.new(), am.Semaphore.new(0)
    local hold = coroutine.wrap(function() local r = m:acquire(); coroutine.yield(); r() end)
    hold()
    for i = 1, 3 do
      coroutine.wrap(function() m:acquire() end)()
      coroutine.wrap(function() s:acquire(2) end)()
      coroutine.wrap(function() s:waitForUnlock(5) end)()
      coroutine.wrap(function() pcall(am.withTimeout(m, 60000).acquire, am.withTimeout(m, 60000)) end)()
    end
  ]]

  it("walks the loop with uv.walk() while waiters and timers are pending", function()
    local res = h.subprocess(prelude .. [[
      s:setValue(2)                            -- a grant waiting for the idle handle
      local n = 0
      uv.walk(function(hd) n = n + 1; tostring(hd); hd:is_active() end)
      print("walked", n > 0)
    ]])
    h.clean_exit(res, "walked\ttrue\n")
  end)

  it("exits cleanly with waiters queued and the loop never run", function()
    local res = h.subprocess(prelude .. [[ print("bye") ]])
    h.clean_exit(res, "bye\n")
  end)

  it("exits cleanly with grants not yet delivered", function()
    local res = h.subprocess(prelude .. [[ s:setValue(2); hold(); print("bye") ]])
    h.clean_exit(res, "bye\n")
  end)

  it("exits cleanly after uv.stop() with a withTimeout timer pending", function()
    local res = h.subprocess(prelude .. [[
      local t = uv.new_timer()
      t:start(5, 0, function() t:close(); uv.stop() end)
      uv.run()
      print("stopped")
    ]])
    h.clean_exit(res, "stopped\n")
  end)

  it("exits cleanly through os.exit(0, true) with waiters queued", function()
    local res = h.subprocess(prelude .. [[ io.write("bye\n"); os.exit(0, true) ]])
    h.clean_exit(res, "bye\n")
  end)

  it("works when the module (and so luv) is first required inside a coroutine that has ended", function()
    local res = h.subprocess([[
      local am
      coroutine.wrap(function() am = require "async_mutex" end)()
      collectgarbage(); collectgarbage()
      local uv = require "luv"
      local m = am.Mutex.new()
      local n = 0
      local r = coroutine.wrap(function() return m:acquire() end)()
      for _ = 1, 3 do coroutine.wrap(function() local x = m:acquire(); n = n + 1; x() end)() end
      r()
      collectgarbage(); collectgarbage()
      uv.run()
      local hold = coroutine.wrap(function() return m:acquire() end)()
      local wt = am.withTimeout(m, 5)
      coroutine.wrap(function() pcall(wt.acquire, wt); n = n + 10 end)()
      uv.run()
      hold()
      print(n, m:isLocked())
    ]])
    h.clean_exit(res, "13\tfalse\n")
  end)

  it("runs to the end when everything is released, with nothing left on the loop", function()
    local res = h.am_subprocess([[
      local m = am.Mutex.new()
      local wt = am.withTimeout(m, 60000)
      local n = 0
      local r = coroutine.wrap(function() return m:acquire() end)()
      for _ = 1, 5 do coroutine.wrap(function() local x = wt:acquire(); n = n + 1; x() end)() end
      r()
      local t0 = uv.hrtime()
      uv.run()
      local active = 0
      uv.walk(function(hd) if hd:is_active() then active = active + 1 end end)
      print(n, active, (uv.hrtime() - t0) / 1e6 < 1000)
    ]])
    h.clean_exit(res, "5\t0\ttrue\n")
  end)
end)
