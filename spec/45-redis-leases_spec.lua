-- Redis locks: leases, the watchdog, lost holds (onLost, check, E_LOST,
-- releasers returning false), fencing tokens, and the server failing
-- (docs/redis-locks.md, "Leases" and "Failures"; the vocabulary is
-- docs/semantics.md, "Leases and lost holds").

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec45")

-- The tokens holding 'name' in Redis.
local holders = R.holder_tokens

describe("am.E_LOST", function()
  it("is the lease vocabulary's exact string", function()
    assert.equal("lock lost: lease expired", am.E_LOST)
  end)
end)

describe("the watchdog", function()
  it("keeps a lock held for 5 times its TTL", with.two_clients(function(a, b, name)
    local lost = false
    -- a renewal is due every ttl / 3: the lease is lost only if the process
    -- stalls for about 2/3 of the TTL, which a loaded machine does for
    -- 100 ms (renewals are slower still under GC stress)
    local ttl = 400 * h.TIME_SCALE
    local ma = am.RedisMutex.new(a, name, { ttl = ttl, onLost = function() lost = true end })
    local tb = am.tryAcquire(am.RedisMutex.new(b, name))
    local release = ma:acquire()
    local t0 = uv.hrtime()
    while h.ms_since(t0) < 5 * ttl do
      h.sleep(50)
      assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(tb.acquire, tb)))
    end
    assert.is_true(release:check())
    assert.is_false(lost)
    assert.is_true(release())
    a:call("PING")                         -- the release has reached the server
    local rb = tb:acquire()
    rb()
  end, { deadline = 20000 }))
end)

describe("a lease that runs out", function()
  it("is lost: onLost fires, check raises E_LOST, the releaser returns false", with.one_client(function(c, name)
    local info
    local m = am.RedisMutex.new(c, name, { ttl = 50, renewInterval = 0,
                                           onLost = function(i) info = i end })
    local release = m:acquire()
    h.wait_until(function() return info ~= nil end)
    assert.equal(name, info.name)
    assert.equal(release.fence, info.fence)
    assert.equal("expired", info.reason)
    assert.equal(release, info.releaser)
    assert.same({ false, am.E_LOST }, { pcall(release.check, release) })
    assert.is_false(release())
    assert.is_false(m:release())
  end))

  it("is reported by onLost within 10 ms of its local end", with.one_client(function(c, name)
    local lost_at, due_at
    local m = am.RedisMutex.new(c, name, { ttl = 200, renewInterval = 0,
                                           onLost = function() lost_at = uv.hrtime() end })
    uv.update_time()
    local sent = uv.hrtime()
    -- the lease ends ttl minus the drift allowance (ttl/100 + 2 ms) after
    -- the request was sent; a timer of the loop due then tells how late
    -- the loop itself runs (a loaded machine delays both alike)
    local due = uv.new_timer()
    due:start(200 - 4, 0, function() due_at = uv.hrtime(); due:close() end)
    local release = m:acquire()
    h.wait_until(function() return lost_at ~= nil and due_at ~= nil end)
    local late = (lost_at - sent) / 1e6 - (200 - 4)
    assert.is_true(late >= 0, "reported before the end of the lease")
    local behind = (lost_at - due_at) / 1e6
    if not h.SLOW then
      assert.is_true(behind < 10, ("reported %.1f ms after the loop's own timer"):format(behind))
    end
    assert.is_false(release())
  end))

  it("uses a custom lostError, raised unchanged", with.client(function(c)
    local e = setmetatable({}, { __name = "my lost" })
    local m = am.RedisMutex.new(c, fresh_name(), { ttl = 30, renewInterval = 0, lostError = e })
    local release = m:acquire()
    h.sleep(60)
    local ok, err = pcall(release.check, release)
    assert.is_false(ok)
    assert.equal(e, err)
  end))

  it("makes runExclusive raise E_LOST when the function returns", h.async(function()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex, { ttl = 30, renewInterval = 0 })
    local ran = false
    local ok, err = pcall(m.runExclusive, m, function()
      h.sleep(60)
      ran = true
      return "result computed without the lock"
    end)
    assert.is_true(ran)
    assert.same({ false, am.E_LOST }, { ok, err })
    c:close()
  end))

  -- Lost by the local clock while Redis still has it (a renewal it ran,
  -- answered here after the lease's local end: R.extend_records): its
  -- holder's release gives it back (once: a second release sends
  -- nothing), whoever saw the loss first: the release itself (the loop
  -- did not run), the lease's own timer at its local end (the usual
  -- case), or check().  The next holder does not wait the 10 s out.
  for _, first in ipairs({ "release", "timer", "check" }) do
    it("is given back by its holder's release, the loss seen first by the " .. first,
      with.two_clients(function(a, b, name)
        local lost
        local ma = am.RedisMutex.new(a, name, { ttl = 200, renewInterval = 0,
                                                onLost = function(i) lost = i.reason end })
        local ra = ma:acquire()
        assert.same({ ra.token }, R.extend_records(b, name))
        if first == "timer" then
          h.wait_until(function() return lost ~= nil end, 2000, "the timer's loss")
        else
          uv.sleep(250)                    -- (the loop does not run: no timer reports it)
          if first == "check" then
            assert.equal(am.E_LOST, select(2, pcall(ra.check, ra)))
          end
        end
        if first ~= "release" then                     -- (a call yields: the timer runs)
          assert.same({ ra.token }, holders(b, name))  -- Redis still has it
        end
        assert.is_false(ra())
        assert.equal("expired", lost)
        local rb = am.withTimeout(am.RedisMutex.new(b, name), 2000):acquire()
        assert.is_true(rb.fence > ra.fence)
        assert.is_false(ra())                          -- nothing of rb's hold
        a:call("PING")
        assert.same({ rb.token }, holders(b, name))
        assert.is_true(rb())
      end))
  end

  it("lets the next process in, and a late release deletes nothing of its hold", with.two_clients(function(a, b, name)
    local ma = am.RedisMutex.new(a, name, { ttl = 40, renewInterval = 0 })
    local mb = am.RedisMutex.new(b, name)
    local ra = ma:acquire()
    local rb = mb:acquire()                -- waits for A's lease to run out
    assert.is_true(rb.fence > ra.fence)
    local before = holders(b, name)
    assert.equal(1, #before)
    assert.is_false(ra())                  -- A's late release
    a:call("PING")                         -- A's release has reached the server
    assert.same(before, holders(b, name))
    assert.is_true(rb:check())
    assert.is_true(rb())
  end))
end)

