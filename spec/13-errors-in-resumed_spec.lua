-- A coroutine resumed by the module that dies with an error: reported (to the
-- handler set with setErrorHandler, else stderr with a traceback), never
-- fatal, never stopping the rest of the batch (docs/semantics.md,
-- Coroutines and the loop).
local h = require "helpers"
local am = require "async_mutex"

local with_handler = h.with_handler

describe("async_mutex.setErrorHandler", function()
  it("returns the previous handler", function()
    local f1, f2 = function() end, function() end
    local p0 = am.setErrorHandler(f1)
    assert.equal(f1, am.setErrorHandler(f2))
    assert.equal(f2, am.setErrorHandler(p0))
  end)

  it("receives the exact error value and a traceback of the dead coroutine", h.async(function()
    local reports = {}
    with_handler(function(err, tb) reports[#reports + 1] = { err = err, tb = tb } end, function()
      local m = am.Mutex.new()
      local r = m:acquire()
      local e = { "boom" }
      coroutine.wrap(function()
        m:acquire()
        error(e)
      end)()
      r()
      h.tick()
      assert.equal(1, #reports)
      assert.is_true(rawequal(e, reports[1].err))
      assert.is_string(reports[1].tb)
      assert.is_truthy(reports[1].tb:find("stack traceback", 1, true))
      assert.is_truthy(reports[1].tb:find("13-errors-in-resumed_spec.lua", 1, true))
      m:release()
    end)
  end))

  it("receives string errors as raised, position included", h.async(function()
    h.with_errors(function(reports)
      local s = am.Semaphore.new(0)
      coroutine.wrap(function()
        s:waitForUnlock()
        error("waiter failed")
      end)()
      s:setValue(1)
      h.tick()
      assert.equal(1, #reports)
      assert.is_truthy(reports[1]:match("^[^:]+:%d+: waiter failed$"), reports[1])
    end)
  end))

  it("does not stop the other coroutines of the same batch", h.async(function()
    local reports, log = {}, {}
    with_handler(function(err) reports[#reports + 1] = err end, function()
      local s = am.Semaphore.new(0)
      coroutine.wrap(function() s:acquire(); log[#log + 1] = "a"; error("a failed", 0) end)()
      coroutine.wrap(function() local _, r = s:acquire(); log[#log + 1] = "b"; r() end)()
      coroutine.wrap(function() s:acquire(); log[#log + 1] = "c"; error("c failed", 0) end)()
      coroutine.wrap(function() local _, r = s:acquire(); log[#log + 1] = "d"; r() end)()
      s:setValue(4)                            -- one batch of four
      h.tick()
      assert.same({ "a", "b", "c", "d" }, log)
      assert.same({ "a failed", "c failed" }, reports)
    end)
  end))

  it("reports an unhandled cancel or timeout error raised in the resumed coroutine", h.async(function()
    h.with_errors(function(reports)
      local m, r = h.held(am.Mutex.new())
      coroutine.wrap(function() m:acquire() end)()
      m:cancel()
      h.tick()
      local wt = am.withTimeout(m, 2)
      coroutine.wrap(function() wt:acquire() end)()
      h.wait_until(function() return #reports == 2 end, 1000)
      assert.same({ am.E_CANCELED, am.E_TIMEOUT }, reports)
      r()
    end)
  end))

  it("is not called for coroutines that finish normally or catch their errors", h.async(function()
    h.with_errors(function(reports)
      local m, r = h.held(am.Mutex.new())
      coroutine.wrap(function() local x = m:acquire(); x() end)()
      coroutine.wrap(function()
        local x = m:acquire()
        pcall(error, "caught")
        x()
      end)()
      r()
      h.tick(3)
      assert.same({}, reports)
      assert.is_false(m:isLocked())
    end)
  end))
end)

describe("the default error report", function()
  local script = [[
    local uv = require "luv"
    local am = require "async_mutex"
    %s
    local s = am.Semaphore.new(0)
    coroutine.wrap(function() s:acquire(); error("boom-XYZ") end)()
    coroutine.wrap(function() s:acquire(); print("second ran") end)()
    s:setValue(2)
    uv.run()
    print("after run")
  ]]

  it("goes to stderr with a traceback, and the process carries on and exits 0", function()
    local res = h.subprocess(script:format(""))
    assert.equal(0, res.rc)
    assert.equal("second ran\nafter run\n", res.stdout)
    assert.is_truthy(res.stderr:find("boom-XYZ", 1, true), res.stderr)
    assert.is_truthy(res.stderr:find("stack traceback", 1, true), res.stderr)
    assert.is_falsy(res.stderr:find("Uncaught Error", 1, true), res.stderr)
  end)

  it("is restored by setErrorHandler(nil)", function()
    local res = h.subprocess(script:format([[
      am.setErrorHandler(function() print("custom handler") end)
      am.setErrorHandler(nil)
    ]]))
    assert.equal(0, res.rc)
    assert.equal("second ran\nafter run\n", res.stdout)
    assert.is_truthy(res.stderr:find("boom-XYZ", 1, true), res.stderr)
  end)

  it("is replaced by a custom handler", function()
    local res = h.subprocess(script:format([[
      am.setErrorHandler(function(err) print("handled: " .. tostring(err):match("boom%-XYZ")) end)
    ]]))
    assert.equal(0, res.rc)
    assert.equal("handled: boom-XYZ\nsecond ran\nafter run\n", res.stdout)
    assert.equal("", res.stderr)
  end)
end)
