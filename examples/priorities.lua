-- Priorities: higher first, first come first served among equals.
--
-- While a holder keeps the mutex busy, five requests queue up with different
-- priorities (any number; the default is 0).  They are served by priority,
-- and in arrival order within the same priority.
--
--   make && lua5.4 examples/priorities.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local mutex = am.Mutex.new()

am.run(function()                       -- runs the loop until all is done
  am.spawn(function()
    local release <close> = mutex:acquire() -- released when this function ends
    print("holder: busy for 50 ms while the others queue up")
    am.sleep(50)
  end)

  local requests = {                    -- in arrival order
    { "nightly backup", 0 },
    { "report", 5 },
    { "user click A", 10 },
    { "user click B", 10 },
    { "cache cleanup", -1 },
  }
  for _, request in ipairs(requests) do
    local name, priority = request[1], request[2]
    print(("queued: %s (priority %d)"):format(name, priority))
    am.spawn(function()
      mutex:runExclusive(function()
        print(("served: %s (priority %d)"):format(name, priority))
        am.sleep(10)
      end, priority)
    end)
  end
end)
