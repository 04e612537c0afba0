-- Giving up after a while: withTimeout.
--
-- A slow task holds the mutex for 150 ms.  A caller that waits at most 50 ms
-- gets am.E_TIMEOUT (and leaves the queue at once); a caller that waits up to
-- 500 ms gets the lock as soon as the slow task releases it.
--
--   make && lua5.4 examples/timeout.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local mutex = am.Mutex.new()

am.run(function()                       -- runs the loop until all is done
  am.spawn(function()
    mutex:runExclusive(function()
      print("slow task: holding the lock for 150 ms")
      am.sleep(150)
    end)
    print("slow task: released the lock")
  end)

  local function try_with(ms)
    local impatient = am.withTimeout(mutex, ms)  -- same lock, bounded waits
    local ok, err = pcall(impatient.runExclusive, impatient, function()
      print(("waiting up to %d ms: got the lock"):format(ms))
    end)
    if not ok then
      if err ~= am.E_TIMEOUT then error(err, 0) end
      print(("waiting up to %d ms: gave up (%s)"):format(ms, err))
    end
  end

  am.spawn(try_with, 50)
  am.spawn(try_with, 500)
end)
