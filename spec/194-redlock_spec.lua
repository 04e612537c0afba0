-- RedlockMutex (docs/redis-locks.md, "RedlockMutex"): a mutex held by a
-- quorum of N independent redis-servers, on the RedisMutex's queue, lease
-- and lost-lease machinery on each.  Granted with a majority; a minority
-- down, paused or restarted changes nothing; a majority down raises
-- E_UNAVAILABLE within the timeouts; fences strictly increase over the
-- quorum; a server up for less than ttl does not count; a partial grant
-- that makes no progress is given back (a split).

local R = require "lock_redis"
local uv = require "luv"

-- every lock here has a ttl <= 1000
local am, h, servers, fresh, clients = R.redlock_spec_file(setup, teardown, 3, 1000, "spec194")

-- Each test starts with servers old enough to count (a test before may
-- have restarted some): up for 2 s at least; and running (one that failed
-- while it had a server paused left it stopped, and redis-cli would wait
-- on it for ever: a hang of the whole suite instead of one failed case).
before_each(function()
  for _, s in ipairs(servers) do
    s:resume()
    for _ = 1, 100 do
      local up = tonumber(s:cli("INFO server"):match("uptime_in_seconds:(%d+)"))
      if up and up >= 2 then break end
      uv.sleep(50)
    end
  end
end)

local function close_all(...)
  for _, list in ipairs({ ... }) do
    for _, c in ipairs(list) do c:close() end
  end
end

-- How many servers have a holder of 'name' right now.
local function holders(cs, name)
  local n = 0
  for _, c in ipairs(cs) do
    local ok, r = pcall(c.call, c, "HLEN", name .. ":h")
    if ok and r > 0 then n = n + 1 end
  end
  return n
end

