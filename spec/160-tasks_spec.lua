-- Tasks (docs/api.md, am.spawn, task:join, task:cancel, task:status; docs/
-- semantics.md, Tasks): am.spawn returns a task whose coroutine records how
-- it ended, whoever resumes it; join gives the results or raises the error
-- unchanged; cancel closes the coroutine (its <close> variables run); a
-- failure nobody takes is reported at the end of the next loop turn.
local h = require "helpers"
local am = require "async_mutex"
local uv = require "luv"

-- Coroutines the module holds beyond `base`.
local function held(base) return am.pending() - base end

local reports_during = h.reports_during

describe("task:join()", function()
  it("returns the task's results: none, one, several with nils", h.async(function()
    local none = am.spawn(function() am.sleep(1) end)
    local one = am.spawn(function() am.sleep(1); return "x" end)
    local many = am.spawn(function() am.sleep(1); return 1, nil, "three", nil end)
    assert.same({ n = 0 }, table.pack(none:join()))
    assert.same({ n = 1, "x" }, table.pack(one:join()))
    assert.same({ n = 4, 1, nil, "three", nil }, table.pack(many:join()))
  end))

  it("returns at once for a task that has ended, as often as it is asked", h.async(function()
    local t = am.spawn(function(a, b) return a + b end, 2, 3)
    assert.equal("done", t:status())
    local ok, res = h.without_yield(t.join, t)
    assert.is_true(ok)
    assert.same({ n = 1, 5 }, res)
    assert.equal(5, t:join())
    assert.equal(5, t:join())
  end))

  it("wakes every joiner, each with the results", h.async(function()
    local t = am.spawn(function() am.sleep(5); return "r", 2 end)
    local got = {}
    for i = 1, 3 do
      am.spawn(function() got[i] = table.pack(t:join()) end)
    end
    assert.same({ n = 2, "r", 2 }, table.pack(t:join()))
    h.tick()
    for i = 1, 3 do assert.same({ n = 2, "r", 2 }, got[i]) end
  end))

  it("raises the task's error unchanged (rawequal), and takes it: nothing is reported",
    h.async(function()
      local e = setmetatable({}, { __tostring = function() return "boom" end })
      local got, ok
      local reports = reports_during(function()
        local t = am.spawn(function() am.sleep(1); error(e) end)
        ok, got = pcall(t.join, t)
        h.tick(2)
      end)
      assert.is_false(ok)
      assert.is_true(rawequal(e, got))
      assert.same({}, reports)
    end))

  it("raises am.E_CANCELED for a canceled task", h.async(function()
    local t = am.spawn(function() am.sleep(1000) end)
    assert.is_true(t:cancel())
    local ok, err = pcall(t.join, t)
    assert.is_false(ok)
    assert.equal(am.E_CANCELED, err)
  end))

  it("makes a waiter like a lock's: counted by am.pending(), withdrawn by coroutine.close",
    h.async(function()
      local base = am.pending()
      local t = am.spawn(function() am.sleep(20) end)
      local joiner = coroutine.create(function() t:join() end)
      assert(coroutine.resume(joiner))
      assert.equal(2, held(base))               -- the sleeper and the joiner
      assert.is_true(coroutine.close(joiner))
      assert.equal(1, held(base))
      t:join()
      assert.equal(0, held(base))
    end))

  it("refuses to join a task from inside itself", h.async(function()
    local err
    local t
    t = am.spawn(function()
      am.sleep(0)
      err = h.error_of(function() t:join() end)
    end)
    t:join()
    assert.equal("attempt to join a task from inside itself", err)
  end))

  it("needs a coroutine that can yield, and says which it lacks", h.async(function()
    local t = am.spawn(function() am.sleep(5) end)
    local outside
    local timer = uv.new_timer()               -- a luv callback: the main thread
    timer:start(0, 0, function()
      timer:close()
      outside = h.error_of(function() t:join() end)
    end)
    h.wait_until(function() return outside ~= nil end)
    assert.equal("attempt to join a task outside a coroutine", outside)
    assert.equal("attempt to join a task" .. h.CANNOT_YIELD, h.cannot_yield_error(function() t:join() end))
    t:join()
  end))
end)

describe("task:status()", function()
  it("is running inside, waiting while suspended, then done, failed or canceled", h.async(function()
    local inside
    local reports = reports_during(function()
      do
        local me
        me = am.spawn(function() inside = me and me:status(); am.sleep(1) end)
        assert.equal("waiting", me:status())
        local self_seen
        local t2
        t2 = am.spawn(function() am.sleep(0); self_seen = t2:status() end)
        t2:join()
        assert.equal("running", self_seen)
        assert.equal("done", t2:status())
        local f = am.spawn(function() am.sleep(0); error("x", 0) end)
        pcall(f.join, f)
        assert.equal("failed", f:status())
        local c = am.spawn(function() am.sleep(100) end)
        c:cancel()
        assert.equal("canceled", c:status())
        me:join()
        assert.equal("done", me:status())
      end
    end)
    assert.is_nil(inside)                      -- (me was not assigned yet)
    assert.same({}, reports)
  end))

  it("shows in tostring", h.async(function()
    local t = am.spawn(function() am.sleep(1) end)
    assert.matches("^async_mutex%.Task %(waiting%): 0x%x+$", tostring(t))
    t:join()
    assert.matches("^async_mutex%.Task %(done%): 0x%x+$", tostring(t))
  end))

  it("is running for a task that resumed the caller (a task it spawned)", h.async(function()
    local seen
    local parent
    parent = am.spawn(function()
      am.sleep(0)
      am.spawn(function() seen = parent:status() end)
    end)
    parent:join()
    assert.equal("running", seen)
  end))
end)

