-- Giving up after a while: withTimeout.
--
-- A slow task holds the mutex for 150 ms.  A caller that waits at most 50 ms
-- gets am.E_TIMEOUT (and leaves the queue at once); a caller that waits up to
-- 500 ms gets the lock as soon as the slow task releases it.
--
--   make && lua5.4 examples/timeout.lua

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
  mutex:runExclusive(function()
    print("slow task: holding the lock for 150 ms")
    sleep(150)
  end)
  print("slow task: released the lock")
end)()

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

coroutine.wrap(try_with)(50)
coroutine.wrap(try_with)(500)
uv.run()
