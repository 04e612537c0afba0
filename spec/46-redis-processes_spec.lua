-- Redis locks across real processes: child lua5.4 processes spawned with
-- uv.spawn take the same lock (docs/redis-locks.md, "Guarantees").  Mutual
-- exclusion is checked on a file every holder writes to; the FIFO order on
-- the fencing tokens, and that no waiter waits more than one turn of the
-- queue on a log kept in Redis; dead holders and dead waiters by SIGKILL.

local R = require "lock_redis"
local uv = require "luv"

local am, h, server, _, with = R.spec_file(setup, teardown)

local queued = R.queued

-- A child that runs COUNT sections of the lock NAME, each writing
-- "B pid fence" and "E pid fence" lines to FILE around a loop turn.
-- It also appends to the Redis list NAME:log "W pid" once its request is in
-- the Redis queue, and "G pid" once granted: the "W" is sent on the same
-- connection right after the acquire's script (by a timer of the next loop
-- turn, when acquire has sent it and yielded), so Redis runs it after the
-- request was queued (or granted); "G" is sent after the "W" was answered.
-- A process's first section is not in the log: its first acquire also
-- subscribes and may load the script, so the "W" could overtake it.
local SECTIONS = R.PROLOGUE .. [[
local name, file, count = ARGS[1], ARGS[2], tonumber(ARGS[3])
main(function()
  local m = am.RedisMutex.new(client, name)
  local f = assert(io.open(file, "a"))
  f:setvbuf("no")
  local pid = uv.os_getpid()
  local log = name .. ":log"
  for k = 1, count do
    local logged = am.Semaphore.new(0)
    if k > 1 then
      local t = uv.new_timer()
      t:start(0, 0, function()
        t:close()
        am.spawn(function()
          client:call("RPUSH", log, ("W %d"):format(pid))
          logged:release()
        end)
      end)
    end
    local release <close> = m:acquire()
    if k > 1 then
      logged:acquire()
      client:call("RPUSH", log, ("G %d"):format(pid))
    end
    f:write(("B %d %d\n"):format(pid, release.fence))
    local t = uv.new_timer()               -- one loop turn inside the section
    local co = coroutine.running()
    t:start(0, 0, function() t:close(); coroutine.resume(co) end)
    coroutine.yield()
    f:write(("E %d %d\n"):format(pid, release.fence))
    assert(release())
  end
  f:close()
end)
]]

