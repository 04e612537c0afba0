-- A hand-off message read late (docs/redis-locks.md, "Waiting without
-- polling"): a waiter's process that does blocking work (or is slow to
-- run) reads the message of its grant only after its own next request
-- went out.  When that request's answer says it does not hold, the grant
-- may have ended before the request was taken, and been given to the next
-- process: the waiter must not take it.  Before, it counted the message's
-- lease from that request, found it fresh, and acquire() returned a hold
-- Redis had already given to another process: two holders, with no fault
-- but blocking work in the waiter's process.
--
-- And a message of any other form than a grant's wakes nobody.
--
-- Exclusion is also checked independently of the library, as in spec 120:
-- worker processes write begin and end markers to one file opened with
-- O_APPEND, and overlaps are read from the order of the lines.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"
local uv = require "luv"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec126")

local raw = R.eval_script

-- The fence of the holder 'token' in Redis (nil: not a holder).
local function fence_in_redis(client, name, token)
  local rec = client:call("HGET", name .. ":h", token)
  return rec and math.tointeger(tonumber(rec:match("^%d+ %d+ (%d+)")))
end

-- A holds for long; B, a RedisMutex of client b with 'opts', waits; C is
-- queued behind B (played by the spec, with a long waiterTimeout).
-- Returns a function that gives B's releaser (nil while B waits).
local function a_holds_b_waits_c_queued(a, b, name, opts)
  assert.equal(1, raw(a, name, scripts.acquire, "A", "1", "1", "100000", "3000", "none",
                      "wait")[1])
  local mb = am.RedisMutex.new(b, name, opts)
  local rb
  h.spawn(function() rb = mb:acquire() end)
  h.wait_until(function() return R.queued(a, name) == 1 end)
  h.sleep(30)                              -- B subscribed and asked again
  assert.equal(0, raw(a, name, scripts.acquire, "C", "1", "1", "100000", "100000", "chC",
                      "wait")[1])
  return function() return rb end
end

-- C holds and B waits its turn; once C releases, B holds, with the fence
-- Redis has.  Returns B's releaser, released.
local function c_holds_then_b(a, name, rb)
  assert.is_not_nil(fence_in_redis(a, name, "C"))      -- C holds
  assert.is_nil(rb())                                  -- and B waits
  assert.equal(1, R.queued(a, name))
  assert.equal(1, raw(a, name, scripts.release, "C", "1"))
  h.wait_until(function() return rb() ~= nil end, 2000)
  local r = rb()
  assert.equal(fence_in_redis(a, name, r.token), r.fence)
  assert.is_true(r:check())
  assert.is_true(r())
  return r
end

-- A test body run with two clients (closed also when it fails), a fresh
-- lock name and its keys, and B's releaser-to-be of a_holds_b_waits_c_queued
-- with 'opts': fn(a, b, name, keys, rb).
local function with_b_waiting(opts, fn)
  return h.async(function()
    local a, b = server:client(), server:client()
    local _ <close> = h.closing(a, b)
    local name = fresh_name()
    fn(a, b, name, scripts.keys(name), a_holds_b_waits_c_queued(a, b, name, opts))
  end, { deadline = 20000 })
end

