-- Which way the C core's folders call each other (docs/internals.md, "The
-- layers").  The folders of src/core/ are layers, read bottom to top in
-- FLOORS below: each may use the ones beneath it.  This lists every use of
-- a higher folder by a lower one, from the code itself:
--   calls and data: each C file compiled alone (no inlining, no LTO), its
--   undefined symbols matched with the files that define them (nm), so a
--   macro of the header counts where it expands;
--   includes: each #include "..." resolved from the file's own folder.
-- src/core/async_mutex.h (the structures and prototypes every layer
-- shares) and src/error_text.c (shared with the Redis client) sit under
-- every folder.
--
--   lua5.4 bench/tools/layers.lua [-a]     (from the repository root)
--
-- Last, the import circles: each set of more than one file that reach one
-- another through these uses (their strongly connected sets).
--
-- -a also lists the downward uses, folder by folder (the drawing of
-- docs/internals.md).  Exit status 0: a listing, not a gate.

local FLOORS = { "queue", "args", "scheduler", "engine", "kinds", "tasks", "debug",
  "bindings" }
local all = arg[1] == "-a"

local floor = { shared = 0 }
for i, name in ipairs(FLOORS) do floor[name] = i end

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local files = {}
for path in sh("ls src/core/*/*.c src/error_text.c"):gmatch("[^\n]+") do
  files[#files + 1] = path
end

-- The folder (layer) of a path of src/.
local function folder_of(path)
  local f = path:match("^src/core/([%w_]+)/")
  if f then
    assert(floor[f], path .. ": a folder of src/core/ missing from FLOORS")
    return f
  end
  return "shared"          -- src/core/async_mutex.h, src/error_text.[ch]
end

local function short(path) return (path:gsub("^src/core/", ""):gsub("^src/", "")) end

local tmp = os.tmpname()
local defined, uses = {}, {}    -- symbol -> file; file -> {symbol}
for _, path in ipairs(files) do
  local _, ok = sh(("cc -std=c99 -O0 -fno-inline -I/usr/include/lua5.4 -c %s -o %s 2>&1")
    :format(path, tmp))
  assert(ok, "cannot compile " .. path)
  uses[path] = {}
  for line in sh("nm " .. tmp):gmatch("[^\n]+") do
    local kind, sym = line:match("(%a) ([%w_]+)$")
    if kind == "U" then
      table.insert(uses[path], sym)
    elseif kind and kind:match("[TDBRC]") then
      defined[sym] = path
    end
  end
end
os.remove(tmp)

-- edges["from>to"] = {symbols} over the files, and the includes.
local edges = {}
local function add(from, to, what)
  local key = from .. ">" .. to
  edges[key] = edges[key] or {}
  table.insert(edges[key], what)
end
for _, path in ipairs(files) do
  for _, sym in ipairs(uses[path]) do
    local to = defined[sym]
    if to and to ~= path then add(path, to, sym) end
  end
  local dir = path:match("^(.*)/")
  for inc in io.lines(path) do
    local name = inc:match('^%s*#%s*include%s+"([^"]+)"')
    if name then
      local target = dir .. "/" .. name
      repeat
        local n
        target, n = target:gsub("[^/]+/%.%./", "", 1)
      until n == 0
      add(path, target, "#include")
    end
  end
end

local keys = {}
for key in pairs(edges) do keys[#keys + 1] = key end
table.sort(keys)

local up, upfiles, pairs_up = 0, {}, {}
print("Uses of a higher folder by a lower one (file -> file: symbols):")
for _, key in ipairs(keys) do
  local from, to = key:match("^(.*)>(.*)$")
  local a, b = folder_of(from), folder_of(to)
  if floor[a] < floor[b] then
    table.sort(edges[key])
    print(("  %-28s -> %-28s %s"):format(short(from), short(to), table.concat(edges[key], " ")))
    up = up + #edges[key]
    upfiles[#upfiles + 1] = key
    pairs_up[a .. " -> " .. b] = true
  end
end
local np = 0
for _ in pairs(pairs_up) do np = np + 1 end
print(("%d upward uses, %d pairs of files, %d pairs of folders")
  :format(up, #upfiles, np))

if all then
  local down = {}
  for _, key in ipairs(keys) do
    local from, to = key:match("^(.*)>(.*)$")
    local a, b = folder_of(from), folder_of(to)
    if a ~= b and floor[a] > floor[b] then
      local k = a .. " -> " .. b
      down[k] = (down[k] or 0) + #edges[key]
    end
  end
  print("Downward uses, folder -> folder (count):")
  for i = #FLOORS, 1, -1 do
    local row = {}
    for j = i - 1, 0, -1 do
      local b = FLOORS[j] or "shared"
      local n = down[FLOORS[i] .. " -> " .. b]
      if n then row[#row + 1] = ("%s %d"):format(b, n) end
    end
    print(("  %-10s -> %s"):format(FLOORS[i], table.concat(row, ", ")))
  end
end

-- Import circles: the strongly connected sets of files (Tarjan), each a
-- set of files that reach one another through their uses.  The issue's
-- target is none of more than two files.
local succ = {}
for _, key in ipairs(keys) do
  local from, to = key:match("^(.*)>(.*)$")
  succ[from] = succ[from] or {}
  table.insert(succ[from], to)
end
local index, low, onstack, stack, nextindex, circles = {}, {}, {}, {}, 0, {}
local function connect(v)
  index[v], low[v] = nextindex, nextindex
  nextindex = nextindex + 1
  stack[#stack + 1] = v
  onstack[v] = true
  for _, w in ipairs(succ[v] or {}) do
    if not index[w] then
      connect(w)
      low[v] = math.min(low[v], low[w])
    elseif onstack[w] then
      low[v] = math.min(low[v], index[w])
    end
  end
  if low[v] == index[v] then
    local set = {}
    repeat
      local w = table.remove(stack)
      onstack[w] = nil
      set[#set + 1] = short(w)
    until w == v
    if #set > 1 then
      table.sort(set)
      circles[#circles + 1] = set
    end
  end
end
for _, path in ipairs(files) do
  if not index[path] then connect(path) end
end
local big = 0
print("Import circles (files that reach one another):")
for _, set in ipairs(circles) do
  print(("  %d files: %s"):format(#set, table.concat(set, " ")))
  if #set > 2 then big = big + 1 end
end
print(("%d circles, %d of more than two files"):format(#circles, big))
