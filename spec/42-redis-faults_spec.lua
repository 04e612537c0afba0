-- async_mutex.redis under faults, with real servers killed (SIGKILL),
-- paused (SIGSTOP) and restarted (docs/redis.md, Failures; Timeouts and
-- back-off): every call ends exactly once, with E_UNAVAILABLE when the
-- server cannot answer, and the client recovers.

local uv = require "luv"
local h = require "helpers"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

local server = redis_server.for_each_test(before_each, after_each)

-- Starts n coroutines that each call c:call(...) once; returns the record
-- of their outcomes: r.done, r.ok, r.errs (E_UNAVAILABLE errors by their
-- reason, others by their text -> count).
local function callers(c, n, ...)
  local r = { done = 0, ok = 0, errs = {} }
  local args = table.pack(...)
  for _ = 1, n do
    h.spawn(function()
      local ok, err = pcall(c.call, c, table.unpack(args, 1, args.n))
      r.done = r.done + 1
      if ok then r.ok = r.ok + 1
      else
        local key = err == redis.E_UNAVAILABLE and err.reason or tostring(err)
        r.errs[key] = (r.errs[key] or 0) + 1
      end
    end)
  end
  return r
end

-- The only key of a record's errs, and its count.
local function only(errs)
  local k, v = next(errs)
  assert(next(errs, k) == nil, "more than one kind of error")
  return k, v
end

describe("a server killed with SIGKILL", function()
  it("fails each of 1,000 calls in flight with E_UNAVAILABLE; the next call reconnects",
    h.async(function()
      local c = redis.connect({ port = server.port, commandTimeout = math.huge })
      assert.equal("PONG", c:call("PING"))
      server:signal("STOP")                  -- the calls stay unanswered
      local n = h.load(1000)
      local r = callers(c, n, "INCR", "counter")
      h.sleep(10)                            -- written: in the server's socket
      assert.equal(n, c:pending())
      assert.equal(0, r.done)
      local walked = 0
      uv.walk(function() walked = walked + 1 end)   -- uv.walk is safe meanwhile
      assert.is_true(walked > 0)
      server:kill()
      h.wait_until(function() return r.done == n end, 5000)
      -- the stopped server had unread input: the kernel reset the connection
      local reason, count = only(r.errs)
      assert.equal(n, count)
      local addr = "127.0.0.1:" .. server.port
      assert.is_true(reason == "connection reset by " .. addr
        or reason == "connection closed by " .. addr, reason)
      assert.equal(0, c:pending())
      server:launch()
      assert.equal("PONG", c:call("PING"))
      c:close()
    end, { deadline = 20000 }))

  it("replaces a connection lost while idle at the next call", h.async(function()
    local c = redis.connect({ port = server.port })
    assert.equal("PONG", c:call("PING"))
    server:restart()
    h.sleep(10)                  -- a later loop turn: the connection is idle
    assert.equal("PONG", c:call("PING"))
    c:close()
  end))
end)

describe("a server stopped with SIGSTOP", function()
  it("makes waiting calls raise E_UNAVAILABLE after commandTimeout", h.async(function()
    local c = redis.connect({ port = server.port, commandTimeout = 200 })
    local t0 = uv.hrtime()                   -- before the last reply
    assert.equal("PONG", c:call("PING"))
    server:signal("STOP")
    local r = callers(c, 10, "PING")
    h.wait_until(function() return r.done == 10 end, 5000)
    assert.same({ ["no reply from 127.0.0.1:" .. server.port .. " within 200 ms"] = 10 }, r.errs)
    -- not before commandTimeout has passed since the last reply (1 ms: the
    -- loop clock counts whole milliseconds)
    assert.is_true(h.ms_since(t0) >= 199)
    server:signal("CONT")
    assert.equal("PONG", c:call("PING"))      -- a new connection
    c:close()
  end))

  it("keeps calls that get replies alive: the timeout counts from the last reply",
    h.async(function()
      local c = redis.connect({ port = server.port, commandTimeout = 300 })
      local stop = redis_server.pinging(c, 20)
      h.sleep(700)                             -- longer than commandTimeout
      assert.is_true(stop() > 5)
      c:close()
    end))
end)

