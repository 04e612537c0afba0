-- RedisReentrantMutex (docs/redis-locks.md, "RedisReentrantMutex"): the
-- API and semantics of am.ReentrantMutex (docs/lockkinds.md,
-- ReentrantMutex) on one hold in Redis.  Its holder, a coroutine, re-enters
-- at once with no request, across yields and through the decorators; the
-- levels end in any order from any coroutine, the last gives the hold back
-- in Redis; everyone else (coroutines of this process, other processes)
-- waits as for a RedisMutex; a lost lease ends every level.

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec190")

describe("RedisReentrantMutex's holder", function()
  it("re-enters at once, across yields, with no request to Redis: levels of one hold, one fence",
    with.one_lock(am.RedisReentrantMutex, function(rm, c)
      assert.equal(0, rm:depth())
      assert.is_false(rm:isHeldByMe())
      local r1 = rm:acquire()
      local before = R.scripts_run(c)
      h.sleep(20)                                    -- yields while holding
      local r2 = rm:acquire()
      h.sleep(5)
      local r3 = rm:runExclusive(function()
        assert.equal(3, rm:depth())
        return rm:acquire()
      end)
      assert.equal(before, R.scripts_run(c))         -- no request for a re-entry
      assert.equal(3, rm:depth())
      assert.is_true(rm:isHeldByMe())
      assert.equal(r1.fence, r2.fence)
      assert.equal(r1.fence, r3.fence)
      assert.equal("async_mutex.RedisReleaser", getmetatable(r2).__name)
      assert.is_true(r2:check())
      assert.is_true(r2())
      assert.is_false(r2())                          -- its level ended once
      assert.is_false(r2:check())
      assert.is_true(rm:isLocked())
      assert.is_true(r1())                           -- outer first: the lock stays held
      assert.equal(1, rm:depth())
      assert.is_true(rm:isLocked())
      assert.is_true(r3())                           -- the last level gives it back
      assert.equal(0, rm:depth())
      assert.is_false(rm:isLocked())
      assert.is_false(r1:check())
    end))

  it("re-enters through withTimeout and tryAcquire, which bound or refuse everyone else",
    with.two_locks(am.RedisReentrantMutex, function(rm, other)
      local r1 = rm:acquire()
      local r2 = am.tryAcquire(rm):acquire()
      local r3 = am.withTimeout(rm, 0):acquire()
      assert.equal(3, rm:depth())
      assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(am.tryAcquire(other).acquire,
        am.tryAcquire(other))))
      assert.equal(am.E_TIMEOUT, select(2, pcall(am.withTimeout(other, 50).acquire,
        am.withTimeout(other, 50))))
      -- a coroutine of this process that is not the holder is refused too
      local err
      h.spawn(function() err = select(2, pcall(am.tryAcquire(rm).acquire, am.tryAcquire(rm))) end)
      h.wait_until(function() return err ~= nil end)
      assert.equal(am.E_ALREADY_LOCKED, err)
      r3(); r2(); r1()
      local r = am.tryAcquire(other):acquire()
      assert.is_true(r())
    end))

  it("waits for itself in waitForUnlock: refused, at the caller's line", with.one_lock(am.RedisReentrantMutex, function(rm)
    local release = rm:acquire()
    h.raises_at_caller({ function() rm:waitForUnlock() end,
      "attempt to wait for a reentrant mutex that this coroutine holds (it would wait for itself)" })
    release()
    rm:waitForUnlock()                               -- free: returns
  end))
end)

