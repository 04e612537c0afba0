-- Keeps async-mutex-scm-1.rockspec and the Makefile in step with the tree:
-- luarocks builds with `make rock-build` and installs with `make
-- rock-install` (build type "make", so that the Redis part is built only
-- where hiredis is), which take every C file of src/core/ (and
-- src/error_text.c) into the core, every Lua
-- module of src/async_mutex/ under its name, and the annotations of
-- types/, with no list to keep up to date.  Here the two targets run into
-- a temporary directory, as luarocks runs them.

local h = require "helpers"

local ROOT = h.ROOT

local function load_rockspec()
  local spec = {}
  local chunk = assert(loadfile(ROOT .. "/async-mutex-scm-1.rockspec", "t", spec))
  chunk()
  return spec
end

local must = h.must

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  table.sort(t)
  return t
end

describe("async-mutex-scm-1.rockspec", function()
  it("builds and installs with the Makefile's rock targets, passing luarocks' flags and directories",
    function()
      local build = load_rockspec().build
      assert.equal("make", build.type)
      assert.equal("rock-build", build.build_target)
      assert.equal("rock-install", build.install_target)
      assert.same({ CFLAGS = "$(CFLAGS)", LIBFLAG = "$(LIBFLAG)", LUA_INCDIR = "$(LUA_INCDIR)" },
        build.build_variables)
      assert.same({ INST_LIBDIR = "$(LIBDIR)", INST_LUADIR = "$(LUADIR)" },
        build.install_variables)
      -- (no external_dependencies: luarocks would then refuse the whole
      -- rock where hiredis is missing, the core too)
      assert.is_nil(load_rockspec().external_dependencies)
    end)

  it("installs the C modules (the core from every C file of src/core/), every Lua module of "
    .. "src/async_mutex/ and the annotations of types/", function()
      local tmp = must("mktemp -d"):gsub("%s+$", "")
      -- (a build of its own, ROCK_BUILD: another suite run beside this one
      -- from the checkout builds in build/luarocks)
      local build = tmp .. "/build"
      must(("cd '%s' && make -s rock-build ROCK_BUILD='%s' CFLAGS='-O2 -fPIC' LIBFLAG=-shared "
        .. "LUA_INCDIR=/usr/include/lua5.4 && make -s rock-install ROCK_BUILD='%s' "
        .. "INST_LIBDIR='%s/lib' INST_LUADIR='%s/lua'"):format(ROOT, build, build, tmp, tmp))
      local installed = lines(must(("cd '%s' && find lib lua -type f"):format(tmp)))
      local expected = {}
      for file in must(("cd '%s' && ls src/async_mutex/*.lua types/*.lua"):format(ROOT))
          :gmatch("[^\n]+") do
        local dir, name = file:match("^(.*)/([^/]*)$")
        expected[#expected + 1] = dir == "types" and "lua/async_mutex/types/" .. name
          or "lua/async_mutex/" .. name
      end
      expected[#expected + 1] = "lib/async_mutex/core.so"
      if pcall(require, "async_mutex.redis_core") then   -- built where hiredis is
        expected[#expected + 1] = "lib/async_mutex/redis_core.so"
      end
      table.sort(expected)
      assert.same(expected, installed)
      -- the core's objects: one per C file of src/core/'s layer folders,
      -- and src/error_text.c's
      local objects = {}
      for o in must(("cd '%s/obj' && ls core/*/*.o error_text.o"):format(build))
          :gmatch("[^\n]+") do
        objects[#objects + 1] = "src/" .. o:gsub("%.o$", ".c")
      end
      table.sort(objects)
      assert.same(lines(must(("cd '%s' && ls src/core/*/*.c src/error_text.c"):format(ROOT))),
        objects)
      assert.is_true(#objects >= 10)
      assert.equal(h.read_file(ROOT .. "/src/async_mutex/init.lua"),
        h.read_file(tmp .. "/lua/async_mutex/init.lua"))
      must(("rm -rf '%s'"):format(tmp))
    end)
end)
