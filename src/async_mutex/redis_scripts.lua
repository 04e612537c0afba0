--- async_mutex.redis_scripts: the server side of the Redis locks.
-- Every change of a lock's state in Redis is one of these scripts, run
-- atomically by the server (EVALSHA).  They implement one structure, a
-- counting lock with a FIFO queue, used with limit 1 by RedisMutex and
-- KeyedRedisMutex and with the user's limit by RedisSemaphore.  The design
-- is explained in docs/redis-locks.md ("In Redis").
--
-- The keys of a lock named N (KEYS[1..6], always in this order):
--   N:h  hash   holder token -> "end weight fence value" (end: the end of
--               its lease, server ms; value: the room left before this
--               grant, what a Semaphore's acquire returns).  One record
--               per holder, so that a grant, a release and a renewal each
--               write one field (a zset of ends beside a hash of records
--               took two commands each)
--   N:q  zset   waiter token -> arrival number (the FIFO order)
--   N:w  zset   waiter token -> deadline (server ms); a waiter that does not
--               renew it in time is taken as dead and skipped
--   N:c  hash   waiter token -> "weight lease channel": 'lease' is the
--               first lease of a hand-off, min(ttl, waiter_timeout), so that
--               a waiter that died just before its turn holds the lock no
--               longer than a dead waiter would block it; the new holder
--               renews it to its ttl (a waiter granted by its own 'again'
--               request gets its ttl at once: it is alive)
--   N:n  string the last number drawn (fences and arrival numbers)
--   N:free  string  set while a waitForUnlock waits (its expiry: the
--               longest waiterTimeout of those that set it); also the name
--               of the channel a release publishes on for them.  A release
--               publishes only when it finds it, and deletes it: each
--               watcher woken asks the state again, which marks again if it
--               must go on waiting (see M.state for why no wake-up is lost)
-- Collections that become empty vanish (Redis removes empty keys), so an
-- idle lock leaves only N:n, which expires on its own.  And every key
-- expires by itself once nothing live can need it, also when its holders
-- and waiters die and no script ever runs on it again (docs/redis-locks.md,
-- "Keys that expire"):
--   N:h      at the end of its last lease (PEXPIREAT, written with it);
--   N:q, N:w, N:c  together, at least as late as the last deadline in N:w:
--            whoever writes a deadline and finds less than its own
--            waiterTimeout left sets two waiterTimeouts (so a busy queue
--            pays one PTTL per arrival, not three PEXPIREs), so they
--            expire at most 2 * waiterTimeout after the last arrival or
--            renewal, and never before a live waiter's deadline (an
--            expiry only ever grows);
--   N:free   after the longest waiterTimeout of its watchers;
--   N:n      an hour after its last draw.
-- Every process sharing a lock name must run the same layout: an older
-- one (N:h a zset) meets this one's N:h with a WRONGTYPE error, never a
-- second holder.
--
-- Numbers: Redis runs scripts on Lua 5.1 with doubles; every number here
-- is an integer below 2^53 and is written with %d (tostring would give
-- 1.8e+15; %d converts to a C long, where %.0f and the %.17g that
-- redis.call applies to a Lua number take the slow exact path of the C
-- library's float formatting, a measurable share of a script's time).
-- Scores go to redis.call as such strings too, and so do the numbers of
-- the records read back with patterns (weights, leases, values: up to 2^53,
-- where concatenation would write 1.1258999068426e+15).  The Lua side
-- bounds what reaches here (ttl and waiterTimeout <= 2^40 ms, a limit
-- <= 2^53): now + ttl stays exact and within a C long.

local M = {}

-- set_get(key, value): SET key value PX 3600000 GET, which writes the
-- value and returns the key's last one (false: none).  SET has GET since
-- Redis 6.2; before (Debian 11's and Ubuntu 22.04's Redis 6.0), it
-- refuses it ("ERR syntax error", nothing written), and a GET and a SET
-- do the same (a script is atomic).  Spec 299.
local SET_GET = [[
local function set_get(key, value)
  local old = redis.pcall('SET', key, value, 'PX', 3600000, 'GET')
  if type(old) == 'table' and old.err then
    old = redis.call('GET', key)
    redis.call('SET', key, value, 'PX', 3600000)
  end
  return old
end
]]
M.SET_GET = SET_GET

