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

-- Reads the markers of R.FAILOVER_WORKER: sections that began while
-- another was running, the sections ({ t = begin time (ns), port = the
-- server that granted }), and the fences in file order.
local function markers(path)
  local inside, overlaps, sections, fences, by_fence = {}, 0, {}, {}, {}
  for line in io.lines(path) do
    local kind, id, fence, rest = line:match("^(%u) (%S+) (%d+) (%S+)")
    if kind == "B" then
      if next(inside) then overlaps = overlaps + 1 end
      local sec = { t = tonumber(rest) }
      inside[id] = sec
      sections[#sections + 1] = sec
      fences[#fences + 1] = tonumber(fence)
      by_fence[id .. " " .. fence] = sec
    elseif kind == "E" then
      inside[id] = nil
    elseif kind == "G" and by_fence[id .. " " .. fence] then
      by_fence[id .. " " .. fence].port = tonumber(rest)
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
      if line:match("^G %S+ %d+ (%d+)") == tostring(port) then n = n + 1 end
    end
    f:close()
    return n
  end
  -- (a worker still running when this fails is killed: by its PID)
  local ran, err = pcall(h.run, function()
    for i = 1, WORKERS do
      children[i] = R.child(R.FAILOVER_WORKER, { "sentinel", table.concat(ports, ","),
        "spec203", log, "w" .. i, run_ms, replicas, stop })
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
