-- A client made with `sentinels` and `master` finds the master through
-- the sentinels and follows it (docs/redis.md, "Sentinel"; README,
-- "Scaling out").  Fake sentinels (spec/fake_redis.lua) name real servers
-- (spec/redis_server.lua), so that each answer a sentinel can give is made
-- on demand: a sentinel down, a master it does not know, one that names a
-- replica or a server that is down, `+switch-master`, a READONLY answer.
-- One real set (a master, 2 replicas, 3 sentinels: spec/redis_sentinel.lua)
-- checks the same against redis-server --sentinel.

local am = require "async_mutex"
local h = require "helpers"
local uv = require "luv"
local fake = require "fake_redis"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

-- A fake sentinel that names whatever `sen.named` says ({ host, port }, or
-- nil: master unknown), for the master `name`; `sen.conns` its clients'
-- subscribed connections (to publish +switch-master on).
local function fake_sentinel(name)
  local sen = { conns = {} }
  sen.srv = fake.start(function(conn, cmd)
    if cmd[1]:upper() == "SUBSCRIBE" then sen.conns[conn] = true end
    if cmd[1]:upper() == "SENTINEL" and cmd[2] == "get-master-addr-by-name" then
      if cmd[3] ~= name or not sen.named then return "*-1\r\n" end
      return fake.array({ sen.named[1], tostring(sen.named[2]) })
    end
    return fake.DEFAULT
  end)
  sen.port = sen.srv.port
  function sen.publish(message)
    for conn in pairs(sen.conns) do
      conn:write(fake.message("+switch-master", message))
    end
  end
  return sen
end

-- A fake sentinel of "mymaster" that names `port` on 127.0.0.1, and a
-- client that finds its master through it (`options`: more connect
-- options).  Returns the client and the sentinel.
local function through_sentinel(port, options)
  local sen = fake_sentinel("mymaster")
  sen.named = { "127.0.0.1", port }
  local o = { master = "mymaster", sentinels = { { host = "127.0.0.1", port = sen.port } } }
  for k, v in pairs(options or {}) do o[k] = v end
  return redis.connect(o), sen
end

-- The port of the server a client's calls reach.
local function port_of(c)
  return tonumber(c:call("CONFIG", "GET", "port")[2])
end

-- The same, or nil while the client finds no server.
local function status_port(c)
  local ok, port = pcall(port_of, c)
  return ok and port or nil
end

local function failure(c, ...)
  local ok, err = pcall(c.call, c, ...)
  assert.is_false(ok)
  assert.is_true(err == redis.E_UNAVAILABLE)
  return err.reason
end

