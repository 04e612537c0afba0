-- What the benchmarks of several processes share (bench/redis_locks.lua,
-- bench/redis_kinds.lua): running shell commands, at once or one by one,
-- reading the JSON line a worker ends with, and the hand-off latencies
-- of the "G id t" (granted) / "R id t" (released) lines workers print.

local procs = {}

--- The output (stdout and stderr) of a shell command.
function procs.sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  return out
end

--- The flat JSON object of numbers that ends a worker's output, as a
-- table; nil (and the output to stderr, to show why) when there is none.
function procs.json(out)
  local t = {}
  local line = out:match("(%b{})%s*$")
  if not line then io.stderr:write(out, "\n"); return nil end
  for k, v in line:gmatch('"([%w_]+)":%s*([%d.e+-]+)') do t[k] = tonumber(v) end
  return t
end

--- The load averages of the last 1, 5 and 15 minutes, as text.
function procs.load_avg()
  local f = io.open("/proc/loadavg")
  local s = f and f:read("l") or "?"
  if f then f:close() end
  return s:match("^(%S+ %S+ %S+)") or s
end

--- Runs the commands at once, in parallel; returns their outputs.
function procs.parallel(cmds)
  local files, outs, script = {}, {}, {}
  for i, cmd in ipairs(cmds) do
    files[i] = os.tmpname()
    script[#script + 1] = ("(%s) > '%s' 2>&1 &"):format(cmd, files[i])
  end
  script[#script + 1] = "wait"
  os.execute(table.concat(script, "\n"))
  for i, f in ipairs(files) do
    local h = io.open(f)
    outs[i] = h:read("a")
    h:close()
    os.remove(f)
  end
  return outs
end

--- The p-th quantile (0 < p <= 1) of a sorted list; nil when it is empty.
function procs.percentile(sorted, p)
  if #sorted == 0 then return nil end
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

--- Hand-off latencies (ms, sorted) from the outputs of the processes: a
-- grant that follows another process's release, on one clock (hrtime ns).
function procs.handoffs(outs)
  local events = {}
  for _, out in ipairs(outs) do
    for kind, id, t in out:gmatch("([GR]) (%S+) (%d+)") do
      events[#events + 1] = { kind = kind, id = id, t = tonumber(t) }
    end
  end
  table.sort(events, function(a, b) return a.t < b.t end)
  local lat = {}
  for i = 2, #events do
    local e, p = events[i], events[i - 1]
    if e.kind == "G" and p.kind == "R" and p.id ~= e.id then
      lat[#lat + 1] = (e.t - p.t) / 1e6
    end
  end
  table.sort(lat)
  return lat
end

return procs
