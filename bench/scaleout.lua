-- Scaling out (docs/redis-locks.md, "Scaling out"): what `replicas = 1`
-- costs per lock cycle, and how long after `kill -9` of a master under
-- Sentinel the first grant comes from the promoted replica.  Real servers
-- on loopback, started here and stopped by PID (spec/redis_server.lua,
-- spec/redis_sentinel.lua); the two sides of each comparison alternate in
-- one run (A/B), so that the ratio, not the rate, is what counts on a
-- shared machine.  BENCH_QUICK=1 runs a tenth of the work.
--
--   lua5.4 bench/scaleout.lua        (from the checkout, after make)

local here = arg[0]:match("^(.*)/[^/]*$") or "."
package.path = here .. "/../spec/?.lua;" .. here .. "/../src/?.lua;"
  .. here .. "/../src/?/init.lua;" .. package.path
package.cpath = here .. "/../build/?.so;" .. package.cpath
local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local redis_server = require "redis_server"
local redis_sentinel = require "redis_sentinel"

local QUICK = os.getenv("BENCH_QUICK") == "1"
local CYCLES = QUICK and 500 or 5000
local ROUNDS = 5

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

-- Cycles per second of `tasks` coroutines, each acquiring and releasing
-- its own key of a KeyedRedisMutex (one key: a RedisMutex) `n` times.
local function cycles(client, replicas, tasks, n)
  local opts = { replicas = replicas }
  local lock = tasks == 1 and am.RedisMutex.new(client, "bench:scaleout", opts)
    or am.KeyedRedisMutex.new(client, "bench:scaleout:", opts)
  local t0 = uv.hrtime()
  am.run(function()
    local g = am.group()
    for k = 1, tasks do
      g:spawn(function()
        for _ = 1, n // tasks do
          local release = tasks == 1 and lock:acquire() or lock:acquire(k)
          release()
        end
      end)
    end
    g:join()
  end)
  return n / ((uv.hrtime() - t0) / 1e9)
end

local function cost_of_replicas()
  local sync = "--repl-diskless-sync-delay 0"
  local master = redis_server.start(nil, sync)
  local replica = redis_server.start(nil, sync .. " --replicaof 127.0.0.1 " .. master.port)
  local ok, err = pcall(function()
    local c = redis.connect { port = master.port }
    am.run(function()
      for _ = 1, 500 do
        if c:call("INFO", "replication"):find("state=online", 1, true) then break end
        am.sleep(10)
      end
    end)
    print(("| tasks | cycles/s, no `replicas` | cycles/s, `replicas = 1` | ratio |"))
    print("|---|---|---|---|")
    for _, tasks in ipairs({ 1, 50 }) do
      local a, b = {}, {}
      cycles(c, nil, tasks, CYCLES // 10)            -- warm: scripts loaded
      cycles(c, 1, tasks, CYCLES // 10)
      for _ = 1, ROUNDS do
        a[#a + 1] = cycles(c, nil, tasks, CYCLES)
        b[#b + 1] = cycles(c, 1, tasks, CYCLES)
      end
      local ma, mb = median(a), median(b)
      print(("| %d | %.0f | %.0f | %.2f |"):format(tasks, ma, mb, mb / ma))
    end
    c:close()
  end)
  master:stop()
  replica:stop()
  assert(ok, err)
end

-- ms from kill -9 of the master to the first grant from the promoted one,
-- the lock idle at the kill (no lease of a lost release to wait for): one
-- coroutine tries every 10 ms.
local function failover_time(replicas)
  local set = redis_sentinel.start { replicas = 2, sentinels = 3, failover_timeout = 3000 }
  local ms
  local ok, err = pcall(function()
    local c = redis.connect { sentinels = set:sentinel_list(), master = "mymaster",
      commandTimeout = 1000, reconnectDelayMax = 200 }
    local m = am.RedisMutex.new(c, "bench:failover", { replicas = replicas })
    am.run(function()
      m:acquire()()
      local old = set.master.port
      set.master:kill()
      local t0 = uv.hrtime()
      while true do
        local got, r = pcall(m.acquire, m)
        if got then
          local port = tonumber(c:call("CONFIG", "GET", "port")[2])
          r()
          if port ~= old then break end
        end
        am.sleep(10)
      end
      ms = (uv.hrtime() - t0) / 1e6
    end)
    c:close()
  end)
  set:stop()
  assert(ok, err)
  return ms
end

print("## `replicas = 1`: lock cycles on a master with one replica (median of "
  .. ROUNDS .. " alternating rounds)\n")
cost_of_replicas()
print("\n## Sentinel: kill -9 of the master to the first grant on the promoted one"
  .. " (down-after-milliseconds 1000)\n")
print("| `replicas` | ms |")
print("|---|---|")
for _, r in ipairs({ false, 1 }) do
  print(("| %s | %.0f |"):format(r or "none", failover_time(r or nil)))
end
