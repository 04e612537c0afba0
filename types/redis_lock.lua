---@meta

-- LuaLS annotations of the Redis locks: `async_mutex.RedisMutex`,
-- `async_mutex.RedisSemaphore` and `async_mutex.KeyedRedisMutex` (loaded
-- on first use from src/async_mutex/redis_lock.lua), and the kinds built on
-- them (redis_reentrant.lua, redis_rwlock.lua, redis_multi.lua, redlock.lua).  docs/api.md, "Redis
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
---@field replicas? integer grants, renewals, releases confirmed by WAIT on N replicas (>= 1; not RedlockMutex)

---What `onLost` is called with.
---@class async_mutex.RedisLostInfo
---@field name string the lock's name in Redis
---@field fence integer the lost grant's fencing token
---@field reason "expired"|"refused"|"unknown" ran out here, Redis no longer had it, a downgrade not answered
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

---A RedisRWLock's write hold becomes a read hold in one atomic step in
---Redis (no writer can enter in between; the readers at the head of the
---queue join): returns the read hold's releaser, with a new fence; this
---releaser is spent.  Raises for any other releaser, or a write hold that
---has ended (the lost error for a lost one).
---@async
---@return async_mutex.RedisReleaser read
function RedisReleaser:downgrade() end

---Not offered: raises (two readers that both upgrade would deadlock).
function RedisReleaser:upgrade() end


---A mutex shared through one Redis server by every process that uses it.
---A hold or a queued process in a Redis lock's snapshot (`am.query`,
---docs/redis-locks.md "Query").
---@class async_mutex.RedisQueryEntry
---@field mode "exclusive"|"shared"|"weighted"
---@field weight integer? a RedisSemaphore's
---@field owner string the request's token, not a coroutine
---@field client string the id of the client that made it
---@field mine boolean whether that client is this one
---@field fence integer? a hold's fencing token
---@field ttl integer? ms left of a hold's lease, by the server's clock
---@field depth integer? a RedisReentrantMutex hold of this client

---@class async_mutex.RedisQuerySnapshot
---@field held async_mutex.RedisQueryEntry[] oldest grant first
---@field pending async_mutex.RedisQueryEntry[] in the order they will be served

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

---Takes the lock at once, whoever holds it (docs/redis-locks.md, "Steal"):
---every hold in place ends, lost; the stealer's fence is larger than every
---earlier one; the queue keeps its order.
---@async
---@param priority? number checked, orders nothing
---@return async_mutex.RedisReleaser release
function RedisMutex:steal(priority) end


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

---Takes the lock at once, whoever holds it (docs/redis-locks.md, "Steal"):
---every hold in place ends, lost; the stealer's fence is larger than every
---earlier one; the queue keeps its order.
---@async
---@param weight? integer default 1, at most the limit
---@param priority? number
---@return integer value the limit (every hold ended)
---@return async_mutex.RedisReleaser release
function RedisSemaphore:steal(weight, priority) end


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

---Takes the lock at once, whoever holds it (docs/redis-locks.md, "Steal"):
---every hold in place ends, lost; the stealer's fence is larger than every
---earlier one; the queue keeps its order.
---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisMutex:steal(key, priority) end

---The holders and queue of `key`'s lock, read from Redis (`am.query`).
---@async
---@param key string|number required: the keys are in Redis
---@return async_mutex.RedisQuerySnapshot
function KeyedRedisMutex:query(key) end

---Every key of `keys`, all or nothing: in one atomic request when all their
---locks are free, else one by one in the canonical order of the lock names.
---@async
---@param keys (string|number)[]
---@param priority? number
---@return async_mutex.RedisMultiReleaser release
function KeyedRedisMutex:acquireAll(keys, priority) end

