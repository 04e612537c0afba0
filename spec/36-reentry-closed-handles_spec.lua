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
  return h.clean_exit(res)
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

describe("priorities", function()
  local am = require "async_mutex"
  -- Which of two acquirers queued with priorities p1 then p2 is served first.
  local function first_of(p1, p2)
    local m = am.Mutex.new()
    local out = {}
    local release = m:acquire()
    coroutine.wrap(function() m:acquire(p1)(); out[#out + 1] = "first" end)()
    coroutine.wrap(function() m:acquire(p2)(); out[#out + 1] = "second" end)()
    release()
    h.tick()
    assert.equal(2, #out)
    return out[1]
  end

  it("compare exactly as Lua compares numbers, beyond 2^53 too", h.async(function()
    local mi, ma = math.mininteger, math.maxinteger
    assert.equal("second", first_of(ma - 1, ma))
    assert.equal("first", first_of(ma, ma - 1))
    assert.equal("second", first_of(1 << 53, (1 << 53) + 1))
    assert.equal("second", first_of(mi, mi + 1))
    assert.equal("first", first_of(2.0 ^ 63, ma))          -- the float is greater
    assert.equal("second", first_of(ma, 2.0 ^ 63))
    assert.equal("first", first_of(1, 1.0))                 -- equal: arrival order
    assert.equal("first", first_of(-(2.0 ^ 63), mi))
    assert.equal("first", first_of(1.5, 1))
    assert.equal("second", first_of(-math.huge, mi))
  end))

  it("decide immediate grants exactly too", h.async(function()
    local s = am.Semaphore.new(1)
    local ma = math.maxinteger
    coroutine.wrap(function() pcall(s.acquire, s, 2, ma - 1) end)()  -- queued: value 1
    assert.is_true(h.try_now(function() return s:acquire(1, ma) end))   -- above the head
    s:release()
    assert.is_false(h.try_now(function() return s:acquire(1, ma - 1) end))  -- level with it
    s:cancel()
    h.tick()
  end))
end)

describe("counts at math.maxinteger", function()
  it("grants beyond maxinteger in all (setValue between them) overflow nothing", function()
    -- a child process: under `make asan` an overflow aborts it
    assert.equal("true\ttrue\t0\n9223372036854775807\nfalse\tsemaphore value overflow\n", run([[
      coroutine.wrap(function()
        local ma = math.maxinteger
        local s = am.Semaphore.new(ma)
        local v1, r1 = s:acquire(ma)
        s:setValue(ma)
        local v2, r2 = s:acquire(ma)
        print(v1 == ma, v2 == ma, s:getValue())
        r1()
        print(s:getValue())
        print(pcall(r2))
      end)()
    ]]))
  end)
end)

describe("a keyed release that fails", function()
  it("leaves no key in the set", function()
    local am = require "async_mutex"
    local ks = am.KeyedSemaphore.new(math.maxinteger)
    for i = 1, 5 do
      local ok, err = pcall(ks.release, ks, "k" .. i)
      assert.is_false(ok)
      assert.equal("semaphore value overflow", h.strip_pos(err))
    end
    assert.equal(0, ks:count())
    assert.same({}, ks:keys())
  end)
end)

describe("usage errors through decorators and wrappers", function()
  local am = require "async_mutex"
  -- The message and the line it points at (this file's, the caller's).
  local function err_of(fn)
    local ok, err = pcall(fn)
    assert.is_false(ok)
    local file, line, msg = err:match("^(.-):(%d+): (.*)$")
    assert.is_not_nil(file, err)
    assert.truthy(file:find("36%-reentry"), "error not at the caller's line: " .. err)
    return msg, tonumber(line)
  end

  it("name the method, the argument and the caller's line", h.async(function()
    local s, m = am.Semaphore.new(1), am.Mutex.new()
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(2)
    local f = function() end
    local cases = {
      { function() am.withTimeout(s, 5):setValue(1.5) end,
        "bad argument #1 to 'setValue' (number has no integer representation)" },
      { function() am.tryAcquire(s):setValue() end,
        "bad argument #1 to 'setValue' (number expected, got no value)" },
      { function() am.withTimeout(s, 5):release(0) end,
        "bad argument #1 to 'release' (weight must be a positive integer)" },
      { function() am.withTimeout(km, 5):isLocked() end,
        "bad argument #1 to 'isLocked' (key must not be nil)" },
      { function() am.withTimeout(s, 5).getValue(m) end,
        "bad argument #1 to 'getValue' (async_mutex.Semaphore expected, got async_mutex.Mutex)" },
      { function() m:runExclusive(f, "x") end,
        "bad argument #2 to 'runExclusive' (priority must be a number, got string)" },
      { function() s:runExclusive(f, 1.5) end,
        "bad argument #2 to 'runExclusive' (weight must be a positive integer)" },
      { function() s:runExclusive(f, 1, 0 / 0) end,
        "bad argument #3 to 'runExclusive' (priority must not be NaN)" },
      { function() km:runExclusive("k", f, "x") end,
        "bad argument #3 to 'runExclusive' (priority must be a number, got string)" },
      { function() ks:runExclusive("k", f, "2") end,
        "bad argument #3 to 'runExclusive' (weight must be a positive integer)" },
      { function() km:runExclusiveAll({ 1 }, f, "x") end,
        "bad argument #3 to 'runExclusiveAll' (priority must be a number, got string)" },
      { function() km:runExclusiveAll({}, f) end,
        "bad argument #1 to 'runExclusiveAll' (key set must not be empty)" },
      { function() ks:runExclusiveAll({ 1 }, f, 0) end,
        "bad argument #3 to 'runExclusiveAll' (weight must be a positive integer)" },
      { function() km:acquireAll({ 1 }, "x") end,
        "bad argument #2 to 'acquireAll' (priority must be a number, got string)" },
      { function() ks:acquireAll({ 1 }, 1, "x") end,
        "bad argument #3 to 'acquireAll' (priority must be a number, got string)" },
      { function() am.withTimeout(ks, 5):acquireAll({ 1 }, 1.5) end,
        "bad argument #2 to 'acquireAll' (weight must be a positive integer)" },
    }
    for _, case in ipairs(cases) do
      local line = debug.getinfo(case[1], "S").linedefined
      local msg, at = err_of(case[1])
      assert.equal(case[2], msg)
      assert.equal(line, at)
    end
    assert.equal(1, s:getValue())
    assert.is_false(m:isLocked())
    assert.equal(0, km:count())
    assert.equal(0, ks:count())
  end))

  it("refuse numeric strings wherever a number is expected", h.async(function()
    local s = am.Semaphore.new(1)
    assert.equal("bad argument #1 to 'setValue' (number expected, got string)",
      (err_of(function() s:setValue("3") end)))
    assert.equal("bad argument #1 to 'new' (number expected, got string)",
      (err_of(function() am.Semaphore.new("5") end)))
    assert.equal("bad argument #1 to 'new' (number expected, got string)",
      (err_of(function() am.KeyedSemaphore.new("5") end)))
    assert.equal("bad argument #1 to 'acquire' (weight must be a positive integer)",
      (err_of(function() s:acquire("2") end)))
    assert.equal("bad argument #1 to 'release' (weight must be a positive integer)",
      (err_of(function() s:release("2") end)))
    assert.equal(1, s:getValue())
  end))
end)
