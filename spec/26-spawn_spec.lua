-- am.spawn(fn, ...): starts fn(...) in a new coroutine at once and returns
-- its task; an error escaping it, when nobody joins the task, is reported
-- at the end of the next loop turn (docs/api.md, "Errors in resumed
-- coroutines"), its <close> variables having run as the error left them.
-- The task's own API (join, cancel, status) is spec/160-tasks_spec.lua's.
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

-- Coroutines the module holds beyond `base` (earlier spec files may leave
-- some waiting for ever on purpose).
local function held(base) return am.pending() - base end

local with_handler = h.with_handler

--- Runs body with a handler that collects the reports, then the loop (a
-- failure nobody took is reported at the end of the next loop turn);
-- returns them, each { err = ..., tb = ..., task = ... }.
local function reports_of(body)
  local reports = {}
  with_handler(function(err, tb, task)
    reports[#reports + 1] = { err = err, tb = tb, task = task }
  end, function()
    body()
    h.run_loop()
  end)
  return reports
end

describe("async_mutex.spawn", function()
  it("runs fn with its arguments at once, up to its first yield, and returns its task",
    h.async(function()
      local log = {}
      local t = am.spawn(function(...)
        log[#log + 1] = table.pack(...)
        am.sleep(0)
        log[#log + 1] = "after the yield"
      end, 1, nil, "x", nil)
      assert.equal("userdata", type(t))
      assert.matches("^async_mutex%.Task %(waiting%): 0x", tostring(t))
      assert.equal("waiting", t:status())
      assert.equal(1, #log)
      assert.same({ n = 4, 1, nil, "x", nil }, log[1])
      h.tick(2)
      assert.same("after the yield", log[2])
      assert.equal("done", t:status())
    end))

  it("returns the task alone, done, when fn returns without yielding", function()
    local t = table.pack(am.spawn(function() return 1, 2, 3 end))
    assert.equal(1, t.n)
    assert.equal("done", t[1]:status())
  end)

  it("works from the main thread, inside a coroutine and inside a luv callback",
    h.async(function()
      local base = am.pending()
      local log = {}
      local outer = coroutine.running()
      local inner = am.spawn(function()
        log[#log + 1] = "inner"
        assert.is_false(coroutine.running() == outer)
        am.sleep(0)
        log[#log + 1] = "inner woke"
      end)
      log[#log + 1] = "outer"
      local t = uv.new_timer()
      t:start(0, 0, function()
        t:close()
        am.spawn(function() log[#log + 1] = "callback"; am.sleep(0); log[#log + 1] = "callback woke" end)
      end)
      h.wait_until(function() return #log == 5 end)
      assert.equal("done", inner:status())
      assert.same({ "inner", "outer" }, { log[1], log[2] })
      assert.equal(0, held(base))
    end))

  it("accepts a callable table, as runExclusive does", function()
    local got
    local callable = setmetatable({}, { __call = function(self, x) got = { self, x } end })
    local t = am.spawn(callable, 42)
    assert.equal("done", t:status())
    assert.same({ callable, 42 }, got)
  end)

  describe("with an error escaping the coroutine", function()
    it("before its first yield: raises nothing, hands the error value, a traceback and the task to the handler at the next loop turn",
      function()
        local e = { "boom" }
        local t, now
        local reports = {}
        with_handler(function(err, tb, task)
          reports[#reports + 1] = { err = err, tb = tb, task = task }
        end, function()
          t = am.spawn(function() error(e) end)
          now = #reports                           -- nothing yet: no loop turn
          h.run_loop()
        end)
        assert.equal(0, now)
        assert.equal(1, #reports)
        assert.is_true(rawequal(e, reports[1].err))
        assert.is_truthy(reports[1].tb:find("stack traceback", 1, true))
        assert.is_truthy(reports[1].tb:find("26-spawn_spec.lua", 1, true))
        assert.is_true(rawequal(t, reports[1].task))
        assert.equal("failed", t:status())
      end)

    it("runs its <close> variables as the error leaves them: the releaser runs and the lock is free at once",
      function()
        local m = am.Mutex.new()
        local closed, locked_after = false, nil
        local t
        local reports = reports_of(function()
          t = am.spawn(function()
            local release <close> = m:acquire()
            local _ <close> = setmetatable({}, { __close = function() closed = true end })
            error("failed while holding the lock", 0)
          end)
          locked_after = m:isLocked()              -- before any loop turn
        end)
        assert.same({ "failed while holding the lock" }, { reports[1].err })
        assert.is_true(closed)
        assert.is_false(locked_after)
        assert.equal("failed", t:status())
      end)

    it("after a wake-up by the module: reported, closed, the lock passes on (the Quick start with an error after the I/O)",
      h.async(function()
        local base = am.pending()
        local m = am.Mutex.new()
        local balance, log = 100, {}
        local function withdraw(amount, fail)
          local release <close> = m:acquire()
          local current = balance
          am.sleep(5)                                 -- the lock is held across it
          if fail then error("I/O failed", 0) end
          if current >= amount then balance = current - amount end
          log[#log + 1] = amount
        end
        local reports = reports_of(function()
          am.spawn(withdraw, 30, true)
          am.spawn(withdraw, 80)
          h.wait_until(function() return #log == 1 end)
        end)
        assert.same({ "I/O failed" }, { reports[1] and reports[1].err })
        assert.equal(20, balance)                     -- the second one ran
        assert.is_false(m:isLocked())
        assert.equal(0, held(base))
      end))

    it("does not stop the caller, nor the other coroutines", function()
      local log = {}
      local reports = reports_of(function()
        am.spawn(function() error("first", 0) end)
        log[#log + 1] = "caller goes on"
        am.spawn(function() log[#log + 1] = "second runs" end)
      end)
      assert.same({ "caller goes on", "second runs" }, log)
      assert.equal(1, #reports)
    end)

    it("is not reported when a join takes it in the same loop turn", function()
      local got
      local reports = reports_of(function()
        am.spawn(function()
          local t = am.spawn(function() error("taken", 0) end)
          got = select(2, pcall(t.join, t))
        end)
      end)
      assert.equal("taken", got)
      assert.equal(0, #reports)
    end)

    it("goes to stderr with its traceback when no handler is set, and the process goes on", function()
      local r = h.subprocess([[
        local uv = require "luv"
        local am = require "async_mutex"
        local m = am.Mutex.new()
        am.spawn(function()
          local release <close> = m:acquire()
          am.sleep(1)
          error("late failure")
        end)
        am.spawn(function() error("early failure") end)
        uv.run()
        print("locked", m:isLocked(), "pending", am.pending())
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("locked\tfalse\tpending\t0\n", r.stdout)
      assert.matches("async_mutex: error in a task: [^\n]*:9: early failure\n"
        .. "stack traceback:\n", r.stderr)
      assert.matches("async_mutex: error in a task: [^\n]*:7: late failure\n"
        .. "stack traceback:\n", r.stderr)
      assert.is_truthy(r.stderr:find("early failure.-late failure"), r.stderr)
    end)

    -- The start of the two children below: luv, the module, and
    -- object(text), an error object whose __tostring gives text.
    local WITH_OBJECT = [[
local uv = require "luv"
local am = require "async_mutex"
local function object(text)
  return setmetatable({}, { __tostring = function() return text end })
end
]]

    it("names an error object by its __tostring, as lua5.4 does (a Redis error's message)",
      function()
        local r = h.subprocess(WITH_OBJECT .. [[
          am.spawn(function() error(object("WRONGTYPE at once"), 0) end)
          am.spawn(function() am.sleep(1); error(object("WRONGTYPE later"), 0) end)
          am.spawn(function() error({}, 0) end)
          am.spawn(function()
            error(setmetatable({}, { __tostring = function() error("no text") end }), 0)
          end)
          uv.run()
          print("went on")
        ]])
        assert.equal(0, r.rc, r.stderr)
        assert.equal("went on\n", r.stdout)
        assert.matches("async_mutex: error in a task: WRONGTYPE at once\n"
          .. "stack traceback:\n", r.stderr, 1, true)
        assert.matches("async_mutex: error in a task: WRONGTYPE later\n"
          .. "stack traceback:\n", r.stderr, 1, true)
        -- no __tostring, or one that raises: its type, as before
        local _, tables = r.stderr:gsub("error in a task: %(error object is a table value%)\n", "")
        assert.equal(2, tables, r.stderr)
      end)

    it("names the error objects of a failing handler and of a failing __close the same way",
      function()
        local r = h.subprocess(WITH_OBJECT .. [[
          -- a <close> that raises as the error leaves: its error is the
          -- task's (Lua's rule for errors in closing methods)
          am.spawn(function()
            local _ <close> = setmetatable({}, { __close = function() error(object("close broke")) end })
            error("body broke", 0)
          end)
          uv.run()
          am.setErrorHandler(function() error(object("handler broke")) end)
          am.spawn(function() error("spawned broke", 0) end)
          uv.run()
          print("still here")
        ]])
        assert.equal(0, r.rc, r.stderr)
        assert.equal("still here\n", r.stdout)
        assert.matches("async_mutex: error in a task: close broke\n", r.stderr, 1, true)
        assert.matches("async_mutex: error in the error handler: handler broke\n"
          .. "while reporting: spawned broke\nstack traceback:", r.stderr, 1, true)
      end)

    it("a handler that raises is reported on stderr and the process goes on", function()
      local r = h.am_subprocess([[
        am.setErrorHandler(function() error("handler broke", 0) end)
        am.spawn(function() error("spawned broke", 0) end)
        uv.run()
        print("still here")
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("still here\n", r.stdout)
      assert.matches("async_mutex: error in the error handler: handler broke\n"
        .. "while reporting: spawned broke\nstack traceback:", r.stderr)
    end)
  end)

  describe("under task:cancel()", function()
    it("a spawned coroutine waiting for a lock leaves the queue; the lock passes on",
      h.async(function()
        local base = am.pending()
        local m = am.Mutex.new()
        local release = m:acquire()
        local log = {}
        local t = am.spawn(function() m:acquire(); log[#log + 1] = "closed one ran" end)
        am.spawn(function() local r = m:acquire(); log[#log + 1] = "next"; r() end)
        assert.equal(2, held(base))
        assert.is_true(t:cancel())
        assert.equal(1, held(base))
        release()
        h.tick()
        assert.same({ "next" }, log)
        assert.is_false(m:isLocked())
      end))
  end)

  describe("leaves the loop clean", function()
    it("uv.run() returns once the spawned coroutines are done, with no handle left", function()
      local r = h.am_subprocess([[
        local s = am.Semaphore.new(2)
        local done = 0
        for i = 1, 50 do
          am.spawn(function()
            s:runExclusive(function() am.sleep(i % 3) end)
            done = done + 1
          end)
        end
        uv.run()
        local active = 0
        uv.walk(function(hd) if hd:is_active() then active = active + 1 end end)
        print(done, am.pending(), active, s:getValue())
      ]])
      assert.equal(0, r.rc, r.stderr)
      assert.equal("50\t0\t0\t2\n", r.stdout)
    end)
  end)

  describe("bad input", function()
    local cases = {
      { "no value", function() am.spawn() end, "function expected, got no value" },
      { "nil", function() am.spawn(nil, 1) end, "function expected, got nil" },
      { "a number", function() am.spawn(42) end, "function expected, got number" },
      { "a string", function() am.spawn("print") end, "function expected, got string" },
      { "a table without __call", function() am.spawn({}) end, "function expected, got table" },
      { "a coroutine", function() am.spawn(coroutine.create(print)) end,
        "function expected, got thread" },
      { "a lock", function() am.spawn(am.Mutex.new()) end,
        "function expected, got async_mutex.Mutex" },
    }
    for _, case in ipairs(cases) do
      it("refuses " .. case[1] .. " at the caller's line, and starts nothing", function()
        local base = am.pending()
        local ok, err = pcall(case[2])
        assert.is_false(ok)
        assert.equal("bad argument #1 to 'spawn' (" .. case[3] .. ")", h.strip_pos(err))
        assert.matches("^[^:]*26%-spawn_spec%.lua:%d+: ", err)
        assert.equal(0, held(base))
      end)
    end
  end)
end)

describe("README's Quick start", function()
  local ROOT = h.ROOT
  local readme = h.read_file(ROOT .. "/README.md")
  local code = readme:match("\n## Quick start\n.-\n```lua\n(.-)```\n")
  local IO_LINE = "  am.sleep(100)                              -- simulated I/O: the lock is held across it\n"

  it("prints 70, with nothing on stderr", function()
    assert.is_string(code)
    local r = h.subprocess(code)
    assert.equal(0, r.rc, r.stderr)
    assert.equal("70\n", r.stdout)
    assert.equal("", r.stderr)
  end)

  it("with an error thrown after the I/O: am.run raises it with its traceback, the other withdrawal canceled, the mutex unlocked",
    function()
      assert.is_truthy(code:find(IO_LINE, 1, true), "the Quick start has no line " .. IO_LINE)
      local failing = code:gsub("\n" .. IO_LINE:gsub("%p", "%%%0"), function(line)
        return line .. '  if amount == 30 then error("I/O failed") end\n'
      end)
      -- as a user runs it: the error ends the script (stderr, exit 1)
      local r = h.subprocess(failing)
      assert.equal(1, r.rc)
      assert.equal("", r.stdout)
      assert.matches("^lua5.4: [^\n]*:%d+: I/O failed\nstack traceback:\n%s*%[C%]: in function 'error'\n",
        r.stderr)
      -- and caught, to look inside: nothing withdrawn, nothing held or waiting
      local RUN, END = "\nam.run(function()", "\nend)                                         -- raises"
      assert.is_truthy(failing:find(RUN, 1, true) and failing:find(END, 1, true))
      local caught = failing:gsub(RUN:gsub("%p", "%%%0"), "\nlocal ran, err = pcall(am.run, function()")
        :gsub(END:gsub("%p", "%%%0"), "\nend) print(ran, err:match('I/O failed'), mutex:isLocked(), am.pending()) --")
      r = h.subprocess(caught)
      assert.equal(0, r.rc, r.stderr)
      assert.equal("false\tI/O failed\tfalse\t0\n100\n", r.stdout)
      assert.equal("", r.stderr)
    end)
end)

describe("docs/api.md's Errors snippets", function()
  local ROOT = h.ROOT
  local section = h.read_file(ROOT .. "/docs/api.md"):match("\n## Errors\n(.-)\n## ")
  local snippets = {}
  for block in (section or ""):gmatch("\n```lua\n(.-)```\n") do
    snippets[#snippets + 1] = (block:gsub("%.%.%.", "outcomes[#outcomes + 1] = tostring(ok)"))
  end

  it("release the mutex on every path: granted, and timed out", function()
    assert.equal(2, #snippets)
    local r = h.am_subprocess(([[
      local mutex = am.Mutex.new()
      local outcomes = {}
      local function snippets() %s
%s end
      am.spawn(snippets)                        -- granted at once
      uv.run()
      am.spawn(function()                       -- held past the timeout
        local release <close> = mutex:acquire()
        am.sleep(300)
      end)
      am.spawn(snippets)
      uv.run()
      print(table.concat(outcomes, " "), mutex:isLocked(), am.pending())
    ]]):format(snippets[1], snippets[2]))
    assert.equal(0, r.rc, r.stderr)
    assert.equal("true false false\tfalse\t0\n", r.stdout)
  end)
end)
