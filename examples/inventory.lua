-- Stock per item behind a KeyedMutex: a small TCP server and its client.
--
-- The shop's "database" answers after a short delay (a luv timer stands in
-- for the round trip), so a sale is read, wait, write.  Two concurrent
-- orders for the same item both read the same count and both sell: units
-- are sold twice, or vanish.  A KeyedMutex holds one lock per item: orders
-- of one item wait for each other, orders of different items do not, and
-- each item's lock is gone as soon as nobody uses it.  A transfer between
-- two bins locks both items with acquireAll, which takes keys in one order
-- whatever order they are given, so opposite transfers never deadlock.
--
--   make && lua5.4 examples/inventory.lua [port]
--
-- Starts the server on 127.0.0.1 (on `port`, or one the system picks), runs
-- the client in the same process (twice: without a lock, then with the
-- KeyedMutex), checks the books, closes the server and returns.
-- `lua5.4 examples/inventory.lua server PORT` only serves (until killed);
-- `lua5.4 examples/inventory.lua client PORT` only runs the client.
--
-- Protocol, one line per request, answered out of order, with the same id:
--   <id> BUY <item> <n>        -> <id> OK <n> | <id> SOLDOUT <left>
--   <id> MOVE <from> <to> <n>  -> <id> OK <n> | <id> SHORT <left>
--   <id> STOCK                 -> <id> STOCK <item>=<n> ...
--   <id> RESET lock|nolock     -> <id> OK 0     (refill; use the lock or not)

-- Find the module in this checkout (src/, build/); harmless once installed.
package.path = "src/?.lua;src/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"

local HOST = "127.0.0.1"
local ITEMS = { "apple", "fig", "kiwi", "pear" }
local INITIAL = { apple = 150, fig = 150, kiwi = 100, pear = 100 } -- 500 units
local CUSTOMERS, ORDERS_EACH = 40, 10                           -- 400 requests
local CONNECTIONS = 8

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

--- Calls fn(...) in a new coroutine; an error in it stops the program.
local function go(fn, ...)
  local co = coroutine.create(fn)
  local ok, err = coroutine.resume(co, ...)
  if not ok then error(debug.traceback(co, err), 0) end
end

--- Calls on_line(line) for each complete line read from a stream; on_eof()
-- at the end.
local function read_lines(stream, on_line, on_eof)
  local buffer = ""
  stream:read_start(function(err, chunk)
    assert(not err, err)
    if not chunk then
      stream:read_stop()
      return on_eof()
    end
    buffer = buffer .. chunk
    for line in buffer:gmatch("([^\n]*)\n") do on_line(line) end
    buffer = buffer:match("[^\n]*$")
  end)
end


