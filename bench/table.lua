-- Prints the tables of a results file in Markdown, as bench/run.lua printed
-- them (docs/bench.md's table is this output), one per section.
--
--   lua5.4 bench/table.lua [RESULTS [SECTION]]
--
-- RESULTS defaults to bench/results/latest.json (in this checkout); SECTION
-- picks one section by name (local, keyed, or one another driver wrote).

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/bench$") or (here == "bench" and ".") or here .. "/.."
package.path = here .. "/?.lua;" .. package.path
local results = require "results"

local input = arg[1] or (root .. "/bench/results/latest.json")
local only = arg[2]

local shown = 0
for _, section in ipairs(results.load(input).sections) do
  if not only or section.name == only then
    if shown > 0 then print() end
    print(("%s (%s, %s):"):format(section.title or section.name, section.name,
      section.date or "undated"))
    print()
    print(results.markdown(section))
    shown = shown + 1
  end
end
if shown == 0 then
  io.stderr:write("table: no section", only and (" named " .. only) or "", " in ", input, "\n")
  os.exit(1)
end
