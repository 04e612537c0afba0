-- The Redis section of `make bench`: async_mutex.redis against
-- redis-benchmark, ioredis (Node, when bench/redis/node has it installed:
-- `make bench` installs it with npm ci) and a bare C program driving hiredis
-- on libuv (hiredis_uv.c), all against one redis-server started here on
-- loopback, unpinned, each in its own process, in one run.  Then how fast
-- E_UNAVAILABLE comes: a refused connection; calls in flight when the
-- server is killed; and the memory a waiting call takes.  Prints a table and the targets of docs/redis.md's
-- benchmark note; BENCH_QUICK=1 runs a tenth of the requests.
--
--   lua5.4 bench/redis/run.lua          (from the checkout, after make)

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/../.."
package.path = root .. "/spec/?.lua;" .. package.path
local redis_server = require "redis_server"

local QUICK = os.getenv("BENCH_QUICK") == "1"
local N = QUICK and 20000 or 200000
local LUA = arg[-1] or "lua5.4"
local ENV = "cd '" .. root .. "' && LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  return out
end

local function json(out)
  local line = out:match("(%b{})%s*$")
  if not line then return nil end
  local t = {}
  for k, v in line:gmatch('"([%w_]+)":%s*([%d.e+-]+)') do t[k] = tonumber(v) end
  return t
end

local function rate(t) return t and t.ops and t.ops / t.seconds end

io.stderr:write("bench/redis: ", QUICK and "quick, " or "", N, " SETs per run\n")
local server = redis_server.start()
local port = server.port

-- the C baseline
local HIREDIS_UV = root .. "/build/bench/hiredis_uv"
sh("mkdir -p '" .. root .. "/build/bench' && gcc -O2 -o '" .. HIREDIS_UV .. "' '"
  .. here .. "/hiredis_uv.c' -lhiredis -luv")
local have_c = io.open(HIREDIS_UV) ~= nil
local have_node = io.open(here .. "/node/node_modules/ioredis/package.json") ~= nil
  and sh("command -v node") ~= ""

local rows = {}
for _, conc in ipairs({ 1, 50 }) do
  local row = { conc = conc }
  row.ours = rate(json(sh(ENV .. LUA .. " bench/redis/client.lua set " .. port
    .. " " .. N .. " " .. conc)))
  local rb = sh(("redis-benchmark -p %d -c %d -n %d -t set -q"):format(port, conc, N))
  row.rb = tonumber(rb:match("SET: ([%d.]+) requests per second"))
  if have_c then
    row.c = rate(json(sh(("'%s' %d %d %d"):format(HIREDIS_UV, port, N, conc))))
  end
  if have_node then
    row.node = rate(json(sh(("cd '%s/node' && node bench.js %d %d %d"):format(here, port, N, conc))))
  end
  rows[#rows + 1] = row
end

local refused = json(sh(ENV .. LUA .. " bench/redis/client.lua refused "
  .. redis_server.free_port() .. " " .. (QUICK and 20 or 200)))
local memory = json(sh(ENV .. LUA .. " bench/redis/client.lua memory " .. port
  .. " '" .. server.pidfile .. "' 10000"))
local killed = json(sh(ENV .. LUA .. " bench/redis/client.lua killed " .. port
  .. " '" .. server.pidfile .. "' 1000"))
server.pid = nil                      -- killed by the scenario
server:stop()

local function k(x) return x and ("%.1f k/s"):format(x / 1000) or "-" end
local function r(a, b) return (a and b) and ("%.2fx"):format(a / b) or "-" end
print(("%-34s %12s %16s %12s %12s"):format("SET on one connection", "ours",
  "redis-benchmark", "ioredis", "C hiredis+uv"))
for _, row in ipairs(rows) do
  print(("%-34s %12s %16s %12s %12s"):format(
    row.conc == 1 and "1 in flight (sequential)" or row.conc .. " in flight (coroutines/callers)",
    k(row.ours), k(row.rb), k(row.node), k(row.c)))
end
print(("%-34s %12s %16s %12s %12s"):format("ours / peer, 1 in flight", "",
  r(rows[1].ours, rows[1].rb), r(rows[1].ours, rows[1].node), r(rows[1].ours, rows[1].c)))
print(("%-34s %12s %16s %12s %12s"):format("ours / peer, 50 in flight", "",
  r(rows[2].ours, rows[2].rb), r(rows[2].ours, rows[2].node), r(rows[2].ours, rows[2].c)))
print(("E_UNAVAILABLE, connection refused: mean %.3f ms, max %.3f ms"):format(
  refused and refused.mean_ms or -1, refused and refused.max_ms or -1))
print(("E_UNAVAILABLE, server killed with 1,000 calls in flight: all failed %.3f ms after the kill"):format(
  killed and killed.ms_after_kill or -1))
print(("memory of a waiting call, beyond its suspended coroutine: %.0f bytes (a waiting lock acquirer: %.0f)"):format(
  memory and memory.call_bytes or -1, memory and memory.lock_bytes or -1))
print("targets: 1 in flight >= 0.8x redis-benchmark -c 1 and >= 1.1x ioredis;"
  .. " 50 in flight >= 3x ioredis and >= 0.7x C; refused <= 5 ms; killed <= 10 ms")
