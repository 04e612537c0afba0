--- async_mutex.redis_lock: RedisMutex, RedisSemaphore and KeyedRedisMutex,
-- locks shared by every process that talks to one Redis server, with the
-- API of the local locks.  The rules are in docs/redis-locks.md; the
-- lease vocabulary (E_LOST, releasers returning booleans, check) is the
-- one of docs/semantics.md, "Leases and lost holds".
--
-- The machinery they share (the hub of each client, leases, the Redis half
-- of an acquisition, the lock records) is async_mutex.redis_lock_base.

local base = require "async_mutex.redis_lock_base"

local ipairs, pcall, tointeger, type =
  ipairs, pcall, math.tointeger, type
local format = string.format
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local argerror = checks.argerror
local check_self, check_priority, check_key, check_usable, acquire, finish, check_fn =
  base.check_self, base.check_priority, base.check_key, base.check_usable, base.acquire,
  base.finish, base.check_fn
local options_of, check_client, new_record, release_name, cancel, state, wait_for_unlock =
  base.options_of, base.check_client, base.new_record, base.release_name, base.cancel,
  base.state, base.wait_for_unlock
local MAX_LIMIT = base.MAX_LIMIT
local check_steal, steal, query = base.check_steal, base.redis_steal, base.redis_query

local M = {}

local Mutex = { __name = "async_mutex.RedisMutex" }
local Semaphore = { __name = "async_mutex.RedisSemaphore" }
local Keyed = { __name = "async_mutex.KeyedRedisMutex" }

-- RedisMutex ------------------------------------------------------------

local mutex = {}
Mutex.__index = mutex

--- RedisMutex.new(client, name [, options])
function M.new_mutex(client, name, opts)
  check_client(client, "new")
  base.check_name(name)
  local o = options_of(opts, 3, "new", client)
  local lk = new_record(Mutex, client, name, 1, o, false)
  return lk
end

function mutex.acquire(self, priority)
  local lk, limit, err = check_self(self, Mutex, "acquire")
  check_priority(priority, 1, "acquire")
  check_usable(lk, "acquire a Redis lock")
  local release = acquire(lk, limit, err, nil, lk.name, 1, priority)
  return release
end

function mutex.runExclusive(self, fn, priority)
  local lk, limit, err = check_self(self, Mutex, "runExclusive")
  check_fn(fn, 1)
  check_priority(priority, 2, "runExclusive")
  check_usable(lk, "acquire a Redis lock")
  local release <close> = acquire(lk, limit, err, nil, lk.name, 1, priority)
  return finish(lk, release, pcall(fn))
end

function mutex.waitForUnlock(self, priority)
  local lk, limit, err = check_self(self, Mutex, "waitForUnlock")
  check_priority(priority, 1, "waitForUnlock")
  check_usable(lk, "wait for a Redis lock")
  wait_for_unlock(lk, limit, err, lk.name, 1)
end

function mutex.isLocked(self)
  local lk = check_self(self, Mutex, "isLocked")
  check_usable(lk, "ask Redis")
  local used = state(lk, lk.name)
  return used >= 1
end

function mutex.release(self)
  local lk = check_self(self, Mutex, "release")
  return release_name(lk, lk.name)
end

function mutex.cancel(self)
  local lk = check_self(self, Mutex, "cancel")
  cancel(lk, nil, nil)
end

--- steal([priority]): docs/redis-locks.md, "Steal"
function mutex.steal(self, priority)
  local lk, limit = check_self(self, Mutex, "steal")
  check_priority(priority, 1, "steal")
  check_steal(lk, limit)
  local release = steal(lk, lk.name, 1)
  return release
end