describe("a connection that cannot be made", function()
  it("raises E_UNAVAILABLE when refused, then backs off before trying again",
    h.async(function()
      local port = redis_server.free_port()
      -- (a back-off longer than starting a redis-server takes on a loaded
      -- machine: 300 ms was not, and the second call found it up)
      local c = redis.connect({ port = port, reconnectDelay = 1500, reconnectDelayMax = 1500 })
      local ok, err = pcall(c.call, c, "PING")
      assert.is_false(ok)
      assert.equal(redis.E_UNAVAILABLE, err)
      local other = redis_server.start(port)
      -- within the back-off: no attempt, at once
      local polls = h.count_handles("uv_poll_t")
      ok, err = pcall(c.call, c, "PING")
      assert.is_false(ok)
      assert.equal(redis.E_UNAVAILABLE, err)
      assert.equal(polls, h.count_handles("uv_poll_t"))
      h.sleep(1520)
      assert.equal("PONG", c:call("PING"))
      c:close()
      other:stop()
    end))

  it("raises E_UNAVAILABLE within connectTimeout when nobody answers", h.async(function()
    -- an address no packet comes back from: the attempt hangs (or, with no
    -- route, fails at once)
    local c = redis.connect({ host = "10.255.255.1", port = 6379, connectTimeout = 100 })
    local r = callers(c, 3, "PING")
    h.wait_until(function() return r.done == 3 end, 3000)
    -- the reason names the address: most often "no connection to
    -- 10.255.255.1:6379 within 100 ms"; with no route, the error at once; on
    -- a network whose proxy answers every address, a protocol error
    local reason, count = only(r.errs)
    assert.equal(3, count)
    assert.truthy(reason:find("10.255.255.1:6379", 1, true), reason)
    c:close()
  end))
end)

describe("AUTH and SELECT", function()
  it("are sent on every connection", h.async(function()
    local secured = redis_server.start(nil, "--requirepass s3cret")
    local c = redis.connect({ port = secured.port, password = "s3cret", db = 3 })
    assert.equal("OK", c:call("SET", "where", "db3"))
    secured:restart()
    pcall(c.call, c, "PING")                   -- the lost connection
    assert.equal("PONG", c:call("PING"))      -- AUTH again, SELECT again
    assert.equal("OK", c:call("SET", "where", "db3 again"))
    local d = redis.connect({ port = secured.port, password = "s3cret" })
    assert.is_nil(d:call("GET", "where"))     -- db 0
    assert.equal("OK", d:call("SELECT", 3))
    assert.equal("db3 again", d:call("GET", "where"))
    c:close(); d:close()
    secured:stop()
  end))

  it("raise a refused AUTH in the calls, as the server's error", h.async(function()
    local secured = redis_server.start(nil, "--requirepass s3cret")
    local c = redis.connect({ port = secured.port, password = "wrong" })
    local ok, err = pcall(c.call, c, "PING")
    assert.is_false(ok)
    assert.equal("WRONGPASS", err.code)
    c:close()
    secured:stop()
  end))

  it("refuse bad options", function()
    assert.equal("bad argument #1 to 'connect' (db must be a non-negative integer)",
      h.error_of(function() redis.connect({ db = -1 }) end))
    assert.equal("bad argument #1 to 'connect' (password must be a string, got number)",
      h.error_of(function() redis.connect({ password = 1 }) end))
    assert.equal("bad argument #1 to 'connect' (username needs a password)",
      h.error_of(function() redis.connect({ username = "u" }) end))
    assert.equal("bad argument #1 to 'connect' (commandTimeout must be a positive number (math.huge: no timeout))",
      h.error_of(function() redis.connect({ commandTimeout = -1 }) end))
  end)
end)

describe("subscriptions across a server restart", function()
  it("are subscribed again once the server is back", h.async(function()
    local c = redis.connect({ port = server.port, reconnectDelay = 20, reconnectDelayMax = 50 })
    local got = {}
    local sub = c:subscribe("survive", function(m) got[#got + 1] = m end)
    assert.equal(1, c:call("PUBLISH", "survive", "before"))
    h.wait_until(function() return #got == 1 end)
    server:kill()
    h.sleep(100)                               -- attempts fail meanwhile
    server:launch()
    h.wait_until(function()
      local ok, n = pcall(c.call, c, "PUBLISH", "survive", "after")
      return ok and n == 1
    end, 3000)
    h.wait_until(function() return got[#got] == "after" end)
    sub:unsubscribe()
    c:close()
  end))
end)

describe("a client referred to only by its callers, with calls in flight", function()
  -- (docs/redis.md, "Closing and exiting": it is anchored while they
  -- wait; it used to be collected with them, and they were never resumed)
  it("is kept through collections while the server is silent, answers them, then is collected", function()
    local weak = setmetatable({}, { __mode = "v" })
    local c
    h.run(function()
      c = redis.connect({ port = server.port, commandTimeout = math.huge })
      assert.equal("PONG", c:call("PING"))
    end)
    server:signal("STOP")
    finally(function() server:signal("CONT") end)   -- (also when it fails)
    local answered = 0
    for _ = 1, 10 do
      h.spawn(function()
        if c:call("PING") == "PONG" then answered = answered + 1 end
      end)
    end
    assert.equal(10, c:pending())
    weak[1], c = c, nil
    h.gc()
    assert.is_not_nil(weak[1])                  -- its callers wait: kept
    assert.equal(1, #h.active_handles())        -- the poll handle, reading
    server:signal("CONT")
    h.run(function()
      h.wait_until(function() return answered == 10 end, 3000, "the replies")
    end)
    h.gc()
    assert.is_nil(weak[1])                      -- nothing waits: collected
    assert.same({}, h.active_handles())
    assert.is_true(h.run_loop(1000))
  end)
end)
