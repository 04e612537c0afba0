-- waitForUnlock on a Redis lock whose holder dies (SIGKILL): no release
-- script runs, so nothing publishes on N:free (docs/redis-locks.md, "In
-- Redis"); the lock is free once the holder's lease ends.  A queued waiter
-- asks again at the end of the first holder's lease ("Waiting without
-- polling"); a watcher did not: it woke only at its poll, every
-- waiterTimeout / 3 (100 s here, with a lease of 300 ms).  Now the state
-- script tells it when the first lease ends, and it looks again then.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec87")

local TTL = 300
local OPTS = { waiterTimeout = 300000 }          -- poll every 100 s
local BOUND = TTL + 3000 * h.TIME_SCALE           -- far below the poll

-- A child that takes 'name' (a mutex, or the whole of a semaphore of
-- ARGS[3]) with a lease of TTL ms, says so, and sleeps until killed.
local HOLDER = R.PROLOGUE .. [[
main(function()
  local limit = tonumber(ARGS[3])
  local o = { ttl = tonumber(ARGS[2]) }
  if limit then
    local _, r = am.RedisSemaphore.new(client, ARGS[1], limit, o):acquire(limit)
    _G.keep = r
  else
    _G.keep = am.RedisMutex.new(client, ARGS[1], o):acquire()
  end
  io.stdout:write("held\n")
  io.stdout:flush()
  am.sleep(600000)
end)
]]

-- Kills a holder of 'name' while 'start_watcher' waits; returns the ms from
-- the kill to the watcher's return (nil: not within BOUND).
local function lag_after_kill(name, limit, start_watcher)
  local child = R.child(HOLDER, { server.path, name, TTL, limit })
  child:wait_for("held\n", 10000)
  local w = start_watcher()
  -- subscribed and marked: the watcher sleeps now
  local c = server:client()
  h.wait_until(function() return c:call("EXISTS", name .. ":free") == 1 end, 5000, "the mark")
  assert.is_false(w.done)
  local killed = uv.hrtime()
  child:kill()
  child:wait()
  local ok = pcall(h.wait_until, function() return w.done end, BOUND, "the watcher")
  c:close()
  if not ok then return nil end
  assert.is_true(w.ok, tostring(w.err))
  return (uv.hrtime() - killed) / 1e6
end

describe("waitForUnlock when the holder dies", function()
  it("RedisMutex: returns at the end of the dead holder's lease", with.one_client(function(c, name)
    local m = am.RedisMutex.new(c, name, OPTS)
    local ms = lag_after_kill(name, nil, function()
      return h.requester("waitForUnlock", nil, "watcher", m)
    end)
    assert.is_not_nil(ms, "the watcher slept past the end of the lease")
    assert.is_true(ms <= BOUND)
  end, { deadline = 20000 }))

  it("RedisSemaphore: returns when the dead holder's lease leaves room", with.one_client(function(c, name)
    local s = am.RedisSemaphore.new(c, name, 3, OPTS)
    local ms = lag_after_kill(name, 3, function()
      return h.requester("waitForUnlock", nil, "watcher", s, 2)
    end)
    assert.is_not_nil(ms, "the watcher slept past the end of the lease")
  end, { deadline = 20000 }))

  it("KeyedRedisMutex: returns at the end of the dead holder's lease", with.one_client(function(c, name)
    -- the key "a" of the set with prefix P is the lock named P .. "a"
    -- (docs/redis-locks.md), the one a RedisMutex of that name takes
    local k = am.KeyedRedisMutex.new(c, name .. ":", OPTS)
    local ms = lag_after_kill(name .. ":a", nil, function()
      return h.requester("waitForUnlock", nil, "watcher", k, "a")
    end)
    assert.is_not_nil(ms, "the watcher slept past the end of the lease")
  end, { deadline = 20000 }))
end)
