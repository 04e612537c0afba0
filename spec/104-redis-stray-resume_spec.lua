-- A coroutine waiting in the Redis client and resumed by someone else's
-- coroutine.resume goes on waiting, as one waiting in the core's locks does
-- (docs/semantics.md, "Spurious resumes"; docs/redis.md, Calls): the stray
-- resume returns true and nothing else, and the wait ends as it would
-- have.  Before, client:call returned the stray resume's own argument, and
-- every later call of that coroutine got the reply of the one before it;
-- subscribe returned before the server had confirmed; connect, waiting
-- for its host name, raised E_UNAVAILABLE.

local am = require "async_mutex"

local h, redis, server = require("redis_server").spec_file(setup, teardown)

describe("a stray coroutine.resume", function()
  it("of a caller waiting in client:call: it goes on waiting for its own reply", h.async(function()
    local c = redis.connect({ port = server.port })
    local other = redis.connect({ port = server.port })
    local replies = {}
    local co = coroutine.create(function()
      replies[1] = c:call("BLPOP", "spec104:list", 0)
      replies[2] = c:call("PING")
      replies[3] = c:call("ECHO", "three")
    end)
    assert(coroutine.resume(co))
    h.sleep(10)
    assert.same({ true }, { coroutine.resume(co, "stray", "values") })
    assert.same({ true }, { coroutine.resume(co) })
    assert.equal("suspended", coroutine.status(co))
    assert.equal(1, other:call("LPUSH", "spec104:list", "x"))
    h.wait_until(function() return coroutine.status(co) == "dead" end)
    assert.same({ "spec104:list", "x", n = 2 }, replies[1])
    assert.equal("PONG", replies[2])
    assert.equal("three", replies[3])
    c:close(); other:close()
  end))

  it("of a caller waiting in subscribe: it returns once the server has confirmed", h.async(function()
    local c = redis.connect({ port = server.port })
    local sub
    local co = coroutine.create(function()
      sub = c:subscribe("spec104", function() end)
    end)
    assert(coroutine.resume(co))
    assert.same({ true }, { coroutine.resume(co, "stray") })
    assert.equal("suspended", coroutine.status(co))
    h.wait_until(function() return coroutine.status(co) == "dead" end)
    assert.equal("async_mutex.redis.Subscription", getmetatable(sub).__name)
    assert.equal(1, c:call("PUBLISH", "spec104", "m"))   -- confirmed: counted
    sub:unsubscribe()
    c:close()
  end))

  it("of redis.connect waiting for its host name: it goes on waiting", function()
    local client, err
    local co
    h.run(function()
      co = coroutine.create(function()
        local ok
        ok, client = pcall(redis.connect, { host = "localhost", port = server.port })
        if not ok then err, client = client, nil end
      end)
      assert(coroutine.resume(co))
      if coroutine.status(co) == "suspended" then    -- (a cached answer: at once)
        assert.same({ true }, { coroutine.resume(co, "stray") })
      end
      h.wait_until(function() return coroutine.status(co) == "dead" end)
      assert.is_nil(err)
      assert.equal("PONG", client:call("PING"))
      client:close()
    end)
  end)
end)