describe("RedisReentrantMutex's other coroutines and processes", function()
  it("wait as for a RedisMutex until every level is released; a coroutine the holder spawns too",
    with.two_locks(am.RedisReentrantMutex, function(rm, other, a, _, name)
      local log = {}
      local r1 = rm:acquire()
      local r2 = rm:acquire()
      local spawned = h.acquirer(log, "spawned", rm)          -- same process, not the holder
      local remote = h.acquirer(log, "remote", other)         -- another process
      h.wait_until(function() return R.queued(a, name) == 2 end)
      local watcher = h.requester("waitForUnlock", log, "watcher", other)
      h.sleep(50)
      assert.same({}, log)
      assert.is_true(r2())
      h.sleep(30)
      assert.same({}, log)                                    -- one level still held
      assert.is_true(r1())
      -- the queue's order: the spawned coroutine reached Redis first
      h.wait_until(function() return #log >= 1 end)
      assert.equal("spawned", log[1])
      assert.equal(1, rm:depth())
      assert.is_false(rm:isHeldByMe())                        -- held by the spawned one
      assert.is_true(spawned.release())
      h.wait_until(function() return remote.done end)
      assert.is_true(remote.ok)
      assert.is_true(remote.release())
      h.wait_until(function() return watcher.done end)
      assert.is_true(watcher.ok)
    end))

  it("cannot end the hold: another process's release and releases with other tokens change nothing",
    with.two_clients(function(a, b, name)
      local rm = am.RedisReentrantMutex.new(a, name)
      local r1 = rm:acquire()
      local r2 = rm:acquire()
      assert.is_false(am.RedisMutex.new(b, name):release())   -- holds nothing there
      assert.equal(0, R.release_script(b, name, "not-the-token"))
      assert.is_true(am.RedisMutex.new(b, name):isLocked())
      assert.is_true(r2:check())
      -- a level released by another coroutine ends just that level
      local done
      h.spawn(function() done = r2() end)
      h.wait_until(function() return done ~= nil end)
      assert.is_true(done)
      assert.equal(1, rm:depth())
      assert.is_true(r1())
    end))

  it("cancel rejects this process's waiters, not the holder's levels", with.one_lock(am.RedisReentrantMutex, function(rm)
    local release = rm:acquire()
    local w = h.acquirer(nil, "w", rm)
    h.sleep(20)
    rm:cancel()
    h.wait_until(function() return w.done end)
    assert.equal(am.E_CANCELED, w.err)
    assert.equal(1, rm:depth())
    local again = rm:acquire()
    assert.is_true(again())
    assert.is_true(release())
  end))
end)

describe("RedisReentrantMutex's lost lease", function()
  it("ends every level: onLost once with the outermost releaser, levels false, check raises, depth 0",
    with.client(function(c)
      local lost = {}
      local rm = am.RedisReentrantMutex.new(c, fresh_name(), { ttl = 150, renewInterval = 0,
        onLost = function(info) lost[#lost + 1] = info end })
      local r1 = rm:acquire()
      local r2 = rm:acquire()
      h.wait_until(function() return #lost == 1 end, 2000)
      h.sleep(20)
      assert.equal(1, #lost)
      assert.equal(r1, lost[1].releaser)
      assert.equal(r1.fence, lost[1].fence)
      assert.equal("expired", lost[1].reason)
      assert.equal(0, rm:depth())
      assert.is_false(rm:isHeldByMe())
      assert.equal(am.E_LOST, select(2, pcall(r2.check, r2)))
      assert.is_false(r2())
      assert.is_false(r1())
      assert.equal(am.E_LOST, select(2, pcall(r1.check, r1)))
      -- the coroutine's next acquire is a new hold, with a larger fence
      local r3 = rm:acquire()
      assert.is_true(r3.fence > r1.fence)
      assert.equal(1, rm:depth())
      assert.is_true(r3())
    end))

  -- Lost by the local clock while Redis still has it (a renewal it ran,
  -- answered after the local end): given back once every level is let go
  -- (its holder is done), not before, as a RedisMutex's (spec 45).
  it("is given back in Redis once its every level is let go", with.two_clients(function(a, b, name)
    local lost
    local rm = am.RedisReentrantMutex.new(a, name, { ttl = 150, renewInterval = 0,
      onLost = function(info) lost = info.reason end })
    local r1 = rm:acquire()
    local r2 = rm:acquire()
    local token = R.extend_records(b, name)[1]
    h.wait_until(function() return lost ~= nil end, 2000, "the loss")
    assert.is_false(r2())
    assert.is_false(r2())                      -- (a level counts once)
    a:call("PING")
    assert.same({ token }, R.holder_tokens(b, name))  -- the outer level's section goes on
    assert.is_false(r1())
    local rb = am.withTimeout(am.RedisMutex.new(b, name), 2000):acquire()
    assert.is_true(rb.fence > r1.fence)
    assert.is_true(rb())
  end))

  it("makes runExclusive raise the lost error when its function returns", with.client(function(c)
    local rm = am.RedisReentrantMutex.new(c, fresh_name(), { ttl = 100, renewInterval = 0,
      lostError = "gone" })
    local ok, err = pcall(rm.runExclusive, rm, function()
      return rm:runExclusive(function() h.sleep(200); return 1 end)
    end)
    assert.is_false(ok)
    assert.equal("gone", err)
  end))
end)

describe("RedisReentrantMutex and client:close()", function()
  it("ends the hold here and gives it back in Redis: the other process is granted at once",
    h.async(function()
      local a, b, name = R.two_clients(server, fresh_name)
      local rm = am.RedisReentrantMutex.new(a, name, { ttl = 30000 })
      local r1 = rm:acquire()
      local r2 = rm:acquire()
      local got
      h.spawn(function() got = am.RedisMutex.new(b, name):acquire() end)
      h.wait_until(function() return R.queued(b, name) == 1 end)
      a:close()
      h.wait_until(function() return got ~= nil end, 1000)
      assert.is_false(r2())
      assert.is_false(r1:check())
      assert.equal(0, rm:depth())
      assert.is_true(got())
      b:close()
    end))
end)

describe("RedisReentrantMutex across 4 processes", function()
  -- Nested sections (re-entered at random depths, yielding inside) write a
  -- begin and an end marker to one O_APPEND file at the outermost level:
  -- no two processes' outermost sections overlap.
  local WORKER = R.WORKER_PROLOGUE .. [[
local rm = am.RedisReentrantMutex.new(client, NAME, { ttl = 2000 })
local function nest(d)
  if d == 0 then am.sleep(math.random(0, 2)); return end
  rm:runExclusive(function()
    assert(rm:depth() >= 1 and rm:isHeldByMe())
    if math.random() < 0.5 then am.sleep(0) end
    nest(d - 1)
  end)
end
main(function()
  for i = 1, tonumber(N) do
    local release <close> = rm:acquire()
    f:write(("B %s %d\n"):format(ID, i))
    nest(math.random(0, 3))
    f:write(("E %s %d\n"):format(ID, i))
  end
  f:close()
end)
]]

  it("keeps the outermost sections exclusive (markers in one O_APPEND file)", h.async(function()
    local name = fresh_name()
    local log = R.run_workers(WORKER, 4, server.path, name, 60)
    local overlaps, sections = R.overlaps_in(log)
    os.remove(log)
    assert.equal(240, sections)
    assert.equal(0, overlaps)
  end, { deadline = 60000 }))
end)

describe("RedisReentrantMutex's usage errors", function()
  it("are those of the Redis locks, at the caller's line", h.async(function()
    local c = server:client()
    h.raises_at_caller({ function() am.RedisReentrantMutex.new(c, "") end,
      "bad argument #2 to 'new' (lock name must be a non-empty string, got string)" })
    h.raises_at_caller({ function() am.RedisReentrantMutex.new({}, "x") end,
      "bad argument #1 to 'new' (redis client expected, got table)" })
    h.raises_at_caller({ function() am.RedisReentrantMutex.new(c, "x", { tll = 1 }) end,
      "bad argument #3 to 'new' (unknown option 'tll'; did you mean 'ttl'? options: cancelError,"
      .. " lostError, onLost, renewInterval, replicas, ttl, unsafeEviction, waiterTimeout)" })
    local rm = am.RedisReentrantMutex.new(c, fresh_name())
    h.raises_at_caller({ function() rm:acquire("x") end,
      "bad argument #1 to 'acquire' (priority must be a number, got string)" })
    h.raises_at_caller({ function() rm:runExclusive(42) end,
      "bad argument #1 to 'runExclusive' (function expected, got number)" })
    h.raises_at_caller({ function() rm.depth({}) end,
      "bad argument #1 to 'depth' (async_mutex.RedisReentrantMutex expected, got table)" })
    local release = rm:acquire()
    h.raises_at_caller({ function() release.check({}) end,
      "bad argument #1 to 'check' (async_mutex.RedisReleaser expected, got table)" })
    release()
    c:close()
    h.raises_at_caller({ function() rm:acquire() end, "attempt to use a closed redis client" })
    h.raises_at_caller({ function() rm:isLocked() end, "attempt to use a closed redis client" })
  end))

  it("need a coroutine for a first acquire, not for a re-entry's release", function()
    local rm, c = R.one_lock(server, fresh_name, am.RedisReentrantMutex)
    h.raises_at_caller({ function() rm:acquire() end,
      "attempt to acquire a Redis lock outside a coroutine" })
    h.raises_at_caller({ function() rm:isLocked() end, "attempt to ask Redis outside a coroutine" })
    c:close()
    h.run_loop(1000)
  end)
end)
