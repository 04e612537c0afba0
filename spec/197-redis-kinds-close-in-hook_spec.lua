-- client:close() from a debug hook (or a finalizer) at any call of the
-- paths the kinds built on the Redis locks have of their own
-- (docs/redis-locks.md, "Closing the client"; the rule of docs/internals.md
-- that whatever a hook or finalizer does is looked at again), as spec 128
-- does for RedisMutex: KeyedRedisMutex:acquireAll's one atomic request,
-- a RedisRWLock write hold's downgrade(), and a RedlockMutex's grant.  The
-- close gives back what the client had in Redis, and the operation never
-- hands out a hold the close gave back: it raises E_UNAVAILABLE, or what
-- it returns is not held.  So the other process is let in at once (its
-- wait is far shorter than the ttl the hold would have kept the lock).
-- Before, a close after the answer and before the new holds were among
-- the lock's holds (an allocation of a releaser, its timer's luv calls)
-- returned holds whose tokens the close had given back: check() true on a
-- closed client while another process held the lock.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec197")
-- a RedlockMutex counts a server once it has been up for its ttl (1000 ms
-- here; INFO gives whole seconds)
setup(function() uv.sleep(2100) end)

-- The lock code a close may come from: the Redis locks' modules, not the
-- client's own (its windows are the client's: docs/redis.md).
local LOCK_FILES = { "async_mutex/redis_lock", "async_mutex/redis_multi",
                     "async_mutex/redis_rwlock", "async_mutex/redlock" }

-- fn() with `client` closed at the k-th call made by the locks' code
-- (R.with_close_at).
local function with_close_at(k, client, fn)
  return R.with_close_at(k, client, LOCK_FILES, fn)
end

-- The errors an operation cut off by its client's close may raise.
local function closed_error(err)
  return err == am.E_UNAVAILABLE
    or tostring(err):find("attempt to use a closed redis client", 1, true)
    or tostring(err):find("write hold that has ended", 1, true)
end

-- One case: 'prepare(a_client, b_client, name)' returns the operation (run
-- with the hook, on a_client's lock) and the other process's acquisition
-- (on b_client's, the same name).  Returns nil when the operation finished
-- before the k-th call, else a problem (a string) or false.
local function close_at(k, b, prepare)
  local a, name = R.one_client(server, fresh_name)
  local op, other = prepare(a, b, name)
  local outcome = with_close_at(k, a, op)
  local problem = R.close_outcome(outcome, a, closed_error)
  if problem == nil then return nil end
  -- what the close gave back lets the other process in at once (the
  -- leases are 1000 ms)
  local rb
  local t0 = uv.hrtime()
  h.spawn(function() rb = other() end)
  h.wait_until(function() return rb ~= nil end, 3000)
  local ms = (uv.hrtime() - t0) / 1e6
  assert.is_true(rb())
  if ms > 600 and not problem then problem = ("the other waited %.0f ms"):format(ms) end
  return problem
end

local CASES = {
  { "KeyedRedisMutex:acquireAll, granted in one request", 20, function(a, b, name)
    local ka = am.KeyedRedisMutex.new(a, name .. ":", { ttl = 1000 })
    local kb = am.KeyedRedisMutex.new(b, name .. ":", { ttl = 1000 })
    assert.is_false(ka:isLocked("x"))      -- connected, eviction policy read
    return function() return ka:acquireAll({ "x", "y", "z" }) end,
           function() return kb:acquireAll({ "z", "x", "y" }) end
  end },
  { "a RedisRWLock write hold's downgrade()", 5, function(a, b, name)
    local la = am.RedisRWLock.new(a, name, { ttl = 1000 })
    local lb = am.RedisRWLock.new(b, name, { ttl = 1000 })
    local w = la:acquireWrite()
    return function() return w:downgrade() end,
           function() return lb:acquireWrite() end
  end },
  { "RedlockMutex:acquire (one server: its quorum)", 20, function(a, b, name)
    local qa = am.RedlockMutex.new({ a }, name, { ttl = 1000 })
    local qb = am.RedlockMutex.new({ b }, name, { ttl = 1000 })
    assert.is_false(qa:isLocked())
    return function() return qa:acquire() end,
           function() return qb:acquire() end
  end },
}

describe("client:close() from a hook at any call of", function()
  for _, case in ipairs(CASES) do
    local title, min_calls, prepare = case[1], case[2], case[3]
    it(title .. ": never hands out a hold the close gave back, the other process is let in"
      .. " at once", h.async(function()
        local b = server:client()
        local problems = {}
        local k = 0
        repeat
          k = k + 1
          local p = close_at(k, b, prepare)
          if p then problems[#problems + 1] = k .. ": " .. p end
        until p == nil
        assert.is_true(k > min_calls, k)     -- the operation's calls were all tried
        assert.equal("", table.concat(problems, "; "))
        b:close()
      end, { deadline = 120000 }))
  end
end)