-- {========================================================== server

local stock = {}                  -- the "database"
local use_lock = true

local function db_read(item)
  sleep(1)
  return stock[item]
end

local function db_write(item, n)
  sleep(1)
  stock[item] = n
end

local locks = am.KeyedMutex.new()

-- What the handlers hold when the lock is off: a releaser that does nothing.
local function nop() end
local NOTHING = setmetatable({}, { __call = nop, __close = nop })

local function lock_one(item)
  if use_lock then return locks:acquire(item) end
  return NOTHING
end

local function lock_both(a, b)
  if use_lock then return locks:acquireAll({ a, b }) end
  return NOTHING
end

local handlers = {}

function handlers.BUY(item, n)
  n = tonumber(n)
  local release <close> = lock_one(item)
  local left = db_read(item)
  if left < n then return "SOLDOUT " .. left end
  db_write(item, left - n)
  return "OK " .. n
end

function handlers.MOVE(from, to, n)
  n = tonumber(n)
  local release <close> = lock_both(from, to)
  local there = db_read(from)
  if there < n then return "SHORT " .. there end
  local here = db_read(to)
  db_write(from, there - n)
  db_write(to, here + n)
  return "OK " .. n
end

function handlers.STOCK()
  local parts = {}
  for i, item in ipairs(ITEMS) do parts[i] = item .. "=" .. stock[item] end
  return "STOCK " .. table.concat(parts, " ")
end

function handlers.RESET(mode)
  for item, n in pairs(INITIAL) do stock[item] = n end
  use_lock = (mode == "lock")
  return "OK 0"
end

--- Serves one request line on `conn`, in its own coroutine.
local function serve(conn, line)
  local id, verb, args = line:match("^(%S+) (%u+) ?(.*)$")
  local handler = handlers[verb]
  local reply
  if not handler then
    reply = "ERROR bad request"
  else
    local fields = {}
    for word in args:gmatch("%S+") do fields[#fields + 1] = word end
    reply = handler(table.unpack(fields))
  end
  if not conn:is_closing() then
    conn:write((id or "?") .. " " .. reply .. "\n")
  end
end

--- Listens on HOST:port (0: any free port); returns the server and its port.
local function start_server(port)
  local server = uv.new_tcp()
  assert(server:bind(HOST, port))
  assert(server:listen(128, function(err)
    assert(not err, err)
    local conn = uv.new_tcp()
    server:accept(conn)
    read_lines(conn, function(line) go(serve, conn, line) end,
      function() conn:close() end)
  end))
  return server, server:getsockname().port
end

-- }==========================================================


-- {========================================================== client

--- A connection whose requests are called from coroutines:
-- c:request("BUY apple 2") returns the reply's words after the id.
local function connect(port, on_ready)
  local c = { tcp = uv.new_tcp(), waiting = {}, next_id = 0 }
  c.tcp:connect(HOST, port, function(err)
    assert(not err, err)
    read_lines(c.tcp, function(line)
      local id, rest = line:match("^(%S+) (.*)$")
      local co = c.waiting[id]
      c.waiting[id] = nil
      assert(coroutine.resume(co, rest))
    end, function() end)
    on_ready()
  end)
  function c:request(text)
    self.next_id = self.next_id + 1
    local id = tostring(self.next_id)
    self.waiting[id] = coroutine.running()
    self.tcp:write(id .. " " .. text .. "\n")
    local words = {}
    for word in coroutine.yield():gmatch("%S+") do words[#words + 1] = word end
    return table.unpack(words)
  end
  return c
end

--- One round: refill, fire every customer's orders at once, then check
-- that what was sold plus what is left is exactly what there was.
local function round(conns, mode, title)
  local admin = conns[1]
  admin:request("RESET " .. mode)
  local sold, requests, buys, moves, refused = 0, 0, 0, 0, 0
  local left_running = CUSTOMERS
  local me = coroutine.running()
  for customer = 1, CUSTOMERS do
    go(function()
      local conn = conns[customer % #conns + 1]
      for _ = 1, ORDERS_EACH do
        local text
        if math.random() < 0.2 then
          local a, b = math.random(#ITEMS), math.random(#ITEMS - 1)
          if b >= a then b = b + 1 end                -- two different items
          text = ("MOVE %s %s %d"):format(ITEMS[a], ITEMS[b], math.random(1, 3))
          moves = moves + 1
        else
          text = ("BUY %s %d")
            :format(ITEMS[math.random(#ITEMS)], math.random(1, 3))
          buys = buys + 1
        end
        local status, n = conn:request(text)
        requests = requests + 1
        if status == "OK" then
          if text:sub(1, 3) == "BUY" then sold = sold + tonumber(n) end
        else
          refused = refused + 1
        end
      end
      left_running = left_running - 1
      if left_running == 0 then assert(coroutine.resume(me)) end
    end)
  end
  coroutine.yield()                                   -- until all are done

  local reply = table.pack(admin:request("STOCK"))
  local left, negative, total = 0, {}, 0
  for i = 2, reply.n do
    local item, n = reply[i]:match("^(%w+)=(%-?%d+)$")
    n = tonumber(n)
    left = left + n
    if n < 0 then negative[#negative + 1] = item end
  end
  for _, n in pairs(INITIAL) do total = total + n end
  print(title)
  print(("  %d requests: %d orders, %d transfers, %d refused"
    .. " (sold out or short)")
    :format(requests, buys, moves, refused))
  local verdict
  if sold + left == total and #negative == 0 then
    verdict = "nothing lost or oversold"
  elseif sold + left > total then
    verdict = ("%d units sold that were never there")
      :format(sold + left - total)
  else
    verdict = ("%d units lost"):format(total - sold - left)
  end
  print(("  sold %d + left %d = %d units, started with %d: %s")
    :format(sold, left, sold + left, total, verdict))
  if #negative > 0 then
    print("  negative stock: " .. table.concat(negative, ", "))
  end
  return verdict == "nothing lost or oversold"
end

--- Opens the connections, runs both rounds, closes them; then done().
local function run_client(port, done)
  local conns, ready = {}, 0
  go(function()
    local me = coroutine.running()
    for i = 1, CONNECTIONS do
      conns[i] = connect(port, function()
        ready = ready + 1
        if ready == CONNECTIONS then assert(coroutine.resume(me)) end
      end)
    end
    coroutine.yield()                                 -- until all connected
    math.randomseed(3)
    round(conns, "nolock", "Without a lock:")
    math.randomseed(3)                                -- the same mix again
    local ok = round(conns, "lock", "With a KeyedMutex per item:")
    print(("  item locks still in use: %d"):format(locks:count()))
    for _, c in ipairs(conns) do c.tcp:close() end
    done(ok)
  end)
end

-- }==========================================================


local mode, port = arg[1], arg[2]
if mode ~= "server" and mode ~= "client" then mode, port = "both", arg[1] end
port = tonumber(port) or 0

if mode == "server" then
  local _, actual = start_server(port)
  print(("inventory server on %s:%d"):format(HOST, actual))
  uv.run()
elseif mode == "client" then
  assert(port ~= 0, "usage: lua5.4 examples/inventory.lua client PORT")
  local ok
  run_client(port, function(result) ok = result end)
  uv.run()
  os.exit(ok and 0 or 1)
else
  local server, actual = start_server(port)
  print(("inventory server on %s:%d"):format(HOST, actual))
  run_client(actual, function()
    server:close()
    print("server closed")
  end)
  uv.run()                                -- returns once everything is closed
end
