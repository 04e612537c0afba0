---@meta

-- LuaLS annotations of the Redis locks: `async_mutex.RedisMutex`,
-- `async_mutex.RedisSemaphore` and `async_mutex.KeyedRedisMutex` (loaded
-- on first use from src/async_mutex/redis_lock.lua).  README.md, "Redis
-- locks", is the reference and docs/redis-locks.md the design;
-- spec/25-api-docs_spec.lua checks that every public name is annotated here
-- and documented there.
-- luacheck: ignore 241 (definition tables: mutated, never read)

---The options of the Redis locks' `new`.
---@class async_mutex.RedisLockOptions
---@field ttl? integer ms a lease lasts without renewal (default 30000, at least 10, at most 2^40)
---@field renewInterval? integer ms between the watchdog's renewals (default `ttl // 3`; 0: no watchdog)
---@field waiterTimeout? integer ms after which a waiting process that stopped renewing: skipped (default 3000, <= 2^40)
---@field onLost? fun(info: async_mutex.RedisLostInfo) called when a hold is lost
---@field cancelError? any what `cancel()` raises (default `async_mutex.E_CANCELED`)
---@field lostError? any what a lost hold raises (default `async_mutex.E_LOST`)
---@field unsafeEviction? "error"|"warn" maxmemory-policy may evict the keys: refuse (default) or warn
---@field replicas? integer grants, renewals, releases confirmed by WAIT on N replicas (>= 1; async_mutex.redis)

---What `onLost` is called with.
---@class async_mutex.RedisLostInfo
---@field name string the lock's name in Redis
---@field fence integer the lost grant's fencing token
---@field reason "expired"|"refused" the lease ran out here, or Redis no longer had it
---@field releaser async_mutex.RedisReleaser the lost hold's releaser

---Ends one hold of a Redis lock: call it (`release()`) or let it go out of
---scope as a to-be-closed variable.  Its first call returns `true`; later
---calls, and a call after the hold was lost, `false`.  In a coroutine the
---call waits for Redis's answer.
---@class async_mutex.RedisReleaser
---@field fence integer the grant's fencing token: strictly increases per lock name
---@operator call: boolean
local RedisReleaser = {}

---Raises the lost error (`async_mutex.E_LOST` by default) once the hold was
---lost; otherwise `true` while it is held, `false` once it was given back.
---@return boolean
function RedisReleaser:check() end


---A mutex shared through one Redis server by every process that uses it.
---@class async_mutex.RedisMutex
local RedisMutex = {}

---A mutex named `name` in Redis (its keys are `name:h`, `name:q`, ...); it
---sends nothing until it is used.
---@param client async_mutex.redis.Client
---@param name string non-empty
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.RedisMutex
function RedisMutex.new(client, name, options) end

---Suspends the calling coroutine until every process's holders and earlier
---waiters are done and Redis grants the lock to this one.
---@async
---@param priority? number orders this process's coroutines (default 0)
---@return async_mutex.RedisReleaser release
function RedisMutex:acquire(priority) end

---Acquires, calls `fn()`, releases (also when `fn` raises), and returns
---`fn`'s results; raises the lost error if the hold was lost meanwhile.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RedisMutex:runExclusive(fn, priority) end

---Suspends until the lock is free in Redis with nobody queued.
---@async
---@param priority? number
function RedisMutex:waitForUnlock(priority) end

---Asks Redis whether some process holds the lock.
---@async
---@return boolean
function RedisMutex:isLocked() end

---Ends this process's oldest hold of the lock; `false` if it had none.
---@return boolean
function RedisMutex:release() end

---Rejects this process's waiters with the cancel error.
function RedisMutex:cancel() end


---A counting semaphore shared through one Redis server: holders' weights
---add up to at most `limit`.
---@class async_mutex.RedisSemaphore
local RedisSemaphore = {}

---@param client async_mutex.redis.Client
---@param name string non-empty
---@param limit integer positive, at most 2^53: the total weight admitted
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.RedisSemaphore
function RedisSemaphore.new(client, name, limit, options) end

---@async
---@param weight? integer from 1 (the default) to `limit`
---@param priority? number
---@return integer value the room left just before this request took its weight
---@return async_mutex.RedisReleaser release gives back exactly `weight`, once
function RedisSemaphore:acquire(weight, priority) end

---@async
---@param fn fun(value: integer): ...
---@param weight? integer
---@param priority? number
---@return any ...
function RedisSemaphore:runExclusive(fn, weight, priority) end

---@async
---@param weight? integer
---@param priority? number
function RedisSemaphore:waitForUnlock(weight, priority) end

---`getValue() <= 0`, asked of Redis.
---@async
---@return boolean
function RedisSemaphore:isLocked() end

---The room left: `limit` minus the weight held, asked of Redis.
---@async
---@return integer
function RedisSemaphore:getValue() end

---Ends this process's oldest hold; `false` if it had none.
---@return boolean
function RedisSemaphore:release() end

---Rejects this process's waiters with the cancel error.
function RedisSemaphore:cancel() end


---One Redis mutex per key: the lock of `key` is named `prefix .. key`.
---@class async_mutex.KeyedRedisMutex
local KeyedRedisMutex = {}

---@param client async_mutex.redis.Client
---@param prefix string
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.KeyedRedisMutex
function KeyedRedisMutex.new(client, prefix, options) end

---@async
---@param key string|number a string or a finite number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisMutex:acquire(key, priority) end

---@async
---@param key string|number
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisMutex:runExclusive(key, fn, priority) end

---@async
---@param key string|number
---@param priority? number
function KeyedRedisMutex:waitForUnlock(key, priority) end

---@async
---@param key string|number
---@return boolean
function KeyedRedisMutex:isLocked(key) end

---Ends this process's oldest hold of `key`; `false` if it had none.
---@param key string|number
---@return boolean
function KeyedRedisMutex:release(key) end

---Rejects this process's waiters of `key`, or of every key when `key` is nil.
---@param key? string|number
function KeyedRedisMutex:cancel(key) end
