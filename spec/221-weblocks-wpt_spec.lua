-- The Web Locks API's platform tests (web-platform-tests, web-locks/), ported
-- where our locks have the feature.  The mapping: navigator.locks is a
-- KeyedRWLock, a lock's name its key; request(name, cb) is runExclusive,
-- {mode: 'shared'} runShared, a held lock a releaser; clientId is the
-- coroutine (`owner`), which with debug mode off only a ReentrantMutex
-- records for its holds (docs/semantics.md, Query); query() is
-- keyed:query().  Each `it` names the WPT case it ports.
local h = require "helpers"
local am = require "async_mutex"

after_each(function() am.debug.disable() end)

-- The modes of the entries of `list` (the snapshot of one name).
local function modes(list)
  local out = {}
  for i, e in ipairs(list or {}) do out[i] = e.mode end
  return out
end

local function owners(list)
  local out = {}
  for i, e in ipairs(list or {}) do out[i] = e.owner end
  return out
end

-- A lock request that holds until `release()` is called (a request whose
-- callback returns a promise that does not settle yet).
local function hold(locks, name, mode)
  local r = { done = false }
  r.co = h.spawn(function()
    local run = mode == "shared" and locks.runShared or locks.runExclusive
    r.ok, r.err = pcall(run, locks, name, function()
      r.held = true
      coroutine.yield()
    end)
    r.done = true
  end)
  function r.release() if coroutine.status(r.co) == "suspended" then coroutine.resume(r.co) end end
  return r
end

describe("Web Locks WPT: query-empty.https.any.js", function()
  it("query() returns dictionary with empty arrays when no locks are held", h.async(function()
    local locks = am.KeyedRWLock.new()
    assert.same({}, locks:query())
    assert.same({ held = {}, pending = {} }, locks:query("res"))
  end))
end)