-- Runs `procs` children of SECTIONS sharing `total` sections; checks the
-- file: sections never overlap, fences strictly increase, all ran.
local function exclusion(procs, total)
  local name = "excl" .. procs
  local file = os.tmpname()
  local each = total // procs
  local children = {}
  for i = 1, procs do
    children[i] = R.child(SECTIONS, { server.path, name, file, each })
  end
  for i = 1, procs do
    local rc, _, err = children[i]:wait()
    assert.equal(0, rc, err)
  end
  local lines = {}
  for line in io.lines(file) do lines[#lines + 1] = line end
  os.remove(file)
  assert.equal(2 * each * procs, #lines)
  local last = 0
  local per = {}
  for i = 1, #lines, 2 do
    local b_pid, b_fence = lines[i]:match("^B (%d+) (%d+)$")
    local e_pid, e_fence = lines[i + 1]:match("^E (%d+) (%d+)$")
    assert(b_pid and e_pid, "overlapping sections at line " .. i .. ": "
      .. lines[i] .. " / " .. lines[i + 1])
    assert.equal(b_pid, e_pid)
    assert.equal(b_fence, e_fence)
    local fence = math.tointeger(tonumber(b_fence))
    assert(fence > last, "fence did not increase at line " .. i)
    last = fence
    per[b_pid] = (per[b_pid] or 0) + 1
  end
  local n = 0
  for _, c in pairs(per) do
    n = n + 1
    assert.equal(each, c)
  end
  assert.equal(procs, n)

  -- No process waits more than one turn of the queue: between a process's
  -- "W" (its request already queued) and its "G", the other processes are
  -- granted at most once each (the one holding when it queued, and those
  -- ahead of it), so at most procs - 1 grants.
  local c = server:client()
  local log = c:call("LRANGE", name .. ":log", 0, -1)
  c:call("DEL", name .. ":log")
  c:close()
  assert.equal(2 * (each - 1) * procs, log.n)
  local grants, since, longest = 0, {}, 0
  for i = 1, log.n do
    local kind, pid = log[i]:match("^([WG]) (%d+)$")
    assert(kind, log[i])
    if kind == "W" then
      assert(since[pid] == nil, "two requests of " .. pid .. " at once")
      since[pid] = grants
    else
      assert(since[pid], "a grant of " .. pid .. " before its request")
      local others = grants - since[pid]
      assert(others <= procs - 1, ("process %s waited while %d others were granted (%d processes)")
        :format(pid, others, procs))
      if others > longest then longest = others end
      since[pid] = nil
      grants = grants + 1
    end
  end
  assert(longest <= procs - 1)
end

describe("mutual exclusion across processes", function()
  it("holds for 2 processes, 5,000 sections", h.async(function()
    exclusion(2, h.load(5000))
  end, { deadline = 120000 }))

  it("holds for 8 processes, 5,000 sections", h.async(function()
    exclusion(8, h.load(5000))
  end, { deadline = 120000 }))
end)

describe("the Redis queue across processes", function()
  it("grants processes in the order they reached it", with.client(function(c)
    local name = "fifo"
    local m = am.RedisMutex.new(c, name)
    local release = m:acquire()
    local code = R.PROLOGUE .. [[
main(function()
  local m = am.RedisMutex.new(client, ARGS[1])
  local r = m:acquire()
  io.stdout:write(ARGS[2], " ", r.fence, "\n")
  r()
end)
]]
    local children = {}
    for i = 1, 5 do
      children[i] = R.child(code, { server.path, name, i })
      h.wait_until(function() return queued(c, name) == i end, 10000)
    end
    release()
    local last = release.fence
    for i = 1, 5 do
      local rc, out, err = children[i]:wait()
      assert.equal(0, rc, err)
      local idx, fence = out:match("^(%d+) (%d+)")
      assert.equal(tostring(i), idx)
      fence = math.tointeger(tonumber(fence))
      assert.is_true(fence > last, "process " .. i .. " was not granted in its turn")
      last = fence
    end
  end, { deadline = 30000 }))
end)

describe("a process killed with SIGKILL", function()
  it("while holding frees the lock when its lease ends", with.client(function(c)
    local name = "dead-holder"
    local holder = R.child(R.PROLOGUE .. [[
main(function()
  local m = am.RedisMutex.new(client, ARGS[1], { ttl = 300 })
  local r = m:acquire()
  io.stdout:write("held ", r.fence, "\n")
  io.stdout:flush()
  am.sleep(60000)            -- killed before: the client is never closed
end)
]], { server.path, name })
    assert.is_true(holder:wait_for("held %d+\n"))
    holder:kill()
    holder:wait()
    local t0 = uv.hrtime()
    local release = am.RedisMutex.new(c, name):acquire()
    local waited = h.ms_since(t0)
    assert.is_true(waited < (300 + 200) * h.TIME_SCALE, ("waited %.1f ms"):format(waited))
    assert.is_true(release())
  end, { deadline = 20000 }))

  it("while waiting holds nobody up longer than the dead-waiter bound", h.async(function()
    local c = server:client()
    local name = "dead-waiter"
    local m = am.RedisMutex.new(c, name, { waiterTimeout = 300 })
    local release = m:acquire()
    local waiter = R.child(R.PROLOGUE .. [[
main(function()
  local m = am.RedisMutex.new(client, ARGS[1], { waiterTimeout = 300 })
  local r = m:acquire()
  r()
end)
]], { server.path, name })
    h.wait_until(function() return queued(c, name) == 1 end, 10000)
    waiter:kill()
    waiter:wait()
    -- a second waiter of this process queues behind the dead one
    local c2 = server:client()
    local got = R.grant_time(am.RedisMutex.new(c2, name, { waiterTimeout = 300 }))
    h.wait_until(function() return queued(c, name) == 2 end)
    local t0 = uv.hrtime()
    release()                              -- handed to the dead process
    h.wait_until(function() return got() ~= nil end, 5000)
    local waited = (got() - t0) / 1e6
    assert.is_true(waited < (300 + 200) * h.TIME_SCALE, ("waited %.1f ms"):format(waited))
    c:close(); c2:close()
  end, { deadline = 20000 }))
end)

describe("examples/redis_orders.lua", function()
  it("sells the whole stock from four processes, no unit twice", h.async(function()
    local child = R.child(([[
      local f = assert(loadfile("examples/redis_orders.lua"))
      arg = { [0] = "examples/redis_orders.lua" }
      f("unix:%s")
    ]]):format(server.path))
    local rc, out, err = child:wait()
    assert.equal(0, rc, err)
    assert.equal("", err)
    assert.matches("stock: 100 units, 4 worker processes\n", out, 1, true)
    assert.matches("sold 100 units in all, 0 left: no unit sold twice\n", out, 1, true)
    assert.matches("worker 4 sold %d+, refused 0\n", out)
  end, { deadline = 30000 }))
end)
