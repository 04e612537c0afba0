-- Groups (docs/api.md, am.group, group:spawn, group:join, group:cancel; docs/
-- semantics.md, Tasks): the first task of a group to fail cancels the
-- others and its join raises that failure; closing the group joins it, an
-- error leaving its block cancels its tasks; groups nest.
local h = require "helpers"
local am = require "async_mutex"

local reports_during = h.reports_during

describe("group:join()", function()
  it("waits for every task of the group, which keep their results", h.async(function()
    local g = am.group()
    local tasks = {}
    for i = 1, 5 do tasks[i] = g:spawn(function() am.sleep(i); return i * 10 end) end
    assert.matches("^async_mutex%.Group %(5 running%): 0x", tostring(g))
    assert.same({ n = 0 }, table.pack(g:join()))
    for i = 1, 5 do
      assert.equal("done", tasks[i]:status())
      assert.equal(i * 10, tasks[i]:join())
    end
    assert.matches("^async_mutex%.Group %(done%): 0x", tostring(g))
  end))

  it("returns at once for a group with no task running, and may take more tasks", h.async(function()
    local g = am.group()
    local ok = h.without_yield(g.join, g)
    assert.is_true(ok)
    local t = g:spawn(function() am.sleep(1); return "later" end)
    g:join()
    assert.equal("later", t:join())
  end))

  it("raises the first failure unchanged, after it canceled the others (their <close> variables ran)",
    h.async(function()
      local e = { "first" }
      local g = am.group()
      local closed = 0
      local m = am.Mutex.new()
      local others = {}
      for i = 1, 3 do
        others[i] = g:spawn(function()
          local _ <close> = setmetatable({}, { __close = function() closed = closed + 1 end })
          local release <close> = m:acquire()
          am.sleep(1000)
        end)
      end
      local failing = g:spawn(function() am.sleep(2); error(e, 0) end)
      local reports = reports_during(function()
        local ok, err = pcall(g.join, g)
        assert.is_false(ok)
        assert.is_true(rawequal(e, err))
        h.tick(2)
      end)
      assert.same({}, reports)                 -- the join took it
      assert.equal(3, closed)
      assert.is_false(m:isLocked())
      for i = 1, 3 do assert.equal("canceled", others[i]:status()) end
      assert.equal("failed", failing:status())
      assert.matches("^async_mutex%.Group %(failed%): 0x", tostring(g))
    end))

  it("wakes every coroutine joining it", h.async(function()
    local g = am.group()
    g:spawn(function() am.sleep(3) end)
    local woke = 0
    for _ = 1, 3 do am.spawn(function() g:join(); woke = woke + 1 end) end
    g:join()
    h.tick()
    assert.equal(3, woke)
  end))

  it("needs a coroutine that can yield while tasks run", h.async(function()
    local g = am.group()
    g:spawn(function() am.sleep(1) end)
    assert.equal("attempt to join a group" .. h.CANNOT_YIELD, h.cannot_yield_error(function() g:join() end))
    g:join()
  end))
end)

