--- async_mutex: async-mutex's Mutex and Semaphore for Lua coroutines on luv.
-- The C core (async_mutex.core) owns the queues, the scheduling and the
-- tasks; this layer composes its calls into runExclusive, the multi-key
-- requests of keyed locks, and am.run.

local core = require "async_mutex.core"
local checks = require "async_mutex.checks"
local uv = require "luv"

local error, getmetatable, ipairs, pcall, rawget, select, setmetatable, tostring, type =
  error, getmetatable, ipairs, pcall, rawget, select, setmetatable, tostring, type
local getinfo = debug.getinfo
-- usage errors: the core's, at the user's call (the first frame outside
-- the Lua layer: this file is registered as such by core.layer, below)
local argerror, typeerror = core.argerror, core.typeerror
local typename, is_callable = checks.typename, checks.is_callable
local huge, max, sort = math.huge, math.max, table.sort
local concat, pack, unpack = table.concat, table.pack, table.unpack
local hrtime = uv.hrtime

-- The clock a limit counts from (ms): read now, never the loop's cached
-- time, as the core's timed requests do (docs/semantics.md, Timeouts).
local function now() return hrtime() / 1e6 end

local limit_of = core.limit
local limited_acquire = core.acquire
local with_timeout = core.withTimeout
-- a KeyedRWLock's, in each mode
local limited_read, limited_write = core.acquireRead, core.acquireWrite

local M = {
  _VERSION = "0.1.0",             -- the release; `make rock` reads it here
  E_TIMEOUT = core.E_TIMEOUT,
  E_ALREADY_LOCKED = core.E_ALREADY_LOCKED,
  E_CANCELED = core.E_CANCELED,
  E_MAX_PENDING = core.E_MAX_PENDING,
  -- async_mutex.redis's, an error object (docs/redis.md, Failures)
  E_UNAVAILABLE = require("async_mutex.unavailable").E_UNAVAILABLE,
  E_LOST = core.E_LOST,             -- docs/semantics.md, Leases and lost holds
  setErrorHandler = core.setErrorHandler,
  pending = core.pending,
  spawn = core.spawn,
  group = core.group,
  -- a private semaphore that nobody releases: its requests can only time out
  sleep = core.sleeper(core.Semaphore.new(0)),
  signal = core.signal,             -- docs/semantics.md, Abort signals
  -- withTimeout, tryAcquire, withLease and withSignal: the C core's
  -- decorators, which Redis locks take their own way (at the end)
}

local KINDS = { "Mutex", "Semaphore", "KeyedMutex", "KeyedSemaphore", "RWLock",
  "ReentrantMutex", "KeyedRWLock" }
local is_keyed = { KeyedMutex = true, KeyedSemaphore = true, KeyedRWLock = true }

-- Usage errors belong to the user's call, the first one outside this file,
-- with no position when that caller is C (pcall), as Lua's own argument
-- errors: the core finds it, for its errors and for core.argerror.
local SOURCE = getinfo(1, "S").source

-- fn, argument #n of fname, must be callable.
local function check_fn(fn, n, fname)
  if not is_callable(fn) then typeerror(n, fname, "function", fn) end
end

-- The metatables each kind's methods accept as self: the lock's and its
-- decorated locks'.
local accepts = {}
for _, kind in ipairs(KINDS) do accepts[kind] = core[kind].self end

local function check_self(self, kind, fname)
  if not accepts[kind][getmetatable(self)] then
    typeerror(1, fname, "async_mutex." .. kind, self)
  end
end


