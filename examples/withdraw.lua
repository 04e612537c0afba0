-- The bank race from the async-mutex article, on Lua coroutines and luv.
--
-- withdraw() reads the balance, waits for (simulated) I/O, then writes the
-- balance back.  Started together, two withdrawals both read 100 before either
-- writes, so both succeed and 110 leaves an account that held 100.  Holding a
-- Mutex from the read to the write makes the second withdrawal wait for the
-- first one, see 70, and refuse.
--
--   make && lua5.4 examples/withdraw.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local IO_MS = 50                        -- a simulated database round trip

local balance

local function withdraw(amount)
  local current = balance               -- read
  am.sleep(IO_MS)                       -- other coroutines run here
  if current >= amount then
    balance = current - amount          -- write
    print(("  withdraw %d: accepted, balance %d"):format(amount, balance))
  else
    print(("  withdraw %d: refused, insufficient funds (balance %d)")
      :format(amount, current))
  end
end

print("Without a lock:")
balance = 100
am.run(function()                       -- returns when both are done
  am.spawn(withdraw, 30)                -- two customers, at the same time
  am.spawn(withdraw, 80)
end)
print(("  final balance %d: 110 withdrawn from 100, an update was lost")
  :format(balance))

print("With a Mutex:")
balance = 100
local mutex = am.Mutex.new()
local function safe_withdraw(amount)
  mutex:runExclusive(function() withdraw(amount) end)
end
am.run(function()
  am.spawn(safe_withdraw, 30)
  am.spawn(safe_withdraw, 80)           -- waits until the first one is done
end)