describe("Web Locks WPT: query.https.any.js", function()
  it("query() returns dictionaries with expected properties", h.async(function()
    local locks = am.KeyedRWLock.new()
    local lock1 = locks:acquireWrite("res")
    local lock2 = h.requester("acquireWrite", nil, "lock2", locks, "res")
    -- ifAvailable: refused, the second request still blocked
    assert.equal(am.E_ALREADY_LOCKED, h.error_of(function() am.tryAcquire(locks):acquireWrite("res") end))
    assert.is_false(lock2.done)
    local state = locks:query()
    assert.is_table(state.res.pending)
    assert.equal("exclusive", state.res.pending[1].mode)
    assert.equal(lock2.co, state.res.pending[1].owner)
    assert.is_table(state.res.held)
    assert.equal("exclusive", state.res.held[1].mode)
    lock1(); h.tick(); lock2.release()
  end))

  it("query() reports individual held locks", h.async(function()
    local locks = am.KeyedRWLock.new()
    locks:runExclusive("res", function()
      assert.same({ "exclusive" }, modes(locks:query().res.held))
    end)
    locks:runShared("res", function()
      assert.same({ "shared" }, modes(locks:query().res.held))
    end)
  end))

  it("query() reports multiple held locks", h.async(function()
    local locks = am.KeyedRWLock.new()
    locks:runExclusive("res1", function()
      locks:runShared("res2", function()
        local state = locks:query()
        assert.same({ "exclusive" }, modes(state.res1.held))
        assert.same({ "shared" }, modes(state.res2.held))
      end)
    end)
  end))

  it("query() reports pending and held locks", h.async(function()
    local locks = am.KeyedRWLock.new()
    local lock2
    locks:runExclusive("res", function()
      lock2 = h.requester("acquireWrite", nil, "lock2", locks, "res")
      assert.equal(am.E_ALREADY_LOCKED, h.error_of(function() am.tryAcquire(locks):acquireWrite("res") end))
      assert.is_false(lock2.done)
      local state = locks:query()
      assert.same({ "exclusive" }, modes(state.res.pending))
      assert.same({ "exclusive" }, modes(state.res.held))
    end)
    h.tick(); lock2.release()
  end))

  it("query() reports held shared locks with appropriate count", h.async(function()
    local locks = am.KeyedRWLock.new()
    locks:runShared("res", function()
      locks:runShared("res", function()
        assert.same({ "shared", "shared" }, modes(locks:query().res.held))
      end)
    end)
  end))

  it("query() reports pending shared locks with appropriate count", h.async(function()
    local locks = am.KeyedRWLock.new()
    local lock2, lock3
    locks:runExclusive("res", function()
      lock2 = h.requester("acquireRead", nil, "lock2", locks, "res")
      lock3 = h.requester("acquireRead", nil, "lock3", locks, "res")
      assert.equal(am.E_ALREADY_LOCKED, h.error_of(function() am.tryAcquire(locks):acquireWrite("res") end))
      assert.is_false(lock2.done or lock3.done)
      local state = locks:query()
      assert.same({ "exclusive" }, modes(state.res.held))
      assert.same({ "shared", "shared" }, modes(state.res.pending))
    end)
    h.tick(); lock2.release(); lock3.release()
  end))

  it("query() reports the same clientId for held locks from the same context (debug mode)", h.async(function()
    am.debug.enable({ onReport = function() end })  -- (lockdep: nested keys)
    local locks = am.KeyedRWLock.new()
    locks:runExclusive("res1", function()
      locks:runExclusive("res2", function()
        local state = locks:query()
        assert.equal(1, #state.res1.held)
        assert.equal(1, #state.res2.held)
        assert.same(owners(state.res1.held), owners(state.res2.held))
        assert.equal(coroutine.running(), state.res1.held[1].owner)
      end)
    end)
  end))

  it("query() reports different ids for held locks from different contexts (debug mode)", h.async(function()
    am.debug.enable()
    local locks = am.KeyedRWLock.new()
    local worker = hold(locks, "res", "shared")
    assert.is_true(worker.held)
    locks:runShared("res", function()
      local held = locks:query().res.held
      assert.equal(2, #held)
      assert.are_not.equal(held[1].owner, held[2].owner)
      assert.same({ worker.co, (coroutine.running()) }, owners(held))
    end)
    worker.release()
  end))

  -- (debug mode would refuse the request that closes the cycle, with
  -- E_DEADLOCK, before it waits: a ReentrantMutex per name names its
  -- holder without it)
  it("query() can observe a deadlock (a ReentrantMutex per name)", h.async(function()
    local res1, res2 = am.ReentrantMutex.new(), am.ReentrantMutex.new()
    local worker = h.spawn(function()
      local r1 = res1:acquire()
      coroutine.yield()
      local ok = pcall(res2.acquire, res2)        -- waits: canceled below
      assert.is_false(ok)
      r1()
    end)
    local rel2 = res2:acquire()
    coroutine.resume(worker)                      -- the worker requests res2
    local main = h.acquirer(nil, "main", res1)    -- "here" requests res1
    local q1, q2 = am.query(res1), am.query(res2)
    assert.equal(1, #q1.held); assert.equal(1, #q2.held)
    assert.equal(1, #q1.pending); assert.equal(1, #q2.pending)
    assert.equal(q1.held[1].owner, q2.pending[1].owner)
    assert.equal(q2.held[1].owner, coroutine.running())
    assert.equal(main.co, q1.pending[1].owner)
    res2:cancel(); h.tick()                       -- the worker gives res1 up
    h.wait_until(function() return main.done end)
    main.release(); rel2()
  end))
end)

-- signal.https.any.js: {signal} is am.withSignal(locks, s); an
-- AbortController is the signal itself (s:abort(reason)); AbortError is
-- E_CANCELED, the reason of an abort without one.
describe("Web Locks WPT: signal.https.any.js", function()
  local function request(locks, s, name, fn)
    local r = { done = false }
    r.co = h.spawn(function()
      r.ok, r.err = pcall(am.withSignal(locks, s).runExclusive, am.withSignal(locks, s), name,
        fn or function() r.ran = true end)
      r.done = true
    end)
    return r
  end

  -- A KeyedRWLock whose "res" is held (hold), a signal, and a request with
  -- that signal queued behind the holder: locks, s, holder, r.
  local function request_behind_holder()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local holder = hold(locks, "res")
    return locks, s, holder, request(locks, s, "res")
  end

  it("The signal option must be an AbortSignal", h.async(function()
    local locks = am.KeyedRWLock.new()
    for _, signal in ipairs({ "string", 12.34, false, {}, function() end, coroutine.create(print) }) do
      assert.matches("^bad argument #2 to 'withSignal' %(async_mutex%.Signal expected, got %a+%)$",
        h.error_of(function() am.withSignal(locks, signal) end))
    end
  end))

  it("Passing an already aborted signal aborts", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    s:abort()
    local r = request(locks, s, "res")
    assert.is_true(r.done)                     -- at once: it never queued
    assert.equal(am.E_CANCELED, r.err)
    assert.is_nil(r.ran)
  end))

  it("Passing an already aborted signal rejects with the custom abort reason.", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local reason = "My dog ate it."
    s:abort(reason)
    assert.equal(reason, request(locks, s, "res").err)
  end))

  it("Passing an already aborted signal rejects with the default abort reason.", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    s:abort()
    assert.equal(s.reason, request(locks, s, "res").err)
  end))

  it("An aborted request results in AbortError", h.async(function()
    local locks, s, holder, r = request_behind_holder()
    local state = locks:query()
    assert.equal(1, #state.res.held)
    assert.equal(1, #state.res.pending)
    s:abort()
    h.tick()
    assert.equal(am.E_CANCELED, r.err)
    assert.is_nil(r.ran)
    holder.release()
  end))

  it("Abort after a timeout", h.async(function()
    local locks, s, holder, r = request_behind_holder()
    local state = locks:query()
    assert.equal(1, #state.res.held)
    assert.equal(1, #state.res.pending)
    local callback_called = false
    local t = require("luv").new_timer()
    t:start(10, 0, function() t:close(); callback_called = true; s:abort() end)
    h.wait_until(function() return r.done end)
    assert.is_true(callback_called)
    assert.equal(am.E_CANCELED, r.err)
    holder.release()
  end))

  it("Signal that is not aborted", h.async(function()
    local locks = am.KeyedRWLock.new()
    local r = request(locks, am.signal(), "res")
    assert.is_true(r.ok and r.ran)
  end))

  it("Abort signaled after lock granted", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local released
    local r = request(locks, s, "res", function()
      coroutine.yield()                          -- held until resumed
      return "resolved ok"
    end)
    assert.is_false(r.done)
    s:abort()
    coroutine.resume(r.co)
    assert.is_true(r.ok)
    released = r.err                             -- (pcall's second value)
    assert.equal("resolved ok", released)
  end))

  it("Abort signaled after lock released", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local r = request(locks, s, "res", function() return "resolved ok" end)
    s:abort()
    assert.is_true(r.ok)
    assert.equal("resolved ok", r.err)
  end))

  -- (a request is granted at once when it can be, so the signalled request
  -- waits behind a holder here; it is aborted, and the next one is served)
  it("Abort should process the next pending lock request", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local holder = hold(locks, "res")
    local first = request(locks, s, "res")
    local next_ = request(locks, am.signal(), "res", function() return "resolved" end)
    s:abort()
    holder.release()
    h.wait_until(function() return next_.done end)
    assert.equal(am.E_CANCELED, first.err)
    assert.equal("resolved", next_.err)
  end))

  it("Aborted promise should reject with the custom abort reason", h.async(function()
    local _, s, holder, r = request_behind_holder()
    s:abort("My cat handled it")
    h.tick()
    assert.equal("My cat handled it", r.err)
    holder.release()
  end))

  it("Aborted promise should reject with the default abort reason", h.async(function()
    local _, s, holder, r = request_behind_holder()
    s:abort()
    h.tick()
    assert.equal(s.reason, r.err)
    holder.release()
  end))

  -- the issue's case: one signal passed to many requests aborts them all
  it("one signal aborts every request made with it, on several names", h.async(function()
    local locks, s = am.KeyedRWLock.new(), am.signal()
    local h1, h2 = hold(locks, "res1"), hold(locks, "res2")
    local rs = { request(locks, s, "res1"), request(locks, s, "res1"), request(locks, s, "res2") }
    s:abort("all of them")
    h.tick()
    for _, r in ipairs(rs) do assert.equal("all of them", r.err) end
    assert.same({}, locks:query().res1.pending)
    h1.release(); h2.release()
  end))
end)

-- steal.https.any.js: {steal: true} is locks:steal(name) (a write, the
-- only mode Web Locks steals in), held until its releaser is called; the
-- rejected `released` promise of a broken lock is its holder's
-- runExclusive raising E_LOST (Web Locks' AbortError) once its callback
-- returns.
-- request.https.any.js, its steal cases: the options Web Locks refuses
-- with steal are decorators here (ifAvailable: tryAcquire; signal:
-- withSignal), and a steal through them is refused (a usage error for the
-- NotSupportedError).  "The 'steal' option must be used with exclusive
-- locks" does not map: stealRead is offered (docs/semantics.md, Steal).
describe("Web Locks WPT: request.https.any.js (steal)", function()
  it("The 'steal' and 'ifAvailable' options are mutually exclusive", h.left_free(am.KeyedRWLock.new, function(locks)
    assert.equal("attempt to steal through tryAcquire (a steal takes the lock whoever holds it)",
      h.error_of(function() am.tryAcquire(locks):steal("res") end))
  end))

  it("The 'signal' and 'steal' options are mutually exclusive", h.left_free(am.KeyedRWLock.new, function(locks)
    assert.equal("attempt to steal through withSignal (a steal never waits)",
      h.error_of(function() am.withSignal(locks, am.signal()):steal("res") end))
  end))
end)

describe("Web Locks WPT: steal.https.any.js", function()
  it("Lock available", h.left_free(am.KeyedRWLock.new, function(locks)
    local release = locks:steal("res")
    assert.is_not_nil(release)
    assert.is_true(release())
  end))

  it("Lock not available", h.async(function()
    local locks = am.KeyedRWLock.new()
    local holder = hold(locks, "res")
    assert.is_true(holder.held)
    local release = locks:steal("res")
    assert.is_true(locks:isWriteLocked("res"))
    assert.is_true(release())
    holder.release()
  end))

  it("Broken lock's release promise rejects", h.async(function()
    local locks = am.KeyedRWLock.new()
    local holder = hold(locks, "res")
    locks:steal("res")()
    holder.release()                        -- its callback returns
    assert.is_true(holder.done)
    assert.is_false(holder.ok)
    assert.equal(am.E_LOST, holder.err)
  end))

  it("Requested lock's release promise is deferred", h.async(function()
    local locks = am.KeyedRWLock.new()
    local holder = hold(locks, "res")
    local granted = false
    local req = h.spawn(function()
      locks:runExclusive("res", function() granted = true end)
    end)
    local release = locks:steal("res")
    h.tick(2)
    assert.is_false(granted)                -- the steal went past it
    release()
    h.wait_until(function() return granted end)
    assert.equal("dead", coroutine.status(req))
    holder.release()
  end))

  it("Last caller wins", h.async(function()
    local locks = am.KeyedRWLock.new()
    local holder = hold(locks, "res")
    local first = { }
    first.co = h.spawn(function()
      local release = locks:steal("res")
      coroutine.yield()                     -- holds it (never settles)
      first.ok, first.err = pcall(release.check, release)
    end)
    locks:steal("res")()
    coroutine.resume(first.co)
    assert.is_false(first.ok)               -- the first steal was broken
    assert.equal(am.E_LOST, first.err)
    holder.release()
    assert.equal(am.E_LOST, holder.err)
  end))
end)
