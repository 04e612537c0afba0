-- Re-entry from finalizers: a user's __gc runs at any allocation the module
-- makes, and may call the module back.  Nothing half-done is visible then:
-- no wake-up lost, no lock granted twice (docs/semantics.md, Re-entry).
-- Each case runs in a child process, so that a crash fails the test.
local h = require "helpers"

-- Runs 'body' (Lua source) in a child lua5.4 after a prelude that defines
-- v(msg) (records a violation) and hit() (counts a finalizer that ran
-- inside the module's request); the child prints its counts, which are
-- returned with the violations.
local function run(body, gcmode)
  local res = h.subprocess(([[
    local am = require "async_mutex"
    local uv = require "luv"
    collectgarbage(%q)
    -- a shorter pause in incremental mode: more cycles end (and run
    -- finalizers) during the trials, so that some fall inside a request
    if %q == "incremental" then collectgarbage("incremental", 150) end
    local bad, hits = {}, 0
    local function v(msg) bad[#bad + 1] = msg end
    local function hit()
      if debug.traceback():find("acquire") then hits = hits + 1 end
    end
    -- some allocations of varying count, so that a collector step falls
    -- at each point of the request in turn
    local function pad(n) local t = {} for i = 1, n do t[i] = {} end return t end
  ]]):format(gcmode, gcmode) .. body .. [[
    io.write(hits, " ", #bad, " ", tostring(bad[1]), "\n")
  ]], 120)
  h.clean_exit(res)
  local hits, nbad, first = res.stdout:match("^(%d+) (%d+) (.-)\n$")
  assert.is_not_nil(hits, res.stdout)
  return tonumber(hits), tonumber(nbad), first
end

local TRIALS = 3000          -- about 0.1 s a case

-- Under the default (generational) collector, these trials run a finalizer
-- inside the request a dozen times or more, always the same for a given
-- build; the incremental one hits it rarely, so it only checks for harm.
local function proves(hits, gcmode)
  if gcmode == "generational" then
    assert.is_true(hits > 0, "no finalizer ran inside acquire: the test proves nothing")
  end
end

for _, gcmode in ipairs({ "generational", "incremental" }) do
  describe("a finalizer run by a request's own allocation (" .. gcmode .. ")", function()
    it("that releases the mutex waited for: the waiter is granted, not stranded", function()
      local hits, nbad, first = run(([[
        for trial = 1, %d do
          local m = am.Mutex.new()
          local holder
          coroutine.wrap(function() holder = m:acquire() end)()
          local armed = true
          local co = coroutine.create(function() m:acquire()() end)
          for _ = 1, trial %% 50 do
            setmetatable({}, { __gc = function()
              if armed then armed = false; hit(); m:release() end
            end })
          end
          local keep = pad(trial %% 37)
          coroutine.resume(co)
          armed = false
          uv.run()
          if coroutine.status(co) ~= "dead" and not m:isLocked() then
            v("waiter queued on a free mutex")
          end
          if holder then holder() end
          uv.run()
          if am.pending() ~= 0 then v("pending " .. am.pending()) end
        end
      ]]):format(TRIALS), gcmode)
      proves(hits, gcmode)
      assert.equal(0, nbad, first)
    end)

    for _, what in ipairs({ "takes the key with tryAcquire", "releases the held key" }) do
      it("that " .. what .. " while a key's lock is looked up: one holder, count() = #keys()", function()
        local hits, nbad, first = run(([[
          local takes = %s
          for trial = 1, %d do
            local km = am.KeyedMutex.new()
            local fin_rel, holder
            if not takes then
              coroutine.wrap(function() holder = km:acquire("k910") end)()
            end
            local armed = true
            local co = coroutine.create(function()
              local rel = km:acquire("k910")
              if fin_rel or holder then v("two holders of k910") end
              if km:count() ~= #km:keys() then v("count() ~= #keys() while held") end
              if not km:isLocked("k910") then v("held but isLocked false") end
              rel()
            end)
            for _ = 1, trial %% 50 do
              setmetatable({}, { __gc = function()
                -- only one that runs inside the request acts
                if not armed or not debug.traceback():find("acquire") then
                  return
                end
                armed = false
                hit()
                if takes then
                  local try = am.tryAcquire(km)
                  local ok, r = pcall(try.acquire, try, "k910")
                  if ok then fin_rel = r end
                else
                  holder = nil
                  km:release("k910")
                end
              end })
            end
            local keep = pad(trial %% 37)
            coroutine.resume(co)
            armed = false
            if km:count() ~= #km:keys() then v("count() ~= #keys()") end
            if fin_rel then local r = fin_rel; fin_rel = nil; r() end
            if holder then local r = holder; holder = nil; r() end
            uv.run()
            if coroutine.status(co) ~= "dead" then v("waiter stranded") end
            if km:count() ~= 0 or am.pending() ~= 0 then
              v(("left: count %%d, pending %%d"):format(km:count(), am.pending()))
            end
          end
        ]]):format(tostring(what:find("tryAcquire") ~= nil), TRIALS), gcmode)
        proves(hits, gcmode)
        assert.equal(0, nbad, first)
      end)
    end
  end)
end

describe("a finalizer run by lua_close", function()
  -- G's finalizer uses the module at exit; 'first' creates G before the
  -- module is loaded, so that it runs after the module's own finalizers.
  local function script(first)
    local g = [[
      local G = {}
      setmetatable(G, { __gc = function()
        local out = {}
        local ok, err = pcall(coroutine.wrap(function() G.m:acquire() end))
        out[#out + 1] = tostring(ok) .. " " .. tostring(err):gsub("^.-:%d+: ", "")
        G.m:release()
        G.s:cancel()
        coroutine.close(G.co)
        io.write(table.concat(out, ", "), "\n")
      end })
    ]]
    return (first and g or "") .. [[
      local am = require "async_mutex"
      local uv = require "luv"
    ]] .. (first and "" or g) .. [[
      G.am, G.m, G.s = am, am.Mutex.new(), am.Semaphore.new(0)
      coroutine.wrap(function() G.m:acquire() end)()
      coroutine.wrap(function() G.m:acquire()() end)()   -- an anchor used, then freed
      G.m:release(); uv.run()
      coroutine.wrap(function() G.m:acquire() end)()
      coroutine.wrap(function() local d = am.withTimeout(G.m, 60000); pcall(d.acquire, d) end)()
      coroutine.wrap(function() pcall(G.s.acquire, G.s) end)()
      G.co = coroutine.create(function() G.s:waitForUnlock() end)
      coroutine.resume(G.co)
      print("bye", am.pending())
    ]]
  end

  for _, case in ipairs({
    { "after the module's own: a request to wait raises, releases and closes are safe", true },
    { "before the module's own, after the lock's: the same", false },
  }) do
    it(case[1], function()
      local res = h.subprocess(script(case[2]))
      h.clean_exit(res, "bye\t3\nfalse attempt to wait for a lock while the Lua state is closing\n")
    end)
  end
end)

describe("keyed locks and the collector", function()
  local am = require "async_mutex"

  it("collects a set that nothing refers to, with a key held or a value raised", function()
    local function round()
      for _ = 1, h.load(20000) do
        local km = am.KeyedMutex.new()
        coroutine.wrap(function() km:acquire("k") end)()    -- releaser dropped
        am.KeyedSemaphore.new(1):release("x", 3)
      end
      h.gc()
      return collectgarbage("count")
    end
    local first = round()
    round()
    local last = round()
    -- (the sets kept alive grew it by about 9 MB a round)
    assert.is_true(last - first < 1024, ("heap grew by %.0f KB"):format(last - first))
    local weak = setmetatable({}, { __mode = "v" })
    do
      local km, ks = am.KeyedMutex.new(), am.KeyedSemaphore.new(1)
      coroutine.wrap(function() km:acquire("k") end)()
      ks:release("x", 3)
      weak[1], weak[2] = km, ks
    end
    h.gc()
    assert.is_nil(weak[1])
    assert.is_nil(weak[2])
  end)

  it("keeps a set alive while a key has waiters: they are granted, never stranded", h.async(function()
    local weak = setmetatable({}, { __mode = "v" })
    local release, got
    local pending = am.pending()
    do
      local km = am.KeyedMutex.new()
      weak[1] = km
      release = km:acquire("k")
      coroutine.wrap(function() km:acquire("k")(); got = true end)()
    end
    h.gc()
    assert.is_not_nil(weak[1])
    release()
    h.tick()
    assert.is_true(got)
    assert.equal(0, weak[1]:count())
    assert.equal(pending, am.pending())
  end))
end)
