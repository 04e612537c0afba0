-- async_mutex.redis on a Redis Cluster: redis.connect{cluster = ...}
-- against 3 real masters started for this file (docs/redis.md, "Cluster"):
-- slots and hash tags as the server computes them, the routing of every
-- kind of command (key positions from the server's COMMAND table), MOVED
-- and ASK during a live slot migration under many pipelined calls (no
-- call lost, duplicated or out of order), seeds down, CLUSTERDOWN, and
-- the usage errors at the caller's line.

local h = require "helpers"
local redis_cluster_server = require "redis_cluster_server"
local redis = require "async_mutex.redis"
local am = require "async_mutex"

local cluster = redis_cluster_server.for_file(setup, teardown, 3)

local function connect(extra) return cluster:connect(extra) end

-- The master (an ordinary client from c:masters()) that holds `key`: the
-- only one whose own EXISTS answers without a MOVED.
local function holder(c, key)
  local found
  for i, m in ipairs(c:masters()) do
    local ok, n = pcall(m.call, m, "EXISTS", key)
    if ok and n == 1 then
      assert(found == nil, "key on two masters")
      found = i
    end
  end
  return found
end

describe("redis cluster client", function()
  it("computes slots as the server does (CRC16, hash tags)", h.async(function()
    local c = connect()
    assert.equal(12739, c:keyslot("123456789"))
    for _, key in ipairs({ "foo", "123456789", "{user1000}.following", "{user1000}.followers",
        "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{", "}{", "", "x{}", "\0\255{\1}" }) do
      assert.equal(c:call("CLUSTER", "KEYSLOT", key), c:keyslot(key), key)
    end
    assert.equal(c:keyslot("{user1000}.following"), c:keyslot("{user1000}.followers"))
    assert.equal(c:keyslot("42"), c:keyslot(42))
    c:close()
  end))

  it("routes every kind of command to the master of its keys' slot", h.async(function()
    local c = connect()
    -- one key
    assert.equal("OK", c:call("SET", "foo", "bar"))
    assert.equal("bar", c:call("GET", "foo"))
    -- several keys, one slot (step 1, and step 2 for MSET)
    assert.equal("OK", c:call("MSET", "{a}1", 1, "{a}2", 2))
    assert.same({ "1", "2", n = 2 }, c:call("MGET", "{a}1", "{a}2"))
    -- the keys before a last argument (BLPOP's last key is -2)
    c:call("RPUSH", "{q}2", "x")
    assert.same({ "{q}2", "x", n = 2 }, c:call("BLPOP", "{q}1", "{q}2", 1))
    -- a subcommand's key (OBJECT ENCODING, XINFO STREAM)
    assert.equal("embstr", c:call("OBJECT", "ENCODING", "foo"))
    c:call("XADD", "stream", "*", "f", "v")
    assert.equal(1, c:call("XINFO", "STREAM", "stream")[2])
    -- movable keys (COMMAND GETKEYS): ZUNIONSTORE, EVAL sent by call
    c:call("ZADD", "{z}1", 1, "m")
    assert.equal(1, c:call("ZUNIONSTORE", "{z}d", 1, "{z}1"))
    assert.equal("bar", c:call("EVAL", "return redis.call('GET', KEYS[1])", 1, "foo"))
    -- no key: any master; an unknown command: the server's error
    assert.equal("PONG", c:call("PING"))
    local err = h.error_of(function() c:call("NOSUCHCOMMAND", "x") end)
    assert.matches("^ERR unknown command", tostring(err))
    -- eval by its keys
    assert.equal("bar", c:eval("return redis.call('GET', KEYS[1])", { "foo" }))
    assert.equal(3, c:eval("return 3"))
    -- each key is on the master of its slot, and only there
    for _, key in ipairs({ "foo", "{a}1", "{z}d", "stream" }) do
      local i = holder(c, key)
      assert.is_not_nil(i, key)
    end
    -- keys spread over every master
    for i = 1, 300 do c:call("SET", "spread:" .. i, i) end
    local total = 0
    for _, m in ipairs(c:masters()) do
      local n = #m:call("KEYS", "spread:*")
      assert.is_true(n > 50, "a master holds " .. n .. " of 300 keys")
      total = total + n
    end
    assert.equal(300, total)
    c:close()
  end))

  it("delivers pub/sub messages (subscribe, PUBLISH on any node)", h.async(function()
    local c = connect()
    local got = {}
    local s = c:subscribe("news", function(msg) got[#got + 1] = msg end)
    for _, m in ipairs(c:masters()) do m:call("PUBLISH", "news", "from " .. m:call("CLUSTER", "MYID")) end
    h.wait_until(function() return #got == 3 end, 2000, "3 messages")
    s:unsubscribe()
    c:close()
  end))

  it("raises usage errors at the caller's line", h.async(function()
    local c = connect()
    h.raises_at_caller { function() c:call("MGET", "a", "b") end,
      "bad argument #4 to 'call' (key \"b\" is in slot 3300, not in slot 15495 of key \"a\":"
      .. " on a cluster a command's keys share one slot (a hash tag: {...}))" }
    h.raises_at_caller { function() c:call("ZUNIONSTORE", "{z}d", 2, "{z}1", "other") end,
      "bad argument #6 to 'call' (key \"other\" is in slot 11361, not in slot 8157 of key"
      .. " \"{z}d\": on a cluster a command's keys share one slot (a hash tag: {...}))" }
    h.raises_at_caller { function() c:eval("return 1", { "a", "b" }) end,
      "bad argument #2 to 'eval' (keys[2] \"b\" is in slot 3300, not in slot 15495 of"
      .. " keys[1] \"a\": on a cluster a script's keys share one slot (a hash tag: {...}))" }
    h.raises_at_caller { function() c:call("MULTI") end,
      "bad argument #2 to 'call' (MULTI is not sent by a cluster client (docs/redis.md,"
      .. " \"Cluster\"))" }
    h.raises_at_caller { function() c:call("GET", {}) end,
      "bad argument #3 to 'call' (string or number expected, got table)" }
    h.raises_at_caller { function() c:call() end,
      "bad argument #2 to 'call' (string or number expected, got no value)" }
    h.raises_at_caller { function() c:eval(1) end,
      "bad argument #1 to 'eval' (string expected, got number)" }
    h.raises_at_caller { function() c:eval("return 1", { {} }) end,
      "bad argument #2 to 'eval' (keys[1] must be a string or number, got table)" }
    h.raises_at_caller { function() c:subscribe(1, print) end,
      "bad argument #1 to 'subscribe' (string expected, got number)" }
    h.raises_at_caller { function() c.call(1, "PING") end,
      "bad argument #1 to 'call' (async_mutex.redis.ClusterClient expected, got number)" }
    h.raises_at_caller { function() redis.connect({ cluster = {} }) end,
      "bad argument #1 to 'connect' (cluster must be a non-empty list of {host =, port =})" }
    h.raises_at_caller { function() redis.connect({ cluster = { { port = "x" } } }) end,
      "bad argument #1 to 'connect' (cluster[1] must be {host = string, port = integer"
      .. " from 1 to 65535})" }
    h.raises_at_caller { function() redis.connect({ cluster = cluster.seeds, db = 1 }) end,
      "bad argument #1 to 'connect' (cluster excludes db)" }
    h.raises_at_caller { function() redis.connect({ cluster = cluster.seeds, port = 1 }) end,
      "bad argument #1 to 'connect' (cluster excludes port)" }
    h.raises_at_caller { function() redis.connect({ cluster = cluster.seeds, tll = 1 }) end,
      "bad argument #1 to 'connect' (unknown option 'tll'; options: cluster, commandTimeout,"
      .. " connectTimeout, password, pingInterval, reconnectDelay, reconnectDelayMax, username)" }
    h.raises_at_caller { function() redis.connect({ cluster = cluster.seeds, commandTimeout = 0 }) end,
      "bad argument #1 to 'connect' (commandTimeout must be a positive number (math.huge: no timeout))" }
    c:close()
    h.raises_at_caller { function() c:call("PING") end, "attempt to use a closed redis client" }
    h.raises_at_caller { function() c:eval("return 1") end, "attempt to use a closed redis client" }
  end))

  it("refuses calls outside a coroutine at the caller's line", function()
    local c = connect()
    h.raises_at_caller { function() c:call("PING") end, "attempt to call redis outside a coroutine" }
    c:close()
  end)

  it("finds the cluster when some seeds are down; E_UNAVAILABLE when all are",
    h.async(function()
      local dead = require("redis_server").free_port()
      local seeds = { { host = "127.0.0.1", port = dead } }
      for i, s in ipairs(cluster.seeds) do seeds[i + 1] = s end
      local c = redis.connect({ cluster = seeds })
      assert.equal("OK", c:call("SET", "seeded", 1))
      c:close()
      local none = redis.connect({ cluster = { { host = "127.0.0.1", port = dead } } })
      local err = h.error_of(function() none:call("GET", "x") end)
      assert.equal(redis.E_UNAVAILABLE, err)
      assert.equal("no node of the cluster gave its slots (127.0.0.1:" .. dead
        .. ": redis server unavailable: connection refused to 127.0.0.1:" .. dead .. ")",
        err.reason)
      none:close()
    end))

  it("closes: calls in flight on every node raise E_UNAVAILABLE", h.async(function()
    local c = connect()
    c:call("PING")
    local results = {}
    for i = 1, 30 do
      h.spawn(function()
        local ok, err = pcall(c.call, c, "BLPOP", "nothing:" .. i, 0)
        results[#results + 1] = not ok and err == redis.E_UNAVAILABLE
      end)
    end
    h.wait_until(function() return c:pending() == 30 end, 2000, "30 calls in flight")
    c:close()
    h.wait_until(function() return #results == 30 end, 2000, "30 results")
    for _, r in ipairs(results) do assert.is_true(r) end
  end))

  it("follows a slot migrated under pipelined calls: ASK, then MOVED; nothing lost,"
    .. " duplicated or out of order", h.async(function()
    local c = connect()
    local slot = c:keyslot("{m}")
    local masters = c:masters()
    local from, to, other
    for i, m in ipairs(masters) do
      local ok = pcall(m.call, m, "GET", "{m}probe")
      if ok then from = i end
    end
    to = from % 3 + 1
    other = 6 - from - to
    local A, B, C = masters[from], masters[to], masters[other]
    local idA, idB = A:call("CLUSTER", "MYID"), B:call("CLUSTER", "MYID")
    local portB = cluster.nodes[1].port
    for _, n in ipairs(cluster.nodes) do
      if cluster:id(_) == idB then portB = n.port end
    end
    local WORKERS, after = 40, h.load(60)
    local migrated = false
    local counts, failures, live = {}, {}, WORKERS + 1
    for w = 1, WORKERS do
      h.spawn(function()
        local key, n, extra = "{m}w" .. w, 0, 0
        while not migrated or extra < after do
          local ok, v = pcall(c.call, c, "INCR", key)
          if not ok then failures[#failures + 1] = tostring(v) break end
          n = n + 1
          if v ~= n then failures[#failures + 1] = ("%s: %s after %d"):format(key, v, n - 1) break end
          if migrated then extra = extra + 1 end
        end
        counts[w] = n
        live = live - 1
      end)
    end
    -- a multi-key reader: TRYAGAIN while its keys are split, then on
    h.spawn(function()
      while not migrated do
        local ok, v = pcall(c.call, c, "MGET", "{m}w1", "{m}w2")
        if not ok then failures[#failures + 1] = "MGET: " .. tostring(v) break end
      end
      live = live - 1
    end)
    h.sleep(50)
    assert.equal("OK", B:call("CLUSTER", "SETSLOT", slot, "IMPORTING", idA))
    assert.equal("OK", A:call("CLUSTER", "SETSLOT", slot, "MIGRATING", idB))
    -- the keys go over a few at a time, while the workers go on
    while true do
      local keys = A:call("CLUSTER", "GETKEYSINSLOT", slot, 4)
      if #keys == 0 then break end
      A:call("MIGRATE", "127.0.0.1", portB, "", 0, 5000, "KEYS", table.unpack(keys, 1, #keys))
      h.sleep(5)
    end
    for _, m in ipairs({ B, A, C }) do
      assert.equal("OK", m:call("CLUSTER", "SETSLOT", slot, "NODE", idB))
    end
    migrated = true
    h.wait_until(function() return live == 0 end, 20000, "workers done")
    assert.same({}, failures)
    for w = 1, WORKERS do
      assert.equal(tostring(counts[w]), B:call("GET", "{m}w" .. w))
    end
    local moved, asked = c:redirections()
    local total = 0
    for w = 1, WORKERS do total = total + counts[w] end
    assert.is_true(total >= WORKERS * after, "calls: " .. total)
    assert.is_true(moved > 0, "no MOVED followed")
    assert.is_true(asked > 0, "no ASK followed")
    c:close()
  end, { deadline = 40000 }))

  -- last: it takes a slot from the cluster, then gives it back
  it("retries CLUSTERDOWN a bounded number of times, then raises E_UNAVAILABLE with"
    .. " the cause", h.async(function()
    local c = connect()
    local slot = c:keyslot("down")
    c:call("SET", "down", 1)
    local owner = holder(c, "down")
    local m = c:masters()[owner]
    local ids = {}
    for i = 1, 3 do ids[i] = cluster:id(i) end
    local myid = m:call("CLUSTER", "MYID")
    for i = 1, 3 do cluster:cli(i, "cluster delslots " .. slot) end
    local t0 = require("luv").now()
    local err = h.error_of(function() c:call("GET", "down") end)
    assert.equal(redis.E_UNAVAILABLE, err)
    assert.matches("^GET failed 8 times: CLUSTERDOWN ", err.reason)
    assert.is_true(require("luv").now() - t0 >= 3000)
    -- given back while a call retries: the call succeeds
    for i = 1, 3 do cluster:cli(i, "cluster delslots " .. slot) end
    local done
    h.spawn(function() done = { pcall(c.call, c, "SET", "down", 2) } end)
    h.sleep(100)
    assert.is_nil(done)
    for i = 1, 3 do
      if ids[i] == myid then cluster:cli(i, "cluster addslots " .. slot) end
    end
    for i = 1, 3 do cluster:cli(i, "cluster setslot " .. slot .. " node " .. myid) end
    h.wait_until(function() return done ~= nil end, 5000, "the retried call")
    assert.same({ true, "OK" }, done)
    c:close()
  end, { deadline = 20000 }))
end)
