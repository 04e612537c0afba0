-- Priorities: higher first, first come first served among equals.
--
-- While a holder keeps the mutex busy, five requests queue up with different
-- priorities (any number; the default is 0).  They are served by priority,
-- and in arrival order within the same priority.
--
--   make && lua5.4 examples/priorities.lua

-- Find the module in this checkout (src/, build/); harmless once installed.
package.path = "src/?.lua;src/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"

--- Suspends the running coroutine for `ms` milliseconds of loop time.
local function sleep(ms)
  local co = coroutine.running()
  local timer = uv.new_timer()
  timer:start(ms, 0, function()
    timer:close()
    assert(coroutine.resume(co))
  end)
  coroutine.yield()
end

local mutex = am.Mutex.new()

coroutine.wrap(function()
  local release = mutex:acquire()
  print("holder: busy for 50 ms while the others queue up")
  sleep(50)
  release()
end)()

local requests = {                      -- in arrival order
  { "nightly backup", 0 },
  { "report", 5 },
  { "user click A", 10 },
  { "user click B", 10 },
  { "cache cleanup", -1 },
}
for _, request in ipairs(requests) do
  local name, priority = request[1], request[2]
  print(("queued: %s (priority %d)"):format(name, priority))
  coroutine.wrap(function()
    mutex:runExclusive(function()
      print(("served: %s (priority %d)"):format(name, priority))
      sleep(10)
    end, priority)
  end)()
end
uv.run()
