-- RedisRWLock's readers of one process (docs/redis-locks.md,
-- "RedisRWLock"): they go to Redis together, each its own request at once
-- (the local gate is a readers-writer lock, not a mutex), so that they
-- queue together behind another process's writer and are granted together
-- by its release; a local writer still goes alone, and a reader that comes
-- while it waits queues behind it.

local am = require "async_mutex"
local h = require "helpers"
local R = require "lock_redis"

local server, fresh_name = R.file_server(setup, teardown, "spec199")

describe("RedisRWLock's readers of one process", function()
  it("queue together behind a writer and are granted together", h.async(function()
    local a, b = server:client(), server:client()
    local _ <close> = h.closing(a, b)
    local name = fresh_name()
    local ra, rb = am.RedisRWLock.new(a, name), am.RedisRWLock.new(b, name)
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
    local a, b = server:client(), server:client()
    local _ <close> = h.closing(a, b)
    local name = fresh_name()
    local ra, rb = am.RedisRWLock.new(a, name), am.RedisRWLock.new(b, name)
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
end)
