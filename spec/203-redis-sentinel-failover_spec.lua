-- Redis locks on a master that Sentinel fails over (docs/redis-locks.md,
-- "Scaling out"): a master, 2 replicas and 3 sentinels
-- (spec/redis_sentinel.lua); worker processes take one RedisMutex in turn,
-- through clients made with `sentinels` and `master`, while the master is
-- failed over (SENTINEL FAILOVER) or killed (kill -9).  Every acquire ends
-- with a grant or E_UNAVAILABLE (never another error, never a hang: each
-- worker runs until told to stop, or for a fixed time at most, and must
-- exit by itself); grants resume on the promoted master; and with
-- `replicas` no two workers ever hold at once (markers in one O_APPEND
-- file, as spec 120 checks them).
-- `replicas = 2` (every replica) for the manual failover, whose old master
-- keeps taking writes until Sentinel reconfigures it; `replicas = 1` for
-- kill -9, where Sentinel promotes the replica with the most data.

local h = require "helpers"
local R = require "lock_redis"
local uv = require "luv"

-- A worker: takes the mutex NAME for at most RUN ms, until the file STOP
-- exists, holding 20 ms; a begin and an end marker around each section ("B id fence t", t the monotonic
-- clock in ns, which every process reads alike); prints "grants
-- unavailable others falses", then every other error on a line, then the
-- reasons of the E_UNAVAILABLEs with their counts.
local WORKER = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SENTINELS, NAME, LOG, ID, RUN, REPLICAS, STOP = ...
local sentinels = {}
for port in SENTINELS:gmatch("%d+") do
  sentinels[#sentinels + 1] = { host = "127.0.0.1", port = tonumber(port) }
end
local client = redis.connect { sentinels = sentinels, master = "mymaster",
  commandTimeout = 1000, reconnectDelayMax = 200 }
local m = am.RedisMutex.new(client, NAME, { ttl = 2000, waiterTimeout = 600,
  replicas = tonumber(REPLICAS) > 0 and tonumber(REPLICAS) or nil })
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
local grants, unavailable, falses, others, reasons = 0, 0, 0, {}, {}
local failed
local function told()
  local s = io.open(STOP)
  if s then s:close() end
  return s ~= nil
end
am.spawn(function()
  local ok, err = pcall(function()
    local stop = uv.hrtime() + tonumber(RUN) * 1e6
    while uv.hrtime() < stop and not told() do
      local got, r = pcall(m.acquire, m)
      if got then
        grants = grants + 1
        f:write(("B %s %d %d\n"):format(ID, r.fence, uv.hrtime()))
        -- the server that granted (the connection may have moved since:
        -- then the section is counted on the new one, later)
        local asked, port = pcall(client.call, client, "CONFIG", "GET", "port")
        am.sleep(20)
        f:write(("E %s %d %d %s\n"):format(ID, r.fence, uv.hrtime(),
          asked and port[2] or "?"))
        if not r() then falses = falses + 1 end
      elseif r == am.E_UNAVAILABLE then
        unavailable = unavailable + 1
        local why = (r.reason or "?"):gsub("%d+ ms", "N ms")
        reasons[why] = (reasons[why] or 0) + 1
        am.sleep(20)
      else
        others[#others + 1] = tostring(r)
        am.sleep(20)
      end
    end
  end)
  if not ok then failed = err end
  client:close()
end)
uv.run()
f:close()
if failed then io.stderr:write(tostring(failed), "\n"); os.exit(1) end
io.stdout:write(("%d %d %d %d\n"):format(grants, unavailable, #others, falses))
for _, e in ipairs(others) do io.stdout:write(e, "\n") end
for why, n in pairs(reasons) do io.stdout:write(("unavailable %d: %s\n"):format(n, why)) end
os.exit(0)
]]

-- Reads the markers: sections that began while another was running, the
-- sections ({ t = begin time (ns), port = the server that granted }), and
-- the fences in file order.
local function markers(path)
  local inside, overlaps, sections, fences = {}, 0, {}, {}
  for line in io.lines(path) do
    local kind, id, fence, t, port = line:match("^(%u) (%S+) (%d+) (%d+) ?(%S*)")
    if kind == "B" then
      if next(inside) then overlaps = overlaps + 1 end
      local sec = { t = tonumber(t) }
      inside[id] = sec
      sections[#sections + 1] = sec
      fences[#fences + 1] = tonumber(fence)
    elseif kind == "E" then
      if inside[id] then inside[id].port = tonumber(port) end
      inside[id] = nil
    end
  end
  return overlaps, sections, fences
end

local WORKERS = 3
-- Sections ended on the promoted master before the workers are told to
-- stop: grants go on there, between the three, for a while.
local AFTER = 10

-- Polls (every 50 ms, in the running coroutine) until pred() is true or
-- every worker has ended by itself.
local function until_(pred, children)
  while not pred() do
    local all_done = true
    for _, child in ipairs(children) do all_done = all_done and child.done end
    if all_done then return end
    h.sleep(50)
  end
end

-- Runs the workers, for at most run_ms; `fault(set)` is called once each
-- has been granted, and they are told to stop once AFTER sections have
-- ended on the promoted master; returns the workers' outcomes, the
-- markers' overlaps, the sections, the fences and the fault's time (ns).
local function scenario(set, replicas, run_ms, fault)
  local log, stop = os.tmpname(), os.tmpname()
  os.remove(stop)
  local ports = {}
  for i, s in ipairs(set.sentinels) do ports[i] = s.port end
  local children, results, fault_at = {}, {}, nil
  local old = set.master.port
  local function ended_on(port)
    local n, f = 0, io.open(log)
    if not f then return 0 end
    for line in f:lines() do
      if line:match("^E %S+ %d+ %d+ (%d+)") == tostring(port) then n = n + 1 end
    end
    f:close()
    return n
  end
  -- (a worker still running when this fails is killed: by its PID)
  local ran, err = pcall(h.run, function()
    for i = 1, WORKERS do
      children[i] = R.child(WORKER, { table.concat(ports, ","), "spec203", log, "w" .. i,
        run_ms, replicas, stop })
    end
    until_(function()
      local f = io.open(log)
      local text = f and f:read("a") or ""
      if f then f:close() end
      for i = 1, WORKERS do
        if not text:find("B w" .. i .. " ", 1, true) then return false end
      end
      return true
    end, children)
    fault_at = uv.hrtime()
    fault(set)
    until_(function()
      local new = set:named_port()
      return new ~= nil and new ~= old and ended_on(new) >= AFTER
    end, children)
    assert(io.open(stop, "w")):close()
    for i = 1, WORKERS do
      local rc, out, err = children[i]:wait()
      results[i] = { rc = rc, out = out, err = err }
    end
  end, { deadline = run_ms + 30000 })
  for _, child in ipairs(children) do child:kill() end
  os.remove(stop)
  assert(ran, err)
  local overlaps, starts, fences = markers(log)
  os.remove(log)
  return results, overlaps, starts, fences, fault_at
end

-- The checks every scenario shares: each worker ended by itself with only
-- grants and E_UNAVAILABLE, and grants came again after the fault, from
-- the promoted master (`port`); returns the time from the fault to the
-- first of those (ms), and the workers' E_UNAVAILABLE count.
local function check(results, sections, fault_at, port)
  for i, r in ipairs(results) do
    assert.equal("", r.err, "worker " .. i)
    assert.equal(0, r.rc, "worker " .. i)
    local grants, _, others = r.out:match("^(%d+) (%d+) (%d+) (%d+)")
    assert.equal("0", others, "worker " .. i .. ": " .. r.out)
    assert.is_true(tonumber(grants) > 0, "worker " .. i .. ": " .. r.out)
  end
  local first, unavailable = nil, 0
  for _, sec in ipairs(sections) do
    if sec.port == port and (not first or sec.t < first) then first = sec.t end
  end
  for _, r in ipairs(results) do unavailable = unavailable + tonumber(r.out:match("^%d+ (%d+)")) end
  if not first then
    local outs = {}
    for i, r in ipairs(results) do outs[i] = r.out end
    error("no grant from the promoted master; the workers said:\n" .. table.concat(outs, "\n"))
  end
  if os.getenv("SPEC203_VERBOSE") then
    for i, r in ipairs(results) do print("worker " .. i .. ": " .. r.out) end
  end
  return (first - fault_at) / 1e6, unavailable
end

-- A fresh set, the workers through `fault`, and every check: a new
-- master, only grants and E_UNAVAILABLE, grants from it, never two
-- holders, fences increasing; prints the time to its first grant.
local function failover(replicas, run_ms, what, fault)
  local set = require("redis_sentinel").start { replicas = 2, sentinels = 3,
    failover_timeout = 3000 }
  local ok, err = pcall(function()
    local old = set.master.port
    local results, overlaps, sections, fences, fault_at = scenario(set, replicas, run_ms, fault)
    local new = set:named_port()
    assert.are_not.equal(old, new)
    local ms, unavailable = check(results, sections, fault_at, new)
    assert.equal(0, overlaps)
    for i = 2, #fences do assert.is_true(fences[i] > fences[i - 1]) end
    print(("\nspec 203: %s, replicas = %d: %d sections, %d E_UNAVAILABLE, first grant on the"
      .. " promoted master %.0f ms after it"):format(what, replicas, #sections, unavailable, ms))
  end)
  set:stop()
  assert(ok, err)
end

describe("Redis locks through Sentinel", function()
  it("SENTINEL FAILOVER with replicas = 2: every acquire gets a grant or E_UNAVAILABLE, "
    .. "grants go on on the promoted master, never two holders", function()
    failover(2, 16000, "SENTINEL FAILOVER", function(set)
      assert(os.execute(("LD_PRELOAD= redis-cli -p %d sentinel failover mymaster >/dev/null")
        :format(set.sentinels[1].port)))
    end)
  end)

  it("kill -9 of the master with replicas = 1: every acquire gets a grant or E_UNAVAILABLE, "
    .. "grants go on on the promoted master, never two holders", function()
    failover(1, 9000, "kill -9 of the master", function(set) set.master:kill() end)
  end)
end)