-- {========================================================== runExclusive
-- A Mutex's and a Semaphore's runExclusive is the C core's (run.c).  The
-- other kinds' do the same here: the releaser is to-be-closed: it
-- releases when runExclusive returns, and when the coroutine is closed
-- while fn is suspended.  fn's error is caught so as to release before it
-- propagates (an error that kills a coroutine closes nothing until the
-- coroutine is closed), then re-raised unchanged (level 0).

-- A hold lost while fn ran (a lease ran out) raises the lost error once
-- fn returns (releaser:check(), lease.c); fn's results are dropped.
local check_hold = debug.getregistry()["async_mutex.Releaser"].__index.check

local function finish(release, ok, ...)
  if not ok then
    release()
    error((...), 0)
  end
  if type(release) == "userdata" then check_hold(release) end
  return ...
end

local run = { Mutex = core.Mutex.runExclusive, Semaphore = core.Semaphore.runExclusive }

function run.KeyedMutex(self, key, fn, priority)
  check_self(self, "KeyedMutex", "runExclusive")
  check_fn(fn, 2, "runExclusive")
  local release <close> = self:acquire(key, priority)
  return finish(release, pcall(fn))
end

function run.KeyedSemaphore(self, key, fn, weight, priority)
  check_self(self, "KeyedSemaphore", "runExclusive")
  check_fn(fn, 2, "runExclusive")
  local value, release <close> = self:acquire(key, weight, priority)
  return finish(release, pcall(fn, value))
end

-- The holder's nested runExclusive re-enters (a new level of its hold).
function run.ReentrantMutex(self, fn, priority)
  check_self(self, "ReentrantMutex", "runExclusive")
  check_fn(fn, 1, "runExclusive")
  local release <close> = self:acquire(priority)
  return finish(release, pcall(fn))
end

-- An RWLock stands wherever a Mutex is expected: its runExclusive writes.
function run.RWLock(self, fn, priority)
  check_self(self, "RWLock", "runExclusive")
  check_fn(fn, 1, "runExclusive")
  local release <close> = self:acquireWrite(priority)
  return finish(release, pcall(fn))
end

local function run_shared(self, fn, priority)
  check_self(self, "RWLock", "runShared")
  check_fn(fn, 1, "runShared")
  local release <close> = self:acquireRead(priority)
  return finish(release, pcall(fn))
end

-- A KeyedRWLock stands wherever a KeyedMutex is expected: its
-- runExclusive writes the key; runShared reads it.
function run.KeyedRWLock(self, key, fn, priority)
  check_self(self, "KeyedRWLock", "runExclusive")
  check_fn(fn, 2, "runExclusive")
  local release <close> = self:acquireWrite(key, priority)
  return finish(release, pcall(fn))
end

local function run_shared_key(self, key, fn, priority)
  check_self(self, "KeyedRWLock", "runShared")
  check_fn(fn, 2, "runShared")
  local release <close> = self:acquireRead(key, priority)
  return finish(release, pcall(fn))
end

-- }==========================================================


