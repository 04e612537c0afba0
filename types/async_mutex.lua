---@meta async_mutex

-- LuaLS (lua-language-server) annotations of `require "async_mutex"`: what
-- editors read for completion, hover and type checks.  Definitions only;
-- the module itself is src/async_mutex/init.lua and its C core.  docs/api.md
-- is the reference; spec/25-api-docs_spec.lua checks that every public name
-- of the module is annotated here and documented there.

---A lock of this process (not a Redis lock): what `withLease` (but for a
---ReentrantMutex) and debug mode take.
---@alias async_mutex.LocalLock
---| async_mutex.Mutex
---| async_mutex.Semaphore
---| async_mutex.KeyedMutex
---| async_mutex.KeyedSemaphore
---| async_mutex.RWLock
---| async_mutex.ReentrantMutex
---| async_mutex.KeyedRWLock

---A lock `withLease` takes: a local lock but a ReentrantMutex (its levels
---are one hold).
---@alias async_mutex.LeasableLock
---| async_mutex.Mutex
---| async_mutex.Semaphore
---| async_mutex.KeyedMutex
---| async_mutex.KeyedSemaphore
---| async_mutex.RWLock
---| async_mutex.KeyedRWLock

---Any lock `withTimeout` and `tryAcquire` accept.
---@alias async_mutex.Lock
---| async_mutex.LocalLock
---| async_mutex.RedisMutex
---| async_mutex.RedisSemaphore
---| async_mutex.KeyedRedisMutex
---| async_mutex.RedisReentrantMutex
---| async_mutex.RedisRWLock
---| async_mutex.KeyedRedisRWLock
---| async_mutex.RedlockMutex

---Called with the error and its traceback when a coroutine resumed by the
---module dies with an error.
---@alias async_mutex.ErrorHandler fun(err: any, traceback: string, task: async_mutex.Task|async_mutex.Group|nil)


---A hold in a snapshot (`am.query`): `owner` and `since` where debug mode
---recorded the grant; `owner` and `depth` for a ReentrantMutex.
---@class async_mutex.QueryHeld
---@field mode "exclusive"|"shared"|"weighted"
---@field weight integer? a Semaphore's
---@field owner thread? the holding coroutine
---@field since number? the grant's time, ms of `uv.hrtime() / 1e6`
---@field depth integer? a ReentrantMutex's levels

---A queued request in a snapshot (`am.query`).
---@class async_mutex.QueryPending
---@field mode "exclusive"|"shared"|"weighted"
---@field weight integer? a Semaphore's
---@field owner thread the waiting coroutine
---@field priority number

---What holds a lock and what waits for it (`am.query`), in grant order and
---in the order the queue serves its requests.
---@class async_mutex.QuerySnapshot
---@field held async_mutex.QueryHeld[]
---@field pending async_mutex.QueryPending[]

---Ends one hold of a lock: call it (`release()`) or let it go out of scope
---as a to-be-closed variable (`local release <close> = m:acquire()`).
---Only its first call counts, and it only ends its own hold: the call
---returns `true` when it ended the hold, `false` otherwise (called before,
---the hold ended by an unscoped `release()`, or lost to a lease).
---@class async_mutex.Releaser
---@operator call: boolean
---A readers-writer lock's write hold becomes a read hold, atomically; returns
---the read hold's releaser (this one is spent).
---@field downgrade fun(self: async_mutex.Releaser): async_mutex.Releaser
---Not offered (two upgraders would deadlock): always raises.
---@field upgrade fun(self: async_mutex.Releaser)
---Raises the lost error once a lease ended the hold; otherwise `true` while
---the hold is in place, `false` once given back.
---@field check fun(self: async_mutex.Releaser): boolean

---Releases every key taken by `acquireAll`: callable once and to-be-closed,
---like `async_mutex.Releaser` (`true` from the call that ended the holds).
---@class async_mutex.MultiReleaser
---@operator call: boolean


---A mutex for coroutines on luv's loop.
---@class async_mutex.Mutex
local Mutex = {}

---Creates an unlocked mutex.
---@param cancel_error? any what `cancel()` raises in the requests it rejects (default `async_mutex.E_CANCELED`)
---@return async_mutex.Mutex
function Mutex.new(cancel_error) end

