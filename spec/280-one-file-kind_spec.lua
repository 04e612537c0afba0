-- A lock kind is one file and one line of the kind table
-- (docs/internals.md, "How to add a lock kind"): the core built with
-- spec/toy/toy_kind.c and the Toy's line (AM_EXTRA_KINDS, the kind
-- table's hook for a line from the compiler's command line) has a class
-- Toy whose shared methods (src/core/kinds/lock.c), tostring, decorators
-- and core.kind all work, with no other change.  The Toy runs in a
-- process of its own: its core is another build of the module.

local h = require "helpers"

local ROOT = h.ROOT

-- Runs a shell command (not under the sanitizer runtime `make asan`
-- preloads); returns its output and whether it exited with 0.
local function run(command)
  local code, out = h.sh(command)
  return out, code == 0
end

local LINE = "X(TOY, Toy, am_toy_kind, am_lock_metamethods, am_lock_methods, "
  .. "am_lock_class, am_decorated_methods)"

-- What the Toy's process checks; it prints "ok" at the end.
local SCRIPT = [[
local uv = require "luv"
local core = require "async_mutex.core"
local Toy = assert(core.Toy, "no class Toy")
local t = Toy.new()
assert(core.kind(t) == "Toy", tostring(core.kind(t)))
assert(tostring(t):match("^async_mutex%.Toy %(unlocked, 0 waiting%): "), tostring(t))
local log = {}
local r1
coroutine.wrap(function() r1 = t:acquire(); log[#log + 1] = "first" end)()
coroutine.wrap(function()
  local r2 = t:acquire()
  log[#log + 1] = "second"
  r2()
end)()
assert(t:isLocked())
assert(tostring(t):match("%(locked, 1 waiting%)"), tostring(t))
r1()
uv.run()
assert(table.concat(log, " ") == "first second", table.concat(log, " "))
assert(not t:isLocked())
-- a hold taken by a coroutine of its own: its releaser
local function hold()
  local r
  coroutine.wrap(function() r = t:acquire() end)()
  return assert(r, "not granted at once")
end
-- a decorated Toy: tryAcquire refuses while it is held, withTimeout times out
local r3 = hold()
local tried, timed
coroutine.wrap(function()
  local d = core.tryAcquire(t)
  tried = { pcall(d.acquire, d) }
end)()
assert(tried[1] == false and tried[2] == core.E_ALREADY_LOCKED, tostring(tried[2]))
coroutine.wrap(function()
  local d = core.withTimeout(t, 5)
  timed = { pcall(d.acquire, d) }
end)()
uv.run()
assert(timed[1] == false and timed[2] == core.E_TIMEOUT, tostring(timed[2]))
-- cancel ends a waiter; an unscoped release frees the lock; the spent
-- releaser of an older grant gives nothing back
local canceled
coroutine.wrap(function() canceled = { pcall(t.acquire, t) } end)()
t:cancel()
uv.run()
assert(canceled[1] == false and canceled[2] == core.E_CANCELED, tostring(canceled[2]))
t:release()
assert(not t:isLocked())
local r4 = hold()
r3()
assert(t:isLocked(), "an older grant's releaser freed the lock")
r4()
assert(not t:isLocked())
local bad = { pcall(Toy.methods.acquire, Toy.new, 1) }
assert(not bad[1] and tostring(bad[2]):match("async_mutex%.Toy expected"), tostring(bad[2]))
print("ok")
]]

describe("a lock kind of one file and one line", function()
  it("builds a core with a toy kind whose shared methods, decorators and kind() work", function()
    local tmp = assert(run("mktemp -d")):gsub("%s+$", "")
    local out, ok = run(("mkdir -p '%s/async_mutex' && cd '%s' && cc -Wall -Wextra -Werror -std=c99 "
        .. "-pedantic -O0 -fPIC -shared -I/usr/include/lua5.4 -Isrc/core "
        .. "'-DAM_EXTRA_KINDS(X)=%s' src/core/*/*.c src/error_text.c spec/toy/toy_kind.c "
        .. "-o '%s/async_mutex/core.so'"):format(tmp, ROOT, LINE, tmp))
    assert(ok, out)
    local f = assert(io.open(tmp .. "/check.lua", "w"))
    f:write(SCRIPT)
    f:close()
    out, ok = run(("LUA_CPATH='%s/?.so;;' lua5.4 '%s/check.lua'"):format(tmp, tmp))
    run(("rm -rf '%s'"):format(tmp))
    assert(ok, out)
    assert.equal("ok\n", out)
  end)
end)
