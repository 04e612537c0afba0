-- RedisRWLock (docs/redis-locks.md, "RedisRWLock"): the rules of am.RWLock
-- (docs/lockkinds.md, RWLock) across processes.  Readers share, a writer
-- holds alone; one FIFO queue whose readers at the head are granted
-- together (by one script: their fences are consecutive), a reader queues
-- behind a waiting writer; each hold has its own lease and fence, fences
-- strictly increase across reads and writes; downgrade lets no writer in
-- between, upgrade is refused.

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec191")

-- Four processes' RedisRWLocks on one fresh name (a client each): the
-- locks, their clients, the name.
local function four_rwlocks()
  local a, b, c, d = server:client(), server:client(), server:client(), server:client()
  local name = fresh_name()
  local new = am.RedisRWLock.new
  return new(a, name), new(b, name), new(c, name), new(d, name), a, b, c, d, name
end

describe("RedisRWLock", function()
  it("lets readers of several processes share it, and a writer hold it alone", with.two_locks(am.RedisRWLock, function(ra, rb, a, _, name)
    assert.is_false(ra:isLocked())
    local r1 = ra:acquireRead()
    local r2 = rb:acquireRead()
    local r3 = rb:acquireRead()
    assert.equal(3, ra:readers())
    assert.is_true(ra:isLocked())
    assert.is_false(ra:isWriteLocked())
    local w = h.requester("acquireWrite", nil, "w", ra)
    h.wait_until(function() return R.queued(a, name) == 1 end)
    r1(); r2()
    h.sleep(30)
    assert.is_false(w.done)                       -- one reader left
    assert.is_true(r3())
    h.wait_until(function() return w.done end)
    assert.is_true(ra:isWriteLocked())
    assert.equal(0, rb:readers())
    assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(am.tryAcquire(rb).acquireRead,
      am.tryAcquire(rb))))
    assert.equal(am.E_TIMEOUT, select(2, pcall(am.withTimeout(rb, 30).acquireWrite,
      am.withTimeout(rb, 30))))
    assert.is_true(w.release())
    assert.is_false(ra:isLocked())
  end))

  it("queues a reader behind a waiting writer, and grants the readers at the head together",
    h.async(function()
      local la, lb, lc, ld, a, b, c, d, name = four_rwlocks()
      local log = {}
      local r0 = la:acquireRead()
      local w = h.requester("acquireWrite", log, "w", lb)      -- waits for r0
      h.wait_until(function() return R.queued(a, name) == 1 end)
      local rc = h.requester("acquireRead", log, "rc", lc)     -- behind w, though r0 reads
      local rd = h.requester("acquireRead", log, "rd", ld)
      h.wait_until(function() return R.queued(a, name) == 3 end)
      local w2 = h.requester("acquireWrite", log, "w2", la)    -- behind them
      h.wait_until(function() return R.queued(a, name) == 4 end)
      h.sleep(30)
      assert.same({}, log)
      assert.is_true(r0())
      h.wait_until(function() return w.done end)
      assert.same({ "w" }, log)
      assert.is_true(w.release())
      h.wait_until(function() return rc.done and rd.done end)
      -- both readers granted by the writer's one release script: one fence
      -- drawn after the other in it
      assert.equal(1, math.abs(rc.release.fence - rd.release.fence))
      assert.is_true(rc.release.fence > w.release.fence)
      h.sleep(30)
      assert.is_false(w2.done)
      assert.is_true(rc.release())
      assert.is_true(rd.release())
      h.wait_until(function() return w2.done end)
      assert.is_true(w2.release.fence > rd.release.fence)
      assert.is_true(w2.release())
      a:close(); b:close(); c:close(); d:close()
    end))

  it("draws strictly increasing fences across reads and writes", with.two_locks(am.RedisRWLock, function(la, lb)
    R.fences_increase(40, 0, function(i)
      local lock = i % 2 == 0 and la or lb
      return (i % 3 == 0) and lock:acquireWrite() or lock:acquireRead()
    end)
  end))

  it("renews and loses each reader's lease on its own", with.two_clients(function(a, b, name)
    local lost = {}
    local short = am.RedisRWLock.new(a, name, { ttl = 150, renewInterval = 0,
      onLost = function(info) lost[#lost + 1] = info end })
    local long = am.RedisRWLock.new(b, name, { ttl = 150 })
    local rs = short:acquireRead()
    local rl = long:acquireRead()
    h.wait_until(function() return #lost == 1 end)
    assert.equal(rs, lost[1].releaser)
    assert.equal(am.E_LOST, select(2, pcall(rs.check, rs)))
    h.sleep(300)                                   -- two of its ttls: renewed
    assert.is_true(rl:check())
    assert.equal(1, long:readers())
    assert.is_false(rs())
    assert.is_true(rl())
  end))

  it("waitForUnlock waits until a write could be granted", with.two_locks(am.RedisRWLock, function(la, lb)
    local r = la:acquireRead()
    local watcher = h.requester("waitForUnlock", nil, "watch", lb)
    h.sleep(50)
    assert.is_false(watcher.done)
    r()
    h.wait_until(function() return watcher.done end)
    assert.is_true(watcher.ok)
  end))

  it("release() ends this process's oldest write hold, nothing while it only reads",
    with.one_lock(am.RedisRWLock, function(rw)
      local r = rw:acquireRead()
      assert.is_false(rw:release())
      assert.is_true(r:check())
      r()
      local w = rw:acquire()                       -- acquire writes
      assert.is_true(rw:isWriteLocked())
      assert.is_true(rw:release())
      assert.is_false(w())
      assert.is_false(rw:isLocked())
    end))

  it("runShared and runExclusive hold a read and a write", with.one_lock(am.RedisRWLock, function(rw)
    assert.equal(7, rw:runShared(function()
      assert.equal(1, rw:readers())
      return rw:runShared(function() return 7 end)    -- a second read: shares
    end))
    assert.equal("x", rw:runExclusive(function()
      assert.is_true(rw:isWriteLocked())
      return "x"
    end))
  end))
end)

describe("RedisRWLock's downgrade", function()
  it("turns the write into a read with no writer in between; the readers at the head join",
    h.async(function()
      local la, lb, lc, ld, a, b, c, d, name = four_rwlocks()
      local w = la:acquireWrite()
      local r1 = h.requester("acquireRead", nil, "r1", lb)
      h.wait_until(function() return R.queued(a, name) == 1 end)
      local w2 = h.requester("acquireWrite", nil, "w2", lc)
      h.wait_until(function() return R.queued(a, name) == 2 end)
      local r2 = h.requester("acquireRead", nil, "r2", ld)
      h.wait_until(function() return R.queued(a, name) == 3 end)
      local read = w:downgrade()
      assert.is_true(read.fence > w.fence)
      h.wait_until(function() return r1.done end)
      assert.is_true(r1.release.fence > read.fence)
      h.sleep(30)
      assert.is_false(w2.done)                     -- the writer at the head waits
      assert.is_false(r2.done)                     -- and the reader behind it
      assert.equal(2, la:readers())
      assert.is_false(w())                         -- the write releaser is spent
      assert.is_false(w:check())
      assert.is_true(read:check())
      assert.is_true(read())
      assert.is_true(r1.release())
      h.wait_until(function() return w2.done end)
      assert.is_true(w2.release())
      h.wait_until(function() return r2.done end)
      assert.is_true(r2.release())
      a:close(); b:close(); c:close(); d:close()
    end))

  it("keeps the read hold's lease renewed by the watchdog", with.two_clients(function(a, b, name)
    local la, lb = am.RedisRWLock.new(a, name, { ttl = 150 }), am.RedisRWLock.new(b, name)
    local read = la:acquireWrite():downgrade()
    h.sleep(400)
    assert.is_true(read:check())
    assert.equal(1, lb:readers())
    assert.is_true(read())
  end))

  it("is refused for reads, other kinds, ended and lost writes; upgrade is never offered",
    with.one_client(function(a, name)
      local rw = am.RedisRWLock.new(a, name, { ttl = 100, renewInterval = 0 })
      local r = rw:acquireRead()
      h.raises_at_caller({ function() r:downgrade() end,
        "attempt to downgrade a releaser that is not a readers-writer lock's write hold" })
      h.raises_at_caller({ function() r:upgrade() end,
        "attempt to upgrade a read hold: not offered (two upgraders would deadlock);"
        .. " release it, then acquireWrite" })
      r()
      local m = am.RedisMutex.new(a, fresh_name()):acquire()
      h.raises_at_caller({ function() m:downgrade() end,
        "attempt to downgrade a releaser that is not a readers-writer lock's write hold" })
      m()
      local w = rw:acquireWrite()
      w()
      h.raises_at_caller({ function() w:downgrade() end,
        "attempt to downgrade a write hold that has ended" })
      w = rw:acquireWrite()
      h.sleep(150)                                 -- its lease ends (no watchdog)
      assert.equal(am.E_LOST, select(2, pcall(w.downgrade, w)))
      -- (a lock of a long ttl: this hold must outlast GC stress beside
      -- valgrind)
      w = am.RedisRWLock.new(a, name, { ttl = 30000 }):acquireWrite()
      local ok, err
      local co = coroutine.wrap(function() return 1 end)
      assert.equal(1, co())
      -- where it cannot yield: in a metamethod called from C
      ok, err = pcall(table.sort, { 1, 2 }, function() w:downgrade(); return false end)
      assert.is_false(ok)
      assert.matches("attempt to downgrade a Redis write hold where the coroutine cannot yield",
        err, 1, true)
      assert.is_true(w())
    end))

  it("from main code (a luv callback) is refused: outside a coroutine", with.one_lock(am.RedisRWLock, function(rw)
    local rel = rw:acquireWrite()
    local done, ok, err = false, nil, nil
    local t = require("luv").new_timer()
    t:start(0, 0, function()
      t:close()
      ok, err = pcall(h.raises_at_caller, { function() rel:downgrade() end,
        "attempt to downgrade a Redis write hold outside a coroutine" })
      done = true
    end)
    h.wait_until(function() return done end)
    assert(ok, err)
    assert.is_true(rel:check())
    assert.is_true(rel())
  end))
end)

describe("RedisRWLock across 4 processes", function()
  -- 95 % reads from 4 processes of 3 coroutines (R.rw_workers_on): each
  -- section writes a begin and an end marker with its mode to one O_APPEND
  -- file.  A write overlaps nothing; reads overlap each other (the lock is
  -- shared, not serialized).
  it("never lets a writer overlap anyone, and lets readers overlap (markers in one O_APPEND file)",
    h.async(function()
      local bad, shared, sections, writes = R.rw_workers_on(server, fresh_name(), 60,
        { ttl = 2000, coroutines = 3, writes = 0.05, pause = 2 })
      assert.equal(4 * 3 * 60, sections)
      assert.equal(0, bad)
      assert.is_true(writes > 0)
      assert.is_true(shared > sections // 4, ("only %d of %d reads shared"):format(shared, sections))
    end, { deadline = 60000 }))
end)

describe("RedisRWLock's usage errors", function()
  it("are those of the Redis locks and of the RWLock, at the caller's line", h.async(function()
    local c = server:client()
    h.raises_at_caller({ function() am.RedisRWLock.new(c, 7) end,
      "bad argument #2 to 'new' (lock name must be a non-empty string, got number)" })
    h.raises_at_caller({ function() am.RedisRWLock.new(c, "x", 5) end,
      "bad argument #3 to 'new' (options must be a table, got number)" })
    local rw = am.RedisRWLock.new(c, fresh_name())
    h.raises_at_caller({ function() rw:acquireRead({}) end,
      "bad argument #1 to 'acquireRead' (priority must be a number, got table)" })
    h.raises_at_caller({ function() rw:acquireWrite("x") end,
      "bad argument #1 to 'acquireWrite' (priority must be a number, got string)" })
    h.raises_at_caller({ function() rw:acquire(true) end,
      "bad argument #1 to 'acquire' (priority must be a number, got boolean)" })
    h.raises_at_caller({ function() rw.acquire(c) end,
      "bad argument #1 to 'acquire' (async_mutex.RedisRWLock expected, got async_mutex.redis.Client)" })
    h.raises_at_caller({ function() rw:runShared(42) end,
      "bad argument #1 to 'runShared' (function expected, got number)" })
    h.raises_at_caller({ function() rw.readers(c) end,
      "bad argument #1 to 'readers' (async_mutex.RedisRWLock expected, got async_mutex.redis.Client)" })
    c:close()
    h.raises_at_caller({ function() rw:acquireWrite() end, "attempt to use a closed redis client" })
  end))
end)
