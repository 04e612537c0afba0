-- The benchmark results as a file: bench/results/latest.json, read by
-- bench/chart.lua (the chart) and bench/table.lua (the Markdown tables), and
-- written by every driver of `make bench` (bench/run.lua, and any other).
--
--   local results = require "results"       -- package.path: bench/?.lua
--   results.save(path, section)   -- replaces the section of that name
--   local doc = results.load(path)
--   print(results.markdown(section))
--
-- The document (format 1) is a list of sections, one table each, each
-- written by one driver, which replaces only its own sections:
--
--   { "format": 1, "sections": [ SECTION, ... ] }
--
--   SECTION = {
--     "name": "local",                 -- unique; save() replaces by name
--     "title": "...", "driver": "bench/run.lua",
--     "date": "2026-12-01 10:30", "machine": "...", "clock": "cpu",
--     "quick": false, "load": { "before": 0.4, "after": 1.1 },
--     "peers": [ { "id": "ours", "label": "ours" }, ... ],   -- column order
--     "ratios": [ { "label": "Node/ours", "num": "node", "den": "ours" } ],
--     "units": { "ns": "ns per operation", ... },  -- chart axis labels
--     "rows": [ ROW, ... ], "notes": [ "..." ], "targets": [ TARGET, ... ]
--   }
--   ROW = {
--     "scenario": "4 timeouts",        -- rows of a scenario are adjacent
--     "params": "100000 x 50 ms", "metric": "work = spawn + enqueue + expiry",
--     "unit": "ms",                    -- ns, ms, B, MB, Ir, %, x
--     "values": { "ours": 231.0, "node": 3478.0, ... },  -- by peer id
--     "ratios": { "Node/ours": 15.06, ... },  -- only on cost rows
--     "cost": true,                    -- lower is better; ratios apply
--     "chart": true                    -- drawn by bench/chart.lua
--   }
--   TARGET = { "verdict": "met", "name": "...", "detail": "..." }
--
-- A value a peer did not measure is absent (JSON has no NaN or infinity:
-- those are written as null and read back as absent).  A section may add
-- fields of its own; readers ignore what they do not know.

local results = {}

local concat, sort = table.concat, table.sort
local mtype = math.type

-- JSON ------------------------------------------------------------------------

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
                  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

