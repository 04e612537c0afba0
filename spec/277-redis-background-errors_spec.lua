-- The Redis locks' background requests (releases, withdrawals, renewals,
-- a Redlock's fence raised on a late server) drop their outcomes: nobody
-- waits for their results (src/async_mutex/redis_lock_hub.lua,
-- background).  An outcome is an E_UNAVAILABLE or an error reply; any
-- other error is a fault, written to stderr with its traceback, not lost
-- and not handed to the error handler.  Also an error raised after the request yielded: a client
-- closed while the request waits makes the call raise when the client
-- resumes it, and that error must not reach the error handler as if the
-- program had failed.  Before, it did (spec 194 under ASan: a Redlock's
-- catch-up RAISE on a client that a restart closed).

local base = require "async_mutex.redis_lock_base"

local h, redis, server = require("redis_server").spec_file(setup, teardown)

-- Runs fn(reported) with the error handler and io.stderr both caught;
-- returns what each received.
local function caught(fn)
  local reported, written = {}, {}
  local stderr = io.stderr
  io.stderr = { write = function(self, ...)   -- luacheck: ignore 122 (caught, then put back)
    for _, v in ipairs({ ... }) do written[#written + 1] = tostring(v) end
    return self
  end }
  local ok, err = pcall(h.with_handler, function(e) reported[#reported + 1] = tostring(e) end, fn)
  io.stderr = stderr                         -- luacheck: ignore 122
  if not ok then error(err, 0) end
  return reported, table.concat(written)
end

describe("a background request of the Redis locks", function()
  it("drops an error raised after it yielded (its client closed meanwhile)", h.async(function()
    local reported, written = caught(function()
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
    assert.equal("", written)
  end))

  it("drops an error the call itself raises after the yield", h.async(function()
    local reported, written = caught(function()
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
    assert.equal("", written)
  end))

  it("writes any other error to stderr with its traceback, before or after a yield", h.async(function()
    local ended = false
    local reported, written = caught(function()
      base.background(function() error("spec277 fault at once") end)
      base.background(function()
        h.sleep(5)
        ended = true
        local t = nil
        return t.field                          -- a fault after the yield
      end)
      h.wait_until(function() return ended end)
      h.tick(2)
    end)
    assert.same({}, reported)
    assert.matches("async_mutex: error in a Redis lock's background request: "
      .. "[^\n]*spec277 fault at once\nstack traceback:\n", written)
    assert.matches("async_mutex: error in a Redis lock's background request: "
      .. "[^\n]*attempt to index a nil value %(local 't'%)\nstack traceback:\n.-277%-redis", written)
  end))
end)
