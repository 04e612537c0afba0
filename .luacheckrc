-- luacheck configuration (Debian package lua-check): `make lint`.
std = "lua54"
max_line_length = 120
ignore = {
  "211/release", "211/r",   -- <close> variables: used by going out of scope
  "581",                    -- 'not (x >= y)' is how NaN is refused
}
-- Specs hold objects only to drop them (GC tests) or to keep them alive.
files["spec"] = { std = "+busted", max_line_length = false, ignore = { "211", "311" } }
files["bench"] = { ignore = { "241", "542" } }
-- LuaLS definitions: functions with empty bodies.
files["types"] = { ignore = { "212" } }
exclude_files = { "build/", "bench/node/node_modules/" }
