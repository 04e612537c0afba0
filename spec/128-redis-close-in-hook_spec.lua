-- client:close() from a debug hook (or a finalizer) at any call of an
-- acquisition (docs/redis-locks.md, "Closing the client"; the rule of
-- docs/internals.md that whatever a hook or finalizer does is looked at
-- again).  The close gives back what the client had in Redis: a waiter's
-- token, or a hold's.  Before, a close that came after the grant's last
-- request and before the new hold was among the lock's holds (at the
-- allocation of the releaser, at its timer's luv calls) gave the token
-- back as a waiter's, and acquire() still returned the hold: check() true,
-- its timer renewing on a closed client, while the other process was
-- granted the lock (two holders), and uv.run() kept running until the
-- lease ended.  Now acquire() raises E_UNAVAILABLE there, as a waiter of a
-- closed client does, and a releaser it returned after a close is not held.
-- Likewise a close at a call of a release, after the hold had left the
-- lock's holds and before its request was known to be in flight: the
-- close gave nothing back and the other process waited for the lease
-- (ttl); the release is now in flight from its first step.
-- The hook closes at calls made by the lock's own code: a close inside the
-- client's own calls (its hooks.watch, while a request is being written)
-- left that request waiting for ever, a defect of the client's, reported.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec128")

-- fn(...) with `client` closed at the k-th call made by the lock's code
-- (R.with_close_at).
local function with_close_at(k, client, fn, ...)
  return R.with_close_at(k, client, { "redis_lock" }, fn, ...)
end

-- Runs acquire on a new client's lock with a call hook that closes that
-- client at the k-th call; 'other' (a lock of another client, on the same
-- name) must then be granted at once.  'setup(la)' prepares the scene (may
-- return a function run once the acquire is queued).  Returns nil when
-- the acquire finished before the k-th call, else a problem (a string) or
-- false.
local function close_at(k, other_client, setup_scene)
  local a, name = R.one_client(server, fresh_name)
  local la = am.RedisMutex.new(a, name, { ttl = 1000 })
  local lb = am.RedisMutex.new(other_client, name, { ttl = 1000 })
  assert.is_false(la:isLocked())          -- connected, eviction policy read
  local after = setup_scene and setup_scene(lb, name)
  local outcome = with_close_at(k, a, la.acquire, la)
  if after then after(function() return outcome() ~= nil end) end
  local problem = R.close_outcome(outcome, a, function(r)
    return r == am.E_UNAVAILABLE or tostring(r):find("attempt to use a closed redis client")
  end)
  if problem == nil then return nil end
  -- what the close gave back lets the other process in at once
  local rb
  h.spawn(function() rb = lb:acquire() end)
  h.wait_until(function() return rb ~= nil end, 800)
  assert.is_true(rb())
  return problem
end

describe("client:close() from a hook at any call of acquire", function()
  it("granted at once: never returns a hold, the other process is let in at once",
    h.async(function()
      local b = server:client()
      local problems = {}
      local k = 0
      repeat
        k = k + 1
        local p = close_at(k, b)
        if p then problems[#problems + 1] = k .. ": " .. p end
      until p == nil
      assert.is_true(k > 30)                 -- the acquire's calls were all tried
      assert.equal("", table.concat(problems, "; "))
      b:close()
    end, { deadline = 60000 }))

  it("granted by a hand-off: likewise", h.async(function()
    local b = server:client()
    local problems = {}
    local k = 0
    repeat
      k = k + 1
      local p = close_at(k, b, function(lb, name)
        local rb = lb:acquire()
        return function(finished)
          -- the waiter queued and subscribed (unless the close came
          -- first), then the hand-off
          h.wait_until(function() return finished() or R.queued(b, name) == 1 end)
          h.sleep(20)
          rb()
        end
      end)
      if p then problems[#problems + 1] = k .. ": " .. p end
    until p == nil
    assert.is_true(k > 35)                   -- more than granted at once: the queue's calls too
    assert.equal("", table.concat(problems, "; "))
    b:close()
  end, { deadline = 120000 }))
end)

-- Releases the hold of a new client's lock with a call hook that closes
-- that client at the k-th call the lock's code makes; 'release(r)' calls
-- the releaser (yieldable or not).  The other process must then be
-- granted at once.  Returns nil when the release finished before the k-th
-- call, else how long the other process waited (ms).
local function close_in_release_at(k, other_client, release)
  local a, name = R.one_client(server, fresh_name)
  local la = am.RedisMutex.new(a, name, { ttl = 1000 })
  local lb = am.RedisMutex.new(other_client, name, { ttl = 1000 })
  local ra = la:acquire()
  local outcome = with_close_at(k, a, release, ra)
  h.wait_until(function() return outcome() ~= nil end, 3000)
  local closed, ok = outcome()
  assert.is_true(ok)
  if not closed then
    a:close()
    return nil
  end
  local rb
  local t0 = uv.hrtime()
  h.spawn(function() rb = lb:acquire() end)
  h.wait_until(function() return rb ~= nil end, 3000)
  assert.is_true(rb())
  return (uv.hrtime() - t0) / 1e6
end

describe("client:close() from a hook at any call of a release", function()
  for _, case in ipairs({
    { "that waits for Redis", function(r) return r() end },
    { "that cannot wait (a comparator of table.sort)", function(r)
      table.sort({ 2, 1 }, function(x, y) r(); return x < y end)
    end },
  }) do
    it(case[1] .. ": gives the hold back, the other process is let in at once",
      h.async(function()
        local b = server:client()
        local late = {}
        local k = 0
        repeat
          k = k + 1
          local ms = close_in_release_at(k, b, case[2])
          if ms and ms > 500 then late[#late + 1] = ("%d: %.0f ms"):format(k, ms) end
        until ms == nil
        assert.is_true(k > 5)
        assert.equal("", table.concat(late, "; "))
        b:close()
      end, { deadline = 60000 }))
  end
end)