-- {========================================================== multi-key
-- acquireAll takes every key of a set, all or nothing.  Keys are taken in
-- one canonical order whatever order the caller gives, so two callers
-- with overlapping sets cannot deadlock; duplicates are dropped.  If a
-- key cannot be had (timeout, cancel, tryAcquire, error, the coroutine
-- being closed) the keys already taken are released.

local RANK = { boolean = 1, number = 2, string = 3 }

local function before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    local ra, rb = RANK[ta] or 4, RANK[tb] or 4
    if ra ~= rb then return ra < rb end
    return ta < tb
  end
  if ta == "number" or ta == "string" then return a < b end
  if ta == "boolean" then return b and not a end
  return ("%p"):format(a) < ("%p"):format(b)    -- tables, userdata, ...
end

local function canonical(keys, fname)
  if type(keys) ~= "table" then
    typeerror(1, fname, "table of keys", keys)
  end
  local n = #keys
  if n == 0 then argerror(1, fname, "key set must not be empty") end
  local seen, sorted = {}, {}
  for i = 1, n do
    local key = keys[i]
    if key == nil then argerror(1, fname, ("key #%d must not be nil"):format(i)) end
    if key ~= key then argerror(1, fname, ("key #%d must not be NaN"):format(i)) end
    if not seen[key] then
      seen[key] = true
      sorted[#sorted + 1] = key
    end
  end
  sort(sorted, before)
  return sorted
end

-- A releaser of several keys: callable and to-be-closed, first call only;
-- like every releaser, its call returns whether it ended a hold (docs/api.md,
-- Releasers).
-- A key whose release raises (semaphore value overflow) does not keep
-- the others: each is given back, then the first error is raised again.
local multi = { __name = "async_mutex.MultiReleaser" }
local function release_all(self)
  if self.done then return false end
  self.done = true
  local ended, failed, first_err = false, false, nil
  for i = #self, 1, -1 do
    local ok, gave = pcall(self[i])
    if not ok then
      if not failed then failed, first_err = true, gave end
    elseif gave then
      ended = true
    end
  end
  if failed then error(first_err, 0) end
  return ended
end
multi.__call, multi.__close = release_all, release_all

-- Releases what was taken unless the acquisition completed.
local guard = { __close = function(self) if not self.done then release_all(self) end end }

-- The releaser is the last value a keyed acquire returns.
local function releaser(a, b) return b or a end

-- How each key is taken: the lock's method, or (decorated) the core's
-- limited request; a KeyedRWLock's in the mode asked for.
local TAKE = {
  acquire = { method = "acquire", limited = limited_acquire },
  read = { method = "acquireRead", limited = limited_read },
  write = { method = "acquireWrite", limited = limited_write },
}

local function acquire_all(self, kind, fname, keys, take, ...)
  check_self(self, kind, fname)
  local sorted = canonical(keys, fname)
  local lock, limit, err, signal = limit_of(self)
  if lock == nil then lock = self end
  local deadline = type(limit) == "number" and limit ~= huge and now() + limit
  local held <close> = setmetatable({}, guard)
  local method, limited = take.method, take.limited
  for i = 1, #sorted do
    if limit == nil then
      held[i] = releaser(lock[method](lock, sorted[i], ...))
    elseif signal ~= nil then
      -- the decorated lock's own request carries its signal (and its try);
      -- a deadline: what is left of it, on a copy of the decoration
      local d = deadline and with_timeout(self, max(0, deadline - now()), err) or self
      held[i] = releaser(d[method](d, sorted[i], ...))
    else
      local left = deadline and max(0, deadline - now()) or limit
      held[i] = releaser(limited(lock, left, err, sorted[i], ...))
    end
  end
  held.done = true
  local all = setmetatable({}, multi)
  for i = 1, #held do all[i] = held[i] end
  return all
end

local all = {}

-- (Not tail calls: the C core finds these frames to name the user's call.)
function all.KeyedMutex(self, keys, priority)
  local release = acquire_all(self, "KeyedMutex", "acquireAll", keys, TAKE.acquire, priority)
  return release
end

function all.KeyedSemaphore(self, keys, weight, priority)
  local release = acquire_all(self, "KeyedSemaphore", "acquireAll", keys, TAKE.acquire,
    weight, priority)
  return release
end

-- A KeyedRWLock's acquireAll writes every key, as its acquire writes one.
function all.KeyedRWLock(self, keys, priority)
  local release = acquire_all(self, "KeyedRWLock", "acquireAll", keys, TAKE.write, priority)
  return release
end

local function acquire_all_read(self, keys, priority)
  local release = acquire_all(self, "KeyedRWLock", "acquireAllRead", keys, TAKE.read, priority)
  return release
end

local function acquire_all_write(self, keys, priority)
  local release = acquire_all(self, "KeyedRWLock", "acquireAllWrite", keys, TAKE.write, priority)
  return release
end

-- One function per name (runExclusiveAll, runSharedAll): the C core tells
-- the user's call by the function's frame.
local function make_run_all(fname)
  return function(self, kind, take, keys, fn, ...)
    check_self(self, kind, fname)
    check_fn(fn, 2, fname)
    local release <close> = acquire_all(self, kind, fname, keys, take, ...)
    return finish(release, pcall(fn))
  end
end
local run_all, run_all_shared = make_run_all("runExclusiveAll"), make_run_all("runSharedAll")

local run_all_of = {}

function run_all_of.KeyedMutex(self, keys, fn, priority)
  return run_all(self, "KeyedMutex", TAKE.acquire, keys, fn, priority)
end

function run_all_of.KeyedSemaphore(self, keys, fn, weight, priority)
  return run_all(self, "KeyedSemaphore", TAKE.acquire, keys, fn, weight, priority)
end

function run_all_of.KeyedRWLock(self, keys, fn, priority)
  return run_all(self, "KeyedRWLock", TAKE.write, keys, fn, priority)
end

local function run_shared_all(self, keys, fn, priority)
  return run_all_shared(self, "KeyedRWLock", TAKE.read, keys, fn, priority)
end

-- }==========================================================


-- {========================================================== methods
-- Interposed in the method tables of each kind, plain and decorated.

for _, kind in ipairs(KINDS) do
  local class = core[kind]
  for _, methods in ipairs({ class.methods, class.decorated }) do
    methods.runExclusive = run[kind]
    if kind == "RWLock" then methods.runShared = run_shared end
    if is_keyed[kind] then
      methods.acquireAll = all[kind]
      methods.runExclusiveAll = run_all_of[kind]
    end
    if kind == "KeyedRWLock" then
      methods.runShared = run_shared_key
      methods.acquireAllRead = acquire_all_read
      methods.acquireAllWrite = acquire_all_write
      methods.runSharedAll = run_shared_all
    end
  end
  M[kind] = { new = class.new }
end

-- The functions above that call requests, and how the user numbers the
-- arguments they pass on: {name, from, shift}: the request's argument #n,
-- n >= from, is the user's #n + shift.
core.layer(SOURCE, {
  [run.KeyedMutex] = { "runExclusive", 2, 1 },
  [run.KeyedSemaphore] = { "runExclusive", 2, 1 },
  [run.RWLock] = { "runExclusive", 1, 1 },
  [run.ReentrantMutex] = { "runExclusive", 1, 1 },
  [run_shared] = { "runShared", 1, 1 },
  [run.KeyedRWLock] = { "runExclusive", 2, 1 },
  [run_shared_key] = { "runShared", 2, 1 },
  [all.KeyedMutex] = { "acquireAll", 1, 0 },
  [all.KeyedSemaphore] = { "acquireAll", 1, 0 },
  [all.KeyedRWLock] = { "acquireAll", 1, 0 },
  [acquire_all_read] = { "acquireAllRead", 1, 0 },
  [acquire_all_write] = { "acquireAllWrite", 1, 0 },
  [run_all] = { "runExclusiveAll", 2, 1 },    -- tail-called by run_all_of
  [run_all_shared] = { "runSharedAll", 2, 1 },  -- tail-called by run_shared_all
})

-- }==========================================================

-- am.debug and am.E_DEADLOCK (docs/debug.md); acquireAll takes its keys in
-- canonical order, so they are no nesting for lockdep
local debug_mode = require "async_mutex.debug"
debug_mode.install(M, core, SOURCE, { acquire_all })


-- {========================================================== am.run
-- am.run runs a function as a task and the loop until nothing is left to
-- run, then says what went wrong: the function's error, a failure nobody
-- joined, coroutines left waiting for ever (docs/semantics.md, Tasks).
-- The core keeps the tasks and lists the waiters (core.waiting); this
-- part only runs the loop and words the reports.

local loop_mode, loop_alive, uv_run = uv.loop_mode, uv.loop_alive, uv.run
local pending, waiting, dbg_lock = core.pending, core.waiting, core.dbg_lock

local ACTS = { acquire = "waits to acquire", waitForUnlock = "waits for the unlock of",
  sleep = "sleeps", join = "waits for the end of" }

--- A lock as a report names it: debug mode's name (its given name, or
-- its kind and creation site) or tostring; a key's lock as its set and
-- key; a Semaphore's request with its weight and the value.
local function lock_name(lock, weight)
  local ok, kind, value, held, _, _, key, set = pcall(dbg_lock, lock)
  if not ok then return tostring(lock) end       -- a task or a group joined
  local s
  if debug_mode.isEnabled() then s = debug_mode.label(lock)
  elseif set ~= nil then s = tostring(set) .. " key " .. tostring(key)
  else s = tostring(lock) end
  if kind == "Semaphore" then
    s = s .. (" (weight %d; value %d, %d held)"):format(weight, value, held)
  end
  return s
end

--- In debug mode, who holds the lock of a waiting record and where each
-- acquired it (docs/api.md, Debugging a hang): lines for a report.
local function holders(lock, lines)
  if not debug_mode.isEnabled() then return end
  local ok, _, _, _, _, _, key, set = pcall(dbg_lock, lock)
  if not ok then return end
  for _, h in ipairs(M.debug.holds(set or lock)) do
    if set == nil or h.key == key then
      lines[#lines + 1] = ("      held by %s, acquired at %s"):format(tostring(h.holder), h.where)
    end
  end
end

--- The coroutines waiting now, but those in 'skip' (a set of threads):
-- how many, and a line each (more in debug mode).
local function waiting_report(skip)
  local lines, n = {}, 0
  for _, r in ipairs(waiting()) do
    if not (skip and skip[r.thread]) then
      n = n + 1
      local who = r.task and tostring(r.task) or tostring(r.thread)
      local what = r.what == "sleep" and "" or (" " .. lock_name(r.lock, r.weight))
      lines[#lines + 1] = ("  %s %s%s%s"):format(who, ACTS[r.what], what,
        r.where and (" at " .. r.where) or "")
      if r.what ~= "join" and r.what ~= "sleep" then holders(r.lock, lines) end
    end
  end
  return n, concat(lines, "\n")
end

local function coroutines(n)
  return n == 1 and "1 coroutine waits" or (n .. " coroutines wait")
end

--- am.stranded(): how many coroutines the module holds waiting (for a
-- lock, a task or a group, or sleeping), and a report naming each with
-- what it waits for and where; after uv.run() has returned they wait
-- for ever.  0 and nil when none.
function M.stranded()
  local n, lines = waiting_report(nil)
  if n == 0 then return 0, nil end
  return n, ("%s for ever (nothing left on the loop can wake them):\n%s"):format(
    coroutines(n), lines)
end

local RUN_OPTIONS = { unjoined = true, traceback = true }

-- The kind of failure an entry of am.run's list holds (core.collect).
local FAILED_IN = { ["async_mutex.Task"] = "error in a task nobody joined",
  ["async_mutex.Group"] = "error in a group nobody joined" }

--- Raises a failure: the text with its traceback for a string or a number
-- (unless traceback is false), any other value unchanged.
local function raise(err, text, traceback, prefix)
  local t = type(err)
  if traceback == false or (t ~= "string" and t ~= "number") then error(err, 0) end
  error(prefix and (prefix .. ": " .. text) or text, 0)
end

local function run_options(options)
  local unknown = core.unknown_option(options, RUN_OPTIONS)
  if unknown then argerror(1, "run", unknown) end
  local u, tb = options.unjoined, options.traceback
  if u ~= nil and u ~= "raise" and u ~= "report" then
    argerror(1, "run", "unjoined must be \"raise\" or \"report\"")
  end
  if tb ~= nil and type(tb) ~= "boolean" then
    argerror(1, "run", "traceback must be a boolean, got " .. typename(tb))
  end
  return u ~= "report", tb
end

--- am.run([options,] fn, ...): runs fn(...) as a task and the loop until
-- nothing is left to run; returns fn's results.  Raises fn's error (with
-- its traceback); else the first failure of a task nobody joined (unless
-- options.unjoined = "report"); else a report of the coroutines left
-- waiting for ever.
function M.run(...)
  local first, raise_unjoined, traceback = 1, true, nil
  local options = ...
  if type(options) == "table" and not is_callable(options) then
    first = 2
    raise_unjoined, traceback = run_options(options)
  end
  local fn = select(first, ...)
  if not is_callable(fn) then typeerror(first, "run", "function", select(first, ...)) end
  local failures = {}
  local outer = core.collect(failures, raise_unjoined)   -- (set while an am.run runs)
  if outer ~= nil or loop_mode() ~= nil then
    core.collect(outer, true)
    core.usage_error("attempt to call am.run while the loop runs or inside am.run "
      .. "(spawn a task and join it instead)")
  end
  -- coroutines waiting already (left by earlier code) are not this run's
  local waited
  if pending() > 0 then
    waited = {}
    for _, r in ipairs(waiting()) do waited[r.thread] = true end
  end
  local out
  do
    local _ <close> = setmetatable({}, { __close = function() core.collect(outer, true) end })
    local main = core.run_main(select(first, ...))
    local status = main:status()
    -- the loop runs until nothing is left, unless fn failed already
    if status ~= "failed" and status ~= "canceled" then uv_run() end
    out = pack(core.outcome(main))
  end
  local status = out[1]
  if status == "failed" then raise(out[2], out[3], traceback) end
  if status == "canceled" then error(M.E_CANCELED, 0) end
  if raise_unjoined then
    for _, f in ipairs(failures) do
      local failed = pack(core.failure(f))
      if failed.n > 0 then
        raise(failed[1], failed[2], traceback,
          "am.run: " .. (FAILED_IN[typename(f)] or "error in a coroutine async_mutex resumed"))
      end
    end
  end
  if status ~= "done" then
    local n, lines = waiting_report(waited)
    if loop_alive() then
      error(("am.run: the loop was stopped (uv.stop()) before the function returned; %s:\n%s")
        :format(coroutines(n), lines), 0)
    end
    error(("am.run: the function never returned, and nothing left on the loop can wake it; "
      .. "%s for ever:\n%s"):format(coroutines(n), lines), 0)
  end
  if not loop_alive() then
    local n, lines = waiting_report(waited)
    if n > 0 then
      error(("am.run: the function returned, but %s for ever (nothing left on the loop "
        .. "can wake them):\n%s"):format(coroutines(n), lines), 0)
    end
  end
  return unpack(out, 2, out.n)
end

-- }==========================================================

-- am.optimistic and am.E_CONFLICT (docs/optimistic.md)
require("async_mutex.optimistic").install(M)


-- The Redis locks (docs/redis-locks.md) live in modules of their own,
-- loaded on first use so that this module loads without Redis support.
-- They decorate themselves: withTimeout and tryAcquire hand them to their
-- metatable's __decorate (a tail call, so errors name the user's line).
local REDIS_LOCKS = {
  RedisMutex = "async_mutex.redis_lock", RedisSemaphore = "async_mutex.redis_lock",
  KeyedRedisMutex = "async_mutex.redis_lock",
  RedisReentrantMutex = "async_mutex.redis_reentrant", RedisRWLock = "async_mutex.redis_rwlock",
  KeyedRedisRWLock = "async_mutex.redis_rwlock", RedlockMutex = "async_mutex.redlock",
}
setmetatable(M, { __index = function(_, name)
  local module = REDIS_LOCKS[name]
  if module then return require(module)[name] end
end })

local function decorator(c_decorate, fname)
  return function(lock, ...)
    local mt = getmetatable(lock)
    if type(mt) == "table" and type(rawget(mt, "__decorate")) == "function" then
      return mt.__decorate(fname, lock, ...)
    end
    return c_decorate(lock, ...)
  end
end
M.withTimeout = decorator(core.withTimeout, "withTimeout")
M.tryAcquire = decorator(core.tryAcquire, "tryAcquire")

-- A Redis lock's holds are leases in Redis already (its ttl, renewed by its
-- watchdog): withLease names it, rather than calling it no async_mutex lock
-- ("async_mutex lock expected, got async_mutex.RedisMutex").
local is_redis_lock = checks.REDIS_LOCKS
function M.withLease(lock, ...)
  if is_redis_lock[typename(lock)] then
    argerror(1, "withLease",
      "a Redis lock cannot be leased (its holds are leases in Redis already: option ttl)")
  end
  return core.withLease(lock, ...)
end

-- Redis locks take no signal (their requests wait in Redis, which an abort
-- would have to withdraw): withSignal names them too.
function M.withSignal(lock, ...)
  if is_redis_lock[typename(lock)] then
    argerror(1, "withSignal", "a Redis lock takes no signal")
  end
  return core.withSignal(lock, ...)
end

--- am.query(lock [, key]): docs/semantics.md, Query.  A Redis lock's
-- metatable has its own (__query, docs/redis-locks.md "Query"): it asks
-- the server, and yields.
do
  local core_query = core.query
  function M.query(...)
    local lock, key = ...
    local mt = getmetatable(lock)
    local q = type(mt) == "table" and rawget(mt, "__query")
    if q then return q(lock, key, 2) end
    return core_query(...)          -- ("got no value" for no argument)
  end
end

return M
