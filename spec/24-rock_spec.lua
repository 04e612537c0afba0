-- `make rock`, then the source rock installed as a user would on a machine
-- with no checkout and no network: from another directory, into a fresh
-- tree, with luarocks told that luv is provided (Debian's lua-luv) and given
-- no server to reach; then the module required and the bank example run
-- from outside the checkout, and the Redis modules used from the tree.  About a second: the install compiles the C
-- core.

local am = require "async_mutex"
local h = require "helpers"

local ROOT = h.ROOT

local q, sh, must = h.shquote, h.sh, h.must

local function load_rockspec(file)
  local spec = {}
  assert(loadfile(file, "t", spec))()
  return spec
end

local ROCK = ("async-mutex-%s-1"):format(am._VERSION)

describe("make rock", function()
  local tmp, out_dir, home, tree, install_log

  -- Lua paths that see the tree and the system's modules (luv), nothing of
  -- the checkout.
  local function lua_env()
    return ("env -u LUA_PATH_5_4 -u LUA_CPATH_5_4 -u LUA_INIT -u LUA_INIT_5_4 "
      .. "LUA_PATH=%s LUA_CPATH=%s"):format(
      q(tree .. "/share/lua/5.4/?.lua;" .. tree .. "/share/lua/5.4/?/init.lua;;"),
      q(tree .. "/lib/lua/5.4/?.so;;"))
  end

  setup(function()
    tmp = must("mktemp -d"):gsub("%s+$", "")
    out_dir, home, tree = tmp .. "/out", tmp .. "/elsewhere", tmp .. "/tree"
    must(("mkdir -p %s %s"):format(q(out_dir), q(home)))
    must(("make -s -C %s rock ROCK_DIR=%s"):format(q(ROOT), q(out_dir)))
    -- The user's machine: the rock alone, and a luarocks configuration that
    -- declares Debian's luv and has no server to download from.
    must(("cp %s/%s.src.rock %s/"):format(q(out_dir), ROCK, q(home)))
    local luv = must("dpkg-query -W -f='${Version}' lua-luv"):match("^(.*)-[^-]*$")
    local f = assert(io.open(home .. "/config.lua", "w"))
    f:write(("rocks_servers = {}\nrocks_provided = { luv = %q }\n"):format(luv))
    f:close()
    install_log = must(("cd %s && LUAROCKS_CONFIG=config.lua luarocks "
      .. "--lua-version 5.4 --tree %s install ./%s.src.rock")
      :format(q(home), q(tree), ROCK))
  end)

  teardown(function()
    if tmp and tmp:match("^/tmp/") then sh("rm -rf " .. q(tmp)) end
  end)

  it("writes rockspecs/<package>-<_VERSION>-1.rockspec from the development "
    .. "rockspec, with the same modules and directories", function()
    local dev = load_rockspec(ROOT .. "/async-mutex-scm-1.rockspec")
    local rel = load_rockspec(out_dir .. "/rockspecs/" .. ROCK .. ".rockspec")
    assert.equal(am._VERSION .. "-1", rel.version)
    assert.equal("async-mutex-" .. am._VERSION, rel.source.dir)
    assert.matches("^file:///.*/async%-mutex%-" .. am._VERSION:gsub("%.", "%%.")
      .. "%.tar%.gz$", rel.source.url)
    assert.same(dev.build, rel.build)
    assert.same(dev.dependencies, rel.dependencies)
    assert.same(dev.description, rel.description)
    assert.equal("MIT", rel.description.license)
    must(("cd %s && luarocks --lua-version 5.4 lint rockspecs/%s.rockspec")
      :format(q(out_dir), ROCK))
  end)

  it("packs a source rock holding the rockspec and the tracked sources",
    function()
      local listing = must(("unzip -l %s/%s.src.rock"):format(q(out_dir), ROCK))
      assert.matches(ROCK:gsub("%p", "%%%0") .. "%.rockspec", listing)
      local tarball = ("async-mutex-%s.tar.gz"):format(am._VERSION)
      assert.matches(tarball:gsub("%p", "%%%0"), listing)
      local files = must(("cd %s && unzip -p %s.src.rock %s | tar -tzf -")
        :format(q(home), ROCK, tarball))
      local top = "async-mutex-" .. am._VERSION .. "/"
      local present = {}
      for line in files:gmatch("[^\n]+") do present[line] = true end
      for _, file in ipairs({ "LICENSE", "README.md", "CHANGELOG.md",
        "src/async_mutex/init.lua", "src/core/bindings/core.c", "types/async_mutex.lua",
        "examples/withdraw.lua" }) do
        assert(present[top .. file], file .. " is not in the rock:\n" .. files)
      end
      assert.is_nil(files:find(top .. "build/", 1, true))
    end)

  it("installs offline into a fresh tree, with luv declared provided and no "
    .. "missing dependency", function()
      assert.matches("async%-mutex " .. am._VERSION:gsub("%.", "%%.")
        .. "%-1 is now installed in", install_log)
      assert.matches("luv >= [%d.]+ %([%d.-]+ provided by VM%)", install_log)
      assert.is_nil(install_log:find("issing", 1, true), install_log)
      assert.is_nil(install_log:find("not installed", 1, true), install_log)
      local list = must(("luarocks --lua-version 5.4 --tree %s list --porcelain")
        :format(q(tree)))
      assert.matches("^async%-mutex\t" .. am._VERSION:gsub("%.", "%%.") .. "%-1\tinstalled", list)
    end)

  it("requires async_mutex and its C core from the tree, outside the checkout, "
    .. "with _VERSION = the rock's version", function()
      local out = must(("cd %s && %s lua5.4 -e %s"):format(q(home), lua_env(), q([[
        local am = require "async_mutex"
        print(package.searchpath("async_mutex", package.path))
        print(package.searchpath("async_mutex.core", package.cpath))
        print(am._VERSION)
        print(type(am.Mutex.new), type(am.KeyedSemaphore.new))
      ]])))
      assert.equal(table.concat({
        tree .. "/share/lua/5.4/async_mutex/init.lua",
        tree .. "/lib/lua/5.4/async_mutex/core.so",
        am._VERSION,
        "function\tfunction",
      }, "\n") .. "\n", out)
    end)

  it("serves the Redis client, versioned values and Redis locks from the tree, "
    .. "against a real server", function()
      local server = require("redis_server").start()
      local ok, out = pcall(must, ("cd %s && %s lua5.4 -e %s"):format(q(home), lua_env(), q(([[
        local uv = require "luv"
        local am = require "async_mutex"
        local redis = require "async_mutex.redis"
        for _, name in ipairs({ "async_mutex.redis", "async_mutex.versioned",
          "async_mutex.optimistic", "async_mutex.redis_lock", "async_mutex.checks" }) do
          print(package.searchpath(name, package.path))
        end
        print(package.searchpath("async_mutex.redis_core", package.cpath))
        local client = redis.connect({ path = %q })
        am.spawn(function()
          print(client:call("PING"))
          local v = redis.versioned(client, "rock:v")
          print(v:update(function(value) return (tonumber(value) or 0) + 1 end))
          local release = am.RedisMutex.new(client, "rock:m"):acquire()
          print(release())
          client:close()
        end)
        uv.run()
      ]]):format(server.path))))
      server:stop()
      assert(ok, out)
      local lua = tree .. "/share/lua/5.4/async_mutex/"
      assert.equal(table.concat({
        lua .. "redis.lua", lua .. "versioned.lua", lua .. "optimistic.lua",
        lua .. "redis_lock.lua", lua .. "checks.lua",
        tree .. "/lib/lua/5.4/async_mutex/redis_core.so",
        "PONG", "1\t1", "true",
      }, "\n") .. "\n", out)
    end)

  it("runs the bank example shipped in the rock with the installed module",
    function()
      local rock_dir = must(("LUAROCKS_CONFIG=%s/config.lua luarocks --lua-version 5.4 "
        .. "--tree %s show --rock-dir async-mutex"):format(q(home), q(tree))):gsub("%s+$", "")
      assert.equal(tree .. "/lib/luarocks/rocks-5.4/async-mutex/" .. am._VERSION .. "-1", rock_dir)
      local out = must(("cd %s && %s lua5.4 %s/examples/withdraw.lua")
        :format(q(home), lua_env(), q(rock_dir)))
      assert.equal(h.read_file(ROOT .. "/examples/withdraw.lua"),
        h.read_file(rock_dir .. "/examples/withdraw.lua"))
      -- what it prints from the checkout (spec/20 checks that)
      assert.equal(must(("cd %s && lua5.4 examples/withdraw.lua"):format(q(ROOT))), out)
      assert.matches("refused, insufficient funds", out)
      -- the annotations: with the modules, at a path that an upgrade keeps
      -- (README, "Editor support")
      assert.equal(h.read_file(ROOT .. "/types/async_mutex.lua"),
        h.read_file(tree .. "/share/lua/5.4/async_mutex/types/async_mutex.lua"))
      -- found as README says: the tree's Lua directory, from luarocks, with
      -- no version in it
      local lua_dir = must(("LUAROCKS_CONFIG=%s/config.lua luarocks --lua-version 5.4 "
        .. "--tree %s config deploy_lua_dir"):format(q(home), q(tree))):gsub("%s+$", "")
      local types = lua_dir .. "/async_mutex/types"
      assert.not_matches(am._VERSION, types, 1, true)
      for _, file in ipairs({ "async_mutex.lua", "async_mutex_redis.lua", "redis_lock.lua",
          "versioned.lua" }) do
        assert.equal(h.read_file(ROOT .. "/types/" .. file), h.read_file(types .. "/" .. file))
      end
    end)
end)
