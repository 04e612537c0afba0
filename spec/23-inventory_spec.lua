-- examples/inventory.lua as a server: started as its own process
-- (`lua5.4 examples/inventory.lua server 0`) and driven over TCP by
-- concurrent clients that misbehave in every way we know of, while the
-- books must balance (units left + units sold = 500) and the server must
-- go on serving everyone else, with nothing on its stderr.

local uv = require "luv"
local h = require "helpers"

local LUA = os.getenv("LUA") or "lua5.4"
local HOST = "127.0.0.1"
local MAX_LINE = 1024                   -- MAX_LINE in examples/inventory.lua
local TOTAL = 500                       -- units in stock after a RESET
local FULL = "STOCK apple=150 fig=150 kiwi=100 pear=100 sold=0"
local TOO_LONG = "? ERROR line too long (at most 1024 bytes)"
local COUNT_ERROR = "ERROR count must be a whole number from 1 to 1000000"

local ROOT = h.ROOT


-- {========================================================== the server

--- `path` ("a/?.lua;b/?.so;;") with its relative entries made absolute.
local function absolute(path)
  local base = ROOT:sub(1, 1) == "/" and ROOT or (uv.cwd() .. "/" .. ROOT)
  return (path:gsub("[^;]+", function(entry)
    if entry:sub(1, 1) ~= "/" then return base .. "/" .. entry end
  end))
end

--- Starts the example's server; returns it once it has printed its port.
-- It runs from another directory, so that it loads the module this process
-- loaded (under `make asan`, the sanitized build), not the one in build/.
local function start_server()
  local srv = { stdout = "", stderr = "", clients = {} }
  local out, err = uv.new_pipe(), uv.new_pipe()
  local env = { "LUA_PATH=" .. absolute(package.path),
    "LUA_CPATH=" .. absolute(package.cpath) }
  for _, name in ipairs({ "PATH", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
    "LSAN_OPTIONS" }) do
    if os.getenv(name) then env[#env + 1] = name .. "=" .. os.getenv(name) end
  end
  srv.proc, srv.pid = uv.spawn(LUA, {
    args = { absolute("examples/inventory.lua"), "server", "0" },
    cwd = "/",
    env = env,
    stdio = { nil, out, err },
  }, function(code, signal)
    srv.exited = ("exit code %d, signal %d"):format(code, signal)
    srv.proc:close()
  end)
  assert(srv.proc, srv.pid)
  local open = 2
  local function reader(pipe, field)
    pipe:read_start(function(_, chunk)
      if chunk then
        srv[field] = srv[field] .. chunk
      else
        pipe:close()
        open = open - 1
      end
    end)
  end
  reader(out, "stdout")
  reader(err, "stderr")
  srv.pipes_closed = function() return open == 0 end
  h.wait_until(function()
    return srv.stdout:find("\n", 1, true) or srv.exited
  end, 5000, "the server to print its port")
  srv.port = tonumber(srv.stdout:match("^inventory server on 127%.0%.0%.1:(%d+)\n"))
  assert(srv.port, "the server did not start: " .. srv.stdout .. srv.stderr
    .. (srv.exited or ""))
  return srv
end

--- Checks that the server still runs and wrote nothing to stderr, and that
-- the body closed its clients; then stops the server (SIGTERM) and waits
-- for it to be gone.
local function stop_server(srv)
  assert(not srv.exited, "the server died: " .. tostring(srv.exited)
    .. "\nstderr:\n" .. srv.stderr)
  for c in pairs(srv.clients) do
    assert(c.tcp:is_closing(), "a client was left open")
  end
  uv.kill(srv.pid, "sigterm")
  h.wait_until(function() return srv.exited and srv.pipes_closed() end, 5000,
    "the server to exit")
  assert.equal("", srv.stderr)
end

--- A spec body run with a fresh server, which is stopped afterwards.  When
-- the body fails, or its deadline passes and the loop is abandoned, its
-- clients are closed and the server is killed by its PID.  (Every handle
-- must be closed, its close completed, before busted exits: luv 1.44 frees
-- the others at exit while libuv still lists them.)
local function with_server(body, opts)
  return function()
    local srv, sigpipe
    local function clean_up()
      if srv then
        for c in pairs(srv.clients) do c:close() end
        if not srv.exited then uv.kill(srv.pid, "sigkill") end
      end
      if sigpipe and not sigpipe:is_closing() then sigpipe:close() end
    end
    finally(function()
      clean_up()
      uv.run("nowait")                    -- the closes complete
    end)
    h.run(function()
      -- A write to a connection the server has reset raises SIGPIPE, which
      -- would kill busted: catch it (the write fails with EPIPE instead).
      sigpipe = uv.new_signal()
      sigpipe:start("sigpipe", function() end)
      srv = start_server()
      local ok, err = xpcall(body, debug.traceback, srv)
      if ok then ok, err = xpcall(stop_server, debug.traceback, srv) end
      if not ok then
        clean_up()
        h.wait_until(function() return srv.exited and srv.pipes_closed() end)
        error(tostring(err) .. "\nserver: " .. tostring(srv.exited)
          .. ", stderr:\n" .. srv.stderr, 0)
      end
      sigpipe:close()
    end, opts)
  end
end

-- }==========================================================


-- {========================================================== clients

local Client = {}
Client.__index = Client

--- Opens a connection to the server (waiting for it) and reads everything
-- it receives: c.lines (in order), c.reply[id] (the text after the id),
-- c.ended ("EOF" or the error that ended reading).
local function connect(srv)
  local c = setmetatable({ tcp = uv.new_tcp(), lines = {}, reply = {},
    partial = "", next_id = 0 }, Client)
  srv.clients[c] = true
  local result
  c.tcp:connect(HOST, srv.port, function(err) result = err or "ok" end)
  h.wait_until(function() return result end, 2000, "connect")
  assert.equal("ok", result)
  c.tcp:read_start(function(err, chunk)
    if err or not chunk then
      c.ended = err or "EOF"
      c.tcp:read_stop()
      return
    end
    local buffer, start = c.partial .. chunk, 1
    while true do
      local nl = buffer:find("\n", start, true)
      if not nl then break end
      local line = buffer:sub(start, nl - 1)
      start = nl + 1
      c.lines[#c.lines + 1] = line
      local id, rest = line:match("^(%S+) (.*)$")
      if id then c.reply[id] = rest end
    end
    c.partial = buffer:sub(start)
  end)
  return c
end

--- Writes raw bytes; a failed write is recorded in c.write_error.
function Client:send(bytes)
  if self.tcp:is_closing() then return end
  local ok, err = self.tcp:write(bytes, function(e)
    if e then self.write_error = e end
  end)
  if not ok then self.write_error = err end
end

--- Sends one request line with a fresh id; returns the id.
function Client:post(text)
  self.next_id = self.next_id + 1
  local id = "r" .. self.next_id
  self:send(id .. " " .. text .. "\n")
  return id
end

--- Waits for the reply to `id` and returns it (the text after the id).
function Client:await(id, what)
  h.wait_until(function() return self.reply[id] or self.ended end, 5000,
    what or ("a reply to " .. id))
  return assert(self.reply[id], "connection ended before the reply to " .. id
    .. ": " .. tostring(self.ended))
end

--- Sends each request of `texts` at once (pipelined); returns the replies
-- in the same order.
function Client:requests(texts)
  local ids = {}
  for i, text in ipairs(texts) do ids[i] = self:post(text) end
  local replies = {}
  for i, id in ipairs(ids) do replies[i] = self:await(id, texts[i]) end
  return replies
end

function Client:request(text)
  return self:requests({ text })[1]
end

--- Waits until the server has ended the connection.
function Client:await_end()
  h.wait_until(function() return self.ended end, 5000, "the server to close")
end

function Client:close()
  if not self.tcp:is_closing() then self.tcp:close() end
end

--- Closes with a TCP reset (the peer reads ECONNRESET).  Not after
-- half_close: libuv refuses then.
function Client:reset()
  if not self.tcp:is_closing() then assert(self.tcp:close_reset()) end
end

--- Ends the sending side (the server reads end-of-stream).
function Client:half_close()
  self.tcp:shutdown()
end

--- Parses a STOCK reply into a table of counts, with .units (left in all
-- items) and .sold.
local function parse_stock(reply)
  assert.matches("^STOCK apple=%d+ fig=%d+ kiwi=%d+ pear=%d+ sold=%d+$", reply)
  local t = { units = 0 }
  for name, n in reply:gmatch("(%a+)=(%d+)") do
    t[name] = tonumber(n)
    if name ~= "sold" then t.units = t.units + tonumber(n) end
  end
  return t
end

--- Asserts that nothing was created or lost: left + sold = 500.  Returns
-- the stock table.
local function assert_conserved(srv)
  local c = connect(srv)
  local stock = parse_stock(c:request("STOCK"))
  c:close()
  assert(stock.units + stock.sold == TOTAL,
    ("left %d + sold %d ~= %d"):format(stock.units, stock.sold, TOTAL))
  return stock
end

--- A long line: "<id> " and `size` bytes in all, newline excluded.
local function long_line(size)
  return "big " .. ("x"):rep(size - 4)
end

-- }==========================================================


-- {========================================================== misbehaviours
-- Each runs in a coroutine of its own, against its own connection.

local BAD = {
  { "BUY apple", "ERROR usage: BUY <item> <count>" },
  { "BUY", "ERROR usage: BUY <item> <count>" },
  { "BUY apple 1 2", "ERROR usage: BUY <item> <count>" },
  { "BUY banana 1", "ERROR unknown item banana" },
  { "BUY Apple 1", "ERROR unknown item Apple" },
  { "BUY apple x", COUNT_ERROR },
  { "BUY apple -5", COUNT_ERROR },
  { "BUY apple 0", COUNT_ERROR },
  { "BUY apple 1.5", COUNT_ERROR },
  { "BUY apple 1e2", COUNT_ERROR },
  { "BUY apple 0x10", COUNT_ERROR },
  { "BUY apple 1000001", COUNT_ERROR },
  { "BUY apple 99999999999999999999999", COUNT_ERROR },
  { "BUY apple nan", COUNT_ERROR },
  { "MOVE apple apple 1", "ERROR cannot move an item to itself" },
  { "MOVE apple banana 1", "ERROR unknown item banana" },
  { "MOVE apple fig -1", COUNT_ERROR },
  { "MOVE apple fig", "ERROR usage: MOVE <item> <item> <count>" },
  { "STOCK now", "ERROR usage: STOCK" },
  { "RESET", "ERROR usage: RESET <mode>" },
  { "RESET maybe", "ERROR mode must be lock or nolock" },
  { "buy apple 1", "ERROR unknown command buy" },
  { "SELL apple 1", "ERROR unknown command SELL" },
}

--- Sends every bad request of BAD, pipelined, and checks each answer.
local function bad_requests(c)
  local texts = {}
  for i, case in ipairs(BAD) do texts[i] = case[1] end
  local replies = c:requests(texts)
  for i, case in ipairs(BAD) do
    assert.equal(case[2], replies[i], "reply to " .. case[1])
  end
  -- no id, or nothing but an id
  c:send("\n   \nlonely\n")
  h.wait_until(function() return #c.lines >= #BAD + 3 end, 5000, "3 errors")
  local n = #c.lines
  local shape = "ERROR expected: <id> <command> [<argument> ...]"
  assert.same({ "? " .. shape, "? " .. shape, "lonely " .. shape },
    { c.lines[n - 2], c.lines[n - 1], c.lines[n] })
end

--- Transfers between two different items: they never change the total, so
-- whether they completed or not, the books must balance.
local function transfers(n)
  local items = { "apple", "fig", "kiwi", "pear" }
  local texts = {}
  for i = 1, n do
    texts[i] = ("MOVE %s %s %d"):format(items[i % 4 + 1],
      items[(i + 1) % 4 + 1], i % 3 + 1)
  end
  return texts
end

local misbehave = {}

misbehave["bad requests"] = function(srv)
  local c = connect(srv)
  bad_requests(c)
  c:close()
end

--- Sends `size` bytes in one line, after a valid request; the server answers
-- the request, refuses the line, and closes the connection.
local function over_long(srv, size, pieces)
  local c = connect(srv)
  local first = c:post("STOCK")
  local line = long_line(size) .. "\n"
  if pieces then                        -- a piece every millisecond
    local step = #line // pieces + 1
    for i = 1, #line, step do
      c:send(line:sub(i, i + step - 1))
      h.sleep(1)
      if c.ended then break end
    end
  else
    c:send(line)
  end
  c:await_end()
  parse_stock(assert(c.reply[first], "no reply to the request before"))
  assert.equal(2, #c.lines)             -- that reply and the refusal
  assert.is_true(c.lines[1] == TOO_LONG or c.lines[2] == TOO_LONG)
  c:close()
end

misbehave["64 KiB line"] = function(srv) over_long(srv, 64 * 1024) end
misbehave["1 MiB line"] = function(srv) over_long(srv, 1024 * 1024) end
misbehave["64 KiB line in 64 pieces"] = function(srv)
  over_long(srv, 64 * 1024, 64)
end

-- A client that posts n transfers, then, while they are being served,
-- ends its connection with `how` ("close", or "reset").
local function ends_mid_request(n, how)
  return function(srv)
    local c = connect(srv)
    for _, text in ipairs(transfers(n)) do c:post(text) end
    h.sleep(2)                          -- the transfers are being served
    c[how](c)
  end
end

-- Fewer requests than the server serves at once (MAX_BUSY, 16): it goes on
-- reading, and reads the end of the stream, or the reset.
misbehave["close mid-request"] = ends_mid_request(10, "close")
misbehave["reset mid-request (ECONNRESET)"] = ends_mid_request(10, "reset")
-- More requests than the server serves at once: it stops reading, so it
-- learns of the reset only when it writes the replies.
misbehave["reset before the replies (write error)"] = ends_mid_request(40, "reset")

misbehave["half a request, then close"] = function(srv)
  local c = connect(srv)
  c:send("r1 MOVE apple fig 1\nr2 MOVE fi")
  assert.matches("^[OS][KH]", c:await("r1"))
  c:half_close()
  c:await_end()                         -- the half line is not a request
  assert.equal(1, #c.lines)
  c:close()
end

misbehave["no count, unknown item, x, -5, 1.5, MOVE x x, then half-close"] =
  function(srv)
    local c = connect(srv)
    for _, case in ipairs(BAD) do c:post(case[1]) end
    c:half_close()                      -- everything is answered, then EOF
    c:await_end()
    assert.equal("EOF", c.ended)
    assert.equal(#BAD, #c.lines)
    for i, case in ipairs(BAD) do
      assert.equal(case[2], c.reply["r" .. i])
    end
    c:close()
  end

--- Runs each misbehaviour (a name of `misbehave`) in its own coroutine;
-- returns a function telling whether all have finished.
local function run_all(srv, names)
  local left = #names
  for _, name in ipairs(names) do
    h.spawn(function()
      local ok, err = xpcall(misbehave[name], debug.traceback, srv)
      if not ok then error(name .. ": " .. tostring(err), 0) end
      left = left - 1
    end)
  end
  return function() return left == 0 end
end

--- A well-behaved customer: n orders on connection c, one at a time;
-- returns the units its BUYs were sold.
local function customer(c, n, seed)
  local items = { "apple", "fig", "kiwi", "pear" }
  local sold = 0
  for i = 1, n do
    local item = items[(seed + i) % 4 + 1]
    if (seed + i) % 5 == 0 then
      local to = items[(seed + i + 1) % 4 + 1]
      assert.matches("^[OS][KH]", c:request(("MOVE %s %s 2"):format(item, to)))
    else
      local reply = c:request(("BUY %s %d"):format(item, i % 3 + 1))
      local got = reply:match("^OK (%d+)$")
      if got then
        sold = sold + tonumber(got)
      else
        assert.matches("^SOLDOUT %d+$", reply)
      end
    end
  end
  return sold
end

-- }==========================================================


describe("examples/inventory.lua server", function()
  it("answers STOCK before any RESET, with the initial stock",
    with_server(function(srv)
      local c = connect(srv)
      assert.equal(FULL, c:request("STOCK"))
      c:close()
    end))

  it("refuses every bad request with an error line, changes nothing and "
    .. "keeps the connection", with_server(function(srv)
      local c = connect(srv)
      bad_requests(c)
      assert.equal(FULL, c:request("STOCK"))
      assert.equal("OK 2", c:request("BUY apple 2"))
      assert.equal("OK 1", c:request("MOVE fig kiwi 1"))
      assert.equal("STOCK apple=148 fig=149 kiwi=101 pear=100 sold=2",
        c:request("STOCK"))
      c:close()
    end))

  it("answers 3,000 requests that arrive in one piece", with_server(function(srv)
    -- Most are answered without waiting: serving them must not nest (it
    -- overflowed the C stack after about 200).  Fewer when every allocation
    -- here runs the collector (h.load).
    local n = math.max(400, h.load(3000))
    local c = connect(srv)
    local lines = {}
    for i = 1, n do
      lines[i] = ("r%d %s\n"):format(i, i % 3 == 0 and "STOCK" or "BUY banana 1")
    end
    c:send(table.concat(lines))
    h.wait_until(function() return #c.lines >= n end, 10000, n .. " replies")
    for i = 1, n do
      assert.equal(i % 3 == 0 and FULL or "ERROR unknown item banana",
        c.reply["r" .. i])
    end
    c:close()
  end))

  it("accepts a line of MAX_LINE bytes and CRLF line ends",
    with_server(function(srv)
      local c = connect(srv)
      local line = "r1 STOCK" .. (" "):rep(MAX_LINE - 8)
      assert.equal(MAX_LINE, #line)
      c:send(line .. "\n" .. "r2 STOCK\r\n")
      assert.equal(FULL, c:await("r1"))
      assert.equal(FULL, c:await("r2"))
      c:close()
    end))

  it("refuses a line one byte over MAX_LINE, after answering the requests "
    .. "before it, and closes only that connection", with_server(function(srv)
      local bystander = connect(srv)
      local c = connect(srv)
      c:send("r1 STOCK\n" .. ("y"):rep(MAX_LINE + 1) .. "\nr2 STOCK\n")
      c:await_end()
      table.sort(c.lines)                 -- replies come in any order
      assert.same({ TOO_LONG, "r1 " .. FULL }, c.lines)
      assert.equal(FULL, bystander:request("STOCK"))
      c:close()
      bystander:close()
    end))

  for _, name in ipairs({ "64 KiB line", "1 MiB line", "64 KiB line in 64 pieces" }) do
    it("refuses a " .. name .. " with an error and closes only that connection",
      with_server(function(srv)
        local bystander = connect(srv)
        local done = run_all(srv, { name })
        h.wait_until(done, 10000, name)
        assert.equal(FULL, bystander:request("STOCK"))
        bystander:close()
      end))
  end

  it("answers a client that closes its sending side, then closes",
    with_server(function(srv)
      local c = connect(srv)
      local texts = transfers(40)
      for _, text in ipairs(texts) do c:post(text) end
      c:half_close()
      c:await_end()
      assert.equal("EOF", c.ended)
      assert.equal(40, #c.lines)
      for i = 1, 40 do assert.matches("^[OS][KH]", c:await("r" .. i)) end
      c:close()
      assert_conserved(srv)
    end))

  for _, name in ipairs({ "close mid-request", "reset mid-request (ECONNRESET)",
    "reset before the replies (write error)", "half a request, then close" }) do
    it("ends only a client that does '" .. name .. "'; what it started "
      .. "finishes and stock is conserved", with_server(function(srv)
        local bystander = connect(srv)
        assert.equal("OK 0", bystander:request("RESET lock"))
        h.wait_until(run_all(srv, { name }), 5000, name)
        h.sleep(50)                     -- its transfers finish
        assert_conserved(srv)
        assert.matches("^STOCK ", bystander:request("STOCK"))
        bystander:close()
      end))
  end

  it("drops a client that leaves more than 64 KiB of replies unread",
    with_server(function(srv)
      local c = connect(srv)
      c.tcp:read_stop()
      -- Each request is answered at once with a reply of 1 KiB (its unknown
      -- command echoed); the kernel's buffers take some MiB of them first.
      local batch = ("r " .. ("X"):rep(1000) .. "\n"):rep(64)
      local sent = 0
      while not c.write_error and sent < 1000 do
        c:send(batch)
        sent = sent + 1
        h.sleep(1)
      end
      assert(c.write_error, "still connected after 64 MiB of unread replies")
      c:close()
      local bystander = connect(srv)
      assert.equal(FULL, bystander:request("STOCK"))
      bystander:close()
    end, { deadline = 20000 }))

  it("survives concurrent clients misbehaving in every way at once, "
    .. "and the books balance", with_server(function(srv)
      local admin = connect(srv)
      assert.equal("OK 0", admin:request("RESET lock"))
      -- well-behaved customers: 4 connections, 5 customers each
      local sold, running = 0, 0
      for conn = 1, 4 do
        local c, on_it = connect(srv), 5
        for k = 1, 5 do
          running = running + 1
          h.spawn(function()
            local got = customer(c, 12, conn * 10 + k)
            sold = sold + got             -- not `sold + customer()`: it yields
            running, on_it = running - 1, on_it - 1
            if on_it == 0 then c:close() end
          end)
        end
      end
      -- every misbehaviour twice, at the same time
      local names = {}
      for name in pairs(misbehave) do names[#names + 1] = name end
      table.sort(names)
      local done1 = run_all(srv, names)
      local done2 = run_all(srv, names)
      h.wait_until(function()
        return done1() and done2() and running == 0
      end, 20000, "all clients")
      h.sleep(50)                       -- transfers of dropped clients finish
      local stock = assert_conserved(srv)
      -- the misbehaving clients only ever moved units: every sale was seen
      assert.equal(sold, stock.sold)
      assert(sold > 0)
      admin:close()
    end, { deadline = 30000 }))
end)
