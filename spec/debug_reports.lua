-- Debug mode's reports, recorded for the specs 60-64 (docs/debug.md):
--
--   local dr = require "debug_reports"
--   local reports = dr.enable({ holdWarning = 10 })   -- am.debug.enable, onReport recording
--   dr.of_kind(reports, "deadlock")                    -- those of one kind, in order
--   dr.line()                                          -- the caller's current line
--
--   local rec = dr.recorder(before_each, after_each)
--                                       -- the current test's reports: debug
--                                       -- mode on before each test, off after
--   rec.count("deadlock"), rec.first("deadlock"), rec.of_kind("inversion")

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

--- fn(reports) run with debug mode on (M.enable(options): `reports` are
-- its reports so far), then debug mode off, whether fn raised or not; fn's
-- error, if any, raised again.
function M.in_debug_mode(options, fn)
  local reports = M.enable(options)
  local ok, err = pcall(fn, reports)
  am.debug.disable()
  if not ok then error(err, 0) end
end

--- The reports of 'kind', in the order they came.
function M.of_kind(reports, kind)
  local out = {}
  for _, r in ipairs(reports) do if r.kind == kind then out[#out + 1] = r end end
  return out
end

--- The reports of a spec file whose tests run in debug mode: given busted's
-- before_each and after_each (the spec file's own), it registers
-- rec.enable and rec.disable with them.  rec.enable([options]): debug mode
-- on, reports recorded afresh; rec.disable(): off; rec.of_kind(kind),
-- rec.count(kind), rec.first(kind): the reports since the last enable;
-- rec.deadlocks(), rec.first_deadlock(), rec.inversions(): the same for
-- the deadlock and lock-order reports.
function M.recorder(before_each, after_each)
  local reports = {}
  local rec = {}
  function rec.enable(options) reports = M.enable(options) end
  function rec.disable() am.debug.disable() end
  if before_each then before_each(rec.enable) end
  if after_each then after_each(rec.disable) end
  function rec.of_kind(kind) return M.of_kind(reports, kind) end
  function rec.count(kind) return #M.of_kind(reports, kind) end
  function rec.first(kind) return M.of_kind(reports, kind)[1] end
  -- the deadlock search's reports and lockdep's, as the specs count them
  function rec.deadlocks() return rec.count("deadlock") end
  function rec.first_deadlock() return rec.first("deadlock") end
  function rec.inversions() return rec.count("inversion") end
  return rec
end

--- The line of the caller of this function.
function M.line() return debug.getinfo(2, "l").currentline end

return M
