-- A SUBSCRIBE the server refuses (docs/redis.md, Pub/sub): an ACL that
-- denies the channel makes Redis answer the command with one error
-- (NOPERM).  subscribe raises that error at once, and the subscriber
-- connection and its other channels go on.  Before, the error was taken
-- for nothing: the caller waited the whole commandTimeout, got
-- E_UNAVAILABLE, and the connection was rebuilt, the other subscriptions
-- losing what was published meanwhile.  A channel refused when it is
-- subscribed again after a lost connection is reported to the error
-- handler; the others come back.

local am = require "async_mutex"
local h = require "helpers"
local uv = require "luv"
local redis_server = require "redis_server"
local redis = require "async_mutex.redis"

local server, admin

setup(function()
  server = redis_server.start()
  h.run(function()
    admin = redis.connect({ port = server.port })
    admin:call("ACL", "SETUSER", "limited", "on", ">pw", "~*", "resetchannels", "&allowed:*", "+@all")
  end)
end)
teardown(function()
  if admin then admin:close() end
  if server then server:stop() end
end)

-- The ids of the server's pub/sub connections.
local function pubsub_ids()
  local ids = {}
  for id in admin:call("CLIENT", "LIST", "TYPE", "pubsub"):gmatch("id=(%d+)") do
    ids[#ids + 1] = id
  end
  return table.concat(ids, ",")
end

describe("a SUBSCRIBE the server refuses", function()
  it("raises the server's error at once; the connection and the other channels go on",
    h.async(function()
      local c = redis.connect({ port = server.port, username = "limited", password = "pw",
                                commandTimeout = 3000 })
      local got = {}
      local s1 = c:subscribe("allowed:1", function(m) got[#got + 1] = m end)
      local before = pubsub_ids()
      local t0 = uv.hrtime()
      local ok, err = pcall(c.subscribe, c, "denied", function() end)
      local ms = h.ms_since(t0)
      assert.is_false(ok)
      assert.equal("NOPERM", err.code)
      assert.matches("no permissions", err.message)
      assert.is_true(ms < 1000 * h.TIME_SCALE, ("raised after %.0f ms"):format(ms))
      assert.equal(1, admin:call("PUBLISH", "allowed:1", "still here"))
      h.wait_until(function() return #got == 1 end)
      assert.same({ "still here" }, got)
      assert.equal(before, pubsub_ids())        -- the same connection
      -- the refused channel left nothing behind; it may be tried again
      ok, err = pcall(c.subscribe, c, "denied", function() end)
      assert.equal("NOPERM", err.code)
      local s2 = c:subscribe("allowed:2", function(m) got[#got + 1] = m end)
      assert.equal(1, admin:call("PUBLISH", "allowed:2", "two"))
      h.wait_until(function() return #got == 2 end)
      s1:unsubscribe(); s2:unsubscribe()
      c:close()
    end))

  it("after a lost connection: the refused channel is reported, the others come back",
    h.async(function()
      local c = redis.connect({ port = server.port, username = "limited", password = "pw",
                                reconnectDelay = 10 })
      local got = {}
      local s1 = c:subscribe("allowed:1", function(m) got[#got + 1] = "1 " .. m end)
      local s2 = c:subscribe("allowed:2", function(m) got[#got + 1] = "2 " .. m end)
      local reported = {}
      h.with_handler(function(err, tb)
        reported[#reported + 1] = tostring(err.code) .. " " .. tb:match("^[^\n]*")
      end, function()
        -- allowed:2 denied from now on (Redis ends the connection itself)
        admin:call("ACL", "SETUSER", "limited", "resetchannels", "&allowed:1")
        admin:call("CLIENT", "KILL", "TYPE", "pubsub")
        h.wait_until(function() return #reported == 1 end, 5000)
        h.wait_until(function()
          return admin:call("PUBLISH", "allowed:1", "back") == 1
        end, 5000)
        h.wait_until(function() return got[#got] == "1 back" end)
      end)
      assert.same({ "NOPERM subscription to channel 'allowed:2' refused: NOPERM this user "
        .. "has no permissions to access one of the channels used as arguments" }, reported)
      admin:call("ACL", "SETUSER", "limited", "resetchannels", "&allowed:*")
      s1:unsubscribe(); s2:unsubscribe()
      c:close()
    end))
end)
