-- The Redis locks on a Redis Cluster of 3 real masters started for this
-- file (docs/redis-locks.md, "On a cluster"): a lock's keys share one slot
-- (its name as a hash tag), hand-offs reach waiters of other clients,
-- KeyedRedisMutex spreads its keys over the masters with mutual exclusion
-- between clients, and acquireAll over several slots is all or nothing.

local h = require "helpers"
local redis_cluster_server = require "redis_cluster_server"
local redis = require "async_mutex.redis"
local am = require "async_mutex"
local uv = require "luv"
local R = require "lock_redis"

local cluster, children = redis_cluster_server.for_file(setup, teardown, 3)

local function connect() return cluster:connect() end

-- The keys each master holds that match pattern.
local function keys_by_master(c, pattern)
  local out = {}
  for i, m in ipairs(c:masters()) do out[i] = m:call("KEYS", pattern) end
  return out
end

describe("Redis locks on a cluster", function()
  it("keep a lock's keys in one slot and hand it to a waiter of another client",
    h.async(function()
      local a, b = connect(), connect()
      local _ <close> = h.closing(a, b)
      local ma, mb = am.RedisMutex.new(a, "orders:42"), am.RedisMutex.new(b, "orders:42")
      local release = ma:acquire()
      local where = keys_by_master(a, "{orders:42}:*")
      local on = 0
      for _, list in ipairs(where) do if #list > 0 then on = on + 1 end end
      assert.equal(1, on)
      local granted_at = R.grant_time(mb, uv.now)
      h.sleep(100)
      assert.is_nil(granted_at())
      -- the waiter listens on a shard channel of the lock's slot, on the
      -- lock's master only, and on no classic channel
      local shard, classic = 0, 0
      for _, m in ipairs(a:masters()) do
        local list = m:call("PUBSUB", "SHARDCHANNELS", "{orders:42}async_mutex:*")
        if #list > 0 then
          shard = shard + 1
          assert.equal(1, m:call("EXISTS", "{orders:42}:h"))
        end
        classic = classic + #m:call("PUBSUB", "CHANNELS", "async_mutex:*")
      end
      assert.equal(1, shard)
      assert.equal(0, classic)
      local t0 = uv.now()
      release()
      h.wait_until(function() return granted_at() ~= nil end, 2000, "the hand-off")
      -- by the hand-off message, not by the waiter's timeout (3000 ms)
      assert.is_true(granted_at() - t0 < 1000 * h.TIME_SCALE, "hand-off took " .. (granted_at() - t0) .. " ms")
      -- waitForUnlock hears the release (on "{orders:42}:free")
      local r2 = ma:acquire()
      local free_at
      h.spawn(function()
        mb:waitForUnlock()
        free_at = uv.now()
      end)
      h.sleep(100)
      assert.is_nil(free_at)
      t0 = uv.now()
      r2()
      h.wait_until(function() return free_at ~= nil end, 2000, "waitForUnlock")
      assert.is_true(free_at - t0 < 500 * h.TIME_SCALE, "waitForUnlock took " .. (free_at - t0) .. " ms")
      -- a name with a hash tag keeps it
      local mt = am.RedisMutex.new(a, "{user7}:cart")
      mt:acquire()()
      assert.equal(a:keyslot("user7"), a:keyslot("{user7}:cart:h"))
    end))

  it("every kind built on the Redis locks works on a cluster", h.async(function()
    local a, b = connect(), connect()
    local _ <close> = h.closing(a, b)
    -- RedisSemaphore: 2 at once, the third waits for a release
    local sa, sb = am.RedisSemaphore.new(a, "sem", 2), am.RedisSemaphore.new(b, "sem", 2)
    local _, r1 = sa:acquire()
    local _, r2 = sb:acquire()
    local third
    h.spawn(function() local _, r = sb:acquire(); third = true; r() end)
    h.sleep(50)
    assert.is_nil(third)
    r1()
    h.wait_until(function() return third end, 1000, "the third")
    r2()
    -- RedisRWLock: readers of two clients share, a writer waits for both
    local wa, wb = am.RedisRWLock.new(a, "rw"), am.RedisRWLock.new(b, "rw")
    local ra, rb = wa:acquireRead(), wb:acquireRead()
    local wrote
    h.spawn(function() local w = wb:acquireWrite(); wrote = true; w() end)
    h.sleep(50)
    assert.is_nil(wrote)
    ra(); rb()
    h.wait_until(function() return wrote end, 1000, "the writer")
    -- RedisReentrantMutex: its holder re-enters
    local re = am.RedisReentrantMutex.new(a, "re")
    local outer = re:acquire()
    local inner = re:acquire()
    inner(); outer()
    -- KeyedRedisRWLock: acquireAllWrite over several slots, then another
    -- client's reader of one key waits for it
    local ka, kb = am.KeyedRedisRWLock.new(a, "krw:"), am.KeyedRedisRWLock.new(b, "krw:")
    local all = ka:acquireAllWrite({ "a", "b", "c" })
    local read
    h.spawn(function() local r = kb:acquireRead("b"); read = true; r() end)
    h.sleep(50)
    assert.is_nil(read)
    all()
    h.wait_until(function() return read end, 1000, "the reader")
    -- each lock's keys in one slot, the keyed ones over several masters
    local on = {}
    for i, list in ipairs(keys_by_master(a, "*")) do
      for _, key in ipairs(list) do
        local base = key:match("^(%b{})")
        assert.is_not_nil(base, key)
        assert.is_true(on[base] == nil or on[base] == i, base .. " on two masters")
        on[base] = i
      end
    end
    assert.is_true(on["{krw:a}"] ~= on["{krw:b}"] or on["{krw:b}"] ~= on["{krw:c}"])
  end))

  it("close() ends the client's holds, wakes its waiters with E_UNAVAILABLE and gives"
    .. " the locks back at once", h.async(function()
      local a, b = connect(), connect()
      local _ <close> = h.closing(a, b)
      local ma, mb = am.RedisMutex.new(a, "closing"), am.RedisMutex.new(b, "closing")
      local release = ma:acquire()
      local waiter_err
      h.spawn(function()
        local ok, err = pcall(ma.acquire, ma)
        waiter_err = ok and "granted" or err
      end)
      local granted_at = R.grant_time(mb, uv.now)
      h.sleep(100)
      local t0 = uv.now()
      a:close()
      assert.is_false(release())
      h.wait_until(function() return waiter_err ~= nil and granted_at() ~= nil end, 3000,
        "the waiter's error and the other client's grant")
      assert.equal(redis.E_UNAVAILABLE, waiter_err)
      assert.equal("client closed", waiter_err.reason)
      -- given back by the closed client, not after its lease (ttl 30 s;
      -- the bound is 4 s under sanitizers, h.TIME_SCALE)
      assert.is_true(granted_at() - t0 < 1000 * h.TIME_SCALE, "granted after " .. (granted_at() - t0) .. " ms")
    end))

  it("KeyedRedisMutex: keys on every master, one holder per key across 4 clients",
    h.async(function()
      local clients, locks = {}, {}
      for i = 1, 4 do
        clients[i] = connect()
        locks[i] = am.KeyedRedisMutex.new(clients[i], "kx:")
      end
      local _ <close> = h.closing(table.unpack(clients))
      local KEYS, ROUNDS = 40, h.load(120)
      local holder, overlaps, done = {}, 0, 0
      for i = 1, 4 do
        for j = 1, 3 do
          h.spawn(function()
            local rnd = math.random
            for _ = 1, ROUNDS do
              local key = rnd(KEYS)
              local release = locks[i]:acquire(key)
              if holder[key] then overlaps = overlaps + 1 end
              holder[key] = i * 10 + j
              if rnd(4) == 1 then am.sleep(1) end
              holder[key] = nil
              release()
            end
            done = done + 1
          end)
        end
      end
      h.wait_until(function() return done == 12 end, 30000, "12 workers")
      assert.equal(0, overlaps)
      -- held at once, 40 keys spread over every master
      local releases = {}
      for k = 1, KEYS do releases[k] = locks[1]:acquire(k) end
      for i, list in ipairs(keys_by_master(clients[1], "{kx:*}:h")) do
        assert.is_true(#list > 3, "master " .. i .. " holds " .. #list .. " of 40")
      end
      for k = 1, KEYS do releases[k]() end
    end, { deadline = 40000 }))

  it("acquireAll over several slots: all or nothing, in the canonical order",
    h.async(function()
      local a, b = connect(), connect()
      local _ <close> = h.closing(a, b)
      local ka, kb = am.KeyedRedisMutex.new(a, "ka:"), am.KeyedRedisMutex.new(b, "ka:")
      local names = { "x", "y", "z", "w" }
      local slots = {}
      for _, n in ipairs(names) do slots[a:keyslot("ka:" .. n)] = true end
      assert.is_true(next(slots, next(slots)) ~= nil, "keys in one slot")
      local all = ka:acquireAll(names)
      -- another client: a try takes nothing, a wait waits for all
      local try = am.tryAcquire(kb)
      local ok = pcall(try.acquireAll, try, { "q", "w" })
      assert.is_false(ok)
      local other = try:acquire("q")        -- raises if the failed try kept q
      other()
      local got
      h.spawn(function()
        local r = kb:acquireAll({ "z", "x" })
        got = true
        r()
      end)
      h.sleep(100)
      assert.is_nil(got)
      all()
      h.wait_until(function() return got end, 3000, "the second acquireAll")
    end))

  -- A worker process: 3 coroutines, N sections each on a KeyedRedisMutex,
  -- half on 10 hot keys, half on 1,000; "B key id" and "E key id" markers
  -- around each section, one write(2) each to LOG (O_APPEND).
  local WORKER = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local PORTS, LOG, ID, N, SEED = ...
N = tonumber(N)
math.randomseed(tonumber(SEED))
local seeds = {}
for p in PORTS:gmatch("%d+") do seeds[#seeds + 1] = { host = "127.0.0.1", port = tonumber(p) } end
local client = redis.connect { cluster = seeds }
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
local locks = am.KeyedRedisMutex.new(client, "px:")
local failed
am.run(function()
  local ws = {}
  for j = 1, 3 do
    ws[j] = am.spawn(function()
      for _ = 1, N do
        local key = math.random(2) == 1 and "hot" .. math.random(10) or "k" .. math.random(1000)
        local release = locks:acquire(key)
        f:write(("B %s %s.%d\n"):format(key, ID, j))
        if math.random(3) == 1 then am.sleep(math.random(2)) end
        f:write(("E %s %s.%d\n"):format(key, ID, j))
        release()
      end
    end)
  end
  for _, w in ipairs(ws) do
    local ok, err = pcall(w.join, w)
    if not ok then failed = err end
  end
  client:close()
end)
f:close()
if failed then io.stderr:write(tostring(failed), "\n") os.exit(1) end
os.exit(0)
]]

  it("4 processes x 3 coroutines over 1,000 keys: never two holders of a key (markers in"
    .. " a file), keys on every master", h.async(function()
      local log = os.tmpname()
      local ports = {}
      for i, n in ipairs(cluster.nodes) do ports[i] = n.port end
      local N = h.load(150)
      local procs = {}
      for i = 1, 4 do
        procs[i] = R.child(WORKER, { table.concat(ports, ","), log, "p" .. i, N, 1000 + i })
        children[#children + 1] = procs[i]
      end
      for i = 1, 4 do
        local rc, _, err = procs[i]:wait()
        assert.equal(0, rc, err)
      end
      local overlaps, sections = R.key_overlaps_in(log)
      os.remove(log)
      assert.equal(4 * 3 * N, sections)
      assert.equal(0, overlaps)
      -- every master keeps fence counters (N:n) of the keys it served; with
      -- 12 x N sections over about 1,000 keys, a third of them each (under
      -- GC stress N is 3: some keys on each master is all one can ask)
      local least = N >= 100 and 11 or 1
      local c = connect()
      local _ <close> = h.closing(c)
      for i, list in ipairs(keys_by_master(c, "{px:*}:n")) do
        assert.is_true(#list >= least, "master " .. i .. " served " .. #list .. " keys")
      end
    end, { deadline = 60000 }))
end)
