--- async_mutex.redis_scripts: the server side of the Redis locks.
-- Every change of a lock's state in Redis is one of these scripts, run
-- atomically by the server (EVALSHA).  They implement one structure, a
-- counting lock with a FIFO queue, used with limit 1 by RedisMutex and
-- KeyedRedisMutex and with the user's limit by RedisSemaphore.  The design
-- is explained in docs/redis-locks.md ("In Redis").
--
-- The keys of a lock named N (KEYS[1..6], always in this order):
--   N:h  zset   holder token -> end of its lease (server ms)
--   N:g  hash   holder token -> "weight fence value" (value: the room left
--               before this grant, what a Semaphore's acquire returns)
--   N:q  zset   waiter token -> arrival number (the FIFO order)
--   N:w  zset   waiter token -> deadline (server ms); a waiter that does not
--               renew it in time is taken as dead and skipped
--   N:c  hash   waiter token -> "weight lease channel": 'lease' is the
--               first lease of a hand-off, min(ttl, waiter_timeout), so that
--               a waiter that died just before its turn holds the lock no
--               longer than a dead waiter would block it; the new holder
--               renews it to its ttl
--   N:n  string the last number drawn (fences and arrival numbers)
-- Collections that become empty vanish (Redis removes empty keys), so an
-- idle lock leaves only N:n, which expires on its own.
--
-- Numbers: Redis runs scripts on Lua 5.1 with doubles; every number here
-- stays below 2^53 and is written with %.0f (tostring would give 1.8e+15).

local M = {}

-- Shared by every script: the clock, expiry of holders and waiters, the
-- number generator, and dispatch (grants to the queue's head).
local PRELUDE = [[
local H, G, Q, W, C, N = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end

-- The next number for this lock: max(last + 1, server time in us).  It
-- grows with every grant and arrival; after N:n expired or the server
-- restarted empty, the clock keeps it above every number drawn before (as
-- long as the server's clock does not go back).
local function draw()
  local last = tonumber(redis.call('GET', N) or '0')
  local v = math.max(last + 1, now_us)
  redis.call('SET', N, fmt(v), 'PX', 3600000)
  return v
end

-- Holders whose lease ended and waiters that stopped renewing are removed.
local function expire()
  local gone = redis.call('ZRANGEBYSCORE', H, '-inf', '(' .. fmt(now))
  for i = 1, #gone do
    redis.call('ZREM', H, gone[i])
    redis.call('HDEL', G, gone[i])
  end
  local dead = redis.call('ZRANGEBYSCORE', W, '-inf', '(' .. fmt(now))
  for i = 1, #dead do
    redis.call('ZREM', Q, dead[i])
    redis.call('ZREM', W, dead[i])
    redis.call('HDEL', C, dead[i])
  end
end

-- The weight held now.
local function used()
  local sum, all = 0, redis.call('HVALS', G)
  for i = 1, #all do sum = sum + tonumber(string.match(all[i], '^%d+')) end
  return sum
end

local function grant(token, weight, ttl, value)
  local fence = draw()
  redis.call('ZADD', H, now + ttl, token)
  redis.call('HSET', G, token, weight .. ' ' .. fmt(fence) .. ' ' .. value)
  return fence
end

-- Grants to the head of the queue while it fits, each by one message on
-- its process's channel: "token fence value".  Strict FIFO: a head that does not
-- fit blocks the ones behind it.  Returns the weight held afterwards.
local function dispatch(limit)
  local u = used()
  while true do
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if not head then break end
    local info = redis.call('HGET', C, head)
    local w, ttl, ch = string.match(info, '^(%d+) (%d+) (.*)$')
    w = tonumber(w)
    if u + w > limit then break end
    redis.call('ZREM', Q, head)
    redis.call('ZREM', W, head)
    redis.call('HDEL', C, head)
    local fence = grant(head, w, tonumber(ttl), limit - u)
    redis.call('PUBLISH', ch, head .. ' ' .. fmt(fence) .. ' ' .. (limit - u))
    u = u + w
  end
  return u
end

-- Milliseconds until the first lease ends (-1: no holder): a waiter asks
-- again then, in case no release comes (a holder that died).
local function first_end()
  local e = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')[2]
  if not e then return -1 end
  return math.max(0, tonumber(e) - now)
end

-- {1, fence, value} for a holder, nil for anyone else.
local function holding(token)
  local g = redis.call('HGET', G, token)
  if not g then return nil end
  local fence, value = string.match(g, '^%d+ (%d+) (%-?%d+)$')
  return {1, fence, tonumber(value)}
end
]]

--- acquire: ARGV token, limit, weight, ttl, waiter_timeout, channel, mode.
-- mode "try": grant now or answer {0}, never queue.  mode "wait": grant
-- now, or queue the token (a known waiter renews its deadline).  A token
-- already granted (by a hand-off whose message has not arrived yet, or
-- was lost) has its lease renewed.  Returns {1, fence, value} when the token
-- holds the lock ('value': the room left before the grant), {0, ms} when
-- it waits (ms: until the first holder's lease ends, -1 if none), {0}
-- for a failed try.
M.acquire = PRELUDE .. [[
local token, limit, weight = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, wait_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
expire()
local held = holding(token)
if held then
  redis.call('ZADD', H, now + ttl, token)
  return held
end
if redis.call('ZSCORE', Q, token) then
  dispatch(limit)
  held = holding(token)
  if held then return held end
  redis.call('ZADD', W, now + wait_ms, token)
  return {0, first_end()}
end
local u = dispatch(limit)
if redis.call('ZCARD', Q) == 0 and u + weight <= limit then
  return {1, fmt(grant(token, weight, ttl, limit - u)), limit - u}
end
if ARGV[7] == 'try' then return {0} end
redis.call('ZADD', Q, fmt(draw()), token)
redis.call('ZADD', W, now + wait_ms, token)
redis.call('HSET', C, token, weight .. ' ' .. math.min(ttl, wait_ms) .. ' ' .. ARGV[6])
return {0, first_end()}
]]

--- release: ARGV token, limit, free_channel.  Ends the token's hold, or
-- takes the token out of the queue (a withdrawn waiter), then dispatches.
-- Publishes on free_channel when the lock is left with room and no queue
-- (for waitForUnlock).  Returns 1 if the token held the lock, else 0.
M.release = PRELUDE .. [[
local token, limit = ARGV[1], tonumber(ARGV[2])
expire()
local was = 0
if redis.call('HEXISTS', G, token) == 1 then
  redis.call('ZREM', H, token)
  redis.call('HDEL', G, token)
  was = 1
elseif redis.call('ZREM', Q, token) == 1 then
  redis.call('ZREM', W, token)
  redis.call('HDEL', C, token)
end
local u = dispatch(limit)
if u < limit and redis.call('ZCARD', Q) == 0 then
  redis.call('PUBLISH', ARGV[3], '')
end
return was
]]

--- renew: ARGV token, limit, ttl.  Extends the token's lease to ttl from
-- now if it still holds the lock.  Returns 1 if it does, else 0.
M.renew = PRELUDE .. [[
local token, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
expire()
dispatch(limit)
if redis.call('HEXISTS', G, token) == 1 then
  redis.call('ZADD', H, now + ttl, token)
  return 1
end
return 0
]]

--- state: ARGV limit.  Returns {weight held, queue length} after expiry
-- and dispatch.
M.state = PRELUDE .. [[
expire()
local u = dispatch(tonumber(ARGV[1]))
return {u, redis.call('ZCARD', Q)}
]]

--- The six keys of the lock named 'name', in the scripts' order.
function M.keys(name)
  return { name .. ":h", name .. ":g", name .. ":q", name .. ":w",
           name .. ":c", name .. ":n" }
end

return M