describe("redis.connect with sentinels", function()
  local a, b, replica
  setup(function()
    a = redis_server.start()
    b = redis_server.start()
    replica = redis_server.start(nil, "--replicaof 127.0.0.1 " .. a.port)
  end)
  teardown(function()
    for _, s in ipairs({ a, b, replica }) do if s then s:stop() end end
  end)

  it("asks the sentinels in turn: one down, one that does not know the master, one that does",
    h.async(function()
      local unknown, knows = fake_sentinel("other"), fake_sentinel("mymaster")
      knows.named = { "127.0.0.1", a.port }
      local down = redis_server.free_port()
      local c = redis.connect { master = "mymaster", sentinels = {
        { host = "127.0.0.1", port = down }, { host = "127.0.0.1", port = unknown.port },
        { host = "127.0.0.1", port = knows.port } } }
      local _ <close> = h.closing(c, unknown.srv, knows.srv)
      assert.equal(a.port, port_of(c))
      assert.equal("master", c:call("ROLE")[1])
    end))

  it("says why when no sentinel can be reached, then backs off", h.async(function()
    local p1, p2 = redis_server.free_port(), redis_server.free_port()
    local c = redis.connect { master = "mymaster", reconnectDelay = 200, reconnectDelayMax = 200,
      sentinels = { { host = "127.0.0.1", port = p1 }, { host = "localhost", port = p2 } } }
    local _ <close> = h.closing(c)
    assert.equal(("no sentinel reachable: 127.0.0.1:%d (connection refused to 127.0.0.1:%d), "
      .. "localhost:%d (connection refused to localhost:%d)"):format(p1, p1, p2, p2),
      failure(c, "PING"))
    assert.matches("^no sentinel reachable: .* %(next attempt in %d+ ms%)$", failure(c, "PING"))
  end))

  it("says so when no sentinel knows the master", h.async(function()
    local sen = fake_sentinel("other")
    local c = redis.connect { master = "mymaster", reconnectDelay = 1,
      sentinels = { { host = "127.0.0.1", port = sen.port } } }
    local _ <close> = h.closing(c, sen.srv)
    assert.equal("master mymaster unknown to the sentinels", failure(c, "PING"))
  end))

  it("never uses a server that says it is a replica, nor one that is down", h.async(function()
    local c, sen = through_sentinel(replica.port, { reconnectDelay = 1 })
    local _ <close> = h.closing(c, sen.srv)
    assert.equal(("master mymaster at 127.0.0.1:%d says it is a slave"):format(replica.port),
      failure(c, "SET", "k", "v"))
    local gone = redis_server.free_port()
    sen.named = { "127.0.0.1", gone }
    h.sleep(5)                                     -- (the back-off: 1 ms)
    assert.equal(("master mymaster at 127.0.0.1:%d: connection refused to 127.0.0.1:%d"):format(
      gone, gone), failure(c, "SET", "k", "v"))
    sen.named = { "127.0.0.1", a.port }
    h.sleep(5)
    assert.equal("OK", c:call("SET", "k", "v"))
    assert.equal(a.port, port_of(c))
  end))

  it("many callers waiting for the search share it, and each gets its reply", h.async(function()
    local c, sen = through_sentinel(a.port)
    local _ <close> = h.closing(c, sen.srv)
    local tasks = {}
    for i = 1, 20 do
      tasks[i] = am.spawn(function() return c:call("ECHO", tostring(i)) end)
    end
    for i = 1, 20 do assert.equal(tostring(i), tasks[i]:join()) end
    local asked = 0
    for _, cmd in ipairs(sen.srv.commands) do
      if cmd[1] == "SENTINEL" then asked = asked + 1 end
    end
    assert.equal(1, asked)
  end))

  it("follows +switch-master: calls in flight raise E_UNAVAILABLE, the next ones reach the new master",
    h.async(function()
      local c, sen = through_sentinel(a.port)
      local _ <close> = h.closing(c, sen.srv)
      assert.equal(a.port, port_of(c))
      h.wait_until(function()
        for _, cmd in ipairs(sen.srv.commands) do
          if cmd[1] == "SUBSCRIBE" and cmd[2] == "+switch-master" then return true end
        end
      end, 2000, "the client watching +switch-master")
      local blocked = am.spawn(function()                -- in flight at the switch
        return pcall(c.call, c, "BLPOP", "nothing", "0")
      end)
      h.sleep(20)
      sen.named = { "127.0.0.1", b.port }
      sen.publish(("other 127.0.0.1 1 127.0.0.1 2"))     -- another master's: ignored
      sen.publish(("mymaster 127.0.0.1 %d 127.0.0.1 %d"):format(a.port, b.port))
      local ok, err = blocked:join()
      assert.is_false(ok)
      assert.is_true(err == redis.E_UNAVAILABLE)
      assert.equal(("master mymaster switched to 127.0.0.1:%d"):format(b.port), err.reason)
      assert.equal(b.port, port_of(c))
    end))

  it("takes READONLY as a demotion: E_UNAVAILABLE with the reason, then the master is found again",
    h.async(function()
      local c, sen = through_sentinel(replica.port, { reconnectDelay = 1 })
      -- a master that becomes a replica after the client confirmed it
      local d = redis_server.start()
      local ok, err = pcall(function()
        sen.named = { "127.0.0.1", d.port }
        assert.equal("OK", c:call("SET", "k", "1"))
        local admin = redis.connect { port = d.port }
        admin:call("REPLICAOF", "127.0.0.1", tostring(a.port))
        admin:close()
        sen.named = { "127.0.0.1", a.port }
        assert.equal(("master mymaster at 127.0.0.1:%d answered READONLY: a replica now"):format(
          d.port), failure(c, "SET", "k", "2"))
        assert.equal("OK", c:call("SET", "k", "3"))
        assert.equal(a.port, port_of(c))
        -- a client without sentinels raises READONLY as it is
        local plain = redis.connect { port = d.port }
        local ok2, e2 = pcall(plain.call, plain, "SET", "k", "4")
        assert.is_false(ok2)
        assert.equal("READONLY", e2.code)
        plain:close()
      end)
      c:close()
      sen.srv:stop()
      d:stop()
      assert(ok, err)
    end))

  it("moves its +switch-master watch to a sentinel that answers when the watched one is gone",
    h.async(function()
      local s1, s2 = fake_sentinel("mymaster"), fake_sentinel("mymaster")
      s1.named, s2.named = { "127.0.0.1", a.port }, { "127.0.0.1", a.port }
      local c = redis.connect { master = "mymaster", reconnectDelay = 1, sentinels = {
        { host = "127.0.0.1", port = s1.port }, { host = "127.0.0.1", port = s2.port } } }
      local _ <close> = h.closing(c, s1.srv, s2.srv)
      assert.equal(a.port, port_of(c))
      h.wait_until(function() return next(s1.conns) ~= nil end, 2000, "the watch on s1")
      s1.srv:stop()
      -- the connection to the master lost: the next call searches, and s2
      -- answers
      local admin = redis.connect { port = a.port }
      admin:call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
      admin:close()
      assert.equal(a.port, port_of(c))
      h.wait_until(function() return next(s2.conns) ~= nil end, 2000, "the watch on s2")
      s2.named = { "127.0.0.1", b.port }
      s2.publish(("mymaster 127.0.0.1 %d 127.0.0.1 %d"):format(a.port, b.port))
      h.wait_until(function() return status_port(c) == b.port end, 2000, "the switch to b")
    end))

  it("authenticates to the sentinels with sentinelPassword, to the master with password",
    h.async(function()
      local locked = redis_server.start(nil, "--requirepass spec200pw")
      local sen = fake_sentinel("mymaster")
      sen.named = { "127.0.0.1", locked.port }
      local ok, err = pcall(function()
        local c = redis.connect { master = "mymaster", password = "spec200pw",
          sentinelUsername = "watcher", sentinelPassword = "s3cret",
          sentinels = { { host = "127.0.0.1", port = sen.port } } }
        assert.equal(locked.port, port_of(c))
        c:close()
        local auths = {}
        for _, cmd in ipairs(sen.srv.commands) do
          if cmd[1] == "AUTH" then auths[#auths + 1] = table.concat(cmd, " ") end
        end
        assert.is_true(#auths >= 1)
        for _, line in ipairs(auths) do assert.equal("AUTH watcher s3cret", line) end
      end)
      sen.srv:stop()
      locked:stop()
      assert(ok, err)
    end))

  it("a client closed while callers wait for the search: they raise E_UNAVAILABLE", h.async(function()
    local c, sen = through_sentinel(a.port)
    local _ <close> = h.closing(c, sen.srv)
    local t = am.spawn(function() return pcall(c.call, c, "PING") end)
    c:close()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.is_true(err == redis.E_UNAVAILABLE)
    assert.equal("client closed", err.reason)
  end))

  -- The search runs in a task of its own; while it waits for ROLE, on a
  -- connection nothing else refers to, only the record it searches for
  -- holds it: a collection at that moment must not end it (its callers
  -- would wait for ever: make gcstress found it so).
  it("the search survives a full collection while it waits for the master's ROLE",
    h.async(function()
      local collected = 0
      local master = fake.start(function(_, cmd)
        if cmd[1]:upper() == "ROLE" then
          collectgarbage(); collectgarbage()
          collected = collected + 1
          return "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"
        end
        return fake.DEFAULT
      end)
      local c, sen = through_sentinel(master.port)
      local ok, err = pcall(c.call, c, "PING")
      c:close()
      sen.srv:stop()
      master:stop()
      assert(ok, err)
      assert.equal("PONG", err)
      assert.equal(1, collected)
    end, { deadline = 3000 }))

  it("pub/sub and the Redis locks follow the master too", h.async(function()
    local c, sen = through_sentinel(a.port)
    local admin = redis.connect { port = a.port }
    local other = redis.connect { port = b.port }
    local _ <close> = h.closing(c, admin, other, sen.srv)
    local got = {}
    local s = c:subscribe("spec200", function(m) got[#got + 1] = m end)
    local m = am.RedisMutex.new(c, "spec200:lock")
    m:runExclusive(function() end)
    admin:call("PUBLISH", "spec200", "one")
    h.wait_until(function() return #got == 1 end, 2000, "the message")
    -- the switch: the subscription and the lock go to b
    sen.named = { "127.0.0.1", b.port }
    sen.publish(("mymaster 127.0.0.1 %d 127.0.0.1 %d"):format(a.port, b.port))
    h.wait_until(function()
      return other:call("PUBSUB", "NUMSUB", "spec200")[2] == 1
    end, 3000, "the subscription on the new master")
    other:call("PUBLISH", "spec200", "two")
    h.wait_until(function() return #got == 2 end, 2000, "the message from the new master")
    assert.same({ "one", "two" }, got)
    m:runExclusive(function()
      assert.equal(1, other:call("EXISTS", "spec200:lock:h"))   -- (its holders, on b)
    end)
    s:unsubscribe()
  end))
end)

describe("redis.connect with real sentinels", function()
  local set
  setup(function() set = require("redis_sentinel").start { replicas = 2, sentinels = 3 } end)
  teardown(function() if set then set:stop() end end)

  it("finds the master with one sentinel down; uv.run() returns with the client left open",
    function()
      set.sentinels[1]:kill()
      local code = ([[
        local uv = require "luv"
        local redis = require "async_mutex.redis"
        local am = require "async_mutex"
        local c = redis.connect { master = "mymaster", sentinels = %s }
        am.spawn(function()
          assert(c:call("SET", "spec200", "x") == "OK")
          io.write(c:call("CONFIG", "GET", "port")[2], " ", c:call("ROLE")[1])
        end)
        uv.run()          -- the +switch-master watch keeps no loop running
      ]]):format(("{ {host='127.0.0.1',port=%d}, {host='127.0.0.1',port=%d},"
        .. " {host='127.0.0.1',port=%d} }"):format(set.sentinels[1].port, set.sentinels[2].port,
        set.sentinels[3].port))
      local r = h.subprocess(code, 20)
      set.sentinels[1]:launch()
      h.clean_exit(r, set.master.port .. " master")
    end)
end)