---Suspends the calling coroutine until the mutex is granted (at once when
---free and nobody of equal or higher priority waits).  Raises the cancel
---error if `cancel()` rejects the request.
---@async
---@param priority? number higher first (default 0)
---@return async_mutex.Releaser release
function Mutex:acquire(priority) end

---Acquires, calls `fn()`, releases (also when `fn` raises), and returns
---`fn`'s results.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function Mutex:runExclusive(fn, priority) end

---Suspends until the mutex could be acquired, without acquiring it.
---@async
---@param priority? number
function Mutex:waitForUnlock(priority) end

---`true` while the mutex is held.
---@return boolean
function Mutex:isLocked() end

---Unlocks the mutex; does nothing when it is not locked.
function Mutex:release() end

---Rejects every queued request with the cancel error; the holder keeps the
---mutex.
function Mutex:cancel() end

---Takes the mutex at once, whoever holds it (Web Locks' `steal: true`):
---the hold in place is lost (its releaser returns false, its `check()`
---raises `E_LOST`); queued requests stay queued.  Never waits.
---@param priority? number accepted as `acquire`'s; changes nothing
---@return async_mutex.Releaser release
function Mutex:steal(priority) end


---A counting semaphore for coroutines on luv's loop.
---@class async_mutex.Semaphore
local Semaphore = {}

---Creates a semaphore with the integer `value` (`<= 0` means locked).
---@param value integer
---@param cancel_error? any default `async_mutex.E_CANCELED`
---@return async_mutex.Semaphore
function Semaphore.new(value, cancel_error) end

---Suspends until `weight` can be taken.
---@async
---@param weight? integer a positive integer (default 1)
---@param priority? number higher first (default 0)
---@return integer value the value just before this request took its weight
---@return async_mutex.Releaser release gives back exactly `weight`, once
function Semaphore:acquire(weight, priority) end

---Acquires, calls `fn(value)`, releases (also when `fn` raises), and returns
---`fn`'s results.
---@async
---@param fn fun(value: integer): ...
---@param weight? integer
---@param priority? number
---@return any ...
function Semaphore:runExclusive(fn, weight, priority) end

---Suspends until a request of this weight and priority could be granted,
---without taking anything.
---@async
---@param weight? integer
---@param priority? number
function Semaphore:waitForUnlock(weight, priority) end

---`getValue() <= 0`.
---@return boolean
function Semaphore:isLocked() end

---@return integer
function Semaphore:getValue() end

---Sets the value and grants whatever the new value allows.
---@param n integer
function Semaphore:setValue(n) end

---Adds `weight` (default 1) to the value and grants queued requests.
---@param weight? integer
function Semaphore:release(weight) end

---Rejects every queued request with the cancel error.
function Semaphore:cancel() end

---Takes `weight` at once: every hold in place is lost first (its weight
---comes back), then this one is granted.  Never waits.
---@param weight? integer at most the value with every hold ended
---@param priority? number accepted as `acquire`'s; changes nothing
---@return integer value the value just before the steal took its weight
---@return async_mutex.Releaser release
function Semaphore:steal(weight, priority) end


---The options of keyed locks.
---@class async_mutex.KeyedOptions
---@field cancelError? any what `cancel` raises (default `async_mutex.E_CANCELED`)
---@field maxPending? integer acquirers that may queue per key (default 0: no bound)
---@field maxPendingError? any raised when `maxPending` is reached (default `async_mutex.E_MAX_PENDING`)


---One mutex per key, created when first needed and gone when idle.  A key is
---any value usable as a table key except NaN.
---@class async_mutex.KeyedMutex
local KeyedMutex = {}

---@param options? async_mutex.KeyedOptions
---@return async_mutex.KeyedMutex
function KeyedMutex.new(options) end

---@async
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedMutex:acquire(key, priority) end

---Takes every key of `keys`, all or nothing, in one canonical order.
---@async
---@param keys any[]
---@param priority? number
---@return async_mutex.MultiReleaser release
function KeyedMutex:acquireAll(keys, priority) end

---@async
---@param key any
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedMutex:runExclusive(key, fn, priority) end

---Calls `fn()` holding all the keys of `keys`.
---@async
---@param keys any[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedMutex:runExclusiveAll(keys, fn, priority) end

---@async
---@param key any
---@param priority? number
function KeyedMutex:waitForUnlock(key, priority) end

---@param key any
---@return boolean
function KeyedMutex:isLocked(key) end

---@param key any
function KeyedMutex:release(key) end

---`steal` of the key's lock.
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedMutex:steal(key, priority) end

---Rejects the queued acquirers of `key`, or of every key when `key` is nil.
---@param key? any
function KeyedMutex:cancel(key) end

---How many keys have a lock in use (held or waited on).
---@return integer
function KeyedMutex:count() end

---@param key any
---@return integer acquirers queued for `key`
---@return integer waiters its `waitForUnlock` waiters
function KeyedMutex:waiting(key) end

---A new array of the keys in use.
---@return any[]
function KeyedMutex:keys() end

---A snapshot of `key`'s lock (`am.query`), or of every key in use by key.
---@param key any
---@return async_mutex.QuerySnapshot
---@overload fun(self: async_mutex.KeyedMutex): table<any, async_mutex.QuerySnapshot>
function KeyedMutex:query(key) end


---One semaphore per key, each starting at the same value.
---@class async_mutex.KeyedSemaphore
local KeyedSemaphore = {}

---@param value integer
---@param options? async_mutex.KeyedOptions
---@return async_mutex.KeyedSemaphore
function KeyedSemaphore.new(value, options) end

---@async
---@param key any
---@param weight? integer
---@param priority? number
---@return integer value
---@return async_mutex.Releaser release
function KeyedSemaphore:acquire(key, weight, priority) end

---@async
---@param keys any[]
---@param weight? integer
---@param priority? number
---@return async_mutex.MultiReleaser release
function KeyedSemaphore:acquireAll(keys, weight, priority) end

---@async
---@param key any
---@param fn fun(value: integer): ...
---@param weight? integer
---@param priority? number
---@return any ...
function KeyedSemaphore:runExclusive(key, fn, weight, priority) end

---@async
---@param keys any[]
---@param fn fun(): ...
---@param weight? integer
---@param priority? number
---@return any ...
function KeyedSemaphore:runExclusiveAll(keys, fn, weight, priority) end

---@async
---@param key any
---@param weight? integer
---@param priority? number
function KeyedSemaphore:waitForUnlock(key, weight, priority) end

---@param key any
---@return boolean
function KeyedSemaphore:isLocked(key) end

---@param key any
---@return integer
function KeyedSemaphore:getValue(key) end

---@param key any
---@param weight? integer
function KeyedSemaphore:release(key, weight) end

---`steal` of the key's lock.
---@param key any
---@param weight? integer
---@param priority? number
---@return integer value
---@return async_mutex.Releaser release
function KeyedSemaphore:steal(key, weight, priority) end

---@param key? any
function KeyedSemaphore:cancel(key) end

---@return integer
function KeyedSemaphore:count() end

---@param key any
---@return integer acquirers
---@return integer waiters
function KeyedSemaphore:waiting(key) end

---@return any[]
function KeyedSemaphore:keys() end

---A snapshot of `key`'s lock (`am.query`), or of every key in use by key.
---@param key any
---@return async_mutex.QuerySnapshot
---@overload fun(self: async_mutex.KeyedSemaphore): table<any, async_mutex.QuerySnapshot>
function KeyedSemaphore:query(key) end


---A readers-writer lock: readers share it, a writer holds it alone; one
---queue in priority then arrival order, granted from its head.
---@class async_mutex.RWLock
local RWLock = {}

---Creates an unlocked readers-writer lock.
---@param cancel_error? any default `async_mutex.E_CANCELED`
---@return async_mutex.RWLock
function RWLock.new(cancel_error) end

---Suspends until a read hold is granted (shared with other readers).
---@async
---@param priority? number higher first (default 0)
---@return async_mutex.Releaser release
function RWLock:acquireRead(priority) end

---Suspends until the write hold is granted (exclusive).
---@async
---@param priority? number
---@return async_mutex.Releaser release
function RWLock:acquireWrite(priority) end

---The same as `acquireWrite`: an RWLock stands where a Mutex is expected.
---@async
---@param priority? number
---@return async_mutex.Releaser release
function RWLock:acquire(priority) end

---Calls `fn()` holding a read hold; returns its results.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RWLock:runShared(fn, priority) end

---Calls `fn()` holding the write hold; returns its results.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function RWLock:runExclusive(fn, priority) end

---Suspends until a write could be granted, without acquiring.
---@async
---@param priority? number
function RWLock:waitForUnlock(priority) end

---`true` while a reader or a writer holds it.
---@return boolean
function RWLock:isLocked() end

---`true` while a writer holds it.
---@return boolean
function RWLock:isWriteLocked() end

---How many readers hold it.
---@return integer
function RWLock:readers() end

---Ends the write hold; does nothing while readers or nobody hold it.
function RWLock:release() end

---Rejects every queued reader and writer with the cancel error.
function RWLock:cancel() end

---A write hold at once: every hold in place (reads and write) is lost.
---@param priority? number accepted as `acquire`'s; changes nothing
---@return async_mutex.Releaser release
function RWLock:steal(priority) end

---A read hold at once: every hold in place (reads and write) is lost.
---@param priority? number
---@return async_mutex.Releaser release
function RWLock:stealRead(priority) end


---One readers-writer lock per key (the rules of `RWLock`, per key), created
---when first needed and gone when idle.  `acquire`, `runExclusive` and
---`acquireAll` write, so it stands where a `KeyedMutex` is expected.
---@class async_mutex.KeyedRWLock
local KeyedRWLock = {}

---@param options? async_mutex.KeyedOptions
---@return async_mutex.KeyedRWLock
function KeyedRWLock.new(options) end

---Suspends until a read hold of `key` is granted (shared with its readers).
---@async
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedRWLock:acquireRead(key, priority) end

---Suspends until the write hold of `key` is granted (exclusive).
---@async
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedRWLock:acquireWrite(key, priority) end

---The same as `acquireWrite`.
---@async
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedRWLock:acquire(key, priority) end

---Reads every key of `keys`, all or nothing, in one canonical order.
---@async
---@param keys any[]
---@param priority? number
---@return async_mutex.MultiReleaser release
function KeyedRWLock:acquireAllRead(keys, priority) end

---Writes every key of `keys`, all or nothing, in one canonical order.
---@async
---@param keys any[]
---@param priority? number
---@return async_mutex.MultiReleaser release
function KeyedRWLock:acquireAllWrite(keys, priority) end

---The same as `acquireAllWrite`.
---@async
---@param keys any[]
---@param priority? number
---@return async_mutex.MultiReleaser release
function KeyedRWLock:acquireAll(keys, priority) end

---Calls `fn()` holding a read hold of `key`; returns its results.
---@async
---@param key any
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRWLock:runShared(key, fn, priority) end

---Calls `fn()` holding the write hold of `key`; returns its results.
---@async
---@param key any
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRWLock:runExclusive(key, fn, priority) end

---Calls `fn()` reading every key of `keys`.
---@async
---@param keys any[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRWLock:runSharedAll(keys, fn, priority) end

---Calls `fn()` writing every key of `keys`.
---@async
---@param keys any[]
---@param fn fun(): ...
---@param priority? number
---@return any ...
function KeyedRWLock:runExclusiveAll(keys, fn, priority) end

---Suspends until a write of `key` could be granted, without acquiring.
---@async
---@param key any
---@param priority? number
function KeyedRWLock:waitForUnlock(key, priority) end

---`true` while a reader or a writer holds `key`.
---@param key any
---@return boolean
function KeyedRWLock:isLocked(key) end

---`true` while a writer holds `key`.
---@param key any
---@return boolean
function KeyedRWLock:isWriteLocked(key) end

---How many readers hold `key`.
---@param key any
---@return integer
function KeyedRWLock:readers(key) end

---Ends the write hold of `key`; does nothing while readers or nobody hold it.
---@param key any
function KeyedRWLock:release(key) end

---`steal` (a write) of the key's lock.
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedRWLock:steal(key, priority) end

---`stealRead` of the key's lock.
---@param key any
---@param priority? number
---@return async_mutex.Releaser release
function KeyedRWLock:stealRead(key, priority) end

---Rejects the queued readers and writers of `key`, or of every key.
---@param key? any
function KeyedRWLock:cancel(key) end

---How many keys have a lock in use (held or waited on).
---@return integer
function KeyedRWLock:count() end

---@param key any
---@return integer acquirers queued for `key`
---@return integer waiters its `waitForUnlock` waiters
function KeyedRWLock:waiting(key) end

---A new array of the keys in use.
---@return any[]
function KeyedRWLock:keys() end

---A snapshot of `key`'s lock (`am.query`), or of every key in use by key.
---@param key any
---@return async_mutex.QuerySnapshot
---@overload fun(self: async_mutex.KeyedRWLock): table<any, async_mutex.QuerySnapshot>
function KeyedRWLock:query(key) end


---A mutex its holder (the coroutine it was granted to) may acquire again
---without waiting, one level per acquire.
---@class async_mutex.ReentrantMutex
local ReentrantMutex = {}

---Creates an unlocked reentrant mutex.
---@param cancel_error? any default `async_mutex.E_CANCELED`
---@return async_mutex.ReentrantMutex
function ReentrantMutex.new(cancel_error) end

---The holder: granted at once as one more level.  Others: waits as for a
---Mutex.
---@async
---@param priority? number higher first (default 0)
---@return async_mutex.Releaser release ends this level only
function ReentrantMutex:acquire(priority) end

---Acquires (re-enters for the holder), calls `fn()`, releases that level.
---@async
---@param fn fun(): ...
---@param priority? number
---@return any ...
function ReentrantMutex:runExclusive(fn, priority) end

---Suspends until the mutex is free; raises when called by its holder.
---@async
---@param priority? number
function ReentrantMutex:waitForUnlock(priority) end

---`true` while held.
---@return boolean
function ReentrantMutex:isLocked() end

---The levels held (0 when free).
---@return integer
function ReentrantMutex:depth() end

---`true` when the running coroutine holds it.
---@return boolean
function ReentrantMutex:isHeldByMe() end

---Rejects every queued request with the cancel error.
function ReentrantMutex:cancel() end

---Takes the mutex at once from another coroutine: every level of its
---hold is lost; this coroutine holds it at depth 1.  Raises when this
---coroutine holds it already.
---@param priority? number
---@return async_mutex.Releaser release
function ReentrantMutex:steal(priority) end


---@class async_mutex
local async_mutex = {}

---The release, as in the rockspec (`"0.1.0"`).
---@type string
async_mutex._VERSION = "0.1.0"

---Raised by a `withTimeout` lock whose deadline passes.
async_mutex.E_TIMEOUT = "timeout while waiting for mutex to become available"

---Raised by a `tryAcquire` lock that cannot be had now.
async_mutex.E_ALREADY_LOCKED = "mutex already locked"

---Raised in the requests `cancel()` rejects.
async_mutex.E_CANCELED = "request for lock canceled"

---Raised when a keyed lock's `maxPending` bound is reached.
async_mutex.E_MAX_PENDING = "too many pending requests for this key"

---What `async_mutex.redis` calls raise when the server cannot answer, and
---why: an error object equal (`==`) to `async_mutex.E_UNAVAILABLE` whatever
---its reason; `tostring` gives its message.  Shared: not to be changed.
---@class async_mutex.E_UNAVAILABLE
---@field message string "redis server unavailable", then ": " and the reason if any
---@field reason? string why ("connection refused to 127.0.0.1:6379"); nil on the constant itself

---Raised by `async_mutex.redis` calls that the server cannot answer
---(refused, lost or timed-out connection, closed client), with the reason;
---the same as `redis.E_UNAVAILABLE`.  Compare with `==`.
---@type async_mutex.E_UNAVAILABLE
async_mutex.E_UNAVAILABLE = {}

---Raised by `check()` and `runExclusive` once a lease-based hold was lost
---(`withLease` ran out, or a Redis lock's lease could not be renewed).
async_mutex.E_LOST = "lock lost: lease expired"

async_mutex.Mutex = Mutex
async_mutex.Semaphore = Semaphore
async_mutex.KeyedMutex = KeyedMutex
async_mutex.KeyedSemaphore = KeyedSemaphore
async_mutex.RWLock = RWLock
async_mutex.ReentrantMutex = ReentrantMutex
async_mutex.KeyedRWLock = KeyedRWLock

-- The Redis locks (types/redis_lock.lua), loaded on first use.
---@type async_mutex.RedisMutex
async_mutex.RedisMutex = nil
---@type async_mutex.RedisSemaphore
async_mutex.RedisSemaphore = nil
---@type async_mutex.KeyedRedisMutex
async_mutex.KeyedRedisMutex = nil
---@type async_mutex.RedisReentrantMutex
async_mutex.RedisReentrantMutex = nil
---@type async_mutex.RedisRWLock
async_mutex.RedisRWLock = nil
---@type async_mutex.KeyedRedisRWLock
async_mutex.KeyedRedisRWLock = nil
---@type async_mutex.RedlockMutex
async_mutex.RedlockMutex = nil

---A lock sharing all state with `lock`, whose requests raise
---`timeout_error` (default `async_mutex.E_TIMEOUT`) when not granted within
---`ms` milliseconds.
---@generic L: async_mutex.Lock
---@param lock L
---@param ms number non-negative; `math.huge` waits for ever
---@param timeout_error? any
---@return L
function async_mutex.withTimeout(lock, ms, timeout_error) end

---A lock sharing all state with `lock`, whose requests decide at once and
---raise `already_locked_error` (default `async_mutex.E_ALREADY_LOCKED`) when
---they cannot succeed now.
---@generic L: async_mutex.Lock
---@param lock L
---@param already_locked_error? any
---@return L
function async_mutex.tryAcquire(lock, already_locked_error) end

---The options of `withLease`.
---@class async_mutex.LeaseOptions
---@field fromRequest? boolean count the lease from the request, not the grant

---A lock sharing all state with `lock`, whose holds last at most `ms`
---milliseconds; then the hold is lost (`releaser:check()` raises
---`lost_error`, default `async_mutex.E_LOST`).  Not a ReentrantMutex, nor
---a Redis lock (its holds are leases in Redis already).
---@generic L: async_mutex.LeasableLock
---@param lock L
---@param ms number positive and finite
---@param lost_error? any
---@param options? async_mutex.LeaseOptions
---@return L
function async_mutex.withLease(lock, ms, lost_error, options) end

-- luacheck: push ignore 241 (Signal: a class of methods, read by nothing)
---An abort signal (Web Locks' `AbortSignal`): one `abort` ends every request
---made with it (`async_mutex.withSignal`), with its reason.
---@class async_mutex.Signal
---@field aborted boolean
---@field reason any `nil` until aborted
local Signal = {}

---Aborts the signal, once: every request waiting with it fails with
---`reason` (default `async_mutex.E_CANCELED`), and later ones at once.
---@param reason? any
function Signal:abort(reason) end

---Raises the reason when the signal is aborted.
function Signal:throwIfAborted() end
-- luacheck: pop

---A new abort signal, not aborted.
---@return async_mutex.Signal
function async_mutex.signal() end

---A lock sharing all state with `lock`, whose requests fail with the
---signal's reason once it is aborted (at once when it is already).  Not a
---Redis lock.
---@generic L: async_mutex.LocalLock
---@param lock L
---@param signal async_mutex.Signal
---@return L
function async_mutex.withSignal(lock, signal) end

---Sets the handler of failures nobody took: an error of a task nobody joined
---(at the end of the next loop turn; `task` the task, or the group whose
---first failure it is), or of a coroutine of yours the module resumed
---(`task` nil).  `nil`: print them on stderr.  Returns the previous one.
---@param handler async_mutex.ErrorHandler?
---@return async_mutex.ErrorHandler? previous
function async_mutex.setErrorHandler(handler) end

---How many coroutines the module holds right now (queued, granted and about
---to be resumed, sleeping, joining a task or a group).
---@return integer
function async_mutex.pending() end

---@alias async_mutex.RedisQueryable async_mutex.RedisMutex|async_mutex.RedisSemaphore
---|async_mutex.KeyedRedisMutex|async_mutex.RedisReentrantMutex|async_mutex.RedisRWLock
---|async_mutex.KeyedRedisRWLock

---What holds `lock` and what waits for it: a new snapshot, with or without
---debug mode (README, `am.query`); a keyed set's with `key`.  On a Redis
---lock (docs/redis-locks.md, "Query") it reads the server, and yields.
---@param lock async_mutex.LocalLock|async_mutex.RedisQueryable
---@param key any?
---@return async_mutex.QuerySnapshot|async_mutex.RedisQuerySnapshot
function async_mutex.query(lock, key) end

-- luacheck: push ignore 241 (Task and Group: classes of methods, read by nothing)
---A coroutine started by `async_mutex.spawn` or `group:spawn`, and how it
---ended.  To-be-closed: closing it cancels it.
---@class async_mutex.Task
local Task = {}

---Suspends until the task has ended; returns its results, or raises its
---error (the value raised, unchanged), or `async_mutex.E_CANCELED`.
---@async
---@return any ...
function Task:join() end

---Closes the task's coroutine (its `<close>` variables run; its joiners
---get `E_CANCELED`); a running task is closed at the loop turn after its
---next yield.  Returns false when the task had ended already.
---@return boolean
function Task:cancel() end

---@alias async_mutex.TaskStatus "running"|"waiting"|"done"|"failed"|"canceled"

---How the task stands.
---@return async_mutex.TaskStatus
function Task:status() end

---A set of tasks: the first to fail cancels the others, and joining raises
---that failure.  To-be-closed: closing joins it (an error leaving the
---block cancels its tasks instead).
---@class async_mutex.Group
local Group = {}

---Starts `fn(...)` as a task of the group (as `async_mutex.spawn`).
---@param fn async fun(...): ...
---@param ... any
---@return async_mutex.Task
function Group:spawn(fn, ...) end

---Suspends until every task of the group has ended; raises the first
---failure.
---@async
function Group:join() end

---Cancels every task of the group; true if one had not ended.
---@return boolean
function Group:cancel() end
-- luacheck: pop

---Starts `fn(...)` as a task: in a new coroutine at once (it runs up to its
---first yield), and returns the task.  An error escaping it is its outcome
---(`task:join()` raises it); one nobody takes by the end of the next loop
---turn goes to the error handler (`setErrorHandler`) or stderr, never to
---the caller.  Its `<close>` variables run as the error leaves them.
---@param fn async fun(...): ...
---@param ... any
---@return async_mutex.Task
function async_mutex.spawn(fn, ...) end

---A new, empty group of tasks.
---@return async_mutex.Group
function async_mutex.group() end

---The options of `async_mutex.run`.
---@class async_mutex.RunOptions
---@field unjoined? "raise"|"report" a failure nobody took: raise the first (default), or only report them
---@field traceback? boolean false: raise errors unchanged, without their traceback (default true)

---Runs `fn(...)` as a task and luv's loop until nothing is left to run;
---returns fn's results.  Raises fn's error (its text with its traceback),
---else the first failure nobody joined, else a report of the coroutines
---left waiting for ever.  Not while the loop runs.  `options` may come
---first.
---@param fn fun(...): ...
---@param ... any
---@return any ...
---@overload fun(options: async_mutex.RunOptions, fn: fun(...): ..., ...): ...
function async_mutex.run(fn, ...) end

---How many coroutines the module holds waiting (for a lock, a task or a
---group, or asleep), and a report naming each with what it waits for and
---where; 0 and nil when none.  After `uv.run()` returned, each waits for
---ever.
---@return integer count
---@return string? report
function async_mutex.stranded() end

---Suspends the calling coroutine for at least `ms` milliseconds, counted
---from the call (the monotonic clock), as a timed waiter of the scheduler:
---no luv handle of its own.  `sleep(0)` always yields to the loop.  Raises
---outside a coroutine.
---@async
---@param ms number non-negative and finite
function async_mutex.sleep(ms) end

---The options of `async_mutex.optimistic`.
---@class async_mutex.OptimisticOptions
---@field maxAttempts? integer calls of `fn` at most (default 10; `math.huge`: no bound)
---@field baseDelay? number ms: the first sleep's cap, doubled after each conflict (default 1)
---@field maxDelay? number ms: the cap of every sleep (default 100)
---@field random? fun(): number returns a number in [0, 1) (default `math.random`)
---@field sleep? fun(ms: integer) suspends the coroutine for `ms` (default `async_mutex.sleep`)
---@field conflictError? any raised when every attempt conflicted (default `async_mutex.E_CONFLICT`)

---Raised by `optimistic` when every attempt conflicted.
async_mutex.E_CONFLICT = "optimistic update gave up: too many conflicts"

---Calls `fn(attempt)` (1, 2, ...) until it returns `true`, and returns what
---`fn` returned after `true`.  `fn` reads, computes and tries one
---conditional write; it returns `false` when the write lost to another
---writer, and the loop sleeps (capped exponential backoff, full jitter) and
---calls it again, up to `maxAttempts` times, then raises `conflictError`.
---An error raised by `fn` propagates at once.  Call it in a coroutine.
---@async
---@param fn fun(attempt: integer): boolean, ...
---@param options? async_mutex.OptimisticOptions
---@return any ...
function async_mutex.optimistic(fn, options) end

---Raised by debug mode (`async_mutex.debug`) in a request that would wait
---for ever: it would wait for a lock its own coroutine holds, or close a
---cycle of waiting coroutines.  Nothing is queued.
async_mutex.E_DEADLOCK = "deadlock: the request would wait for ever"

---A lock, a keyed lock or a decorated lock of this process, as
---`async_mutex.debug` takes it (debug mode does not watch the Redis locks).
---@alias async_mutex.AnyLock async_mutex.LocalLock

---Hears debug mode's reports: what kind, the text, and its facts as a table.
---@alias async_mutex.DebugReportHandler fun(kind: "deadlock"|"inversion"|"long-hold", text: string, info: table)

---The options of `async_mutex.debug.enable`.
---@class async_mutex.DebugOptions
---@field traceback? boolean capture a traceback at each grant (`where` of a hold)
---@field holdWarning? number ms: a hold lasting longer is reported once (positive, at most 2^40)
---@field onReport? async_mutex.DebugReportHandler hears every report (default: stderr)

---One hold, as `async_mutex.debug.holds()` returns it.
---@class async_mutex.DebugHold
---@field lock async_mutex.AnyLock the lock (a key's: its keyed lock)
---@field kind string `"Mutex"`, `"KeyedMutex"`, `"RWLock"`, ...
---@field key any the key, for a keyed lock
---@field name string the lock's name in reports
---@field holder thread the coroutine the grant was delivered to
---@field since number loop time of the grant (ms, `uv.now()`)
---@field where string the traceback at the acquire (`traceback` option), else `site`
---@field site string `"file:line"` of the acquire
---@field waiters integer acquirers and `waitForUnlock` waiters queued on the lock
---@field weight integer the weight granted
---@field mode? "read"|"write" an RWLock hold's mode

---Debug mode: owner records, deadlocks caught as they close, lock-order
---validation, long holds (docs/debug.md).  Off by default; on with
---`enable` or `ASYNC_MUTEX_DEBUG=1` at require time.
---@class async_mutex.debug
local debug_mode = {}

---Turns debug mode on (again: replaces the options, keeps the records).
---@param options? async_mutex.DebugOptions
function debug_mode.enable(options) end

---Turns debug mode off and drops every record and lockdep's graph.
function debug_mode.disable() end

---Whether debug mode is on.
---@return boolean
function debug_mode.isEnabled() end

---Names a lock (or keyed lock) in reports; a named lock is its own lockdep
---class.  Works while off too.  Returns `lock`.
---@generic L: async_mutex.AnyLock
---@param lock L
---@param name string
---@return L
function debug_mode.name(lock, name) end

---The holds in place, oldest first (of `lock` only, when given).
---@param lock? async_mutex.AnyLock
---@return async_mutex.DebugHold[]
function debug_mode.holds(lock) end

---The text to read when the server hangs: each held lock, for how long, its
---holder's current traceback, where it was acquired, how many wait; then
---lockdep's class and edge counts.
---@param lock? async_mutex.AnyLock
---@return string
function debug_mode.report(lock) end

async_mutex.debug = debug_mode

return async_mutex
