-- Cancelling pending requests: cancel() and am.E_CANCELED.
--
-- A long task holds the mutex; three others wait for it.  At shutdown,
-- cancel() rejects every waiting request with am.E_CANCELED (or the error given
-- to Mutex.new).  It does not take the lock away from its holder, which
-- finishes normally.
--
--   make && lua5.4 examples/cancel.lua

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
    print("holder: working for 100 ms")
    sleep(100)
    print("holder: done, nobody is waiting any more")
  end)
end)()

for i = 1, 3 do
  coroutine.wrap(function()
    local ok, err = pcall(mutex.runExclusive, mutex, function()
      print(("waiter %d: got the lock (not expected)"):format(i))
    end)
    if ok then return end
    if err ~= am.E_CANCELED then error(err, 0) end
    print(("waiter %d: %s"):format(i, err))
  end)()
end

local shutdown = uv.new_timer()         -- cancel from a plain loop callback
shutdown:start(30, 0, function()
  shutdown:close()
  print("shutdown: canceling pending requests")
  mutex:cancel()
  print(("shutdown: still locked by the holder: %s"):format(mutex:isLocked()))
end)
uv.run()
