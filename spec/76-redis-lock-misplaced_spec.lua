-- A Redis lock given where only the local locks go (docs/api.md, "Redis locks";
-- "Debugging a hang"): am.withLease, and debug mode's name, holds and
-- report.  The error names the Redis lock for what it is, at the caller's
-- line, instead of "async_mutex lock expected, got async_mutex.RedisMutex"
-- (a RedisMutex is an async_mutex lock); a local lock, decorated or not, is
-- taken as before.  No Redis server is needed: a client connects at its
-- first call, and making a lock or checking these arguments makes none.
local am = require "async_mutex"
local h = require "helpers"
local redis = require "async_mutex.redis"

local client

setup(function() client = redis.connect({ port = require("redis_server").free_port() }) end)
teardown(function() if client then client:close() end end)

local function redis_locks()
  local rm = am.RedisMutex.new(client, "spec76:m")
  local rs = am.RedisSemaphore.new(client, "spec76:s", 2)
  local krm = am.KeyedRedisMutex.new(client, "spec76:k:")
  return {
    rm, rs, krm,
    am.withTimeout(rm, 10), am.tryAcquire(rs), am.withTimeout(krm, 10),
  }
end

describe("am.withLease of a Redis lock", function()
  local LEASED = "bad argument #1 to 'withLease' (a Redis lock cannot be leased"
    .. " (its holds are leases in Redis already: option ttl))"

  it("is refused, naming the Redis lock, at the caller's line", function()
    for _, lock in ipairs(redis_locks()) do
      h.raises_at_caller({ function() am.withLease(lock, 100) end, LEASED })
      assert.equal(LEASED, select(2, pcall(am.withLease, lock, 100)))
    end
  end)

  it("still leases local locks and decorated ones, and words their errors as before",
    function()
      local m = am.Mutex.new()
      assert.matches("^async_mutex%.decorated Mutex", tostring(am.withLease(m, 100)))
      assert.matches("^async_mutex%.decorated Mutex",
        tostring(am.withLease(am.withTimeout(m, 5), 100, nil, { fromRequest = true })))
      h.raises_at_caller({ function() am.withLease({}, 100) end,
        "bad argument #1 to 'withLease' (async_mutex lock expected, got table)" })
      h.raises_at_caller({ function() am.withLease(m, 0) end,
        "bad argument #2 to 'withLease' (lease must be a positive finite number)" })
      h.raises_at_caller({ function() am.withLease(m, 10, nil, { x = 1 }) end,
        "bad argument #4 to 'withLease' (unknown option 'x'; options: fromRequest)" })
    end)
end)

describe("debug mode given a Redis lock", function()
  local function watched(fname, got)
    return ("bad argument #1 to '%s' (debug mode watches the local locks, not a Redis lock,"
      .. " got %s)"):format(fname, got)
  end

  it("says it watches the local locks only, in name, holds and report", function()
    for _, lock in ipairs(redis_locks()) do
      local got = getmetatable(lock).__name
      h.raises_at_caller({ function() am.debug.name(lock, "orders") end, watched("name", got) })
      h.raises_at_caller({ function() am.debug.holds(lock) end, watched("holds", got) })
      h.raises_at_caller({ function() am.debug.report(lock) end, watched("report", got) })
    end
  end)

  it("still calls anything else no async_mutex lock", function()
    h.raises_at_caller({ function() am.debug.name({}, "x") end,
      "bad argument #1 to 'name' (async_mutex lock expected, got table)" })
    h.raises_at_caller({ function() am.debug.holds("m") end,
      "bad argument #1 to 'holds' (async_mutex lock expected, got string)" })
  end)
end)