describe("task:cancel()", function()
  it("closes a task waiting for a lock: it leaves the queue, its releasers run, joiners get E_CANCELED",
    h.async(function()
      local base = am.pending()
      local a, b = am.Mutex.new(), am.Mutex.new()
      local hold_b = b:acquire()
      local t = am.spawn(function()
        local ra <close> = a:acquire()          -- held across the wait below
        local rb <close> = b:acquire()
        error("never here")
      end)
      local joined
      am.spawn(function() joined = select(2, pcall(t.join, t)) end)
      assert.is_true(a:isLocked())
      assert.equal("waiting", t:status())
      assert.is_true(t:cancel())
      assert.equal("canceled", t:status())
      assert.is_false(a:isLocked())            -- its releaser ran
      h.tick()
      assert.equal(am.E_CANCELED, joined)
      hold_b()
      assert.is_false(b:isLocked())            -- its request had left the queue
      assert.equal(0, held(base))
      assert.is_false(t:cancel())              -- ended: nothing to cancel
    end))

  it("closes a sleeping task: its deadline leaves the timer, no timer stays active",
    h.async(function()
      local woke = false
      local t = am.spawn(function() am.sleep(60000); woke = true end)
      assert.equal(1, h.count_handles("uv_timer_t", true))
      t:cancel()
      assert.equal(0, h.count_handles("uv_timer_t", true))
      h.tick()
      assert.is_false(woke)
    end))

  it("of a task by itself: it goes on to its next yield, then is closed at the next loop turn",
    h.async(function()
      local log = {}
      local m = am.Mutex.new()
      local t
      t = am.spawn(function()
        local release <close> = m:acquire()
        am.sleep(0)
        assert.is_true(t:cancel())
        log[#log + 1] = "went on after its cancel"
        am.sleep(1000)                         -- closed while it sleeps
        log[#log + 1] = "never"
      end)
      local ok, err = pcall(t.join, t)
      assert.is_false(ok)
      assert.equal(am.E_CANCELED, err)
      assert.same({ "went on after its cancel" }, log)
      assert.is_false(m:isLocked())
    end))

  it("of a task by itself that then returns: canceled all the same, its results dropped",
    h.async(function()
      local t
      t = am.spawn(function() am.sleep(0); t:cancel(); return "dropped" end)
      local ok, err = pcall(t.join, t)
      assert.is_false(ok)
      assert.equal(am.E_CANCELED, err)
      assert.equal("canceled", t:status())
    end))

  it("of a task by itself that then raises: it failed", h.async(function()
    local reports = reports_during(function()
      do
        local t
        t = am.spawn(function() am.sleep(0); t:cancel(); error("raised after", 0) end)
        local ok, err = pcall(t.join, t)
        assert.is_false(ok)
        assert.equal("raised after", err)
        assert.equal("failed", t:status())
      end
    end)
    assert.same({}, reports)
  end))

  it("of a task that resumed the caller: closed once it waits", h.async(function()
    local parent
    local after = false
    parent = am.spawn(function()
      am.sleep(0)
      am.spawn(function() parent:cancel() end)  -- parent is "running" here
      after = true
      am.sleep(1000)
    end)
    local ok, err = pcall(parent.join, parent)
    assert.is_false(ok)
    assert.equal(am.E_CANCELED, err)
    assert.is_true(after)
  end))

  it("makes the error of a <close> variable that raises while closing the task's failure",
    h.async(function()
      local reports = reports_during(function()
        do
          local t = am.spawn(function()
            local _ <close> = setmetatable({}, { __close = function() error("close broke", 0) end })
            am.sleep(1000)
          end)
          t:cancel()
          assert.equal("failed", t:status())
          local ok, err = pcall(t.join, t)
          assert.is_false(ok)
          assert.equal("close broke", err)
        end
      end)
      assert.same({}, reports)                 -- the join took it
    end))

  it("happens when a to-be-closed variable holding the task goes out of scope", h.async(function()
    local t
    do
      local task <close> = am.spawn(function() am.sleep(1000) end)
      t = task
      assert.equal("waiting", t:status())
    end
    assert.equal("canceled", t:status())
  end))

  it("happens when the task's coroutine is closed with coroutine.close", h.async(function()
    local co
    local t = am.spawn(function() co = coroutine.running(); am.sleep(1000) end)
    local joined
    am.spawn(function() joined = select(2, pcall(t.join, t)) end)
    assert.is_true(coroutine.close(co))
    assert.equal("canceled", t:status())
    h.tick()
    assert.equal(am.E_CANCELED, joined)
  end))
end)

describe("a task resumed by someone else", function()
  it("records its end, whoever resumes it: a luv callback of the user's, with a coroutine.resume that sees no error",
    h.async(function()
      local resumed_ok
      local reports = reports_during(function()
        do
          local t = am.spawn(function()
            local co = coroutine.running()
            local timer = uv.new_timer()
            timer:start(1, 0, function()
              timer:close()
              resumed_ok = coroutine.resume(co)
            end)
            coroutine.yield()                  -- not the module's wait
            error("failed after the user's resume", 0)
          end)
          assert.equal("waiting", t:status())
          local ok, err = pcall(t.join, t)
          assert.is_false(ok)
          assert.equal("failed after the user's resume", err)
        end
      end)
      assert.is_true(resumed_ok)               -- the task took its error
      assert.same({}, reports)
    end))
end)

describe("a failure nobody takes", function()
  it("is reported at the end of the next loop turn, with its task", h.async(function()
    local t
    local reports = reports_during(function()
      t = am.spawn(function() am.sleep(1); error("nobody joins", 0) end)
      h.sleep(20)
    end)
    assert.equal(1, #reports)
    assert.equal("nobody joins", reports[1].err)
    assert.matches("^nobody joins\nstack traceback:\n", reports[1].text)
    assert.is_true(rawequal(t, reports[1].task))
  end))

  it("is not reported when a joiner it woke takes it, in the turn after", h.async(function()
    local reports = reports_during(function()
      local t = am.spawn(function() am.sleep(5); error("taken", 0) end)
      local r = am.spawn(function() return select(2, pcall(t.join, t)) end)
      assert.equal("taken", r:join())
      h.tick(2)
    end)
    assert.same({}, reports)
  end))

  it("joined later than that is reported, and the join still raises it", h.async(function()
    local got
    local reports = reports_during(function()
      local t = am.spawn(function() am.sleep(1); error("late join", 0) end)
      h.sleep(20)
      got = select(2, pcall(t.join, t))
    end)
    assert.equal(1, #reports)
    assert.equal("late join", got)
  end))

  it("keeps the traceback where it was raised when a join raises it again", h.async(function()
    local reports = reports_during(function()
      local inner = am.spawn(function() am.sleep(1); error("deep") end)
      local outer = am.spawn(function() inner:join() end) -- raises it again; nobody joins it
      h.wait_until(function() return outer:status() == "failed" end, 2000, "the join raised")
      h.tick(2)   -- reported in the turn after its end
    end)
    assert.equal(1, #reports)
    local text = reports[1].text
    assert.matches("160%-tasks_spec%.lua:%d+: deep\nstack traceback:\n\t%[C%]: in function 'error'\n",
      text)
    assert.matches("\nraised again by a join:\nstack traceback:\n", text, 1, true)
  end))

  it("is reported on stderr when the script never runs the loop again, at exit", function()
    local r = h.subprocess([[
      local am = require "async_mutex"
      am.spawn(function() error("never reported by a loop", 0) end)
      print("exits")
    ]])
    assert.equal(0, r.rc)
    assert.equal("exits\n", r.stdout)
    assert.matches("^async_mutex: error in a task: never reported by a loop\nstack traceback:\n",
      r.stderr)
  end)
end)

describe("a task's lifetime", function()
  it("keeps a task whose coroutine waits on the module alive with nothing else referring to it",
    h.async(function()
      local m = am.Mutex.new()
      local release = m:acquire()
      local done = false
      local weak = setmetatable({}, { __mode = "v" })
      weak[1] = am.spawn(function() m:acquire()(); done = true end)
      h.gc()
      assert.is_not_nil(weak[1])
      release()
      h.wait_until(function() return done end)
    end))

  it("lets a task nobody can resume any more be collected, with its coroutine", h.async(function()
    local weak = setmetatable({}, { __mode = "v" })
    weak[1] = am.spawn(function() coroutine.yield() end)   -- nobody will resume it
    h.gc()
    assert.is_nil(weak[1])
  end))
end)

describe("a task's cost", function()
  it("is a handle of at most 64 bytes beside its coroutine (60 on 64-bit Lua 5.4)", function()
    -- ended tasks returning nothing: their coroutines are gone, the handles
    -- (the task and what it holds) are what is left
    local n = h.load(20000)
    local keep = {}
    for i = 1, n do keep[i] = false end
    h.gc()
    local before = collectgarbage("count")
    for i = 1, n do keep[i] = am.spawn(function() end) end
    h.gc()
    local per_task = (collectgarbage("count") - before) * 1024 / n
    assert.equal("done", keep[n]:status())
    assert.is_true(per_task <= 64, ("%.1f bytes per task"):format(per_task))
  end)
end)
