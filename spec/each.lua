-- Runs every spec file in a busted process of its own and sums their
-- closing lines into one "N passed, N failed".  `make gcstress` uses it:
-- under the most aggressive collector each step traverses the whole live
-- heap, so one process per file (a small heap) keeps the run linear; and
-- so does `make portable-check` (tools/portable_check.lua), where a file
-- that hangs must be named, not stall the whole run.
--
--   lua5.4 spec/each.lua [busted options] [spec files]
--
-- Spec files given (arguments ending in _spec.lua) run instead of all of
-- spec/*_spec.lua.  Environment:
--   AM_EACH_TIMEOUT   seconds a file may run (default 1800); a file still
--                     running then is killed and reported as hung, with
--                     the test it was in (AM_TEST_TRACE, spec/summary.lua)
--   BUSTED, LUA       busted's script and the interpreter
-- A hung file's process group is killed (timeout(1)); a redis-server it
-- had started, a daemon in a session of its own, is not.

local busted = os.getenv("BUSTED") or "/usr/bin/busted"
local lua = os.getenv("LUA") or "lua5.4"
local timeout = tonumber(os.getenv("AM_EACH_TIMEOUT") or "") or 1800

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local options, files = {}, {}
for _, a in ipairs(arg) do
  if a:match("_spec%.lua$") then files[#files + 1] = a else options[#options + 1] = q(a) end
end
if #files == 0 then
  for file in io.popen("ls spec/*_spec.lua"):lines() do files[#files + 1] = file end
end
local extra = table.concat(options, " ")

local function read_file(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local trace = os.tmpname()
local passed, failed, broken = 0, 0, {}
local clock0 = os.time()
for _, file in ipairs(files) do
  local t0 = os.time()
  os.remove(trace)
  -- timeout(1) ends the file's busted process (TERM, then KILL 10 s later)
  local pipe = io.popen(("AM_TEST_TRACE=%s timeout -k 10 %d %s %s %s %s 2>&1")
    :format(q(trace), timeout, q(lua), q(busted), extra, q(file)))
  local out = pipe:read("a")
  local _, _, code = pipe:close()
  local secs = os.time() - t0
  local p, f = out:match("(%d+) passed, (%d+) failed%s*$")
  local status
  if code == 124 or code == 137 then
    local test = read_file(trace)
    status = ("HUNG: killed after %d s%s"):format(timeout,
      test and test ~= "" and (", in the test \"" .. test .. "\"") or "")
  else
    status = p and (p .. " passed, " .. f .. " failed") or ("no summary (exit " .. tostring(code) .. ")")
  end
  io.write(("%-44s %s (%d s)\n"):format(file, status, secs))
  if code ~= 0 or not p or tonumber(f) > 0 then
    broken[#broken + 1] = file
    io.write(out)
  end
  passed = passed + (tonumber(p) or 0)
  failed = failed + (tonumber(f) or 0)
  if not p or (code ~= 0 and tonumber(f) == 0) then failed = failed + 1 end
  io.flush()
end
os.remove(trace)
io.write(("%d files in %d s\n"):format(#files, os.time() - clock0))
if #broken > 0 then io.write("failing files: ", table.concat(broken, " "), "\n") end
io.write(("%d passed, %d failed\n"):format(passed, failed))
os.exit(failed == 0)
