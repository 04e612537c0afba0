-- Debug mode's reports of a user's value whose __tostring fails (raises,
-- yields, returns no string): a key of a keyed lock, an error raised by
-- onReport (docs/debug.md, Reports).  The text is the shared error text's
-- (src/error_text.c, core.error_text), made protected: the long-hold check
-- runs in a luv timer callback, where an error escaping ended the process
-- ("Uncaught Error", exit -1); a deadlock report is made inside the
-- request, which raised the __tostring's error in place of E_DEADLOCK.
local h = require "helpers"
local am = require "async_mutex"
local dr = require "debug_reports"

-- Keys whose __tostring fails in each way; a report names them by the
-- shared text, "(error object is a table value)".
local HOSTILE = [[
local function hostile(how)
  return setmetatable({}, { __tostring = function()
    if how == "raises" then error("tostring failed") end
    if how == "yields" then coroutine.yield() end
    if how == "number" then return 42 end
  end })
end
]]
local HOW = { "raises", "yields", "number" }
local SHOWN = "key %(error object is a table value%)"

describe("a key whose __tostring fails", function()
  for _, how in ipairs(HOW) do
    it(("in a long-hold report from the luv timer (its __tostring %s): reported, the process goes on"):format(how), function()
      local res = h.subprocess(HOSTILE .. ([[
local uv = require "luv"
local am = require "async_mutex"
local texts = {}
am.debug.enable({ holdWarning = 20, onReport = function(kind, text) texts[#texts + 1] = kind .. ": " .. text end })
local k = am.KeyedMutex.new()
am.spawn(function()
  local r = k:acquire(hostile(%q))
  am.sleep(80)                  -- held past holdWarning: the timer reports it
  r()
end)
uv.run()
io.write(#texts, "\n", texts[1] or "", "\n")
      ]]):format(how))
      assert.equal(0, res.rc, res.stderr)
      assert.equal("", res.stderr)
      assert.matches("^1\nlong%-hold: async_mutex.debug: long hold %(over 20 ms%): KeyedMutex created at .- "
        .. SHOWN .. " held for %d+ ms", res.stdout)
    end)
  end

  for _, how in ipairs(HOW) do
    it(("in a deadlock report (its __tostring %s): the request raises E_DEADLOCK, the report names the key"):format(how), h.async(function()
      local hostile = load(HOSTILE .. " return hostile(...)")
      local reports = dr.enable()
      local k = am.KeyedMutex.new()
      local key = hostile(how)
      local r = k:acquire(key)
      local ok, err = pcall(k.acquire, k, key)
      am.debug.disable()
      assert.is_false(ok)
      assert.equal(am.E_DEADLOCK, err)
      assert.equal(1, #reports)
      assert.matches("requested KeyedMutex created at .- " .. SHOWN .. " and would wait for ever", reports[1].text)
      r()
      assert.equal(0, k:count())
    end))
  end

  it("in lockdep's report of two keys taken nested: the acquire is granted, the report names the key", h.async(function()
    local hostile = load(HOSTILE .. " return hostile(...)")
    local reports = dr.enable()
    local k = am.KeyedMutex.new()
    local r1 = k:acquire(hostile("raises"))
    local ok, r2 = pcall(k.acquire, k, "plain")
    am.debug.disable()
    assert.is_true(ok, r2)
    r2(); r1()
    local inv = dr.of_kind(reports, "inversion")
    assert.equal(1, #inv)
    assert.matches("two keys of one keyed lock", inv[1].text)
    assert.matches(SHOWN, inv[1].text)
  end))

  it("in holds() and report(): both return, naming the key", h.async(function()
    local hostile = load(HOSTILE .. " return hostile(...)")
    dr.enable()
    local k = am.KeyedMutex.new()
    local r = k:acquire(hostile("raises"))
    local ok, holds = pcall(am.debug.holds, k)
    local ok2, text = pcall(am.debug.report)
    am.debug.disable()
    r()
    assert.is_true(ok, holds)
    assert.is_true(ok2, text)
    assert.equal(1, #holds)
    assert.matches(SHOWN .. "$", holds[1].name)
    assert.matches(SHOWN .. " held for", text)
  end))
end)

describe("an onReport that raises an error object whose __tostring raises", function()
  it("from the long-hold timer: written to stderr by the shared text, the process goes on", function()
    local res = h.am_subprocess([[
local bad = setmetatable({}, { __tostring = function() error("tostring failed") end })
am.debug.enable({ holdWarning = 20, onReport = function() error(bad) end })
local m = am.Mutex.new()
am.spawn(function()
  local r = m:acquire()
  am.sleep(80)
  r()
end)
uv.run()
io.write("done\n")
    ]])
    assert.equal(0, res.rc, res.stderr)
    assert.equal("done\n", res.stdout)
    assert.equal("async_mutex.debug: error in onReport: (error object is a table value)\n", res.stderr)
  end)
end)
