-- Every E_UNAVAILABLE says why, and stays E_UNAVAILABLE (README, "Errors:
-- `redis.E_UNAVAILABLE`"; docs/redis.md, Failures): an error object whose
-- tostring is "redis server unavailable: " and the reason, equal (==) to
-- am.E_UNAVAILABLE and redis.E_UNAVAILABLE whatever the reason, read-only.
-- Each reason is made here as it happens: a port nobody listens on, a name
-- that does not resolve, a listener whose queue is full (the connect
-- hangs), servers that never answer, answer garbage or hang up (a fake one,
-- spec/fake_redis.lua), a real one killed, a client closed, the back-off.
-- Before, each read "redis server unavailable".

local am = require "async_mutex"
local h = require "helpers"
local uv = require "luv"
local fake = require "fake_redis"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

-- The error a call raises; that it is an E_UNAVAILABLE, as user code
-- compares it, and reads as one.
local function failure(c, ...)
  local ok, err = pcall(c.call, c, ...)
  assert.is_false(ok)
  assert.is_true(err == redis.E_UNAVAILABLE)
  assert.is_true(err == am.E_UNAVAILABLE)
  assert.is_true(am.E_UNAVAILABLE == err)
  assert.is_string(err.reason)
  assert.equal("redis server unavailable: " .. err.reason, tostring(err))
  assert.equal(tostring(err), err.message)
  return err
end

describe("E_UNAVAILABLE", function()
  it("is one constant for async_mutex and async_mutex.redis, with no reason", function()
    assert.is_true(rawequal(am.E_UNAVAILABLE, redis.E_UNAVAILABLE))
    assert.equal("redis server unavailable", tostring(am.E_UNAVAILABLE))
    assert.equal("redis server unavailable", am.E_UNAVAILABLE.message)
    assert.is_nil(am.E_UNAVAILABLE.reason)
    assert.equal("async_mutex.E_UNAVAILABLE", getmetatable(am.E_UNAVAILABLE).__name)
  end)

  it("with a reason: equal to the constant, not to a string, another table or error",
    h.async(function()
      local c = redis.connect({ port = redis_server.free_port() })
      local err = failure(c, "PING")
      local other = failure(c, "PING")          -- (the back-off's)
      assert.is_true(err == other)
      assert.is_false(rawequal(err, am.E_UNAVAILABLE))
      assert.is_false(err == "redis server unavailable")
      assert.is_false(err == tostring(err))
      assert.is_false(err == {})
      assert.is_false(err == am.E_TIMEOUT)
      assert.is_false(err == redis.connect)
      -- plain fields: what a logger that walks the table shows
      local fields = {}
      for k, v in pairs(err) do fields[k] = v end
      assert.same({ message = tostring(err), reason = err.reason }, fields)
      c:close()
    end))

  it("raised by a Redis lock whose client is closed while it waits: 'client closed'",
    h.async(function()
      local server = redis_server.start()
      local a = redis.connect({ port = server.port })
      local b = redis.connect({ port = server.port })
      local held = am.RedisMutex.new(a, "spec105:lock"):acquire()
      local err
      h.spawn(function()
        local m = am.RedisMutex.new(b, "spec105:lock")
        local ok, e = pcall(m.acquire, m)
        assert.is_false(ok)
        err = e
      end)
      h.sleep(50)                          -- queued in Redis, waiting
      b:close()
      h.wait_until(function() return err ~= nil end, 2000)
      assert.is_true(err == am.E_UNAVAILABLE)
      assert.equal("client closed", err.reason)
      assert.equal("redis server unavailable: client closed", tostring(err))
      held()
      a:close()
      server:stop()
    end))
end)

describe("the reason of an E_UNAVAILABLE", function()
  it("for a port nobody listens on: connection refused, then the back-off", h.async(function()
    local port = redis_server.free_port()
    local c = redis.connect({ port = port, reconnectDelay = 1000, reconnectDelayMax = 1000 })
    assert.equal("connection refused to 127.0.0.1:" .. port, failure(c, "PING").reason)
    assert.matches("^connection refused to 127%.0%.0%.1:" .. port .. " %(next attempt in %d+ ms%)$",
      failure(c, "PING").reason)
    c:close()
  end))

  it("for a unix socket that is not there", h.async(function()
    local c = redis.connect({ path = "/nonexistent/spec105.sock" })
    assert.equal("no socket at /nonexistent/spec105.sock", failure(c, "PING").reason)
    c:close()
  end))

  it("for a host name that does not resolve (in a coroutine, and outside one)", function()
    local ok, err = pcall(redis.connect, { host = "no-such-host.invalid" })
    assert.is_false(ok)
    assert.is_true(err == redis.E_UNAVAILABLE)
    assert.matches("^name not resolved: no%-such%-host%.invalid %(E[%u_]+%)$", err.reason)
    h.run(function()
      ok, err = pcall(redis.connect, { host = "no-such-host.invalid" })
    end)
    assert.is_false(ok)
    assert.matches("^name not resolved: no%-such%-host%.invalid %(E[%u_]+%)$", err.reason)
  end)

  it("for a connect that does not complete within connectTimeout", h.async(function()
    -- a listener whose queue is full: libuv holds the first connection,
    -- the kernel's queue (backlog 0) the second, and a third SYN is dropped
    local srv = uv.new_tcp()
    assert(srv:bind("127.0.0.1", 0))
    assert(srv:listen(0, function() end))
    local port = srv:getsockname().port
    local fillers = {}
    for i = 1, 2 do
      fillers[i] = uv.new_tcp()
      fillers[i]:connect("127.0.0.1", port, function() end)
      h.sleep(30)
    end
    local c = redis.connect({ port = port, connectTimeout = 100 })
    local t0 = uv.hrtime()
    assert.equal("no connection to 127.0.0.1:" .. port .. " within 100 ms", failure(c, "PING").reason)
    assert.is_true(h.ms_since(t0) >= 99)
    c:close()
    for _, f in ipairs(fillers) do f:close() end
    srv:close()
  end))

  it("for a server that never answers: no reply within commandTimeout, to every call waiting",
    h.async(function()
      local srv = fake.start(function() return nil end)
      local c = redis.connect({ port = srv.port, commandTimeout = 150 })
      local reasons = {}
      for i = 1, 3 do
        h.spawn(function() reasons[i] = failure(c, "PING").reason end)
      end
      h.wait_until(function() return #reasons == 3 end, 3000)
      local expected = "no reply from 127.0.0.1:" .. srv.port .. " within 150 ms"
      assert.same({ expected, expected, expected }, reasons)
      c:close()
      srv:stop()
    end))

  it("for a server whose answer is not Redis's protocol", h.async(function()
    local srv = fake.start(function() return "hello\r\n" end)
    local c = redis.connect({ port = srv.port })
    assert.equal(("protocol error from 127.0.0.1:%d (Protocol error, got \"h\" as reply type byte)")
      :format(srv.port), failure(c, "PING").reason)
    c:close()
    srv:stop()
  end))

  it("for a server that hangs up", h.async(function()
    local srv = fake.start(function(conn) conn:close() end)
    local c = redis.connect({ port = srv.port })
    assert.equal("connection closed by 127.0.0.1:" .. srv.port, failure(c, "PING").reason)
    c:close()
    srv:stop()
  end))

  it("for a server killed with calls unread: reset", function()
    -- (a real server, stopped so that the calls stay unread, then killed:
    -- the kernel resets the connection, spec 71's way)
    local server = redis_server.start()
    local reason
    local body_ok, body_err = pcall(h.run, function()
      local c = redis.connect({ port = server.port, commandTimeout = math.huge })
      assert.equal("PONG", c:call("PING"))
      server:signal("STOP")
      h.spawn(function() reason = failure(c, "PING").reason end)
      h.sleep(20)
      server:kill()
      h.wait_until(function() return reason ~= nil end, 5000)
      c:close()
    end)
    server:stop()
    assert(body_ok, body_err)
    assert.equal("connection reset by 127.0.0.1:" .. server.port, reason)
  end)

  it("for a client closed while the call waits, and the host as the user wrote it",
    h.async(function()
      local srv = fake.start(function() return nil end)
      local c = redis.connect({ host = "localhost", port = srv.port })
      local reason
      h.spawn(function() reason = failure(c, "PING").reason end)
      h.sleep(10)
      c:close()
      assert.equal("client closed", reason)
      local d = redis.connect({ host = "localhost", port = redis_server.free_port(),
                                reconnectDelay = 0 })
      assert.matches("^connection refused to localhost:%d+$", failure(d, "PING").reason)
      d:close()
      srv:stop()
    end))
end)
