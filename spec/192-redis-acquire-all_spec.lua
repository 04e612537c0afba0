-- KeyedRedisMutex:acquireAll and runExclusiveAll (docs/redis-locks.md,
-- "Several keys at once"): every key or none; one atomic request when all
-- their locks are free, otherwise one key at a time in the canonical order
-- every process shares, so overlapping sets never deadlock; a key that
-- cannot be had gives back the keys taken before it; the releaser gives
-- every key back, even when one of them was lost.

local R = require "lock_redis"

local am, h, server, fresh, with = R.spec_file(setup, teardown, "spec192")

-- The keys of 'names' held in Redis right now (their N:h exists).
local function held(client, prefix, names)
  local out = {}
  for _, k in ipairs(names) do
    if client:call("EXISTS", prefix .. k .. ":h") == 1 then out[#out + 1] = k end
  end
  return out
end

describe("KeyedRedisMutex:acquireAll", function()
  it("takes free keys in one atomic request, and gives them all back", with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, a, _, prefix)
    assert.is_false(ka:isLocked("x"))          -- connected; the eviction policy read
    local before = R.scripts_run(a)
    local all = ka:acquireAll({ "y", 3, "x", "3", "y" })
    assert.equal(before + 1, R.scripts_run(a))
    assert.equal("async_mutex.RedisMultiReleaser", getmetatable(all).__name)
    assert.same({ "3", "x", "y" }, held(a, prefix, { "3", "x", "y" }))
    assert.is_number(all.fences.x)
    assert.equal(all.fences[3], all.fences["3"])  -- one lock: 3 and "3"
    assert.is_true(all:check())
    assert.equal(am.E_ALREADY_LOCKED, select(2, pcall(am.tryAcquire(kb).acquire,
      am.tryAcquire(kb), "x")))
    assert.is_true(all())
    assert.is_false(all())
    assert.is_false(all:check())
    assert.same({}, held(a, prefix, { "3", "x", "y" }))
    local r = kb:acquire("y")
    assert.is_true(r.fence > all.fences.y)
    r()
  end))

  it("waits for held keys one at a time in the canonical order, holding those before them",
    with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, _, b, prefix)
      local rm = kb:acquire("m")
      local w = h.requester("acquireAll", nil, "all", ka, { "z", "m", "a" })
      h.wait_until(function() return R.queued(b, prefix .. "m") == 1 end)
      assert.same({ "a" }, held(b, prefix, { "a", "z" }))   -- "a" taken, "z" not yet
      assert.is_false(w.done)
      rm()
      h.wait_until(function() return w.done end)
      assert.is_true(w.ok)
      assert.same({ "a", "m", "z" }, held(b, prefix, { "a", "m", "z" }))
      assert.is_true(w.release())
    end))

  it("gives back the keys it took when one cannot be had: timeout, cancel, try", with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, _, b, prefix)
    local rm = kb:acquire("m")
    -- a bound on the whole acquisition
    local t0 = require("luv").hrtime()
    local ok, err = pcall(am.withTimeout(ka, 150).acquireAll, am.withTimeout(ka, 150),
      { "a", "m", "z" })
    local ms = (require("luv").hrtime() - t0) / 1e6
    assert.is_false(ok)
    assert.equal(am.E_TIMEOUT, err)
    assert.is_true(ms >= 150 and ms < 1000, ms)
    h.wait_until(function() return #held(b, prefix, { "a", "z" }) == 0 end, 1000)
    assert.equal(0, R.queued(b, prefix .. "m"))
    -- a try decides at once, all or nothing: nothing is ever taken
    local before = R.scripts_run(b)
    ok, err = pcall(am.tryAcquire(ka).acquireAll, am.tryAcquire(ka), { "a", "m" })
    assert.is_false(ok)
    assert.equal(am.E_ALREADY_LOCKED, err)
    assert.equal(before + 1, R.scripts_run(b))        -- one atomic request
    assert.same({}, held(b, prefix, { "a" }))
    -- cancel
    local w = h.requester("acquireAll", nil, "all", ka, { "a", "m" })
    h.wait_until(function() return R.queued(b, prefix .. "m") == 1 end)
    ka:cancel()
    h.wait_until(function() return w.done end)
    assert.equal(am.E_CANCELED, w.err)
    h.wait_until(function() return #held(b, prefix, { "a" }) == 0 end, 1000)
    rm()
  end))

  it("gives every key back even when one of them was lost; the lost one is reported",
    with.client(function(a)
      local prefix = fresh() .. ":"
      local lost = {}
      local ka = am.KeyedRedisMutex.new(a, prefix, { onLost = function(info)
        lost[#lost + 1] = info.name end })
      local all = ka:acquireAll({ "a", "b", "c" })
      a:call("DEL", prefix .. "b:h")             -- Redis no longer has "b"
      assert.is_false(all())
      assert.same({ prefix .. "b" }, lost)
      assert.same({}, held(a, prefix, { "a", "b", "c" }))
      assert.equal(am.E_LOST, select(2, pcall(all.check, all)))
    end))

  it("runExclusiveAll calls fn holding every key, and raises the lost error", with.client(function(a)
    local prefix = fresh() .. ":"
    -- (ttl stretched where the process is slow: valgrind, GC stress)
    local ttl = 100 * h.TIME_SCALE
    local ka = am.KeyedRedisMutex.new(a, prefix, { ttl = ttl, renewInterval = 0 })
    assert.same({ 1, 2 }, { ka:runExclusiveAll({ "p", "q" }, function()
      assert.same({ "p", "q" }, held(a, prefix, { "p", "q" }))
      return 1, 2
    end) })
    assert.same({}, held(a, prefix, { "p", "q" }))
    local ok, err = pcall(ka.runExclusiveAll, ka, { "p", "q" }, function() h.sleep(2 * ttl) end)
    assert.is_false(ok)
    assert.equal(am.E_LOST, err)
  end))

  it("is given back by client:close(), at once", h.async(function()
    local ka, kb, a, b, prefix = R.two_keyed_locks(server, fresh, am.KeyedRedisMutex)
    local all = ka:acquireAll({ "a", "b" })
    local got
    h.spawn(function() got = kb:acquireAll({ "b", "a" }) end)
    h.wait_until(function() return R.queued(b, prefix .. "a") == 1 end)
    a:close()
    h.wait_until(function() return got ~= nil end, 1000)
    assert.is_false(all())
    assert.is_true(got())
    b:close()
  end))
end)

describe("acquireAll from 4 processes over overlapping keys in random order", function()
  -- Each section takes 1 to 4 of 6 keys, listed in a random order, and
  -- writes a begin and an end marker per key to one O_APPEND file.
  local WORKER = R.WORKER_PROLOGUE .. [[
local km = am.KeyedRedisMutex.new(client, NAME, { ttl = 3000 })
local KEYS = { "a", "b", "c", "d", "e", "f" }
main(function()
  in_parallel(2, function(c)
    for i = 1, tonumber(N) do
      local pick = some_of(KEYS)
      for j = #pick, 2, -1 do
        local r = math.random(j)
        pick[j], pick[r] = pick[r], pick[j]
      end
      local id = ("%s.%d.%d"):format(ID, c, i)
      km:runExclusiveAll(pick, function()
        for _, k in ipairs(pick) do f:write(("B %s %s\n"):format(k, id)) end
        if math.random() < 0.5 then am.sleep(math.random(0, 2)) end
        for _, k in ipairs(pick) do f:write(("E %s %s\n"):format(k, id)) end
      end)
    end
  end)
  f:close()
end)
]]

  it("never deadlock, and never hold a key twice (markers in one O_APPEND file)",
    h.async(function()
      local prefix = fresh() .. ":"
      local log = R.run_workers(WORKER, 4, server.path, prefix, 80)
      local overlaps, sections = R.key_overlaps_in(log)
      os.remove(log)
      assert.is_true(sections >= 4 * 2 * 80)
      assert.equal(0, overlaps)
      local c = server:client()
      for _, k in ipairs({ "a", "b", "c", "d", "e", "f" }) do
        assert.equal(0, c:call("EXISTS", prefix .. k .. ":h", prefix .. k .. ":q"))
      end
      c:close()
    end, { deadline = 60000 }))
end)

describe("acquireAll's usage errors", function()
  it("are the local acquireAll's, and the Redis keys', at the caller's line", h.async(function()
    local c = server:client()
    local km = am.KeyedRedisMutex.new(c, "")
    h.raises_at_caller({ function() km:acquireAll("a") end,
      "bad argument #1 to 'acquireAll' (table of keys expected, got string)" })
    h.raises_at_caller({ function() km:acquireAll({}) end,
      "bad argument #1 to 'acquireAll' (key set must not be empty)" })
    h.raises_at_caller({ function() km:acquireAll({ "a", true }) end,
      "bad argument #1 to 'acquireAll' (key #2 must be a string or a finite number, got boolean)" })
    h.raises_at_caller({ function() km:acquireAll({ "a", "" }) end,
      "bad argument #1 to 'acquireAll' (key #2 must not be empty when the prefix is empty"
      .. " (a lock name must be a non-empty string))" })
    h.raises_at_caller({ function() km:acquireAll({ 0 / 0 }) end,
      "bad argument #1 to 'acquireAll' (key #1 must be a string or a finite number, got number)" })
    h.raises_at_caller({ function() km:acquireAll({ "a" }, "p") end,
      "bad argument #2 to 'acquireAll' (priority must be a number, got string)" })
    h.raises_at_caller({ function() km:runExclusiveAll({ "a" }, 1) end,
      "bad argument #2 to 'runExclusiveAll' (function expected, got number)" })
    h.raises_at_caller({ function() am.withTimeout(km, 5):runExclusiveAll({}, print) end,
      "bad argument #1 to 'runExclusiveAll' (key set must not be empty)" })
    local all = km:acquireAll({ "a" })
    h.raises_at_caller({ function() all.check({}) end,
      "bad argument #1 to 'check' (async_mutex.RedisMultiReleaser expected, got table)" })
    all()
    c:close()
    h.raises_at_caller({ function() km:acquireAll({ "a" }) end,
      "attempt to use a closed redis client" })
  end))
end)
