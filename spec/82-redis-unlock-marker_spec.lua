-- waitForUnlock's mark on a Redis lock (docs/redis-locks.md, "In Redis"):
-- a release publishes on N:free only when a waitForUnlock marked the key
-- N:free, and uses the mark up.  What must hold: a watcher that started
-- before a release is woken by it (not by its safety-net poll, every
-- waiterTimeout / 3: 100 s here); one that starts on a free lock returns at
-- once and marks nothing; and an idle lock leaves only its counter key.
-- (h.wait_until scales its bound under the memory checkers: the poll, at
-- 100 s here, stays far beyond it.)

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec82")

-- Long enough that a watcher woken within WOKEN ms was woken by the
-- release's message, not by its poll (every waiterTimeout / 3).
local OPTS = { waiterTimeout = 300000 }
local WOKEN = 3000

-- The keys Redis has for the lock 'name', sorted.
local function keys_of(c, name)
  return R.sorted(c:call("KEYS", name .. ":*"))
end

-- Spawns m:waitForUnlock(...); returns its record (done, ok, err).
local function watcher(m, ...)
  return h.requester("waitForUnlock", nil, "watcher", m, ...)
end

describe("RedisMutex:waitForUnlock and the release's mark", function()
  it("is woken by a release that comes after it started waiting", with.two_clients(function(c, c2, name)
    local m, other = am.RedisMutex.new(c, name, OPTS), am.RedisMutex.new(c2, name, OPTS)
    local release = other:acquire()
    local w = watcher(m)
    -- subscribed and marked: the next release must publish
    h.wait_until(function() return c:call("EXISTS", name .. ":free") == 1 end, 5000, "the mark")
    assert.is_false(w.done)
    assert.is_true(release())
    h.wait_until(function() return w.done end, WOKEN, "the watcher woken by the release")
    assert.is_true(w.ok)
    assert.equal(0, c:call("EXISTS", name .. ":free"))   -- the mark is used up
  end))

  it("is woken whatever the moment of the release between its start and its wait",
    with.two_clients(function(c, c2, name)
      local m, other = am.RedisMutex.new(c, name, OPTS), am.RedisMutex.new(c2, name, OPTS)
      -- the release comes 0, 1, 2, ... loop turns after the watcher started:
      -- before its first check, between its subscription and its mark, or
      -- after the mark
      for turns = 0, 12 do
        local release = other:acquire()
        local w = watcher(m)
        h.tick(turns)
        assert.is_true(release())
        h.wait_until(function() return w.done end, WOKEN,
          "the watcher released after " .. turns .. " loop turns")
        assert.is_true(w.ok)
      end
    end))

  it("returns at once on a free lock and leaves no mark", with.one_client(function(c, name)
    local m = am.RedisMutex.new(c, name, OPTS)
    m:waitForUnlock()
    assert.same({}, keys_of(c, name))
    m:acquire()()
    m:waitForUnlock()
    assert.same({ name .. ":n" }, keys_of(c, name))
  end))

  it("marks for at most waiterTimeout when it gives up; a later release publishes nothing",
    with.two_clients(function(c, c2, name)
      local m = am.RedisMutex.new(c, name, { waiterTimeout = 2000 })
      local release = am.RedisMutex.new(c2, name, OPTS):acquire()
      local err = h.error_of(function() am.withTimeout(m, 50):waitForUnlock() end)
      assert.equal(am.E_TIMEOUT, err)
      local pttl = c:call("PTTL", name .. ":free")
      assert.is_true(pttl > 0 and pttl <= 2000)
      -- a subscriber of our own hears the one release that finds the mark
      local heard = 0
      local sub = c:subscribe(name .. ":free", function() heard = heard + 1 end)
      assert.is_true(release())
      h.wait_until(function() return heard == 1 end, 2000, "the marked release's message")
      am.RedisMutex.new(c2, name, OPTS):acquire()()
      h.sleep(20)
      assert.equal(1, heard)
      sub:unsubscribe()
    end))
end)

describe("RedisSemaphore:waitForUnlock and the release's mark", function()
  it("waits for room for its weight, woken by the release that makes it", with.two_clients(function(c, c2, name)
    local s = am.RedisSemaphore.new(c, name, 3, OPTS)
    local other = am.RedisSemaphore.new(c2, name, 3, OPTS)
    local _, r1 = other:acquire(1)
    local _, r2 = other:acquire(2)
    local w = watcher(s, 2)
    h.wait_until(function() return c:call("EXISTS", name .. ":free") == 1 end, 5000, "the mark")
    assert.is_true(r1())                    -- room 1: not enough, it marks again
    h.wait_until(function() return c:call("EXISTS", name .. ":free") == 1 end, 5000,
      "the mark made again")
    assert.is_false(w.done)
    assert.is_true(r2())                    -- room 3
    h.wait_until(function() return w.done end, WOKEN, "the watcher woken by the release")
    assert.is_true(w.ok)
  end))
end)

describe("an idle lock", function()
  it("leaves only its counter key, which expires, after every kind of use", with.two_clients(function(c, c2, name)
    -- a mutex: a free acquire, a queued one, a hand-off, a watcher, a withdrawal
    local m, other = am.RedisMutex.new(c, name, OPTS), am.RedisMutex.new(c2, name, OPTS)
    local r = m:acquire()
    local w = h.acquirer(nil, "queued", other)
    h.wait_until(function() return R.queued(c, name) == 1 end, 5000)
    local u = watcher(m)
    h.wait_until(function() return c:call("EXISTS", name .. ":free") == 1 end, 5000, "the mark")
    assert.has_error(function() am.tryAcquire(m):acquire() end, am.E_ALREADY_LOCKED)
    assert.has_error(function() am.withTimeout(m, 30):acquire() end, am.E_TIMEOUT)
    r()
    h.wait_until(function() return w.done end, 5000)
    w.release()
    h.wait_until(function() return u.done end, WOKEN)
    assert.same({ name .. ":n" }, keys_of(c, name))
    local pttl = c:call("PTTL", name .. ":n")
    assert.is_true(pttl > 0 and pttl <= 3600000)
    -- a semaphore with holders of mixed weights and a queue
    local sname = fresh_name()
    local s = am.RedisSemaphore.new(c, sname, 3, OPTS)
    local _, a = s:acquire(2)
    local _, b = s:acquire(1)
    local q = h.acquirer(nil, "q", am.RedisSemaphore.new(c2, sname, 3, OPTS), 3)
    h.wait_until(function() return R.queued(c, sname) == 1 end, 5000)
    a()
    b()
    h.wait_until(function() return q.done end, 5000)
    q.release()
    assert.same({ sname .. ":n" }, keys_of(c, sname))
    -- and through the scripts: a release after the lease ended
    local n3 = fresh_name()
    c:eval(scripts.acquire, scripts.keys(n3), { "t", "1", "1", "10", "3000", "x", "wait" })
    h.sleep(30)
    assert.equal(0, c:eval(scripts.release, scripts.keys(n3), { "t", "1" }))
    assert.same({ n3 .. ":n" }, keys_of(c, n3))
  end))
end)
