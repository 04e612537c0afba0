-- Runs every script in examples/ as a subprocess, from the repository root,
-- exactly as a user would (`lua5.4 examples/NAME.lua`), and checks its exit
-- status, its key output lines and that it wrote nothing to stderr.

local uv = require "luv"
local h = require "helpers"

local LUA = os.getenv("LUA") or "lua5.4"
local TIME_LIMIT = 10                   -- seconds, for a hung example

local ROOT = h.ROOT

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

--- Runs examples/<name>.lua with the arguments `args` (a string, already
-- quoted); returns exit code, stdout, stderr, milliseconds.
local function run_example(name, args)
  local err_file = os.tmpname()
  local command = ("cd %s && exec timeout %d %s examples/%s.lua %s 2>%s")
    :format(shell_quote(ROOT), TIME_LIMIT, LUA, name, args or "", shell_quote(err_file))
  local started = uv.hrtime()
  local pipe = assert(io.popen(command, "r"))
  local out = pipe:read("a")
  local _, _, code = pipe:close()
  local elapsed = (uv.hrtime() - started) / 1e6
  local f = assert(io.open(err_file, "r"))
  local err = f:read("a")
  f:close()
  os.remove(err_file)
  return code, out, err, elapsed
end

--- Asserts that `out` contains each of `lines` as a whole line, in order
-- (other lines may come in between).
local function assert_lines(out, lines)
  local i = 1
  for line in out:gmatch("([^\n]*)\n") do
    if line == lines[i] then i = i + 1 end
  end
  assert(i > #lines, ("expected the line %q (in this order) in the output:\n%s")
    :format(tostring(lines[i]), out))
end

--- Runs an example and checks that it exits 0, prints `lines` in order,
-- and writes nothing to stderr.  Returns its stdout and run time.
local function check(name, lines)
  local code, out, err, elapsed = run_example(name)
  assert(code == 0, ("examples/%s.lua exited with %s\nstdout:\n%s\nstderr:\n%s")
    :format(name, tostring(code), out, err))
  assert.are.equal("", err)
  assert_lines(out, lines)
  return out, elapsed
end

describe("examples/withdraw.lua", function()
  it("shows the lost update without a lock, the refusal with a Mutex, "
    .. "in well under a second", function()
    local _, elapsed = check("withdraw", {
      "Without a lock:",
      "  withdraw 30: accepted, balance 70",
      "  withdraw 80: accepted, balance 20",
      "  final balance 20: 110 withdrawn from 100, an update was lost",
      "With a Mutex:",
      "  withdraw 30: accepted, balance 70",
      "  withdraw 80: refused, insufficient funds (balance 70)",
    })
    -- (the module slowed down by sanitizers or valgrind takes longer)
    assert(h.SLOW or elapsed < 1000, ("took %.0f ms"):format(elapsed))
  end)
end)

