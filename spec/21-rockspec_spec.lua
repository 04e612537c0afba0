-- Keeps async-mutex-scm-1.rockspec in step with the tree: the builtin build
-- lists its C sources and Lua modules one by one, so a new src/*.c or
-- src/async_mutex/*.lua must be added there too.

local ROOT do
  local source = debug.getinfo(1, "S").source:gsub("^@", "")
  ROOT = (source:match("^(.*)/[^/]*$") or ".") .. "/.."
end

local function load_rockspec()
  local spec = {}
  local chunk = assert(loadfile(ROOT .. "/async-mutex-scm-1.rockspec", "t", spec))
  chunk()
  return spec
end

describe("async-mutex-scm-1.rockspec", function()
  it("builds async_mutex.core from exactly the C files in src/", function()
    local listed = {}
    for _, file in ipairs(load_rockspec().build.modules["async_mutex.core"].sources) do
      listed[#listed + 1] = file
    end
    table.sort(listed)
    local present = {}
    local ls = assert(io.popen("cd '" .. ROOT .. "' && ls src/*.c"))
    for file in ls:lines() do present[#present + 1] = file end
    ls:close()
    table.sort(present)
    assert.are.same(present, listed)
  end)

  it("installs every Lua module of src/async_mutex/ under its name", function()
    local modules = load_rockspec().build.modules
    local ls = assert(io.popen("cd '" .. ROOT .. "' && ls src/async_mutex/*.lua"))
    local count = 0
    for file in ls:lines() do
      local name = file:match("^src/async_mutex/(.*)%.lua$")
      name = name == "init" and "async_mutex" or "async_mutex." .. name
      assert.are.equal(file, modules[name], name .. " is not in the rockspec")
      count = count + 1
    end
    ls:close()
    assert.is_true(count >= 7)
  end)

  it("installs the Lua layer as async_mutex", function()
    local spec = load_rockspec()
    assert.are.equal("src/async_mutex/init.lua", spec.build.modules.async_mutex)
    local f = io.open(ROOT .. "/" .. spec.build.modules.async_mutex)
    assert.is_truthy(f, "missing " .. spec.build.modules.async_mutex)
    f:close()
  end)
end)
