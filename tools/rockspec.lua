-- Writes a release rockspec on stdout, made from the development rockspec:
--
--   lua5.4 tools/rockspec.lua async-mutex-scm-1.rockspec 0.1.0-1 URL
--
-- The development rockspec is the template: everything in it (description,
-- dependencies, the modules to build, the directories to copy) is kept as
-- it is; only its opening comment, `version` and `source` are replaced.  A
-- module added to the development rockspec is in every release rockspec
-- made after it.  URL is the source tarball, whose top directory is
-- async-mutex-<version without the revision>.  `make rock` runs this.

local template_file, version, url = arg[1], arg[2], arg[3]
if not (template_file and version and url) then
  io.stderr:write("usage: lua5.4 tools/rockspec.lua TEMPLATE VERSION-REV URL\n")
  os.exit(2)
end
local release = version:match("^(%d+%.%d+%.%d+)%-%d+$")
if not release then
  io.stderr:write("tools/rockspec.lua: version must look like 0.1.0-1, got ",
    version, "\n")
  os.exit(2)
end

local f = assert(io.open(template_file, "r"))
local text = f:read("a")
f:close()

--- Replaces the one match of `pattern` in `text` by `repl`; fails unless
-- there is exactly one.
local function replace_once(pattern, repl, what)
  local n
  text, n = text:gsub(pattern, function() return repl end)
  if n ~= 1 then
    error(("%s: expected one %s, found %d"):format(template_file, what, n), 0)
  end
end

local dir = "async-mutex-" .. release
replace_once("^.-\nrockspec_format", table.concat({
  ("-- async-mutex %s, written by `make rock` from %s:"):format(
    version, template_file:match("[^/]*$")),
  "-- edit that file, not this one.  Install the source rock packed with it:",
  ("--   luarocks --lua-version 5.4 install ./async-mutex-%s.src.rock"):format(version),
  "--",
  "-- luv is a real run-time dependency and is declared as one.  Debian's",
  "-- lua-luv package is not a rock, so luarocks does not see it: on Debian,",
  "-- either pass --deps-mode=none, or declare it provided once with",
  "--   luarocks --lua-version 5.4 config --scope user rocks_provided.luv 1.44.2-0",
  "rockspec_format",
}, "\n"), "opening comment before rockspec_format")
replace_once('\nversion = "[^"\n]*"\n', ('\nversion = %q\n'):format(version),
  "version line")
replace_once("\nsource = %b{}\n", ("\nsource = {\n  url = %q,\n  dir = %q,\n}\n")
  :format(url, dir), "source table")

-- The result must be a rockspec with what we put in.
local spec = {}
assert(load(text, "=rockspec", "t", spec))()
assert(spec.version == version and spec.source.url == url
  and spec.source.dir == dir and spec.package == "async-mutex",
  "tools/rockspec.lua: the rockspec written does not say what was asked")

io.write(text)
