-- Optimistic concurrency against a SQL-shaped store (kept in memory here).
--
-- Five customers buy the last three units of item 42 at the same time.  A
-- blind read-modify-write oversells: everyone reads 3 and writes 2.  With a
-- version column, the write is conditional,
--     UPDATE items SET stock = ?, version = version + 1
--      WHERE id = ? AND version = ?
-- and affects no row when someone wrote first; am.optimistic then reads again
-- and retries, after a short random sleep.  No lock is held across the round
-- trips, and exactly three units are sold.
--
--   make && lua5.4 examples/optimistic_sql.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local IO_MS = 5                         -- a simulated database round trip

-- {========================================================== the "database"
local items = {}

-- SELECT stock, version FROM items WHERE id = ?
local function select_item(id)
  am.sleep(IO_MS)
  local row = items[id]
  return row.stock, row.version
end

-- UPDATE items SET stock = ? WHERE id = ?   (no condition: last write wins)
local function update_blind(id, stock)
  am.sleep(IO_MS)
  items[id].stock = stock
  return 1                                -- rows affected
end

-- UPDATE items SET stock = ?, version = version + 1
--  WHERE id = ? AND version = ?
local function update_versioned(id, stock, version)
  am.sleep(IO_MS)
  local row = items[id]
  if row.version ~= version then return 0 end
  row.stock, row.version = stock, row.version + 1
  return 1
end
-- }==========================================================

local CUSTOMERS = 5

local function run(title, buy)
  items[42] = { stock = 3, version = 1 }
  local sold = 0
  print(title)
  am.run(function()                       -- returns when every customer is done
    for customer = 1, CUSTOMERS do
      am.spawn(function()
        local result, attempts = buy()
        if result == "bought" then sold = sold + 1 end
        print(("  customer %d: %s%s"):format(customer, result,
          attempts and (" (attempt %d)"):format(attempts) or ""))
      end)
    end
  end)
  print(("  sold %d, stock left %d: %s"):format(sold, items[42].stock,
    sold + items[42].stock == 3 and "nothing oversold" or "oversold"))
end

run("Read, then write blindly:", function()
  local stock = select_item(42)
  if stock < 1 then return "sold out" end
  update_blind(42, stock - 1)
  return "bought"
end)

run("With a version column and am.optimistic:", function()
  return am.optimistic(function(attempt)
    local stock, version = select_item(42)
    if stock < 1 then return true, "sold out", attempt end  -- nothing to write
    if update_versioned(42, stock - 1, version) == 0 then
      return false                                          -- someone wrote first
    end
    return true, "bought", attempt
  end, { maxAttempts = 20 })
end)