local function encode_number(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if mtype(v) == "integer" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%.0f"):format(v) end
  return ("%.6g"):format(v)
end

-- A table is an array when its keys are exactly 1..n (an empty table is an
-- object: sections and rows are objects, and `{}` reads back either way).
local function is_array(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n > 0 and #t == n
end

-- Pretty-printed, keys sorted, so that a committed file diffs line by line.
-- Arrays of scalars and objects of scalars go on one line.
local function encode(v, indent)
  local t = type(v)
  if t == "string" then return encode_string(v)
  elseif t == "number" then return encode_number(v)
  elseif t == "boolean" then return tostring(v)
  elseif v == nil then return "null"
  elseif t ~= "table" then error("cannot encode a " .. t .. " in JSON", 2) end
  local inner = indent .. "  "
  local parts, flat = {}, true
  if is_array(v) then
    for i = 1, #v do
      parts[i] = encode(v[i], inner)
      if type(v[i]) == "table" then flat = false end
    end
    local line = "[" .. concat(parts, ", ") .. "]"
    if flat and #line + #indent <= 100 then return line end
    return "[\n" .. inner .. concat(parts, ",\n" .. inner) .. "\n" .. indent .. "]"
  end
  local keys = {}
  for k in pairs(v) do
    if type(k) ~= "string" then error("cannot encode a non-string key in JSON", 2) end
    keys[#keys + 1] = k
  end
  sort(keys)
  for i, k in ipairs(keys) do
    parts[i] = encode_string(k) .. ": " .. encode(v[k], inner)
    if type(v[k]) == "table" then flat = false end
  end
  if #parts == 0 then return "{}" end
  local line = "{ " .. concat(parts, ", ") .. " }"
  if flat and #line + #indent <= 100 then return line end
  return "{\n" .. inner .. concat(parts, ",\n" .. inner) .. "\n" .. indent .. "}"
end

--- Encodes `v` (tables, strings, numbers, booleans) as JSON text.
function results.encode(v)
  return encode(v, "")
end

local decode_value

local function decode_error(s, i, what)
  local line = select(2, s:sub(1, i):gsub("\n", "")) + 1
  error(("JSON: %s at line %d (byte %d)"):format(what, line, i), 0)
end

local function skip(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local function utf8_of(s, i, hex)
  local cp = tonumber(hex, 16)
  if cp >= 0xD800 and cp <= 0xDBFF then          -- a surrogate pair
    local lo = s:match("^\\u(%x%x%x%x)", i)
    lo = lo and tonumber(lo, 16)
    if not lo or lo < 0xDC00 or lo > 0xDFFF then decode_error(s, i, "lone surrogate") end
    return utf8.char(0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)), i + 6
  end
  return utf8.char(cp), i
end

local simple = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f",
                 n = "\n", r = "\r", t = "\t" }

local function decode_string(s, i)             -- s:sub(i, i) == '"'
  local out, j = {}, i + 1
  while true do
    local k = s:find('["\\%c]', j)
    if not k then decode_error(s, i, "unterminated string") end
    out[#out + 1] = s:sub(j, k - 1)
    local c = s:sub(k, k)
    if c == '"' then return concat(out), k + 1 end
    if c ~= "\\" then decode_error(s, k, "control character in string") end
    local e = s:sub(k + 1, k + 1)
    if simple[e] then
      out[#out + 1] = simple[e]
      j = k + 2
    elseif e == "u" then
      local hex = s:match("^%x%x%x%x", k + 2)
      if not hex then decode_error(s, k, "bad \\u escape") end
      local ch
      ch, j = utf8_of(s, k + 6, hex)
      out[#out + 1] = ch
    else
      decode_error(s, k, "bad escape")
    end
  end
end

function decode_value(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      if s:sub(i, i) ~= '"' then decode_error(s, i, "object key expected") end
      local k
      k, i = decode_string(s, i)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then decode_error(s, i, "':' expected") end
      obj[k], i = decode_value(s, i + 1)
      i = skip(s, i)
      c = s:sub(i, i)
      if c == "}" then return obj, i + 1 end
      if c ~= "," then decode_error(s, i, "',' or '}' expected") end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local arr, n = {}, 0
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      n = n + 1
      arr[n], i = decode_value(s, i)
      i = skip(s, i)
      c = s:sub(i, i)
      if c == "]" then return arr, i + 1 end
      if c ~= "," then decode_error(s, i, "',' or ']' expected") end
      i = i + 1
    end
  elseif c == '"' then
    return decode_string(s, i)
  end
  for word, value in pairs { ["true"] = true, ["false"] = false } do
    if s:sub(i, i + #word - 1) == word then return value, i + #word end
  end
  if s:sub(i, i + 3) == "null" then return nil, i + 4 end
  local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
  local v = num and tonumber(num)
  if not v then decode_error(s, i, "value expected") end
  return v, i + #num
end

--- Decodes JSON text; null becomes nil (an absent key).  Raises on bad input.
function results.decode(s)
  local v, i = decode_value(s, 1)
  i = skip(s, i)
  if i <= #s then decode_error(s, i, "trailing characters") end
  return v
end

-- The file -----------------------------------------------------------------------

--- Reads a results file; a missing file is an empty document.
function results.load(path)
  local f = io.open(path)
  if not f then return { format = 1, sections = {} } end
  local text = f:read("a")
  f:close()
  local ok, doc = pcall(results.decode, text)
  if not ok then error(path .. ": " .. doc, 0) end
  if type(doc) ~= "table" or doc.format ~= 1 or type(doc.sections) ~= "table" then
    error(path .. ": not a results file of format 1", 0)
  end
  return doc
end

--- Writes `section` into the file at `path`, replacing the section of the
-- same name and keeping the others (written by other drivers) in place.
function results.save(path, section)
  assert(type(section.name) == "string", "a section needs a name")
  local doc = results.load(path)
  local replaced = false
  for i, s in ipairs(doc.sections) do
    if s.name == section.name then
      doc.sections[i], replaced = section, true
    end
  end
  if not replaced then doc.sections[#doc.sections + 1] = section end
  local dir = path:match("^(.*)/[^/]*$")
  if dir then os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(results.encode(doc), "\n")
  assert(f:close())
  assert(os.rename(tmp, path))
end

-- Formatting --------------------------------------------------------------------

--- A value in its unit, as the tables print it ("—" when absent).
function results.fmt(v, unit)
  if v == nil then return "—" end
  if unit == "%" then return ("%.0f%%"):format(v) end
  if unit == "x" then return ("%.2f"):format(v) end
  if math.abs(v) >= 100 then return ("%.0f"):format(v) end
  if math.abs(v) >= 10 then return ("%.1f"):format(v) end
  return ("%.2f"):format(v)
end

--- A ratio as the tables print it: 118x, 15.0x, 3.62x ("—" when absent).
function results.fmt_ratio(r)
  if r == nil then return "—" end
  if r >= 100 then return ("%.0fx"):format(r) end
  if r >= 10 then return ("%.1fx"):format(r) end
  return ("%.2fx"):format(r)
end

--- Fills row.ratios from row.values for a cost row, by the section's ratio
-- definitions (numerator / denominator peer); returns the row.
function results.add_ratios(section, row)
  if not row.cost then return row end
  row.ratios = {}
  for _, def in ipairs(section.ratios or {}) do
    local a, b = row.values[def.num], row.values[def.den]
    if a and b and b ~= 0 then row.ratios[def.label] = a / b end
  end
  return row
end

--- The section's table in Markdown, columns aligned.
function results.markdown(section)
  local header = { "scenario", "parameters", "metric" }
  for _, p in ipairs(section.peers) do header[#header + 1] = p.label end
  for _, r in ipairs(section.ratios or {}) do header[#header + 1] = r.label end
  local rows = {}
  for _, row in ipairs(section.rows) do
    local unit = row.unit or ""
    local metric = row.metric
    if unit ~= "" and unit ~= "x" and unit ~= "%" then metric = metric .. " (" .. unit .. ")" end
    local cells = { row.scenario, row.params, metric }
    for _, p in ipairs(section.peers) do
      local v = row.values[p.id]
      cells[#cells + 1] = v and results.fmt(v, unit) or ""
    end
    for _, r in ipairs(section.ratios or {}) do
      local v = row.ratios and row.ratios[r.label]
      cells[#cells + 1] = v and results.fmt_ratio(v) or ""
    end
    rows[#rows + 1] = cells
  end
  local widths = {}
  for i, h in ipairs(header) do widths[i] = utf8.len(h) end
  for _, cells in ipairs(rows) do
    for i, c in ipairs(cells) do widths[i] = math.max(widths[i], utf8.len(c)) end
  end
  local function line(cells)
    local out = {}
    for i, c in ipairs(cells) do
      local pad = (" "):rep(widths[i] - utf8.len(c))
      out[i] = (i <= 3) and (c .. pad) or (pad .. c)
    end
    return "| " .. concat(out, " | ") .. " |"
  end
  local lines = { line(header) }
  local sep = {}
  for i, w in ipairs(widths) do
    sep[i] = (i <= 3) and ("-"):rep(w) or (("-"):rep(w - 1) .. ":")
  end
  lines[2] = "| " .. concat(sep, " | ") .. " |"
  for _, cells in ipairs(rows) do lines[#lines + 1] = line(cells) end
  return concat(lines, "\n")
end

return results