describe("a hand-off message read after the waiter's next request went out", function()
  it("is told apart by the answer's n: every grant before the request has a fence up to it,"
    .. " every later one a larger fence", h.async(function()
    local a = server:client()
    local _ <close> = setmetatable({}, { __close = function() a:close() end })
    local name = fresh_name()
    assert.equal(1, raw(a, name, scripts.acquire, "A", "1", "1", "100000", "3000", "none",
                        "wait")[1])
    local queued = raw(a, name, scripts.acquire, "B", "1", "1", "100", "3000", "none", "wait")
    assert.equal(0, queued[1])
    assert.equal(0, raw(a, name, scripts.acquire, "C", "1", "1", "100000", "100000", "none",
                        "wait")[1])
    assert.equal(1, raw(a, name, scripts.release, "A", "1"))
    local fb = fence_in_redis(a, name, "B")
    assert.is_true(fb > math.tointeger(tonumber(queued[3])))
    h.sleep(150)                             -- B's first lease (100 ms) ends unrenewed
    -- B asks again: its grant is over, C is granted, B is queued again
    local again = raw(a, name, scripts.acquire, "B", "1", "1", "100", "3000", "none", "again")
    assert.equal(0, again[1])
    local n = math.tointeger(tonumber(again[3]))
    local fc = fence_in_redis(a, name, "C")
    assert.is_true(fb <= n and fc <= n)
    assert.equal(1, raw(a, name, scripts.release, "C", "1"))
    assert.is_true(fence_in_redis(a, name, "B") > n)
  end))

  it("is not taken when that request finds the grant over: the next process holds, the waiter"
    .. " waits its turn", h.async(function()
    local a, b, x = server:client(), server:client(), server:client()
    -- closed also when an assertion below fails: B's acquire then ends
    -- (E_UNAVAILABLE) instead of waiting out C's 100 s lease and holding
    -- on with its watchdog, which kept the loop, and every later test of
    -- the process, running (a whole-suite run hung in epoll_wait)
    local _ <close> = setmetatable({}, { __close = function()
      a:close(); b:close(); x:close()
    end })
    local name = fresh_name()
    local k = scripts.keys(name)
    -- B's first lease is short (min(ttl, waiterTimeout) = 100 ms), and it
    -- asks again every 100 ms
    local rb = a_holds_b_waits_c_queued(a, b, name, { ttl = 100, waiterTimeout = 300 })
    local sha = a:call("SCRIPT", "LOAD", scripts.release)
    -- Resumed by a reply, from the loop's poll phase: this process blocks
    -- there while another process releases A (the hand-off message to B
    -- waits in B's socket) and B's first lease runs out in Redis.  B's
    -- timer comes first in the next loop turn: B asks again, and reads the
    -- message while that request is in flight; the request finds B's
    -- grant over, grants C and queues B again.
    x:call("PING")
    assert(os.execute(("LD_PRELOAD= redis-cli -s %s EVALSHA %s 6 %s %s %s %s %s %s A 1 >/dev/null")
      :format(server.path, sha, k[1], k[2], k[3], k[4], k[5], k[6])))
    uv.sleep(250)
    -- B's request grants C in Redis; how soon depends on the machine (a
    -- fixed 400 ms was too short under valgrind on a loaded one)
    h.wait_until(function() return fence_in_redis(a, name, "C") ~= nil end, 10000)
    h.sleep(100)                             -- B read that answer and the message
    c_holds_then_b(a, name, rb)
  end, { deadline = 20000 }))

  -- B's first lease is 1000 ms, which it would confirm only if its
  -- message came more than 333 ms after its last request
  it("is not taken when read after that request's answer: the two connections are read in no"
    .. " set order", with_b_waiting({ ttl = 1000, waiterTimeout = 1000 }, function(a, _, name, k, rb)
    -- B's hand-off message is held back, to be read after B's next answer
    -- (as a process whose subscriber connection is read after its other
    -- one reads it): the channel in B's record of N:c goes nowhere, and
    -- the spec publishes the message on B's channel when it chooses
    local tb = a:call("ZRANGE", k[2], 0, 0)[1]
    local weight, first, channel = a:call("HGET", k[4], tb):match("^(%d+) (%d+) (.*)$")
    a:call("HSET", k[4], tb, weight .. " " .. first .. " nowhere")
    -- This process blocks while another one releases A (B is granted) and
    -- B's first lease runs out in Redis; then B asks again: that request
    -- finds its grant over, grants C, and queues B again
    local sha = a:call("SCRIPT", "LOAD", scripts.release)
    assert(os.execute(("LD_PRELOAD= redis-cli -s %s EVALSHA %s 6 %s %s %s %s %s %s A 1 >/dev/null")
      :format(server.path, sha, k[1], k[2], k[3], k[4], k[5], k[6])))
    local grant = server:cli(("HGET %s %s"):format(k[1], tb))
    local fence = assert(grant:match("^%d+ %d+ (%d+)"), grant)
    uv.sleep(1100)
    h.wait_until(function()
      return fence_in_redis(a, name, "C") ~= nil and a:call("ZSCORE", k[2], tb) ~= nil
    end)
    h.sleep(20)                              -- B read that answer
    -- B reads the message of the grant that ended, well within a third of
    -- its first lease after its request: taken, it was a second holder
    assert.equal(1, a:call("PUBLISH", channel, tb .. " " .. fence .. " 1"))
    h.sleep(100)
    local r = c_holds_then_b(a, name, rb)
    assert.is_true(r.fence > math.tointeger(tonumber(fence)))
  end))
end)

-- The message's form: the hub cuts the token at the first space and
-- matches the rest from there (redis_lock_hub.lua, on_message).
describe("a hand-off message", function()
  it("is taken only in its exact form, \"token fence value\": a message of another form on the"
    .. " waiter's channel wakes nobody",
    with_b_waiting({ ttl = 1000, waiterTimeout = 1000 }, function(a, _, name, k, rb)
    local tb = a:call("ZRANGE", k[2], 0, 0)[1]
    local channel = a:call("HGET", k[4], tb):match("^%d+ %d+ (.*)$")
    -- a fence above any the lock has drawn: taken, B would hold with it
    local f = "9000000000000000"
    for _, message in ipairs({
      tb .. "  " .. f .. " 1", tb .. "\t" .. f .. " 1", " " .. tb .. " " .. f .. " 1",
      tb .. " " .. f, tb .. " " .. f .. " 1 x", tb .. " " .. f .. " 1\n", tb .. " +" .. f .. " 1",
      tb .. " 0x1" .. f .. " 1", tb .. " " .. f .. " --1", tb .. " " .. f .. "lost", tb,
      tb .. " ", "",
    }) do
      assert.equal(1, a:call("PUBLISH", channel, message))
      h.sleep(20)
      assert.is_nil(rb(), message)
      assert.is_not_nil(a:call("ZSCORE", k[2], tb), message)   -- still queued
    end
    -- A's release hands the lock to B, by its own message
    assert.equal(1, raw(a, name, scripts.release, "A", "1"))
    h.wait_until(function() return rb() ~= nil end, 2000)
    local r = rb()
    assert.equal(fence_in_redis(a, name, r.token), r.fence)
    assert.is_true(r())
  end))
end)