---@async
---@param keys (string|number)[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisMutex:runExclusiveAll(keys, fn, priority) end


---What `acquireAll` returns: call it, or let it go out of scope, to give
---every key back (each by its own request, all at once).  `true` when this
---call gave them all back held; `false` if called before or a key was lost.
---@class async_mutex.RedisMultiReleaser
---@field fences table<string|number, integer> each key (as given) to its hold's fencing token
---@operator call: boolean
local RedisMultiReleaser = {}

---Raises the lost error if a key's hold was lost; `true` while every key is
---held, `false` once they were given back.
---@return boolean
function RedisMultiReleaser:check() end


---A RedisMutex that the coroutine holding it may acquire again at once:
---one hold in Redis, counted in levels here (the API of
---`async_mutex.ReentrantMutex`).
---@class async_mutex.RedisReentrantMutex
local RedisReentrantMutex = {}

---@param client async_mutex.redis.Client
---@param name string non-empty
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.RedisReentrantMutex
function RedisReentrantMutex.new(client, name, options) end

---The holder's call is one more level, at once, with no request; anyone
---else waits as for a RedisMutex.  Each level has its own releaser.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release ends this level, once
function RedisReentrantMutex:acquire(priority) end

---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RedisReentrantMutex:runExclusive(fn, priority) end

---Suspends until the lock is free in Redis; raises for the holder itself.
---@async
---@param priority? number
function RedisReentrantMutex:waitForUnlock(priority) end

---@async
---@return boolean
function RedisReentrantMutex:isLocked() end

---The levels this process's holder holds (0: no hold in this process).
---@return integer
function RedisReentrantMutex:depth() end

---Whether the running coroutine holds the lock.
---@return boolean
function RedisReentrantMutex:isHeldByMe() end

---Rejects this process's waiters with the cancel error.
function RedisReentrantMutex:cancel() end

---Takes the lock at once, whoever holds it (docs/redis-locks.md, "Steal"):
---every hold in place ends, lost; the stealer's fence is larger than every
---earlier one; the queue keeps its order.
---@async
---Not by the coroutine that holds it (it would hold it twice).
---@param priority? number
---@return async_mutex.RedisReleaser release depth 1
function RedisReentrantMutex:steal(priority) end


---A readers-writer lock shared through one Redis server: readers of every
---process share it, a writer holds it alone (the API of `async_mutex.RWLock`).
---@class async_mutex.RedisRWLock
local RedisRWLock = {}

---@param client async_mutex.redis.Client
---@param name string non-empty
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.RedisRWLock
function RedisRWLock.new(client, name, options) end

---A read hold: shared with every other reader; queued behind a waiting writer.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release
function RedisRWLock:acquireRead(priority) end

---A write hold: alone.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release
function RedisRWLock:acquireWrite(priority) end

---`acquireWrite`.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release
function RedisRWLock:acquire(priority) end

---Calls `fn()` holding a read hold.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RedisRWLock:runShared(fn, priority) end

---Calls `fn()` holding the write hold.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RedisRWLock:runExclusive(fn, priority) end

---Suspends until a write could be granted (nobody holds, nobody queued).
---@async
---@param priority? number
function RedisRWLock:waitForUnlock(priority) end

---@async
---@return boolean
function RedisRWLock:isLocked() end

---@async
---@return boolean
function RedisRWLock:isWriteLocked() end

---How many read holds there are (of every process), asked of Redis.
---@async
---@return integer
function RedisRWLock:readers() end

---Ends this process's oldest write hold; `false` (nothing done) if it has none.
---@return boolean
function RedisRWLock:release() end

---Rejects this process's waiters with the cancel error.
function RedisRWLock:cancel() end

---Takes the lock at once, whoever holds it (docs/redis-locks.md, "Steal"):
---every hold in place ends, lost; the stealer's fence is larger than every
---earlier one; the queue keeps its order.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release a write hold
function RedisRWLock:steal(priority) end

---The same, for a read hold (the readers at the queue's head join it).
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release a read hold
function RedisRWLock:stealRead(priority) end


---A RedisRWLock per key, named `prefix .. key` (the API of `async_mutex.KeyedRWLock`).
---@class async_mutex.KeyedRedisRWLock
local KeyedRedisRWLock = {}

---@param client async_mutex.redis.Client
---@param prefix string
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.KeyedRedisRWLock
function KeyedRedisRWLock.new(client, prefix, options) end

---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisRWLock:acquireRead(key, priority) end

---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisRWLock:acquireWrite(key, priority) end

---`acquireWrite`.
---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisRWLock:acquire(key, priority) end

---@async
---@param key string|number
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisRWLock:runShared(key, fn, priority) end

---@async
---@param key string|number
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisRWLock:runExclusive(key, fn, priority) end

---Every key, read, all or nothing, in the canonical order.
---@async
---@param keys (string|number)[]
---@param priority? number
---@return async_mutex.RedisMultiReleaser release
function KeyedRedisRWLock:acquireAllRead(keys, priority) end

---Every key, written, all or nothing, in the canonical order.
---@async
---@param keys (string|number)[]
---@param priority? number
---@return async_mutex.RedisMultiReleaser release
function KeyedRedisRWLock:acquireAllWrite(keys, priority) end

---`acquireAllWrite`.
---@async
---@param keys (string|number)[]
---@param priority? number
---@return async_mutex.RedisMultiReleaser release
function KeyedRedisRWLock:acquireAll(keys, priority) end

---@async
---@param keys (string|number)[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisRWLock:runSharedAll(keys, fn, priority) end

---@async
---@param keys (string|number)[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRedisRWLock:runExclusiveAll(keys, fn, priority) end

---@async
---@param key string|number
---@param priority? number
function KeyedRedisRWLock:waitForUnlock(key, priority) end

---@async
---@param key string|number
---@return boolean
function KeyedRedisRWLock:isLocked(key) end

---@async
---@param key string|number
---@return boolean
function KeyedRedisRWLock:isWriteLocked(key) end

---@async
---@param key string|number
---@return integer
function KeyedRedisRWLock:readers(key) end

---Ends this process's oldest write hold of `key`; `false` if it has none.
---@param key string|number
---@return boolean
function KeyedRedisRWLock:release(key) end

---Rejects this process's waiters of `key`, or of every key when `key` is nil.
---@param key? string|number
function KeyedRedisRWLock:cancel(key) end

---Takes `key`'s lock at once for a write (docs/redis-locks.md, "Steal").
---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisRWLock:steal(key, priority) end

---Takes `key`'s lock at once for a read.
---@async
---@param key string|number
---@param priority? number
---@return async_mutex.RedisReleaser release
function KeyedRedisRWLock:stealRead(key, priority) end

---The holders and queue of `key`'s lock, read from Redis (`am.query`).
---@async
---@param key string|number
---@return async_mutex.RedisQuerySnapshot
function KeyedRedisRWLock:query(key) end


---A mutex held by a quorum (a majority) of N independent Redis servers.
---@class async_mutex.RedlockMutex
local RedlockMutex = {}

---A mutex named `name` on every server of `clients` (one client per
---server, each counted once); the options are the Redis locks' but
---`replicas`, which is refused (the quorum keeps a grant).
---@param clients async_mutex.redis.Client[]
---@param name string non-empty
---@param options? async_mutex.RedisLockOptions
---@return async_mutex.RedlockMutex
function RedlockMutex.new(clients, name, options) end

---Suspends until a quorum of the servers granted the lock to this process
---(each server's queue served in order); raises `E_UNAVAILABLE` when a
---quorum cannot be had.
---@async
---@param priority? number
---@return async_mutex.RedisReleaser release its `fence` strictly increases over the quorum
function RedlockMutex:acquire(priority) end

---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RedlockMutex:runExclusive(fn, priority) end

---Whether a quorum of the servers have a holder.
---@async
---@return boolean
function RedlockMutex:isLocked() end

---Ends this process's oldest hold; `false` if it had none.
---@return boolean
function RedlockMutex:release() end

---Rejects this process's waiters with the cancel error.
function RedlockMutex:cancel() end

---Refused: a Redlock hold is on several independent servers, which no one
---atomic step can take over (docs/redis-locks.md, "Steal").
function RedlockMutex:steal() end
