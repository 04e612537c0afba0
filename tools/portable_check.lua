-- `make portable-check LUV_SRC=...`: the whole suite against luv as
-- luarocks builds it for users outside Debian (its own libuv, linked in
-- statically; no C headers installed), on a tree of its own:
--
--   1. Lua's own headers copied to a directory of their own: the only
--      headers that the builds below may see (no luv, no libuv header);
--   2. luv built from LUV_SRC into a fresh luarocks tree (LUV_SRC: the
--      source rock `luarocks download --source luv` fetches, a tarball of
--      an unpacked one, or its directory; "download": fetch it now);
--   3. this checkout's rock (`make rock`) installed into that tree;
--   4. what the modules include and link checked: no luv or libuv header
--      in any C file's dependencies, no libuv.so in any module's `ldd`;
--   5. the suite run against the tree (Redis specs included), one busted
--      process per spec file (spec/each.lua, a file that hangs named and
--      killed after AM_EACH_TIMEOUT seconds, default 600): with libuv's
--      defaults, then with UV_USE_IO_URING=1 (libuv >= 1.45 batches its
--      epoll changes on io_uring then, whatever the kernel);
--   6. the libuv mapped into a process that uses the Redis client:
--      `grep libuv /proc/PID/maps` (none: luv's own is inside luv.so).
--
--   lua5.4 tools/portable_check.lua LUV_SRC DIR     (make portable-check)
--
-- Everything goes to DIR (build/portable), which is made afresh, and the
-- log to DIR/check.log as well as stdout.  Exits 1 at the first failure.

local LUV_SRC, DIR = arg[1], arg[2]
if not (LUV_SRC and DIR) then
  io.stderr:write("usage: lua5.4 tools/portable_check.lua LUV_SRC DIR\n")
  os.exit(2)
end

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local ROOT = io.popen("pwd"):read("l")
if DIR:sub(1, 1) ~= "/" then DIR = ROOT .. "/" .. DIR end
if LUV_SRC ~= "download" and LUV_SRC:sub(1, 1) ~= "/" then LUV_SRC = ROOT .. "/" .. LUV_SRC end
local TREE, INC = DIR .. "/tree", DIR .. "/lua-include"
local LUA_INC = os.getenv("LUA_INC") or "/usr/include/lua5.4"

os.execute("rm -rf " .. q(DIR) .. " && mkdir -p " .. q(DIR))
local logf = assert(io.open(DIR .. "/check.log", "w"))
local function log(...)
  local s = table.concat({ ... })
  io.stdout:write(s, "\n")
  io.stdout:flush()
  logf:write(s, "\n")
  logf:flush()
end
local function fail(msg)
  log("portable-check FAILED: ", msg)
  os.exit(1)
end

-- Runs a shell command (not under a preloaded sanitizer); returns its exit
-- code and output.  `shown`: the output goes to the log too.
local function sh(command, shown)
  local p = assert(io.popen("(unset LD_PRELOAD; " .. command .. ") 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  if shown then log(out) end
  return code, out
end
local function must(command, shown)
  log("$ ", command)
  local code, out = sh(command, shown)
  if code ~= 0 then
    log(out)
    fail(("`%s` exited %s"):format(command, tostring(code)))
  end
  return out
end

-- luarocks with a configuration of this check only: this tree, no server
-- (offline), and Lua's headers from INC for every build.
local CONFIG = DIR .. "/luarocks-config.lua"
do
  local f = assert(io.open(CONFIG, "w"))
  f:write(("rocks_trees = { %q }\nrocks_servers = {}\nvariables = { LUA_INCDIR = %q }\n")
    :format(TREE, INC))
  f:close()
end
local LUAROCKS = ("LUAROCKS_CONFIG=%s luarocks --lua-version 5.4 --tree %s")
  :format(q(CONFIG), q(TREE))

local START = os.time()
log("== portable-check: ", os.date("!%Y-%m-%d %H:%M:%S UTC"), " in ", DIR)

-- 1. Lua's headers, alone
must(("mkdir -p %s && cp %s %s"):format(q(INC),
  table.concat({ "lua.h", "luaconf.h", "lualib.h", "lauxlib.h", "lua.hpp" }, " ")
    :gsub("(%S+)", function(h) return q(LUA_INC .. "/" .. h) end), q(INC)))

-- 2. luv, as its rock builds it (with cmake)
if sh("command -v cmake") ~= 0 then
  fail("luv's rock builds with cmake: install it (apt-get install cmake)")
end
if LUV_SRC == "download" then
  local code = sh(("cd %s && luarocks --lua-version 5.4 download --source luv"):format(q(DIR)))
  local found = code == 0 and io.popen("ls " .. q(DIR) .. "/luv-*.src.rock 2>/dev/null"):read("l")
  if not found then
    fail("`luarocks download --source luv` failed (offline?): pass "
      .. "LUV_SRC=path to luv's source rock, fetched where the network is")
  end
  LUV_SRC = found
end
if LUV_SRC:match("%.src%.rock$") then
  must(("cd %s && %s install %s"):format(q(DIR), LUAROCKS, q(LUV_SRC)))
else
  local src = LUV_SRC
  if LUV_SRC:match("%.tar%.gz$") or LUV_SRC:match("%.tgz$") then
    must(("mkdir -p %s/luv-src && tar -xzf %s -C %s/luv-src"):format(q(DIR), q(LUV_SRC), q(DIR)))
    src = io.popen(("dirname \"$(ls %s/luv-src/*/*.rockspec %s/luv-src/*.rockspec 2>/dev/null | head -1)\"")
      :format(q(DIR), q(DIR))):read("l")
  end
  local rockspec = io.popen("ls " .. q(src) .. "/luv-*.rockspec 2>/dev/null"):read("l")
  if not rockspec then fail("no luv-*.rockspec in " .. tostring(src)) end
  must(("cd %s && %s make %s"):format(q(src), LUAROCKS, q(rockspec)))
end

-- 3. this checkout's rock
must(("make -s rock ROCK_DIR=%s"):format(q(DIR)))
local rock = io.popen("ls " .. q(DIR) .. "/async-mutex-*.src.rock"):read("l")
must(("cd %s && %s install %s"):format(q(DIR), LUAROCKS, q(rock)))
log(must(LUAROCKS .. " list --porcelain"))

-- The paths that see the tree first (then the system's, for busted).
local LUA_PATH = TREE .. "/share/lua/5.4/?.lua;" .. TREE .. "/share/lua/5.4/?/init.lua;;"
local LUA_CPATH = TREE .. "/lib/lua/5.4/?.so;;"
local ENV = ("env -u LUA_PATH_5_4 -u LUA_CPATH_5_4 -u LUA_INIT LUA_PATH=%s LUA_CPATH=%s ")
  :format(q(LUA_PATH), q(LUA_CPATH))

local version = must(ENV .. "lua5.4 -e 'io.write(require(\"luv\").version_string())'")
local luv_so = must(ENV .. [[lua5.4 -e 'io.write(package.searchpath("luv", package.cpath))']])
log("luv's libuv: ", version, " (", luv_so, ")")

-- 4. what the modules include and link
log("== the tree")
log(must(("cd %s && find lib/lua share/lua -type f | sort"):format(q(TREE))))
for _, src in ipairs({ "src/*.c", "src/core/*/*.c", "src/redis/*.c" }) do
  local deps = must(("cc -M -I%s %s"):format(q(INC), src))
  for header in deps:gmatch("%S+%.h") do
    if header:match("uv%.h$") or header:match("/uv/") or header:match("luv") then
      fail(src .. " includes " .. header)
    end
  end
end
log("no C file includes a luv or libuv header")
log("== ldd of every module")
for so in must(("find %s/lib/lua -name '*.so' | sort"):format(q(TREE))):gmatch("[^\n]+") do
  local out = must("ldd " .. q(so))
  log(so, ":\n", out)
  if out:match("libuv") then fail(so .. " links a libuv") end
end

-- 5. the suite, twice, one busted process per spec file (spec/each.lua):
-- a file that hangs is killed after AM_EACH_TIMEOUT seconds and named,
-- with the test it was in, and the run goes on.  Its lines go to the log
-- as they come.
local EACH_TIMEOUT = tonumber(os.getenv("AM_EACH_TIMEOUT") or "") or 600
local function suite(label, env)
  log("== the suite, ", label, " (spec/each.lua: one process per file, ",
    EACH_TIMEOUT, " s at most each)")
  local t0 = os.time()
  local p = assert(io.popen(("(unset LD_PRELOAD; cd %s && %s %s AM_EACH_TIMEOUT=%d"
    .. " lua5.4 spec/each.lua --lpath=%s --cpath=%s) 2>&1")
    :format(q(ROOT), env, ENV, EACH_TIMEOUT, q("spec/?.lua"), q(TREE .. "/lib/lua/5.4/?.so"))))
  -- (a failing file's own output, copied in, ends with its counts too:
  -- the total is the line after "N files in N s")
  local summary, failing, ended = "(no summary: spec/each.lua did not finish)", nil, false
  for line in p:lines() do
    log(line)
    if line:match("^%d+ files in %d+ s$") then ended = true
    elseif ended then
      summary = line:match("^%d+ passed, %d+ failed$") or summary
      failing = line:match("^failing files: (.*)$") or failing
    end
  end
  local ok = p:close()
  log(label, ": ", summary, (" (%d s)"):format(os.time() - t0),
    failing and (", failing: " .. failing) or "")
  return ok and summary:match(", 0 failed$") ~= nil, summary
end
local ok1, sum1 = suite("libuv's defaults", "")
local ok2, sum2 = suite("UV_USE_IO_URING=1", "UV_USE_IO_URING=1")

-- 6. the libuv in a process that uses the Redis client
log("== grep libuv /proc/PID/maps of a process using the Redis client")
local maps = must(("cd %s && %s lua5.4 -e %s"):format(q(ROOT), ENV, q([[
package.path = "spec/?.lua;" .. package.path
local uv = require "luv"
local redis = require "async_mutex.redis"
local server = require("redis_server").start()
local client = redis.connect({ port = server.port })
local reply
coroutine.wrap(function() reply = client:call("PING"); client:close() end)()
uv.run()
server:stop()
local pid = ("%d"):format(uv.os_getpid())   -- (a float from luv 1.48)
local p = io.popen("grep -E 'libuv|luv' /proc/" .. pid .. "/maps | awk '{print $6}' | sort -u")
io.write("pid ", pid, ", PING: ", tostring(reply), "\n", p:read("a"))
p:close()
local q = io.popen("grep -c libuv /proc/" .. pid .. "/maps")
io.write("lines naming libuv: ", q:read("l"), "\n")
q:close()
]])))
log(maps)
if not maps:match("PING: PONG") then fail("the Redis client did not answer") end
if not maps:match("lines naming libuv: 0") then fail("a libuv.so is mapped") end

-- The last line: both runs' counts summed, as `make test` ends.
local function counts(summary)
  local p, f = summary:match("(%d+) passed, (%d+) failed")
  return tonumber(p) or 0, tonumber(f) or 1
end
local p1, f1 = counts(sum1)
local p2, f2 = counts(sum2)
local total = ("%d passed, %d failed"):format(p1 + p2, f1 + f2)
if not (ok1 and ok2) then
  log("portable-check FAILED: the suite failed (see " .. DIR .. "/check.log)")
  log(total)
  os.exit(1)
end
log("portable-check passed: luv ", version, " from ", LUV_SRC, " in ",
  os.time() - START, " s; libuv's defaults: ", sum1, "; UV_USE_IO_URING=1: ", sum2)
log(total)
