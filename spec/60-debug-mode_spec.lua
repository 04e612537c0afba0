-- Debug mode: on and off, owner records (holds), the report, names, and
-- usage errors of every function of am.debug (docs/debug.md).
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

local THIS = "spec/60%-debug%-mode_spec.lua"

local dr = require "debug_reports"
local line = dr.line
local function enable(opts) return dr.enable(opts) end

after_each(function() am.debug.disable() end)

describe("am.debug on and off", function()
  it("is off by default: nothing is recorded", h.async(function()
    assert.is_false(am.debug.isEnabled())
    local m = am.Mutex.new()
    local r = m:acquire()
    assert.same({}, am.debug.holds())
    assert.matches("debug mode off", am.debug.report())
    r()
  end))

  it("enable() turns it on, disable() off, and disable drops every record", h.async(function()
    enable()
    assert.is_true(am.debug.isEnabled())
    local m = am.Mutex.new()
    local r = m:acquire()
    assert.equal(1, #am.debug.holds())
    am.debug.disable()
    assert.is_false(am.debug.isEnabled())
    assert.same({}, am.debug.holds())
    r()
    enable()
    assert.same({}, am.debug.holds())
  end))

  it("a hold granted while off has no record once on", h.async(function()
    local m = am.Mutex.new()
    local r = m:acquire()
    enable()
    assert.same({}, am.debug.holds())
    r()
    assert.same({}, am.debug.holds())
  end))

  it("ASYNC_MUTEX_DEBUG=1 turns it on when the module is required; 0 or unset does not", function()
    local code = [[
      local am = require "async_mutex"
      io.write(tostring(am.debug.isEnabled()))
    ]]
    local function run(env)
      local path = os.tmpname()
      local f = assert(io.open(path, "w")); f:write(code); f:close()
      local p = assert(io.popen(("%s LUA_PATH=%q LUA_CPATH=%q lua5.4 %s"):format(
        env, package.path, package.cpath, path)))
      local out = p:read("a")
      p:close()
      os.remove(path)
      return out
    end
    assert.equal("true", run("env ASYNC_MUTEX_DEBUG=1"))
    assert.equal("false", run("env ASYNC_MUTEX_DEBUG=0"))
    assert.equal("false", run("env -u ASYNC_MUTEX_DEBUG"))
  end)

  it("exports E_DEADLOCK, an exact string like the other errors", function()
    assert.equal("deadlock: the request would wait for ever", am.E_DEADLOCK)
  end)
end)

describe("am.debug.holds", function()
  before_each(function() enable() end)

  it("records a Mutex's holder, since (loop time), where, waiters", h.async(function()
    local m = am.Mutex.new()
    local co = coroutine.running()
    local t0 = uv.hrtime() / 1e6              -- the loop's clock (uv.now()'s), in ms
    local r = m:acquire(); local at = line()
    local t1 = uv.hrtime() / 1e6
    local w = h.acquirer(nil, "w", m)
    local list = am.debug.holds()
    assert.equal(1, #list)
    local v = list[1]
    assert.equal(m, v.lock)
    assert.equal("Mutex", v.kind)
    assert.is_nil(v.key)
    assert.equal(co, v.holder)
    assert.is_true(t0 - 1 <= v.since and v.since <= t1 + 1)
    assert.matches(THIS .. ":" .. at .. "$", v.where)
    assert.equal(v.where, v.site)
    assert.equal(1, v.waiters)
    r()
    h.tick()
    assert.is_true(w.ok)
    list = am.debug.holds()
    assert.equal(1, #list)
    assert.equal(w.co, list[1].holder)        -- recorded when delivered
    w.release()
    assert.same({}, am.debug.holds())
  end))

  it("with options.traceback, where is the traceback at the acquire", h.async(function()
    am.debug.enable({ traceback = true, onReport = function() end })
    local m = am.Mutex.new()
    local r = m:acquire(); local at = line()
    local v = am.debug.holds()[1]
    assert.matches("^stack traceback:", v.where)
    assert.matches(THIS .. ":" .. at .. ":", v.where)
    assert.matches(THIS .. ":" .. at .. "$", v.site)
    r()
  end))

  it("an unscoped release ends the record", h.async(function()
    local m = am.Mutex.new()
    local _ = m:acquire()
    m:release()
    assert.same({}, am.debug.holds())
    local k = am.KeyedMutex.new()
    local _ = k:acquire("a")
    k:release("a")
    assert.same({}, am.debug.holds())
    local rw = am.RWLock.new()
    local _ = rw:acquireWrite()
    rw:release()
    assert.same({}, am.debug.holds())
  end))

  it("records each Semaphore grant with its weight", h.async(function()
    local s = am.Semaphore.new(5)
    local _, r1 = s:acquire(2)
    local b = h.acquirer(nil, "b", s, 3)
    local list = am.debug.holds()
    assert.equal(2, #list)
    local weights = { list[1].weight, list[2].weight }
    table.sort(weights)
    assert.same({ 2, 3 }, weights)
    assert.equal("Semaphore", list[1].kind)
    r1()
    b.release()
    assert.same({}, am.debug.holds())
  end))

  it("records a key of a keyed lock as the set and the key", h.async(function()
    local k = am.KeyedMutex.new()
    local r = k:acquire("acct-7")
    local v = am.debug.holds()[1]
    assert.equal(k, v.lock)
    assert.equal("KeyedMutex", v.kind)
    assert.equal("acct-7", v.key)
    assert.equal(1, #am.debug.holds(k))
    r()
    local ks = am.KeyedSemaphore.new(2)
    local _, r2 = ks:acquire(1, 2)
    v = am.debug.holds()[1]
    assert.same({ ks, "KeyedSemaphore", 1, 2 }, { v.lock, v.kind, v.key, v.weight })
    r2()
  end))

  it("records a KeyedRWLock key's holds with the key and the mode", h.async(function()
    local k = am.KeyedRWLock.new()
    local r1 = k:acquireRead("doc")
    local w = k:acquireWrite("other")
    local list = am.debug.holds(k)
    assert.equal(2, #list)
    table.sort(list, function(a, b) return tostring(a.key) < tostring(b.key) end)
    assert.same({ "KeyedRWLock", "doc", "read" }, { list[1].kind, list[1].key, list[1].mode })
    assert.same({ "KeyedRWLock", "other", "write" }, { list[2].kind, list[2].key, list[2].mode })
    k:release("other")                        -- unscoped: ends the write
    assert.equal(1, #am.debug.holds())
    r1()
    w()                                       -- (a no-op now)
    assert.same({}, am.debug.holds())
  end))

  it("records RWLock holds with their mode, and a downgrade as a read", h.async(function()
    local rw = am.RWLock.new()
    local r1 = rw:acquireRead()
    local r2 = rw:acquireRead()
    local list = am.debug.holds()
    assert.same({ "read", "read" }, { list[1].mode, list[2].mode })
    r1(); r2()
    local w = rw:acquireWrite()
    assert.equal("write", am.debug.holds()[1].mode)
    local rd = w:downgrade()
    list = am.debug.holds()
    assert.equal(1, #list)
    assert.equal("read", list[1].mode)
    rd()
    assert.same({}, am.debug.holds())
  end))

  it("records each level of a ReentrantMutex", h.async(function()
    local m = am.ReentrantMutex.new()
    local r1 = m:acquire()
    local r2 = m:acquire()
    assert.equal(2, #am.debug.holds())
    r2()
    assert.equal(1, #am.debug.holds())
    r1()
    assert.same({}, am.debug.holds())
  end))

  it("records a leased hold, and drops it when the lease runs out", h.async(function()
    local m = am.Mutex.new()
    local r = am.withLease(m, 5):acquire()
    assert.equal(1, #am.debug.holds())
    h.sleep(20)
    assert.is_false(pcall(r.check, r))        -- lost
    assert.is_false(m:isLocked())
    assert.same({}, am.debug.holds())
    local r2 = am.withLease(m, 1000):acquire()
    r2()
    assert.same({}, am.debug.holds())
  end))

  it("records runExclusive's hold at the user's call, not in the module", h.async(function()
    local m = am.Mutex.new()
    local seen
    m:runExclusive(function() seen = am.debug.holds()[1] end); local at = line()
    assert.matches(THIS .. ":" .. at .. "$", seen.site)
    assert.same({}, am.debug.holds())
  end))

  it("filters by lock, a decorated lock standing for its lock", h.async(function()
    local a, b = am.Mutex.new(), am.Mutex.new()
    local ra, rb = a:acquire(), b:acquire()
    assert.equal(a, am.debug.holds(am.withTimeout(a, 10))[1].lock)
    assert.equal(1, #am.debug.holds(b))
    ra(); rb()
  end))

  it("a holder closed with its releaser to-be-closed leaves no record", h.left_free(am.Mutex.new, function(m)
    local co = coroutine.create(function()
      local r <close> = m:acquire()
      coroutine.yield()
    end)
    coroutine.resume(co)
    assert.equal(1, #am.debug.holds())
    coroutine.close(co)
    assert.same({}, am.debug.holds())
  end))

  it("a holder closed without releasing stays recorded, as dead (the forgotten release)", h.async(function()
    local m = am.Mutex.new()
    local co = coroutine.create(function()
      local _ = m:acquire()
      coroutine.yield()
    end)
    coroutine.resume(co)
    coroutine.close(co)
    local v = am.debug.holds()[1]
    assert.equal(co, v.holder)
    assert.matches("%(dead%)", am.debug.report())
    m:release()
    assert.same({}, am.debug.holds())
  end))
end)

describe("am.debug.report", function()
  before_each(function() enable() end)

  it("names each held lock, for how long, its holder's traceback, the acquire site, the waiters", h.async(function()
    local m = am.debug.name(am.Mutex.new(), "accounts")
    local holder_co, sleep_at
    local function hold_and_sleep()
      local r = m:acquire()
      sleep_at = line(); h.sleep(30)          -- suspended in a luv timer
      r()
    end
    holder_co = h.spawn(hold_and_sleep)
    local w = h.acquirer(nil, "w", m)
    h.sleep(10)
    local text = am.debug.report()
    assert.matches("1 hold", text)
    assert.matches('Mutex "accounts" held for %d+ ms by ' .. tostring(holder_co):gsub("%p", "%%%0")
      .. " %(suspended%), 1 waiting", text)
    assert.matches("acquired at " .. THIS .. ":%d+", text)
    assert.matches("holder now:", text)
    assert.matches("in %a* ?function 'helpers.sleep'", text)
    assert.matches("holder now:\n    stack traceback:\n.-" .. THIS .. ":" .. sleep_at .. ":", text)
    assert.matches("lockdep: %d+ classes, %d+ edges", text)
    h.wait_until(function() return w.done end)
    w.release()
  end))

  it("names unnamed locks by their creation site", h.async(function()
    local m = am.Mutex.new(); local at = line()
    local r = m:acquire()
    assert.matches("Mutex created at " .. THIS .. ":" .. at, am.debug.report())
    assert.equal("Mutex created at spec/60-debug-mode_spec.lua:" .. at, am.debug.holds()[1].name)
    r()
  end))

  it("names a key by its set's name or creation site and the key", h.async(function()
    local k = am.debug.name(am.KeyedMutex.new(), "orders")
    local r = k:acquire(42)
    assert.matches('KeyedMutex "orders" key 42 held for', am.debug.report())
    r()
  end))

  it("of one lock only when given one", h.async(function()
    local a = am.debug.name(am.Mutex.new(), "a")
    local b = am.debug.name(am.Mutex.new(), "b")
    local ra, rb = a:acquire(), b:acquire()
    local text = am.debug.report(b)
    assert.matches('Mutex "b"', text)
    assert.is_nil(text:find('Mutex "a"', 1, true))
    ra(); rb()
  end))

  it("says so when nothing is held", function()
    enable()
    assert.matches(": 0 holds\nlockdep: 0 classes, 0 edges$", am.debug.report())
  end)
end)

describe("am.debug.name", function()
  it("returns the lock, works while off, and a decorated lock names its lock", h.async(function()
    local m = am.Mutex.new()
    assert.equal(m, am.debug.name(m, "first"))
    local d = am.withTimeout(m, 100)
    assert.equal(d, am.debug.name(d, "second"))
    enable()
    local r = m:acquire()
    assert.equal('Mutex "second"', am.debug.holds()[1].name)
    r()
  end))
end)

describe("am.debug usage errors", function()
  -- Each raises at the caller's line, naming the function and the argument.
  local function err_at(fn)
    local at = debug.getinfo(2, "l").currentline
    local ok, err = pcall(fn)
    assert.is_false(ok)
    assert.matches("^" .. THIS .. ":" .. at .. ": ", err)
    return h.strip_pos(err)
  end

  it("enable", function()
    assert.equal("bad argument #1 to 'enable' (table expected, got number)",
      err_at(function() am.debug.enable(5) end))
    assert.equal("bad argument #1 to 'enable' (holdWarning must be a positive number of ms)",
      err_at(function() am.debug.enable({ holdWarning = -1 }) end))
    assert.equal("bad argument #1 to 'enable' (holdWarning must be a positive number of ms)",
      err_at(function() am.debug.enable({ holdWarning = "10" }) end))
    assert.equal("bad argument #1 to 'enable' (holdWarning must be a positive number of ms)",
      err_at(function() am.debug.enable({ holdWarning = 0 / 0 }) end))
    assert.equal("bad argument #1 to 'enable' (traceback must be a boolean)",
      err_at(function() am.debug.enable({ traceback = 1 }) end))
    assert.equal("bad argument #1 to 'enable' (onReport must be a function)",
      err_at(function() am.debug.enable({ onReport = "stderr" }) end))
    assert.equal("bad argument #1 to 'enable' (unknown option 'tracebak'; did you mean"
      .. " 'traceback'? options: holdWarning, onReport, traceback)",
      err_at(function() am.debug.enable({ tracebak = true }) end))
    assert.equal("bad argument #1 to 'enable' (unknown option '1'; options: holdWarning,"
      .. " onReport, traceback)",
      err_at(function() am.debug.enable({ true }) end))
    assert.is_false(am.debug.isEnabled())     -- nothing changed
  end)

  it("disable and isEnabled take no argument", function()
    assert.equal("bad argument #1 to 'disable' (no argument expected, got boolean)",
      err_at(function() am.debug.disable(true) end))
    assert.equal("bad argument #1 to 'isEnabled' (no argument expected, got table)",
      err_at(function() am.debug.isEnabled({}) end))
  end)

  it("name", function()
    assert.equal("bad argument #1 to 'name' (async_mutex lock expected, got nil)",
      err_at(function() am.debug.name(nil, "x") end))
    assert.equal("bad argument #1 to 'name' (async_mutex lock expected, got table)",
      err_at(function() am.debug.name({}, "x") end))
    assert.equal("bad argument #2 to 'name' (string expected, got number)",
      err_at(function() am.debug.name(am.Mutex.new(), 5) end))
  end)

  it("holds and report", function()
    assert.equal("bad argument #1 to 'holds' (async_mutex lock expected, got string)",
      err_at(function() am.debug.holds("m") end))
    assert.equal("bad argument #1 to 'report' (async_mutex lock expected, got number)",
      err_at(function() am.debug.report(1) end))
  end)
end)
