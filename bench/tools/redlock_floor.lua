-- The floor of a Redlock cycle with our guarantees (issue 34; docs/bench.md,
-- "Redlock: the floor of a cycle").  One run, on 5 redis-servers started
-- here (spec/redis_server.lua) and stopped at the end:
--  1. CPU per uncontended cycle (acquire + release, 1 coroutine, 5 servers)
--     of RedlockMutex (bench/redis_kinds/worker.lua) and of node-redlock 5
--     (bench/redis_locks/node): the client's (all its threads: the shell's
--     `times` of its children) and the servers' (INFO cpu, summed), each
--     as the difference of a long and a short run (start-up cancels out);
--  2. the least script pair that does what a grant with our guarantees
--     must do on one server (FLOOR_ACQUIRE / FLOOR_RELEASE below), run by a
--     bare loop on our client over the same 5 servers (this file's `client`
--     mode): its client CPU, its servers' CPU and EVALSHA usec_per_call;
--  3. server instructions per call pair (callgrind on a redis-server of its
--     own, n and 2n pairs sent by redis-cli one request at a time, less
--     each other), for the floor pair with 7 keys and 8 arguments and with
--     1 key and 2, and for both real clients.
-- PIN=1 pins the 5 servers to CPU 0 and every client to CPU 1 (taskset):
-- the client's cost alone, the servers no longer on its core.
--
--   lua5.4 bench/tools/redlock_floor.lua      (from the checkout, after make)

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/../.."

-- client mode: N cycles of the floor pair over the servers PORTS, the five
-- acquires sent at once and awaited, then the five releases (a Redlock
-- cycle's shape), with KEYS/ARGV as many as NKEYS says (7: ours).
local FLOOR_ACQUIRE = [[
-- KEYS: holders, queue (+ 5 more passed as ours are); ARGV: token, ttl ms, ...
local K = function(i) return KEYS[i] or (KEYS[1] .. ':' .. i) end
-- the common case first: no holder and nobody queued, one command
if redis.call('EXISTS', K(1), K(2)) ~= 0 then return false end
local t = redis.call('TIME')          -- lease end and fence from the server's clock
local f = t[1] * 1000000 + t[2]
-- the fence: read and raised in one command; a second only if it was ahead
local old = redis.call('SET', K(7), string.format('%d', f), 'PX', 3600000, 'GET')
if old and tonumber(old) >= f then
  f = tonumber(old) + 1
  redis.call('SET', K(7), string.format('%d', f), 'PX', 3600000)
end
local e = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2]))
-- the holder's record (lease end, fence) and its key's expiry: nothing left
redis.call('HSET', K(1), ARGV[1], e .. ' ' .. string.format('%d', f))
redis.call('PEXPIREAT', K(1), e)
return string.format('%d', f)
]]
local FLOOR_RELEASE = [[
local K = function(i) return KEYS[i] or (KEYS[1] .. ':' .. i) end
if redis.call('HDEL', K(1), ARGV[1]) == 0 then return -1 end   -- lease lost
return redis.call('EXISTS', K(2))                             -- anyone to hand off to?
]]
local function floor_keys(nkeys, name)
  local keys = {}
  for i = 1, nkeys do keys[i] = name .. ":" .. i end
  local args = { "tok", "30000" }
  if nkeys > 1 then for i = 3, 8 do args[i] = "x" .. i end end
  return keys, args
end

