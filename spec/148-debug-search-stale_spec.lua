-- Debug mode's deadlock search runs Lua, and so user code: a count or
-- "c" hook, a finalizer at an allocation (docs/semantics.md, Re-entry).
-- That code may let a member of the deadlock it found in before the
-- request raises (a release, a cancel, a coroutine closed): the request
-- raised E_DEADLOCK though, with the cycle gone, it would be served.  A
-- deadlock now stands only if nothing the search read changed meanwhile
-- (no record made or ended, no waiter come or gone on a lock it read);
-- else the search is made again (docs/debug.md, Deadlocks).  Each case
-- runs in a child process (h.reentry_child: a crash, or anything on
-- stderr, fails the test); a "c" hook acts at the first debug.traceback,
-- as the report is written.
local h = require "helpers"

local function run(body) return h.reentry_child(body, 60) end

-- A holds a and waits for b; this coroutine holds b and requests a: a
-- deadlock, until ACTION lets A in.
local CYCLE = [[
  am.debug.enable({ onReport = function() end })
  local a, b = am.Mutex.new(), am.Mutex.new()
  local ra, outcome, A_err
  local A = coroutine.create(function()
    local r <close> = a:acquire()
    ra = r
    coroutine.yield()
    local ok, rb = pcall(b.acquire, b)
    if ok then rb() else A_err = rb end
  end)
  assert(coroutine.resume(A))
  coroutine.wrap(function()
    local rb = b:acquire()
    assert(coroutine.resume(A))              -- A waits for b
    on_call(debug.traceback, function() ACTION end)
    local ok, r = pcall(a.acquire, a)
    debug.sethook()
    outcome = ok and "granted" or tostring(r)
    rb()
    if ok then r() end
  end)()
  uv.run()
  io.write(outcome, " ", tostring(A_err), " ", am.pending(), " ", #am.debug.holds(), "\n")
]]

local function case(action) return run((CYCLE:gsub("ACTION", action))) end

describe("a deadlock the search found, broken by a hook before the request raises", function()
  it("the member's hold released: the request is granted", function()
    assert.equal("granted nil 0 0\n", case("ra()"))
  end)

  it("the member's wait canceled: the request waits for its release, and is granted", function()
    assert.equal("granted request for lock canceled 0 0\n", case("b:cancel()"))
  end)

  it("the member's coroutine closed (its <close> releases): the request is granted", function()
    assert.equal("granted nil 0 0\n", case("coroutine.close(A)"))
  end)

  it("nothing changed meanwhile: E_DEADLOCK, as before", function()
    assert.equal("deadlock: the request would wait for ever nil 0 0\n", case("local _ = 0"))
  end)
end)
