-- RedisRWLock's readers of one process (docs/redis-locks.md,
-- "RedisRWLock"): they go to Redis together, each its own request at once
-- (the local gate is a readers-writer lock, not a mutex), so that they
-- queue together behind another process's writer and are granted together
-- by its release; a local writer still goes alone, and a reader that comes
-- while it waits queues behind it.  A write keeps the gate until its hold
-- ends, however it ends: the process's readers wait there, not in Redis.

local R = require "lock_redis"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec199")

describe("RedisRWLock's readers of one process", function()
  it("queue together behind a writer and are granted together", h.async(function()
    local ra, rb, a, b, name = R.two_locks(server, fresh_name, am.RedisRWLock)
    local _ <close> = h.closing(a, b)
    local w = rb:acquireWrite()
    local readers = {}
    for i = 1, 3 do readers[i] = h.requester("acquireRead", nil, "r" .. i, ra) end
    -- (before: the process's gate let one reader through at a time: one
    -- queued in Redis, the others waiting at the gate for its grant)
    h.wait_until(function() return R.queued(a, name) == 3 end)
    for i = 1, 3 do assert.is_false(readers[i].done) end
    assert.is_true(w())
    h.wait_until(function()
      return readers[1].done and readers[2].done and readers[3].done
    end)
    assert.equal(3, ra:readers())
    -- granted by the one release: consecutive fences, in arrival order
    local f = readers[1].release.fence
    assert.equal(f + 1, readers[2].release.fence)
    assert.equal(f + 2, readers[3].release.fence)
    for i = 1, 3 do assert.is_true(readers[i].release()) end
    assert.is_false(ra:isLocked())
  end))

  it("wait behind a writer of their process, which goes alone", h.async(function()
    local ra, rb, a, b, name = R.two_locks(server, fresh_name, am.RedisRWLock)
    local _ <close> = h.closing(a, b)
    local r0 = rb:acquireRead()
    local w = h.requester("acquireWrite", nil, "w", ra)
    h.wait_until(function() return R.queued(a, name) == 1 end)
    local r1 = h.requester("acquireRead", nil, "r1", ra)
    h.sleep(50)
    -- the reader waits at the gate, behind the writer: not in Redis, and
    -- not granted beside the other process's reader
    assert.equal(1, R.queued(a, name))
    assert.is_false(r1.done)
    assert.is_true(r0())
    h.wait_until(function() return w.done end)
    assert.is_true(ra:isWriteLocked())
    h.sleep(30)
    assert.is_false(r1.done)
    assert.is_true(w.release())
    h.wait_until(function() return r1.done end)
    assert.equal(1, ra:readers())
    assert.is_true(r1.release())
  end))

  it("wait at the gate while a write of their process holds, let in by its release",
    h.async(function()
    local a = server:client()
    local _ <close> = h.closing(a)
    local name = fresh_name()
    local ra = am.RedisRWLock.new(a, name)
    local w = ra:acquireWrite()
    local r1 = h.requester("acquireRead", nil, "r1", ra)
    local r2 = h.requester("acquireRead", nil, "r2", ra)
    h.sleep(50)
    -- (before: both queued in Redis behind the write)
    assert.equal(0, R.queued(a, name))
    assert.is_false(r1.done or r2.done)
    assert.is_true(ra:release())
    h.wait_until(function() return r1.done and r2.done end)
    assert.is_true(r1.ok and r2.ok)
    assert.equal(2, ra:readers())
    assert.is_true(r1.release.fence > w.fence and r2.release.fence > w.fence)
    assert.is_true(r1.release())
    assert.is_true(r2.release())
    assert.is_false(ra:isLocked())
  end))

  it("are let in when the write is downgraded, lost, or ended by the close",
    h.async(function()
    local a, b = server:client(), server:client()
    local _ <close> = h.closing(a, b)
    -- downgraded: the reader joins the read it became
    local name = fresh_name()
    local ra = am.RedisRWLock.new(a, name)
    local w = ra:acquireWrite()
    local r1 = h.requester("acquireRead", nil, "r1", ra)
    h.sleep(30)
    assert.is_false(r1.done)
    local d = w:downgrade()
    h.wait_until(function() return r1.done end)
    assert.is_true(r1.ok)
    assert.equal(2, ra:readers())
    assert.is_true(d())
    assert.is_true(r1.release())
    -- lost by the local clock (no watchdog): the reader goes to Redis, and
    -- is granted once Redis's lease ran out
    local lost = {}
    name = fresh_name()
    local short = am.RedisRWLock.new(a, name, { ttl = 150 * h.TIME_SCALE, renewInterval = 0,
      onLost = function(info) lost[#lost + 1] = info end })
    local ws = short:acquireWrite()
    local r2 = h.requester("acquireRead", nil, "r2", short)
    h.wait_until(function() return #lost == 1 end)
    assert.equal(ws, lost[1].releaser)
    h.wait_until(function() return r2.done end)
    assert.is_true(r2.ok)
    assert.is_true(r2.release.fence > ws.fence)
    assert.is_true(r2.release())
    assert.is_false(ws())
    -- ended by the client's close: the reader at the gate raises
    -- E_UNAVAILABLE, and the other process gets the lock
    name = fresh_name()
    local rc, rb = am.RedisRWLock.new(a, name), am.RedisRWLock.new(b, name)
    local wc = rc:acquireWrite()
    local r3 = h.requester("acquireRead", nil, "r3", rc)
    h.sleep(30)
    assert.is_false(r3.done)
    a:close()
    h.wait_until(function() return r3.done end)
    assert.is_false(r3.ok)
    assert.equal(am.E_UNAVAILABLE, r3.err)
    assert.is_false(wc())
    local wb = rb:acquireWrite()
    assert.is_true(wb())
  end))
end)
