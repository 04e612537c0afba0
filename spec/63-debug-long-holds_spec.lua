-- Debug mode: long holds (options.holdWarning; docs/debug.md, Long holds).  A
-- hold that lasts longer than holdWarning ms is reported once, with its part
-- of the report, through onReport or stderr; the check never keeps the loop
-- alive.
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

local THIS = "spec/63%-debug%-long%-holds_spec.lua"

local dr = require "debug_reports"
local line = dr.line

local reports
local function enable(ms) reports = dr.enable({ holdWarning = ms }) end
after_each(function() am.debug.disable() end)

describe("holdWarning", function()
  it("reports a hold whose holder sleeps in a luv timer, once, with the holder's traceback", h.async(function()
    enable(20)
    local m = am.debug.name(am.Mutex.new(), "slow")
    local sleep_at
    uv.update_time()            -- the sleep counts from now (GC stress is slow)
    local co = h.spawn(function()
      local r = m:acquire()
      sleep_at = line(); h.sleep(120)         -- a luv timer of the helpers
      r()
    end)
    h.wait_until(function() return coroutine.status(co) == "dead" end)
    assert.equal(1, #reports)
    local rep = reports[1]
    assert.equal("long-hold", rep.kind)
    assert.matches('long hold %(over 20 ms%): Mutex "slow" held for %d+ ms by', rep.text)
    assert.matches(THIS .. ":" .. sleep_at .. ":", rep.text)
    assert.equal(co, rep.info.holder)
    assert.equal(m, rep.info.lock)
    local held = tonumber(rep.text:match("held for (%d+) ms"))
    assert.is_true(held >= 20)
  end))

  it("does not report holds shorter than holdWarning", h.async(function()
    enable(200)
    local m = am.Mutex.new()
    for _ = 1, 5 do
      local r = m:acquire()
      h.sleep(5)
      r()
    end
    assert.equal(0, #reports)
  end))

  it("reports each long hold once, several holds each", h.async(function()
    enable(10)
    local s = am.Semaphore.new(3)
    local cos = {}
    uv.update_time()            -- the sleeps count from now (GC stress is slow)
    for i = 1, 2 do
      cos[i] = h.spawn(function()
        local _, r = s:acquire()
        h.sleep(60)
        r()
      end)
    end
    h.wait_until(function() return coroutine.status(cos[1]) == "dead" and coroutine.status(cos[2]) == "dead" end)
    local texts = {}
    for i, r in ipairs(reports) do texts[i] = r.kind .. ": " .. r.text end
    assert.equal(2, #reports, table.concat(texts, "\n"))
    assert.is_true(reports[1].info.holder ~= reports[2].info.holder)
  end))

  it("writes to stderr when no onReport is given", function()
    local out = h.subprocess([[
      local am = require "async_mutex"
      local uv = require "luv"
      am.debug.enable({ holdWarning = 10 })
      local m = am.debug.name(am.Mutex.new(), "stuck")
      uv.update_time()            -- the sleep counts from now, not from start-up
      am.spawn(function()
        local r = m:acquire()
        am.sleep(100)
        r()
      end)
      uv.run()
      io.write("done")
    ]])
    assert.equal("done", out.stdout)
    assert.matches('async_mutex.debug: long hold %(over 10 ms%): Mutex "stuck" held for', out.stderr)
  end)

  it("never keeps uv.run() going: a hold kept by main code", function()
    enable(1000)
    local m = am.Mutex.new()
    uv.update_time()                          -- since: the loop time now
    local r = am.tryAcquire(m):acquire()
    local t0 = uv.hrtime()
    uv.run()                                  -- nothing pending: returns
    assert.is_true((uv.hrtime() - t0) / 1e6 < 1000)
    r()
    assert.equal(0, #reports)
  end)

  it("stops checking with the last hold, and when disabled", h.async(function()
    enable(10)
    local before = h.count_handles("uv_timer_t", true)
    local m = am.Mutex.new()
    local r = m:acquire()
    assert.equal(before + 1, h.count_handles("uv_timer_t", true))
    r()
    assert.equal(before, h.count_handles("uv_timer_t", true))
    local r2 = m:acquire()
    am.debug.disable()
    assert.equal(before, h.count_handles("uv_timer_t", true))
    r2()
  end))

  it("enable again without holdWarning stops the check", h.async(function()
    enable(10)
    local m = am.Mutex.new()
    local r = m:acquire()
    am.debug.enable({ onReport = function(kind) reports[#reports + 1] = { kind = kind } end })
    h.sleep(40)
    r()
    assert.equal(0, #reports)
  end))
end)