if arg[1] == "client" then
  local uv = require "luv"
  local am = require "async_mutex"
  local redis = require "async_mutex.redis"
  local clients = {}
  for p in arg[2]:gmatch("%d+") do
    clients[#clients + 1] = redis.connect { host = "127.0.0.1", port = tonumber(p) }
  end
  local n, keys, args = tonumber(arg[3]), floor_keys(tonumber(arg[4]), "floor:cl")
  local function all(script)
    local g = am.group()
    for i = 1, #clients do g:spawn(function() clients[i]:eval(script, keys, args) end) end
    g:join()
  end
  am.run(function()
    all(FLOOR_ACQUIRE); all(FLOOR_RELEASE)      -- scripts loaded: the timed loop is EVALSHA
    local t0 = uv.hrtime()
    for _ = 1, n do all(FLOOR_ACQUIRE); all(FLOOR_RELEASE) end
    print(('{"ops": %d, "seconds": %f}'):format(n, (uv.hrtime() - t0) / 1e9))
    for _, c in ipairs(clients) do c:close() end
  end)
  return
end

package.path = root .. "/bench/?.lua;" .. root .. "/spec/?.lua;" .. package.path
local redis_server = require "redis_server"
local procs = require "procs"
local sh, json, load_avg = procs.sh, procs.json, procs.load_avg
local uv = require "luv"

local PIN = os.getenv("PIN") == "1"
local LUA = arg[-1] or "lua5.4"
local CLIENT_PIN = PIN and "taskset -c 1 " or ""
local ENV = "cd '" .. root .. "' && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "
local NODE_DIR = root .. "/bench/redis_locks/node"
assert(io.open(NODE_DIR .. "/node_modules/redlock/package.json"),
  "node-redlock missing: npm ci in bench/redis_locks/node")
local function ours_cmd(ports, n)
  return ENV .. CLIENT_PIN .. LUA .. (" bench/redis_kinds/worker.lua redlock_cycles %s %d 1"):format(ports, n)
end
local function node_cmd(ports, n)
  return "cd '" .. NODE_DIR .. "' && " .. CLIENT_PIN .. ("node bench.js cycles %s %d 1 default"):format(ports, n)
end
local function floor_cmd(ports, n, nkeys)
  return ENV .. CLIENT_PIN .. LUA .. (" bench/tools/redlock_floor.lua client %s %d %d"):format(ports, n, nkeys)
end

local function cli(port, what) return sh(("LD_PRELOAD= redis-cli -p %d %s"):format(port, what)) end
local load_start = load_avg()
local servers, port_list = {}, {}
for i = 1, 5 do
  servers[i] = redis_server.start()
  port_list[i] = servers[i].port
  if PIN then sh(("taskset -p -c 0 %d >/dev/null"):format(servers[i].pid)) end
end
local t_started = uv.hrtime()
local PORTS = table.concat(port_list, ",")

-- callgrind on one more server of its own (valgrind), started now: the
-- Redlock counts a server once it is up for its ttl (30 s)
local cg_dir = os.tmpname(); os.remove(cg_dir); sh("mkdir -p " .. cg_dir)
local cg_port = redis_server.free_port()
sh(("cd %s && valgrind --tool=callgrind --callgrind-out-file=%s/cg.%%p.out redis-server --port %d"
  .. " --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null 2>%s/vg.log &"):format(
  cg_dir, cg_dir, cg_port, cg_dir))
local cg_pid
for _ = 1, 100 do
  uv.sleep(200)
  if cli(cg_port, "ping"):match("PONG") then break end
end
cg_pid = tonumber(cli(cg_port, "info server"):match("process_id:(%d+)"))

local function servers_cpu()
  local s = 0
  for _, p in ipairs(port_list) do
    local info = cli(p, "info cpu")
    s = s + tonumber(info:match("used_cpu_user:([%d.]+)")) + tonumber(info:match("used_cpu_sys:([%d.]+)"))
  end
  return s
end
-- EVALSHA calls and usec over the 5 servers since the last reset
local function evalsha_stats()
  local calls, usec = 0, 0
  for _, p in ipairs(port_list) do
    local c, u = cli(p, "info commandstats"):match("cmdstat_evalsha:calls=(%d+),usec=(%d+)")
    calls, usec = calls + (tonumber(c) or 0), usec + (tonumber(u) or 0)
  end
  return calls, usec
end
local function reset_stats() for _, p in ipairs(port_list) do cli(p, "config resetstat") end end

-- runs cmd; its JSON, its children's CPU seconds (user + sys), the servers'
local function measured(cmd)
  local s0 = servers_cpu()
  local out = sh("{ " .. cmd .. "; } ; times")
  local mu, ms, su, ss             -- the last line of `times`: the children's
  for a, b, c, d in out:gmatch("(%d+)m([%d.]+)s (%d+)m([%d.]+)s") do mu, ms, su, ss = a, b, c, d end
  local client = tonumber(mu) * 60 + tonumber(ms) + tonumber(su) * 60 + tonumber(ss)
  return json(out:match("^(.*})") or out), client, servers_cpu() - s0
end

-- per cycle: (long run - short run) / (difference of cycles), 2 rounds
-- alternating the sides (the machine's load drifts)
local SHORT, LONG = 300, tonumber(os.getenv("LONG") or 3000)
local ROUNDS = tonumber(os.getenv("ROUNDS") or 2)
local function per_cycle(cmd_of)
  local c0, sv0 = select(2, measured(cmd_of(SHORT)))
  local o, c1, sv1 = measured(cmd_of(SHORT + LONG))
  reset_stats()
  local _ = measured(cmd_of(LONG))
  local calls, usec = evalsha_stats()
  return { rate = o.ops / o.seconds, client = (c1 - c0) * 1e6 / LONG,
           server = (sv1 - sv0) * 1e6 / LONG, usec_call = usec / math.max(1, calls),
           calls = calls / LONG }
end

local results = { floor7 = {}, floor1 = {}, ours = {}, node = {} }
local function add(t, r) t[#t + 1] = r end

local cg = {}
local ok, err = pcall(function()
  -- the floor pair first (no ttl wait needed)
  for _ = 1, ROUNDS do
    add(results.floor7, per_cycle(function(n) return floor_cmd(PORTS, n, 7) end))
    add(results.floor1, per_cycle(function(n) return floor_cmd(PORTS, n, 1) end))
  end

  local dumps = 0
  -- instructions since the last dump
  local function cg_dump()
    sh(("callgrind_control -d %d >/dev/null"):format(cg_pid))
    dumps = dumps + 1
    local f = sh(("ls -v %s/cg.%d.out.* | tail -1"):format(cg_dir, cg_pid)):gsub("%s+$", "")
    return tonumber(sh("grep '^totals:' " .. f):match("(%d+)"))
  end
  local function cg_per(send_n, n)       -- instructions per unit: (2n run - n run) / n
    cg_dump()
    send_n(n); local a = cg_dump()
    send_n(2 * n); local b = cg_dump()
    return (b - a) / n
  end
  local function redis_cli_pairs(nkeys)
    return function(n)
      local keys, args = floor_keys(nkeys, "floor:cg")
      local function load(script)
        local f = io.open(cg_dir .. "/script", "w"); f:write(script); f:close()
        return (sh(("LD_PRELOAD= redis-cli -p %d -x script load < %s/script"):format(cg_port, cg_dir))
          :gsub("%s+$", ""))
      end
      local a, r = load(FLOOR_ACQUIRE), load(FLOOR_RELEASE)
      local tail = (" %d %s %s\n"):format(nkeys, table.concat(keys, " "), table.concat(args, " "))
      local path = cg_dir .. "/cmds"
      local f = io.open(path, "w")
      for _ = 1, n do f:write("evalsha ", a, tail, "evalsha ", r, tail) end
      f:close()
      sh(("LD_PRELOAD= redis-cli -p %d < %s > /dev/null"):format(cg_port, path))
    end
  end
  local CG_N = 500
  cg.floor7 = cg_per(redis_cli_pairs(7), CG_N)
  cg.floor1 = cg_per(redis_cli_pairs(1), CG_N)

  local wait = 33 - (uv.hrtime() - t_started) / 1e9
  if wait > 0 then uv.sleep(math.floor(wait * 1000)) end

  -- the real clients on the callgrind server (one server: a Redlock of one)
  cg.ours = cg_per(function(n) sh(ours_cmd(cg_port, n)) end, CG_N)
  cg.node = cg_per(function(n) sh(node_cmd(cg_port, n)) end, CG_N)

  for _ = 1, ROUNDS do
    add(results.ours, per_cycle(function(n) return ours_cmd(PORTS, n) end))
    add(results.node, per_cycle(function(n) return node_cmd(PORTS, n) end))
  end
end)
-- stopped whatever happened: only the servers started here
cli(cg_port, "shutdown nosave")
sh("sleep 1; rm -rf " .. cg_dir)
for _, s in ipairs(servers) do s:stop() end
assert(ok, err)
local load_end = load_avg()

local function mean(t, k)
  local s = 0
  for _, r in ipairs(t) do s = s + r[k] end
  return s / #t
end
print(("load %s -> %s%s"):format(load_start, load_end, PIN and ", servers on CPU 0, clients on CPU 1" or ""))
print("| 5 servers, 1 coroutine, per cycle | cycles/s | client CPU us | servers' CPU us | total us"
  .. " | EVALSHA usec_per_call | EVALSHA per cycle | server instr. per pair (callgrind) |")
print("|---|---|---|---|---|---|---|---|")
for _, k in ipairs({ "ours", "node", "floor7", "floor1" }) do
  local t = results[k]
  local name = ({ ours = "RedlockMutex", node = "node-redlock 5",
                  floor7 = "floor pair, bare loop, 7 keys 8 args",
                  floor1 = "floor pair, bare loop, 1 key 2 args" })[k]
  local c, s = mean(t, "client"), mean(t, "server")
  print(("| %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1fk |"):format(name, mean(t, "rate"), c, s,
    c + s, mean(t, "usec_call"), mean(t, "calls"), cg[k] / 1000))
end
