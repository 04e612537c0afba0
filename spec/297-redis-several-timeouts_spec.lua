-- Timeouts of several clients, and leases of several locks, of one
-- process (docs/redis.md, "Timeouts and back-off"): a client with a short
-- commandTimeout fails at its own time while another waits longer, a
-- client that gets replies does not extend another's count, and each
-- lease is renewed and lost at its own time.

local redis_server = require "redis_server"
local am = require "async_mutex"
local uv = require "luv"

-- two servers: 'stopped' is SIGSTOPped in the tests, and let go (CONT) by
-- each before it ends
local h, redis, live = redis_server.spec_file(setup, teardown)
local stopped = redis_server.for_file(setup, teardown)

describe("the command timeouts of several clients", function()
  it("fails a client with a short commandTimeout on time while another one waits longer",
    h.async(function()
      -- the long one begins to wait first (5 s)
      local long = redis.connect({ port = live.port, commandTimeout = 5000 })
      local short = redis.connect({ port = stopped.port, commandTimeout = 200 })
      -- connected, and both idle
      for _ = 1, 2 do
        assert.equal("PONG", long:call("PING"))
        assert.equal("PONG", short:call("PING"))
        h.sleep(20)
      end
      local blocked
      h.spawn(function() blocked = { pcall(long.call, long, "BLPOP", "spec290:none", "2") } end)
      h.sleep(20)                               -- long is waiting (BLPOP for 2 s)
      stopped:signal("STOP")
      local t0 = uv.hrtime()
      local ok, err = pcall(short.call, short, "PING")
      local ms = (uv.hrtime() - t0) / 1e6
      stopped:signal("CONT")
      assert.is_false(ok)
      assert.equal(am.E_UNAVAILABLE, err)
      assert.equal("no reply from 127.0.0.1:" .. stopped.port .. " within 200 ms", err.reason)
      -- served at its own time, not at the long one's (5 s), nor at
      -- BLPOP's reply (2 s)
      assert.is_true(ms >= 199 and ms < 1500, ("failed after %.0f ms"):format(ms))
      h.wait_until(function() return blocked ~= nil end, 5000)
      assert.is_true(blocked[1])                 -- BLPOP timed out in Redis: nil
      assert.equal("PONG", short:call("PING"))   -- a new connection
      long:close()
      short:close()
    end))

  it("keeps every client's own count: one that gets replies does not extend another's",
    h.async(function()
      local busy = redis.connect({ port = live.port, commandTimeout = 300 })
      local quiet = redis.connect({ port = stopped.port, commandTimeout = 300 })
      assert.equal("PONG", quiet:call("PING"))
      local stop = redis_server.pinging(busy, 10)
      stopped:signal("STOP")
      local t0 = uv.hrtime()
      local ok, err = pcall(quiet.call, quiet, "PING")
      local ms = (uv.hrtime() - t0) / 1e6
      stopped:signal("CONT")
      assert.is_true(stop() > 5)
      assert.is_false(ok)
      assert.equal(am.E_UNAVAILABLE, err)
      assert.is_true(ms >= 299 and ms < 1500, ("failed after %.0f ms"):format(ms))
      busy:close()
      quiet:close()
    end))
end)

describe("the leases of one process, each on its own timer", function()
  it("renews a short lease taken while a long one holds, and stops with the last",
    h.async(function()
      local c = redis.connect({ port = live.port })
      local lost = {}
      local function on_lost(info) lost[#lost + 1] = info.name end
      -- the long lease first (its renewal due in 10 s)
      local long = am.RedisMutex.new(c, "spec290:long", { ttl = 30000, onLost = on_lost })
      local short = am.RedisMutex.new(c, "spec290:short",
                                      { ttl = 300, renewInterval = 100, onLost = on_lost })
      local r_long = long:acquire()
      local r_short = short:acquire()
      h.sleep(700)                               -- over two ttls of the short one
      assert.same({}, lost)
      assert.is_true(r_short:check())
      -- Redis has it still: its lease was renewed
      assert.is_true(c:call("PTTL", "spec290:short:h") > 0)
      assert.is_true(r_short())
      -- the long one alone, then none
      h.sleep(150)
      assert.is_true(r_long:check())
      assert.is_true(r_long())
      assert.same({}, lost)
      c:close()
    end))

  it("tells each lease's loss at its own time", h.async(function()
    local c = redis.connect({ port = live.port })
    local lost = {}
    local function on_lost(info) lost[#lost + 1] = info.name end
    local a = am.RedisMutex.new(c, "spec290:a", { ttl = 30000, onLost = on_lost })
    local b = am.RedisMutex.new(c, "spec290:b", { ttl = 200, renewInterval = 50, onLost = on_lost })
    local ra = a:acquire()
    local rb = b:acquire()
    -- b's hold ends in Redis (its key removed): its next renewal is refused
    c:call("DEL", "spec290:b:h")
    h.wait_until(function() return #lost == 1 end, 2000)
    assert.same({ "spec290:b" }, lost)
    assert.is_false(rb())
    assert.is_true(ra:check())
    assert.is_true(ra())
    c:close()
  end))
end)
