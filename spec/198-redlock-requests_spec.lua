-- RedlockMutex's requests (docs/redis-locks.md, "RedlockMutex"), counted
-- on the servers (INFO commandstats): a hand-off costs the new holder no
-- request (the release that grants it draws its quorum fence, and the
-- message carries it); a process keeps its hand-off subscriptions from
-- one acquisition to the next; a server that answers late never finds the
-- next acquisition queued behind the grant of the one before (its token
-- is given back behind its request at the release).

local am = require "async_mutex"
local h = require "helpers"
local R = require "lock_redis"
local uv = require "luv"

local servers = {}

setup(function()
  for i = 1, 3 do servers[i] = R.server() end
  -- a server counts once it has been up for ttl (read in whole seconds,
  -- taken as up to a second less): every lock here has a ttl <= 3000
  uv.sleep(4100)
end)
teardown(function()
  for _, s in ipairs(servers) do s:resume(); s:stop() end
end)

local fresh = R.namer("spec198")

local function clients()
  local t = {}
  for i, s in ipairs(servers) do t[i] = s:client() end
  return t
end

-- calls of 'command' (a command name in INFO commandstats, a script's own
-- calls included) on each server of 'cs', summed
local function calls(cs, command)
  local n = 0
  for _, c in ipairs(cs) do
    local stats = c:call("INFO", "commandstats")
    n = n + tonumber(stats:match("cmdstat_" .. command .. ":calls=(%d+)") or "0")
  end
  return n
end

local function scripts_run(cs)
  local n = 0
  for _, c in ipairs(cs) do n = n + R.scripts_run(c) end
  return n
end

local function holders(cs, name)
  local n = 0
  for _, c in ipairs(cs) do
    if c:call("HLEN", name .. ":h") > 0 then n = n + 1 end
  end
  return n
end

describe("RedlockMutex's requests", function()
  it("hand over with the releases alone: the new holder sends nothing", h.async(function()
    local ca, cb, cs = clients(), clients(), clients()
    local _ <close> = h.closing(ca, cb, cs)
    local name = fresh()
    -- the same quorum-fence counter on every server: every draw agrees,
    -- and no counter has to be raised (a request of its own)
    for _, c in ipairs(cs) do c:call("SET", name .. ":qf", "1000", "PX", "60000") end
    -- ttl 3000: no renewal (every second) and no waiter's request again
    -- (at the lease's end) between the counts
    local qa = am.RedlockMutex.new(ca, name, { ttl = 3000 })
    local qb = am.RedlockMutex.new(cb, name, { ttl = 3000 })
    local r = qa:acquire()
    assert.equal(1001, r.fence)
    h.wait_until(function() return holders(cs, name) == 3 end)  -- the late one joined
    local got
    h.spawn(function() got = qb:acquire() end)
    h.wait_until(function()
      for _, c in ipairs(cs) do if R.queued(c, name) ~= 1 then return false end end
      return true
    end)
    h.sleep(100)                  -- its requests (and asking again once subscribed) answered
    local before = scripts_run(cs)
    assert.is_true(r())
    h.wait_until(function() return got ~= nil end)
    h.sleep(100)                  -- anything the grant sends in the background
    -- the 3 releases, each drawing the new holder's quorum fence there
    -- (before: one DRAW per server granted, 5 or 6 scripts)
    assert.equal(3, scripts_run(cs) - before)
    assert.equal(1002, got.fence)
    assert.is_true(got())
  end))

  it("keeps its subscriptions from one acquisition to the next", h.async(function()
    local ca, cb, cs = clients(), clients(), clients()
    local _ <close> = h.closing(ca, cb, cs)
    local name = fresh()
    local qa = am.RedlockMutex.new(ca, name, { ttl = 3000 })
    local qb = am.RedlockMutex.new(cb, name, { ttl = 3000 })
    -- both processes take turns; the subscriptions are counted while the
    -- two are at it, after the first turns (each process subscribed on
    -- each server where it waited) and before the last
    local done, before, after = 0, nil, nil
    for _, q in ipairs({ qa, qb }) do
      h.spawn(function()
        for i = 1, 25 do
          local x = q:acquire()
          if q == qa and i == 5 then before = calls(cs, "subscribe") end
          if q == qa and i == 25 then after = calls(cs, "subscribe") end
          h.sleep(2)
          x()
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 2 end, 4000)
    -- (before: a server whose request was withdrawn once the quorum came
    -- from the others left the process with no use of its hub, and it
    -- unsubscribed there, and subscribed again at the next acquisition)
    assert.is_true(before > 0)
    assert.equal(before, after)
  end))

  it("never finds a late server's next request queued behind its grant", h.async(function()
    local ca, cs = clients(), clients()
    local _ <close> = h.closing(ca, cs)
    local name = fresh()
    local q = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    q:acquire()()                 -- connected, the servers' age read
    local before = calls({ cs[3] }, "zadd")
    servers[3]:pause()
    -- three acquisitions with the quorum of servers 1 and 2; server 3's
    -- requests wait in its socket: acquire, (its release), acquire, ...
    for _ = 1, 3 do
      local x = q:acquire()
      assert.is_true(x())
    end
    servers[3]:resume()
    h.wait_until(function() return holders(cs, name) == 0 end, 3000, "every grant given back")
    -- (before: the second acquisition's request found the first's grant,
    -- not given back yet, and was queued, a ZADD, then handed the lock)
    assert.equal(before, calls({ cs[3] }, "zadd"))
    assert.is_false(q:isLocked())
  end))
end)
