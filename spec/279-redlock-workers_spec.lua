-- RedlockMutex's workers (src/async_mutex/redlock.lua, "workers";
-- docs/redis-locks.md, "RedlockMutex"): each server's request waits for
-- its reply in a coroutine that is kept for the next request rather than
-- made anew.  A spare worker holds nothing of its last job (the lock, its
-- hold, its clients are collected once the program lets go of them), and
-- many acquisitions at once, each with a request per server in flight,
-- each get the worker of their own that the client's replies need.

local R = require "lock_redis"
local uv = require "luv"

-- every lock here has this ttl: 1 s, stretched when the suite runs slowed
-- down (GC stress beside valgrind took 1.5-2.5 s for an acquisition of the
-- many below, and the watchdog's renewals came late: holds were lost
-- between acquire() and their release)
local TTL = 1000 * require("helpers").TIME_SCALE
local am, h, servers, fresh, clients = R.redlock_spec_file(setup, teardown, 3, TTL, "spec279")

describe("RedlockMutex's workers", function()
  it("keep nothing of their last job: the lock and its hold are collected", h.async(function()
    local cs = clients()
    local _ <close> = h.closing(table.unpack(cs))
    local weak = setmetatable({}, { __mode = "v" })
    do
      local q = am.RedlockMutex.new(cs, fresh(), { ttl = TTL })
      for _ = 1, 5 do
        local r = q:acquire()
        weak[2] = r
        assert.is_true(r())
      end
      weak[1] = q
    end
    -- the late servers' answers, read in the background (their workers
    -- hold the job until then: 50 ms was not enough under ASan)
    h.wait_until(function()
      for _, c in ipairs(cs) do if c:pending() > 0 then return false end end
      return true
    end, 5000, "the late servers' answers")
    h.sleep(0)
    collectgarbage()
    collectgarbage()
    assert.is_true(weak[1] == nil, "the lock is still referenced")
    assert.is_true(weak[2] == nil, "its last hold is still referenced")
  end))

  it("give each of many acquisitions at once a worker per server", h.async(function()
    local cs = clients()
    local _ <close> = h.closing(table.unpack(cs))
    -- more workers in flight than the spare ones kept (64): a request per
    -- server of each acquisition; fewer under GC stress, where each
    -- allocation runs a collection step (80 at once took minutes there,
    -- before the workers too), but still more than 64 (25 x 3 servers)
    local N, ROUNDS = 80, 3
    if h.SLOW then N, ROUNDS = 25, 1 end
    local locks, names, done, fences = {}, {}, 0, {}
    for i = 1, N do
      names[i] = fresh()
      locks[i] = am.RedlockMutex.new(cs, names[i], { ttl = TTL })
    end
    for i = 1, N do
      h.spawn(function()
        for _ = 1, ROUNDS do
          local r = locks[i]:acquire()
          assert.is_true(r:check())
          fences[#fences + 1] = r.fence
          assert.is_true(r())
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == N end, 30000, "every acquisition")
    assert.equal(N * ROUNDS, #fences)
    -- and none is left held on any server, once the releases' answers are
    -- in: a release returns with a quorum's answers and the rest go on in
    -- the background, as does the give-back of a server's lease lost here
    -- (a renewal answered too late on a loaded machine: the hold lives on
    -- with the others; make test on a loaded machine saw one such record)
    h.wait_until(function()
      for _, c in ipairs(cs) do
        for i = 1, N do
          if c:call("HLEN", names[i] .. ":h") ~= 0 then return false end
        end
      end
      return true
    end, 3 * 1000, "every record gone")   -- (three ttls: scaled as TTL is)
  end, { deadline = 40000 }))
end)
