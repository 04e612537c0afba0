-- Where a fuzzer run as a script (lua5.4 spec/fuzz/NAME.lua, from any
-- folder) finds this checkout's Lua code and build.  A fuzzer loads this
-- file by its own folder, before package.path can find anything:
--
--   local paths = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".")
--     .. "/paths.lua")
--   local root = paths.lua(debug.getinfo(1, "S").source)
--   paths.build_unless_chosen(root)      -- or paths.build_unless_ours(root)

local paths = {}

--- The repository root of the file whose chunk name is `source`
-- (ROOT/spec/fuzz/NAME.lua), with ROOT/src and ROOT/spec put first on
-- package.path.
function paths.lua(source)
  local root = source:match("^@(.*)/spec/fuzz/[^/]*$") or "."
  -- (root is "." when busted loads the file as spec/fuzz/...: its lpath has
  -- src/ and spec/ already, and a second, "./"-spelt copy would load
  -- async_mutex again under another chunk name in the later spec files)
  if not package.path:find(root .. "/spec/?.lua", 1, true)
      and not (root == "." and package.path:find("spec/?.lua", 1, true)) then
    package.path = ("%s/src/?.lua;%s/src/?/init.lua;%s/spec/?.lua;"):format(root, root, root)
      .. package.path
  end
  return root
end

--- ROOT/build first on package.cpath, unless the caller chose one (LUA_CPATH:
-- `make asan` and the specs under it run the sanitizer build, build/asan).
function paths.build_unless_chosen(root)
  if not (os.getenv("LUA_CPATH_5_4") or os.getenv("LUA_CPATH"))
      and not package.cpath:find(root .. "/build/?.so", 1, true) then
    package.cpath = root .. "/build/?.so;" .. package.cpath
  end
end

--- ROOT/build first on package.cpath, unless a build of this checkout is on
-- it already: that one is the one under test (`make asan` puts build/asan
-- first), and two builds loaded at once would share one scheduler.
-- Otherwise (an installed copy, or none) build/.
function paths.build_unless_ours(root)
  local found = package.searchpath("async_mutex.core", package.cpath)
  local ours = found and (not found:match("^/") or found:sub(1, #root + 1) == root .. "/")
  if not ours then
    package.cpath = ("%s/build/?.so;"):format(root) .. package.cpath
  end
end

return paths
