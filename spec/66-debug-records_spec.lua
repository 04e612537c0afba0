-- Debug mode's owner records as the C core keeps them (docs/debug.md, Owner
-- records): a grant and a release allocate nothing the collector sees, and
-- the records stay exact however holds come and go: many holders, many
-- locks, releases in any order, unscoped releases, and finalizers that take
-- and give back locks at any allocation (the records' one allocation
-- included: their table of anchors doubles when every slot is used).
local h = require "helpers"
local am = require "async_mutex"

after_each(function()
  am.debug.disable()
  collectgarbage("generational")
end)

--- Bytes Lua allocated for 'n' calls of 'body', the collector stopped.
local function allocated(n, body)
  body()                                      -- warm: method caches, slots
  collectgarbage("collect")
  collectgarbage("stop")
  local before = collectgarbage("count")
  for _ = 1, n do body() end
  local after = collectgarbage("count")
  collectgarbage("restart")
  return (after - before) * 1024
end

describe("owner records", function()
  it("an uncontended pair of every kind allocates no more with debug mode on than off", h.async(function()
    local m, s, rw = am.Mutex.new(), am.Semaphore.new(3), am.RWLock.new()
    local rm = am.ReentrantMutex.new()
    local function pairs_of_all()
      local r = m:acquire(); r()
      local _, rs = s:acquire(2); rs()
      local rr = rw:acquireRead(); rr()
      local rwr = rw:acquireWrite(); rwr()
      local rrm = rm:acquire(); rrm()
    end
    local off = allocated(200, pairs_of_all)
    am.debug.enable({ onReport = function() end })
    local on = allocated(200, pairs_of_all)
    assert.equal(off, on)
    assert.same({}, am.debug.holds())
  end))

  it("holds() names every hold of many coroutines on many locks, as they come and go in random order", h.async(function()
    am.debug.enable({ onReport = function() end })
    local seed = os.time()
    math.randomseed(seed)
    local locks, is_mutex = {}, {}
    for i = 1, 12 do
      locks[i] = i % 3 == 0 and am.Semaphore.new(4) or am.Mutex.new()
      is_mutex[locks[i]] = i % 3 ~= 0
    end
    local held = {}                           -- { co =, lock =, release = }
    local function check(step)
      local want = {}
      for _, x in ipairs(held) do
        local k = tostring(x.co) .. " " .. tostring(x.lock)
        want[k] = (want[k] or 0) + 1
      end
      local got = {}
      for _, v in ipairs(am.debug.holds()) do
        local k = tostring(v.holder) .. " " .. tostring(v.lock)
        got[k] = (got[k] or 0) + 1
      end
      assert.same(want, got, ("seed %d, step %d"):format(seed, step))
    end
    local function take()
      -- the running coroutine takes a free lock (tryAcquire), if it finds one
      for _, i in ipairs { math.random(#locks), math.random(#locks), math.random(#locks) } do
        local lock = locks[i]
        local ok, a, b = pcall(function() return am.tryAcquire(lock):acquire() end)
        if ok then
          held[#held + 1] = { co = coroutine.running(), lock = lock, release = b or a }
          return
        end
      end
    end
    local cos = {}
    for step = 1, 400 do
      local what = math.random(3)
      if what == 1 or #held == 0 then
        -- a new holder, or one that holds already takes another lock
        if #cos > 0 and math.random(2) == 1 then
          local co = cos[math.random(#cos)]
          if coroutine.status(co) == "suspended" then coroutine.resume(co) end
        else
          local co = coroutine.create(function()
            while true do take(); coroutine.yield() end
          end)
          cos[#cos + 1] = co
          coroutine.resume(co)
        end
      elseif what == 2 then
        local i = math.random(#held)
        local x = table.remove(held, i)
        assert.is_true(x.release())
      else
        -- an unscoped release of a held mutex ends its hold
        local i = math.random(#held)
        local x = held[i]
        if is_mutex[x.lock] then
          table.remove(held, i)
          x.lock:release()
        end
      end
      check(step)
    end
    for _, x in ipairs(held) do x.release() end
    held = {}
    check(0)
    for _, l in ipairs(locks) do assert.is_false(l:isLocked()) end
  end))

  it("stay exact when finalizers take and give back locks at the module's allocations", h.async(function()
    am.debug.enable({ onReport = function() end })
    local m = am.Mutex.new()
    local s = am.Semaphore.new(1000)
    local kept = {}                           -- holds taken by finalizers
    local function garbage()
      setmetatable({}, { __gc = function()
        local ok, a, b = pcall(function() return am.tryAcquire(s):acquire() end)
        if ok then
          if #kept < 40 then kept[#kept + 1] = b or a else (b or a)() end
        end
        local okm, rm = pcall(function() return am.tryAcquire(m):acquire() end)
        if okm then rm() end
      end })
    end
    collectgarbage("incremental", 1, 100)     -- a collector step at every allocation
    local mine = {}
    for i = 1, 120 do                         -- the slots double three times
      garbage()
      local _, r = s:acquire()
      mine[#mine + 1] = r
      if i % 7 == 0 then table.remove(mine, 1)() end
    end
    collectgarbage("generational")
    h.gc()
    assert.is_true(#kept > 0)                 -- finalizers held some
    local holds = am.debug.holds(s)
    assert.equal(#mine + #kept, #holds)
    assert.equal(1000 - #mine - #kept, s:getValue())
    for _, r in ipairs(mine) do r() end
    for _, r in ipairs(kept) do r() end
    assert.same({}, am.debug.holds())
    assert.is_false(m:isLocked())
    assert.equal(1000, s:getValue())
  end))
end)