-- am.query(lock): docs/redis-locks.md, "Query" ('n': the key's argument)
function Mutex.__query(self, key, n)
  local lk = check_self(self, Mutex, "query")
  base.check_no_key(lk, key, n)
  return query(lk, lk.name)
end

function Mutex.__tostring(lk)
  return format("async_mutex.RedisMutex (%s)", lk.name)
end

-- RedisSemaphore --------------------------------------------------------

local semaphore = {}
Semaphore.__index = semaphore

local function check_weight(lk, w, n, fname)
  if w == nil then return 1 end
  local i = type(w) == "number" and tointeger(w)
  if not i or i < 1 then argerror(n, fname, "weight must be a positive integer") end
  if i > lk.limit then argerror(n, fname, "weight must not exceed the semaphore's limit") end
  return i
end

--- RedisSemaphore.new(client, name, limit [, options])
function M.new_semaphore(client, name, limit, opts)
  check_client(client, "new")
  base.check_name(name)
  if type(limit) ~= "number" or tointeger(limit) == nil or limit < 1 then
    argerror(3, "new", "limit must be a positive integer")
  end
  if limit > MAX_LIMIT then argerror(3, "new", format("limit must be at most %d", MAX_LIMIT)) end
  local o = options_of(opts, 4, "new", client)
  return new_record(Semaphore, client, name, tointeger(limit), o, false)
end

function semaphore.acquire(self, weight, priority)
  local lk, limit, err = check_self(self, Semaphore, "acquire")
  weight = check_weight(lk, weight, 1, "acquire")
  check_priority(priority, 2, "acquire")
  check_usable(lk, "acquire a Redis lock")
  local release, value = acquire(lk, limit, err, nil, lk.name, weight, priority)
  return value, release
end

function semaphore.runExclusive(self, fn, weight, priority)
  local lk, limit, err = check_self(self, Semaphore, "runExclusive")
  check_fn(fn, 1)
  weight = check_weight(lk, weight, 2, "runExclusive")
  check_priority(priority, 3, "runExclusive")
  check_usable(lk, "acquire a Redis lock")
  local release <close>, value = acquire(lk, limit, err, nil, lk.name, weight, priority)
  return finish(lk, release, pcall(fn, value))
end

function semaphore.waitForUnlock(self, weight, priority)
  local lk, limit, err = check_self(self, Semaphore, "waitForUnlock")
  weight = check_weight(lk, weight, 1, "waitForUnlock")
  check_priority(priority, 2, "waitForUnlock")
  check_usable(lk, "wait for a Redis lock")
  wait_for_unlock(lk, limit, err, lk.name, weight)
end

function semaphore.isLocked(self)
  local lk = check_self(self, Semaphore, "isLocked")
  check_usable(lk, "ask Redis")
  local used = state(lk, lk.name)
  return used >= lk.limit
end

--- getValue(): the room left (limit minus the weight held, in Redis).
function semaphore.getValue(self)
  local lk = check_self(self, Semaphore, "getValue")
  check_usable(lk, "ask Redis")
  local used = state(lk, lk.name)
  return lk.limit - used
end

function semaphore.release(self)
  local lk = check_self(self, Semaphore, "release")
  return release_name(lk, lk.name)
end

function semaphore.cancel(self)
  local lk = check_self(self, Semaphore, "cancel")
  cancel(lk, nil, nil)
end

function semaphore.steal(self, weight, priority)
  local lk, limit = check_self(self, Semaphore, "steal")
  weight = check_weight(lk, weight, 1, "steal")
  check_priority(priority, 2, "steal")
  check_steal(lk, limit)
  local release, value = steal(lk, lk.name, weight)
  return value, release
end

function Semaphore.__query(self, key, n)
  local lk = check_self(self, Semaphore, "query")
  base.check_no_key(lk, key, n)
  return query(lk, lk.name, "weighted")
end

function Semaphore.__tostring(lk)
  return format("async_mutex.RedisSemaphore (%s, %d)", lk.name, lk.limit)
end

-- KeyedRedisMutex -------------------------------------------------------

local keyed = {}
Keyed.__index = keyed

--- KeyedRedisMutex.new(client, prefix [, options])
function M.new_keyed(client, prefix, opts)
  check_client(client, "new")
  base.check_prefix(prefix)
  local o = options_of(opts, 3, "new", client)
  return new_record(Keyed, client, prefix, 1, o, true)
end

function keyed.acquire(self, key, priority)
  local lk, limit, err = check_self(self, Keyed, "acquire")
  local k = check_key(key, 1, "acquire", lk.name)
  check_priority(priority, 2, "acquire")
  check_usable(lk, "acquire a Redis lock")
  local release = acquire(lk, limit, err, key, lk.name .. k, 1, priority)
  return release
end

function keyed.runExclusive(self, key, fn, priority)
  local lk, limit, err = check_self(self, Keyed, "runExclusive")
  local k = check_key(key, 1, "runExclusive", lk.name)
  check_fn(fn, 2)
  check_priority(priority, 3, "runExclusive")
  check_usable(lk, "acquire a Redis lock")
  local release <close> = acquire(lk, limit, err, key, lk.name .. k, 1, priority)
  return finish(lk, release, pcall(fn))
end

function keyed.waitForUnlock(self, key, priority)
  local lk, limit, err = check_self(self, Keyed, "waitForUnlock")
  local k = check_key(key, 1, "waitForUnlock", lk.name)
  check_priority(priority, 2, "waitForUnlock")
  check_usable(lk, "wait for a Redis lock")
  wait_for_unlock(lk, limit, err, lk.name .. k, 1)
end

function keyed.isLocked(self, key)
  local lk = check_self(self, Keyed, "isLocked")
  local k = check_key(key, 1, "isLocked", lk.name)
  check_usable(lk, "ask Redis")
  local used = state(lk, lk.name .. k)
  return used >= 1
end

function keyed.release(self, key)
  local lk = check_self(self, Keyed, "release")
  local k = check_key(key, 1, "release", lk.name)
  return release_name(lk, lk.name .. k)
end

function keyed.cancel(self, key)
  local lk = check_self(self, Keyed, "cancel")
  if key == nil then return cancel(lk, nil, nil) end
  local k = check_key(key, 1, "cancel", lk.name)
  cancel(lk, key, lk.name .. k)
end

function keyed.steal(self, key, priority)
  local lk, limit = check_self(self, Keyed, "steal")
  local k = check_key(key, 1, "steal", lk.name)
  check_priority(priority, 2, "steal")
  check_steal(lk, limit)
  local release = steal(lk, lk.name .. k, 1)
  return release
end

-- am.query(set, key) and set:query(key)
function Keyed.__query(self, key, n)
  local lk = check_self(self, Keyed, "query")
  local k = base.check_query_key(lk, key, n, "query")
  check_usable(lk, "query a Redis lock")
  return query(lk, lk.name .. k)
end

function keyed.query(self, key)
  return Keyed.__query(self, key, 1)
end

function Keyed.__tostring(lk)
  return format("async_mutex.KeyedRedisMutex (%s*)", lk.name)
end

-- acquireAll, runExclusiveAll: several keys at once (redis_multi.lua)
require("async_mutex.redis_multi").install(keyed, Keyed,
  { { all = "acquireAll", run = "runExclusiveAll", weight = 1 } })

-- }==========================================================


-- {========================================================== decorators
-- am.withTimeout and am.tryAcquire hand Redis locks to mt.__decorate
-- (redis_lock_base.lua, decorable).

for _, mt in ipairs({ Mutex, Semaphore, Keyed }) do base.decorable(mt) end

-- }==========================================================

M.RedisMutex = { new = M.new_mutex }
M.RedisSemaphore = { new = M.new_semaphore }
M.KeyedRedisMutex = { new = M.new_keyed }
M.new_mutex, M.new_semaphore, M.new_keyed = nil, nil, nil

return M
