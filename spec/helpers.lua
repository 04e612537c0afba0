-- Test helpers: run a spec body as a task on luv's loop (am.run), with a
-- deadline, and check that the loop is left with nothing active.
--
--   local h = require "helpers"
--   it("waits", h.async(function() ... h.sleep(10) ... end))
--
-- busted runs bodies on the main thread, which cannot yield; h.async runs the
-- body with am.run (README, "Testing your own code"), which runs the loop until it
-- is idle, raises the body's error (with its traceback), and fails when
-- coroutines are left waiting for ever; h.run also fails if the deadline
-- passed or a handle other than the module's stopped ones is still active.
--
-- Errors that happen outside the body (in a coroutine started with h.spawn, in
-- a coroutine the module resumed and that died, in a helper timer) are
-- collected and make the test fail when the body is done.
--
-- h.left_free(new, ..., fn): a case on a new lock, new(...), that fn(lock)
-- must leave free (no hold; on a keyed lock, no key in use);
-- h.holding(new, fn): a case on a new lock the test holds until it ends.
--
-- Also: h.tick(n) (one loop turn: deferred wake-ups delivered), h.sleep(ms),
-- h.wait_until(pred), h.spawn(fn, ...), h.acquirer / h.waiter (a coroutine
-- blocked in acquire / waitForUnlock, with its outcome recorded), h.held(lock)
-- (a new lock held by the test), h.chain (an
-- acquirer that releases at once), h.holder(lock) (a lock held for main
-- code), h.check_one_owner(lock, a, b), h.occupancy() (how many are inside
-- a section at once), h.without_yield(fn), h.granted_at_once(n, take) (n
-- grants without a yield), h.cancel_exclusive_waiter(lock),
-- h.handed_on_refuses_try(), h.newcomer_behind_waiter(lock),
-- h.served_in_turn(first, second) and h.granted_in_turn(log, first, second)
-- (two waiters served in that order), h.try_now(fn),
-- h.error_of(fn) (message without "file:line: "), h.keys_of(keyed),
-- h.count_handles(kind),
-- h.run_loop(ms) (uv.run() from main code), h.tcp_server(on_data) (a loopback
-- server that reads and, by default, never answers), h.subprocess(code) (a separate
-- lua5.4; h.am_subprocess(code): one with uv and am; h.clean_exit(res, out): its
-- stderr empty, exit 0, stdout out), h.instructions(code) (callgrind's count of one), h.load(n) (load-test sizes), h.gc(), h.closing(...) (closes
-- clients and servers when a case ends, also when it fails), h.ms_since(t0),
-- h.with_loop_clock(fn) (deadlines counted from uv.now(), as a model does),
-- h.reports_during(fn) (the module's reports of failures made meanwhile),
-- h.reentrancy_fuzzer(script, seed, n) (a fuzzer of spec/fuzz run and
-- checked), h.CHILD_ACTIVE (a child's active(): Lua source), h.ROOT (the
-- repository root).
--
-- The numbering of the spec files is explained in spec/README.md.

local uv = require "luv"

local helpers = {}

-- GC stress: AM_GC_STRESS=1 runs every spec with the collector in incremental
-- mode at its most aggressive (a collection step at nearly every allocation).
helpers.GC_STRESS = os.getenv("AM_GC_STRESS") == "1"
if helpers.GC_STRESS then
  collectgarbage("incremental", 1, 1000)
end

-- AM_STRESS_SCALE=0.1 (the asan and valgrind targets) scales load tests down.
helpers.STRESS_SCALE = tonumber(os.getenv("AM_STRESS_SCALE") or "") or 1

--- True when the suite runs slowed down (GC stress, sanitizers, valgrind):
-- assertions about CPU time are skipped then.
helpers.SLOW = helpers.GC_STRESS or helpers.STRESS_SCALE < 1

--- Scales a load test's size: by AM_STRESS_SCALE, and down by 50 under GC
-- stress (every allocation runs a collection step there, so 100,000
-- coroutines would take minutes).
function helpers.load(n)
  n = math.floor(n * helpers.STRESS_SCALE)
  if helpers.GC_STRESS then n = n // 50 end
  return math.max(1, n)
end

--- The repository root, as a path from where the suite runs: the parent
-- of spec/, the folder of this file (and of every spec).
helpers.ROOT = (debug.getinfo(1, "S").source:gsub("^@", ""):match("^(.*)/[^/]*$") or ".")
  .. "/.."

helpers.DEFAULT_DEADLINE = 5000

-- Deadlines and wait_until limits are stretched by this factor when SLOW.
helpers.TIME_SCALE = helpers.SLOW and 4 or 1

-- Handles created by these helpers: left out of the "left active" checks.
local own = setmetatable({}, { __mode = "k" })
local function own_handle(hd) own[hd] = true; return hd end

-- Errors seen outside the body during helpers.run (strings, with tracebacks).
local stray = {}
local function record(msg)
  stray[#stray + 1] = tostring(msg)
end
helpers.record_error = record

-- (An idle Redis client's poll handle goes on watching, unref'd: it keeps
-- no loop running, docs/redis.md, Connection; it is not counted.)
local function idle_poll(hd)
  return tostring(hd):match("^uv_poll") and not hd:has_ref()
end

local function active_handles(except)
  local names = {}
  uv.walk(function(hd)
    if hd ~= except and not own[hd] and not hd:is_closing()
        and hd:is_active() and not idle_poll(hd) then
      names[#names + 1] = tostring(hd)
    end
  end)
  return names
end
--- Active handles on the loop, apart from the helpers' own ones.
helpers.active_handles = function() return active_handles(nil) end

--- Number of non-closing handles (active or not) whose tostring starts with
-- `kind` ("uv_timer_t", "uv_idle_t"), apart from the helpers' own ones.
function helpers.count_handles(kind, only_active)
  local n = 0
  uv.walk(function(hd)
    if not own[hd] and not hd:is_closing()
        and tostring(hd):sub(1, #kind) == kind
        and (not only_active or hd:is_active()) then
      n = n + 1
    end
  end)
  return n
end

-- While helpers.run runs, route the module's reports of dead coroutines into
-- `stray`, so that a failing assertion in a resumed coroutine fails the test.
local function install_error_handler()
  local am = package.loaded.async_mutex
  if type(am) ~= "table" or type(am.setErrorHandler) ~= "function" then
    return function() end
  end
  local ok, prev = pcall(am.setErrorHandler, function(err, tb)
    record("coroutine resumed by async_mutex died: " .. tostring(err)
      .. "\n" .. tostring(tb))
  end)
  if not ok then return function() end end
  return function() pcall(am.setErrorHandler, prev) end
end

-- connect's stand-in, made in a chunk that joins the module's Lua layer
-- (checks.lua) when run: connect's usage errors stand at the spec's line,
-- as without it.
local stand_in = assert(load([[
  require("async_mutex.checks").join_layer()
  return function(connect, made)
    return function(...)
      local c = connect(...)
      made[c] = true
      return c
    end
  end
]], "=(spec/helpers.lua: connect's stand-in)"))

-- The Redis clients a test makes through async_mutex.redis's connect (when
-- that module is loaded), so that a failed test can close them: its
-- coroutines would otherwise wait on them, and keep the loop of every later
-- test of the process running ("the body finished, the loop did not").
-- Returns a function that stops the tracking and returns the clients.
local function track_clients()
  local redis = package.loaded["async_mutex.redis"]
  if type(redis) ~= "table" or type(redis.connect) ~= "function" then
    return function() return {} end
  end
  local connect = redis.connect
  local made = setmetatable({}, { __mode = "k" })  -- (specs of collection too)
  redis.connect = stand_in()(connect, made)
  return function()
    redis.connect = connect
    return made
  end
end

-- After a failed test: closes its clients, and runs the loop until what
-- they ended has ended (at most 2 s; their errors are the failure's).
local function close_clients(made)
  for c in pairs(made) do pcall(c.close, c) end
  local bound = own_handle(uv.new_timer())
  bound:start(2000, 0, function() uv.stop() end)
  bound:unref()
  pcall(uv.run)
  bound:close()
  uv.run("nowait")
end

--- Runs body with `handler` as the module's error handler (setErrorHandler),
-- restoring the previous one afterwards, also when body fails.
function helpers.with_handler(handler, body)
  local am = require "async_mutex"
  local prev = am.setErrorHandler(handler)
  local ok, err = pcall(body)
  am.setErrorHandler(prev)
  if not ok then error(err, 0) end
end

--- Runs body(errors) with a handler (setErrorHandler) that appends each
-- error value the module reports to the list `errors`, which body may
-- watch as it runs; returns that list.
function helpers.with_errors(body)
  local errors = {}
  helpers.with_handler(function(err) errors[#errors + 1] = err end,
    function() body(errors) end)
  return errors
end

--- Runs body with a handler collecting the module's reports (its
-- setErrorHandler's handler); returns them, each {err, text, task}.
function helpers.reports_during(body)
  local reports = {}
  helpers.with_handler(function(err, text, task)
    reports[#reports + 1] = { err = err, text = text, task = task }
  end, body)
  return reports
end

--- Runs body() with the deadlines of timed requests counted from the
-- loop's cached time (uv.now()), as they were before the module read the
-- clock at each request (docs/semantics.md, Timeouts): for specs of the
-- queues' order that need deadlines made in one loop turn to be equal.
-- Restores the clock after, also when body fails.
function helpers.with_loop_clock(body)
  local core = require "async_mutex.core"
  local clock = core.clock(function() return uv.now() * 1e6 end)
  local ok, err = pcall(body)
  core.clock(clock)
  if not ok then error(err, 0) end
end

--- Runs `body()` as a task on the loop with am.run (README, "Testing your
-- own code"); returns what it returned.  am.run fails the test when the body
-- raises (with its traceback), and when coroutines are left waiting for
-- ever; failures of other coroutines are reported to this file's handler
-- (unjoined = "report"), so that a test may set its own handler for them
-- (h.with_handler), and fail the test here otherwise.
-- opts.deadline (ms) bounds the run (uv.stop(): am.run then says what
-- still waits); opts.allow_active skips the handle check.
function helpers.run(body, opts)
  opts = opts or {}
  stray = {}
  local am = require "async_mutex"
  local restore_handler = install_error_handler()
  uv.update_time()      -- timers started before uv.run() count from now
  local timed_out = false
  local deadline = own_handle(uv.new_timer())
  local deadline_ms = (opts.deadline or helpers.DEFAULT_DEADLINE) * helpers.TIME_SCALE
  deadline:start(deadline_ms, 0, function()
    timed_out = true
    uv.stop()
  end)
  deadline:unref()                       -- do not keep uv.run() alive by itself
  local untrack = track_clients()
  local result = table.pack(pcall(am.run, { unjoined = "report" }, body))
  local made = untrack()
  local left = active_handles(deadline)
  deadline:close()
  uv.run("nowait")                       -- let the close complete
  if timed_out or not result[1] then close_clients(made) end
  restore_handler()
  local failures = stray
  stray = {}                      -- (not seen by a later test's h.wait_until)
  if timed_out then
    error(("deadline of %d ms passed: %s"):format(deadline_ms,
      result[1] and "the body finished, the loop did not" or tostring(result[2])), 0)
  end
  if not result[1] then error(result[2], 0) end
  if #failures > 0 then
    error("error outside the body: " .. table.concat(failures, "\n---\n"), 0)
  end
  if not opts.allow_active and #left > 0 then
    error("handles left active after the body: " .. table.concat(left, ", "), 0)
  end
  return table.unpack(result, 2, result.n)
end

--- Wraps a spec body for `it(...)`.
function helpers.async(body, opts)
  return function() return helpers.run(body, opts) end
end

local SLEEP_TOKEN = setmetatable({}, { __name = "helpers.sleep token" })

--- The body of an `it` on a new lock that the case must leave free:
-- h.left_free(new, ..., fn) makes lock = new(...) and runs fn(lock) as
-- h.async runs a body, then checks that fn left no hold on the lock
-- (not lock:isLocked()), or, for a keyed lock, no key in use
-- (lock:count() == 0).
--   it("...", h.left_free(am.KeyedSemaphore.new, 2, function(ks) ... end))
function helpers.left_free(new, ...)
  local args = table.pack(...)
  local fn = args[args.n]
  return helpers.async(function()
    local lock = new(table.unpack(args, 1, args.n - 1))
    fn(lock)
    local assert = require "luassert"
    if lock.keys then assert.equal(0, lock:count()) else assert.is_false(lock:isLocked()) end
  end)
end

--- The body of an `it` on a new lock held by the test (h.held) until the
-- case ends: h.holding(new, fn) makes lock = new(), acquires it, runs
-- fn(lock, release) as h.async runs a body, then releases it.
--   it("...", h.holding(am.Mutex.new, function(m, r) ... end))
function helpers.holding(new, fn)
  return helpers.async(function()
    local lock, release = helpers.held(new())
    fn(lock, release)
    release()
  end)
end

--- Suspends the running coroutine for `ms` milliseconds of loop time.
-- Fails if anything other than its own timer resumes the coroutine (the
-- module must only resume coroutines it suspended itself).
function helpers.sleep(ms)
  local co = coroutine.running()
  local done = false
  local t = own_handle(uv.new_timer())
  t:start(ms, 0, function()
    t:close()
    if done or coroutine.status(co) ~= "suspended" then
      record(("h.sleep: timer fired but the sleeping coroutine is %s%s"):format(
        coroutine.status(co), done and " and was woken by something else" or ""))
      return
    end
    local ok, err = coroutine.resume(co, SLEEP_TOKEN)
    if not ok then record(debug.traceback(co, err)) end
  end)
  local token = coroutine.yield()
  done = true
  if token ~= SLEEP_TOKEN then
    error("h.sleep: the coroutine was resumed by something other than its timer", 2)
  end
end

--- Suspends the running coroutine until the loop has completed one more turn:
-- everything the module deferred to its idle handle before this call has been
-- resumed by then, wherever this is called from (main code, a timer callback
-- or the module's idle callback).  tick(n) does it n times.
--
-- How: a 0 ms timer first (it runs in this turn's timer phase when called from
-- a timer callback, otherwise in the next turn's), then a check handle, which
-- runs after that turn's idle phase; an idle handle of ours keeps the poll phase
-- from blocking in between.
function helpers.tick(n)
  for _ = 1, n or 1 do
    local co = coroutine.running()
    local t = own_handle(uv.new_timer())
    local resumed = false
    t:start(0, 0, function()
      t:close()
      local idle = own_handle(uv.new_idle())
      local check = own_handle(uv.new_check())
      idle:start(function() end)
      check:start(function()
        idle:close(); check:close()
        if resumed or coroutine.status(co) ~= "suspended" then
          record("h.tick: the ticking coroutine was woken by something else")
          return
        end
        resumed = true
        local ok, err = coroutine.resume(co, SLEEP_TOKEN)
        if not ok then record(debug.traceback(co, err)) end
      end)
    end)
    local token = coroutine.yield()
    if token ~= SLEEP_TOKEN then
      resumed = true
      error("h.tick: the coroutine was resumed by something other than its timer", 2)
    end
  end
end

--- Ticks until pred() is true; fails after `ms` (default 2000) milliseconds,
-- or at once, with their errors, when coroutines of the test have failed
-- meanwhile (h.spawn, or resumed by the module): the condition usually
-- waits for them, and would hide their error behind the whole wait.
local function failed_meanwhile(what)
  if #stray > 0 then
    error("h.wait_until" .. (what and (" (" .. what .. ")") or "")
      .. ": a coroutine of the test failed: " .. table.concat(stray, "\n---\n"), 3)
  end
end

function helpers.wait_until(pred, ms, what)
  if pred() then return end
  helpers.tick()
  ms = (ms or 2000) * helpers.TIME_SCALE
  local limit = uv.now() + ms
  while not pred() do
    failed_meanwhile(what)
    if uv.now() > limit then
      error("h.wait_until: condition still false after " .. ms
        .. " ms" .. (what and (": " .. what) or ""), 2)
    end
    helpers.sleep(1)
  end
end

--- Starts `fn(...)` in a new coroutine right now (on the current thread's
-- behalf) and returns the coroutine.  An error raised before its first yield
-- is raised here; a later one is recorded and fails the test.
function helpers.spawn(fn, ...)
  local early, failed = true, nil
  local co = coroutine.create(function(...)
    local ok, err = xpcall(fn, debug.traceback, ...)
    if not ok then
      if early then failed = err else record("spawned coroutine: " .. tostring(err)) end
    end
  end)
  local ok, err = coroutine.resume(co, ...)
  early = false
  if not ok then error(debug.traceback(co, err), 0) end
  if failed then error(failed, 0) end
  return co
end

--- The end of the message of a call that would wait where the coroutine
-- cannot yield (docs/semantics.md): "attempt to <act>" .. this.
helpers.CANNOT_YIELD = " where the coroutine cannot yield (inside a metamethod or a function"
  .. " called from C, such as a table.sort comparator)"

--- The error of fn() called from a string.gsub callback (a C function: the
-- running coroutine cannot yield there), without "file:line: ".
function helpers.cannot_yield_error(fn)
  local err
  ("x"):gsub(".", function() err = helpers.error_of(fn) end)
  return err
end

--- Spawns a coroutine that calls lock:acquire(...) under pcall and returns a
-- record of it: w.co, w.done (acquire returned or raised), w.ok, w.err,
-- w.value (semaphores), w.release (the releaser), w.n (number of results).
-- If `log` is given, `name` is appended to it when the acquire returns.
function helpers.acquirer(log, name, lock, ...)
  local w = { name = name, done = false }
  local args = table.pack(...)
  w.co = helpers.spawn(function()
    local res = table.pack(pcall(lock.acquire, lock, table.unpack(args, 1, args.n)))
    w.done, w.ok, w.n = true, res[1], res.n - 1
    if res[1] then
      if type(res[2]) == "number" then
        w.value, w.release = res[2], res[3]
      else
        w.release = res[2]
      end
    else
      w.err = res[2]
    end
    if log then log[#log + 1] = name end
    if w.after then w.after(w) end
  end)
  return w
end

--- Spawns a coroutine that calls lock[method](lock, ...) under pcall and
-- returns a record of it, as acquirer does for acquire: r.co, r.done, r.ok,
-- r.err, r.release; `log` gets `name` when the call returns.
function helpers.requester(method, log, name, lock, ...)
  local r = { name = name, done = false }
  local args = table.pack(...)
  r.co = helpers.spawn(function()
    local ok, res = pcall(lock[method], lock, table.unpack(args, 1, args.n))
    r.done, r.ok = true, ok
    if ok then r.release = res else r.err = res end
    if log then log[#log + 1] = name end
    if r.after then r.after(r) end
  end)
  return r
end

--- Like acquirer, for lock:waitForUnlock(...); also records w.locked_then,
-- whether the lock (on a keyed lock: the key, the first argument) was locked
-- when waitForUnlock returned.
function helpers.waiter(log, name, lock, ...)
  local w = { name = name, done = false }
  local args = table.pack(...)
  local keyed = lock.keys ~= nil              -- keyed locks have keys()
  w.co = helpers.spawn(function()
    local res = table.pack(pcall(lock.waitForUnlock, lock,
      table.unpack(args, 1, args.n)))
    w.done, w.ok, w.err = true, res[1], (not res[1]) and res[2] or nil
    if keyed then w.locked_then = lock:isLocked(args[1])
    else w.locked_then = lock:isLocked() end
    if log then log[#log + 1] = name end
    if w.after then w.after(w) end
  end)
  return w
end

--- A new Mutex, held, released while `a` waits (h.acquirer): the release
-- hands it to `a` at once (docs/semantics.md, Dispatch), so a tryAcquire
-- right after is refused with E_ALREADY_LOCKED.  Returns the mutex, its
-- tryAcquire form and `a`, once a's wake-up was delivered.
function helpers.handed_on_refuses_try()
  local am = require "async_mutex"
  local m, r = helpers.held(am.Mutex.new())
  local a = helpers.acquirer(nil, "a", m)
  r()
  local ta = am.tryAcquire(m)
  require("luassert").same({ false, am.E_ALREADY_LOCKED }, { pcall(ta.acquire, ta) })
  helpers.tick()
  return m, ta, a
end

--- No barging (docs/semantics.md, Dispatch): `lock` (a Mutex, or a keyed
-- lock with `...` its key) held, released while `a` waits: a newcomer `b`
-- of priority 100 queues behind a, granted only after a's release.
-- `after_release` (if given) runs right after the release.
function helpers.newcomer_behind_waiter(lock, after_release, ...)
  local assert = require "luassert"
  local log, key = {}, table.pack(...)
  local r = lock:acquire(...)
  local a = helpers.acquirer(log, "a", lock, ...)
  r()
  if after_release then after_release() end
  local b = helpers.acquirer(log, "b", lock, table.unpack(key, 1, key.n), 100)
  assert.is_false(b.done)
  helpers.granted_in_turn(log, a, b)
end

--- Checks that `first` then `second` (records of h.acquirer, h.reader,
-- ...) are served one at a time, in that order: after a loop turn first
-- is granted and second still waits; once first releases, second is
-- granted, and releases.
function helpers.served_in_turn(first, second)
  local assert = require "luassert"
  helpers.tick()
  assert.is_true(first.ok)
  assert.is_false(second.done)
  first.release()
  helpers.tick()
  assert.is_true(second.ok)
  second.release()
end

--- The same, seen in `log`: `first` then `second` (records of h.acquirer, h.reader,
-- ...: their names go to `log`, empty until then) are granted one at a
-- time, in that order: after a loop turn only first is; once first
-- releases, second is, and releases.
function helpers.granted_in_turn(log, first, second)
  local assert = require "luassert"
  helpers.tick()
  assert.same({ first.name }, log)
  first.release()
  helpers.tick()
  assert.same({ first.name, second.name }, log)
  second.release()
end

--- A runExclusive waiter on `lock` (held by the caller), canceled
-- (lock:cancel(), then a loop turn): returns its pcall's results, packed
-- in a table (nil if it has not ended), and whether its function ran.
function helpers.cancel_exclusive_waiter(lock)
  local called, got = false, nil
  helpers.spawn(function()
    got = { pcall(lock.runExclusive, lock, function() called = true end) }
  end)
  lock:cancel()
  helpers.tick()
  return got, called
end

--- An acquirer (see helpers.acquirer) that releases as soon as it is
-- granted: a link in a chain of hand-offs, logging its name.
function helpers.chain(log, name, lock, ...)
  local w = helpers.acquirer(log, name, lock, ...)
  w.after = function(x) if x.ok then x.release() end end
  return w
end

--- The set-up of most cases: `lock`, new and free, held by the running
-- test (lock:acquire(), or lock[method](...) such as an RWLock's
-- "acquireRead", a keyed lock's "acquire" with its key).  Returns lock
-- and the releaser.
function helpers.held(lock, method, ...)
  return lock, lock[method or "acquire"](lock, ...)
end

--- Holds `lock` from a coroutine of its own, so that main code (which cannot
-- wait) can hold a lock and release it later: acquires now, with `...` as
-- the acquire's arguments (the lock must be free), and returns a function
-- that releases it, from wherever it is called (the release runs in the
-- holder's coroutine, which then ends).
function helpers.holder(lock, ...)
  local HELD = {}
  local co = coroutine.create(function(...)
    local a, b = lock:acquire(...)
    coroutine.yield(HELD)
    ;(b or a)()                 -- a Semaphore returns value, releaser
  end)
  local ok, res = coroutine.resume(co, ...)
  if not ok then error(res, 2) end
  if res ~= HELD then error("h.holder: the lock is not free", 2) end
  return function()
    local done, err = coroutine.resume(co)
    if not done then error(err, 2) end
  end
end

--- Requesters (helpers.requester) of a readers-writer lock's read and
-- write holds: reader(log, name, lock, ...) calls lock:acquireRead(...).
function helpers.reader(...) return helpers.requester("acquireRead", ...) end
function helpers.writer(...) return helpers.requester("acquireWrite", ...) end

--- Counts before each test the coroutines queued for good (am.pending():
-- what earlier files left waiting); returns a function that asserts the
-- test has left no more.
function helpers.pending_baseline(before_each)
  local am = require "async_mutex"
  local base
  before_each(function() base = am.pending() end)
  return function() require("luassert").equal(base, am.pending()) end
end

--- Checks that a lock has one owner at a time: `holder` and `waiter` are
-- helpers.acquirer records on `lock`; the holder has it and the waiter
-- waits; once the holder releases, the waiter has it on the next loop turn;
-- once the waiter releases, the lock is free.
function helpers.check_one_owner(lock, holder, waiter)
  local function check(cond, msg) if not cond then error(msg, 3) end end
  check(holder.done, "the first acquirer does not hold the lock")
  check(not waiter.done, "two coroutines hold the lock at once")
  holder.release()
  helpers.tick()
  check(waiter.done, "the lock did not pass to the waiter when its holder released it")
  waiter.release()
  check(not lock:isLocked(), "the lock is still locked after its last owner released it")
end

--- Counts how many coroutines are inside a critical section at once, per
-- key (nil: the one section), each counting for `weight` (default 1):
--   local inside = h.occupancy()
--   inside:enter(key) ... inside:leave(key)     -- around the section
--   inside:most(key)    -- the highest count seen, 0 if never entered
--   inside:now(key)     -- the count right now
-- With `limit`, enter raises as soon as a key's count would pass it.
function helpers.occupancy(limit)
  local NONE = {}
  local now, most = {}, {}
  local o = {}
  function o.enter(_, key, weight)
    if key == nil then key = NONE end
    local n = (now[key] or 0) + (weight or 1)
    now[key] = n                  -- counted even when over: leave() balances it
    if n > (most[key] or 0) then most[key] = n end
    if limit and n > limit then
      error(("h.occupancy: %s inside at once%s, more than %d"):format(
        n, key == NONE and "" or (" for key " .. tostring(key)), limit), 2)
    end
  end
  function o.leave(_, key, weight)
    if key == nil then key = NONE end
    now[key] = (now[key] or 0) - (weight or 1)
  end
  function o.most(_, key) return most[key == nil and NONE or key] or 0 end
  function o.now(_, key) return now[key == nil and NONE or key] or 0 end
  return o
end

--- Calls fn(...) in a fresh coroutine; returns true and fn's results (packed)
-- if it ran to completion without yielding, false if it yielded.
function helpers.without_yield(fn, ...)
  local co = coroutine.create(function(...) return table.pack(fn(...)) end)
  local ok, res = coroutine.resume(co, ...)
  if not ok then error(res, 0) end
  if coroutine.status(co) == "dead" then return true, res end
  return false
end

--- Calls take(i) for i = 1..n, each in a fresh coroutine that must end
-- without yielding (a grant at once: failing otherwise, naming i);
-- returns the list of each call's first result (its releaser).
function helpers.granted_at_once(n, take)
  local rs = {}
  for i = 1, n do
    local completed, res = helpers.without_yield(take, i)
    require("luassert").is_true(completed, "request " .. i .. " yielded")
    rs[i] = res[1]
  end
  return rs
end

--- Like without_yield, with fn called under pcall: returns true and
-- pcall's results (packed: res[1] is pcall's status) if it completed
-- without yielding, false if it yielded.
function helpers.try_now(fn, ...)
  local args = table.pack(...)
  return helpers.without_yield(function() return pcall(fn, table.unpack(args, 1, args.n)) end)
end

--- The keys a keyed lock has in use, as sorted strings ("number:1", "string:a").
function helpers.keys_of(lock)
  local out = {}
  for i, k in ipairs(lock:keys()) do out[i] = type(k) .. ":" .. tostring(k) end
  table.sort(out)
  return out
end

--- Strips one leading "chunk:line: " position from an error message.
function helpers.strip_pos(msg)
  if type(msg) ~= "string" then return msg end
  return (msg:gsub("^[^\n:]+:%d+: ", "", 1))
end

--- Calls fn(...), which must raise; returns the error with any leading
-- position stripped.  Call the API inside `fn` as a statement (not as
-- `return s:acquire(0)`: a tail call loses the function name).
function helpers.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then error("expected an error, but the call succeeded", 2) end
  return helpers.strip_pos(err)
end

--- Checks a usage error's position: case[1] is a function whose body is
-- one call written on the line that defines it, case[2] the exact message
-- it must raise there (at the caller's line, not inside the library).
function helpers.raises_at_caller(case)
  local fn, msg = case[1], case[2]
  local ok, err = pcall(fn)
  assert(not ok, "no error: " .. msg)
  local info = debug.getinfo(fn, "S")
  local expected = ("%s:%d: %s"):format(info.short_src, info.linedefined, msg)
  if err ~= expected then
    error(("wrong error:\nexpected: %s\n  actual: %s"):format(expected, tostring(err)), 2)
  end
end

--- A to-be-closed value that, when its scope ends (also by an error: an
-- assertion that fails), ends each of `...` by its close method, else its
-- stop method (Redis clients, fake servers), ignoring their errors:
--   local _ <close> = h.closing(client, srv)
-- A client or server a failing case left open would keep the loop
-- running in every later case, of its file and of the files after it.
function helpers.closing(...)
  local things = table.pack(...)
  -- (a thing it cannot close is an error here, not a silent no-op at the
  -- end: a list of clients given by mistake closed none of them, and a
  -- failed case's holds then kept the loop running into the next cases)
  for i = 1, things.n do
    local t = things[i]
    if t ~= nil and not (t.close or t.stop) then
      error(("h.closing: argument #%d has no close or stop method"):format(i), 2)
    end
  end
  return setmetatable({}, { __close = function()
    for i = 1, things.n do
      local t = things[i]
      if t ~= nil then
        local f = t.close or t.stop
        pcall(f, t)
      end
    end
  end })
end

--- A TCP server on a free loopback port that accepts every connection and
-- reads from it: on_data(conn, data) gets what it reads (data nil at the
-- end of the stream); by default it reads and never answers.  Returns the
-- port and a function that closes the server and its connections.
function helpers.tcp_server(on_data)
  on_data = on_data or function() end
  local listener = uv.new_tcp()
  assert(listener:bind("127.0.0.1", 0))
  local conns = {}
  assert(listener:listen(16, function()
    local conn = uv.new_tcp()
    listener:accept(conn)
    conns[#conns + 1] = conn
    conn:read_start(function(_, data) on_data(conn, data) end)
  end))
  return listener:getsockname().port, function()      -- (again: nothing)
    for _, conn in ipairs(conns) do if not conn:is_closing() then conn:close() end end
    if not listener:is_closing() then listener:close() end
  end
end

--- Full collection, twice (finalizers run in the first, memory freed in the second).
function helpers.gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

--- Milliseconds of real time since t0, a uv.hrtime() reading.
function helpers.ms_since(t0)
  return (uv.hrtime() - t0) / 1e6
end

--- Runs uv.run() from the main thread with a deadline (ms, default 2000).
-- Returns true if the loop ran out of work by itself, and the elapsed ms.
function helpers.run_loop(ms)
  uv.update_time()
  local stopped = false
  local t0 = uv.hrtime()
  local deadline = own_handle(uv.new_timer())
  deadline:start((ms or 2000) * helpers.TIME_SCALE, 0, function()
    stopped = true
    uv.stop()
  end)
  deadline:unref()
  uv.run()
  deadline:close()
  uv.run("nowait")
  return not stopped, (uv.hrtime() - t0) / 1e6
end

local function shquote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
helpers.shquote = shquote

--- Runs a shell command; returns its exit code and its output (stdout and
-- stderr together).  Not under the sanitizer runtime `make asan` preloads:
-- its leak checker would fail the tools.
function helpers.sh(command)
  local p = assert(io.popen("(unset LD_PRELOAD; " .. command .. ") 2>&1", "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

--- The same, failing on a non-zero exit code; returns the output.
function helpers.must(command)
  local code, out = helpers.sh(command)
  assert(code == 0, ("`%s` failed (%s):\n%s"):format(command, tostring(code), out))
  return out
end

--- Runs Lua code in a separate `lua5.4` process that finds the module the way
-- this one does (LUA_PATH / LUA_CPATH from package.path / package.cpath).
-- 'prefix' (optional) is put before lua5.4 in the command (a checker such
-- as valgrind).  Returns { rc = exit code, stdout = ..., stderr = ... }.
function helpers.subprocess(code, timeout_s, prefix)
  local script = os.tmpname()
  local errfile = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local cmd = ("env -u LUA_PATH_5_4 -u LUA_CPATH_5_4 -u LUA_INIT "
    .. "LUA_PATH=%s LUA_CPATH=%s timeout -s KILL %d %s lua5.4 %s 2>%s"):format(
    shquote(package.path), shquote(package.cpath), timeout_s or 30,
    prefix or "", shquote(script), shquote(errfile))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local _, how, rc = p:close()
  local ef = io.open(errfile, "r")
  local err = ef and ef:read("a") or ""
  if ef then ef:close() end
  os.remove(script)
  os.remove(errfile)
  return { rc = rc, how = how, stdout = out, stderr = err }
end

--- The check of a child (helpers.subprocess) that must end cleanly:
-- nothing on stderr, exit code 0, and its stdout `stdout` when given.
-- Returns its stdout.
function helpers.clean_exit(res, stdout)
  local assert = require "luassert"
  assert.equal("", res.stderr)
  assert.equal(0, res.rc, "exit status " .. tostring(res.rc) .. " (" .. tostring(res.how) .. ")")
  if stdout ~= nil then assert.equal(stdout, res.stdout) end
  return res.stdout
end

--- Runs the re-entrancy fuzzer `script` (spec/fuzz/..., its "run SEED N"
-- mode) in a child lua5.4 (helpers.subprocess) and checks its report:
-- nothing on stderr, exit 0, "OK <N> sequences <ops> ops <calls>
-- re-entrant calls" with N sequences.  Returns ops and calls.
function helpers.reentrancy_fuzzer(script, seed, n, timeout_s)
  local assert = require "luassert"
  local res = helpers.subprocess(([[
    arg = { [0] = %q, "run", "%d", "%d" }
    dofile(arg[0])
  ]]):format(script, seed, n), timeout_s)
  assert.equal("", res.stderr)
  local seqs, ops, calls = res.stdout:match("^OK (%d+) sequences (%d+) ops (%d+) re%-entrant calls\n$")
  assert.is_not_nil(seqs, res.stdout)
  assert.equal(0, res.rc)
  assert.equal(n, tonumber(seqs))
  return tonumber(ops), tonumber(calls)
end

--- helpers.subprocess for a child that uses the module: `code` runs
-- with `uv` (luv) and `am` (async_mutex) required on its first line.
function helpers.am_subprocess(code, timeout_s, prefix)
  return helpers.subprocess('local uv, am = require "luv", require "async_mutex"; ' .. code,
    timeout_s, prefix)
end

--- The instructions a child (helpers.subprocess) running `code` executes,
-- callgrind's "Collected" count; the child must print "ok\n" and nothing
-- else.  For the cost specs' ratios (measured in one run: docs name no
-- timed unit test).
function helpers.instructions(code, timeout_s)
  local res = helpers.subprocess(code, timeout_s,
    "valgrind --tool=callgrind --callgrind-out-file=/dev/null")
  require("luassert").equal("ok\n", res.stdout, res.stderr)
  local count = res.stderr:match("Collected : (%d+)")
  assert(count, "no count from callgrind: " .. res.stderr)
  return tonumber(count)
end

--- Lua source for a child process (needs `uv` in scope): active(), how
-- many handles are active (uv.run() would not return).  Shared by the
-- re-entry prelude below and spec 101's.
helpers.CHILD_ACTIVE = [[
local function active()
  local n = 0
  uv.walk(function(hd) if hd:is_active() and not hd:is_closing() then n = n + 1 end end)
  return n
end
]]

-- The prelude of a re-entry case (reentry_child): the module, luv, and
-- the tools the cases of specs 35, 38 and 39 call back with.
local REENTRY_PRELUDE = [[
local am = require "async_mutex"
local uv = require "luv"
-- a "c" hook on the running coroutine that runs 'action' once, at the
-- first call of 'fn'
local function on_call(fn, action)
  local armed = true
  debug.sethook(function()
    if armed and debug.getinfo(2, "f").func == fn then
      armed = false
      action()
    end
  end, "c")
end
-- a "c" hook on the running coroutine that raises "hook failed" once, at
-- the first call of 'fn'
local function raise_at(fn)
  debug.sethook(function()
    if debug.getinfo(2, "f").func == fn then
      debug.sethook()
      error("hook failed", 0)
    end
  end, "c")
end
-- uv.walk closing every handle (the module's among them)
local function close_all()
  uv.walk(function(hd) if not hd:is_closing() then hd:close() end end)
end
]] .. helpers.CHILD_ACTIVE

--- Runs a re-entry case (docs/semantics.md, Re-entry): 'body' (Lua
-- source) in a child lua5.4 after a prelude that defines am, uv,
-- on_call(fn, action), raise_at(fn), close_all() and active(), with a
-- time limit (default 20 s), so that a crash or a hang fails the test
-- instead of the suite.  Fails on any stderr output or exit code but 0;
-- returns the child's stdout.
function helpers.reentry_child(body, timeout_s)
  local res = helpers.subprocess(REENTRY_PRELUDE .. body, timeout_s or 20)
  if res.stderr ~= "" or res.rc ~= 0 then
    error(("the child hung or crashed (exit %s, %s), stderr:\n%s"):format(
      tostring(res.rc), tostring(res.how), res.stderr), 2)
  end
  return res.stdout
end

--- Runs Lua code in a child under a memory checker: the child is under
-- AddressSanitizer already when this run is (`make asan` preloads it, and
-- LeakSanitizer fails a leak), else it runs under valgrind's memcheck (a
-- read of freed memory or a definite leak fails it).  Fails on any stderr
-- output or exit code but 0; returns the child's stdout.
function helpers.memcheck_child(code, timeout_s)
  local prefix = nil
  if not (os.getenv("LD_PRELOAD") or ""):find("asan") then
    prefix = "valgrind --quiet --error-exitcode=99 --leak-check=full"
      .. " --errors-for-leak-kinds=definite"
  end
  local res = helpers.subprocess(code, timeout_s, prefix)
  if res.stderr ~= "" or res.rc ~= 0 then
    error(("the child failed (exit %s), stderr:\n%s"):format(tostring(res.rc), res.stderr), 2)
  end
  return res.stdout
end

--- The whole content of a text file.
function helpers.read_file(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  return s
end

return helpers
