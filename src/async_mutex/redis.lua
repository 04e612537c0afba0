--- async_mutex.redis: a Redis client on luv's loop, driven by hiredis.
-- The C part (async_mutex.redis_core) owns the connection, the FIFO of
-- waiting coroutines and the yield and resume of `call`; this layer
-- resolves host names with luv, gives the C part its luv poll handles
-- (through luv's Lua API), and composes calls into `eval`.
-- See docs/redis.md.

local core = require "async_mutex.redis_core"
local uv = require "luv"

local error, getmetatable, ipairs, pcall, rawget, setmetatable, tostring, type =
  error, getmetatable, ipairs, pcall, rawget, setmetatable, tostring, type
local running, yield, resume, isyieldable =
  coroutine.running, coroutine.yield, coroutine.resume, coroutine.isyieldable
local mtype, unpack, traceback = math.type, table.unpack, debug.traceback

local M = {
  E_UNAVAILABLE = core.E_UNAVAILABLE,
}

local Client = core.Client               -- the methods of every client

local function typename(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__name")) == "string"
    and mt.__name or type(v)
end

-- Raises an argument error at 'level' (1 = the caller of argerror).
local function argerror(level, n, fname, msg)
  error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), level + 1)
end


-- {========================================================== hooks
-- What the C part calls: its poll handles, made and driven through
-- luv's Lua API, and the report of an error escaping a coroutine it
-- resumed.

local hooks = core.hooks
local onpoll = core.onpoll
local WEAK_K, WEAK_V = { __mode = "k" }, { __mode = "v" }
local callbacks = setmetatable({}, WEAK_K)  -- poll handle -> its callback

-- open(fd, client, state): the poll handle of a new connection.  Its
-- callback holds the client weakly, so that an idle client that nobody
-- references can be collected (its __gc closes the handle).
function hooks.open(fd, client, state)
  local poll = uv.new_socket_poll(fd)
  local ref = setmetatable({ client }, WEAK_V)
  callbacks[poll] = function(err, events)
    local c = ref[1]
    if c then onpoll(c, err, events) end
  end
  state.poll = poll
end

function hooks.start(poll, events)
  poll:start(events, callbacks[poll])
end

function hooks.stop(poll)
  poll:stop()
end

function hooks.close(poll)
  if not poll:is_closing() then poll:close() end
end

-- An error escaped a coroutine resumed with a reply: it goes to the
-- handler set with async_mutex.setErrorHandler, as the locks' do.
function hooks.report(err, tb)
  local am = package.loaded.async_mutex
  local handler
  if type(am) == "table" and am.setErrorHandler then
    handler = am.setErrorHandler(nil)
    am.setErrorHandler(handler)
  end
  if handler then
    local ok, herr = pcall(handler, err, tb)
    if ok then return end
    tb = tb .. "\nand in the error handler: " .. tostring(herr)
  end
  io.stderr:write("async_mutex.redis: error in a resumed coroutine: ", tb, "\n")
end

-- }==========================================================


-- {========================================================== connect

-- The numeric address of `host`: at once when it is one already; else
-- by luv's asynchronous getaddrinfo when called in a coroutine (which
-- waits), or its synchronous form outside one.  IPv4 is preferred.
local function resolve(host)
  local hints = { socktype = "stream", numerichost = true }
  local res = uv.getaddrinfo(host, nil, hints)
  if not res then
    hints.numerichost = nil
    local co, main = running()
    if main or not isyieldable() then
      res = uv.getaddrinfo(host, nil, hints)
    else
      local done, waiting = false, false
      uv.getaddrinfo(host, nil, hints, function(_, r)
        res, done = r, true
        if waiting then
          local ok, err = resume(co)
          if not ok then hooks.report(err, traceback(co, tostring(err))) end
        end
      end)
      if not done then
        waiting = true
        yield()
      end
    end
  end
  if type(res) ~= "table" or not res[1] then return nil end
  for _, a in ipairs(res) do
    if a.family == "inet" then return a.addr end
  end
  return res[1].addr
end

--- Creates a client for the server at `options.host`/`options.port` or
-- at the unix socket `options.path`.  Connects at the first call.
function M.connect(options)
  if type(options) ~= "table" then
    argerror(2, 1, "connect", "table expected, got " .. typename(options))
  end
  local state = {}
  if options.path ~= nil then
    if type(options.path) ~= "string" then
      argerror(2, 1, "connect", "path must be a string, got " .. typename(options.path))
    end
    state.path = options.path
  else
    local host, port = options.host, options.port
    if host == nil then host = "127.0.0.1" end
    if port == nil then port = 6379 end
    if type(host) ~= "string" then
      argerror(2, 1, "connect", "host must be a string, got " .. typename(host))
    end
    if mtype(port) == "float" and port == port // 1 then port = port // 1 end
    if mtype(port) ~= "integer" or port < 1 or port > 65535 then
      argerror(2, 1, "connect", "port must be an integer from 1 to 65535")
    end
    state.host = resolve(host)
    if not state.host then error(M.E_UNAVAILABLE, 0) end
    state.port = port
  end
  return core.new(state)
end

-- }==========================================================


-- {========================================================== eval

-- script -> its SHA1 as the server computed it (SCRIPT LOAD)
local shas = setmetatable({}, WEAK_K)

local function check_list(list, n, what)
  if list == nil then return 0 end
  if type(list) ~= "table" then
    argerror(3, n, "eval", ("table of %s expected, got %s"):format(what, typename(list)))
  end
  local len = #list
  for i = 1, len do
    local t = type(list[i])
    if t ~= "string" and t ~= "number" then
      argerror(3, n, "eval", ("%s[%d] must be a string or number, got %s"):format(
        what, i, typename(list[i])))
    end
  end
  return len
end

local function is_noscript(err)
  return getmetatable(err) == getmetatable(core.error("NOSCRIPT x"))
    and err.code == "NOSCRIPT"
end

--- Runs a Lua script on the server: EVALSHA, and EVAL when the server
-- does not know the script (NOSCRIPT: restarted, flushed).
function Client.eval(self, script, keys, args)
  if type(script) ~= "string" then
    argerror(2, 1, "eval", "string expected, got " .. typename(script))
  end
  local nk = check_list(keys, 2, "keys")
  local na = check_list(args, 3, "args")
  local argv = { "EVALSHA", false, nk }
  for i = 1, nk do argv[3 + i] = keys[i] end
  for i = 1, na do argv[3 + nk + i] = args[i] end
  local n = 3 + nk + na
  local sha = shas[script]
  if sha then
    argv[2] = sha
    local res = table.pack(pcall(self.call, self, unpack(argv, 1, n)))
    if res[1] then return res[2] end
    if not is_noscript(res[2]) then error(res[2], 0) end
  end
  argv[1], argv[2] = "EVAL", script
  local reply = self:call(unpack(argv, 1, n))
  if not sha then
    -- the next time: EVALSHA with the SHA1 the server computes
    local ok, s = pcall(self.call, self, "SCRIPT", "LOAD", script)
    if ok then shas[script] = s end
  end
  return reply
end

-- }==========================================================

-- Versioned values for optimistic concurrency (docs/optimistic.md).
M.versioned = require("async_mutex.versioned").versioned

return M
