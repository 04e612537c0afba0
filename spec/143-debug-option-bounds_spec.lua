-- am.debug.enable's holdWarning at its bounds (docs/debug.md, Long holds).
-- The long-hold check is a luv timer every holdWarning / 4 ms, which luv
-- takes in whole ms below 2^63: holdWarning = 1e20 was accepted, then every
-- grant printed "async_mutex.debug: error in a hook" (luv refused the
-- timer).  Above 2^40 ms (about 34 years, the Redis locks' bound too) it
-- is refused at enable, at the caller's line; up to it, it works.
local h = require "helpers"
local am = require "async_mutex"

local THIS = "spec/143%-debug%-option%-bounds_spec.lua"

describe("am.debug.enable({ holdWarning = ms })", function()
  after_each(function() am.debug.disable() end)

  it("refuses above 2^40 at the caller's line, leaving debug mode as it was", function()
    for _, ms in ipairs({ 2 ^ 40 + 2 ^ 20, 1e20, 2 ^ 63, math.huge }) do
      local ok, err = pcall(function() am.debug.enable({ holdWarning = ms }) end); local at = debug.getinfo(1, "l").currentline
      assert.is_false(ok)
      assert.matches("^" .. THIS .. ":" .. at .. ": ", err)
      assert.equal("bad argument #1 to 'enable' (holdWarning must be at most 2^40)", h.strip_pos(err))
      assert.is_false(am.debug.isEnabled())
    end
  end)

  it("still refuses what is not a positive number", function()
    for _, ms in ipairs({ 0, -1, 0 / 0, "10" }) do
      assert.equal("bad argument #1 to 'enable' (holdWarning must be a positive number of ms)",
        h.error_of(function() am.debug.enable({ holdWarning = ms }) end))
    end
  end)

  it("takes 2^40 and a fraction of a ms: grants and releases print nothing, a long hold is reported", function()
    local res = h.am_subprocess([[
local reports = 0
for _, ms in ipairs({ 2 ^ 40, 0.5 }) do
  am.debug.enable({ holdWarning = ms, onReport = function() reports = reports + 1 end })
  local m = am.Mutex.new()
  am.spawn(function()
    for _ = 1, 3 do local r = m:acquire(); r() end
    local r = m:acquire()
    am.sleep(20)                -- a long hold for 0.5 ms, not for 2^40
    r()
  end)
  uv.run()
  am.debug.disable()
end
io.write(reports, "\n")
    ]])
    h.clean_exit(res, "1\n")
  end)
end)
