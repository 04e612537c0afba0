-- Where the instructions go, per operation: runs a scenario of
-- bench/scenarios.lua under callgrind at two sizes (n and 2n) and prints,
-- for the heaviest functions, (cost at 2n - cost at n) / n: the cost of one
-- operation, start-up and set-up cancelled.  Functions of the interpreter are
-- named too: it runs under bench/tools/lua_sym (built here, linked with
-- Debian's liblua5.4.a), because Debian's lua5.4 is stripped.
--
--   lua5.4 bench/tools/profile.lua IMPL SCENARIO [N] [self]
--
-- IMPL: ours | lua | floor.  SCENARIO: pairs (one uncontended pair),
-- handoff (one hand-off, 10 coroutines), handoff1000 (1000 coroutines),
-- chain, timeout, cancel, priority, semaphore (one waiter), spawn (a task
-- started and ended), spawnwait (one that waits for a mutex once).  `self` sorts by
-- self cost instead of inclusive cost.  Run from the repository root after
-- `make`; needs valgrind and liblua5.4-dev.

local impl, scenario = arg[1], arg[2]
local presets = {
  pairs = { n = 50000, args = function(n) return tostring(n) end },
  handoff = { n = 20000, args = function(n) return ("10 %d"):format(n // 10) end },
  handoff1000 = { name = "handoff", n = 10000,
                  args = function(n) return ("1000 %d"):format(n // 1000) end },
  chain = { n = 10000, args = function(n) return tostring(n) end },
  timeout = { n = 5000, args = function(n) return n .. " 50" end },
  cancel = { n = 10000, args = function(n) return tostring(n) end },
  priority = { n = 10000, args = function(n) return tostring(n) end },
  semaphore = { n = 5000, args = function(n) return n .. " 16" end },
  spawn = { n = 20000, args = function(n) return tostring(n) end },
  spawnwait = { name = "spawn", n = 10000, args = function(n) return n .. " wait" end },
}
local preset = presets[scenario or ""]
if not impl or not preset then
  io.stderr:write("usage: lua5.4 bench/tools/profile.lua ours|lua|floor ",
    "pairs|handoff|handoff1000|chain|timeout|cancel|priority|semaphore|spawn|spawnwait [N] [self]\n")
  os.exit(2)
end
local n = tonumber(arg[3]) or preset.n
local inclusive = arg[4] ~= "self" and arg[3] ~= "self"

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

-- The interpreter with symbols.
local exe = "build/bench/lua_sym"
local src = "bench/tools/lua_sym.c"
if not select(2, sh(("test -x %s -a %s -nt %s"):format(exe, exe, src))) then
  local _, ok = sh(("mkdir -p build/bench && cc -O2 -g -I/usr/include/lua5.4 %s -o %s " ..
    "-Wl,-E /usr/lib/x86_64-linux-gnu/liblua5.4.a -lm -ldl 2>&1"):format(src, exe))
  if not ok then error("cannot build " .. exe .. " (is liblua5.4-dev installed?)") end
end

local env = "LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='build/?.so;;' "

-- Per-function costs of one run (inclusive or self), by function name.
local function costs(size)
  local file = os.tmpname()
  sh(("%svalgrind --tool=callgrind --callgrind-out-file=%s %s bench/scenarios.lua %s %s %s " ..
    ">/dev/null 2>&1"):format(env, file, exe, impl, preset.name or scenario, preset.args(size)))
  local out = sh(("callgrind_annotate --threshold=100 --inclusive=%s %s 2>/dev/null")
    :format(inclusive and "yes" or "no", file))
  os.remove(file)
  local t = {}
  for count, name in out:gmatch("\n%s*([%d,]+) %([^)]*%)%s+(%S+)") do
    name = name:gsub("^%?%?%?:", ""):gsub("^.*/src/", "src/")
    t[name] = (t[name] or 0) + tonumber((count:gsub(",", "")))
  end
  return t
end

local a, b = costs(n), costs(2 * n)
local rows = {}
for name, v in pairs(b) do
  local d = (v - (a[name] or 0)) / n
  if d >= 10 and not (name:match("^%(below") or name:match("^0x") or name == "=>"
      or name:match("csu/") or name:match("lua_sym%.c:main")) then
    rows[#rows + 1] = { d, name }
  end
end
table.sort(rows, function(x, y) return x[1] > y[1] end)
print(("%s %s: instructions per operation (%s), n = %d vs %d"):format(impl, scenario,
  inclusive and "inclusive" or "self", n, 2 * n))
local shown, seen = 0, {}
for _, r in ipairs(rows) do
  -- The same function appears under several names (recursion levels,
  -- source file vs symbol): keep the first of each cost.
  local key = r[2]:gsub("'%d+$", ""):gsub("^src/[%w_/]+%.c:", "")
  if not seen[key] then
    seen[key] = true
    print(("%8.0f  %s"):format(r[1], r[2]))
    shown = shown + 1
    if shown == 40 then break end
  end
end