-- The next 'count' numbers of the counter N (KEYS[5]), from the server's
-- time (sec, usec): max(last + 1, time in us) and the ones after it;
-- returns the first.  One command when the clock is ahead of the last
-- number (nearly always: numbers are drawn far slower than one per us):
-- SET ... GET writes the clock's number and returns the last one, and only
-- a last number at or above it (drawn in this same us, a batch of
-- readers' fences, a clock that went back) costs a second SET.  The
-- script is atomic: nobody sees the first write.
local DRAW_N = [[
local function draw_n(sec, usec, count)
  local v = sec * 1000000 + usec
  local old = set_get(KEYS[5], string.format('%d', v + count - 1))
  if old and tonumber(old) >= v then
    v = tonumber(old) + 1
    redis.call('SET', KEYS[5], string.format('%d', v + count - 1), 'PX', 3600000)
  end
  return v
end
]]

-- The message of a grant to the process of channel ch: "token fence
-- value", on the lock's shard channel on a cluster (a channel in "{...}").
-- Sent once the token's record is written (redlock.lua's own TELL, which
-- draws the new holder's quorum fence, counts on it: release_telling).
local TELL = [[
local function tell(ch, token, fence, value)
  redis.call(string.byte(ch) == 123 and 'SPUBLISH' or 'PUBLISH', ch,
             token .. ' ' .. fence .. ' ' .. value)
end
]]

-- Shared by every script: the clock, expiry of holders and waiters, the
-- number generator, and dispatch (grants to the queue's head).  Each
-- redis.call costs about a microsecond of the server's single thread, so
-- the common cases (a free lock, a release nobody waits for) take the
-- fewest: the scripts ask first whether there is anything to expire or
-- dispatch at all.
local PRELUDE_BODY = [[
local H, Q, W, C, N, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local function fmt(x) return string.format('%d', x) end

-- The next number for this lock (fences and arrival numbers):
-- max(last + 1, server time in us).  It grows with every grant and
-- arrival; and because it keeps up with the clock, a counter that lost its
-- last values (N:n expired, a restart without persistence, the last second
-- of an append-only file, a replica promoted before it had them) still
-- goes on above every number drawn before, as long as the server's clock
-- does not go back.
local function draw() return draw_n(sec, usec, 1) end

-- The ends of the first and the last lease (server ms) among the holders
-- seen by held() and the leases written since; nil: no holder.  'wrote':
-- a lease was written, so N:h must expire later (keep()).
local first, last, wrote

local function note(e)
  if not first or e < first then first = e end
  if not last or e > last then last = e end
end

-- Removes the holders whose lease ended; returns the weight the others
-- hold.
local function held()
  local all = redis.call('HGETALL', H)
  local sum = 0
  for i = 1, #all, 2 do
    local e, w = string.match(all[i + 1], '^(%d+) (%d+)')
    e = tonumber(e)
    if e < now then
      redis.call('HDEL', H, all[i])
    else
      sum = sum + tonumber(w)
      note(e)
    end
  end
  return sum
end

-- Writes the token's record with its lease ending at e ('rest': weight,
-- fence, value).  Only after held(): keep() sets N:h's expiry from the
-- ends held() saw.
local function put(token, e, rest)
  redis.call('HSET', H, token, fmt(e) .. ' ' .. rest)
  note(e)
  wrote = true
end

-- At the end of a script that wrote a lease: N:h expires with its last
-- lease (Redis removes a key only once the time is past its expiry, as
-- held() removes a lease only once now is past its end).
local function keep()
  if wrote then redis.call('PEXPIREAT', H, fmt(last)) end
end

-- After a waiter's deadline (now + wait_ms) was written: N:q, N:w and N:c
-- live at least until then (see the header; their expiries are always
-- set together, so N:w's stands for all three).
local function waiters_until(wait_ms)
  if redis.call('PTTL', W) < wait_ms then
    local ms = fmt(2 * wait_ms)
    redis.call('PEXPIRE', Q, ms)
    redis.call('PEXPIRE', W, ms)
    redis.call('PEXPIRE', C, ms)
  end
end

-- Waiters that stopped renewing their place are removed.
local function expire_waiters()
  local dead = redis.call('ZRANGEBYSCORE', W, '-inf', '(' .. fmt(now))
  for i = 1, #dead do
    redis.call('ZREM', Q, dead[i])
    redis.call('ZREM', W, dead[i])
    redis.call('HDEL', C, dead[i])
  end
end

local function grant(token, weight, ttl, value)
  local fence = draw()
  put(token, now + ttl, fmt(weight) .. ' ' .. fmt(fence) .. ' ' .. fmt(value))
  return fence
end

-- Grants to the head of the queue while it fits (u: the weight held), each
-- by one message on its process's channel: "token fence value".  Strict
-- FIFO: a head that does not fit blocks the ones behind it.  Returns the
-- weight held afterwards.  The heads granted together (the readers at the
-- head of a RedisRWLock's queue, behind a writer that left) are granted
-- by one command of each kind for all of them, read and written a batch
-- of heads at a time: their fences are what as many draw()s would give
-- (consecutive: the clock is the script's one reading).
local BATCH = 64
local function dispatch(limit, u)
  while u < limit do
    -- the head alone first: most often it does not fit (a writer behind
    -- readers, a reader behind a writer), or it fills the room
    local heads = redis.call('ZRANGE', Q, 0, 0)
    if not heads[1] then break end
    local infos = {redis.call('HGET', C, heads[1])}
    local w = tonumber(string.match(infos[1], '^(%d+)'))
    if u + w > limit then break end
    if u + w < limit then
      heads = redis.call('ZRANGE', Q, 0, BATCH - 1)
      if heads[2] then infos = redis.call('HMGET', C, unpack(heads)) end
    end
    local n, u0, ws, ttls, chs = 0, u, {}, {}, {}
    for i = 1, #heads do
      local w, ttl, ch = string.match(infos[i], '^(%d+) (%d+) (.*)$')
      w = tonumber(w)
      if u + w > limit then break end
      n = n + 1
      ws[n], ttls[n], chs[n] = w, tonumber(ttl), ch
      u = u + w
    end
    if n == 0 then break end
    local granted = n == #heads and heads or {unpack(heads, 1, n)}
    redis.call('ZREM', Q, unpack(granted))
    redis.call('ZREM', W, unpack(granted))
    redis.call('HDEL', C, unpack(granted))
    local fence = draw_n(sec, usec, n)
    -- (value: the room left before each grant, as one grant after the
    -- other leaves it)
    local records, messages, room = {}, {}, limit - u0
    for i = 1, n do
      local f, e = fmt(fence + i - 1), now + ttls[i]
      records[2 * i - 1] = granted[i]
      records[2 * i] = fmt(e) .. ' ' .. fmt(ws[i]) .. ' ' .. f .. ' ' .. fmt(room)
      messages[i] = {granted[i], f, fmt(room)}
      note(e)
      room = room - ws[i]
    end
    redis.call('HSET', H, unpack(records))
    wrote = true
    -- (the records first: a message is sent once its token holds)
    for i = 1, n do tell(chs[i], messages[i][1], messages[i][2], messages[i][3]) end
    if n < #heads then break end
  end
  return u
end

-- Milliseconds until the first lease ends (-1: no holder): a waiter asks
-- again then, in case no release comes (a holder that died).
local function first_end()
  if not first then return -1 end
  return math.max(0, first - now)
end

-- {1, fence, value} for a holder (after held(): its lease runs), nil for
-- anyone else; and its record without the lease's end.
local function holding(token)
  local g = redis.call('HGET', H, token)
  if not g then return nil end
  local rest = string.match(g, '^%d+ (.*)$')
  local fence, value = string.match(rest, '^%d+ (%d+) (%-?%d+)$')
  return {1, fence, tonumber(value)}, rest
end
]]
local PRELUDE = SET_GET .. DRAW_N .. TELL .. PRELUDE_BODY

--- acquire: ARGV token, limit, weight, ttl, waiter_timeout, channel, mode.
-- mode "try": grant now or answer {0}, never queue.  mode "wait": grant
-- now, or queue the token.  mode "again": a queued waiter asks again: it
-- renews its deadline, and learns of a grant whose message has not arrived
-- yet (or was lost), whose lease is then renewed; a waiter no longer
-- queued (taken as dead) is queued again.  Returns {1, fence, value} when
-- the token holds the lock ('value': the room left before the grant),
-- {0, ms, n} when it waits (ms: until the first holder's lease ends, -1
-- if none; n: every grant made before this request has a fence <= n,
-- every later one a larger fence, so that the waiter can tell a hand-off
-- message read after this answer but sent before it, of a grant that
-- ended, from one of a grant made since), {0} for a failed try.
M.acquire = SET_GET .. DRAW_N .. TELL .. [[
-- A new request on a lock that nobody holds or waits for (holders and
-- queue are both empty keys): granted before the prelude's functions are
-- even made, as grant() would (fence: draw(); value: the limit).
if ARGV[7] ~= 'again' then
  if redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then
    local t = redis.call('TIME')
    local sec, usec = tonumber(t[1]), tonumber(t[2])
    local fence = string.format('%d', draw_n(sec, usec, 1))
    local e = string.format('%d', sec * 1000 + math.floor(usec / 1000) + tonumber(ARGV[4]))
    redis.call('HSET', KEYS[1], ARGV[1], e .. ' ' .. ARGV[3] .. ' ' .. fence .. ' ' .. ARGV[2])
    redis.call('PEXPIREAT', KEYS[1], e)       -- N:h was absent: this lease is its last
    return {1, fence, tonumber(ARGV[2])}
  end
  -- A new waiter on a mutex whose one holder's lease is running (the
  -- contended case): queued at the tail as the full path below would queue
  -- it, since with a live holder there is nothing to dispatch.  The full
  -- path would also expire dead waiters first; that is left to the next
  -- full run (the release that reaches a dead head, a renewal): the
  -- newcomer's place behind them does not depend on it.
  if ARGV[7] == 'wait' and ARGV[2] == '1' then
    local hs = redis.call('HGETALL', KEYS[1])
    if #hs == 2 then
      local t = redis.call('TIME')
      local sec, usec = tonumber(t[1]), tonumber(t[2])
      local now = sec * 1000 + math.floor(usec / 1000)
      local e = tonumber(string.match(hs[2], '^%d+'))
      if e >= now then
        local n = string.format('%d', draw_n(sec, usec, 1))
        local ttl, wait_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
        redis.call('ZADD', KEYS[2], n, ARGV[1])
        redis.call('ZADD', KEYS[3], string.format('%d', now + wait_ms), ARGV[1])
        redis.call('HSET', KEYS[4], ARGV[1],
          ARGV[3] .. ' ' .. string.format('%d', math.min(ttl, wait_ms)) .. ' ' .. ARGV[6])
        if redis.call('PTTL', KEYS[3]) < wait_ms then   -- as waiters_until() below
          local ms = string.format('%d', 2 * wait_ms)
          redis.call('PEXPIRE', KEYS[2], ms)
          redis.call('PEXPIRE', KEYS[3], ms)
          redis.call('PEXPIRE', KEYS[4], ms)
        end
        return {0, e - now, n}
      end
    end
  end
  -- The other new requests of the common cases, before the prelude: a
  -- reader beside other readers (granted when nobody is queued and it
  -- fits beside the live holders), and a request that must queue (it
  -- does not fit, or a live head that does not fit waits: then dispatch
  -- would grant nothing, and a newcomer queues at the tail, or a try is
  -- refused).  What the full path would do first is left out only where
  -- it changes nothing: with nobody queued there is nothing to expire or
  -- dispatch; behind a live head that does not fit, dead waiters further
  -- on stay until a full run, which expires them before any grant (as
  -- above).  A grant removes the holders whose lease ended (as held());
  -- N:h keeps its expiry unless this lease ends later (every lease
  -- written set it to at least its own end).
  local hs = redis.call('HGETALL', KEYS[1])
  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  local now = sec * 1000 + math.floor(usec / 1000)
  local limit, weight = tonumber(ARGV[2]), tonumber(ARGV[3])
  local sum, first, last = 0, nil, 0
  for i = 2, #hs, 2 do
    local e, w = string.match(hs[i], '^(%d+) (%d+)')
    e = tonumber(e)
    if e >= now then
      sum = sum + tonumber(w)
      if e > last then last = e end
      if not first or e < first then first = e end
    end
  end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head and sum + weight <= limit then
    for i = 2, #hs, 2 do
      if tonumber(string.match(hs[i], '^%d+')) < now then redis.call('HDEL', KEYS[1], hs[i - 1]) end
    end
    local fence = string.format('%d', draw_n(sec, usec, 1))
    local e = now + tonumber(ARGV[4])
    redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', e) .. ' ' .. ARGV[3] .. ' '
      .. fence .. ' ' .. string.format('%d', limit - sum))
    if e > last then redis.call('PEXPIREAT', KEYS[1], string.format('%d', e)) end
    return {1, fence, limit - sum}
  end
  -- (dispatch would grant nothing: nobody queued, or a live head that
  -- does not fit; a try is then refused as the full path refuses it)
  local stuck = not head
  if head then
    local d = redis.call('ZSCORE', KEYS[3], head)
    if d and tonumber(d) >= now then
      local w = string.match(redis.call('HGET', KEYS[4], head), '^(%d+)')
      stuck = sum + tonumber(w) > limit
    end
  end
  if stuck and ARGV[7] == 'try' then return {0} end
  if stuck then
    local n = string.format('%d', draw_n(sec, usec, 1))
    local ttl, wait_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
    redis.call('ZADD', KEYS[2], n, ARGV[1])
    redis.call('ZADD', KEYS[3], string.format('%d', now + wait_ms), ARGV[1])
    redis.call('HSET', KEYS[4], ARGV[1],
      ARGV[3] .. ' ' .. string.format('%d', math.min(ttl, wait_ms)) .. ' ' .. ARGV[6])
    if redis.call('PTTL', KEYS[3]) < wait_ms then   -- as waiters_until() below
      local ms = string.format('%d', 2 * wait_ms)
      redis.call('PEXPIRE', KEYS[2], ms)
      redis.call('PEXPIRE', KEYS[3], ms)
      redis.call('PEXPIRE', KEYS[4], ms)
    end
    return {0, first and first - now or -1, n}
  end
end
]] .. PRELUDE_BODY .. [[
local token, limit, weight = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, wait_ms, mode = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[7]
local u = held()
expire_waiters()
if mode == 'again' then
  local h, rest = holding(token)
  if h then
    put(token, now + ttl, rest)
    keep()
    return h
  end
  if redis.call('ZSCORE', Q, token) then
    dispatch(limit, u)
    h, rest = holding(token)
    if h then
      -- Granted by this very request: its lease is ttl from now, as the
      -- client counts a grant it learns from the answer (the short first
      -- lease of a hand-off is for a waiter that may have died before its
      -- turn; this one is asking).  Left at min(ttl, waiter_timeout), it
      -- ended in Redis while its holder still counted on it (two holders).
      put(token, now + ttl, rest)
      keep()
      return h
    end
    redis.call('ZADD', W, fmt(now + wait_ms), token)
    waiters_until(wait_ms)
    keep()
    -- (the last number drawn, or the clock: a later draw is larger than
    -- both, as draw() makes it)
    return {0, first_end(), fmt(math.max(tonumber(redis.call('GET', N) or '0'),
                                         sec * 1000000 + usec - 1))}
  end
end
u = dispatch(limit, u)
if u + weight <= limit and redis.call('EXISTS', Q) == 0 then
  local fence = grant(token, weight, ttl, limit - u)
  keep()
  return {1, fmt(fence), limit - u}
end
if mode == 'try' then keep(); return {0} end
local n = fmt(draw())               -- the arrival number: also the answer's n
redis.call('ZADD', Q, n, token)
redis.call('ZADD', W, fmt(now + wait_ms), token)
redis.call('HSET', C, token, fmt(weight) .. ' ' .. fmt(math.min(ttl, wait_ms)) .. ' ' .. ARGV[6])
waiters_until(wait_ms)
keep()
return {0, first_end(), n}
]]

--- release: ARGV token, limit.  Ends the token's hold (a lease that ended
-- is not a hold), or takes the token out of the queue (a withdrawn
-- waiter), then dispatches.  When the lock is left with room and no queue
-- and a waitForUnlock marked N:free, deletes the mark and publishes on the
-- channel N:free.  Returns 1 if the token held the lock, else 0.
local RELEASE = [[
-- A holder's release: before the prelude's functions are made, and all of
-- it when nobody waits (its weight is room, there is nothing to dispatch).
-- A mutex's (limit 1) is one HDEL: its N:h holds at most one record (every
-- grant needs an empty N:h, and removes the records whose lease ended)
-- and expires with it (every script that writes a lease sets N:h's expiry
-- to the last lease's end: for a mutex, this one's), so a record still
-- there is a lease still running, as Redis removes a key only once its
-- expiry is past (held() below keeps a lease up to its end too; spec 298).
-- That needs each token's leases to end in order, as they do: each is
-- now + the ttl its process always asks for, or the shorter first lease
-- of a hand-off.  (A server clock that went back could leave N:h a little
-- after its record's end: a release then answers 1 for a lease that ended
-- with nobody granted since, never a second holder.)  Other limits read
-- the record's end and the clock.
local was, sec, usec, now = 0, nil, nil, nil
if ARGV[2] == '1' then
  was = redis.call('HDEL', KEYS[1], ARGV[1])
else
  local e = redis.call('HGET', KEYS[1], ARGV[1])
  if e then
    local t = redis.call('TIME')
    sec, usec = tonumber(t[1]), tonumber(t[2])
    now = sec * 1000 + math.floor(usec / 1000)
    if tonumber(string.match(e, '^%d+')) >= now then
      redis.call('HDEL', KEYS[1], ARGV[1])
      was = 1
    end
  end
end
if was == 1 then
  -- nobody queued and nobody waiting for the unlock: one EXISTS for both
  if redis.call('EXISTS', KEYS[2], KEYS[6]) == 0 then return 1 end
  if not now then                     -- (a mutex's: the clock not read yet)
    local t = redis.call('TIME')
    sec, usec = tonumber(t[1]), tonumber(t[2])
    now = sec * 1000 + math.floor(usec / 1000)
  end
  do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then                -- nobody queued: a waitForUnlock marked it
      redis.call('DEL', KEYS[6])
      redis.call('PUBLISH', KEYS[6], '')
      return 1
    end
    -- A mutex's hand-off to a live head (the contended critical path): what
    -- dispatch() would do, without the prelude.  A mutex has at most one
    -- holder (every grant needs an empty N:h), so N:h is empty now; it is
    -- checked all the same, and any other case (a dead head, whose place
    -- expire_waiters() frees first) takes the full path below.  A dead
    -- waiter behind a live head stays queued until a full run expires it:
    -- dispatch never passes it, since every full run expires first.
    if ARGV[2] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then
      local d = redis.call('ZSCORE', KEYS[3], head)
      if d and tonumber(d) >= now then
        local w, ttl, ch = string.match(redis.call('HGET', KEYS[4], head), '^(%d+) (%d+) (.*)$')
        redis.call('ZREM', KEYS[2], head)
        redis.call('ZREM', KEYS[3], head)
        redis.call('HDEL', KEYS[4], head)
        local fence = string.format('%d', draw_n(sec, usec, 1))
        local he = string.format('%d', now + tonumber(ttl))
        redis.call('HSET', KEYS[1], head, he .. ' ' .. w .. ' ' .. fence .. ' 1')
        redis.call('PEXPIREAT', KEYS[1], he)    -- N:h was empty: its one lease
        tell(ch, head, fence, '1')
        return 1
      end
    end
    -- A reader's release while others still read and a writer waits (a
    -- RedisRWLock's, a semaphore's): when the live head does not fit
    -- beside the live holders, dispatch would grant nothing, and nothing
    -- else is left to do (the queue stays, so no waitForUnlock is rung).
    -- A dead head takes the full path, whose expiry may let the next one
    -- in; dead waiters behind a live head stay until a full run, as above.
    if ARGV[2] ~= '1' then
      local d = redis.call('ZSCORE', KEYS[3], head)
      if d and tonumber(d) >= now then
        local hs = redis.call('HGETALL', KEYS[1])
        local sum = 0
        for i = 2, #hs, 2 do
          local he, hw = string.match(hs[i], '^(%d+) (%d+)')
          if tonumber(he) >= now then sum = sum + tonumber(hw) end
        end
        local w = string.match(redis.call('HGET', KEYS[4], head), '^(%d+)')
        if sum + tonumber(w) > tonumber(ARGV[2]) then return 1 end
      end
    end
  end
end
]] .. PRELUDE_BODY .. [[
local token, limit = ARGV[1], tonumber(ARGV[2])
local u = held()
if was == 0 and redis.call('ZREM', Q, token) == 1 then
  redis.call('ZREM', W, token)
  redis.call('HDEL', C, token)
end
expire_waiters()
u = dispatch(limit, u)
keep()
if u < limit and redis.call('EXISTS', Q) == 0 and redis.call('DEL', F) == 1 then
  redis.call('PUBLISH', F, '')
end
return was
]]

