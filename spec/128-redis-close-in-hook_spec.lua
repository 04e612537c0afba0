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
-- The hook closes at calls made by the lock's own code: a close inside the
-- client's own calls (its hooks.watch, while a request is being written)
-- left that request waiting for ever, a defect of the client's, reported.

local am = require "async_mutex"
local h = require "helpers"
local R = require "lock_redis"

local server

setup(function() server = R.server() end)
teardown(function() if server then server:stop() end end)

local fresh_name = R.namer("spec128")

-- Runs acquire on a new client's lock with a call hook that closes that
-- client at the k-th call; 'other' (a lock of another client, on the same
-- name) must then be granted at once.  'setup(la)' prepares the scene (may
-- return a function run once the acquire is queued).  Returns nil when
-- the acquire finished before the k-th call, else a problem (a string) or
-- false.
local function close_at(k, other_client, setup_scene)
  local a = server:client()
  local name = fresh_name()
  local la = am.RedisMutex.new(a, name, { ttl = 1000 })
  local lb = am.RedisMutex.new(other_client, name, { ttl = 1000 })
  assert.is_false(la:isLocked())          -- connected, eviction policy read
  local after = setup_scene and setup_scene(lb, name)
  local ok, r, closed
  local calls = 0
  h.spawn(function()
    debug.sethook(function()
      -- calls made by the lock's code (the client's own windows are the
      -- client's: docs/redis.md)
      local caller = debug.getinfo(3, "S")
      if not (caller and caller.short_src:find("redis_lock.lua", 1, true)) then return end
      calls = calls + 1
      if calls == k then
        debug.sethook()
        closed = true
        a:close()
      end
    end, "c")
    ok, r = pcall(la.acquire, la)
    debug.sethook()
  end)
  if after then after(function() return ok ~= nil end) end
  h.wait_until(function() return ok ~= nil end, 3000)
  if not closed then
    a:close()
    assert.is_true(ok, r)
    return nil
  end
  local problem = false
  if ok then
    if r:check() then problem = "held after the close" end
  elseif r ~= am.E_UNAVAILABLE and not tostring(r):find("attempt to use a closed redis client") then
    problem = "raised " .. tostring(r)
  end
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
    assert.is_true(k > 45)
    assert.equal("", table.concat(problems, "; "))
    b:close()
  end, { deadline = 120000 }))
end)
