-- Closed coroutines never get the lock; waiting coroutines, locks and error
-- values stay alive through full GC cycles in the middle of waits
-- (docs/semantics.md, Coroutines and the loop).
local h = require "helpers"
local am = require "async_mutex"

describe("a coroutine closed while queued", function()
  it("never receives the Mutex, which passes to the next waiter", h.left_free(am.Mutex.new, function(m)
    local log = {}
    local r = m:acquire()
    local b = h.acquirer(log, "b", m)
    local c = h.acquirer(log, "c", m)
    assert.is_true(coroutine.close(b.co))
    r()
    assert.is_true(m:isLocked())               -- c owns it
    h.tick(2)
    assert.same({ "c" }, log)
    c.release()
  end))

  it("leaves the Mutex free when it was the only waiter", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    coroutine.close(b.co)
    r()
    assert.is_false(m:isLocked())
    h.tick()
    assert.is_false(m:isLocked())
    assert.is_false(b.done)
  end))

  it("consumes no Semaphore value and does not block lighter waiters behind it", h.async(function()
    local s = am.Semaphore.new(0)
    local a = h.acquirer(nil, "a", s, 2)       -- the head
    local b = h.acquirer(nil, "b", s, 1)
    coroutine.close(a.co)
    s:release(1)                               -- not enough for a: a must be skipped anyway
    assert.equal(0, s:getValue())
    h.tick()
    assert.is_true(b.done)
    assert.equal(1, b.value)
    assert.is_false(a.done)
    b.release()
    s:release(1)
    assert.equal(2, s:getValue())
  end))

  it("is forgotten by pending() once it has been dropped", h.async(function()
    local base = am.pending()
    local m, r = h.held(am.Mutex.new())
    local b = h.acquirer(nil, "b", m)
    coroutine.close(b.co)
    r()
    h.tick()
    assert.equal(base, am.pending())
  end))

  it("is not kept alive by the lock once dropped", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local weak = setmetatable({}, { __mode = "v" })
    do
      local co = coroutine.create(function() m:acquire() end)
      coroutine.resume(co)
      weak[1] = co
      coroutine.close(co)
    end
    r()
    h.tick()
    h.gc()
    assert.is_nil(weak[1])
    assert.is_false(m:isLocked())
  end))

  it("is forgotten, like every waiter the module has finished with", h.async(function()
    local m, m2 = am.Mutex.new(), am.Mutex.new()
    local s = am.Semaphore.new(0)
    local wt = am.withTimeout(s, 1)
    local r, r2 = m:acquire(), m2:acquire()
    local weak = setmetatable({}, { __mode = "v" })
    local function track(fn)
      local co = coroutine.create(fn)
      assert(coroutine.resume(co))
      weak[#weak + 1] = co
    end
    track(function() local x = m:acquire(); x() end)              -- granted
    track(function() pcall(m2.acquire, m2) end)                   -- canceled
    local timed_out
    track(function() timed_out = select(2, pcall(wt.acquire, wt)) end) -- times out
    track(function() s:waitForUnlock() end)                       -- resolved
    assert.equal(4, #weak)
    r()
    m2:cancel()
    -- the timeout ends before the value comes: its deadline counts from
    -- the clock, and a loaded machine may fire a fixed sleep first, when
    -- the acquirer would take the value and the waitForUnlock stay queued
    h.wait_until(function() return timed_out ~= nil end)
    assert.equal(am.E_TIMEOUT, timed_out)
    s:setValue(1)
    h.tick()
    r2()
    h.gc()
    assert.is_nil(next(weak))
    assert.is_false(m:isLocked())
  end))

  it("is dropped from the waitForUnlock waiters without harm", h.async(function()
    local s = am.Semaphore.new(0)
    local w1 = h.waiter(nil, "w1", s)
    local w2 = h.waiter(nil, "w2", s)
    coroutine.close(w1.co)
    s:setValue(1)
    h.tick()
    assert.is_false(w1.done)
    assert.is_true(w2.done)
  end))

  it("waiting under withTimeout is neither resumed nor a problem when the deadline passes", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local wt = am.withTimeout(m, 5)
    local a = h.acquirer(nil, "a", wt)
    coroutine.close(a.co)
    h.sleep(20)
    assert.is_false(a.done)
    r()
    assert.is_false(m:isLocked())
    local b = h.acquirer(nil, "b", wt)
    assert.is_true(b.done)
    b.release()
  end))
end)

