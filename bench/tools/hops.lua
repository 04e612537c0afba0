-- The path of one contended Mutex acquire -> release -> resume through the
-- C core, as a reader would follow it: the functions of src/core/ entered
-- (and how often), and the files they are in (by their layer's folder,
-- docs/internals.md).  Runs the cycle K and K + 10
-- times under callgrind, on a build without optimization (so that every
-- function is a function), and keeps the calls that grew by a multiple of
-- 10: the ones each cycle makes.
--
--   lua5.4 bench/tools/hops.lua [BUILD_DIR]     (from the repository root)
--
-- Needs valgrind.  BUILD_DIR (default build/hops) gets a -O0 build.

local build = arg[1] or "build/hops"

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local _, ok = sh(("make -s BUILD=%s CFLAGS='-O0 -g -fno-inline' LDFLAGS= all 2>&1")
  :format(build))
assert(ok, "build failed")

local script = os.tmpname()
local f = assert(io.open(script, "w"))
f:write([[
local am = require "async_mutex"
local uv = require "luv"
local m = am.Mutex.new()
local holder
coroutine.wrap(function() holder = m:acquire() end)()
for _ = 1, tonumber(arg[1]) do
  coroutine.wrap(function() holder = m:acquire() end)()   -- contended
  holder()                                               -- release: hand-off
  uv.run()                                               -- resume
end
holder()
]])
f:close()

-- calls[name] and edges["caller>callee"] over one run of k cycles;
-- file[name] for functions of the core: "engine/waiter.c" for
-- src/core/engine/waiter.c ("error_text.c": src/error_text.c).
local file = {}
local function calls(k)
  local out = os.tmpname()
  sh(("LUA_PATH='src/?.lua;src/?/init.lua;;' LUA_CPATH='%s/?.so;;' valgrind --tool=callgrind "
    .. "--compress-strings=no --compress-pos=no --callgrind-out-file=%s lua5.4 %s %d "
    .. ">/dev/null 2>&1"):format(build, out, script, k))
  local t, e, fl, fn, cfn = {}, {}, nil, nil, nil
  for line in io.lines(out) do
    local key, val = line:match("^(%a+)=(.*)$")
    if key == "fl" then fl = val
    elseif key == "fn" then
      fn = val
      local src = fl and (fl:match("/src/core/([%w_]+/[%w_]+%.c)$")
        or fl:match("/src/(error_text%.c)$"))
      if src then file[val] = src end
    elseif key == "cfn" then cfn = val
    elseif key == "calls" and cfn then
      local n = tonumber(val:match("^%d+"))
      t[cfn] = (t[cfn] or 0) + n
      local edge = fn .. ">" .. cfn
      e[edge] = (e[edge] or 0) + n
    end
  end
  os.remove(out)
  return t, e
end

local a, ea = calls(1)
local b, eb = calls(11)
os.remove(script)
local rows, files, total = {}, {}, 0
for name, n in pairs(b) do
  local per = (n - (a[name] or 0)) / 10
  if file[name] and per >= 1 then
    rows[#rows + 1] = { file[name], name, per }
    files[file[name]] = true
    total = total + per
  end
end
table.sort(rows, function(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  return x[2] < y[2]
end)
for _, r in ipairs(rows) do print(("%-26s %-28s %g"):format(r[1], r[2], r[3])) end
local nfiles = 0
for _ in pairs(files) do nfiles = nfiles + 1 end
-- hops: calls from a function of one file of the core into another file's;
-- of them, the calls from one folder into another
local hops, folder_hops = 0, 0
local function folder(path) return path:match("^(.*)/") or "." end
for edge, n in pairs(eb) do
  local from, to = edge:match("^(.*)>(.*)$")
  if file[from] and file[to] and file[from] ~= file[to] then
    local per = (n - (ea[edge] or 0)) / 10
    if per >= 1 and os.getenv("HOPS_EDGES") then
      print(("  %s:%s -> %s:%s  %g"):format(file[from], from, file[to], to, per))
    end
    hops = hops + per
    if folder(file[from]) ~= folder(file[to]) then folder_hops = folder_hops + per end
  end
end
print(("%d functions in %d files entered, %g calls, %g of them from one file into another "
  .. "(%g from one folder into another), per cycle"):format(#rows, nfiles, total, hops, folder_hops))
