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
-- `lua5.4 examples/inventory.lua client PORT` only runs the client; it
-- gives up (status 1) on a server that closes the connection, answers a
-- request it was never sent, or leaves a request without a reply for 5 s.
-- Bad arguments: a usage line, status 2.
--
-- Protocol: one request a line, answered out of order, each reply starting
-- with the id its request started with:
--   <id> BUY <item> <count>        -> <id> OK <count> | <id> SOLDOUT <left>
--   <id> MOVE <from> <to> <count>  -> <id> OK <count> | <id> SHORT <left>
--   <id> STOCK                     -> <id> STOCK apple=<n> ... sold=<n>
--   <id> RESET lock|nolock         -> <id> OK 0   (refill; use the locks or not)
-- Items are apple, fig, kiwi and pear; counts are whole numbers from 1 to
-- 1000000.  A bad request is answered `<id> ERROR <reason>` (`? ERROR ...`
-- when it has no id) and changes nothing.
--
-- The server is written to be copied: whatever a client sends or does, only
-- that client is affected.
-- - Lines are split in time linear in their length, and a line longer than
--   MAX_LINE bytes is answered `? ERROR line too long` and ends the
--   connection (after the requests before it are answered).
-- - Each connection has at most MAX_BUSY requests being served; the lines
--   after those wait, and the connection is not read meanwhile.
-- - A client that closes its side is answered, then closed.  One that resets
--   the connection, or whose replies cannot be written, is dropped: its
--   waiting lines are dropped, and the requests already being served finish
--   (so a transfer never stops halfway) with no reply.  A client that leaves
--   more than MAX_UNSENT bytes of replies unread is dropped too.
-- - A request that fails with a Lua error (a bug) is answered
--   `<id> ERROR internal error` and reported on stderr.

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"

local HOST = "127.0.0.1"
local ITEMS = { "apple", "fig", "kiwi", "pear" }
local INITIAL = { apple = 150, fig = 150, kiwi = 100, pear = 100 } -- 500 units
local MAX_COUNT = 1000000
local MAX_LINE = 1024            -- bytes in a request line, newline excluded
local MAX_BUSY = 16              -- requests of one connection served at once
local MAX_UNSENT = 64 * 1024     -- bytes of replies a client may leave unread
local CUSTOMERS, ORDERS_EACH = 40, 10                           -- 400 requests
local CONNECTIONS = 8
local REPLY_TIMEOUT = 5000       -- ms the client waits for a reply

--- Resumes `co`, a coroutine waiting for an I/O event of ours (a reply, a
-- connection); if that kills it, prints the error and closes `co` (so that
-- its <close> variables run).  (The coroutines of tasks, am.spawn's, never
-- die so: their task takes the error, and am.run raises it.)
local function resume(co, ...)
  local ok, err = coroutine.resume(co, ...)
  if not ok then
    io.stderr:write(debug.traceback(co, err), "\n")
    coroutine.close(co)
  end
end

