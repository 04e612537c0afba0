-- Draws the benchmark chart from a results file alone: for each row marked
-- `chart` (bench/results.lua), one group of bars, one bar per peer, on a log
-- scale; one panel per section and unit, with its unit on the axis.  Writes
-- a gnuplot script and runs gnuplot (Debian: gnuplot-nox).
--
--   lua5.4 bench/chart.lua [RESULTS [OUT]]     (from anywhere)
--   lua5.4 bench/chart.lua RESULTS -           (print the gnuplot script)
--
-- RESULTS defaults to bench/results/latest.json, OUT to docs/bench.svg (in
-- this checkout).  `make bench` runs it after its drivers.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/bench$") or (here == "bench" and ".") or here .. "/.."
package.path = here .. "/?.lua;" .. package.path
local results = require "results"

local input = arg[1] or (root .. "/bench/results/latest.json")
local output = arg[2] or (root .. "/docs/bench.svg")

local concat, floor, log = table.concat, math.floor, math.log

-- Colours for peers that name none, in order.
local PALETTE = { "#0b5394", "#e69138", "#999999", "#6aa84f", "#a64d79", "#45818e" }
local WIDTH, PANEL_H, TITLE_H = 1000, 330, 90

-- A gnuplot string literal (single quotes: no escapes but '').
local function q(s) return "'" .. s:gsub("'", "''") .. "'" end
-- A double-quoted one, where \n is a line break (tic labels).
local function qq(s) return '"' .. s:gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"' end

-- 3 significant digits with k / M, as the table rounds: 36.5, 124, 3.72k,
-- 2.00k, 227k, 1.20M.
local function short(v)
  local a = math.abs(v)
  if a < 1e3 then return results.fmt(v, "") end
  local s, suffix = v / 1e3, "k"
  if a >= 1e6 then s, suffix = v / 1e6, "M" end
  if math.abs(s) >= 100 then return ("%.0f"):format(s) .. suffix end
  if math.abs(s) >= 10 then return ("%.1f"):format(s) .. suffix end
  return ("%.2f"):format(s) .. suffix
end

local function tick_label(p)                     -- 10^p
  if p >= 6 then return ("%gM"):format(10 ^ (p - 6)) end
  if p >= 3 then return ("%gk"):format(10 ^ (p - 3)) end
  if p >= 0 then return ("%d"):format(floor(10 ^ p + 0.5)) end
  return ("%g"):format(10 ^ p)
end

local doc = results.load(input)
local charted = {}                  -- sections with a chart row