describe("README's \"The problem\"", function()
  it("shows exactly what examples/withdraw.lua prints (`make demo`)", function()
    local section = h.read_file(ROOT .. "/README.md"):match("\n## The problem\n(.-)\n## ")
    assert.is_string(section)
    local shown = {}
    for block in section:gmatch("\n```\n(.-)```\n") do shown[#shown + 1] = block end
    assert.equal(2, #shown)
    local code, out = run_example("withdraw")
    assert.equal(0, code)
    assert.equal(table.concat(shown), out)
  end)
end)

describe("examples/semaphore_jobs.lua", function()
  it("never runs more than three jobs at once and runs them all", function()
    local out = check("semaphore_jobs", {
      "job 1 starts (permits free: 3, running: 1)",
      "job 2 starts (permits free: 2, running: 2)",
      "job 3 starts (permits free: 1, running: 3)",
      "all 8 jobs done, at most 3 ran at once (limit 3)",
    })
    for i = 1, 8 do
      assert_lines(out, { ("job %d done"):format(i) })
    end
    for running in out:gmatch("running: (%d+)%)") do
      assert(tonumber(running) <= 3, out)
    end
  end)
end)

describe("examples/timeout.lua", function()
  it("times out the short wait with E_TIMEOUT and serves the long one", function()
    check("timeout", {
      "slow task: holding the lock for 150 ms",
      "waiting up to 50 ms: gave up (timeout while waiting for mutex to become available)",
      "slow task: released the lock",
      "waiting up to 500 ms: got the lock",
    })
  end)
end)

describe("examples/try_lock.lua", function()
  it("lets one refresh run, skips the others with E_ALREADY_LOCKED", function()
    check("try_lock", {
      "A: refreshing the cache",
      "B: skipped, a refresh is already running (mutex already locked)",
      "C: skipped, a refresh is already running (mutex already locked)",
      "A: cache refreshed",
      "D: refreshing the cache",
      "D: cache refreshed",
    })
  end)
end)

describe("examples/priorities.lua", function()
  it("serves higher priorities first, in arrival order among equals", function()
    check("priorities", {
      "holder: busy for 50 ms while the others queue up",
      "served: user click A (priority 10)",
      "served: user click B (priority 10)",
      "served: report (priority 5)",
      "served: nightly backup (priority 0)",
      "served: cache cleanup (priority -1)",
    })
  end)
end)

describe("examples/cancel.lua", function()
  it("rejects the waiters with E_CANCELED and leaves the holder alone", function()
    local out = check("cancel", {
      "holder: working for 100 ms",
      "shutdown: canceling pending requests",
      "shutdown: still locked by the holder: true",
      "waiter 1: request for lock canceled",
      "waiter 2: request for lock canceled",
      "waiter 3: request for lock canceled",
    })
    -- the holder ends after the shutdown; the waiters' rejections are
    -- printed on the next loop turn, which a process stalled past the
    -- holder's 100 ms (a loaded machine, sanitizers) runs after the
    -- holder's end: cancel() settled them at once either way
    assert_lines(out, {
      "shutdown: canceling pending requests",
      "holder: done, nobody is waiting any more",
    })
    assert.is_nil(out:find("not expected", 1, true))
  end)
end)

describe("examples/wait_for_unlock.lua", function()
  it("resumes every reader after the migration, without locking", function()
    check("wait_for_unlock", {
      "migration: upgrading the schema (holding the lock)",
      "reader 1: waiting for the migration",
      "migration: done",
      "reader 1: reads schema v2 (mutex locked: false)",
      "reader 2: reads schema v2 (mutex locked: false)",
      "reader 3: reads schema v2 (mutex locked: false)",
    })
  end)
end)

describe("examples/close_guard.lua", function()
  it("releases on scope exit, on error, when a task is canceled and when a task dies",
    function()
    check("close_guard", {
      "1. normal exit:",
      "  update written",
      "  after the block, locked: false",
      "2. error:",
      '  caught "disk full" (ok = false), locked: false',
      "3. task canceled while holding the lock:",
      "  suspended with the lock, locked: true",
      "  after stuck:cancel(), locked: false (canceled)",
      "4. error nobody catches, in a task:",
      '  join raised "disk full" (ok = false), locked: false',
    })
  end)
end)

describe("examples/inventory.lua", function()
  it("loses or oversells stock without a lock, never with a KeyedMutex per item, "
    .. "and closes its server", function()
    local out, elapsed = check("inventory", {
      "Without a lock:",
      "With a KeyedMutex per item:",
      "  item locks still in use: 0",
      "server closed",
    })
    assert.matches("^inventory server on 127%.0%.0%.1:%d+\n", out)
    local unlocked = out:match("Without a lock:\n[^\n]*\n([^\n]*)\n")
    assert.is_nil(unlocked:find("nothing lost or oversold", 1, true), unlocked)
    local sold, left = out:match("With a KeyedMutex per item:\n  400 requests: [^\n]*\n"
      .. "  sold (%d+) %+ left (%d+) = 500 units, started with 500: nothing lost or oversold\n")
    assert(sold, out)
    assert.equal(500, tonumber(sold) + tonumber(left))
    assert(h.SLOW or elapsed < 2000, ("took %.0f ms"):format(elapsed))
  end)
end)

describe("examples/redis_orders.lua", function()
  -- (the run against a server: spec/46-redis-processes_spec.lua)
  it("says so in one line and exits 1 when no server is at the address", function()
    local port = require("redis_server").free_port()
    local code, out, err = run_example("redis_orders", "127.0.0.1 " .. port)
    assert.equal(1, code)
    assert.equal("", out)
    assert.equal(("no Redis server at 127.0.0.1:%d\n"):format(port), err)
  end)
end)

describe("examples/optimistic_stock.lua", function()
  -- (the whole sale against a server: spec/49-versioned_spec.lua)
  it("exits 1 when a seller's sales fail (no server at the socket)", function()
    local code, out, err = run_example("optimistic_stock", "sell /nonexistent/redis.sock 1")
    assert.equal(1, code)
    assert.equal("process 1 sold 0 (0 attempts)\n", out)
    assert.matches("redis server unavailable", err, 1, true)
  end)
end)

describe("every example", function()
  -- README: the examples find the module in the checkout they belong to,
  -- wherever they are run from (no LUA_PATH, another directory)
  it("runs from any directory, with no LUA_PATH, and prints what it prints from the root",
    function()
      local from_root = select(2, run_example("withdraw"))
      local pwd = assert(io.popen(("cd %s && pwd"):format(shell_quote(ROOT))))
      local root = pwd:read("l")
      pwd:close()
      for _, dir in ipairs({ "/", root .. "/examples" }) do
        local p = assert(io.popen(("cd %s && env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 "
          .. "-u LUA_CPATH_5_4 timeout %d %s %s/examples/withdraw.lua 2>&1")
          :format(shell_quote(dir), TIME_LIMIT, LUA, shell_quote(root))))
        local out = p:read("a")
        local _, _, code = p:close()
        assert.equal(0, code, out)
        assert.equal(from_root, out)
      end
    end)

  it("finds the module beside itself the same way", function()
    local ls = assert(io.popen(("ls %s/examples/*.lua"):format(shell_quote(ROOT))))
    local n = 0
    for file in ls:lines() do
      n = n + 1
      local text = h.read_file(file)
      assert.truthy(text:find('\nlocal root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") '
        .. 'or ".") .. "/.."\n', 1, true), file)
    end
    ls:close()
    assert.is_true(n > 0)
  end)
end)

describe("examples/deadlock.lua", function()
  it("reports the ABBA inversion before anything hangs, raises E_DEADLOCK when the "
    .. "transfers collide, and the fixed order reports nothing", function()
    local out = check("deadlock", {
      "1. One transfer at a time (a test suite):",
      "  transfer A -> B: 10 done",
      "[debug: inversion]",
      "async_mutex.debug: possible deadlock: lock order inversion (lockdep), locks taken in a cycle of orders:",
      "  transfer B -> A: 5 done",
      "2. Both at once (production):",
      "[debug: deadlock]",
      "  transfer B -> A failed: deadlock: the request would wait for ever",
      "  transfer A -> B: 10 done",
      "3. Fixed, both at once:",
      "  transfer A -> B: 10 done",
      "  transfer B -> A: 5 done",
      "balances: A 80, B 120",
    })
    assert.matches('Mutex "account B" %(acquired at examples/deadlock%.lua:%d+%)\n'
      .. '    %-> Mutex "account A" %(acquired at examples/deadlock%.lua:%d+%)', out)
    assert.is_nil(out:find("unexpected", 1, true))
    local _, inversions = out:gsub("%[debug: inversion%]", "")
    assert.equal(1, inversions)
  end)
end)