describe("fencing tokens", function()
  it("keep increasing across a restart of a server without persistence", h.async(function()
    local s = R.server()
    local c = s:client()
    local m = am.RedisMutex.new(c, "fence")
    local r1 = m:acquire()
    r1()
    s:kill()
    s:start()
    local r2
    for _ = 1, 50 do                       -- the first call may find the old connection gone
      local ok, rel = pcall(m.acquire, m)
      if ok then r2 = rel; break end
      assert.equal(am.E_UNAVAILABLE, rel)
      h.sleep(10)
    end
    assert.is_true(r2.fence > r1.fence)
    r2()
    c:close()
    s:stop()
  end))
end)

describe("the server paused (SIGSTOP) past the TTL while held", function()
  it("tells the holder, and leaves no ghost once it resumes", h.async(function()
    local s = R.server()
    local a, b = s:client(), s:client()
    local name = "paused"
    local lost = 0
    local ma = am.RedisMutex.new(a, name, { ttl = 150, onLost = function() lost = lost + 1 end })
    local mb = am.RedisMutex.new(b, name)
    local release = ma:acquire()
    s:pause()
    h.wait_until(function() return lost == 1 end)
    assert.same({ false, am.E_LOST }, { pcall(release.check, release) })
    assert.is_false(release())
    s:resume()
    local rb = mb:acquire()                -- granted: A's hold is gone in Redis too
    assert.is_true(rb.fence > release.fence)
    rb()
    assert.equal(1, lost)
    a:close(); b:close()
    s:stop()
  end))
end)

describe("the server restarted mid-contention", function()
  it("fails the calls in flight with E_UNAVAILABLE, then serves everyone again, one at a time", h.async(function()
    local s = R.server()
    local name = "restart"
    local inside, max_inside, unavailable, sections = 0, 0, 0, 0
    local clients, stop, finished = {}, false, 0
    for i = 1, 3 do
      clients[i] = s:client()
      local m = am.RedisMutex.new(clients[i], name, { ttl = 2000 })
      h.spawn(function()
        while not stop do
          local ok, release = pcall(m.acquire, m)
          if ok then
            inside = inside + 1
            max_inside = math.max(max_inside, inside)
            h.sleep(1)
            inside = inside - 1
            sections = sections + 1
            release()
          else
            assert.equal(am.E_UNAVAILABLE, release)
            unavailable = unavailable + 1
            h.sleep(10)
          end
        end
        finished = finished + 1
      end)
    end
    h.wait_until(function() return sections >= 30 end, 5000)
    s:kill()
    h.wait_until(function() return unavailable >= 3 end, 5000)
    s:start()
    local after = sections
    h.wait_until(function() return sections >= after + 30 end, 10000)
    stop = true
    h.wait_until(function() return finished == 3 end, 5000)
    assert.equal(1, max_inside)
    for i = 1, 3 do clients[i]:close() end
    s:stop()
  end, { deadline = 30000 }))
end)

describe("Redis unavailable", function()
  it("makes acquire raise E_UNAVAILABLE at once, holding nothing", h.async(function()
    local s = R.server()
    -- no timeout to wait for: only the refused connection can end the call
    local c = s:client({ connectTimeout = math.huge, commandTimeout = math.huge })
    local m = am.RedisMutex.new(c, "down")
    s:stop()
    assert.same({ false, am.E_UNAVAILABLE }, { pcall(m.acquire, m) })
    -- the local gate was given back: the next attempt gets the same answer
    assert.same({ false, am.E_UNAVAILABLE }, { pcall(m.acquire, m) })
    c:close()
  end))

  it("is used again after a restart", h.async(function()
    local s = R.server()
    local c = s:client()
    local m = am.RedisMutex.new(c, "again")
    m:acquire()()
    s:kill()
    assert.same({ false, am.E_UNAVAILABLE }, { pcall(m.acquire, m) })
    s:start()
    local release
    for _ = 1, 100 do                      -- the client's back-off may refuse at first
      local ok, r = pcall(m.acquire, m)
      if ok then release = r; break end
      assert.equal(am.E_UNAVAILABLE, r)
      h.sleep(20)
    end
    assert.is_true(release())
    c:close()
    s:stop()
  end))
end)
