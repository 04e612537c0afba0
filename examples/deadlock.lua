-- A real ABBA bug, reported before it hangs: debug mode (README, "Debugging a
-- hang"; docs/debug.md).
--
-- transfer(from, to) locks the source account, then the destination.  Two
-- transfers in opposite directions take the same two locks in opposite
-- orders.  Run one after the other they never collide, and a test suite
-- passes; under load they deadlock.  Debug mode reports the inversion the
-- first time both orders are seen (lockdep), while nothing hung yet; and
-- when the two transfers do collide, the request that closes the cycle
-- raises am.E_DEADLOCK at once instead of hanging both for ever.
--
--   make && lua5.4 examples/deadlock.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

am.debug.enable({
  onReport = function(kind, text)
    print(("[debug: %s]"):format(kind))
    print(text)
  end,
})

local function account(name, balance)
  return { name = name, balance = balance,
           lock = am.debug.name(am.Mutex.new(), "account " .. name) }
end
local A, B = account("A", 100), account("B", 100)

-- The bug: the lock order depends on the direction of the transfer.
local function transfer(from, to, amount)
  local release <close> = from.lock:acquire()
  am.sleep(10)                                -- reads the balance from a database
  local r <close> = to.lock:acquire()
  from.balance, to.balance = from.balance - amount, to.balance + amount
  print(("  transfer %s -> %s: %d done"):format(from.name, to.name, amount))
end

local function run(label, ...)
  print(label)
  local transfers = { ... }
  am.run(function()                           -- returns when all are done
    for _, t in ipairs(transfers) do
      am.spawn(function()
        local ok, err = pcall(transfer, t[1], t[2], t[3])
        if not ok then
          print(("  transfer %s -> %s failed: %s"):format(t[1].name, t[2].name, tostring(err)))
        end
      end)
    end
  end)
end

-- 1. In the test suite: one transfer at a time.  Nothing hangs, but the
-- second one takes the locks in the other order: lockdep reports it.
print("1. One transfer at a time (a test suite):")
run("  A -> B", { A, B, 10 })
run("  B -> A", { B, A, 5 })

-- 2. In production: both at once.  Without debug mode both would wait for
-- ever; here the request that closes the cycle raises am.E_DEADLOCK.
print("2. Both at once (production):")
run("  A -> B and B -> A", { A, B, 10 }, { B, A, 5 })

-- 3. The fix: take the two locks in one order, whatever the direction.
local function fixed_transfer(from, to, amount)
  local first, second = from, to
  if second.name < first.name then first, second = second, first end
  local release <close> = first.lock:acquire()
  am.sleep(10)
  local r <close> = second.lock:acquire()
  from.balance, to.balance = from.balance - amount, to.balance + amount
  print(("  transfer %s -> %s: %d done"):format(from.name, to.name, amount))
end
transfer = fixed_transfer
am.debug.disable()                            -- forget the graph of the buggy version
am.debug.enable({ onReport = function(kind) print("[debug: " .. kind .. "] unexpected") end })
run("3. Fixed, both at once:", { A, B, 10 }, { B, A, 5 })
print(("balances: A %d, B %d"):format(A.balance, B.balance))
