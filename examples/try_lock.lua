-- Skip work that is already under way: tryAcquire.
--
-- Three callers want to refresh a cache at the same moment.  tryAcquire
-- decides at once, without waiting: the first caller gets the lock, the others
-- get am.E_ALREADY_LOCKED and skip.  Later, with the lock free, a refresh runs.
--
--   make && lua5.4 examples/try_lock.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local mutex = am.Mutex.new()
local try_mutex = am.tryAcquire(mutex)  -- same lock, never waits

local function refresh(who)
  local ok, err = pcall(function()
    local release <close> = try_mutex:acquire()   -- raises if taken
    print(who .. ": refreshing the cache")
    am.sleep(50)
    print(who .. ": cache refreshed")
  end)
  if not ok then
    if err ~= am.E_ALREADY_LOCKED then error(err, 0) end
    print(who .. ": skipped, a refresh is already running (" .. err .. ")")
  end
end

am.run(function()                       -- runs the loop until all is done
  am.spawn(refresh, "A")
  am.spawn(refresh, "B")
  am.spawn(refresh, "C")
  am.spawn(function()
    am.sleep(100)                       -- well after A has finished
    refresh("D")
  end)
end)
