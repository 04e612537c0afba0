-- busted output handler: the usual terminal output, then one closing line
-- "N passed, N failed" (errors count as failures) that CI reads.  With
-- AM_TEST_TRACE=FILE, the full name of the test under way is written to
-- FILE as each starts: spec/each.lua names the test a hung file was in.
local TRACE = os.getenv("AM_TEST_TRACE")

return function(options)
  local busted = require "busted"
  local terminal = require("busted.outputHandlers.utfTerminal")(options)
  local passed, failed = 0, 0
  local subscribe = terminal.subscribe
  -- Subscribe after the terminal handler, so our line is the last one.
  terminal.subscribe = function(self, handler_options)
    subscribe(self, handler_options)
    if TRACE and TRACE ~= "" then
      busted.subscribe({ "test", "start" }, function(element)
        local f = io.open(TRACE, "w")
        if f then
          f:write(terminal.getFullName(element))
          f:close()
        end
        return nil, true
      end)
    end
    busted.subscribe({ "test", "end" }, function(_, _, status)
      if status == "success" then passed = passed + 1
      elseif status == "failure" or status == "error" then failed = failed + 1 end
      return nil, true
    end)
    busted.subscribe({ "error" }, function(element)
      -- errors outside a test body (describe blocks, file loading)
      if element.descriptor ~= "it" then failed = failed + 1 end
      return nil, true
    end)
    busted.subscribe({ "suite", "end" }, function()
      io.write(("%d passed, %d failed\n"):format(passed, failed))
      io.flush()
      return nil, true
    end)
  end
  return terminal
end
