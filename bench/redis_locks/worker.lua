-- One process of the Redis locks' benchmark (bench/redis_locks.lua).
--   worker.lua cycles   PORT N CONC      N acquire+release cycles, CONC coroutines on distinct keys
--   worker.lua pingpong PORT N ID        N sections on one key; prints "G t" and "R t" (uv.hrtime)
--   worker.lua contend  PORT MS ID       sections on one key for MS ms; prints counts and waits
--   worker.lua lost     PORT             how late onLost comes after the lease's local end
--   worker.lua refused  PORT             how fast acquire fails on a port nobody listens on
--   worker.lua seed_cycles PORT N / seed_pingpong PORT N ID: the seed's SET NX PX recipe
--   worker.lua churn    PORT N           N distinct keys churned by 4 processes killed at random
--                                        (churn_one), then what is left in Redis, and when
-- Prints one JSON line at the end (except pingpong).

local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"

local mode, port = arg[1], tonumber(arg[2])
local client = redis.connect { host = "127.0.0.1", port = port }
local hr = uv.hrtime

local function json(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = ('"%s": %s'):format(k, tostring(v)) end
  print("{" .. table.concat(parts, ", ") .. "}")
end

local modes = {}

-- The seed's recipe on this client: SET key token NX PX ttl, a script that
-- deletes the key only if it holds our token, and 200 ms sleeps between
-- tries.  Returns the release function.
local SEED_RELEASE = [[
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
]]
local seed_n = 0
local function seed_acquire(key)
  seed_n = seed_n + 1
  local token = ("%d:%d:%d"):format(uv.os_getpid(), seed_n, hr())
  while client:call("SET", key, token, "NX", "PX", 30000) == nil do
    am.sleep(200)
  end
  return function() client:eval(SEED_RELEASE, { key }, { token }) end
end

function modes.seed_cycles(n)
  n = tonumber(n)
  local t0 = hr()
  for _ = 1, n do seed_acquire("bench:seed:cycles")() end
  json { ops = n, seconds = (hr() - t0) / 1e9 }
end

function modes.seed_pingpong(n, id)
  local out = {}
  for _ = 1, tonumber(n) do
    local release = seed_acquire("bench:seed:pingpong")
    out[#out + 1] = ("G %s %d"):format(id, hr())
    am.sleep(1)
    out[#out + 1] = ("R %s %d"):format(id, hr())
    release()
  end
  print(table.concat(out, "\n"))
end

function modes.cycles(n, conc)
  n, conc = tonumber(n), tonumber(conc)
  local each = n // conc
  local left = conc
  local done = coroutine.running()
  local t0 = hr()
  for c = 1, conc do
    am.spawn(function()
      local m = am.RedisMutex.new(client, "bench:cycles:" .. c)
      for _ = 1, each do
        local release = m:acquire()
        release()
      end
      left = left - 1
      if left == 0 then coroutine.resume(done) end
    end)
  end
  if left > 0 then coroutine.yield() end
  json { ops = each * conc, seconds = (hr() - t0) / 1e9 }
end

function modes.pingpong(n, id)
  n = tonumber(n)
  local m = am.RedisMutex.new(client, "bench:pingpong")
  local out = {}
  for _ = 1, n do
    local release = m:acquire()
    out[#out + 1] = ("G %s %d"):format(id, hr())
    am.sleep(1)                       -- let the other process queue
    out[#out + 1] = ("R %s %d"):format(id, hr())
    release()
  end
  print(table.concat(out, "\n"))
end

function modes.contend(ms, id)
  ms = tonumber(ms)
  local m = am.RedisMutex.new(client, "bench:contend")
  local count, max_wait, waits = 0, 0, {}
  local stop = hr() + ms * 1e6
  while hr() < stop do
    local t = hr()
    local release = m:acquire()
    local w = (hr() - t) / 1e6
    waits[#waits + 1] = w
    if w > max_wait then max_wait = w end
    count = count + 1
    release()
  end
  table.sort(waits)
  json { id = id, count = count, max_wait_ms = max_wait,
         p50_wait_ms = waits[(#waits + 1) // 2] or 0 }
end

function modes.lost()
  local lates = {}
  -- connected first (and, where the locks read it, the server's eviction
  -- policy read): each run below times its acquire's request alone
  am.RedisMutex.new(client, "bench:lost:0"):isLocked()
  for i = 1, 5 do
    local lost_at
    -- a lock of its own each time: a lost lease is not given back early, and
    -- the next acquire of the same lock would wait for it in Redis first
    local m = am.RedisMutex.new(client, "bench:lost:" .. i, { ttl = 100, renewInterval = 0,
      onLost = function() lost_at = hr() end })
    local sent = hr()
    m:acquire()
    while not lost_at do am.sleep(5) end
    lates[#lates + 1] = (lost_at - sent) / 1e6 - (100 - 3)     -- ttl minus drift allowance
  end
  table.sort(lates)
  json { lost_late_ms_max = lates[#lates], lost_late_ms_p50 = lates[3] }
end

function modes.refused()
  local dead = redis.connect { host = "127.0.0.1", port = port }
  local m = am.RedisMutex.new(dead, "bench:refused")
  local t = hr()
  local ok, err = pcall(m.acquire, m)
  assert(not ok and err == am.E_UNAVAILABLE)
  json { refused_ms = (hr() - t) / 1e6 }
  dead:close()
end

-- One churning process: 8 coroutines take the keys FROM..TO of a keyed
-- set in turn (every 50th a semaphore of 2, every 7th a waitForUnlock),
-- holding each 0-2 ms, until the range is done or the process is killed.
-- Two such processes share each range, so that they queue for each other.
local CHURN_OPTIONS = { ttl = 200, waiterTimeout = 200 }

function modes.churn_one(prefix, from, to, seed)
  from, to = tonumber(from), tonumber(to)
  math.randomseed(tonumber(seed))
  local k = am.KeyedRedisMutex.new(client, prefix, CHURN_OPTIONS)
  local next_key, left, told = from, 8, false
  local done = coroutine.running()
  for _ = 1, 8 do
    am.spawn(function()
      while next_key <= to do
        local key = next_key
        next_key = next_key + 1
        if key % 50 == 0 then
          local s = am.RedisSemaphore.new(client, prefix .. "s" .. key, 2, CHURN_OPTIONS)
          local _, r = s:acquire(math.random(2))
          am.sleep(math.random(0, 2))
          r()
        elseif key % 7 == 0 then
          pcall(k.waitForUnlock, am.withTimeout(k, 10), key)
        else
          local r = k:acquire(key)
          if not told then                 -- (the driver's first kill waits for it)
            told = true
            io.stdout:write("granted\n")
            io.stdout:flush()
          end
          am.sleep(math.random(0, 2))
          r()
        end
      end
      left = left - 1
      if left == 0 then coroutine.resume(done) end
    end)
  end
  coroutine.yield()
end

-- The driver: ranges of 200 keys, two processes on each, two ranges at a
-- time (4 processes); every 20-120 ms each running pair has one process
-- SIGKILLed with probability 1/2.  The first kill always happens, and
-- waits for a process of the first pair to say it was granted a key (on
-- its stdout): killed then, it leaves holds and places in queues (its 8
-- coroutines'), where one killed before its first request left nothing
-- (the first key in Redis was most often the other processes').  Then,
-- once every process is gone and the keys' bound has passed (max(ttl,
-- 2 * waiterTimeout) = 400 ms), the keys are counted:
-- DBSIZE (which counts keys whose expiry has passed but that Redis has not
-- reclaimed yet: its active expiry cycle stops while fewer than about a
-- tenth of the keys it samples have expired), then by SCAN (which reclaims
-- those it meets): counters (N:n), and any other key.
function modes.churn(n)
  n = tonumber(n)
  local prefix = ("bench:churn:%d:"):format(uv.os_getpid())
  local seed = os.time()
  math.randomseed(seed)
  local RANGE = 200
  local function start(from, to, i)
    local child = { done = false, granted = false }
    local out = uv.new_pipe(false)
    local handle
    handle, child.pid = uv.spawn(arg[-1] or "lua5.4", {
      args = { arg[0], "churn_one", tostring(port), prefix, tostring(from), tostring(to),
               tostring(seed + from * 2 + i) },
      stdio = { nil, out, 2 },
    }, function() handle:close(); child.done = true end)
    out:read_start(function(err, data)
      if data then child.granted = true end
      if err or not data then out:close() end
    end)
    return child
  end
  local base = client:call("DBSIZE")
  local t0 = hr()
  local running, from, kills = {}, 1, 0
  while from <= n or #running > 0 do
    while from <= n and #running < 2 do
      local to = math.min(from + RANGE - 1, n)
      running[#running + 1] = { start(from, to, 1), start(from, to, 2) }
      from = from + RANGE
    end
    local first_victim
    if kills == 0 then
      -- The first kill waits for a grant of the first pair rather than a
      -- random time: a range can be done within 120 ms (1,000 keys took
      -- 0.46 s), and a run with no kill, or one of a process that had
      -- sent nothing yet, proves nothing.
      local first = running[1]
      repeat
        am.sleep(1)
        for _, c in ipairs(first) do
          if c.granted and not c.done then first_victim = c end
        end
      until first_victim or (first[1].done and first[2].done)
    else
      am.sleep(math.random(20, 120))
    end
    for i = #running, 1, -1 do
      local pair = running[i]
      local victim, sure = pair[math.random(2)], false
      -- (not "kills == 0": this loop looks at the last pair first, whose
      -- processes, started last, had most often sent nothing yet)
      if i == 1 and first_victim then victim, sure = first_victim, true end
      if (sure or math.random() < 0.5) and not victim.done then
        uv.kill(victim.pid, "sigkill")
        kills = kills + 1
      end
      if pair[1].done and pair[2].done then table.remove(running, i) end
    end
  end
  local churned = (hr() - t0) / 1e9
  am.sleep(400)                              -- the bound
  local at_bound = client:call("DBSIZE") - base
  local cursor, counters, others = "0", 0, 0
  repeat
    local r = client:call("SCAN", cursor, "MATCH", prefix .. "*", "COUNT", "1000")
    cursor = r[1]
    for _, key in ipairs(r[2]) do
      if key:sub(-2) == ":n" then counters = counters + 1 else others = others + 1 end
    end
  until cursor == "0"
  json { keys = n, seconds = churned, kills = kills, counters = counters, others = others,
         unreclaimed = at_bound - counters - others, after_scan = client:call("DBSIZE") - base }
end

am.spawn(function()
  modes[mode](table.unpack(arg, 3))
  client:close()
end)
uv.run()
