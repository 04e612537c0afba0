-- RedlockMutex's requests (docs/redis-locks.md, "RedlockMutex"), counted
-- on the servers (INFO commandstats): a hand-off costs the new holder no
-- request (the release that grants it draws its quorum fence, and the
-- message carries it); a process keeps its hand-off subscriptions from
-- one acquisition to the next; a server that answers late never finds the
-- next acquisition queued behind the grant of the one before (its token
-- is given back behind its request at the release); an acquisition that
-- guessed its quorum fence's draw right (no other process took the lock
-- since) draws it with one command, and one that guessed wrong still draws
-- above the counter.

local R = require "lock_redis"
local uv = require "luv"
local scripts = require "async_mutex.redis_scripts"

-- every lock here has a ttl <= 3000
local am, h, servers, fresh, clients = R.redlock_spec_file(setup, teardown, 3, 3000, "spec198")

-- closes every client of the lists given when a case ends, also when it
-- fails: a hold a failed case leaves would keep its hand-off subscriptions,
-- and with them the loop, for ever (h.closing takes clients, not lists)
local function closing(...)
  local all = {}
  for _, list in ipairs({ ... }) do
    for _, c in ipairs(list) do all[#all + 1] = c end
  end
  return h.closing(table.unpack(all))
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

-- The scripts the servers of 'cs' run from now on, but a hold's renewals
-- (each holder's watchdog, every ttl / 3 from its grant: one lands
-- anywhere in a slow run), read from their SLOWLOG with every command
-- logged (INFO commandstats cannot tell the scripts apart).  The renewal
-- script is loaded on every server first, so that it is always an EVALSHA
-- of its SHA1; an EVALSHA answered NOSCRIPT (followed by the EVAL of the
-- same keys and arguments) ran nothing.  log:count() counts them, and
-- says what they were; log:count(word) counts those whose mode is 'word'
-- (an acquire request's 7th argument: "wait", "again", "try").  Closing
-- the log restores the SLOWLOG settings.
local function script_log(cs)
  local renew
  for _, c in ipairs(cs) do
    renew = c:call("SCRIPT", "LOAD", scripts.renew)
    c:call("CONFIG", "SET", "slowlog-max-len", "100000")
    c:call("CONFIG", "SET", "slowlog-log-slower-than", "0")
    c:call("SLOWLOG", "RESET")
  end
  local log = {}
  function log.count(_, word)
    local n, seen = 0, {}
    for i, c in ipairs(cs) do
      local evals = {}                -- (the log is newest first)
      for _, entry in ipairs(c:call("SLOWLOG", "GET", "-1")) do
        local args = entry[4]
        local cmd = args[1]:lower()
        local rest = table.concat(args, " ", 3)      -- (a token: unique)
        if cmd == "eval" then evals[rest] = true end
        -- (word: an acquire request's mode, its 7th argument; the 8th is
        -- the hint of its quorum fence's draw, redlock.lua's ACQUIRE)
        local mode = args[3 + (tonumber(args[3]) or 0) + 7]
        if (cmd == "eval" or cmd == "evalsha" and args[2] ~= renew and not evals[rest])
            and (word == nil or mode == word) then
          n = n + 1
          seen[#seen + 1] = ("server %d %s %s %s"):format(i, cmd, args[2]:sub(1, 24), rest)
        end
      end
    end
    return n, table.concat(seen, "\n")
  end
  return setmetatable(log, { __close = function()
    for _, c in ipairs(cs) do
      pcall(c.call, c, "CONFIG", "SET", "slowlog-log-slower-than", "10000")
      pcall(c.call, c, "CONFIG", "SET", "slowlog-max-len", "128")
    end
  end })
end

-- the clients' hand-off channels subscribed on the servers of 'cs'
-- (docs/redis-locks.md: async_mutex:<id>), summed
local function subscribed(cs)
  local n = 0
  for _, c in ipairs(cs) do n = n + #c:call("PUBSUB", "CHANNELS", "async_mutex:*") end
  return n
end

local function holders(cs, name)
  local n = 0
  for _, c in ipairs(cs) do
    if c:call("HLEN", name .. ":h") > 0 then n = n + 1 end
  end
  return n
end

-- A list of clients of two of the three servers: a quorum of both, so
-- that every request of an acquisition is answered when it returns.
local function pair()
  local t = clients()
  t[3]:close()
  t[3] = nil
  return t
end

describe("RedlockMutex's requests", function()
  it("hand over with the releases alone: the new holder sends nothing", h.async(function()
    -- two servers, a quorum of both: with three, a slow run may settle the
    -- quorum on two hand-offs before the third one's message comes, and
    -- withdraw from that server (a request of the new holder's, and not
    -- the one this case is about)
    local ca, cb, cs = pair(), pair(), pair()
    local _ <close> = closing(ca, cb, cs)
    local name = fresh()
    -- the same quorum-fence counter on every server: every draw agrees,
    -- and no counter has to be raised (a request of its own)
    for _, c in ipairs(cs) do c:call("SET", name .. ":qf", "1000", "PX", "60000") end
    -- waiterTimeout far above any run: the waiter does not renew its place
    -- while it waits (every waiterTimeout / 3)
    local opts = { ttl = 3000, waiterTimeout = 3600000 }
    local qa = am.RedlockMutex.new(ca, name, opts)
    local qb = am.RedlockMutex.new(cb, name, opts)
    local r = qa:acquire()
    assert.equal(1001, r.fence)
    local got
    h.spawn(function() got = qb:acquire() end)
    h.wait_until(function()
      for _, c in ipairs(cs) do if R.queued(c, name) ~= 1 then return false end end
      return true
    end)
    h.sleep(100)                  -- its requests (and asking again once subscribed) answered
    local log <close> = script_log(cs)
    assert.is_true(r())
    h.wait_until(function() return got ~= nil end)
    h.sleep(100)                  -- anything the grant sends in the background
    -- the 2 releases, each drawing the new holder's quorum fence there
    -- (before: one DRAW per server, 4 scripts)
    local n, seen = log:count()
    assert.equal(2, n, seen)
    assert.equal(1002, got.fence)
    assert.is_true(got())
  end))

  it("draws its quorum fence with one SET when its hint is right, above the counter when not",
     h.async(function()
    local ca, cb, cs = pair(), pair(), pair()
    local _ <close> = closing(ca, cb, cs)
    local name = fresh()
    local qa = am.RedlockMutex.new(ca, name, { ttl = 3000 })
    local qb = am.RedlockMutex.new(cb, name, { ttl = 3000 })
    local r = qa:acquire()
    local f0 = r.fence
    assert.is_true(r())
    -- qa's hint is f0 + 1, which the counters give: on each server one SET
    -- for the lock's own counter (N:n, behind the server's clock) and one
    -- for the quorum fence's (N:qf)
    local sets = calls(cs, "set")
    r = qa:acquire()
    assert.equal(sets + 4, calls(cs, "set"))
    assert.equal(f0 + 1, r.fence)
    assert.is_true(r())
    -- another process takes the lock: qa's hint (f0 + 2) is now stale
    local rb = qb:acquire()
    assert.equal(f0 + 2, rb.fence)
    assert.is_true(rb())
    sets = calls(cs, "set")
    r = qa:acquire()
    assert.equal(f0 + 3, r.fence)                  -- above every counter
    assert.equal(sets + 6, calls(cs, "set"))      -- (a second SET on each)
    for _, c in ipairs(cs) do assert.equal(tostring(f0 + 3), c:call("GET", name .. ":qf")) end
    assert.is_true(r())
  end))

  it("keeps its subscriptions from one acquisition to the next", h.async(function()
    local ca, cb, cs = clients(), clients(), clients()
    local _ <close> = closing(ca, cb, cs)
    local name = fresh()
    local qa = am.RedlockMutex.new(ca, name, { ttl = 3000 })
    local qb = am.RedlockMutex.new(cb, name, { ttl = 3000 })
    -- both processes take turns; the subscriptions are counted while the
    -- two are at it, after the first turns (each process subscribed on
    -- each server where it waited) and before the last
    local done, before, after, subs = 0, nil, nil, nil
    for _, q in ipairs({ qa, qb }) do
      h.spawn(function()
        for i = 1, 25 do
          local x = q:acquire()
          if q == qa and i == 5 then before = calls(cs, "subscribe") end
          if q == qa and i == 25 then after, subs = calls(cs, "subscribe"), subscribed(cs) end
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
    assert.is_true(subs > 0)
    -- and once the lock is neither held nor waited for, the processes
    -- unsubscribe (a loop turn later), their clients still open: nothing
    -- is left to keep uv.run() from returning
    h.wait_until(function() return subscribed(cs) == 0 end, 2000, "unsubscribed")
  end))

  it("never finds a late server's next request queued behind its grant", h.async(function()
    local ca, cs = clients(), clients()
    local _ <close> = closing(ca, cs)
    local name = fresh()
    local q = am.RedlockMutex.new(ca, name, { ttl = 1000 })
    q:acquire()()                 -- connected, the servers' age read
    local before = calls({ cs[3] }, "zadd")
    local log <close> = script_log({ cs[3] })
    servers[3]:pause()
    -- three acquisitions with the quorum of servers 1 and 2; server 3's
    -- requests wait in its socket: acquire, (its release), acquire, ...
    for _ = 1, 3 do
      local x = q:acquire()
      assert.is_true(x())
    end
    -- answered after a third of the lease (ttl 1000): the late grants
    -- are stale, and a stale grant is confirmed by asking again (unless
    -- given back)
    h.sleep(400)
    servers[3]:resume()
    h.wait_until(function() return holders(cs, name) == 0 end, 3000, "every grant given back")
    -- (before: the second acquisition's request found the first's grant,
    -- not given back yet, and was queued, a ZADD, then handed the lock)
    assert.equal(before, calls({ cs[3] }, "zadd"))
    -- and no request of theirs asked again there: a grant answered late
    -- (after a third of its lease, as confirmed grants are) is not
    -- confirmed once its token was given back (before: it was, taking the
    -- lock there anew, behind the release, until its lease ended)
    local asked, seen = log:count("again")
    assert.equal(0, asked, seen)
    assert.equal(3, (log:count("wait")))
    assert.is_false(q:isLocked())
    h.wait_until(function() return subscribed(cs) == 0 end, 2000, "unsubscribed")
  end))
end)
