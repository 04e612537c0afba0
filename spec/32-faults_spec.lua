-- Fault cases: errors in runExclusive and in resumed coroutines, the loop
-- stopped and restarted, holders closed or collected while holding, the
-- module loaded twice, locks reachable only through their waiters
-- (docs/semantics.md, Coroutines and the loop).
local h = require "helpers"
local uv = require "luv"
local am = require "async_mutex"

local with_handler = h.with_handler

describe("an error raised in runExclusive", function()
  -- error values of every kind: each must come out unchanged (rawequal)
  local VALUES = { "plain", { "table" }, 42, false, setmetatable({}, { __tostring = function() return "obj" end }) }

  it("before any yield releases the lock before the error leaves, then raises the same value", h.async(function()
    -- Catches: a runExclusive that releases only through a <close>
    -- variable or after pcall returns to a caller's handler: xpcall's
    -- message handler (which runs where the error is raised again) would
    -- still see the lock held; and an error value wrapped or stringified.
    local m = am.Mutex.new()
    local s = am.Semaphore.new(3)
    for _, e in ipairs(VALUES) do
      local seen_locked
      local handler = function(err) seen_locked = m:isLocked(); return err end
      local ok, err = xpcall(m.runExclusive, handler, m, function()
        assert.is_true(m:isLocked())
        error(e, 0)
      end)
      assert.is_false(ok)
      assert.is_true(rawequal(e, err), tostring(e))
      assert.is_false(seen_locked)             -- released before the error left
      assert.is_false(m:isLocked())
      local value
      ok, err = pcall(s.runExclusive, s, function(v) value = v; error(e, 0) end, 2)
      assert.is_false(ok)
      assert.is_true(rawequal(e, err))
      assert.equal(3, value)
      assert.equal(3, s:getValue())
    end
    -- an error with a position keeps it; error(nil) stays nil
    local ok, err = pcall(m.runExclusive, m, function() error("where") end)
    assert.is_false(ok)
    assert.is_truthy(err:match("^[^:]+:%d+: where$"), err)
    assert.same({ false, nil }, { pcall(m.runExclusive, m, function() error(nil) end) })
    assert.is_false(m:isLocked())
  end))

  it("after yields releases the lock and raises the same value; the waiters behind get the lock in order", h.async(function()
    -- Catches: a continuation that loses the error (returns normally) or
    -- the lock (never releases) when fn fails after being resumed, the
    -- case Lua 5.4 routes through the continuation with an error status.
    local m = am.Mutex.new()
    local s = am.Semaphore.new(2)
    for _, e in ipairs(VALUES) do
      local log = {}
      local out = {}
      h.spawn(function()
        out.m = { pcall(m.runExclusive, m, function()
          h.tick()
          local ok = pcall(h.sleep, 1)         -- a pcall around a yield inside fn
          assert(ok)
          error(e, 0)
        end) }
        out.locked = m:isLocked()
      end)
      local b = h.acquirer(log, "b", m)
      local c = h.acquirer(log, "c", m)
      h.wait_until(function() return out.m ~= nil end, 1000)
      assert.is_false(out.m[1])
      assert.is_true(rawequal(e, out.m[2]))
      assert.is_true(out.locked)               -- already handed to b
      h.granted_in_turn(log, b, c)
      assert.is_false(m:isLocked())

      local sv
      h.spawn(function()
        sv = { pcall(s.runExclusive, s, function() h.sleep(1); error(e, 0) end, 2, 1) }
      end)
      local d = h.acquirer(nil, "d", s, 2)
      h.wait_until(function() return sv ~= nil end, 1000)
      assert.is_true(rawequal(e, sv[2]))
      h.tick()
      assert.is_true(d.ok)
      d.release()
      assert.equal(2, s:getValue())
    end
  end))

  it("inside nested runExclusive over two locks, reached after waiting through withTimeout, releases both", h.async(function()
    local outer, inner = am.Mutex.new(), am.Semaphore.new(1)
    local wo, wi = am.withTimeout(outer, 2000), am.withTimeout(inner, 2000)
    local e = { "inner failure" }
    local ro = outer:acquire()
    local _, ri = inner:acquire()
    local res
    h.spawn(function()
      res = { pcall(wo.runExclusive, wo, function()
        return wi:runExclusive(function()
          h.sleep(1)
          error(e)
        end)
      end) }
    end)
    h.tick()
    ro()                                       -- the outer lock is granted after a wait
    h.tick()
    assert.is_nil(res)
    ri()                                       -- and the inner one
    h.wait_until(function() return res ~= nil end, 1000)
    assert.is_false(res[1])
    assert.is_true(rawequal(e, res[2]))
    assert.is_false(outer:isLocked())
    assert.equal(1, inner:getValue())
  end))
end)