-- A worker: N sections of the mutex NAME with markers in LOG; meanwhile,
-- while the section's acquire waits, another coroutine blocks the loop
-- from a reply's callback now and then, for up to twice the first lease
-- (never while the process holds: a holder blocked past its lease is the
-- pause no lock can survive, docs/redis-locks.md, "Limits").  Prints
-- "stale falses starved" (releasers not held right after acquire
-- returned, releasers that returned false, and those that were not held
-- or returned false after the holder's loop or the server stalled past a
-- sixth of the lease on a loaded machine, after acquire returned, while it
-- held or during the release's round trip: a pause, not a fault of the
-- lock).
local WORKER = R.TIMED_WORKER_PROLOGUE .. [[
local m = am.RedisMutex.new(client, NAME, { ttl = TTL, waiterTimeout = WAIT })
local other = redis.connect { path = SOCK }
local waiting, done = false, false
local stale, falses, starved = 0, 0, 0
am.spawn(function()
  local first = math.min(TTL, WAIT)
  while not done do
    am.sleep(math.random(1, first))
    if waiting then
      other:call("PING")
      if waiting then uv.sleep(math.random(0, 2 * first)) end
    end
  end
  other:close()
end)
main(function()
  for i = 1, N do
    -- (a sixth of the first lease: as in spec 120)
    local margin = math.min(TTL, WAIT) / 6
    waiting = true
    local r = m:acquire()
    local got_at = uv.hrtime()
    waiting = false
    stalls()
    f:write(("B %s %d\n"):format(ID, i))
    if not pcall(r.check, r) or not r:check() then
      -- acquire returns a hold with most of its first lease left: one that
      -- ran out before this check, in a stall of this process since then
      -- (a loaded machine), is the pause's
      if (uv.hrtime() - got_at) / 1e6 > margin then
        starved = starved + 1
        f:write(("P %s %d\n"):format(ID, i))
      else
        stale = stale + 1
      end
    end
    am.sleep(math.random(1, TTL // 2))
    f:write(("E %s %d\n"):format(ID, i))
    local held = stalls()                        -- while it held
    if not r() then
      -- a release that reached Redis after the lease's end, in a stall of
      -- this process or of the server during its round trip, is refused:
      -- the pause's too
      if math.max(held, stalls()) > margin then
        starved = starved + 1
        -- its overlaps are the pause's when the pause came while it held
        if held > margin then f:write(("P %s %d\n"):format(ID, i)) end
      else
        falses = falses + 1
      end
    end
  end
  done = true
  f:close()
  io.stdout:write(("%d %d %d\n"):format(stale, falses, starved))
end)
]]

local overlaps_in = R.overlaps_in

describe("RedisMutex across processes whose loops block while they wait", function()
  it("never has two holders: ttl {50, 100} x waiterTimeout {60, 300}, 3 processes",
    h.async(function()
      local seed = os.time()
      local N = 30
      local cells = {}
      for _, ttl in ipairs({ 50, 100 }) do
        for _, wait in ipairs({ 60, 300 }) do
          local log = os.tmpname()
          local cell = { ttl = ttl, wait = wait, log = log, children = {} }
          local name = fresh_name()
          for p = 1, 3 do
            cell.children[p] = R.child(WORKER, { server.path, name, ttl, wait, N,
              seed + p * 7919 + ttl + wait, log, "p" .. p })
          end
          cells[#cells + 1] = cell
        end
      end
      local report = {}
      for _, cell in ipairs(cells) do
        local stale, falses, starved = R.sum_counts(cell.children, 3)
        local overlaps, sections = overlaps_in(cell.log)
        os.remove(cell.log)
        assert.equal(3 * N, sections)
        if overlaps + stale + falses > 0 then
          report[#report + 1] = ("ttl %d, waiterTimeout %d: %d overlaps, %d stale grants,"
            .. " %d releasers false (and %d after a stall of the holder)"):format(cell.ttl,
            cell.wait, overlaps, stale, falses, starved)
        end
      end
      assert.equal("", table.concat(report, "; "), "seed " .. seed)
    end, { deadline = 120000 }))
end)
