-- Keyed locks: throughput over many distinct keys and memory per
-- live key, for KeyedMutex and for the "map of mutexes by hand" that
-- async-mutex's maintainers suggest (a Lua table of Mutex by key, each
-- dropped when it is unlocked), built on the same module.  One JSON line.
--
--   lua5.4 bench/keyed.lua [N]     (from the repository root, with the
--   LUA_PATH/LUA_CPATH of `make bench`)

local uv = require "luv"
local am = require "async_mutex"

local N = tonumber(arg[1]) or 1000000
local now = function() return os.clock() * 1e9 end

local function full_gc() collectgarbage(); collectgarbage() end

-- The by-hand peer: a map key -> Mutex; the last one out drops the entry.
local function by_hand()
  local locks, waiting = {}, {}
  local set = {}
  function set.acquire(_, key)
    local m = locks[key]
    if not m then m = am.Mutex.new(); locks[key] = m end
    waiting[key] = (waiting[key] or 0) + 1
    local release = m:acquire()
    waiting[key] = waiting[key] - 1
    return function()
      release()
      if waiting[key] == 0 and not m:isLocked() then
        locks[key], waiting[key] = nil, nil
      end
    end
  end
  return set
end

local result = {}

local function measure(name, set)
  coroutine.wrap(function()
    -- distinct keys: each pair creates and drops the key's lock
    local t0 = now()
    for i = 1, N do local r = set:acquire(i); r() end
    result[name .. "_distinct_ns"] = (now() - t0) / N
    -- one key again and again
    t0 = now()
    for _ = 1, N do local r = set:acquire("k"); r() end
    result[name .. "_same_ns"] = (now() - t0) / N
  end)()
  uv.run()
end

measure("keyed", am.KeyedMutex.new())
measure("hand", by_hand())

-- Memory per live key: hold 100,000 distinct keys.
local function live(name, set)
  local M = math.min(N, 100000)
  local held = {}
  full_gc()
  local before = collectgarbage("count") * 1024
  coroutine.wrap(function()
    for i = 1, M do held[i] = set:acquire(i) end
  end)()
  full_gc()
  -- less the array slots of `held` (16 B each); the releasers count: they are the holds
  result[name .. "_live_b"] = (collectgarbage("count") * 1024 - before - M * 16) / M
  coroutine.wrap(function() for i = 1, M do held[i]() end end)()
  held = nil
  uv.run()
end

live("keyed", am.KeyedMutex.new())
live("hand", by_hand())

local keys = {}
for k in pairs(result) do keys[#keys + 1] = k end
table.sort(keys)
local out = {}
for _, k in ipairs(keys) do out[#out + 1] = ("%q:%.6g"):format(k, result[k]) end
io.write("{", table.concat(out, ","), "}\n")