describe("an error escaping a coroutine resumed by the module", function()
  it("is reported with its exact value, the rest of a large batch runs, and the locks stay consistent", h.async(function()
    -- 3,000 coroutines are granted by one setValue (more than one idle
    -- callback's worth); every third dies with a table error while holding
    -- its permit in a <close> releaser, which the module's closing of the
    -- dead coroutine gives back.  Catches: an error that stops the batch,
    -- is swallowed, crashes the loop ("Uncaught Error"), or a dead
    -- coroutine whose to-be-closed releaser never runs.
    local N = h.load(3000)
    local base = am.pending()
    local s = am.Semaphore.new(0)
    local reports, log, errs = {}, {}, {}
    local tracebacks = 0
    with_handler(function(err, tb)
      reports[#reports + 1] = err
      if type(tb) == "string" and tb:find("stack traceback", 1, true) then
        tracebacks = tracebacks + 1
      end
    end, function()
      for i = 1, N do
        coroutine.wrap(function()
          local _, r <close> = s:acquire()
          log[#log + 1] = i
          if i % 3 == 0 then
            errs[i] = { i }
            error(errs[i])
          end
        end)()
      end
      s:setValue(N)
      assert.equal(0, s:getValue())
      h.wait_until(function() return #log == N end, 5000)
      h.tick()
    end)
    for i = 1, N do assert.equal(i, log[i]) end
    assert.equal(N // 3, #reports)
    assert.equal(N // 3, tracebacks)
    for k, err in ipairs(reports) do assert.is_true(rawequal(errs[3 * k], err)) end
    assert.equal(N, s:getValue())              -- every permit back, the dead ones' too
    assert.equal(base, am.pending())
  end))

  it("leaves the lock held when the dead coroutine held it in a plain local, as documented", h.async(function()
    -- docs/api.md, Conventions: a lock is released by its releaser or by
    -- release(); nothing releases on the holder's death unless the
    -- releaser is a <close> variable.  Catches an implementation that
    -- silently releases (or double-releases) on its own.
    local m, r = h.held(am.Mutex.new())
    h.with_errors(function(reports)
      coroutine.wrap(function()
        local mine = m:acquire()               -- not <close>
        local _ = mine
        error("died holding", 0)
      end)()
      local b = h.acquirer(nil, "b", m)
      r()                                      -- granted to the doomed coroutine
      h.tick(3)
      assert.same({ "died holding" }, reports)
      assert.is_true(m:isLocked())
      assert.is_false(b.done)                  -- still queued behind the dead holder
      m:release()                              -- the way out
      h.tick()
      assert.is_true(b.ok)
      b.release()
    end)
    assert.is_false(m:isLocked())
  end))

  it("goes to stderr by default, also for non-string values and a failing handler, and the process carries on", function()
    -- Catches: luv's "Uncaught Error" exit, an error that ends the batch,
    -- a table error that crashes the reporter (tostring of a table).
    local res = h.subprocess([[
      local uv = require "luv"
      local am = require "async_mutex"
      local s = am.Semaphore.new(0)
      local ran = 0
      for i = 1, 2500 do
        coroutine.wrap(function()
          local _, r <close> = s:acquire()
          ran = ran + 1
          if i == 7 then error({ "a table" }) end
          if i == 1800 then error("string-XYZ") end
        end)()
      end
      s:setValue(2500)
      uv.run()
      io.write(ran, " ", s:getValue(), "\n")
      am.setErrorHandler(function() error("handler-ABC") end)
      local m = am.Mutex.new()
      local hold = coroutine.wrap(function() local r = m:acquire(); coroutine.yield(); r() end)
      hold()
      coroutine.wrap(function() local r <close> = m:acquire(); error("again") end)()
      coroutine.wrap(function() local r <close> = m:acquire(); io.write("next ran\n") end)()
      hold()
      uv.run()
      io.write("locked ", tostring(m:isLocked()), "\n")
    ]])
    assert.equal(0, res.rc)
    assert.equal("2500 2500\nnext ran\nlocked false\n", res.stdout)
    assert.is_truthy(res.stderr:find("(error object is a table value)", 1, true), res.stderr)
    assert.is_truthy(res.stderr:find("string-XYZ", 1, true), res.stderr)
    assert.is_truthy(res.stderr:find("handler-ABC", 1, true), res.stderr)
    assert.is_truthy(res.stderr:find("stack traceback", 1, true), res.stderr)
    assert.is_falsy(res.stderr:find("Uncaught Error", 1, true), res.stderr)
  end)
end)

describe("uv.stop() in the middle of a run", function()
  -- These run uv.run() themselves (h.async would take uv.stop() for a
  -- body that never finished); errors of resumed coroutines are collected.
  local function capture(body)
    uv.update_time()                           -- deadlines count from now, not the last turn
    local reports = {}
    with_handler(function(err) reports[#reports + 1] = tostring(err) end, body)
    assert.same({}, reports)
  end

  it("leaves the undelivered wake-ups for the next uv.run(), which delivers them in order", function()
    -- Catches: a scheduler that drops its ready list, or stops its idle
    -- handle for good, when the loop is stopped with work pending.
    capture(function()
      local N = h.load(5000)
      local m = am.Mutex.new()
      local log = {}
      local release = h.holder(m)
      local stop_at = math.max(1, N // 3)
      for i = 1, N do
        coroutine.wrap(function()
          local r = m:acquire()
          log[#log + 1] = i
          if i == stop_at then uv.stop() end
          r()
        end)()
      end
      release()                                -- from main code
      local idle = h.run_loop(5000)
      assert.is_true(idle)                     -- returned by itself (uv.stop), not the deadline
      assert.is_true(#log >= stop_at)
      for i = 1, #log do assert.equal(i, log[i]) end
      if #log < N then                         -- stopped mid-way: more to come
        assert.is_true(m:isLocked())
      end
      assert.is_true(h.run_loop(5000))
      assert.equal(N, #log)
      for i = 1, N do assert.equal(i, log[i]) end
      assert.is_false(m:isLocked())
      assert.same({}, h.active_handles())
    end)
  end)

  it("keeps withTimeout deadlines and grants across a stop, and delivers with uv.run('nowait') too", function()
    capture(function()
      -- The deadlines count in loop time from the acquires (docs/semantics.md,
      -- Timeouts) and the loop is stopped 1 ms of loop time later.  A process
      -- that stalls for longer in between (a busy machine, a long collection)
      -- finds the deadlines passed in that same timer phase: the waiters time
      -- out then, rightly, and the run says nothing about deadlines kept
      -- across a stop.  So the stop's loop time is compared with the
      -- deadlines, and a stalled attempt is checked for that outcome and
      -- made again.
      local MS = 100 * h.TIME_SCALE
      local function attempt()
        local m = am.Mutex.new()
        local wt = am.withTimeout(m, MS)
        local release = h.holder(m)
        local out = {}
        local due = uv.now() + MS              -- the waiters' deadline
        for _ = 1, 3 do
          coroutine.wrap(function()
            local ok, err = pcall(wt.acquire, wt)
            out[#out + 1] = ok and "granted" or err
            if ok then coroutine.yield() end   -- keeps the lock: the others time out
          end)()
        end
        local stopped_at
        local t = uv.new_timer()
        t:start(1, 0, function()
          t:close()
          stopped_at = uv.now()
          release()                            -- the first waiter is granted
          uv.stop()
        end)
        uv.run()
        local kept = stopped_at < due
        if kept then
          assert.is_true(#out <= 1, table.concat(out, ","))  -- the deadlines are still ahead
          uv.stop()                            -- and a stop before uv.run()
          uv.run()
          assert.is_true(h.run_loop(3000))     -- the deadlines still pass
        end
        assert.same({ "granted", am.E_TIMEOUT, am.E_TIMEOUT }, out)
        assert.is_true(m:isLocked())
        m:release()
        assert.same({}, h.active_handles())
        return kept
      end
      local kept = false
      for _ = 1, 5 do
        kept = attempt()
        if kept then break end
      end
      assert.is_true(kept, "the process stalled past the deadlines in 5 attempts out of 5")

      -- many grants drained by repeated uv.run("nowait")
      local s = am.Semaphore.new(0)
      local log = {}
      local N = h.load(3000)
      for i = 1, N do coroutine.wrap(function() s:acquire(); log[#log + 1] = i end)() end
      s:setValue(N)
      local runs = 0
      while #log < N and runs < 10000 do uv.run("nowait"); runs = runs + 1 end
      assert.equal(N, #log)
      for i = 1, N do assert.equal(i, log[i]) end
      assert.same({}, h.active_handles())
    end)
  end)
end)

describe("a holder closed or collected while holding", function()
  it("closed with a <close> releaser gives the lock back, also from inside a suspended runExclusive", h.async(function()
    local s = am.Semaphore.new(3)
    local co = coroutine.create(function()
      local _, r <close> = s:acquire(2)
      coroutine.yield()
    end)
    assert(coroutine.resume(co))
    local w = h.acquirer(nil, "w", s, 3)
    assert.equal(1, s:getValue())
    assert.is_true(coroutine.close(co))
    h.tick()
    assert.is_true(w.ok)                       -- 3 back, then taken by w
    w.release()
    assert.equal(3, s:getValue())

    local m = am.Mutex.new()
    local ran_after = false
    local re = coroutine.create(function()
      m:runExclusive(function() coroutine.yield("inside") end)
      ran_after = true
    end)
    assert.same({ true, "inside" }, { coroutine.resume(re) })
    local b = h.acquirer(nil, "b", m)
    assert.is_true(coroutine.close(re))
    assert.is_false(ran_after)
    h.tick()
    assert.is_true(b.ok)                       -- runExclusive's own <close> released it
    b.release()
    assert.is_false(m:isLocked())
  end))

  it("closed without <close> leaves the lock held, as documented; its releaser or release() still frees it", h.async(function()
    -- docs/api.md, Conventions: "a coroutine that is collected, or closed
    -- without a <close> releaser, while holding a lock leaves it locked".
    -- Catches an implementation that tracks owners and releases (or
    -- corrupts the queue) when the owner goes away, and a releaser that
    -- stops working once its coroutine is gone.
    local m = am.Mutex.new()
    local s = am.Semaphore.new(2)
    local kept = {}
    local co = coroutine.create(function()
      local r = m:acquire()
      local _, rs = s:acquire(2)
      kept.r, kept.rs = r, rs
      coroutine.yield()
    end)
    assert(coroutine.resume(co))
    local log = {}
    local a = h.acquirer(log, "a", m)
    local b = h.acquirer(log, "b", s, 1)
    assert.is_true(coroutine.close(co))
    h.tick(3)
    assert.same({}, log)
    assert.is_true(m:isLocked())
    assert.equal(0, s:getValue())
    kept.r()                                   -- the releaser outlives its coroutine
    kept.rs()
    h.tick()
    assert.is_true(a.ok and b.ok)
    a.release(); b.release()
    assert.is_false(m:isLocked())
    assert.equal(2, s:getValue())
  end))

  it("collected leaves the lock held (a <close> releaser does not run on collection); release() frees it", h.async(function()
    -- Lua runs no to-be-closed variable of a coroutine that is collected,
    -- and our releaser has no __gc.  Catches a releaser whose __gc
    -- releases (behind the program's back, at a time chosen by the
    -- collector) and any dangling reference to the collected holder.
    local m = am.Mutex.new()
    local s = am.Semaphore.new(5)
    local weak = setmetatable({}, { __mode = "v" })
    do
      local plain = coroutine.create(function()
        local r = m:acquire()
        local _ = r
        coroutine.yield()
      end)
      local closing = coroutine.create(function()
        local _, r <close> = s:acquire(4)
        coroutine.yield()
      end)
      assert(coroutine.resume(plain))
      assert(coroutine.resume(closing))
      weak[1], weak[2] = plain, closing
    end
    local a = h.acquirer(nil, "a", m)
    local b = h.acquirer(nil, "b", s, 2)
    h.gc()
    h.gc()
    assert.is_nil(weak[1])                     -- both holders are gone
    assert.is_nil(weak[2])
    h.tick(2)
    assert.is_true(m:isLocked())
    assert.equal(1, s:getValue())
    assert.is_false(a.done or b.done)
    m:release()
    s:release(4)
    h.tick()
    assert.is_true(a.ok and b.ok)
    a.release(); b.release()
    assert.is_false(m:isLocked())
    assert.equal(5, s:getValue())
  end))
end)

describe("the module required twice", function()
  it("gives two copies that share the scheduler, the locks and their waiters on one loop", h.async(function()
    -- Catches per-copy state kept in C statics or in each copy's own
    -- tables: two schedulers fighting over one loop, a lock of one copy
    -- rejected by the other's decorators, waiters of a dropped copy lost.
    local am0, core0 = package.loaded.async_mutex, package.loaded["async_mutex.core"]
    local function fresh()
      package.loaded.async_mutex = nil
      package.loaded["async_mutex.core"] = nil
      return require "async_mutex"
    end
    local A = fresh()
    local B = fresh()
    assert.is_false(rawequal(A, B))
    local m = A.Mutex.new()
    local s = B.Semaphore.new(0)
    local r = m:acquire()
    local log = {}
    -- waiters on A's lock through both copies' methods and decorators, in turn
    local w = {
      h.acquirer(log, "A1", m),
      h.acquirer(log, "B1", B.withTimeout(m, 5000)),
      h.acquirer(log, "A2", A.withTimeout(m, 5000)),
      h.acquirer(log, "B2", m),
    }
    local t = h.acquirer(log, "Btimeout", B.withTimeout(m, 2))
    local sw = h.acquirer(log, "S", A.withTimeout(s, 5000))
    assert.equal(A.pending(), B.pending())
    h.wait_until(function() return t.done end, 1000)
    assert.equal(A.E_TIMEOUT, t.err)
    assert.same({ false, B.E_ALREADY_LOCKED }, { pcall(B.tryAcquire(m).acquire, B.tryAcquire(m)) })
    -- one error handler per Lua state: B's handler hears A's coroutines
    local heard
    local prev = B.setErrorHandler(function(err) heard = err end)
    coroutine.wrap(function() m:acquire(); error("from A's lock", 0) end)()
    -- drop copy A: only its decorated objects and its locks remain
    A = nil
    h.gc()
    r()
    for i = 1, 4 do
      h.tick()
      assert.equal(i + 1, #log)                -- Btimeout, then one per hand-off
      w[i].release()
    end
    h.tick()
    assert.equal("from A's lock", heard)
    B.setErrorHandler(prev)
    assert.same({ "Btimeout", "A1", "B1", "A2", "B2" }, log)
    assert.is_true(m:isLocked())               -- held by the dead coroutine (plain local)
    m:release()
    s:release()
    h.tick()
    assert.is_true(sw.ok)
    sw.release()
    assert.equal(1, s:getValue())
    assert.is_false(m:isLocked())
    assert.equal(0, h.count_handles("uv_idle_t", true))
    package.loaded.async_mutex, package.loaded["async_mutex.core"] = am0, core0
  end))
end)

describe("a lock reachable only through its waiters", function()
  it("is kept alive by them through full collections, serves them, and is collected afterwards", h.async(function()
    -- Catches: a lock collected (its queue freed) while coroutines wait
    -- in it, which is a use after free when they are served (ASan and
    -- valgrind see it; here the waiters would never run or crash), and
    -- the opposite: a lock anchored for good once it had waiters.
    local weak = setmetatable({}, { __mode = "v" })
    local log = {}
    do
      local m = am.Mutex.new()
      local r = m:acquire()
      for i = 1, 3 do
        coroutine.wrap(function()
          local x = m:acquire()
          log[#log + 1] = i
          x()
        end)()
      end
      weak.lock = m
    end                                        -- the releaser is dropped too
    h.gc()
    h.tick()
    h.gc()
    assert.is_not_nil(weak.lock)               -- its waiters keep it
    assert.same({}, log)
    weak.lock:release()                        -- found again, released without the releaser
    h.wait_until(function() return #log == 3 end, 1000)
    assert.same({ 1, 2, 3 }, log)
    h.gc()
    assert.is_nil(weak.lock)                   -- and collected once nobody waits

    -- a releaser kept elsewhere, waitForUnlock waiters and timed waiters
    local outcome = {}
    local releaser
    do
      local s = am.Semaphore.new(2)
      local _
      _, releaser = s:acquire(2)
      for i = 1, 2 do h.waiter(outcome, "u" .. i, s, 2) end
      local wt = am.withTimeout(s, 15)
      h.acquirer(outcome, "timed", wt, 1)
      h.acquirer(outcome, "plain", s, 1)
      weak.sem = s
    end
    h.gc()
    h.wait_until(function() return #outcome == 1 end, 1000)   -- the timeout fired
    h.gc()
    assert.same({ "timed" }, outcome)
    assert.is_not_nil(weak.sem)
    releaser()                                 -- value 2: plain granted, then u1 u2 wait
    h.tick()
    assert.same({ "timed", "plain" }, outcome)
    releaser = nil
    h.gc()
    assert.is_not_nil(weak.sem)                -- the unlock waiters still need it
    weak.sem:release(1)                        -- back to 2: u1, u2 resolved
    h.tick()
    table.sort(outcome)
    assert.same({ "plain", "timed", "u1", "u2" }, outcome)
    h.gc()
    assert.is_nil(weak.sem)
  end))
end)
