-- Dead processes queued by the acquire script's queueing short path
-- (docs/redis-locks.md, "In Redis": a new waiter behind a mutex's live
-- holder is queued without expiring dead waiters first).  Those left
-- queued must not hold up a live waiter beyond the documented bounds
-- ("Guarantees": a dead holder blocks for at most ttl, a dead waiter for
-- at most waiterTimeout): the release, or the live waiter asking again when
-- the lease ends, runs the full path, which expires them.  Waiters are
-- killed with SIGKILL, as in spec 46.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, _, with = R.spec_file(setup, teardown)

local queued = R.queued

-- A child that queues for the lock ARGS[1] (waiterTimeout ARGS[2]) and
-- would hold it for a minute.
local WAITER = R.PROLOGUE .. R.HOLD_UNTIL_KILLED .. [[
main(function()
  local m = am.RedisMutex.new(client, ARGS[1], { waiterTimeout = tonumber(ARGS[2]) })
  hold_until_killed(m:acquire())
end)
]]

-- Starts n WAITER children one after the other, each queued (by the short
-- path: the lock is held) before the next starts, then kills them all.
local function queue_and_kill(c, name, n, wait_ms, already)
  local children = {}
  for i = 1, n do
    children[i] = R.child(WAITER, { server.path, name, wait_ms })
    h.wait_until(function() return queued(c, name) == already + i end, 10000)
  end
  for i = 1, n do children[i]:kill() end
  for i = 1, n do children[i]:wait() end
end

describe("waiters queued by the short path that die", function()
  it("are skipped at once by the release once their deadline has passed", h.async(function()
    local c = server:client()
    local name = "spec78:release"
    local release = am.RedisMutex.new(c, name, { waiterTimeout = 300 }):acquire()
    queue_and_kill(c, name, 3, 300, 0)
    local c2 = server:client()
    -- a live waiter that renews its place only every 10 s: no full run
    -- (which would expire the dead ones) comes before the release
    local got = R.grant_time(am.RedisMutex.new(c2, name, { waiterTimeout = 30000 }))
    h.wait_until(function() return queued(c, name) == 4 end)
    h.sleep(700)                           -- every dead waiter's deadline passes
    local t0 = uv.hrtime()
    assert.is_true(release())
    h.wait_until(function() return got() ~= nil end, 5000, "the live waiter's grant")
    local waited = (got() - t0) / 1e6
    assert.is_true(waited < 200 * h.TIME_SCALE, ("waited %.1f ms"):format(waited))
    assert.equal(0, queued(c, name))
    c:close(); c2:close()
  end, { deadline = 30000 }))

  it("behind a holder that dies hold the live waiter up no longer than ttl + waiterTimeout",
    with.client(function(c)
      local name = "spec78:lease"
      -- long enough for the three waiters to start and queue before it
      -- ends (slowed down, under make asan, each start takes longer)
      local ttl = 600 * h.TIME_SCALE
      local holder = R.child(R.PROLOGUE .. [[
main(function()
  local r = am.RedisMutex.new(client, ARGS[1], { ttl = tonumber(ARGS[2]) }):acquire()
  io.stdout:write("held ", r.fence, "\n")
  io.stdout:flush()
  am.sleep(60000)            -- killed before: the client is never closed
end)
]], { server.path, name, ttl })
      assert.is_true(holder:wait_for("held %d+\n"))
      local fence0 = tonumber(table.concat(holder.out):match("held (%d+)"))
      holder:kill()
      holder:wait()
      queue_and_kill(c, name, 3, 300, 0)
      local t0 = uv.hrtime()                 -- the lease and the deadlines run from before
      local release = am.RedisMutex.new(c, name, { waiterTimeout = 300 }):acquire()
      local waited = h.ms_since(t0)
      assert.is_true(waited < ttl + (300 + 200) * h.TIME_SCALE, ("waited %.1f ms"):format(waited))
      assert.is_true(release.fence > fence0)
      assert.equal(0, queued(c, name))
      assert.is_true(release())
    end, { deadline = 30000 }))
end)
