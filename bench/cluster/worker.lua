-- A worker of bench/cluster.lua: COROS coroutines take and give back
-- keyed Redis locks on keys of their own (never contended) for MS ms, on
-- one server ("single PORT") or on a cluster ("cluster PORT,PORT,...").
-- Ends with a JSON line: {"cycles": N, "cpu": its own CPU seconds}.
-- COROS 0: a ping-pong of MS sections on one lock instead (below).
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"

local mode, ports, coros, ms, id = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5]
local client
if mode == "single" then
  client = redis.connect { host = "127.0.0.1", port = tonumber(ports) }
else
  local seeds = {}
  for p in ports:gmatch("%d+") do seeds[#seeds + 1] = { host = "127.0.0.1", port = tonumber(p) } end
  client = redis.connect { cluster = seeds }
end
local locks = am.KeyedRedisMutex.new(client, "bench:")
local cycles, client_cpu = 0, 0
if coros == 0 then
  -- ping-pong: MS sections on one lock shared with another process, each
  -- held for 1 ms so that the other queues; "G id t" and "R id t" lines
  -- (hrtime ns) give the hand-off latencies (bench/procs.lua, handoffs)
  local out = {}
  am.run(function()
    local m = am.RedisMutex.new(client, "bench:pingpong")
    m:isLocked()                       -- the slot map before the clock
    for _ = 1, ms do
      local release = m:acquire()
      out[#out + 1] = ("G %s %d"):format(id, uv.hrtime())
      am.sleep(1)
      out[#out + 1] = ("R %s %d"):format(id, uv.hrtime())
      release()
    end
    client:close()
  end)
  print(table.concat(out, "\n"))
  os.exit(0)
end
am.run(function()
  -- the slot map and the scripts loaded before the clock starts
  locks:acquire("warm" .. id)()
  local stop = uv.now() + ms
  local c0 = os.clock()
  local ws = {}
  for c = 1, coros do
    ws[c] = am.spawn(function()
      local i = 0
      while uv.now() < stop do
        i = i + 1
        local release = locks:acquire(("%s:%d:%d"):format(id, c, i % 64))
        release()
        cycles = cycles + 1
      end
    end)
  end
  for _, w in ipairs(ws) do w:join() end
  client_cpu = os.clock() - c0
  client:close()
end)
io.stdout:write(('{"cycles": %d, "cpu": %.4f}\n'):format(cycles, client_cpu))