--- Returns a function to call with each chunk read from a stream.  It calls
-- on_line(line) for each complete line (without "\n" or "\r\n"), and
-- on_too_long() instead, once and for good, when a line grows past max_len
-- bytes.  Each byte is looked at once: the start of a line that is not
-- complete yet is kept as a list of pieces, joined when its end arrives.
local function line_splitter(max_len, on_line, on_too_long)
  local pieces, length = {}, 0
  local failed = false
  return function(chunk)
    local start = 1
    while not failed do
      local stop = chunk:find("\n", start, true)
      local piece = chunk:sub(start, stop and stop - 1)
      length = length + #piece
      if length > max_len then
        failed = true
        return on_too_long()
      end
      pieces[#pieces + 1] = piece
      if not stop then return end
      local line = table.concat(pieces):gsub("\r$", "")
      pieces, length = {}, 0
      on_line(line)
      start = stop + 1
    end
  end
end


-- {========================================================== server

local stock = {}                  -- the "database"
local sold = 0                    -- units sold since the last RESET
local use_lock = true
for item, n in pairs(INITIAL) do stock[item] = n end

local function db_read(item)
  am.sleep(1)
  return stock[item]
end

local function db_write(item, n)
  am.sleep(1)
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

-- The handlers get their arguments checked and converted (see ARGUMENTS);
-- they return the reply after the id.

local function buy(item, n)
  local release <close> = lock_one(item)
  local left = db_read(item)
  if left < n then return "SOLDOUT " .. left end
  db_write(item, left - n)
  sold = sold + n
  return "OK " .. n
end

local function move(from, to, n)
  if from == to then return "ERROR cannot move an item to itself" end
  local release <close> = lock_both(from, to)
  local there = db_read(from)
  if there < n then return "SHORT " .. there end
  local here = db_read(to)
  db_write(from, there - n)
  db_write(to, here + n)
  return "OK " .. n
end

local function report()
  -- All items at one moment: no transfer is halfway.
  local release <close> = use_lock and locks:acquireAll(ITEMS) or NOTHING
  local parts = {}
  for i, item in ipairs(ITEMS) do parts[i] = item .. "=" .. stock[item] end
  return ("STOCK %s sold=%d"):format(table.concat(parts, " "), sold)
end

local function reset(mode)
  local release <close> = locks:acquireAll(ITEMS)
  for item, n in pairs(INITIAL) do stock[item] = n end
  sold = 0
  use_lock = (mode == "lock")
  return "OK 0"
end

local COMMANDS = {
  BUY = { buy, "item", "count" },
  MOVE = { move, "item", "item", "count" },
  STOCK = { report },
  RESET = { reset, "mode" },
}

-- Each kind of argument: the value it stands for, or nil and why not.
local ARGUMENTS = {
  item = function(word)
    if INITIAL[word] then return word end
    return nil, "unknown item " .. word
  end,
  count = function(word)
    local n = word:match("^%d+$") and tonumber(word)
    if n and n >= 1 and n <= MAX_COUNT then return n end
    return nil, "count must be a whole number from 1 to " .. MAX_COUNT
  end,
  mode = function(word)
    if word == "lock" or word == "nolock" then return word end
    return nil, "mode must be lock or nolock"
  end,
}

--- Serves one request line (in a coroutine: it may wait); returns the reply
-- line.  A bad request changes nothing.
local function answer(line)
  local words = {}
  for word in line:gmatch("%S+") do words[#words + 1] = word end
  local id, verb = words[1] or "?", words[2]
  if not verb then
    return id .. " ERROR expected: <id> <command> [<argument> ...]"
  end
  local command = COMMANDS[verb]
  if not command then return id .. " ERROR unknown command " .. verb end
  if #words ~= #command + 1 then
    local usage = { verb }
    for i = 2, #command do usage[i] = "<" .. command[i] .. ">" end
    return id .. " ERROR usage: " .. table.concat(usage, " ")
  end
  local args = {}
  for i = 2, #command do
    local value, why = ARGUMENTS[command[i]](words[i + 1])
    if value == nil then return id .. " ERROR " .. why end
    args[i - 1] = value
  end
  local ok, reply = pcall(command[1], table.unpack(args))
  if not ok then
    io.stderr:write(("request %q failed: %s\n"):format(line, reply))
    reply = "ERROR internal error"
  end
  return id .. " " .. reply
end

--- Serves one client connection until it ends (see the top of the file).
local function serve(conn)
  local waiting, first, last = {}, 1, 0   -- lines not started yet
  local busy = 0                          -- requests being served
  local reading = true
  local finished = false                  -- no more lines will be read
  local closed = false
  local pumping = false
  local on_read

  local function drop()
    if closed then return end
    closed = true
    waiting, first, last = {}, 1, 0
    conn:close()
  end

  local function send(line)
    if closed then return end
    if conn:get_write_queue_size() > MAX_UNSENT then return drop() end
    local ok = conn:write(line .. "\n", function(err)
      if err then drop() end              -- EPIPE, ECONNRESET: it is gone
    end)
    if not ok then drop() end
  end

  -- Starts waiting lines while fewer than MAX_BUSY run; reads while none
  -- waits; closes once finished and everything is answered.  A request
  -- answered without waiting calls pump() from inside the loop below:
  -- `pumping` lets the loop go on rather than nest.
  local function pump()
    if pumping or closed then return end
    pumping = true
    while busy < MAX_BUSY and first <= last do
      local line = waiting[first]
      waiting[first], first = nil, first + 1
      am.spawn(function()
        busy = busy + 1
        send(answer(line))
        busy = busy - 1
        pump()
      end)
    end
    pumping = false
    if closed then return end
    if finished then
      if busy == 0 and first > last then  -- everything answered
        closed = true                     -- the replies go out, then FIN
        if not conn:shutdown(function() conn:close() end) then
          conn:close()
        end
      end
    elseif reading and first <= last then
      reading = false
      conn:read_stop()
    elseif not reading and first > last then
      reading = true
      conn:read_start(on_read)
    end
  end

  local split = line_splitter(MAX_LINE,
    function(line)
      last = last + 1
      waiting[last] = line
    end,
    function()
      send(("? ERROR line too long (at most %d bytes)"):format(MAX_LINE))
      finished = true
    end)

  on_read = function(err, chunk)
    if err then return drop() end         -- ECONNRESET and the like
    if chunk then split(chunk) else finished = true end  -- nil: end of stream
    if finished and reading then
      reading = false
      conn:read_stop()
    end
    pump()
  end
  conn:read_start(on_read)
end

--- Listens on HOST:port (0: any free port); returns the server and its port.
local function start_server(port)
  -- Writing to a connection the client has closed raises SIGPIPE, which
  -- kills the process unless the signal is caught.  Caught, the write just
  -- fails (EPIPE) and drops that client.  unref: it does not keep uv.run()
  -- from returning.
  local sigpipe = uv.new_signal()
  sigpipe:start("sigpipe", function() end)
  sigpipe:unref()
  local server = uv.new_tcp()
  assert(server:bind(HOST, port))
  assert(server:listen(128, function(err)
    if err then return end                -- a failed accept: nobody to tell
    local conn = uv.new_tcp()
    if server:accept(conn) then
      serve(conn)
    else
      conn:close()
    end
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
    if err then
      io.stderr:write("cannot connect to the server: ", err, "\n")
      os.exit(1)
    end
    local split = line_splitter(math.huge, function(line)
      local id, rest = line:match("^(%S+) (.*)$")
      local request = c.waiting[id]
      if not request then                -- a server that lies: stop, say so
        io.stderr:write(("the server answered a request never sent: %q\n"):format(line))
        os.exit(1)
      end
      c.waiting[id] = nil
      request.timer:close()
      resume(request.co, rest)
    end)
    c.tcp:read_start(function(read_err, chunk)
      if read_err or not chunk then
        if next(c.waiting) then
          io.stderr:write("the server closed the connection\n")
          os.exit(1)
        end
        return c.tcp:close()
      end
      split(chunk)
    end)
    on_ready()
  end)
  function c:request(text)
    self.next_id = self.next_id + 1
    local id = tostring(self.next_id)
    -- a server that goes silent must not leave the client waiting for ever
    local timer = uv.new_timer()
    timer:start(REPLY_TIMEOUT, 0, function()
      io.stderr:write(("no reply from the server in %d ms to %q\n"):format(REPLY_TIMEOUT, text))
      os.exit(1)
    end)
    self.waiting[id] = { co = coroutine.running(), timer = timer }
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
  local sold_seen, requests, buys, moves, refused = 0, 0, 0, 0, 0
  local customers = am.group()
  for customer = 1, CUSTOMERS do
    customers:spawn(function()
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
          if text:sub(1, 3) == "BUY" then sold_seen = sold_seen + tonumber(n) end
        else
          refused = refused + 1
        end
      end
    end)
  end
  customers:join()                                    -- until all are done

  local reply = table.pack(admin:request("STOCK"))
  local left, negative, total = 0, {}, 0
  for i = 2, reply.n do
    local item, n = reply[i]:match("^(%w+)=(%-?%d+)$")
    if item ~= "sold" then
      n = tonumber(n)
      left = left + n
      if n < 0 then negative[#negative + 1] = item end
    end
  end
  for _, n in pairs(INITIAL) do total = total + n end
  print(title)
  print(("  %d requests: %d orders, %d transfers, %d refused"
    .. " (sold out or short)")
    :format(requests, buys, moves, refused))
  local verdict
  if sold_seen + left == total and #negative == 0 then
    verdict = "nothing lost or oversold"
  elseif sold_seen + left > total then
    verdict = ("%d units sold that were never there")
      :format(sold_seen + left - total)
  else
    verdict = ("%d units lost"):format(total - sold_seen - left)
  end
  print(("  sold %d + left %d = %d units, started with %d: %s")
    :format(sold_seen, left, sold_seen + left, total, verdict))
  if #negative > 0 then
    print("  negative stock: " .. table.concat(negative, ", "))
  end
  return verdict == "nothing lost or oversold"
end

--- Opens the connections, runs both rounds, closes them; returns whether
-- nothing was lost or oversold with the locks.
local function run_client(port)
  local conns, ready = {}, 0
  local me = coroutine.running()
  for i = 1, CONNECTIONS do
    conns[i] = connect(port, function()
      ready = ready + 1
      if ready == CONNECTIONS then resume(me) end
    end)
  end
  coroutine.yield()                                   -- until all connected
  math.randomseed(3)
  round(conns, "nolock", "Without a lock:")
  math.randomseed(3)                                  -- the same mix again
  local ok = round(conns, "lock", "With a KeyedMutex per item:")
  print(("  item locks still in use: %d"):format(locks:count()))
  for _, c in ipairs(conns) do c.tcp:shutdown() end   -- the server closes
  return ok
end

-- }==========================================================


-- Bad arguments end the script with a usage line and status 2 (a typo such
-- as `serve 1234` must not run the demo instead).
local USAGE = "usage: lua5.4 examples/inventory.lua [PORT] | server [PORT] | client PORT"
local function usage(why)
  io.stderr:write("inventory.lua: ", why, "\n", USAGE, "\n")
  os.exit(2)
end
local mode, port = arg[1], arg[2]
if mode ~= "server" and mode ~= "client" then mode, port = "both", arg[1] end
if mode == "both" and #arg > 1 then
  usage(("no mode %q: server or client"):format(arg[1]))
end
if #arg > 2 then usage("too many arguments") end
if mode == "client" and not port then usage("the client needs the server's PORT") end
if port and not (port:match("^%d+$") and tonumber(port) <= 65535
    and (mode ~= "client" or tonumber(port) >= 1)) then
  usage(("not a port: %q"):format(port))
end
port = tonumber(port) or 0

-- am.run runs the loop until everything is closed; an error in a request's
-- task that nobody joined makes it raise (the exit status is then 1)
if mode == "server" then
  am.run(function()
    local _, actual = start_server(port)
    print(("inventory server on %s:%d"):format(HOST, actual))
    io.stdout:flush()
  end)
elseif mode == "client" then
  os.exit(am.run(run_client, port) and 0 or 1)
else
  am.run(function()
    local server, actual = start_server(port)
    print(("inventory server on %s:%d"):format(HOST, actual))
    run_client(actual)
    server:close()
    print("server closed")
  end)
end
