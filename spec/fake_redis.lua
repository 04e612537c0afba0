-- A fake Redis server written with luv, on this process's loop, for the
-- cases a real server cannot make on demand: a reply cut or malformed, a
-- connection closed or reset at a chosen command, a burst of pub/sub
-- messages, a SUBSCRIBE refused.  It reads requests in the protocol's form
-- (arrays of bulk strings) and answers each with what `handler` returns.
--
--   local fake = require "fake_redis"
--   local srv = fake.start(function(conn, cmd) ... end)   -- cmd = { "PING", ... }
--   srv.port; srv.commands (every command received, in order); srv:stop()
--
-- handler(conn, cmd) returns the bytes to send (a string; nil: nothing);
-- conn:write(bytes) and conn:close() act at once.  Without a handler, or when it
-- returns fake.DEFAULT, the answer is Redis's own for PING, ECHO, SET, GET,
-- INCR (a counter per key), SUBSCRIBE, UNSUBSCRIBE, PUBLISH (0) and AUTH /
-- SELECT (+OK); -ERR for anything else.

local uv = require "luv"

local M = { DEFAULT = {} }

-- libuv writes with write(): a reply to a client that has gone would
-- raise SIGPIPE, and end this process.  A luv signal handle catches it
-- while a server runs (unreferenced: it keeps no loop running; closed
-- with the last server).
local sigpipe, running = nil, 0

function M.bulk(s) return ("$%d\r\n%s\r\n"):format(#s, s) end
function M.array(items)
  local out = { ("*%d\r\n"):format(#items) }
  for _, it in ipairs(items) do
    out[#out + 1] = type(it) == "number" and (":%d\r\n"):format(it) or M.bulk(it)
  end
  return table.concat(out)
end
function M.message(channel, payload) return M.array({ "message", channel, payload }) end

-- Redis's answer to the commands the client and its locks use here.
local function default_reply(srv, cmd)
  return M.reply(srv, cmd)
end

--- Redis's answer to cmd on srv (what a handler returning fake.DEFAULT
-- sends).
function M.reply(srv, cmd)
  local name = (cmd[1] or ""):upper()
  if name == "PING" then return "+PONG\r\n"
  elseif name == "ECHO" then return M.bulk(cmd[2] or "")
  elseif name == "SET" or name == "AUTH" or name == "SELECT" then return "+OK\r\n"
  elseif name == "GET" then
    local v = srv.data[cmd[2]]
    return v and M.bulk(v) or "$-1\r\n"
  elseif name == "INCR" then
    local v = (tonumber(srv.data[cmd[2]]) or 0) + 1
    srv.data[cmd[2]] = tostring(v)
    return (":%d\r\n"):format(v)
  elseif name == "SUBSCRIBE" or name == "UNSUBSCRIBE" then
    local out = {}
    for i = 2, #cmd do
      out[#out + 1] = M.array({ name:lower(), cmd[i], i - 1 })
    end
    return table.concat(out)
  elseif name == "PUBLISH" then return ":0\r\n"
  end
  return "-ERR unknown command '" .. tostring(cmd[1]) .. "'\r\n"
end

-- Takes the complete requests from the front of buf: returns the list of
-- commands and what is left.
local function parse(buf)
  local cmds, pos = {}, 1
  while true do
    local n, after = buf:match("^%*(%d+)\r\n()", pos)
    if not n then break end
    local cmd, p, complete = {}, after, true
    for _ = 1, tonumber(n) do
      local len, data = buf:match("^%$(%d+)\r\n()", p)
      if not len then complete = false break end
      len = tonumber(len)
      if #buf < data + len + 1 then complete = false break end
      cmd[#cmd + 1] = buf:sub(data, data + len - 1)
      p = data + len + 2
    end
    if not complete then break end
    cmds[#cmds + 1] = cmd
    pos = p
  end
  return cmds, buf:sub(pos)
end

local Conn = {}
Conn.__index = Conn

function Conn:write(bytes)
  if not self.closed then self.tcp:write(bytes) end
end

function Conn:close()
  if self.closed then return end
  self.closed = true
  self.tcp:read_stop()
  self.tcp:close()
end

local Server = {}
Server.__index = Server

function Server:stop()
  for conn in pairs(self.conns) do conn:close() end
  if self.tcp:is_closing() then return end
  self.tcp:close()
  running = running - 1
  if running == 0 and sigpipe then
    sigpipe:close()
    sigpipe = nil
  end
end

--- Starts a server on a free loopback port.
function M.start(handler)
  if not sigpipe then
    sigpipe = uv.new_signal()
    sigpipe:start("sigpipe", function() end)
    sigpipe:unref()
  end
  running = running + 1
  local srv = setmetatable({ conns = {}, commands = {}, data = {} }, Server)
  srv.tcp = uv.new_tcp()
  assert(srv.tcp:bind("127.0.0.1", 0))
  srv.port = srv.tcp:getsockname().port
  assert(srv.tcp:listen(128, function(err)
    assert(not err, err)
    local tcp = uv.new_tcp()
    srv.tcp:accept(tcp)
    local conn = setmetatable({ tcp = tcp, server = srv, buf = "" }, Conn)
    srv.conns[conn] = true
    tcp:read_start(function(rerr, data)
      if rerr or not data then
        srv.conns[conn] = nil
        conn:close()
        return
      end
      conn.buf = conn.buf .. data
      local cmds
      cmds, conn.buf = parse(conn.buf)
      for _, cmd in ipairs(cmds) do
        if conn.closed then break end
        srv.commands[#srv.commands + 1] = cmd
        local out = M.DEFAULT
        if handler then out = handler(conn, cmd) end
        if out == M.DEFAULT then out = default_reply(srv, cmd) end
        if out and not conn.closed then conn:write(out) end
      end
    end)
  end))
  return srv
end

return M
