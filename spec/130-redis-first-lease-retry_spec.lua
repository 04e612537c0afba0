-- Without a watchdog (renewInterval = 0), a hold granted by a hand-off
-- still gets one renewal: its first lease in Redis is the short one of a
-- hand-off, min(ttl, waiterTimeout), renewed to ttl after a third of it
-- (docs/redis-locks.md, "Waiting without polling").  When that one renewal
-- fails (no answer within commandTimeout, a dropped connection), it is
-- tried again halfway to the first lease's end.  Before, nothing retried
-- it: one transient failure ended the hold at waiterTimeout instead of
-- ttl (onLost, E_LOST), with the server reachable again long before.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec130")

local raw = R.eval_script

describe("a hand-off's first lease with no watchdog", function()
  it("is renewed again when its one renewal fails: the hold lasts its ttl", h.async(function()
    local a = server:client()
    local b = server:client { commandTimeout = 60 }
    local name = fresh_name()
    local lost = {}
    local mb = am.RedisMutex.new(b, name, { ttl = 3000, renewInterval = 0, waiterTimeout = 600,
                                            onLost = function(info) lost[#lost + 1] = info end })
    assert.is_false(mb:isLocked())           -- connected, eviction policy read
    assert.equal(1, raw(a, name, scripts.acquire, "A", "1", "1", "100000", "3000", "none",
                        "wait")[1])
    local rb
    h.spawn(function() rb = mb:acquire() end)
    h.wait_until(function() return R.queued(a, name) == 1 end)
    h.sleep(30)
    assert.equal(1, raw(a, name, scripts.release, "A", "1"))
    h.wait_until(function() return rb ~= nil end)
    -- its one renewal is due about 200 ms after its request: the server
    -- does not answer it (paused past commandTimeout), then answers again
    h.sleep(50)
    server:pause()
    h.sleep(200)
    server:resume()
    h.sleep(800)                             -- past the first lease (600 ms)
    assert.same({}, lost)
    assert.is_true(rb:check())
    local rec = a:call("HGET", name .. ":h", rb.token)
    assert.is_not_nil(rec)
    assert.is_true(tonumber(rec:match("^%d+")) - R.server_ms(a) > 1500)   -- renewed to ttl
    assert.is_true(rb())
    a:close(); b:close()
  end, { deadline = 10000 }))
end)
