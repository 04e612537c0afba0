-- What a failover loses, made on purpose (docs/redis-locks.md, "Scaling
-- out"): the master's replicas are cut off (given a wrong password for the
-- master, then disconnected: CLIENT KILL TYPE replica), a process takes
-- the lock, and the master is killed (kill -9); Sentinel promotes a
-- replica that never saw the grant.
-- Without `replicas` the grant is lost: a second process is granted while
-- the first still holds by its own count (two holders, which only a fence
-- can tell apart: the second's is higher, since the promoted server's clock
-- is the same machine's).  With `replicas = 1` the first grant is not
-- confirmed, so it is given back and raised, never used: never two holders.

local am = require "async_mutex"
local h = require "helpers"
local redis = require "async_mutex.redis"

local PASSWORD = "spec204"

local function cli(port, args)
  local p = assert(io.popen(("LD_PRELOAD= redis-cli --no-auth-warning -a %s -p %d %s 2>&1"):format(
    PASSWORD, port, args)))
  local out = p:read("a")
  p:close()
  return out
end

-- Takes the lock through the master with its replicas cut off, kills the
-- master, and once Sentinel has promoted a replica takes it from another
-- client.  Returns the first outcome (ok, releaser or error) and the
-- second (ok, releaser or error).
local function lose_a_grant(set, replicas)
  local first, second
  h.run(function()
    local sentinels = set:sentinel_list()
    local a = redis.connect { sentinels = sentinels, master = "mymaster", commandTimeout = 200,
      password = PASSWORD }
    local b = redis.connect { sentinels = sentinels, master = "mymaster", password = PASSWORD }
    local ma = am.RedisMutex.new(a, "spec204", { ttl = 30000, replicas = replicas })
    local mb = am.RedisMutex.new(b, "spec204", { ttl = 30000 })
    a:call("PING")
    b:call("PING")
    local old = set.master.port
    for _, r in ipairs(set.replicas) do cli(r.port, "config set masterauth wrong") end
    cli(old, "client kill type replica")
    first = table.pack(pcall(ma.acquire, ma))
    set.master:kill()
    h.wait_until(function()
      local port = set:named_port()
      return port and port ~= old
    end, 20000, "a replica promoted")
    local bounded = am.withTimeout(mb, 5000)
    second = table.pack(pcall(bounded.acquire, bounded))
    if second[1] then second[2]() end
    if first[1] then first[2]() end
    a:close()
    b:close()
  end, { deadline = 40000 })
  return first, second
end

describe("a grant made just before the master dies, on no replica", function()
  local set
  after_each(function() if set then set:stop() end set = nil end)

  it("without replicas: lost, a second holder comes, with a higher fence", function()
    set = require("redis_sentinel").start { replicas = 2, sentinels = 3, failover_timeout = 3000,
      password = PASSWORD }
    local first, second = lose_a_grant(set, nil)
    assert.is_true(first[1], tostring(first[2]))
    assert.is_true(second[1], tostring(second[2]))
    assert.is_true(second[2].fence > first[2].fence)
  end)

  it("with replicas = 1: not confirmed, given back and raised; the next holder is the only one",
    function()
      set = require("redis_sentinel").start { replicas = 2, sentinels = 3, failover_timeout = 3000,
      password = PASSWORD }
      local first, second = lose_a_grant(set, 1)
      assert.is_false(first[1])
      assert.is_true(first[2] == redis.E_UNAVAILABLE)
      assert.equal("grant not confirmed: 0 of 1 replicas within 100 ms", first[2].reason)
      assert.is_true(second[1], tostring(second[2]))
    end)
end)