describe("RedlockMutex", function()
  it("is held with a quorum, handed from process to process, with increasing fences",
    h.async(function()
      local ca, cb = clients(), clients()
      local name = fresh()
      local qa = am.RedlockMutex.new(ca, name, { ttl = 1000 })
      local qb = am.RedlockMutex.new(cb, name, { ttl = 1000 })
      assert.equal("async_mutex.RedlockMutex (" .. name .. ", 3 servers, quorum 2)", tostring(qa))
      assert.is_false(qa:isLocked())
      local r = qa:acquire()
      assert.equal("async_mutex.RedisReleaser", getmetatable(r).__name)
      assert.is_true(r:check())
      assert.is_true(qb:isLocked())
      assert.equal(3, holders(ca, name))
      local got
      h.spawn(function() got = qb:acquire() end)
      h.sleep(50)
      assert.is_nil(got)
      assert.is_true(r())
      h.wait_until(function() return got ~= nil end)
      assert.is_true(got.fence > r.fence)
      assert.is_false(r())
      assert.is_false(r:check())
      -- fences go on increasing, turn after turn
      assert.is_true(got())
      R.fences_increase(20, got.fence, function(i) return (i % 2 == 0 and qa or qb):acquire() end)
      -- a release returns once a quorum answered, and a server's grant that
      -- came after the quorum joins the hold or is given back, in the
      -- background (docs/redis-locks.md, RedlockMutex): none left soon after
      h.wait_until(function() return holders(ca, name) == 0 end, 2000,
        "every server's lease given back")
      close_all(ca, cb)
    end))

  it("is decorated, tried, canceled, run, and released unscoped as a RedisMutex", h.async(function()
    local ca, cb = clients(), clients()
    local name = fresh()
    local qa = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    local qb = am.RedlockMutex.new(cb, name, { ttl = 1000 })
    local r = qa:acquire()
    assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(am.tryAcquire(qb).acquire, am.tryAcquire(qb))))
    local t0 = uv.hrtime()
    assert.equal(am.E_TIMEOUT, select(2, pcall(am.withTimeout(qb, 80).acquire, am.withTimeout(qb, 80))))
    assert.is_true((uv.hrtime() - t0) / 1e6 >= 80)
    local w = h.requester("acquire", nil, "w", qb)
    h.sleep(30)
    qb:cancel()
    h.wait_until(function() return w.done end)
    assert.equal(am.E_CANCELED, w.err)
    h.sleep(30)                                   -- the withdrawals are in
    assert.is_true(qa:release())                 -- the oldest hold of this process
    assert.is_false(r())
    assert.is_false(qa:release())
    assert.equal(6, qb:runExclusive(function() return 6 end))
    local x = am.tryAcquire(qb):acquire()       -- nothing left of the canceled one
    x()
    close_all(ca, cb)
  end))

  it("tells its holder when fewer than a quorum of leases are left (onLost), once",
    h.async(function()
      local ca = clients()
      local name = fresh()
      local lost = {}
      local q = am.RedlockMutex.new(ca, name, { ttl = 300, renewInterval = 0,
        onLost = function(info) lost[#lost + 1] = info end })
      local t0 = uv.hrtime()
      local r = q:acquire()
      h.wait_until(function() return #lost == 1 end, 2000)
      local ms = (uv.hrtime() - t0) / 1e6
      assert.is_true(ms >= 300 - 5 - 50 and ms < 400 * h.TIME_SCALE, ms)
      h.sleep(30)
      assert.equal(1, #lost)
      assert.equal(r, lost[1].releaser)
      assert.equal(name, lost[1].name)
      assert.equal(r.fence, lost[1].fence)
      assert.equal("expired", lost[1].reason)
      assert.equal(am.E_LOST, select(2, pcall(r.check, r)))
      assert.is_false(r())
      local ok, err = pcall(q.runExclusive, q, function() h.sleep(400) end)
      assert.is_false(ok)
      assert.equal(am.E_LOST, err)
      close_all(ca)
    end))

  -- A hold lost by the local clock while the servers still have it (a
  -- renewal each ran, answered after the local end): its holder's release
  -- gives every server's lease back, as a RedisMutex's does (spec 45),
  -- and the next process does not wait the servers' leases out.
  it("is given back on every server by its holder's release once lost", h.async(function()
    local ca, cb = clients(), clients()
    -- (closed also when a check fails: x's watchdog would keep the loop)
    local _ca <close> = h.closing(table.unpack(ca))
    local _cb <close> = h.closing(table.unpack(cb))
    local name = fresh()
    local lost
    local q = am.RedlockMutex.new(ca, name, { ttl = 300, renewInterval = 0,
                                              onLost = function(i) lost = i.reason end })
    local r = q:acquire()
    for _, c in ipairs(cb) do R.extend_records(c, name) end
    h.wait_until(function() return lost ~= nil end, 2000, "the loss")
    assert.equal("expired", lost)
    assert.equal(3, holders(cb, name))             -- the servers still have it
    assert.is_false(r())
    local x = am.withTimeout(am.RedlockMutex.new(cb, name, { ttl = 1000 }), 2000):acquire()
    assert.is_true(x.fence > r.fence)
    assert.is_false(r())
    assert.is_true(x())
  end))

  it("goes on as before with a minority of servers down, paused or closed", h.async(function()
    local ca = clients({ commandTimeout = 300 })
    local name = fresh()
    local q = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    local r = q:acquire()
    servers[3]:pause()                            -- the hold keeps its quorum
    h.sleep(600)                                  -- renewals on the other two
    assert.is_true(r:check())
    r()
    local t0 = uv.hrtime()
    for _ = 1, 5 do q:acquire()() end            -- never waits for the paused one
    assert.is_true((uv.hrtime() - t0) / 1e6 < 300 * h.TIME_SCALE)
    servers[3]:resume()
    servers[2]:kill()
    for _ = 1, 5 do
      local x = q:acquire()
      assert.is_true(x:check())
      x()
    end
    servers[2]:start()
    close_all(ca)
  end, { deadline = 20000 }))

  it("raises E_UNAVAILABLE within the timeouts when a majority is down or paused", h.async(function()
    local ca = clients({ commandTimeout = 300 })
    local name = fresh()
    local q = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    q:acquire()()
    servers[1]:kill()
    servers[2]:pause()
    local t0 = uv.hrtime()
    local ok, err = pcall(q.acquire, q)
    local ms = (uv.hrtime() - t0) / 1e6
    assert.is_false(ok)
    assert.equal(am.E_UNAVAILABLE, err)
    -- it says why, server by server (the killed one, the paused one)
    assert.matches("^no quorum of 2 of 3 servers %(#1 .+; #2 .+%)$", err.reason)
    -- one commandTimeout and a little (the slack stretches, with the
    -- timeout's own overshoot, when the suite runs slowed down: valgrind
    -- took 666 ms)
    assert.is_true(ms < (300 + 50) * h.TIME_SCALE, ms)
    local _, err2 = pcall(q.isLocked, q)
    assert.equal(am.E_UNAVAILABLE, err2)
    assert.equal("1 of 3 servers answered (quorum 2)", err2.reason)
    servers[2]:resume()
    servers[1]:start()
    close_all(ca)
  end, { deadline = 20000 }))
end)

describe("RedlockMutex and restarted servers", function()
  it("does not count a server up for less than ttl, and its fences still increase",
    h.async(function()
      local ca = clients({ reconnectDelay = 10, reconnectDelayMax = 50 })
      local name = fresh()
      local q = am.RedlockMutex.new(ca, name, { ttl = 500 })
      local r = q:acquire()
      local f1 = r.fence
      r()
      -- a majority restarted without persistence: their holds and
      -- counters are gone
      -- (t0 before the first start: under load a start may take longer
      -- than ttl, and a quorum needs one of the two restarted servers,
      -- each up since after t0)
      servers[1]:kill()
      local t0 = uv.hrtime()
      servers[1]:start()
      servers[2]:kill(); servers[2]:start()
      local r2
      repeat
        local ok, got = pcall(q.acquire, q)
        if ok then r2 = got else assert.equal(am.E_UNAVAILABLE, got); h.sleep(20) end
      until r2
      local ms = (uv.hrtime() - t0) / 1e6
      assert.is_true(ms >= 500, ("counted after %.1f ms"):format(ms))
      -- their counters restart from their clocks (in us), above every fence
      assert.is_true(r2.fence > f1)
      r2()
      close_all(ca)
    end, { deadline = 20000 }))

  it("never counts a restarted server towards a second holder while the first holds",
    h.async(function()
      local ca, cb = clients({ reconnectDelay = 10, reconnectDelayMax = 50 }),
        clients({ reconnectDelay = 10, reconnectDelayMax = 50 })
      local name = fresh()
      local lost = {}
      local qa = am.RedlockMutex.new(ca, name, { ttl = 600, onLost = function()
        lost[#lost + 1] = uv.hrtime() end })
      local qb = am.RedlockMutex.new(cb, name, { ttl = 600 })
      local r = qa:acquire()
      servers[1]:kill(); servers[1]:start()       -- two of its three servers forget it
      servers[2]:kill(); servers[2]:start()
      local got_at
      h.spawn(function()
        local x
        repeat
          local ok, got = pcall(qb.acquire, qb)
          if ok then x = got else h.sleep(10) end
        until x
        got_at = uv.hrtime()
        x()
      end)
      h.wait_until(function() return got_at ~= nil end, 5000)
      -- the first was told before the second got in
      assert.equal(1, #lost)
      assert.is_true(lost[1] < got_at)
      assert.is_false(r())
      close_all(ca, cb)
    end, { deadline = 20000 }))
end)

describe("RedlockMutex's split", function()
  it("gives a partial grant back when it makes no progress, so the server goes on", h.async(function()
    local ca, cx = clients(), clients()
    local name = fresh()
    -- servers 1 and 2 held by plain RedisMutex holders: the Redlock gets
    -- server 3 only, and waits on the others
    local x1 = am.RedisMutex.new(cx[1], name, { ttl = 5000 }):acquire()
    local x2 = am.RedisMutex.new(cx[2], name, { ttl = 5000 }):acquire()
    local q = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    local w = h.requester("acquire", nil, "q", q)
    h.wait_until(function() return holders(ca, name) == 3 end)
    -- a plain waiter on server 3, behind the Redlock's partial grant
    local c3 = servers[3]:client()
    local t0 = uv.hrtime()
    local r3 = am.RedisMutex.new(c3, name, { ttl = 5000 }):acquire()
    local ms = (uv.hrtime() - t0) / 1e6
    assert.is_true(ms < 500 * h.TIME_SCALE, ("server 3 went on after %.1f ms"):format(ms))
    assert.is_false(w.done)
    -- once the others give their servers back, the Redlock completes
    x1(); x2(); r3()
    h.wait_until(function() return w.done end, 3000)
    assert.is_true(w.ok)
    assert.is_true(w.release())
    c3:close()
    close_all(ca, cx)
  end, { deadline = 20000 }))
end)

describe("RedlockMutex's hand-out", function()
  -- Redlock's validity (docs/redis-locks.md, "RedlockMutex", Validity) is
  -- ttl minus the time to acquire: a process that stalls between the
  -- grants and its caller's wake-up for longer than the leases run does
  -- not hand out the hold (its check() raised E_LOST at once, or the fence's
  -- RAISE found the grant gone: E_UNAVAILABLE; spec 279 under GC stress
  -- beside valgrind failed so).  Each server's counter N:qf is set first:
  -- equal, the grants' draws agree (no RAISE); apart, a RAISE follows.
  -- 'stalls': how many attempts stall (each its own quorum): one is
  -- acquired again; three in a row raise E_UNAVAILABLE, where a ttl
  -- shorter than the servers' time to grant it was retried for ever.
  local function stalled_acquisition(counters, stalls)
    stalls = stalls or 1
    local ca = clients()
    local _ca <close> = h.closing(table.unpack(ca))   -- (also when a check fails)
    local lost = {}
    -- (no watchdog: the acquire requests are the only ones on the clients)
    local opts = { ttl = 300, renewInterval = 0,
                   onLost = function(info) lost[#lost + 1] = info end }
    assert.is_true(am.RedlockMutex.new(ca, fresh(), opts):acquire()())   -- (ages, policies read)
    h.sleep(50)                        -- (the last server's release answered)
    local name = fresh()
    for i, c in ipairs(ca) do c:call("SET", name .. ":qf", tostring(counters[i])) end
    local q = am.RedlockMutex.new(ca, name, opts)
    -- The stall: in the loop turn that read the grants of a quorum, after
    -- the reads (a check handle), before the caller is resumed (at the
    -- next turn), the process blocks for longer than the leases run.
    local r, err, stalled = nil, nil, 0
    local stall = uv.new_check()
    local _ <close> = h.closing(stall)     -- (also when a check below fails)
    stall:start(function()
      if r or err then return end
      local answered = 0
      for _, c in ipairs(ca) do if c:pending() == 0 then answered = answered + 1 end end
      if answered >= 2 then
        stalled = stalled + 1
        if stalled == stalls then stall:stop() end
        uv.sleep(300 + 50)
      end
    end)
    h.spawn(function()
      local ok, e = pcall(q.acquire, q)
      if ok then r = e else err = e end
    end)
    h.wait_until(function() return r ~= nil or err ~= nil end, 5000, "the acquisition")
    assert.equal(stalls, stalled)
    if stalls < 3 then
      assert.is_nil(err)
      assert.is_true(r:check())
      assert.is_true(r())
    else
      assert.is_nil(r)
      assert.equal(am.E_UNAVAILABLE, err)
      assert.equal("3 quorums in a row were over before they could be handed out (ttl 300 ms):"
        .. " a ttl too short for these servers, or a process that stalls", err.reason)
      -- (each attempt's grants ran out in Redis during its stall, longer
      -- than ttl: their give-backs cannot be seen there)  Its gate is let
      -- go: the next acquisition goes on
      local x = am.withTimeout(q, 2000):acquire()
      assert.is_true(x:check())
      assert.is_true(x())
    end
    assert.same({}, lost)
  end

  it("never hands out a hold that is over already: it acquires again", h.async(function()
    stalled_acquisition({ 100, 100, 100 })
    stalled_acquisition({ 300, 200, 100 })
    stalled_acquisition({ 100, 100, 100 }, 2)
  end))

  it("gives up with E_UNAVAILABLE after three in a row were over", h.async(function()
    stalled_acquisition({ 100, 100, 100 }, 3)
  end))
end)

describe("RedlockMutex's usage errors", function()
  it("are the Redis locks', and its own, at the caller's line", h.async(function()
    local ca = clients()
    h.raises_at_caller({ function() am.RedlockMutex.new(ca[1], "x") end,
      "bad argument #1 to 'new' (array of redis clients expected, got async_mutex.redis.Client)" })
    h.raises_at_caller({ function() am.RedlockMutex.new({}, "x") end,
      "bad argument #1 to 'new' (array of redis clients must not be empty)" })
    h.raises_at_caller({ function() am.RedlockMutex.new({ ca[1], 5 }, "x") end,
      "bad argument #1 to 'new' (client #2: redis client expected, got number)" })
    h.raises_at_caller({ function() am.RedlockMutex.new({ ca[1], ca[2], ca[1] }, "x") end,
      "bad argument #1 to 'new' (client #3 is client #1 again (each server counts once))" })
    h.raises_at_caller({ function() am.RedlockMutex.new(ca, "") end,
      "bad argument #2 to 'new' (lock name must be a non-empty string, got string)" })
    h.raises_at_caller({ function() am.RedlockMutex.new(ca, "x", { tll = 5 }) end,
      "bad argument #3 to 'new' (unknown option 'tll'; did you mean 'ttl'? options: cancelError,"
      .. " lostError, onLost, renewInterval, ttl, unsafeEviction, waiterTimeout)" })
    local q = am.RedlockMutex.new(ca, fresh())
    h.raises_at_caller({ function() q:acquire("p") end,
      "bad argument #1 to 'acquire' (priority must be a number, got string)" })
    h.raises_at_caller({ function() q:runExclusive(3) end,
      "bad argument #1 to 'runExclusive' (function expected, got number)" })
    ca[2]:close()
    h.raises_at_caller({ function() q:acquire() end, "attempt to use a closed redis client" })
    close_all(ca)
  end))
end)
