-- The Redis client installs and works wherever luarocks runs (docs/redis.md,
-- Connection; README, "Install with luarocks"): its C part includes no
-- luv or libuv header and links no libuv (luv's public Lua API only: luv
-- from luarocks has its own libuv inside and installs no header); hiredis
-- is its only external dependency, and without hiredis the rest of the
-- rock builds and installs, `require "async_mutex.redis"` saying what is
-- missing; its sockets are closed on exec, so that a child process never
-- keeps a connection open (one did, which on libuv >= 1.45 left a stale
-- registration in luv's epoll set: docs/redis.md, Connection).
-- `make portable-check` runs the whole suite on luv 1.48 as luarocks
-- builds it, also with io_uring forced.

local h = require "helpers"
local redis_server = require "redis_server"

local ROOT = h.ROOT

local q, must = h.shquote, h.must

describe("async_mutex.redis_core", function()
  local so = package.searchpath("async_mutex.redis_core", package.cpath)

  it("links no libuv and calls none of its functions", function()
    assert.is_string(so)
    assert.not_matches("libuv", must("ldd " .. q(so)))
    local undefined = must("nm -D --undefined-only " .. q(so))
    assert.not_matches("%f[%w_]uv_", undefined)
    assert.not_matches("luv_", undefined)
    assert.matches("redisReaderCreate", undefined)        -- hiredis: its parser
  end)

  it("includes no luv or libuv header, with only Lua's headers given", function()
    local tmp = must("mktemp -d"):gsub("%s+$", "")
    must(("cp /usr/include/lua5.4/lua.h /usr/include/lua5.4/luaconf.h "
      .. "/usr/include/lua5.4/lauxlib.h %s"):format(q(tmp)))
    local deps = must(("cd %s && cc -M -I%s src/redis/*.c src/*.c"):format(q(ROOT), q(tmp)))
    must("rm -rf " .. q(tmp))
    for header in deps:gmatch("%S+%.h") do
      assert.is_nil(header:match("luv") or header:match("/uv%.h$") or header:match("/uv/"),
        header)
    end
    assert.matches("hiredis/", deps)
  end)
end)

describe("a rock built where hiredis is missing", function()
  it("installs the core and the Lua modules; require 'async_mutex.redis' says what is missing",
    function()
      local tmp = must("mktemp -d"):gsub("%s+$", "")
      -- (a build of its own, ROCK_BUILD: NO_HIREDIS leaves no
      -- redis_core.so there for rock-install to take, and no other suite
      -- run beside this one from the checkout builds there)
      local build = tmp .. "/build"
      local out = must(("cd %s && make -s rock-build NO_HIREDIS=1 ROCK_BUILD=%s "
        .. "CFLAGS='-O2 -fPIC' LIBFLAG=-shared LUA_INCDIR=/usr/include/lua5.4"):format(
        q(ROOT), q(build)))
      assert.matches("hiredis not found: async_mutex.redis is not built", out, 1, true)
      must(("cd %s && make -s rock-install ROCK_BUILD=%s INST_LIBDIR=%s/lib INST_LUADIR=%s/lua")
        :format(q(ROOT), q(build), q(tmp), q(tmp)))
      local files = must(("cd %s && find lib lua -type f | sort"):format(q(tmp)))
      assert.matches("lib/async_mutex/core.so\n", files, 1, true)
      assert.not_matches("redis_core", files, 1, true)
      local res = h.subprocess(([[
        package.path = %q .. "/lua/?.lua;" .. %q .. "/lua/?/init.lua"
        package.cpath = %q .. "/lib/?.so;/usr/lib/x86_64-linux-gnu/lua/5.4/?.so"
        local am = require "async_mutex"
        print(type(am.Mutex.new), tostring(am.E_UNAVAILABLE))
        print(select(2, pcall(require, "async_mutex.redis")))
        print((select(2, pcall(function() return am.RedisMutex end)):gsub("^[^:]*:%%d+: ", "")))
      ]]):format(tmp, tmp, tmp), 30)
      must("rm -rf " .. q(tmp))
      assert.equal("", res.stderr)
      local msg = "async_mutex.redis needs its C part, async_mutex.redis_core, built only where"
        .. " hiredis is installed (Debian: libhiredis-dev): install hiredis, then reinstall"
        .. " async-mutex (async_mutex.redis_core: not installed)"
      assert.equal("function\tredis server unavailable\n" .. msg .. "\n" .. msg .. "\n", res.stdout)
    end)
end)

describe("the client's sockets", function()
  local server = redis_server.for_file(setup, teardown)

  it("are closed on exec: a child process started while connected holds none of them",
    function()
      local redis = require "async_mutex.redis"
      local uv = require "luv"
      local inherited, ours
      h.run(function()
        local c = redis.connect({ port = server.port })
        local s = c:subscribe("spec100", function() end)       -- two connections
        assert.equal("PONG", c:call("PING"))
        -- our sockets, by inode
        ours = {}
        local dir = assert(uv.fs_scandir("/proc/self/fd"))
        for name in function() return uv.fs_scandir_next(dir) end do
          local inode = (uv.fs_readlink("/proc/self/fd/" .. name) or ""):match("^socket:%[(%d+)%]$")
          if inode then ours[inode] = true end
        end
        -- what a child sees as its own (io.popen: fork and exec of sh)
        local p = io.popen("LD_PRELOAD= ls -l /proc/self/fd/ 2>/dev/null")
        inherited = {}
        for inode in p:read("a"):gmatch("socket:%[(%d+)%]") do
          if ours[inode] then inherited[#inherited + 1] = inode end
        end
        p:close()
        s:unsubscribe()
        c:close()
      end)
      assert.is_truthy(next(ours))
      assert.same({}, inherited)
    end)

  it("end with close() while a child process started before still runs", function()
    -- (before, the child kept the connection open: the server saw it go
    -- only when the child ended)
    local redis = require "async_mutex.redis"
    local clients
    h.run(function()
      local c = redis.connect({ port = server.port })
      assert.equal("PONG", c:call("PING"))
      local child = io.popen("LD_PRELOAD= sleep 1")   -- forked while connected
      c:close()
      local probe = redis.connect({ port = server.port })
      h.sleep(50)
      clients = probe:call("CLIENT", "LIST")
      probe:close()
      child:close()
    end, { deadline = 10000 })
    local n = select(2, clients:gsub("\n", ""))
    assert.equal(1, n, clients)                    -- only the probe
  end)
end)