-- Panels: per section, the chart rows grouped by unit, in order of first
-- appearance; in each, the peers that have a value in one of its rows.
local panels = {}
for _, section in ipairs(doc.sections) do
  local by_unit = {}
  for _, row in ipairs(section.rows or {}) do
    if row.chart then
      local p = by_unit[row.unit]
      if not p then
        p = { section = section, unit = row.unit, rows = {} }
        by_unit[row.unit] = p
        panels[#panels + 1] = p
        if not charted[section] then
          charted[#charted + 1], charted[section] = section, true
          p.key = true                    -- the first panel of a section
        end
      end
      p.rows[#p.rows + 1] = row
    end
  end
end
for _, p in ipairs(panels) do
  p.peers = {}
  for i, peer in ipairs(p.section.peers) do
    for _, row in ipairs(p.rows) do
      local v = row.values[peer.id]
      if v and v > 0 then
        p.peers[#p.peers + 1] = { id = peer.id, label = peer.label,
                                  color = peer.color or PALETTE[(i - 1) % #PALETTE + 1] }
        break
      end
    end
  end
end
if #panels == 0 then
  io.stderr:write("chart: no row of ", input, " is marked for the chart\n")
  os.exit(1)
end

-- The script ------------------------------------------------------------------------

local out = {}
local function w(...) out[#out + 1] = concat({ ... }) end

local height = TITLE_H + PANEL_H * #panels
local first = doc.sections[1]
w("set terminal svg size ", WIDTH, ",", height, " dynamic font 'Helvetica,12' background rgb 'white'")
w("set output ", q(output))
w("set encoding utf8")
w("set termoption noenhanced")
local m = first.machine or {}
-- Joins the parts that are present with ", ".
local function join(...)
  local t, parts = {}, table.pack(...)
  for i = 1, parts.n do
    if parts[i] then t[#t + 1] = parts[i] end
  end
  return concat(t, ", ")
end
local subtitle = {
  join(first.date, m.cpu and m.cores and (m.cpu .. " x " .. m.cores .. " cores"), m.lua,
    m.luv and ("luv " .. m.luv), m.node and ("Node " .. m.node)),
  join(first.clock == "wall" and "elapsed time" or "CPU time of each process",
    first.load and first.load.before and first.load.after and
      ("load average %.2f before the run, %.2f after"):format(first.load.before, first.load.after),
    first.quick and "BENCH_QUICK: sizes / 10, not meaningful" or nil),
  "Every peer does the same work",
}
for _, p in ipairs(first.peers or {}) do
  if p.id == "floor" then
    subtitle[3] = subtitle[3] .. "; floor: the same coroutine traffic with no lock at all"
  end
end
w("set multiplot title ", qq("async_mutex benchmarks: the cost of each scenario, lower is better" ..
  " (log scale)\n" .. concat(subtitle, "\n")) .. " font ',13'")
w("set style fill solid 0.9 border rgb '#333333'")
w("set grid ytics mytics lc rgb '#dddddd' lw 1")
w("set border 3")
w("set xtics nomirror scale 0 font ',11'")
w("set ytics nomirror")
w("set mytics 10")
w("set logscale y 10")
w("set lmargin 12")
w("set bmargin 4")

for pi, p in ipairs(panels) do
  local units = p.section.units or {}
  local lo, hi = math.huge, 0
  for _, row in ipairs(p.rows) do
    for _, peer in ipairs(p.peers) do
      local v = row.values[peer.id]
      if v and v > 0 then lo, hi = math.min(lo, v), math.max(hi, v) end
    end
  end
  -- the bottom a decade under the least value less a half, so that every
  -- bar shows; the top leaves room for the labels above the bars
  local plo = floor(log(lo / 3, 10))
  local bottom = 10 ^ plo * 0.999               -- the tic at 10^plo shows
  local top_v = hi * 3
  local tics = {}
  for e = plo, floor(log(top_v, 10)) do
    tics[#tics + 1] = qq(tick_label(e)) .. " " .. ("%.10g"):format(10 ^ e)
  end
  local top = 1 - (TITLE_H + PANEL_H * pi) / height
  w("")
  w("set origin 0,", ("%.5f"):format(top))
  w("set size 1,", ("%.5f"):format(PANEL_H / height))
  local title = (units[p.unit] and (units[p.unit] .. " (" .. p.unit .. ")")) or p.unit
  if #charted > 1 and p.section.title then title = p.section.title .. ": " .. title end
  w("set title ", qq(title), " font ',13'")
  w("set ylabel ", qq(p.unit .. " (log scale)"))
  w("set yrange [", ("%.10g"):format(bottom), ":", ("%.10g"):format(top_v), "]")
  if p.key then
    w("set key outside top center horizontal samplen 1.5 width 2 font ',12'")
  else
    w("unset key")
  end
  w("set ytics (", concat(tics, ", "), ")")
  w("set xrange [-0.6:", #p.rows - 0.4, "]")
  local xt = {}
  for i, row in ipairs(p.rows) do
    xt[i] = qq(row.label or (row.scenario .. "\n" .. row.metric)) .. " " .. (i - 1)
  end
  w("set xtics (", concat(xt, ", "), ")")
  -- one data block per peer: x, value, its label, bar edges
  local k = #p.peers
  local slot = 0.84 / k
  local plots = {}
  for j, peer in ipairs(p.peers) do
    local name = ("$p%d_%d"):format(pi, j)
    w(name, " << EOD")
    for i, row in ipairs(p.rows) do
      local v = row.values[peer.id]
      if v and v > 0 then
        local x = (i - 1) + (j - (k + 1) / 2) * slot
        w(("%.4f %.6g %s %.4f %.4f"):format(x, v, short(v), x - slot * 0.45, x + slot * 0.45))
      end
    end
    w("EOD")
    plots[#plots + 1] = ("%s using 1:2:4:5:(%.10g):2 with boxxyerror lc rgb %s title %s")
      :format(name, bottom, q(peer.color), q(peer.label))
    plots[#plots + 1] = ("%s using 1:2:3 with labels offset 0,0.6 font ',9' tc rgb '#222222' notitle")
      :format(name)
  end
  w("plot ", concat(plots, ", \\\n     "))
end
w("unset multiplot")
w("set output")

local script = concat(out, "\n") .. "\n"
if output == "-" then
  io.write(script)
  os.exit(0)
end

local has = io.popen("command -v gnuplot"):read("a")
if has == "" then
  io.stderr:write("chart: gnuplot not found (Debian: apt-get install gnuplot-nox)\n")
  os.exit(1)
end
local dir = output:match("^(.*)/[^/]*$")
if dir then os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
local file = os.tmpname()
local f = assert(io.open(file, "w"))
f:write(script)
f:close()
local ok = os.execute("gnuplot " .. ("'" .. file:gsub("'", "'\\''") .. "'"))
os.remove(file)
if not ok then
  io.stderr:write("chart: gnuplot failed on the script (see: lua5.4 bench/chart.lua ",
    input, " -)\n")
  os.exit(1)
end
print("chart: " .. output .. " from " .. input)
