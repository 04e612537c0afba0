-- RedlockMutex under faults (docs/redis-locks.md, "RedlockMutex"): 4
-- processes take one Redlock (ttl 1 s, holds of up to 100 ms) over 3 and
-- over 5 redis-servers while, for 6 s (and 12 faults at least), the servers are SIGKILLed,
-- SIGSTOPped, resumed and restarted (without persistence) at random,
-- between and during grants; then for 2 s more once every server is up and
-- old enough to count.  Checked independently of the library, in one
-- O_APPEND file of markers: no section begins while another holder's lease
-- is valid (a section ends at its end marker, or at its holder's onLost),
-- the fences of the sections, in the order they began, strictly increase,
-- and once the faults are over the lock grants again.

local h = require "helpers"
local R = require "lock_redis"
local uv = require "luv"

local WORKER = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local NAME, STOP, LOG, ID, SEED, SOCKS = ...   -- STOP: a file; its existence stops
math.randomseed(tonumber(SEED))
local clients = {}
for path in SOCKS:gmatch("[^,]+") do
  clients[#clients + 1] = redis.connect { path = path, commandTimeout = 300,
    connectTimeout = 300, reconnectDelay = 10, reconnectDelayMax = 100 }
end
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
local current
local q = am.RedlockMutex.new(clients, NAME, { ttl = 1000, waiterTimeout = 600,
  onLost = function(info)
    if current == info.releaser then f:write(("L %s\n"):format(ID)) end
  end })
local got, unavailable, lost = 0, 0, 0
am.run(function()
  local limit = uv.hrtime() + 60e9                -- if the spec never says stop
  local function stopped()
    local sf = io.open(STOP)
    if sf then sf:close() end
    return sf ~= nil or uv.hrtime() > limit
  end
  while not stopped() do
    local ok, r = pcall(q.acquire, q)
    if ok then
      got = got + 1
      current = r
      f:write(("B %s %d %d\n"):format(ID, r.fence, uv.hrtime() // 1000000))
      -- mostly short, some across faults; all shorter than a renewal
      -- period (ttl / 3), so that no section outlives its validity
      am.sleep(math.random() < 0.7 and math.random(0, 3) or math.random(20, 100))
      if pcall(r.check, r) and r:check() then
        f:write(("E %s\n"):format(ID))
      else
        lost = lost + 1
      end
      current = nil
      r()
    else
      assert(ok or r == am.E_UNAVAILABLE, tostring(r))
      unavailable = unavailable + 1
      am.sleep(math.random(5, 30))
    end
  end
  for _, c in ipairs(clients) do c:close() end
end)
io.stdout:write(("%d %d %d\n"):format(got, unavailable, lost))
]]

-- Reads the markers: sections that began while another was open, fences
-- out of order, sections, and sections begun at `since` (ms of
-- uv.hrtime(), the same clock in every process of the machine) or later.
local function check_markers(path, since)
  local open, overlaps, disorder, sections, last, after = {}, 0, 0, 0, 0, 0
  for line in io.lines(path) do
    local kind, id, fence, at = line:match("^(%u) (%S+) ?(%d*) ?(%d*)")
    if kind == "B" then
      sections = sections + 1
      if tonumber(at) >= since then after = after + 1 end
      if next(open) then overlaps = overlaps + 1 end
      open[id] = true
      fence = tonumber(fence)
      if fence <= last then disorder = disorder + 1 end
      last = math.max(last, fence)
    else
      open[id] = nil
    end
  end
  return overlaps, disorder, sections, after
end

local function run(n_servers)
  local servers = {}
  for i = 1, n_servers do servers[i] = R.server() end
  local ok, err = pcall(h.run, function()
    uv.sleep(2100)                  -- old enough to count (ttl 1000: 2 s of uptime)
    local socks = {}
    for i, s in ipairs(servers) do socks[i] = s.path end
    local log = servers[1].dir .. "/markers"   -- removed with the server
    local stop = servers[1].dir .. "/stop"
    local name = "spec195:" .. n_servers
    local children = {}
    for p = 1, 4 do
      children[p] = R.child(WORKER, { name, stop, log, "p" .. p, os.time() + p,
                                      table.concat(socks, ",") })
    end
    -- the faults, for 6 s and at least 12 of them (a loaded machine, as
    -- under make asan, runs this loop late), 15 s at most: every 100-300
    -- ms a server not in a fault is paused (for 50-400 ms), killed
    -- (started again 50-400 ms later, empty) or restarted at once (empty)
    local t0 = uv.hrtime()
    local busy, faults, restarts, healing = {}, 0, 0, 0
    while uv.hrtime() < t0 + 6e9 or faults < 12 and uv.hrtime() < t0 + 15e9 do
      h.sleep(math.random(100, 300))
      local i = math.random(n_servers)
      if not busy[i] then
        local s = servers[i]
        local act = math.random(4)
        faults = faults + 1
        if act == 4 then
          s:kill(); s:start()
          restarts = restarts + 1
        else
          busy[i] = true
          healing = healing + 1
          if act <= 2 then s:pause() else s:kill() end
          h.spawn(function()
            h.sleep(math.random(50, 400))
            if act <= 2 then s:resume() else s:start(); restarts = restarts + 1 end
            busy[i] = nil
            healing = healing - 1
          end)
        end
      end
    end
    h.wait_until(function() return healing == 0 end, 2000)
    -- every server up; once the youngest is 2 s old (a quorum restarted
    -- empty counts only then), 2 s without faults
    local quiet = uv.hrtime() // 1000000 + 2100
    h.sleep(2100 + 2000)
    assert(io.open(stop, "w")):close()
    local got, unavailable, lost = 0, 0, 0
    for p = 1, 4 do
      local rc, out, e = children[p]:wait()
      assert.equal(0, rc, e)
      local g, u, l = out:match("^(%d+) (%d+) (%d+)")
      got, unavailable, lost = got + tonumber(g), unavailable + tonumber(u), lost + tonumber(l)
    end
    local overlaps, disorder, sections, after = check_markers(log, quiet)
    if os.getenv("SPEC195_VERBOSE") then
      io.stderr:write(("%d servers: %d faults (%d restarts), %d sections (%d after the faults),"
        .. " %d E_UNAVAILABLE, %d lost\n"):format(n_servers, faults, restarts, got, after,
        unavailable, lost))
    end
    assert.is_true(faults > 10)
    -- the faults over, it grants again: 4 processes with holds of 0-100 ms
    -- make dozens of sections in 2 s even under load; one that stopped
    -- granting makes none (how many come during the faults depends on how
    -- often a quorum was down, and is not a bound)
    assert.is_true(after >= 5, ("%d sections in the 2 s after the faults, %d in all"):format(after, got))
    assert.equal(got, sections)
    assert.equal(0, overlaps)
    assert.equal(0, disorder)
  end, { deadline = 120000 })
  for _, s in ipairs(servers) do s:resume(); s:stop() end
  assert(ok, err)
end

describe("RedlockMutex from 4 processes while servers are killed, paused and restarted", function()
  it("never has two holders with valid leases, and its fences strictly increase: 3 servers",
    function() run(3) end)
  it("never has two holders with valid leases, and its fences strictly increase: 5 servers",
    function() run(5) end)
end)
