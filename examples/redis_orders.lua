-- Several processes sell from one stock kept in Redis, without overselling.
--
-- The parent puts 100 units in stock and starts 4 worker processes (this
-- script again).  Each worker sells one unit at a time, read-modify-write,
-- holding the RedisMutex "example:orders" that all of them share.  The
-- store (a Redis hash here, standing for any database) accepts a write
-- only with a fencing token above the last one it accepted: a worker
-- paused past its lease (a long GC, SIGSTOP) cannot overwrite the stock
-- with a stale value, even though it believes it still holds the lock.
--
--   make && lua5.4 examples/redis_orders.lua [host [port]]   (127.0.0.1 6379)
--   lua5.4 examples/redis_orders.lua unix:/path/to/redis.sock

-- Find the module in this checkout (src/, build/); harmless once installed.
package.path = "src/?.lua;src/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"

local WORKERS, UNITS = 4, 100
local STOCK, LOCK = "example:stock", "example:orders"

local where, port, role, id = ...
local function connect()
  if where and where:match("^unix:") then return redis.connect { path = where:sub(6) } end
  return redis.connect { host = where or "127.0.0.1", port = tonumber(port) or 6379 }
end
local client = connect()

-- The store's conditional write: the new stock, if the fence is the
-- highest it has seen.
local FENCED_WRITE = [[
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'units', ARGV[1], 'fence', ARGV[2])
return 1
]]

local function worker()
  local orders = am.RedisMutex.new(client, LOCK)
  local sold, refused = 0, 0
  while true do
    local release <close> = orders:acquire()
    local units = tonumber(client:call("HGET", STOCK, "units"))
    if units == 0 then break end
    am.sleep(1)                                     -- preparing the order
    if client:eval(FENCED_WRITE, { STOCK }, { units - 1, release.fence }) == 1 then
      sold = sold + 1
    else
      refused = refused + 1                         -- a stale holder's write
    end
    release()
  end
  print(("worker %s sold %d, refused %d"):format(id, sold, refused))
end

local function parent()
  client:call("DEL", STOCK)
  client:call("HSET", STOCK, "units", UNITS, "fence", 0)
  print(("stock: %d units, %d worker processes"):format(UNITS, WORKERS))
  local lines, running = {}, WORKERS
  local done = coroutine.running()
  for i = 1, WORKERS do
    local out = uv.new_pipe(false)
    local handle
    handle = uv.spawn(uv.exepath(), {
      args = { arg[0], where or "127.0.0.1", port or "6379", "worker", tostring(i) },
      stdio = { nil, out, 2 },
    }, function(code)
      handle:close()
      assert(code == 0, "a worker failed")
    end)
    local buffer = {}
    out:read_start(function(err, data)
      assert(not err, err)
      if data then buffer[#buffer + 1] = data return end
      out:close()
      lines[#lines + 1] = table.concat(buffer)
      running = running - 1
      if running == 0 then coroutine.resume(done) end
    end)
  end
  coroutine.yield()
  table.sort(lines)
  local total = 0
  for _, line in ipairs(lines) do
    io.write(line)
    total = total + tonumber(line:match("sold (%d+)"))
  end
  local left = tonumber(client:call("HGET", STOCK, "units"))
  print(("sold %d units in all, %d left: %s"):format(total, left,
    total + left == UNITS and "no unit sold twice" or "OVERSOLD"))
  client:call("DEL", STOCK)
end

am.spawn(function()
  if role == "worker" then worker() else parent() end
  client:close()
end)
uv.run()
