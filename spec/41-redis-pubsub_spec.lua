-- async_mutex.redis: subscriptions, on the client's second connection
-- (docs/redis.md, Pub/sub), against a real redis-server.

local redis_server = require "redis_server"
local am = require "async_mutex"

local h, redis, server, client, with = redis_server.spec_file(setup, teardown)

describe("client:subscribe", function()
  it("delivers messages to fn(message, channel) once the server confirmed", with.client(function(c)
    local got = {}
    local sub = c:subscribe("news", function(message, channel)
      got[#got + 1] = channel .. "=" .. message
    end)
    assert.equal(1, c:call("PUBLISH", "news", "one"))
    assert.equal(1, c:call("PUBLISH", "news", "two\0bin"))
    h.wait_until(function() return #got == 2 end)
    assert.same({ "news=one", "news=two\0bin" }, got)
    sub:unsubscribe()
  end))

  it("shares one connection between subscriptions, and a channel between callbacks",
    with.client(function(c)
      local a, b, d = 0, 0, 0
      local s1 = c:subscribe("x", function() a = a + 1 end)
      local s2 = c:subscribe("x", function() b = b + 1 end)
      local s3 = c:subscribe("y", function() d = d + 1 end)
      assert.equal(1, h.count_handles("uv_poll_t"))    -- the call connection is not open yet
      assert.equal(1, c:call("PUBLISH", "x", "m"))    -- one subscriber connection
      assert.equal(1, c:call("PUBLISH", "y", "m"))
      h.wait_until(function() return a == 1 and b == 1 and d == 1 end)
      s1:unsubscribe()
      assert.equal(1, c:call("PUBLISH", "x", "m"))
      h.wait_until(function() return b == 2 end)
      assert.equal(1, a)
      s2:unsubscribe(); s3:unsubscribe()
      s2:unsubscribe()                                 -- twice: nothing
      h.wait_until(function() return c:call("PUBLISH", "x", "m") == 0 end)
    end))

  it("runs each callback in a coroutine of its own, which may call Redis", with.client(function(c)
    local seen
    local sub = c:subscribe("ask", function(message)
      seen = c:call("ECHO", "re:" .. message)
    end)
    c:call("PUBLISH", "ask", "q")
    h.wait_until(function() return seen ~= nil end)
    assert.equal("re:q", seen)
    sub:unsubscribe()
  end))

  it("keeps the loop alive while subscribed, and lets it end after", function()
    local uv = require "luv"
    local c, active_then
    local ended = h.run(function()
      c = client()
      local sub = c:subscribe("alive", function() end)
      local t = uv.new_timer()
      t:start(50, 0, function()       -- the loop still runs: the subscription
        t:close()
        active_then = #h.active_handles()
        sub:unsubscribe()
      end)
      return true
    end)
    assert.is_true(ended)
    assert.equal(2, active_then)      -- the subscriber's poll handle and ping timer (t is closing)
    assert.same({}, h.active_handles())
    c:close()
  end)

  it("never subscribes a coroutine closed while it waits for the confirmation", function()
    local c = client()
    local calls = 0
    local co = coroutine.create(function()
      c:subscribe("closed-early", function() calls = calls + 1 end)
    end)
    assert.is_true(coroutine.resume(co))
    assert.equal("suspended", coroutine.status(co))   -- waiting for the server
    assert.is_true(coroutine.close(co))
    local published
    -- h.run fails on its deadline if the subscription kept the loop alive
    h.run(function()
      h.sleep(50)
      published = c:call("PUBLISH", "closed-early", "m")
      h.sleep(50)
    end)
    assert.equal(0, published)
    assert.equal(0, calls)
    assert.same({}, h.active_handles())
    c:close()
  end)

  it("calls a callable table as fn", with.client(function(c)
    local got
    local fn = setmetatable({}, { __call = function(_, message, channel)
      got = channel .. "=" .. message
    end })
    local sub = c:subscribe("callable", fn)
    c:call("PUBLISH", "callable", "m")
    h.wait_until(function() return got ~= nil end)
    assert.equal("callable=m", got)
    sub:unsubscribe()
  end))

  it("closes a callback's coroutine, or subscribe's, that dies with an error: its <close> "
    .. "releasers run", h.async(function()
    local c = client()
    local m = am.Mutex.new()
    local reported, sub = {}, nil
    h.with_handler(function(err) reported[#reported + 1] = tostring(err) end, function()
      sub = c:subscribe("dies", function()
        local release <close> = m:acquire()
        c:call("PING")                        -- resumed by the reply
        error("in the callback", 0)
      end)
      c:call("PUBLISH", "dies", "m")
      h.wait_until(function() return #reported == 1 end)
      assert.is_false(m:isLocked())
      am.spawn(function()
        local release <close> = m:acquire()
        c:subscribe("confirmed", function() end)   -- resumed by the confirmation
        error("after subscribe", 0)
      end)
      h.wait_until(function() return #reported == 2 end)
      assert.is_false(m:isLocked())
    end)
    assert.same({ "in the callback", "after subscribe" }, reported)
    sub:unsubscribe()
    c:close()
  end))

  it("reports an error in a callback to the error handler, and goes on", with.client(function(c)
    local errors, got = {}, 0
    local prev = am.setErrorHandler(function(err) errors[#errors + 1] = err end)
    local sub = c:subscribe("bad", function(m)
      got = got + 1
      if m == "boom" then error("boom", 0) end
    end)
    c:call("PUBLISH", "bad", "boom")
    c:call("PUBLISH", "bad", "fine")
    h.wait_until(function() return got == 2 end)
    am.setErrorHandler(prev)
    assert.same({ "boom" }, errors)
    sub:unsubscribe()
  end))

  it("ends with close(): subscriptions stop, the handles close", h.async(function()
    local c = client()
    c:subscribe("closing", function() end)
    c:close()
    assert.same({}, h.active_handles())
    assert.equal("attempt to use a closed redis client",
      h.error_of(function() c:subscribe("closing", function() end) end))
  end))

  it("ends with the client when the client is collected", function()
    local weak = setmetatable({}, { __mode = "v" })
    local c = client()
    local subscribed = false
    coroutine.wrap(function()
      c:subscribe("gone", function() end)
      subscribed = true
    end)()
    h.run_loop(200)                     -- the subscription keeps it running
    assert.is_true(subscribed)
    assert.equal(2, #h.active_handles())   -- the subscriber's poll handle and ping timer
    weak[1], c = c, nil
    h.gc()
    assert.is_nil(weak[1])
    assert.same({}, h.active_handles())
    assert.is_true(h.run_loop(1000))
  end)

  -- As a waiting call (spec 40): a coroutine waiting in subscribe for the
  -- confirmation, holding its client in a local only, is kept, and the
  -- client with it, through a full collection.
  it("keeps a coroutine waiting for the confirmation, and its client, through a collection",
    h.async(function()
      local weak = setmetatable({}, { __mode = "v" })
      local confirmed, got, finished = false, nil, false
      local stopped = false
      local ok, err = pcall(function()
        do
          local c = client()
          weak.client = c
          assert.equal("PONG", c:call("PING"))
          server:signal("STOP")               -- no confirmation until CONT
          stopped = true
          am.spawn(function()
            local sub = c:subscribe("kept", function(message) got = message end)
            confirmed = true
            assert.equal(1, c:call("PUBLISH", "kept", "m"))
            h.wait_until(function() return got ~= nil end)
            sub:unsubscribe()
            c:close()
            finished = true
          end)
        end
        h.sleep(50)                           -- it waits for the confirmation
        assert.is_false(confirmed)
        h.gc()
        assert.is_not_nil(weak.client)
        server:signal("CONT")
        stopped = false
        h.wait_until(function() return finished end, 5000, "the confirmation and the message")
      end)
      if stopped then server:signal("CONT") end
      assert(ok, err)
      assert.is_true(confirmed)
      assert.equal("m", got)
      h.gc()
      assert.is_nil(weak.client)
    end))

  it("refuses bad input", with.client(function(c)
    assert.equal("bad argument #1 to 'subscribe' (string expected, got number)",
      h.error_of(function() c:subscribe(1, function() end) end))
    assert.equal("bad argument #2 to 'subscribe' (function expected, got nil)",
      h.error_of(function() c:subscribe("ch") end))
    assert.equal("bad argument #1 to 'subscribe' (async_mutex.redis.Client expected, got table)",
      h.error_of(function() c.subscribe({}, "ch", print) end))
    local sub = c:subscribe("ch", print)
    assert.equal("bad argument #1 to 'unsubscribe' (async_mutex.redis.Subscription expected, got table)",
      h.error_of(function() sub.unsubscribe({}) end))
    sub:unsubscribe()
  end))

  it("raises outside a coroutine", function()
    local c = client()
    assert.equal("attempt to subscribe outside a coroutine",
      h.error_of(function() c:subscribe("ch", print) end))
    c:close()
  end)

  it("raises E_UNAVAILABLE when the subscriber connection fails before the confirmation "
    .. "(a wrong password), and leaves nothing running", function()
    local secured = redis_server.start(nil, "--requirepass s3cret")
    local ok, err
    local body_ok, body_err = pcall(h.run, function()
      local c = redis.connect({ port = secured.port, password = "wrong" })
      ok, err = pcall(c.subscribe, c, "locked-out", function() end)
      c:close()
    end)
    secured:stop()
    assert(body_ok, body_err)
    assert.is_false(ok)
    assert.equal(redis.E_UNAVAILABLE, err)
    assert.matches("^set%-up refused by 127%.0%.0%.1:%d+ %(WRONGPASS ", err.reason)
  end)

  it("raises E_UNAVAILABLE when the server cannot be reached", h.async(function()
    local c = redis.connect({ port = redis_server.free_port() })
    local ok, err = pcall(c.subscribe, c, "nobody", print)
    assert.is_false(ok)
    assert.equal(redis.E_UNAVAILABLE, err)
    c:close()
  end))
end)

-- A TCP relay on the loop, between the client and the server, that can
-- go silent: its connections stay open but carry nothing more, as through
-- a network that drops everything (no FIN, no RST).  Connections made
-- after that are relayed again.
local function relay(target_port)
  local uv = require "luv"
  local r = { pairs = {} }
  local listener = uv.new_tcp()
  assert(listener:bind("127.0.0.1", 0))
  r.port = listener:getsockname().port
  local function close(hd) if not hd:is_closing() then hd:close() end end
  assert(listener:listen(16, function()
    local p = { down = uv.new_tcp(), up = uv.new_tcp(), silent = false }
    r.pairs[#r.pairs + 1] = p
    listener:accept(p.down)
    local function pipe(from, to)
      from:read_start(function(_, data)
        if data == nil then close(p.down); close(p.up)
        elseif not p.silent then to:write(data) end
      end)
    end
    p.up:connect("127.0.0.1", target_port, function(err)
      if err then close(p.down); close(p.up); return end
      pipe(p.down, p.up)
      pipe(p.up, p.down)
    end)
  end))
  function r.silence() for _, p in ipairs(r.pairs) do p.silent = true end end
  function r.close()
    close(listener)
    for _, p in ipairs(r.pairs) do close(p.down); close(p.up) end
  end
  return r
end

describe("the subscriber's health check", function()
  it("notices a connection that went silent, and subscribes again on a new one", h.async(function()
    local r = relay(server.port)
    local c = redis.connect({ port = r.port, pingInterval = 100, commandTimeout = 1000 })
    local publisher = client()
    local got = {}
    local sub = c:subscribe("quiet", function(message) got[#got + 1] = message end)
    assert.equal(1, publisher:call("PUBLISH", "quiet", "before"))
    h.wait_until(function() return #got == 1 end)
    r.silence()                           -- the subscriber now hears nothing
    -- the server drops the silent subscriber (its output buffer never
    -- drains) only much later: a delivery proves a new connection
    local n = 0
    h.wait_until(function()
      n = n + 1
      publisher:call("PUBLISH", "quiet", "after " .. n)
      return #got > 1
    end, 5000, "no message through a new subscriber connection")
    assert.matches("^after %d+$", got[2])
    sub:unsubscribe()
    c:close(); publisher:close()
    r.close()
  end, { deadline = 10000 }))

  it("is off with pingInterval = math.huge, and refuses a pingInterval that is not positive", h.async(function()
    assert.equal("bad argument #1 to 'connect' (pingInterval must be a positive number (math.huge: no ping))",
      h.error_of(function() client({ pingInterval = 0 }) end))
    local on, off = client(), client({ pingInterval = math.huge })
    local s1 = on:subscribe("calm", function() end)
    h.tick()                        -- the confirmation's timeout timer stops
    assert.equal(1, h.count_handles("uv_timer_t", true))     -- its ping timer
    local s2 = off:subscribe("calm", function() end)
    h.tick()
    assert.equal(1, h.count_handles("uv_timer_t", true))
    s1:unsubscribe()
    assert.equal(0, h.count_handles("uv_timer_t", true))
    s2:unsubscribe()
    on:close(); off:close()
  end))
end)
