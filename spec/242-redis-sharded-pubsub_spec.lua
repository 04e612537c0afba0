-- Sharded pub/sub (SSUBSCRIBE / SPUBLISH, Redis 7): on one server
-- (client:ssubscribe) and on a cluster of 3 masters started for this file,
-- where the subscription follows its channel's slot to a new owner
-- (docs/redis.md, "Pub/sub" and "Cluster").

local h = require "helpers"
local redis_server = require "redis_server"
local redis_cluster_server = require "redis_cluster_server"
local redis = require "async_mutex.redis"

local server, cluster

setup(function()
  server = redis_server.start()
  cluster = redis_cluster_server.start(3)
end)
teardown(function()
  if server then server:stop() end
  if cluster then cluster:stop() end
end)

describe("sharded pub/sub", function()
  it("ssubscribe on one server: shard and classic channels apart", h.async(function()
    local c = redis.connect({ port = server.port })
    local _ <close> = h.closing(c)
    local got = {}
    local s1 = c:ssubscribe("ch", function(m, ch) got[#got + 1] = "s " .. ch .. " " .. m end)
    local s2 = c:subscribe("ch", function(m, ch) got[#got + 1] = "c " .. ch .. " " .. m end)
    assert.equal(1, c:call("SPUBLISH", "ch", "1"))
    assert.equal(1, c:call("PUBLISH", "ch", "2"))
    h.wait_until(function() return #got == 2 end, 2000, "2 messages")
    table.sort(got)
    assert.same({ "c ch 2", "s ch 1" }, got)
    s1:unsubscribe()
    h.wait_until(function() return c:call("SPUBLISH", "ch", "x") == 0 end, 2000, "unsubscribed")
    assert.equal(1, c:call("PUBLISH", "ch", "3"))
    s2:unsubscribe()
    h.raises_at_caller { function() c:ssubscribe(1, print) end,
      "bad argument #1 to 'ssubscribe' (string expected, got number)" }
  end))

  it("on a cluster: on the channel's master, and again on its next owner", h.async(function()
    local c = redis.connect({ cluster = cluster.seeds })
    local _ <close> = h.closing(c)
    local got = {}
    local s = c:ssubscribe("{news}", function(m) got[#got + 1] = m end)
    assert.equal(1, c:call("SPUBLISH", "{news}", "a"))
    h.wait_until(function() return #got == 1 end, 2000, "a")
    -- the slot goes to another master: the old one ends the subscription
    local slot = c:keyslot("{news}")
    local masters = c:masters()
    local from
    for i, m in ipairs(masters) do
      if pcall(m.call, m, "GET", "{news}") then from = i end
    end
    local to = masters[from % 3 + 1]
    local id = to:call("CLUSTER", "MYID")
    for _, m in ipairs(masters) do
      assert.equal("OK", m:call("CLUSTER", "SETSLOT", slot, "NODE", id))
    end
    h.wait_until(function()
      return to:call("SPUBLISH", "{news}", "b") == 1
    end, 5000, "subscribed at the new owner")
    h.wait_until(function() return got[#got] == "b" end, 2000, "b")
    s:unsubscribe()
    h.wait_until(function() return to:call("SPUBLISH", "{news}", "c") == 0 end, 2000,
      "unsubscribed")
    h.raises_at_caller { function() c:ssubscribe("x", 1) end,
      "bad argument #2 to 'ssubscribe' (function expected, got number)" }
  end))
end)
