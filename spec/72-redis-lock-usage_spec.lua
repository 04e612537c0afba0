-- The Redis locks' usage errors read as those of redis.connect,
-- am.optimistic and the core locks (docs/redis-locks.md, "Usage errors"):
-- an unknown option is refused, a priority error is worded as the core
-- locks word it, and a call on a closed client raises at the caller's line.

local redis = require "async_mutex.redis"
local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec72")

local check = h.raises_at_caller

describe("Redis lock options", function()
  it("refuses an unknown option name, as redis.connect does", with.client(function(c)
    local LOCK = "cancelError, lostError, onLost, renewInterval, replicas, ttl, unsafeEviction, waiterTimeout"
    check { function() am.RedisMutex.new(c, "x", { tll = 5 }) end,
      "bad argument #3 to 'new' (unknown option 'tll'; did you mean 'ttl'? options: " .. LOCK .. ")" }
    check { function() am.KeyedRedisMutex.new(c, "k:", { onlost = print }) end,
      "bad argument #3 to 'new' (unknown option 'onlost'; did you mean 'onLost'? options: "
        .. LOCK .. ")" }
    check { function() am.RedisSemaphore.new(c, "s", 2, { renew = 5 }) end,
      "bad argument #4 to 'new' (unknown option 'renew'; did you mean 'renewInterval'? options: "
        .. LOCK .. ")" }
    assert.equal("bad argument #3 to 'new' (unknown option '1'; options: " .. LOCK .. ")",
      h.error_of(function() am.RedisMutex.new(c, "x", { 100 }) end))
    -- the same wording as connect's and optimistic's
    assert.matches("^bad argument #1 to 'connect' %(unknown option 'tll'; options: ",
      h.error_of(function() redis.connect { path = server.path, tll = 5 } end))
    local ok, err = pcall(am.optimistic, function() end, { tll = 5 })
    assert.is_false(ok)
    assert.matches("%(unknown option 'tll'; options: [^)]*%)$", err)
  end))

  it("takes every option it documents", with.client(function(c)
    local opts = { ttl = 1000, renewInterval = 300, waiterTimeout = 500,
      onLost = function() end, cancelError = "gone", lostError = "lost" }
    local m = am.RedisMutex.new(c, fresh_name(), opts)
    local release = m:acquire()
    assert.is_true(release())
    local k = am.KeyedRedisMutex.new(c, fresh_name() .. ":", opts)
    assert.is_true(k:acquire("a")())
    local s = am.RedisSemaphore.new(c, fresh_name(), 2, opts)
    local _, r = s:acquire()
    assert.is_true(r())
  end))
end)

describe("Redis lock priorities", function()
  it("are refused in the core locks' words", with.one_lock(am.RedisMutex, function(m, c)
    local core = am.Mutex.new()
    local function both(fn)
      return h.error_of(function() fn(m) end), h.error_of(function() fn(core) end)
    end
    local redis_msg, core_msg = both(function(l) l:acquire("x") end)
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)", redis_msg)
    assert.equal(core_msg, redis_msg)
    redis_msg, core_msg = both(function(l) l:acquire(0 / 0) end)
    assert.equal("bad argument #1 to 'acquire' (priority must not be NaN)", redis_msg)
    assert.equal(core_msg, redis_msg)
    redis_msg, core_msg = both(function(l) l:waitForUnlock(true) end)
    assert.equal("bad argument #1 to 'waitForUnlock' (priority must be a number, got boolean)", redis_msg)
    assert.equal(core_msg, redis_msg)
    local k = am.KeyedRedisMutex.new(c, fresh_name() .. ":")
    assert.equal(h.error_of(function() am.KeyedMutex.new():acquire("a", "x") end),
      h.error_of(function() k:acquire("a", "x") end))
    local s = am.RedisSemaphore.new(c, fresh_name(), 2)
    assert.equal(h.error_of(function() am.Semaphore.new(2):acquire(1, "x") end),
      h.error_of(function() s:acquire(1, "x") end))
  end))
end)

describe("Redis locks on a closed client", function()
  it("raise at the caller's line, for every method that asks Redis", h.async(function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    local k = am.KeyedRedisMutex.new(c, fresh_name() .. ":")
    local s = am.RedisSemaphore.new(c, fresh_name(), 2)
    local timed = am.withTimeout(m, 1000)
    m:acquire()()                  -- used once, then closed
    c:close()
    local closed = "attempt to use a closed redis client"
    local calls = {
      function() m:acquire() end,
      function() m:runExclusive(function() end) end,
      function() m:waitForUnlock() end,
      function() m:isLocked() end,
      function() timed:acquire() end,
      function() k:acquire("a") end,
      function() k:runExclusive("a", function() end) end,
      function() k:waitForUnlock("a") end,
      function() k:isLocked("a") end,
      function() s:acquire() end,
      function() s:runExclusive(function() end) end,
      function() s:waitForUnlock() end,
      function() s:isLocked() end,
      function() s:getValue() end,
    }
    for _, call in ipairs(calls) do check { call, closed } end
    -- argument errors come first, as on an open client
    assert.equal("bad argument #1 to 'acquire' (priority must be a number, got string)",
      h.error_of(function() m:acquire("x") end))
  end))
end)
