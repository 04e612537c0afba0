-- Several processes sell from one stock kept in Redis, without overselling.
--
-- The parent puts 100 units in stock and starts 4 worker processes (this
-- script again).  Each worker sells one unit at a time, read-modify-write,
-- holding the RedisMutex "example:orders" that all of them share.  The
-- store (a Redis hash here, standing for any database) checks the fencing
-- token of every read and write: it remembers the highest token it has
-- seen, and refuses a read or a write with a lower one.  A worker paused
-- past its lease (a long GC, SIGSTOP) cannot overwrite the stock with a
-- stale value, even though it believes it still holds the lock: the next
-- holder's read has already shown the store a newer token.  (Checking the
-- token at writes only is not enough: the paused worker could write just
-- after the next holder read, and the next holder's write, based on the
-- stock before that sale, would then be accepted too.)
--
--   make && lua5.4 examples/redis_orders.lua [host [port]]   (127.0.0.1 6379)
--   lua5.4 examples/redis_orders.lua unix:/path/to/redis.sock
--
-- It exits with status 0 when the stock was sold exactly, 1 otherwise (no
-- server at that address, a host name that does not resolve, a worker that
-- failed, a unit sold twice), 2 on bad arguments (a port that is not a
-- number from 1 to 65535, too many arguments).

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"

local WORKERS, UNITS = 4, 100
local STOCK, LOCK = "example:stock", "example:orders"

-- (a worker is this script again: `worker ID [host [port]]`)
local where, port, role, id = ...
if where == "worker" then role, id, where, port = ... end
local failed = false

-- Bad arguments end the script with a usage line and status 2, before
-- anything is sent anywhere (a port that is not a number must not quietly
-- mean 6379).
local USAGE = "usage: lua5.4 examples/redis_orders.lua [host [port]] | unix:PATH"
local function usage(why)
  io.stderr:write("redis_orders.lua: ", why, "\n", USAGE, "\n")
  os.exit(2)
end
if where == "" then usage("the host is empty") end
if where and where:match("^unix:") and port then usage("a unix socket takes no port") end
if port and not (port:match("^%d+$") and tonumber(port) >= 1 and tonumber(port) <= 65535) then
  usage(("the port must be a number from 1 to 65535, not %q"):format(port))
end
if select("#", ...) > (role and 4 or 2) or (role and not (id or ""):match("^%d+$")) then
  usage("too many arguments")
end

local address = where and where:match("^unix:") and where
  or ("%s:%s"):format(where or "127.0.0.1", port or "6379")
local function connect()
  if where and where:match("^unix:") then return redis.connect { path = where:sub(6) } end
  return redis.connect { host = where or "127.0.0.1", port = tonumber(port) or 6379 }
end
-- connect resolves a host name at once: a name that does not resolve fails
-- here, with the same one-line message as a server that is not there
local connected, client = pcall(connect)
if not connected then
  io.stderr:write(("no Redis server at %s (%s)\n"):format(address, tostring(client)))
  os.exit(1)
end

-- The store's fenced read: the stock, for a fence at least as high as any
-- it has seen (which it now remembers); nil (refused) for a lower one.
local FENCED_READ = [[
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence < last then return false end
if fence > last then redis.call('HSET', KEYS[1], 'fence', ARGV[1]) end
return redis.call('HGET', KEYS[1], 'units')
]]

-- The store's fenced write: the new stock, for a fence at least as high as
-- any it has seen; 0 (refused) for a lower one.
local FENCED_WRITE = [[
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) < last then return 0 end
redis.call('HSET', KEYS[1], 'units', ARGV[1], 'fence', ARGV[2])
return 1
]]

local function worker()
  local orders = am.RedisMutex.new(client, LOCK)
  local sold, refused = 0, 0
  while true do
    local release <close> = orders:acquire()
    local units = tonumber(client:eval(FENCED_READ, { STOCK }, { release.fence }))
    if units == 0 then break end
    if units == nil then
      refused = refused + 1                         -- a stale holder's read
    else
      am.sleep(1)                                   -- preparing the order
      if client:eval(FENCED_WRITE, { STOCK }, { units - 1, release.fence }) == 1 then
        sold = sold + 1
      else
        refused = refused + 1                       -- a stale holder's write
      end
    end
    release()
  end
  print(("worker %s sold %d, refused %d"):format(id, sold, refused))
end

local function parent()
  local reached, why = pcall(client.call, client, "DEL", STOCK)
  if not reached and why == redis.E_UNAVAILABLE then
    error(("no Redis server at %s"):format(address), 0)
  end
  assert(reached, why)
  client:call("HSET", STOCK, "units", UNITS, "fence", 0)
  print(("stock: %d units, %d worker processes"):format(UNITS, WORKERS))
  -- each worker that ends gives one unit back; the parent waits for all
  -- (resumed by the module, which reports an error of the parent's rather
  -- than dropping it, as a bare coroutine.resume would)
  local lines, finished = {}, am.Semaphore.new(0)
  for i = 1, WORKERS do
    local out = uv.new_pipe(false)
    local handle
    handle = uv.spawn(uv.exepath(), {
      args = { arg[0], "worker", tostring(i), where, port },
      stdio = { nil, out, 2 },
    }, function(code)
      handle:close()
      if code ~= 0 then failed = true end
    end)
    local buffer = {}
    out:read_start(function(err, data)
      assert(not err, err)
      if data then buffer[#buffer + 1] = data return end
      out:close()
      lines[#lines + 1] = table.concat(buffer)
      finished:release()
    end)
  end
  finished:acquire(WORKERS)
  table.sort(lines)
  local total = 0
  for _, line in ipairs(lines) do
    io.write(line)
    total = total + tonumber(line:match("sold (%d+)"))
  end
  local left = tonumber(client:call("HGET", STOCK, "units"))
  print(("sold %d units in all, %d left: %s"):format(total, left,
    total + left == UNITS and "no unit sold twice" or "OVERSOLD"))
  if total + left ~= UNITS then failed = true end
  client:call("DEL", STOCK)
end

-- am.run raises what failed, with its traceback (the exit status is 1):
-- the one failure a user expects, no server, in one line
local ok, err = pcall(am.run, function()
  if role == "worker" then worker() else parent() end
  client:close()
end)
if not ok then
  io.stderr:write(type(err) == "string" and err:match("^no Redis server[^\n]*")
    or tostring(err), "\n")
  os.exit(1)
end
if failed then os.exit(1) end
