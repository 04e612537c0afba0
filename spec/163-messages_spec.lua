-- The words of two usage errors (docs/api.md, Errors): a request made where its
-- coroutine cannot yield says so, rather than "outside a coroutine"; an
-- unknown option lists the options taken and suggests the one meant when
-- one is near.  One owner each in the C core (src/core/args/args.c), which the Lua
-- modules use (async_mutex/checks.lua).
local h = require "helpers"
local am = require "async_mutex"
local checks = require "async_mutex.checks"

local CANNOT = h.CANNOT_YIELD

describe("a request where the coroutine cannot yield", function()
  -- every way a request may wait, and what each attempts
  local function requests()
    local m, s, rw = am.Mutex.new(), am.Semaphore.new(1), am.RWLock.new()
    local km, re = am.KeyedMutex.new(), am.ReentrantMutex.new()
    local t = am.spawn(function() am.sleep(1) end)
    local g = am.group()
    g:spawn(function() am.sleep(1) end)
    return {
      { function() m:acquire() end, "acquire a mutex" },
      { function() m:waitForUnlock() end, "wait for a mutex" },
      { function() m:runExclusive(print) end, "acquire a mutex" },
      { function() s:acquire() end, "acquire a semaphore" },
      { function() am.withTimeout(s, 10):acquire() end, "acquire a semaphore" },
      { function() rw:acquireRead() end, "acquire a readers-writer lock" },
      { function() km:acquire("k") end, "acquire a mutex" },
      { function() re:acquire() end, "acquire a reentrant mutex" },
      { function() am.sleep(1) end, "sleep" },
      { function() t:join() end, "join a task" },
      { function() g:join() end, "join a group" },
    }, function() t:join(); g:join() end
  end

  it("says so, in a string.gsub callback, a metamethod and a table.sort comparator, and changes nothing",
    h.async(function()
      local cases, finish = requests()
      local base = am.pending()
      for _, case in ipairs(cases) do
        local fn, act = case[1], case[2]
        local in_gsub, in_meta, in_sort
        ("x"):gsub(".", function() in_gsub = h.error_of(fn) end)
        local _ = tostring(setmetatable({}, { __tostring = function()
          in_meta = h.error_of(fn)
          return ""
        end }))
        table.sort({ 2, 1 }, function(a, b) in_sort = in_sort or h.error_of(fn); return a < b end)
        for _, err in ipairs({ in_gsub, in_meta, in_sort }) do
          assert.equal("attempt to " .. act .. CANNOT, err)
        end
      end
      assert.equal(base, am.pending())
      finish()
    end))

  it("is outside a coroutine on the main thread, a luv callback's too", h.async(function()
    local cases, finish = requests()
    local uv = require "luv"
    local errs
    local timer = uv.new_timer()
    timer:start(0, 0, function()
      timer:close()
      errs = {}
      for i, case in ipairs(cases) do errs[i] = h.error_of(case[1]) end
    end)
    h.wait_until(function() return errs ~= nil end)
    for i, case in ipairs(cases) do
      assert.equal("attempt to " .. case[2] .. " outside a coroutine", errs[i])
    end
    finish()
  end))

  it("is worded by core.cannot_yield for the Lua modules, nil where the coroutine can yield",
    h.async(function()
      assert.is_nil(checks.cannot_yield("acquire a Redis lock"))
      local got
      ("x"):gsub(".", function() got = checks.cannot_yield("acquire a Redis lock") end)
      assert.equal("attempt to acquire a Redis lock" .. CANNOT, got)
    end))

  it("is said by a Redis lock too (at the caller's line, before Redis is asked)", function()
    local R = require "lock_redis"
    local server = R.server()
    local ok, err = pcall(h.run, function()
      local c = server:client()
      local rm = am.RedisMutex.new(c, "spec163")
      assert.equal("attempt to acquire a Redis lock" .. CANNOT, h.cannot_yield_error(function() rm:acquire() end))
      c:close()
    end)
    server:stop()
    assert(ok, err)
  end)
end)

describe("an unknown option", function()
  local function complaint(options, known)
    return checks.unknown_option(options, known)
  end
  local KNOWN = { maxPending = true, cancelError = true, maxPendingError = true,
    onLost = true, renewInterval = true, ttl = true }
  local LIST = "options: cancelError, maxPending, maxPendingError, onLost, renewInterval, ttl"

  it("lists the options taken, sorted, when none is near", function()
    assert.equal("unknown option 'bogus'; " .. LIST, complaint({ bogus = 1 }, KNOWN))
    assert.equal("unknown option '1'; " .. LIST, complaint({ 5 }, KNOWN))
    assert.equal("unknown option 'true'; " .. LIST, complaint({ [true] = 1 }, KNOWN))
  end)

  for _, case in ipairs({
    { "a letter left out", "maxPendng", "maxPending" },
    { "a letter too many", "ttll", "ttl" },
    { "two letters swapped", "tll", "ttl" },
    { "two neighbours swapped", "maxPendingErorr", "maxPendingError" },
    { "a wrong case", "onlost", "onLost" },
    { "a prefix", "renew", "renewInterval" },
    { "a longer word", "ttlMs", "ttl" },
  }) do
    it("suggests the option meant for " .. case[1], function()
      assert.equal(("unknown option '%s'; did you mean '%s'? %s"):format(case[2], case[3], LIST),
        complaint({ [case[2]] = 1 }, KNOWN))
    end)
  end

  it("suggests nothing far off, nor for a short key or a key that is no string", function()
    assert.equal("unknown option 'xyz'; " .. LIST, complaint({ xyz = 1 }, KNOWN))
    assert.equal("unknown option 'waiterTimeout'; " .. LIST, complaint({ waiterTimeout = 1 }, KNOWN))
    assert.equal("unknown option 't'; " .. LIST, complaint({ t = 1 }, KNOWN))
  end)

  it("reads alike from the core's option tables and the Lua modules'", function()
    assert.equal("bad argument #1 to 'new' (unknown option 'maxPendng'; did you mean 'maxPending'?"
      .. " options: cancelError, maxPending, maxPendingError)",
      h.error_of(function() am.KeyedMutex.new({ maxPendng = 1 }) end))
    assert.equal("bad argument #2 to 'optimistic' (unknown option 'maxAttempt'; did you mean"
      .. " 'maxAttempts'? options: baseDelay, conflictError, maxAttempts, maxDelay, random, sleep)",
      h.error_of(function() am.optimistic(print, { maxAttempt = 1 }) end))
  end)

  it("is nil when every key is known, and keys with a false value are not known", function()
    assert.is_nil(complaint({ ttl = 1 }, KNOWN))
    assert.equal("unknown option 'ttl'; options: onLost", complaint({ ttl = 1 }, { ttl = false, onLost = true }))
  end)
end)
