-- A subscriber closed by a finalizer in the middle of its own work
-- (docs/redis.md, Pub/sub).  The subscriber belongs to a client; when that
-- client is collected, its finalizer closes the subscriber (core.drop).
-- A finalizer runs wherever the collector steps: at any allocation, and at
-- any call that grows the stack, so also between the ping timer's check
-- of the subscriber's status and its PING.  Under AM_GC_STRESS=1 specs
-- 80-82 in one process crashed 2 times in 28 with "BUG: send on a closed
-- client" from the ping timer.  Here the interleaving is forced: a call
-- hook runs a full collection at the exact call (progress() or send() from
-- the ping timer; send() from unsubscribe and from the re-subscribe timer, after
-- the subscriber's connection was killed), after the client's last
-- reference is gone.  The child must end cleanly: exit 0, nothing on
-- stderr, uv.run() returned.

local R = require "lock_redis"

local _, h, server = R.spec_file(setup, teardown)

local CHILD = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local core = require "async_mutex.redis_core"
local uv = require "luv"
local SOCK, CASE = ...
local TARGET = ({ progress = core.progress, ping = core.send, unsubscribe = core.send,
                 retry = core.send })[CASE]
-- the re-subscribe timer's callback has no name (nil)
local CALLER = ({ progress = "ping_tick", ping = "ping_tick", unsubscribe = "unsubscribe" })[CASE]
local weak = setmetatable({}, { __mode = "v" })
local armed, fired, s = false, false, nil

-- runs on the main thread, where the luv callbacks run
debug.sethook(function()
  if not armed or debug.getinfo(2, "f").func ~= TARGET then return end
  local caller = debug.getinfo(3, "nS")
  if not caller or caller.name ~= CALLER or not caller.source:find("redis.lua", 1, true) then
    return
  end
  armed = false
  debug.sethook()
  collectgarbage(); collectgarbage()
  fired = weak.client == nil
end, "c")

do
  local client = redis.connect { path = SOCK, pingInterval = 20 }
  weak.client = client
  am.spawn(function()
    s = client:subscribe("spec86:" .. CASE, function() end)
    -- (this coroutine lets go of the client: while it waits for the
    -- killer's reply, it is kept, and the client with it)
    client = nil
    armed = true
    if CASE == "retry" then
      -- the subscriber's connection ends (not the client): it subscribes
      -- again from its re-subscribe timer
      local killer = redis.connect { path = SOCK }
      killer:call("CLIENT", "KILL", "TYPE", "pubsub")
      killer:close()
    elseif CASE == "unsubscribe" then
      local t = uv.new_timer()
      t:start(5, 0, function() t:close(); s:unsubscribe() end)
    end
  end)
end

uv.run()
io.stdout:write(fired and "fired\n" or "not fired\n")
]]

local function run_case(case)
  local child = R.child(CHILD, { server.path, case })
  local rc, out, err = child:wait()
  assert.equal("", err)
  assert.equal(0, rc)
  assert.equal("fired\n", out)
end

describe("a subscriber closed by its client's finalizer", function()
  for _, case in ipairs({
    { "between the ping timer's status check and its progress() call", "progress" },
    { "between the ping timer's status check and its PING", "ping" },
    { "between unsubscribe's status check and its UNSUBSCRIBE", "unsubscribe" },
    { "between the re-subscribe timer's status check and its SUBSCRIBE", "retry" },
  }) do
    it(case[1], h.async(function() run_case(case[2]) end))
  end
end)
