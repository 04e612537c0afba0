-- The Redis locks' background requests (releases, withdrawals, renewals,
-- a Redlock's fence raised on a late server) drop their errors: nobody
-- waits for their results (src/async_mutex/redis_lock_hub.lua,
-- background).  Also an error raised after the request yielded: a client
-- closed while the request waits makes the call raise when the client
-- resumes it, and that error must not reach the error handler as if the
-- program had failed.  Before, it did (spec 194 under ASan: a Redlock's
-- catch-up RAISE on a client that a restart closed).

local h = require "helpers"
local redis = require "async_mutex.redis"
local base = require "async_mutex.redis_lock_base"
local redis_server = require "redis_server"

local server = redis_server.for_file(setup, teardown)

describe("a background request of the Redis locks", function()
  it("drops an error raised after it yielded (its client closed meanwhile)", h.async(function()
    local reported = {}
    h.with_handler(function(err) reported[#reported + 1] = tostring(err) end, function()
      local c = redis.connect({ port = server.port })
      local ended = false
      base.background(function()
        local ok, err = pcall(c.call, c, "BLPOP", "spec277:none", 5)
        ended = true
        error(ok and "BLPOP answered" or err, 0)   -- raised after the yield
      end)
      h.sleep(20)
      assert.is_false(ended)                        -- waiting in Redis
      c:close()
      h.wait_until(function() return ended end)
      h.tick(2)
    end)
    assert.same({}, reported)
  end))

  it("drops an error the call itself raises after the yield", h.async(function()
    local reported = {}
    h.with_handler(function(err) reported[#reported + 1] = tostring(err) end, function()
      local c = redis.connect({ port = server.port })
      local started = false
      base.background(function(...)
        started = true
        return c:call(...)                          -- raises: closed below
      end, "BLPOP", "spec277:none", 5)
      h.sleep(20)
      assert.is_true(started)
      c:close()
      h.tick(3)
    end)
    assert.same({}, reported)
  end))
end)