describe("garbage collection in the middle of waits", function()
  it("keeps waiting coroutines alive when only the lock references them", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local log = {}
    for i = 1, 5 do
      coroutine.wrap(function()
        local rel = m:acquire()
        log[#log + 1] = i
        h.gc()
        rel()
      end)()
    end
    h.gc()
    r()
    h.gc()
    h.wait_until(function() return #log == 5 end)
    assert.same({ 1, 2, 3, 4, 5 }, log)
  end))

  -- (each kind's waiters log what their grant gives: a Mutex waiter its
  -- number, a Semaphore waiter the value before its decrement)
  for _, case in ipairs {
    { "keeps a lock alive that only its releaser and its waiters reference",
      new = function() return am.Mutex.new() end,
      take = function(m, i) return i, m:acquire() end, logged = { 1, 2, 3 } },
    { "keeps a Semaphore alive that only its releaser and its waiters reference",
      new = function() return am.Semaphore.new(1) end,
      take = function(s) return s:acquire() end, logged = { 1, 1, 1 } },
  } do
    it(case[1], h.async(function()
      local log = {}
      local release
      do
        local lock = case.new()
        release = select(2, case.take(lock, 0))
        for i = 1, 3 do
          coroutine.wrap(function()
            local v, rel = case.take(lock, i)
            log[#log + 1] = v
            rel()
          end)()
        end
      end
      h.gc()
      release()
      h.gc()
      h.wait_until(function() return #log == 3 end)
      assert.same(case.logged, log)
    end))
  end

  for _, kind in ipairs { "Mutex", "Semaphore" } do
    it("keeps a " .. kind .. " alive that only the releaser of a waited grant references", h.async(function()
      local weak = setmetatable({}, { __mode = "v" })
      local waited_release
      do
        local lock = kind == "Mutex" and am.Mutex.new() or am.Semaphore.new(1)
        weak.lock = lock
        local first = select(-1, lock:acquire())
        coroutine.wrap(function()
          waited_release = select(-1, lock:acquire())   -- waits: the waiter is handed out
        end)()
        first()
      end
      h.wait_until(function() return waited_release ~= nil end)
      h.gc()
      assert.is_not_nil(weak.lock)            -- the releaser keeps it
      assert.is_true(weak.lock:isLocked())
      waited_release()
      assert.is_false(weak.lock:isLocked())
      assert.matches("^async_mutex%.Releaser %(released%)", tostring(waited_release))
      waited_release = nil
      h.gc()
      assert.is_nil(weak.lock)                -- and nothing else does
    end))
  end

  it("keeps a custom cancel error alive that only the lock references", h.async(function()
    local seen = setmetatable({}, { __mode = "k" })
    local m
    do
      local e = { tag = "cancel" }
      seen[e] = true
      m = am.Mutex.new(e)
    end
    h.gc()
    local r = m:acquire()
    local a = h.acquirer(nil, "a", m)
    h.gc()
    m:cancel()
    h.gc()
    h.tick()
    assert.is_table(a.err)
    assert.equal("cancel", a.err.tag)
    assert.is_true(seen[a.err])
    r()
  end))

  it("keeps a withTimeout object, its error and its waiter alive while the deadline is pending", h.holding(am.Mutex.new, function(m)
    local result
    h.spawn(function()
      local wt = am.withTimeout(m, 15, { tag = "timeout" })
      local ok, err = pcall(wt.acquire, wt)
      result = { ok, err }
    end)
    for _ = 1, 3 do
      h.gc()
      h.sleep(2)
    end
    h.wait_until(function() return result ~= nil end, 1000)
    assert.is_false(result[1])
    assert.equal("timeout", result[2].tag)
  end))

  it("keeps a coroutine waiting under withTimeout alive when only the module references it", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local result
    do
      local wt = am.withTimeout(m, 1000, { tag = "t" })
      coroutine.wrap(function()
        local rel = wt:acquire()
        result = "granted"
        rel()
      end)()
    end
    h.gc()
    h.sleep(2)
    h.gc()
    r()
    h.wait_until(function() return result ~= nil end)
    assert.equal("granted", result)
  end))

  it("keeps a custom tryAcquire error alive that only the decorator references", h.holding(am.Mutex.new, function(m)
    local ta = am.tryAcquire(m, { tag = "busy" })
    h.gc()
    local ok, err = pcall(ta.acquire, ta)
    assert.is_false(ok)
    assert.equal("busy", err.tag)
  end))

  it("collects an abandoned Semaphore with waiters without crashing or resuming them", h.async(function()
    local log, cos = {}, {}
    do
      local s = am.Semaphore.new(0)
      for i = 1, 3 do
        cos[i] = coroutine.create(function()
          s:acquire()
          log[#log + 1] = i
        end)
        assert(coroutine.resume(cos[i]))
      end
      cos[4] = coroutine.create(function()
        pcall(s.waitForUnlock, s, 2)
        log[#log + 1] = "w"
      end)
      assert(coroutine.resume(cos[4]))
    end
    h.gc()
    h.tick()
    h.gc()
    assert.same({}, log)
    -- they would wait for ever (am.run, under h.async, says so): closed
    for _, co in ipairs(cos) do assert(coroutine.close(co)) end
  end))

  it("survives an aggressive incremental collector through a mixed workload", function()
    local prev = collectgarbage("incremental", 1, 1000)
    local ok, err = pcall(h.run, function()
      local s = am.Semaphore.new(2)
      local m = am.Mutex.new({ "custom cancel" })
      local wt = am.withTimeout(s, 5, { "custom timeout" })
      local done, outcomes = 0, {}
      for i = 1, 60 do
        h.spawn(function()
          if i % 4 == 0 then
            local okk, e, rel = pcall(wt.acquire, wt, 3, i % 3)
            outcomes[#outcomes + 1] = okk and "granted" or e[1]
            if okk then rel() end
          elseif i % 4 == 1 then
            local okk, e = pcall(m.runExclusive, m, function()
              h.sleep(1)
              return "ran"
            end, i % 5)
            outcomes[#outcomes + 1] = okk and e or e[1]
          elseif i % 4 == 2 then
            s:waitForUnlock(1, i % 2)
            outcomes[#outcomes + 1] = "waited"
          else
            local _, rel = s:acquire(1, i % 3)
            h.sleep(1)
            rel()
            outcomes[#outcomes + 1] = "acquired"
          end
          done = done + 1
        end)
        if i == 30 then m:cancel() end
      end
      h.wait_until(function() return done == 60 end, 3000)
      local count = {}
      for _, o in ipairs(outcomes) do count[o] = (count[o] or 0) + 1 end
      assert.equal(15, count.acquired)
      assert.equal(15, count.waited)
      assert.equal(15, (count.ran or 0) + (count["custom cancel"] or 0))
      assert.equal(15, (count.granted or 0) + (count["custom timeout"] or 0))
      assert.equal(2, s:getValue())
      assert.is_false(m:isLocked())
    end)
    if prev == "generational" then collectgarbage("generational") end
    if not ok then error(err, 0) end
  end)
end)
