-- One scenario of bench/redis/run.lua on async_mutex.redis, in its own
-- process; prints one line: a JSON object {"ops": N, "seconds": S, ...}.
--
--   lua5.4 bench/redis/client.lua set PORT N CONCURRENCY
--   lua5.4 bench/redis/client.lua refused PORT N        (ms to E_UNAVAILABLE)
--   lua5.4 bench/redis/client.lua killed PORT PIDFILE N (ms from SIGKILL)
--   lua5.4 bench/redis/client.lua memory PORT PIDFILE N (bytes per waiting
--     call, and per waiting lock acquirer, beyond a suspended coroutine)

local uv = require "luv"
local redis = require "async_mutex.redis"

local what, port = arg[1], tonumber(arg[2])

local function out(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = ('"%s": %s'):format(k, v) end
  table.sort(parts)
  print("{" .. table.concat(parts, ", ") .. "}")
end

if what == "set" then
  local n, conc = tonumber(arg[3]), tonumber(arg[4])
  local c = redis.connect({ port = port })
  local per = n // conc
  local t0
  coroutine.wrap(function()
    c:call("PING")                                -- connected before timing
    t0 = uv.hrtime()
    local left = conc
    for i = 1, conc do
      coroutine.wrap(function()
        local key = "k" .. i
        for _ = 1, per do c:call("SET", key, "value") end
        left = left - 1
        if left == 0 then
          local s = (uv.hrtime() - t0) / 1e9
          out({ ops = per * conc, seconds = s })
          c:close()
        end
      end)()
    end
  end)()
  uv.run()
elseif what == "refused" then
  local n = tonumber(arg[3])
  local total, worst = 0, 0
  coroutine.wrap(function()
    for _ = 1, n do
      local c = redis.connect({ port = port, reconnectDelay = 0 })
      local t0 = uv.hrtime()
      local ok, err = pcall(c.call, c, "PING")
      local ms = (uv.hrtime() - t0) / 1e6
      assert(not ok and err == redis.E_UNAVAILABLE)
      total, worst = total + ms, math.max(worst, ms)
      c:close()
    end
    out({ mean_ms = total / n, max_ms = worst })
  end)()
  uv.run()
elseif what == "memory" then
  local am = require "async_mutex"
  local pidfile, n = arg[3], tonumber(arg[4])
  local function measure(body)
    collectgarbage(); collectgarbage()
    local before = collectgarbage("count")
    local keep = {}
    for i = 1, n do
      keep[i] = coroutine.create(body)
      coroutine.resume(keep[i])
    end
    collectgarbage(); collectgarbage()
    return (collectgarbage("count") - before) * 1024 / n, keep
  end
  local bare = measure(function() coroutine.yield() end)
  local m = am.Mutex.new()
  coroutine.wrap(function() m:acquire() end)()           -- held for good
  local lock = measure(function() m:acquire() end)
  local c = redis.connect({ port = port, commandTimeout = math.huge })
  coroutine.wrap(function() c:call("PING") end)()
  uv.run()
  local f = assert(io.open(pidfile))
  local pid = f:read("n")
  f:close()
  os.execute("kill -STOP " .. pid)                      -- no reply comes
  local call = measure(function() pcall(c.call, c, "GET", "k") end)
  os.execute("kill -CONT " .. pid)
  out({ call_bytes = call - bare, lock_bytes = lock - bare })
  os.exit(0)
elseif what == "killed" then
  local pidfile, n = arg[3], tonumber(arg[4])
  local f = assert(io.open(pidfile))
  local pid = f:read("n")
  f:close()
  local c = redis.connect({ port = port, commandTimeout = math.huge })
  coroutine.wrap(function()
    c:call("PING")
    os.execute("kill -STOP " .. pid)
    local done, last = 0, 0
    local t0
    for _ = 1, n do
      coroutine.wrap(function()
        pcall(c.call, c, "PING")
        done = done + 1
        if done == n then
          last = (uv.hrtime() - t0) / 1e6
          out({ calls = n, ms_after_kill = last })
        end
      end)()
    end
    local t = uv.new_timer()
    t:start(20, 0, function()
      t:close()
      os.execute("kill -KILL " .. pid)
      t0 = uv.hrtime()                       -- the signal is delivered by now
    end)
  end)()
  uv.run()
end
