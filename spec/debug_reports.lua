-- Debug mode's reports, recorded for the specs 60-64 (docs/debug.md):
--
--   local dr = require "debug_reports"
--   local reports = dr.enable({ holdWarning = 10 })   -- am.debug.enable, onReport recording
--   dr.of_kind(reports, "deadlock")                    -- those of one kind, in order
--   dr.line()                                          -- the caller's current line

local am = require "async_mutex"

local M = {}

--- am.debug.enable(options) with an onReport that appends {kind, text, info}
-- to the list it returns.
function M.enable(options)
  local reports = {}
  options = options or {}
  options.onReport = function(kind, text, info)
    reports[#reports + 1] = { kind = kind, text = text, info = info }
  end
  am.debug.enable(options)
  return reports
end

--- The reports of 'kind', in the order they came.
function M.of_kind(reports, kind)
  local out = {}
  for _, r in ipairs(reports) do if r.kind == kind then out[#out + 1] = r end end
  return out
end

--- The line of the caller of this function.
function M.line() return debug.getinfo(2, "l").currentline end

return M
