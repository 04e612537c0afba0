-- The Redis client when Lua code runs inside its own C calls (docs/redis.md,
-- "Re-entry"): a hook of the Lua layer (connected, open, attempt, watch),
-- a finalizer at an allocation, may close the client or end its
-- connection; the C part looks again at the client after each such call,
-- never at what it saw before.  Every case runs in a child process (a
-- crash fails the test, not the run) under a memory checker (valgrind's
-- memcheck, or AddressSanitizer under `make asan`): no read of freed
-- memory, no leak; every call ends exactly once, with its reply or
-- E_UNAVAILABLE; uv.run() returns; nothing is left open, in the process or
-- at the server.  Each case crashed, hung or leaked before (see each).

local h = require "helpers"
local redis_server = require "redis_server"

local server = redis_server.for_file(setup, teardown)

-- The child's prelude: the client's modules, and at_hook(co, name,
-- action), which runs action() once, at the first call of hooks[name] (a
-- function of the Lua layer that the C part calls) in coroutine co (nil:
-- the main thread, where luv's callbacks run); others() and
-- call_in_coroutine() below, active() from h.CHILD_ACTIVE.
local PRELUDE = [[
local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local core = require "async_mutex.redis_core"
local PORT = %d
local function at_hook(co, name, action)
  local fn = core.hooks[name]
  local function hook()
    if debug.getinfo(2, "f").func == fn then
      if co then debug.sethook(co) else debug.sethook() end
      action()
    end
  end
  if co then debug.sethook(co, hook, "c") else debug.sethook(hook, "c") end
end
-- the connections the server has, but for the one that asks
local function others()
  local probe = redis.connect({ port = PORT })
  local n
  am.spawn(function()
    local list = probe:call("CLIENT", "LIST")
    n = select(2, list:gsub("\n", "")) - 1
    probe:close()
  end)
  uv.run()
  return n
end
]] .. h.CHILD_ACTIVE .. [[
-- c:call(...) in a coroutine of its own, prepare(co) run first in it.
-- Returns r: r.co the coroutine, r.outcome "ok err" once the call ended.
local function call_in_coroutine(c, prepare, ...)
  local args = table.pack(...)
  local r = {}
  am.spawn(function()
    r.co = coroutine.running()
    if prepare then prepare(r.co) end
    local ok, err = pcall(c.call, c, table.unpack(args, 1, args.n))
    r.outcome = tostring(ok) .. " " .. tostring(err)
  end)
  return r
end
]]

local function child(body)
  return h.memcheck_child(PRELUDE:format(server.port) .. body, 120)
end

describe("a client closed by Lua code the C part runs", function()
  it("in the connected hook: the read that follows finds no freed parser", function()
    -- (before: conn_event went on with the hiredis context disconnect had
    -- just freed: a heap-use-after-free)
    local out = child([[
local c = redis.connect({ port = PORT })
at_hook(nil, "connected", function() c:close() end)
local r = call_in_coroutine(c, nil, "PING")
uv.run()
print(r.outcome, active(), others())
]])
    assert.equal("false redis server unavailable: client closed\t0\t0\n", out)
  end)

  it("in hooks.open, while its connection is set up (with AUTH and SELECT queued)", function()
    -- (before: the set-up commands were written into the freed context,
    -- then the call's into a NULL one)
    local out = child([[
local c = redis.connect({ port = PORT, db = 2 })
local r = call_in_coroutine(c, function(co) at_hook(co, "open", function() c:close() end) end, "PING")
uv.run()
print(r.outcome, coroutine.status(r.co), active(), others())
]])
    assert.equal("false redis server unavailable: client closed\tdead\t0\t0\n", out)
  end)

  it("in hooks.attempt: a closed client opens no connection (before: one was left open)",
    function()
      local out = child([[
local c = redis.connect({ port = PORT })
local r = call_in_coroutine(c, function(co) at_hook(co, "attempt", function() c:close() end) end, "PING")
uv.run()
print(r.outcome, core.status(c), active(), others())
]])
      assert.equal("false redis server unavailable: client closed\tclosed\t0\t0\n", out)
    end)

  it("in hooks.watch, during the caller's own call: that call raises (before: it waited for ever)",
    function()
      -- (disconnect resumes every waiting caller but the running one, whose
      -- call sees its connection gone and raises the error itself)
      local out = child([[
local c = redis.connect({ port = PORT })
local r = call_in_coroutine(c, function(co)
  assert(c:call("PING") == "PONG")          -- connected, then idle: unwatched
  am.sleep(1)                               -- a call of its own loop turn
  at_hook(co, "watch", function() c:close() end)
end, "BLPOP", "spec101:none", 0)
uv.run()
print(r.outcome, coroutine.status(r.co), active(), others())
]])
      assert.equal("false redis server unavailable: client closed\tdead\t0\t0\n", out)
    end)

  it("by its finalizer, while its subscriber parses a burst of messages", function()
    -- The client unreferenced, its subscriber's connection reading 2,000
    -- messages in one callback: with the collector this frequent, the
    -- client's finalizer runs at one of the allocations that convert them,
    -- and closes the subscriber (before: its parser was freed under the
    -- loop that read it, and the process aborted in round 3 of 3 runs).
    -- The fake server (spec/fake_redis.lua) keeps the loop running: each
    -- round runs it until its client is collected.
    local out = child([[
local fake = require "fake_redis"
local N, ROUNDS = 2000, 5
local burst = {}
for i = 1, N do burst[i] = fake.message("burst", ("m%d"):format(i)) end
burst = table.concat(burst)
local srv = fake.start(function(conn, cmd)
  if cmd[1] == "SUBSCRIBE" then
    local t = uv.new_timer()
    t:start(20, 0, function() t:close(); conn:write(burst) end)
  end
  return fake.DEFAULT
end)
local mid = 0
for _ = 1, ROUNDS do
  local got, done = 0, false
  local weak = setmetatable({}, { __mode = "v" })
  do
    local c = redis.connect({ port = srv.port })
    weak[1] = c
    am.spawn(function()
      c:subscribe("burst", function() got = got + 1 end)
      c = nil
      collectgarbage("incremental", 50, 200)      -- a cycle every 50 % growth
      local t = uv.new_timer()                    -- (if it outlived the burst)
      t:start(300, 0, function() t:close(); collectgarbage(); done = true end)
    end)
  end
  repeat uv.run("once") until done
  collectgarbage("generational")
  if got < N and weak[1] == nil then mid = mid + 1 end
end
srv:stop()
uv.run()
-- (the collector's timing depends on the heap: most rounds close
-- mid-burst, all of them when this runs alone)
print(mid > 0, active())
]])
    assert.equal("true\t0\n", out)
  end)
end)

describe("hooks.open failing", function()
  it("fails the attempt with E_UNAVAILABLE that says why, leaving nothing open", function()
    -- (before: "BUG: hooks.open made no poll handle")
    local out = child([[
local real = uv.new_poll
local failing = function() return nil, "EMFILE: too many open files", "EMFILE" end
uv.new_poll, uv.new_socket_poll = failing, failing
local c = redis.connect({ port = PORT, reconnectDelay = 0 })
local outcome
am.spawn(function()
  local ok, err = pcall(c.call, c, "PING")
  outcome = tostring(ok) .. " " .. tostring(err) .. " " .. tostring(err == redis.E_UNAVAILABLE)
  uv.new_poll = real
  outcome = outcome .. " / " .. tostring(c:call("PING"))   -- the back-off over: works
end)
uv.run()
c:close()
print(outcome, active(), others())
]])
    assert.equal("false redis server unavailable: cannot watch the connection to 127.0.0.1:"
      .. server.port .. " (EMFILE) true / PONG\t0\t0\n", out)
  end)
end)