describe("a group closed", function()
  it("at the end of its block joins it, raising the first failure there", h.async(function()
    local log = {}
    local ok, err = pcall(function()
      local g <close> = am.group()
      g:spawn(function() am.sleep(5); log[#log + 1] = "a" end)
      g:spawn(function() am.sleep(1); log[#log + 1] = "b" end)
      log[#log + 1] = "block ends"
    end)
    assert.is_true(ok, err)
    assert.same({ "block ends", "b", "a" }, log)
    ok, err = pcall(function()
      local g <close> = am.group()
      g:spawn(function() am.sleep(1); error("inside", 0) end)
      g:spawn(function() am.sleep(1000) end)
    end)
    assert.is_false(ok)
    assert.equal("inside", err)
  end))

  it("by an error leaving its block cancels its tasks at once, and the block's error goes on",
    h.async(function()
      local m = am.Mutex.new()
      local t
      local reports = reports_during(function()
        local ok, err = pcall(function()
          local g <close> = am.group()
          t = g:spawn(function() local r <close> = m:acquire(); am.sleep(1000) end)
          am.sleep(1)
          error("the block failed", 0)
        end)
        assert.is_false(ok)
        assert.equal("the block failed", err)
        assert.equal("canceled", t:status())
        assert.is_false(m:isLocked())
        h.tick(2)
      end)
      assert.same({}, reports)
    end))

  it("takes no more tasks", h.async(function()
    local g
    do
      local group <close> = am.group()
      g = group
    end
    assert.equal("attempt to spawn into a closed group", h.error_of(function() g:spawn(print) end))
  end))

  it("once it failed, starts a new task canceled: its function never runs", h.async(function()
    local g = am.group()
    local ran = false
    local t
    g:spawn(function()
      g:spawn(function() error("first", 0) end)  -- fails at once: the group fails
      t = g:spawn(function() ran = true end)     -- this member still runs, and spawns
    end)
    assert.equal("canceled", t:status())
    assert.is_false(ran)
    assert.equal(am.E_CANCELED, h.error_of(function() t:join() end))
    assert.equal("first", h.error_of(function() g:join() end))
    local late = g:spawn(function() ran = true end)
    assert.equal("canceled", late:status())
    assert.is_false(ran)
  end))

  it("when the coroutine owning it is closed cancels its tasks (it cannot wait then)",
    h.async(function()
      local inner
      local owner = am.spawn(function()
        local g <close> = am.group()
        inner = g:spawn(function() am.sleep(1000) end)
        am.sleep(1000)
      end)
      assert.equal("waiting", inner:status())
      owner:cancel()
      assert.equal("canceled", owner:status())
      assert.equal("canceled", inner:status())
    end))
end)

describe("nested groups", function()
  it("pass a failure up: the inner join raises in the outer task, which fails its group",
    h.async(function()
      local outer = am.group()
      local sibling = outer:spawn(function() am.sleep(1000) end)
      local inner_other
      outer:spawn(function()
        local inner <close> = am.group()
        inner_other = inner:spawn(function() am.sleep(1000) end)
        inner:spawn(function() am.sleep(1); error("deep down", 0) end)
      end)
      local ok, err = pcall(outer.join, outer)
      assert.is_false(ok)
      assert.equal("deep down", err)
      assert.equal("canceled", inner_other:status())
      assert.equal("canceled", sibling:status())
    end))

  it("cancel down: canceling the outer group cancels the tasks of the inner ones", h.async(function()
    local outer = am.group()
    local leaves, m = {}, am.Mutex.new()
    for _ = 1, 2 do
      outer:spawn(function()
        local inner <close> = am.group()
        for _ = 1, 2 do
          leaves[#leaves + 1] = inner:spawn(function()
            local r <close> = m:acquire()         -- one holds it, three wait
            am.sleep(1000)
          end)
        end
      end)                                -- each waits in its inner group's join
    end
    assert.equal(4, #leaves)
    assert.is_true(outer:cancel())
    for _, leaf in ipairs(leaves) do assert.equal("canceled", leaf:status()) end
    assert.is_false(m:isLocked())
    assert.same({ n = 0 }, table.pack(outer:join()))   -- canceled is no failure
  end))
end)

describe("group:cancel()", function()
  it("cancels every task, true if one had not ended; the group stays open", h.async(function()
    local g = am.group()
    local a = g:spawn(function() am.sleep(1000) end)
    assert.is_true(g:cancel())
    assert.equal("canceled", a:status())
    assert.is_false(g:cancel())
    local b = g:spawn(function() return "after" end)
    assert.equal("after", b:join())
  end))
end)

describe("a group's failure nobody joins", function()
  it("is reported at the end of the next loop turn, with the group; its task's own is not",
    h.async(function()
      local g = am.group()
      local reports = reports_during(function()
        g:spawn(function() am.sleep(1); error("group failure", 0) end)
        g:spawn(function() am.sleep(1000) end)
        h.sleep(30)
      end)
      assert.equal(1, #reports)
      assert.equal("group failure", reports[1].err)
      assert.is_true(rawequal(g, reports[1].task))
    end))

  it("reports a second failure on its own (the first canceled the rest, but one failed as it closed)",
    h.async(function()
      local g = am.group()
      local reports = reports_during(function()
        g:spawn(function()
          local _ <close> = setmetatable({}, { __close = function() error("second", 0) end })
          am.sleep(1000)
        end)
        g:spawn(function() am.sleep(1); error("first", 0) end)
        h.sleep(30)
      end)
      table.sort(reports, function(a, b) return tostring(a.err) < tostring(b.err) end)
      assert.equal(2, #reports)
      assert.equal("first", reports[1].err)
      assert.equal("second", reports[2].err)
    end))
end)
