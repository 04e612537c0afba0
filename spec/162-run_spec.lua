-- am.run (docs/api.md, am.run, am.stranded; README, Testing your own code; docs/
-- semantics.md, Tasks): runs a function as a task and the loop until
-- nothing is left; raises the function's error with its traceback, else a
-- failure nobody joined, else a report of the coroutines left waiting for
-- ever.  Each case runs in a child lua5.4 (am.run runs the loop itself,
-- and cannot inside this file's h.async).
local h = require "helpers"

local ROOT = h.ROOT

--- Runs 'body' in a child after `am` and `uv` are loaded; returns the
-- result (rc, stdout, stderr).
local function child(body)
  return h.subprocess('local am = require "async_mutex"\nlocal uv = require "luv"\n' .. body, 30)
end

--- Runs 'body' in a child that prints what `pcall(am.run, ...)` in it
-- raised (the chunk's lines are numbered from 3); returns the message.
local function raised(body)
  local r = child(body .. "\nio.write(tostring(select(2, pcall(am.run, main))))\n")
  assert.equal(0, r.rc, r.stderr)
  return r.stdout, r.stderr
end

describe("am.run", function()
  it("returns the function's results, given its arguments", function()
    local r = child([[
      print(am.run(function(a, b) am.sleep(1); return a + b, nil, "c" end, 1, 2))
      print(select("#", am.run(function() end)))
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("3\tnil\tc\n0\n", r.stdout)
  end)

  it("runs the loop until nothing is left: tasks nobody joins finish first", function()
    local r = child([[
      local log = {}
      am.run(function()
        am.spawn(function() am.sleep(20); log[#log + 1] = "late" end)
        log[#log + 1] = "fn returned"
      end)
      print(table.concat(log, " "), am.pending())
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("fn returned late\t0\n", r.stdout)
  end)

  it("raises the function's error as its text and the traceback of the line that raised it", function()
    local out = raised([[
      function main()
        am.sleep(1)
        error("the function failed")
      end
    ]])
    assert.matches("^[^\n]*:5: the function failed\nstack traceback:\n\t%[C%]: in function 'error'\n"
      .. "\t[^\n]*:5: in function 'main'\n", out)
  end)

  it("stops the loop at once when the function fails: a task sleeping on is not waited for", function()
    local r = child([[
      local t0 = uv.hrtime()
      local ok, err = pcall(am.run, function()
        am.spawn(function() am.sleep(5000) end)
        am.sleep(1)
        error("stop", 0)
      end)
      print(ok, err:match("^stop") ~= nil, (uv.hrtime() - t0) / 1e6 < 4000)
      os.exit(0)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("false\ttrue\ttrue\n", r.stdout)
  end)

  it("raises an error object unchanged, and any error unchanged with traceback = false", function()
    local r = child([[
      local e = setmetatable({}, { __tostring = function() return "obj" end })
      local ok, err = pcall(am.run, function() error(e) end)
      print(ok, rawequal(err, e))
      ok, err = pcall(am.run, { traceback = false }, function() am.sleep(1); error(am.E_TIMEOUT, 0) end)
      print(ok, err == am.E_TIMEOUT)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("false\ttrue\nfalse\ttrue\n", r.stdout)
  end)

  describe("once the loop is idle, a failure nobody took", function()
    it("raises the first failure of a task nobody joined, also reported as it happened", function()
      local out, err = raised([[
        function main()
          am.spawn(function() am.sleep(1); error("lost in a task") end)
          am.spawn(function() am.sleep(5); error("second, not raised", 0) end)
        end
      ]])
      assert.matches("^am%.run: error in a task nobody joined: [^\n]*:4: lost in a task\n"
        .. "stack traceback:\n", out)
      assert.matches("async_mutex: error in a task: [^\n]*:4: lost in a task\n", err)
      assert.matches("async_mutex: error in a task: second, not raised\n", err, 1, true)
    end)

    it("raises the failure of a group nobody joined, and of a coroutine the module resumed", function()
      local out = raised([[
        function main()
          local g = am.group()
          g:spawn(function() am.sleep(1); error("group's", 0) end)
        end
      ]])
      assert.matches("^am%.run: error in a group nobody joined: group's\n", out)
      out = raised([[
        function main()
          coroutine.wrap(function() am.sleep(1); error("ours", 0) end)()
        end
      ]])
      assert.matches("^am%.run: error in a coroutine async_mutex resumed: ours\n", out)
    end)

    it("raises nothing for a failure a join took, even in a later loop turn", function()
      local r = child([[
        print(am.run(function()
          local t = am.spawn(function() am.sleep(1); error("taken later", 0) end)
          am.sleep(30)
          return (select(2, pcall(t.join, t)))
        end))
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("taken later\n", r.stdout)
      assert.matches("^async_mutex: error in a task: taken later\n", r.stderr)  -- reported meanwhile
    end)

    it("with unjoined = \"report\" only reports it", function()
      local r = child([[
        print(am.run({ unjoined = "report" }, function()
          am.spawn(function() am.sleep(1); error("reported only", 0) end)
          return "returned"
        end))
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("returned\n", r.stdout)
      assert.matches("^async_mutex: error in a task: reported only\n", r.stderr)
    end)
  end)

  describe("once the loop is idle, coroutines left waiting", function()
    it("raises a report of a forgotten release: the count, the lock, where each waits", function()
      local out = raised([[
        function main()
          local m = am.Mutex.new()
          local release = m:acquire()          -- never released
          am.spawn(function() m:acquire() end)
          coroutine.wrap(function() m:waitForUnlock() end)()
        end
      ]])
      assert.matches("^am%.run: the function returned, but 2 coroutines wait for ever %(nothing left "
        .. "on the loop can wake them%):\n", out)
      assert.matches("\n  async_mutex%.Task %(waiting%): 0x%x+ waits to acquire async_mutex%.Mutex "
        .. "%(locked, 1 waiting%): 0x%x+ at [^\n]*:6\n", out)
      assert.matches("\n  thread: 0x%x+ waits for the unlock of async_mutex%.Mutex [^\n]* at [^\n]*:7$", out)
    end)

    it("names a Semaphore request's weight and the value (a weight above the value)", function()
      local out = raised([[
        function main()
          local s = am.Semaphore.new(2)
          local _, r = s:acquire(3)
        end
      ]])
      assert.matches("^am%.run: the function never returned, and nothing left on the loop can wake it; "
        .. "1 coroutine waits for ever:\n  async_mutex%.Task %(waiting%): 0x%x+ waits to acquire "
        .. "async_mutex%.Semaphore %(value 2, 1 waiting%): 0x%x+ %(weight 3; value 2, 0 held%) at "
        .. "[^\n]*:5$", out)
    end)

    it("names a key's lock by its keyed set and key, and a joiner by the task it joins", function()
      local out = raised([[
        function main()
          local km = am.KeyedMutex.new()
          local r = km:acquire("k")
          local t = am.spawn(function() km:acquire("k") end)
          t:join()
        end
      ]])
      assert.matches("async_mutex%.KeyedMutex[^\n]* key k at [^\n]*:6\n", out)
      assert.matches("waits for the end of async_mutex%.Task %(waiting%): 0x%x+ at [^\n]*:7", out)
    end)

    it("finds a self-deadlock without debug mode", function()
      local out = raised([[
        function main()
          local m = am.Mutex.new()
          local r = m:acquire()
          m:acquire()                          -- its own lock
        end
      ]])
      assert.matches("^am%.run: the function never returned", out)
      assert.matches("waits to acquire async_mutex%.Mutex [^\n]* at [^\n]*:6$", out)
    end)

    it("in debug mode names the lock as its reports do, and each holder with where it acquired",
      function()
        local out = raised([[
          am.debug.enable()
          local m = am.debug.name(am.Mutex.new(), "orders")
          function main()
            local release = m:acquire()
            am.spawn(function() m:acquire() end)
          end
        ]])
        assert.matches("waits to acquire Mutex \"orders\" at [^\n]*:7\n      held by thread: 0x%x+,"
          .. " acquired at [^\n]*:6$", out)
      end)

    it("leaves out the coroutines that waited before it was called", function()
      local r = child([[
        local m = am.Mutex.new()
        coroutine.wrap(function() m:acquire() end)()     -- holds
        coroutine.wrap(function() m:acquire() end)()     -- waits for ever, before am.run
        print(am.run(function() am.sleep(1); return "fine" end), am.pending())
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("fine\t1\n", r.stdout)
    end)

    it("says so when a uv.stop() of the user's ended the loop before the function returned", function()
      local out = raised([[
        function main()
          local t = uv.new_timer()
          t:start(5, 0, function() t:close(); uv.stop() end)
          am.sleep(1000)
        end
      ]])
      assert.matches("^am%.run: the loop was stopped %(uv%.stop%(%)%) before the function returned; "
        .. "1 coroutine waits:\n  async_mutex%.Task %(waiting%): 0x%x+ sleeps at [^\n]*:6$", out)
    end)
  end)

  describe("refuses", function()
    it("to run inside am.run or while the loop runs: in its function, a task, a luv callback", function()
      local r = child([[
        local ok = pcall(am.run, function()
          print(pcall(am.run, print))            -- before the loop runs
          am.sleep(1)
          print(pcall(am.run, print))            -- in the loop
        end)
        print(ok)
        local t = uv.new_timer()
        t:start(0, 0, function() t:close(); print(pcall(am.run, print)) end)
        uv.run()
      ]])
      assert.equal(0, r.rc, r.stderr)
      local MSG = "attempt to call am.run while the loop runs or inside am.run %(spawn a task and "
        .. "join it instead%)"
      -- (called by pcall: no position, as Lua's own errors)
      assert.matches("^false\t" .. MSG .. "\nfalse\t" .. MSG .. "\ntrue\nfalse\t" .. MSG .. "\n$",
        r.stdout)
    end)

    it("bad arguments and options, at the caller's line", function()
      local am = require "async_mutex"
      for _, case in ipairs({
        { function() am.run() end, "bad argument #1 to 'run' (function expected, got no value)" },
        { function() am.run(42) end, "bad argument #1 to 'run' (function expected, got number)" },
        { function() am.run({}, "f") end, "bad argument #2 to 'run' (function expected, got string)" },
        { function() am.run({ unjoined = "ignore" }, print) end,
          "bad argument #1 to 'run' (unjoined must be \"raise\" or \"report\")" },
        { function() am.run({ traceback = 1 }, print) end,
          "bad argument #1 to 'run' (traceback must be a boolean, got number)" },
        { function() am.run({ unjoind = "report" }, print) end,
          "bad argument #1 to 'run' (unknown option 'unjoind'; did you mean 'unjoined'? options:"
            .. " traceback, unjoined)" },
      }) do h.raises_at_caller(case) end
    end)
  end)
end)

describe("am.run under a memory checker", function()
  it("leaves no read of freed memory nor leak across tasks, groups, cancels, failures and reports",
    function()
      -- valgrind's memcheck, or ASan when this run is under it (h.memcheck_child)
      local out = h.memcheck_child([[
        local am = require "async_mutex"
        collectgarbage("incremental", 1, 1000)      -- collections at every step
        am.setErrorHandler(function() end)         -- (nothing on stderr)
        local n = 0
        for round = 1, 3 do
          local ok, err = pcall(am.run, function()
            local m = am.Mutex.new()
            local outer <close> = am.group()
            for i = 1, 20 do
              outer:spawn(function()
                local inner <close> = am.group()
                inner:spawn(function() local r <close> = m:acquire(); am.sleep(i % 3) end)
                local t = am.spawn(function() am.sleep(1); return i end)
                n = n + t:join()
                local c = am.spawn(function() m:acquire(); am.sleep(1000) end)
                c:cancel()
              end)
            end
            outer:spawn(function() am.sleep(2); if round == 2 then error("round 2", 0) end end)
          end)
          assert(ok == (round ~= 2), err)
        end
        -- a failure nobody joins, a coroutine left waiting: both reported
        local ok, err = pcall(am.run, function()
          am.spawn(function() error("lost", 0) end)
        end)
        assert(not ok and err:find("lost", 1, true))
        ok, err = pcall(am.run, function()
          local s = am.Semaphore.new(0)
          am.spawn(function() s:acquire() end)
        end)
        assert(not ok and err:find("1 coroutine waits for ever", 1, true))
        print(n > 0, am.pending())
      ]], 300)
      assert.equal("true\t1\n", out)
    end)
end)

describe("am.stranded()", function()
  it("after a plain uv.run(): the count and the report am.run words; 0 and nil when none", function()
    local r = child([[
      print(am.stranded())
      local s = am.Semaphore.new(0)
      am.spawn(function() s:acquire() end)
      uv.run()
      local n, report = am.stranded()
      print(n)
      print(report)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.matches("^0\tnil\n1\n1 coroutine waits for ever %(nothing left on the loop can wake them%):\n"
      .. "  async_mutex%.Task %(waiting%): 0x%x+ waits to acquire async_mutex%.Semaphore [^\n]* at "
      .. "[^\n]*:5\n$", r.stdout)
  end)

  it("while the loop runs: what waits now, sleepers included", function()
    local r = child([[
      am.run(function()
        am.spawn(function() am.sleep(50) end)
        local n, report = am.stranded()
        print(n, report:match("sleeps at [^\n]*") ~= nil)
      end)
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("1\ttrue\n", r.stdout)
  end)
end)

describe("busted with am.run (README, Testing your own code)", function()
  local readme = h.read_file(ROOT .. "/README.md")
  local snippet = readme:match("\n## Testing your own code\n.-\n<!%-%- doctest: busted %-%->\n```lua\n(.-)```\n")

  --- Runs 'spec' (a spec file's text) under busted in a child; returns the
  -- exit code and the output.
  -- the module's paths, made absolute (busted runs in a directory of its own)
  local cwd = io.popen("pwd"):read("l")
  local function absolute(path)
    return (path:gsub("[^;]+", function(p) return p:sub(1, 1) == "/" and p or (cwd .. "/" .. p) end))
  end

  local function busted(spec)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir))
    local file = dir .. "/x_spec.lua"
    local f = assert(io.open(file, "w"))
    f:write(spec)
    f:close()
    local p = assert(io.popen(("cd %s && LUA_PATH=%q LUA_CPATH=%q timeout 60 lua5.4 /usr/bin/busted"
      .. " -o TAP x_spec.lua 2>&1"):format(dir, absolute(package.path), absolute(package.cpath))))
    local out = p:read("a")
    local _, _, rc = p:close()
    os.execute("rm -rf " .. dir)
    return rc, out
  end

  it("passes the README's test", function()
    assert.is_string(snippet)
    local rc, out = busted(snippet)
    assert.equal(0, rc, out)
    assert.matches("^ok 1 ", out)
  end)

  it("fails it when an assertion fails inside a task, after a yield", function()
    local broken = snippet:gsub("assert%.are%.equal%(1, inside%)", "assert.are.equal(2, inside)")
    assert.are_not.equal(snippet, broken)
    local rc, out = busted(broken)
    assert.equal(1, rc, out)
    assert.matches("not ok 1 ", out, 1, true)
    assert.matches("Expected objects to be equal", out, 1, true)
  end)

  it("fails the test of the issue: a task nobody joins failing after a sleep", function()
    local rc, out = busted([[
      local am = require "async_mutex"
      it("fails", function()
        am.run(function()
          am.spawn(function() am.sleep(1); assert.are.equal(1, 2) end)
        end)
      end)
    ]])
    assert.equal(1, rc, out)
    assert.matches("\nnot ok 1 ", out)
    -- (luassert's error object, raised by am.run unchanged: busted words it)
    assert.matches("Failure message: x_spec.lua:4: Expected objects to be equal.", out, 1, true)
  end)

  it("fails it when a coroutine is left waiting for ever", function()
    local rc, out = busted([[
      local am = require "async_mutex"
      it("fails", function()
        am.run(function()
          local m = am.Mutex.new()
          m:acquire()
          am.spawn(function() m:acquire() end)
        end)
      end)
    ]])
    assert.equal(1, rc, out)
    assert.matches("1 coroutine waits for ever", out, 1, true)
  end)
end)
