-- RedisRWLock's grants in Redis (docs/redis-locks.md, "RedisRWLock" and
-- "In Redis"): the readers at the head of the queue are granted by one
-- dispatch, a batch of heads at a time, and the common requests take
-- short paths before the scripts' prelude (a reader beside readers, a
-- request that must queue, a reader's release that can grant nothing).
-- None of them may grant past a queued writer, grant a reader beside a
-- writer, or give fences out of order; a dead head is still skipped at
-- once.  Each client stands for a process here (its own channel and
-- tokens), and the last test runs 4 real processes.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec276")

local WRITE = 1 << 40

-- The holders in Redis: how many, and whether one of them writes.
local function holders(c, name)
  local now = R.server_ms(c)
  local all = c:call("HGETALL", name .. ":h")
  local n, writer = 0, false
  for i = 2, #all, 2 do
    local e, w = all[i]:match("^(%d+) (%d+)")
    if tonumber(e) >= now then
      n = n + 1
      if tonumber(w) == WRITE then writer = true end
    end
  end
  return n, writer
end

describe("RedisRWLock's batch grants", function()
  it("never pass a queued writer: readers, writer, readers, writer, readers, in order",
    h.async(function()
      local cs = {}
      for i = 1, 6 do cs[i] = server:client() end
      local _ <close> = h.closing(table.unpack(cs))
      local name = fresh_name()
      local rw = {}
      for i = 1, 6 do rw[i] = am.RedisRWLock.new(cs[i], name) end
      local r0 = rw[1]:acquireRead()
      local function queue(method, i, label)
        local before = R.queued(cs[1], name)
        local q = h.requester(method, nil, label, rw[i])
        h.wait_until(function() return R.queued(cs[1], name) == before + 1 end)
        return q
      end
      -- behind the reader that holds: a writer, 3 readers (of 2 clients:
      -- one of them with 2), a writer, 2 readers
      local w1 = queue("acquireWrite", 2, "w1")
      local r1 = queue("acquireRead", 3, "r1")
      local r2 = queue("acquireRead", 3, "r2")
      local r3 = queue("acquireRead", 4, "r3")
      local w2 = queue("acquireWrite", 5, "w2")
      local r4 = queue("acquireRead", 6, "r4")
      local r5 = queue("acquireRead", 6, "r5")
      -- a reader that comes while a writer waits queues, though a reader holds
      assert.same({ 1, false }, { holders(cs[1], name) })
      assert.equal(7, R.queued(cs[1], name))

      assert.is_true(r0())
      h.wait_until(function() return w1.done end)
      h.sleep(30)
      assert.same({ 1, true }, { holders(cs[1], name) })
      assert.is_true(w1.release.fence > r0.fence)
      for _, r in ipairs({ r1, r2, r3, w2, r4, r5 }) do assert.is_false(r.done, r.name) end

      assert.is_true(w1.release())
      h.wait_until(function() return r1.done and r2.done and r3.done end)
      h.sleep(30)
      -- the three readers at the head together, in order, and nobody past w2
      assert.same({ 3, false }, { holders(cs[1], name) })
      assert.is_false(w2.done)
      assert.is_false(r4.done)
      assert.is_false(r5.done)
      assert.is_true(r1.release.fence > w1.release.fence)
      assert.equal(r1.release.fence + 1, r2.release.fence)
      assert.equal(r2.release.fence + 1, r3.release.fence)

      -- a reader's release while readers hold and a writer waits: nothing
      assert.is_true(r2.release())
      h.sleep(30)
      assert.is_false(w2.done)
      assert.is_true(r1.release())
      assert.is_true(r3.release())
      h.wait_until(function() return w2.done end)
      h.sleep(30)
      assert.same({ 1, true }, { holders(cs[1], name) })
      assert.is_false(r4.done)
      assert.is_false(r5.done)
      assert.is_true(w2.release.fence > r3.release.fence)

      assert.is_true(w2.release())
      h.wait_until(function() return r4.done and r5.done end)
      assert.same({ 2, false }, { holders(cs[1], name) })
      assert.is_true(r4.release.fence > w2.release.fence)
      assert.equal(r4.release.fence + 1, r5.release.fence)
      assert.is_true(r4.release())
      assert.is_true(r5.release())
      assert.is_false(rw[1]:isLocked())
      assert.equal(0, R.queued(cs[1], name))
    end))

  it("grant more readers than one batch, and stop at the writer behind them", h.async(function()
    -- A slowed process (GC stress, valgrind) may take longer than the
    -- default waiterTimeout (3 s) to renew 150 places, or 150 first leases
    -- of a hand-off (docs/redis-locks.md, "Waiting without polling"):
    -- its writer is then skipped as dead and its readers' holds are lost,
    -- as documented, and the test, which waits for that writer, stalls;
    -- and longer than connectTimeout (2 s) to connect while 150 requests
    -- wait for it (E_UNAVAILABLE).  So the waiters here get a first lease
    -- and a place as long as the ttl, and the clients 20 s to connect.
    local slow = h.SLOW and { connectTimeout = 20000 } or nil
    local a, b, c, d = server:client(slow), server:client(slow), server:client(slow),
                       server:client(slow)
    local _ <close> = h.closing(a, b, c, d)
    local name = fresh_name()
    local opts = h.SLOW and { waiterTimeout = 30000 } or nil
    local ra, rb, rc, rd = am.RedisRWLock.new(a, name, opts), am.RedisRWLock.new(b, name, opts),
                           am.RedisRWLock.new(c, name, opts), am.RedisRWLock.new(d, name, opts)
    local w = ra:acquireWrite()
    -- 150 readers: more than a batch (64); 3 under GC stress, for time
    -- (AM_GC_STRESS=1 AM_STRESS_SCALE=50 runs all 150)
    local N = h.GC_STRESS and math.max(3, h.load(150)) or 150
    local readers = {}
    for i = 1, N do readers[i] = h.requester("acquireRead", nil, "r" .. i, rb) end
    h.wait_until(function() return R.queued(a, name) == N end, 10000)
    local w2 = h.requester("acquireWrite", nil, "w2", rc)
    h.wait_until(function() return R.queued(a, name) == N + 1 end)
    local r_late = h.requester("acquireRead", nil, "late", rd)
    h.wait_until(function() return R.queued(a, name) == N + 2 end)
    assert.is_true(w())
    h.wait_until(function()
      for i = 1, N do if not readers[i].done then return false end end
      return true
    end)
    h.sleep(30)
    assert.same({ N, false }, { holders(a, name) })
    assert.is_false(w2.done)
    assert.is_false(r_late.done)
    -- one grant after the other: consecutive fences, in arrival order
    local seen = {}
    for i = 1, N do
      assert.is_true(readers[i].ok)
      seen[#seen + 1] = readers[i].release.fence
    end
    table.sort(seen)
    for i = 2, N do assert.equal(seen[i - 1] + 1, seen[i]) end
    assert.is_true(seen[1] > w.fence)
    for i = 1, N do assert.is_true(readers[i].release()) end
    h.wait_until(function() return w2.done end)
    assert.same({ 1, true }, { holders(a, name) })
    assert.is_true(w2.release.fence > seen[N])
    assert.is_false(r_late.done)
    assert.is_true(w2.release())
    h.wait_until(function() return r_late.done end)
    assert.is_true(r_late.release.fence > w2.release.fence)
    assert.is_true(r_late.release())
  end, { deadline = 30000 }))

  it("skip a dead writer at the head at once, at the last reader's release", h.async(function()
    local ra, rb, a, b, name = R.two_locks(server, fresh_name, am.RedisRWLock)
    local _ <close> = h.closing(a, b)
    local r0 = ra:acquireRead()
    -- a writer of a process that then dies: queued with a deadline 100 ms on
    local r = a:eval(scripts.acquire, scripts.keys(name),
      { "dead:1", tostring(WRITE), tostring(WRITE), "30000", "100", "async_mutex:dead", "wait" })
    assert.equal(0, r[1])
    local r1 = h.requester("acquireRead", nil, "r1", rb)
    h.wait_until(function() return R.queued(a, name) == 2 end)
    h.sleep(150)                          -- the dead writer's deadline passes
    assert.is_false(r1.done)
    local t0 = require("luv").hrtime()
    assert.is_true(r0())
    -- granted by that release, not at its own request a third of
    -- waiterTimeout (1 s) later
    h.wait_until(function() return r1.done end)
    assert.is_true((require("luv").hrtime() - t0) / 1e6 < 500)
    assert.same({ 1, false }, { holders(a, name) })
    assert.is_true(r1.release())
    assert.equal(0, R.queued(a, name))
  end))
end)

describe("RedisRWLock's grants across 4 processes", function()
  -- 20 % writes from 4 processes of 6 coroutines (R.rw_workers_on; so
  -- that many readers queue behind each writer and are granted together):
  -- each section writes its begin and end, with its mode and fence, to one
  -- O_APPEND file.  Besides the overlaps, the fences: every section that began
  -- before a write began was granted before it (a smaller fence), every
  -- one that began after it ended was granted after it (a larger one); a
  -- reader granted beside a writer, even one that ended before the
  -- writer wrote its begin, breaks that.
  it("never let a writer overlap anyone or be passed (markers and fences in one file)",
    h.async(function()
      local bad, shared, sections, writes, events = R.rw_workers_on(server, fresh_name(), 40,
        { ttl = 5000, coroutines = 6, writes = 0.2, pause = 1 })
      local misordered = 0
      local max_begun = 0             -- the largest fence of the sections begun so far
      local open_w                    -- the fence of a write between its begin and end
      local last_w_end = 0            -- the fence of the last write that ended
      for _, e in ipairs(events) do
        if e.kind == "B" then
          if e.mode == "W" then
            if e.fence <= max_begun then misordered = misordered + 1 end
            open_w = e.fence
          end
          if e.fence <= last_w_end then misordered = misordered + 1 end
          if e.fence > max_begun then max_begun = e.fence end
        elseif e.mode == "W" then
          open_w, last_w_end = nil, e.fence
        end
      end
      assert.is_nil(open_w)
      assert.equal(4 * 6 * 40, sections)
      assert.equal(0, bad)
      assert.equal(0, misordered)
      assert.is_true(writes > 0)
      assert.is_true(shared > 0)
    end, { deadline = 90000 }))
end)
