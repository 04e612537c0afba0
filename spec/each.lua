-- Runs every spec file in a busted process of its own and sums their
-- closing lines into one "N passed, N failed".  `make gcstress` uses it:
-- under the most aggressive collector each step traverses the whole live
-- heap, so one process per file (a small heap) keeps the run linear.
--
--   lua5.4 spec/each.lua [busted options]

local busted = os.getenv("BUSTED") or "/usr/bin/busted"
local lua = os.getenv("LUA") or "lua5.4"
local extra = table.concat(arg, " ")

local files = {}
for file in io.popen("ls spec/*_spec.lua"):lines() do files[#files + 1] = file end

local passed, failed, broken = 0, 0, {}
for _, file in ipairs(files) do
  local pipe = io.popen(("%s %s %s %s 2>&1"):format(lua, busted, extra, file))
  local out = pipe:read("a")
  local ok = pipe:close()
  local p, f = out:match("(%d+) passed, (%d+) failed%s*$")
  io.write(("%-40s %s\n"):format(file, p and (p .. " passed, " .. f .. " failed") or "no summary"))
  if not ok or not p or tonumber(f) > 0 then
    broken[#broken + 1] = file
    io.write(out)
  end
  passed = passed + (tonumber(p) or 0)
  failed = failed + (tonumber(f) or 0)
  if not p or (not ok and tonumber(f) == 0) then failed = failed + 1 end
end
if #broken > 0 then io.write("failing files: ", table.concat(broken, " "), "\n") end
io.write(("%d passed, %d failed\n"):format(passed, failed))
os.exit(failed == 0)
