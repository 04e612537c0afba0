-- The <close> guard: releases the lock however the scope is left.
--
-- The releaser returned by acquire() is a to-be-closed value, so
-- `local release <close> = mutex:acquire()` releases the mutex when the block
-- ends normally, when an error leaves it (also one nobody catches in a task:
-- its join raises it afterwards), and when a coroutine suspended inside it
-- is closed (task:cancel() closes it).  (Calling release() yourself is fine
-- too: the releaser is idempotent.)
--
--   make && lua5.4 examples/close_guard.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local mutex = am.Mutex.new()

local function update(fail)
  local release <close> = mutex:acquire()
  print("  got the lock")
  am.sleep(20)
  if fail then error("disk full", 0) end
  print("  update written")
end                                     -- release() runs here, in all cases

am.run(function()
  print("1. normal exit:")
  update(false)
  print(("  after the block, locked: %s"):format(mutex:isLocked()))

  print("2. error:")
  local ok, err = pcall(update, true)
  print(("  caught %q (ok = %s), locked: %s"):format(err, ok, mutex:isLocked()))

  print("3. task canceled while holding the lock:")
  local stuck = am.spawn(function()
    local release <close> = mutex:acquire()
    coroutine.yield()                   -- waits for an event that never comes
  end)
  print(("  suspended with the lock, locked: %s"):format(mutex:isLocked()))
  stuck:cancel()                        -- closes its coroutine
  print(("  after stuck:cancel(), locked: %s (%s)"):format(mutex:isLocked(), stuck:status()))

  print("4. error nobody catches, in a task:")
  local failing = am.spawn(update, true)
  local joined, failure = pcall(failing.join, failing)
  print(("  join raised %q (ok = %s), locked: %s"):format(failure, joined, mutex:isLocked()))
end)
