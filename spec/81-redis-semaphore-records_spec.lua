-- Several holders in N:h, one record each (docs/redis-locks.md, "In
-- Redis"): a semaphore's holders of mixed weights, their expiry and the
-- dispatch that follows, the state; the renewal and the "again" request,
-- which rewrite a record's lease end and nothing else.  The scripts are run
-- directly, with tokens of our own, as in spec 70; the lease the client
-- counts is checked through RedisMutex.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec81")

local release, server_ms = R.release_script, R.server_ms

-- acquire(c, name, token, limit, weight, ttl [, mode, wait_ms, channel])
local function acquire(c, name, token, limit, weight, ttl, mode, wait_ms, channel)
  return R.acquire_script(c, name, token, ttl, mode,
    { limit = limit, weight = weight, wait = wait_ms, channel = channel })
end

local function renew(c, name, token, limit, ttl)
  return R.renew_script(c, name, token, ttl, limit)
end

local function state(c, name, limit)
  local r = c:eval(scripts.state, scripts.keys(name), { tostring(limit) })
  return r[1], r[2]
end

-- The record of 'token': end, weight, fence, value as integers (nil: none).
local function record(c, name, token)
  local s = c:call("HGET", name .. ":h", token)
  if not s then return nil end
  local e, w, f, v = s:match("^(%d+) (%d+) (%d+) (%d+)$")
  assert(e, "malformed record: " .. s)
  return { e = tonumber(e), w = tonumber(w), f = math.tointeger(tonumber(f)),
           v = tonumber(v), raw = s }
end

-- Ends the lease of the holder 'token' now: its record's end is put in
-- the past.  (A short lease instead could end, under load or
-- AM_GC_STRESS, before the requests that must find it running.)
local function end_lease(c, name, token)
  local r = record(c, name, token)
  c:call("HSET", name .. ":h", token, (r.raw:gsub("^%d+", tostring(server_ms(c) - 1))))
end

describe("a semaphore's holders of mixed weights", function()
  it("each have a record; the weight held is their sum", with.one_client(function(c, name)
    local ra = acquire(c, name, "a", 5, 2, 30000)
    local rb = acquire(c, name, "b", 5, 1, 30000)
    local rc = acquire(c, name, "c", 5, 2, 30000)
    assert.same({ 1, 1, 1 }, { ra[1], rb[1], rc[1] })
    assert.same({ 5, 3, 2 }, { ra[3], rb[3], rc[3] })   -- the room before each grant
    local a, b, cc = record(c, name, "a"), record(c, name, "b"), record(c, name, "c")
    assert.same({ 2, 1, 2 }, { a.w, b.w, cc.w })
    assert.same({ 5, 3, 2 }, { a.v, b.v, cc.v })
    assert.is_true(a.f < b.f and b.f < cc.f)
    assert.equal(3, c:call("HLEN", name .. ":h"))
    local used, queued = state(c, name, 5)
    assert.same({ 5, 0 }, { used, queued })
    assert.same({ 0 }, { table.unpack(acquire(c, name, "d", 5, 1, 30000, "try"), 1, 1) })
    assert.equal(1, release(c, name, "b", 5))
    assert.is_nil(record(c, name, "b"))
    assert.equal(4, (state(c, name, 5)))
  end))

  it("lose an ended lease's weight, and the queue's heads that then fit are granted in order",
    with.one_client(function(c, name)
      local got = {}
      local sub = c:subscribe(name .. ":chan", function(m) got[#got + 1] = m end)
      acquire(c, name, "a", 5, 2, 30000)
      acquire(c, name, "b", 5, 1, 30000)
      acquire(c, name, "c", 5, 2, 30000)
      assert.equal(0, acquire(c, name, "d", 5, 2, 30000, "wait", 3000, name .. ":chan")[1])
      assert.equal(0, acquire(c, name, "e", 5, 1, 30000, "wait", 3000, name .. ":chan")[1])
      -- a's lease ends now: its record's end is put in the past (a lease
      -- of 30 ms, before, could end before d asked, under load and
      -- AM_GC_STRESS, and d was granted at once)
      end_lease(c, name, "a")
      -- a's 2 are free: d (2) fits, e (1) then does not (strict FIFO)
      local used, queued = state(c, name, 5)
      assert.same({ 5, 1 }, { used, queued })
      assert.is_nil(record(c, name, "a"))
      local d = record(c, name, "d")
      assert.same({ 2, 2 }, { d.w, d.v })
      local now = server_ms(c)
      assert.is_true(d.e > now + 2000 and d.e <= now + 3000)   -- first lease: waiterTimeout
      assert.is_true(d.f > record(c, name, "c").f)
      -- b's release makes room for e
      assert.equal(1, release(c, name, "b", 5))
      local e = record(c, name, "e")
      assert.same({ 1, 1 }, { e.w, e.v })
      assert.is_true(e.f > d.f)
      assert.same({ 5, 0 }, { state(c, name, 5) })
      h.wait_until(function() return #got == 2 end, 2000, "two grant messages")
      assert.same({ "d " .. d.f .. " 2", "e " .. e.f .. " 1" }, got)
      sub:unsubscribe()
    end))
end)

describe("renew", function()
  it("moves a live holder's lease end and keeps its weight, fence and value", with.one_client(function(c, name)
    acquire(c, name, "t", 3, 2, 1000)
    acquire(c, name, "u", 3, 1, 20)
    local before = record(c, name, "t")
    assert.equal(1, renew(c, name, "t", 3, 30000))
    local after = record(c, name, "t")
    assert.same({ before.w, before.f, before.v }, { after.w, after.f, after.v })
    local now = server_ms(c)
    assert.is_true(after.e > now + 29000 and after.e <= now + 30000)
    h.sleep(40)
    -- u's lease ended: no renewal, and its record goes
    assert.equal(0, renew(c, name, "u", 3, 30000))
    assert.is_nil(record(c, name, "u"))
    assert.equal(after.raw, record(c, name, "t").raw)
  end))
end)

describe("the 'again' request of a queued waiter", function()
  it("renews to ttl the lease of a grant whose message it did not get", with.one_client(function(c, name)
    acquire(c, name, "holder", 1, 1, 30000)
    assert.equal(0, acquire(c, name, "w", 1, 1, 30000, "wait", 3000)[1])
    assert.equal(1, release(c, name, "holder", 1))          -- hand-off: first lease 3 s
    local granted = record(c, name, "w")
    local now = server_ms(c)
    assert.is_true(granted.e <= now + 3000)
    local r = acquire(c, name, "w", 1, 1, 30000, "again", 3000)
    assert.same({ 1, granted.f, 1 }, { r[1], math.tointeger(tonumber(r[2])), r[3] })
    local renewed = record(c, name, "w")
    assert.same({ granted.w, granted.f, granted.v }, { renewed.w, renewed.f, renewed.v })
    assert.is_true(renewed.e > now + 29000)
  end))

  it("granted by its own request (the holder's lease ended), gets its ttl too", with.one_client(function(c, name)
    acquire(c, name, "dead", 2, 2, 30000)
    assert.equal(0, acquire(c, name, "w", 2, 1, 30000, "wait", 3000)[1])
    end_lease(c, name, "dead")          -- (a lease of 30 ms could end before w asked)
    local r = acquire(c, name, "w", 2, 1, 30000, "again", 3000)
    assert.equal(1, r[1])
    assert.equal(2, r[3])
    local now = server_ms(c)
    -- the client counts a lease of ttl from this request: Redis must too
    assert.is_true(record(c, name, "w").e > now + 29000)
    assert.is_nil(record(c, name, "dead"))
  end))

  it("through RedisMutex: a waiter granted at its holder's lease end holds for its ttl",
    with.two_clients(function(c, c2, name)
      -- a holder that dies: a token of our own with a 100 ms lease
      acquire(c, name, "dead", 1, 1, 100)
      local m = am.RedisMutex.new(c, name, { ttl = 5000, waiterTimeout = 300 })
      local releaser = m:acquire()        -- asks again when the lease ends
      -- past waiterTimeout (the first lease of a hand-off): still held in Redis
      h.sleep(600)
      assert.is_true(releaser:check())
      local other = am.RedisMutex.new(c2, name)
      assert.has_error(function() am.tryAcquire(other):acquire() end, am.E_ALREADY_LOCKED)
      assert.is_true(releaser())
    end))
end)
