-- am.query(lock) and keyed:query([key]): a snapshot of a lock's holds and
-- pending requests, with debug mode off and on (docs/semantics.md, Query).
local h = require "helpers"
local am = require "async_mutex"

after_each(function() am.debug.disable() end)

local function modes(list)
  local out = {}
  for i, e in ipairs(list) do out[i] = e.mode end
  return out
end

local function field(list, name)
  local out = {}
  for i, e in ipairs(list) do out[i] = e[name] == nil and "nil" or e[name] end
  return out
end

describe("am.query(lock)", function()
  it("shows a free lock as nothing held and nothing pending", h.async(function()
    for _, lock in ipairs({ am.Mutex.new(), am.Semaphore.new(2), am.RWLock.new(),
        am.ReentrantMutex.new() }) do
      assert.same({ held = {}, pending = {} }, am.query(lock))
    end
  end))

  it("lists a Mutex's holder and its queued requests in queue order, with their priorities and coroutines", h.async(function()
    local m = am.Mutex.new()
    local rel = m:acquire()
    local a = h.acquirer(nil, "a", m)
    local b = h.acquirer(nil, "b", m, 5)
    local c = h.acquirer(nil, "c", m, 1.5)
    local d = h.acquirer(nil, "d", m)
    local q = am.query(m)
    assert.same({ "exclusive" }, modes(q.held))
    assert.is_nil(q.held[1].owner)              -- debug mode off: who is not recorded
    assert.same({ "exclusive", "exclusive", "exclusive", "exclusive" }, modes(q.pending))
    assert.same({ 5, 1.5, 0, 0 }, field(q.pending, "priority"))
    assert.equal(b.co, q.pending[1].owner)
    assert.equal(c.co, q.pending[2].owner)
    assert.equal(a.co, q.pending[3].owner)      -- arrival order within a priority
    assert.equal(d.co, q.pending[4].owner)
    assert.is_true(math.type(q.pending[3].priority) == "integer")
    rel()
    assert.same({ 1.5, 0, 0 }, field(am.query(m).pending, "priority"))  -- b granted
    h.tick()
    b.release(); h.tick(); c.release(); h.tick(); a.release(); h.tick(); d.release()
    assert.same({ held = {}, pending = {} }, am.query(m))
  end))

  it("gives an RWLock's modes: one shared hold per reader, exclusive for a writer", h.async(function()
    local rw = am.RWLock.new()
    local r1, r2 = rw:acquireRead(), rw:acquireRead()
    local w = h.requester("acquireWrite", nil, "w", rw)
    local r3 = h.requester("acquireRead", nil, "r3", rw)
    local q = am.query(rw)
    assert.same({ "shared", "shared" }, modes(q.held))
    assert.same({ "exclusive", "shared" }, modes(q.pending))
    assert.equal(w.co, q.pending[1].owner)
    assert.equal(r3.co, q.pending[2].owner)
    r1(); r2(); h.tick()
    q = am.query(rw)
    assert.same({ "exclusive" }, modes(q.held))
    assert.same({ "shared" }, modes(q.pending))
    w.release(); h.tick(); r3.release()
  end))

  it("gives a Semaphore's weights: its holds as one hold of their weight, each request's weight", h.async(function()
    local s = am.Semaphore.new(5)
    local _, r1 = s:acquire(2)
    local _, r2 = s:acquire(1)
    local a = h.acquirer(nil, "a", s, 4)
    local q = am.query(s)
    assert.same({ { mode = "weighted", weight = 3 } }, q.held)
    assert.same({ "weighted" }, modes(q.pending))
    assert.same({ 4 }, field(q.pending, "weight"))
    assert.equal(a.co, q.pending[1].owner)
    r1(); h.tick()
    q = am.query(s)
    assert.same({ { mode = "weighted", weight = 5 } }, q.held)
    r2(); a.release()
    assert.same({}, am.query(s).held)
  end))

  it("names a ReentrantMutex's holder, with its depth, without debug mode", h.async(function()
    local rm = am.ReentrantMutex.new()
    local r1 = rm:acquire()
    local r2 = rm:acquire()
    local me = coroutine.running()
    local q = am.query(rm)
    assert.same({ { mode = "exclusive", owner = me, depth = 2 } }, q.held)
    local other = h.acquirer(nil, "o", rm)
    assert.equal(other.co, am.query(rm).pending[1].owner)
    r2(); r1(); h.tick()
    assert.same({ { mode = "exclusive", owner = other.co, depth = 1 } }, am.query(rm).held)
    other.release()
  end))

  it("leaves waitForUnlock waiters out: they request no hold", h.async(function()
    local m, rel = h.held(am.Mutex.new())
    local u = h.waiter(nil, "u", m)
    assert.same({}, am.query(m).pending)
    rel(); h.tick()
    assert.is_true(u.ok)
  end))

  it("shows a timed request while it waits, and not once it timed out", h.holding(am.Mutex.new, function(m)
    local t = h.acquirer(nil, "t", am.withTimeout(m, 10))
    assert.equal(t.co, am.query(m).pending[1].owner)
    h.wait_until(function() return t.done end)
    assert.equal(am.E_TIMEOUT, t.err)
    assert.same({}, am.query(m).pending)
  end))

  it("accepts decorated locks, and answers for the lock they decorate", h.holding(am.Mutex.new, function(m)
    assert.same({ "exclusive" }, modes(am.query(am.withTimeout(m, 5)).held))
    assert.same({ "exclusive" }, modes(am.query(am.tryAcquire(m)).held))
    assert.same({ "exclusive" }, modes(am.query(am.withLease(m, 1000)).held))
  end))

  it("makes new tables at each call, which later changes leave as they were", h.async(function()
    local m = am.Mutex.new()
    local q1 = am.query(m)
    local rel = m:acquire()
    local q2 = am.query(m)
    assert.are_not.equal(q1, q2)
    assert.same({ held = {}, pending = {} }, q1)
    q2.held[1].mode = "changed"
    assert.same({ "exclusive" }, modes(am.query(m).held))
    rel()
  end))
end)

