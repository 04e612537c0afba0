-- Cancelling pending requests: cancel() and am.E_CANCELED.
--
-- A long task holds the mutex; three others wait for it.  At shutdown,
-- cancel() rejects every waiting request with am.E_CANCELED (or the error given
-- to Mutex.new).  It does not take the lock away from its holder, which
-- finishes normally.
--
--   make && lua5.4 examples/cancel.lua

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
      print("holder: working for 100 ms")
      am.sleep(100)
      print("holder: done, nobody is waiting any more")
    end)
  end)

  for i = 1, 3 do
    am.spawn(function()
      local ok, err = pcall(mutex.runExclusive, mutex, function()
        print(("waiter %d: got the lock (not expected)"):format(i))
      end)
      if ok then return end
      if err ~= am.E_CANCELED then error(err, 0) end
      print(("waiter %d: %s"):format(i, err))
    end)
  end

  am.spawn(function()                   -- (cancel() itself never waits: it
    am.sleep(30)                        -- works from any code, coroutine or not)
    print("shutdown: canceling pending requests")
    mutex:cancel()
    print(("shutdown: still locked by the holder: %s"):format(mutex:isLocked()))
  end)
end)
