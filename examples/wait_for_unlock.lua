-- Waiting for a lock to become free without taking it: waitForUnlock.
--
-- A migration holds the mutex while it rewrites the schema.  Readers only need
-- the migration to be over: waitForUnlock() returns once the mutex could be
-- acquired, without acquiring it, so the readers then run side by side.
--
--   make && lua5.4 examples/wait_for_unlock.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local mutex = am.Mutex.new()
local schema = 1

am.run(function()                       -- runs the loop until all is done
  am.spawn(function()
    mutex:runExclusive(function()
      print("migration: upgrading the schema (holding the lock)")
      am.sleep(60)
      schema = 2
      print("migration: done")
    end)
  end)

  for i = 1, 3 do
    am.spawn(function()
      print(("reader %d: waiting for the migration"):format(i))
      mutex:waitForUnlock()
      print(("reader %d: reads schema v%d (mutex locked: %s)")
        :format(i, schema, mutex:isLocked()))
    end)
  end
end)