describe("am.query with debug mode on", function()
  it("names each holder and the time of its grant (uv.hrtime() / 1e6), in grant order", h.async(function()
    am.debug.enable()
    local s = am.Semaphore.new(3)
    local t0 = require("luv").hrtime() / 1e6
    local _, r1 = s:acquire(2)
    local other = h.acquirer(nil, "o", s, 1)
    local q = am.query(s)
    assert.same({ "weighted", "weighted" }, modes(q.held))
    assert.same({ 2, 1 }, field(q.held, "weight"))
    assert.equal(coroutine.running(), q.held[1].owner)
    assert.equal(other.co, q.held[2].owner)
    assert.is_true(q.held[1].since >= t0 and q.held[2].since >= q.held[1].since)
    assert.is_true(q.held[2].since <= require("luv").hrtime() / 1e6)
    r1(); other.release()
    assert.same({}, am.query(s).held)
  end))

  it("shows holds granted before it was switched on without their holder, before the recorded ones", h.async(function()
    local rw = am.RWLock.new()
    local r1 = rw:acquireRead()
    am.debug.enable()
    local r2 = rw:acquireRead()
    local q = am.query(rw)
    assert.same({ "shared", "shared" }, modes(q.held))
    assert.is_nil(q.held[1].owner)
    assert.equal(coroutine.running(), q.held[2].owner)
    r2()
    assert.same({ "nil" }, field(am.query(rw).held, "owner"))
    r1()
    assert.same({}, am.query(rw).held)
  end))

  it("drops a hold an unscoped release ended", h.async(function()
    am.debug.enable()
    local m = am.Mutex.new()
    local rel = m:acquire()
    m:release()
    assert.same({}, am.query(m).held)
    assert.is_false(rel())
  end))
end)

describe("keyed:query([key])", function()
  it("gives one key's snapshot, or every key in use by key", h.async(function()
    local km, ra = h.held(am.KeyedRWLock.new(), "acquireWrite", "a")
    local rb = km:acquireRead(2)
    local w = h.requester("acquireRead", nil, "w", km, "a")
    local q = km:query("a")
    assert.same({ "exclusive" }, modes(q.held))
    assert.same({ "shared" }, modes(q.pending))
    assert.equal(w.co, q.pending[1].owner)
    assert.same(q, am.query(km, "a"))
    assert.same({ held = {}, pending = {} }, km:query("unused"))
    assert.equal(2, km:count())                  -- asking made no lock for "unused"
    local all = km:query()
    assert.same({ "exclusive" }, modes(all.a.held))
    assert.same({ "shared" }, modes(all[2].held))
    local n = 0
    for _ in pairs(all) do n = n + 1 end
    assert.equal(2, n)
    ra(); rb(); h.tick(); w.release()
    assert.same({}, km:query())
  end))

  it("works on keyed mutexes and semaphores, plain and decorated", h.async(function()
    local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(4)
    local r1 = km:acquire("x")
    local _, r2 = ks:acquire("y", 3)
    assert.same({ { mode = "exclusive" } }, km:query("x").held)
    assert.same({ { mode = "weighted", weight = 3 } }, ks:query("y").held)
    assert.same({ { mode = "exclusive" } }, am.withTimeout(km, 5):query("x").held)
    assert.same({ { mode = "exclusive" } }, am.query(am.tryAcquire(km), "x").held)
    r1(); r2()
  end))
end)

describe("am.query: bad input", function()
  it("rejects what is not a lock, a key for a lock without keys, and a bad key", h.async(function()
    assert.equal("bad argument #1 to 'query' (async_mutex lock expected, got table)",
      h.error_of(function() am.query({}) end))
    assert.equal("bad argument #1 to 'query' (async_mutex lock expected, got no value)",
      h.error_of(function() am.query() end))
    assert.equal("bad argument #2 to 'query' (no key expected: a Mutex has no keys)",
      h.error_of(function() am.query(am.Mutex.new(), "k") end))
    local km = am.KeyedMutex.new()
    assert.equal("bad argument #1 to 'query' (key must not be NaN)",
      h.error_of(function() km:query(0 / 0) end))
    assert.equal("bad argument #2 to 'query' (key must not be NaN)",
      h.error_of(function() am.query(km, 0 / 0) end))
  end))
end)