--- release_telling(tell): the release script with 'tell' (the text of a
-- function tell(ch, token, fence, value), sending a hand-off's message) in
-- place of TELL: RedlockMutex's draws its quorum fence in it (redlock.lua).
function M.release_telling(tell) return SET_GET .. DRAW_N .. tell .. RELEASE end
M.release = M.release_telling(TELL)

--- renew: ARGV token, limit, ttl.  Extends the token's lease to ttl from
-- now if it still holds the lock.  Returns 1 if it does, else 0.
M.renew = PRELUDE .. [[
local token, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local u = held()
expire_waiters()
dispatch(limit, u)
local _, rest = holding(token)
if rest then put(token, now + ttl, rest) end
keep()
return rest and 1 or 0
]]

--- state: ARGV limit [, weight, watch_ms].  Returns {weight held, queue
-- length, ms until the first holder's lease ends (-1: no holder)} after
-- expiry and dispatch.  A holder that dies ends by its lease, with no
-- release to publish: a waitForUnlock looks again then, as a queued waiter
-- does (spec 87).  With watch_ms (a waitForUnlock
-- already subscribed to the channel N:free), marks N:free for at least
-- watch_ms when a request of 'weight' could not be granted now (no room,
-- or a queue).  The check and the mark are one atomic step: a release
-- before it changed the state this answer reports; a release after it
-- finds the mark and publishes to a subscriber already listening.  So no
-- release between the watcher's subscription and its mark goes unheard.
M.state = PRELUDE .. [[
local limit = tonumber(ARGV[1])
local u = held()
expire_waiters()
u = dispatch(limit, u)
keep()
local q = redis.call('ZCARD', Q)
if ARGV[3] and (q > 0 or u + tonumber(ARGV[2]) > limit) then
  local ms = tonumber(ARGV[3])
  if redis.call('PTTL', F) < ms then redis.call('SET', F, '1', 'PX', fmt(ms)) end
end
return {u, q, first_end()}
]]

--- steal: ARGV token, limit, weight, ttl, prefix.  A forced takeover
-- (docs/redis-locks.md, "Steal"): every hold in place ends (its record
-- goes: its renewal and release then find it gone and fail, as for a
-- lease that ran out), the token is granted 'weight' with a new fence,
-- and the queue is left as it was, then dispatched (what the ended holds
-- gave back beyond the steal's weight goes to its head).  Each ended
-- holder's process is told on its hand-off channel (prefix .. the
-- process id that begins its token) by "token fence lost", which a
-- hand-off's pattern does not match.  Returns {1, fence, limit, {token,
-- fence, ...}}: the ended holds.
M.steal = PRELUDE .. [[
local token, limit, weight, ttl, prefix =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
held()
expire_waiters()
local all = redis.call('HGETALL', H)
redis.call('DEL', H)
first, last = nil, nil              -- (N:h now holds the stealer's lease alone)
local fence = grant(token, weight, ttl, limit)
local ended = {}
for i = 1, #all, 2 do
  local old, f = all[i], string.match(all[i + 1], '^%d+ %d+ (%d+)')
  ended[#ended + 1] = old
  ended[#ended + 1] = f
  local id = string.match(old, '^([^:]+):')
  if id then
    local ch = prefix .. id
    redis.call(string.byte(ch) == 123 and 'SPUBLISH' or 'PUBLISH', ch, old .. ' ' .. f .. ' lost')
  end
end
local u = dispatch(limit, weight)
keep()
if u < limit and redis.call('EXISTS', Q) == 0 and redis.call('DEL', F) == 1 then
  redis.call('PUBLISH', F, '')
end
return {1, fmt(fence), limit, ended}
]]

--- query: ARGV limit.  The holders and the queue after expiry and
-- dispatch (as state), for am.query: {now, {token, record, ...} of N:h,
-- {token, arrival, ...} of N:q in order, {token, record, ...} of N:c}.
M.query = PRELUDE .. [[
local limit = tonumber(ARGV[1])
local u = held()
expire_waiters()
dispatch(limit, u)
keep()
local q = redis.call('ZRANGE', Q, 0, -1)
local c = {}
for i = 1, #q do c[i] = redis.call('HGET', C, q[i]) or '' end
return {fmt(now), redis.call('HGETALL', H), q, c}
]]

-- For the scripts of the kinds built on this structure (redis_rwlock.lua).
M.PRELUDE = PRELUDE

--- The six keys of the lock named 'name', in the scripts' order.
function M.keys(name)
  return { name .. ":h", name .. ":q", name .. ":w", name .. ":c", name .. ":n",
           name .. ":free" }
end

return M
