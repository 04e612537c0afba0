-- Handles closed by someone else, and uv.run() called inside a coroutine
-- the module resumed: every later wake-up still arrives, and nothing spins
-- (docs/semantics.md, Re-entry; Coroutines and the loop).  Each case runs
-- in a child process, so that a crash or a hang fails the test.
local h = require "helpers"

local function run(body)
  local res = h.subprocess([[
    local am = require "async_mutex"
    local uv = require "luv"
    local function close_all() uv.walk(function(hd) if not hd:is_closing() then hd:close() end end) end
  ]] .. body, 10)
  assert.equal("", res.stderr)
  assert.equal(0, res.rc)
  return res.stdout
end

describe("a module handle closed by someone else", function()
  it("the idle handle, while a wake-up is due: it and every later one arrive", function()
    assert.equal("0 true true\n", run([[
      local m, m2 = am.Mutex.new(), am.Mutex.new()
      local got1, got2 = false, false
      local r1 = coroutine.wrap(function() return m:acquire() end)()
      coroutine.wrap(function() m:acquire()(); got1 = true end)()
      r1()                                   -- a wake-up due: the idle handle is active
      close_all()
      uv.run()                               -- the close completes
      local r2 = coroutine.wrap(function() return m2:acquire() end)()
      coroutine.wrap(function() m2:acquire()(); got2 = true end)()
      r2()                                   -- the next need: a new idle handle
      uv.run()
      io.write(am.pending(), " ", tostring(got1), " ", tostring(got2), "\n")
    ]]))
  end)

  it("the timer, while a deadline is queued: it and every later one time out", function()
    assert.equal("0 timeout timeout\n", run([[
      local m = am.Mutex.new()
      local r = coroutine.wrap(function() return m:acquire() end)()
      local out = {}
      local function timed(i, ms)
        coroutine.wrap(function()
          local d = am.withTimeout(m, ms)
          local ok, err = pcall(d.acquire, d)
          out[i] = ok and "granted" or (err == am.E_TIMEOUT and "timeout" or tostring(err))
        end)()
      end
      timed(1, 5)                            -- the timer is active
      close_all()
      timed(2, 10)                           -- a later deadline: a new timer
      uv.run()
      r()
      io.write(am.pending(), " ", tostring(out[1]), " ", tostring(out[2]), "\n")
    ]]))
  end)

  it("by a waiter the module resumed, with more wake-ups due in the same round", function()
    assert.equal("0 3\n", run([[
      local m = am.Mutex.new()
      local n = 0
      local r = coroutine.wrap(function() return m:acquire() end)()
      coroutine.wrap(function() m:acquire()(); n = n + 1; close_all() end)()
      coroutine.wrap(function() m:acquire()(); n = n + 1 end)()
      coroutine.wrap(function() m:acquire()(); n = n + 1 end)()
      r()
      uv.run()
      io.write(am.pending(), " ", n, "\n")
    ]]))
  end)
end)

describe("uv.run() called inside a coroutine the module resumed", function()
  it("returns when its own work is done; wake-ups due meanwhile arrive after", function()
    assert.equal("slept true 0 2\n", run([[
      local m = am.Mutex.new()
      local order = {}
      local r = coroutine.wrap(function() return m:acquire() end)()
      local function sleep(ms)              -- a "synchronous sleep" helper
        local t = uv.new_timer()
        t:start(ms, 0, function() t:close() end)
        uv.run()
      end
      coroutine.wrap(function()
        local rel = m:acquire()
        order[#order + 1] = 1
        local s = am.Semaphore.new(0)
        coroutine.wrap(function() s:acquire(); order[#order + 1] = 2 end)()
        s:release()                          -- a wake-up due during the sleep
        sleep(5)
        io.write("slept ")
        rel()
      end)()
      r()
      uv.run()
      io.write(tostring(order[1] == 1), " ", am.pending(), " ", #order, "\n")
    ]]))
  end)
end)
