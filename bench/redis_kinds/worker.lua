-- One process of the benchmark of the Redis lock kinds (bench/redis_kinds.lua).
--   worker.lua redlock_cycles   PORTS N CONC   N acquire+release cycles of RedlockMutex, CONC
--                                              coroutines on distinct names, over the servers PORTS
--   worker.lua redlock_pingpong PORTS N ID     N sections on one name; prints "G id t" and "R id t"
--   worker.lua redlock_contend  PORTS MS ID    sections on one name for MS ms: counts and waits
--   worker.lua rw_contend    PORT MS ID CONC HOLD  CONC coroutines, 95 % reads of a RedisRWLock
--   worker.lua mutex_contend PORT MS ID CONC HOLD  the same sections on a RedisMutex
-- PORTS: comma-separated ports of redis-servers on 127.0.0.1.  HOLD: ms a
-- section sleeps (0: it yields once).  Prints one JSON line (but pingpong).

local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"

local mode = arg[1]
local hr = uv.hrtime

local function json(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = ('"%s": %s'):format(k, tostring(v)) end
  print("{" .. table.concat(parts, ", ") .. "}")
end

local clients = {}
local function connect(ports)
  for port in ports:gmatch("%d+") do
    clients[#clients + 1] = redis.connect { host = "127.0.0.1", port = tonumber(port) }
  end
  return clients
end

-- Redlock's options here: node-redlock's duration in bench.js (30 s).
local OPTIONS = { ttl = 30000 }

local modes = {}

function modes.redlock_cycles(ports, n, conc)
  connect(ports)
  n, conc = tonumber(n), tonumber(conc)
  local each = n // conc
  local locks = {}
  for c = 1, conc do locks[c] = am.RedlockMutex.new(clients, "bench:rl:cycles:" .. c, OPTIONS) end
  -- connected, eviction policy and servers' age read: the timed loop is the lock's
  for c = 1, conc do locks[c]:acquire()() end
  local g = am.group()
  local t0 = hr()
  for c = 1, conc do
    g:spawn(function()
      local m = locks[c]
      for _ = 1, each do m:acquire()() end
    end)
  end
  g:join()
  json { ops = each * conc, seconds = (hr() - t0) / 1e9 }
end

function modes.redlock_pingpong(ports, n, id)
  connect(ports)
  local m = am.RedlockMutex.new(clients, "bench:rl:pingpong", OPTIONS)
  local out = {}
  for _ = 1, tonumber(n) do
    local release = m:acquire()
    out[#out + 1] = ("G %s %d"):format(id, hr())
    am.sleep(1)                       -- let the other process queue
    out[#out + 1] = ("R %s %d"):format(id, hr())
    release()
  end
  print(table.concat(out, "\n"))
end

function modes.redlock_contend(ports, ms, id)
  connect(ports)
  ms = tonumber(ms)
  local m = am.RedlockMutex.new(clients, "bench:rl:contend", OPTIONS)
  m:isLocked()                        -- connected before the clock
  local count, max_wait = 0, 0
  local stop = hr() + ms * 1e6
  while hr() < stop do
    local t = hr()
    local release = m:acquire()
    local w = (hr() - t) / 1e6
    if w > max_wait then max_wait = w end
    count = count + 1
    release()
  end
  json { id = id, count = count, max_wait_ms = max_wait }
end

-- CONC coroutines, each taking the lock for ms ms: 95 % reads (rw) or
-- always the mutex, holding each section HOLD ms (0: one yield).
local function contend(make, read_pct, port, ms, id, conc, hold)
  connect(port)
  ms, conc, hold = tonumber(ms), tonumber(conc), tonumber(hold)
  local lock = make(clients[1])
  lock:isLocked()
  local count = 0
  local stop = hr() + ms * 1e6
  local g = am.group()
  for _ = 1, conc do
    g:spawn(function()
      while hr() < stop do
        local release
        if read_pct and math.random(100) <= read_pct then
          release = lock:acquireRead()
        else
          release = lock:acquire()
        end
        if hold > 0 then am.sleep(hold) else am.sleep(0) end
        release()
        count = count + 1
      end
    end)
  end
  g:join()
  json { id = id, count = count }
end

function modes.rw_contend(port, ms, id, conc, hold)
  contend(function(c) return am.RedisRWLock.new(c, "bench:rw:contend") end, 95,
          port, ms, id, conc, hold)
end

function modes.mutex_contend(port, ms, id, conc, hold)
  contend(function(c) return am.RedisMutex.new(c, "bench:rw:mutex") end, nil,
          port, ms, id, conc, hold)
end

am.run(function()
  modes[mode](table.unpack(arg, 2))
  for _, c in ipairs(clients) do c:close() end
end)
