-- A subscriber connection lost while `subscribe` puts its caller among
-- the waits for the channel's confirmation (docs/redis.md, "Re-entry"): a
-- lost connection settles every such wait and replaces their table.  A
-- hook or a finalizer can end the connection between any two steps of
-- `subscribe`; before, one that came after the caller's list was looked up
-- and before the caller's record was stored in it left the record in a
-- list nobody would settle: the subscription came back with the
-- reconnection, and the caller waited for ever (found by the Redis
-- client's re-entrancy fuzzer, once in 89,000 sequences).
--
-- Here a line hook in `subscribe` loses the connection at its k-th line
-- event, for every k: the fake server closes the subscriber's connection
-- and the hook runs the loop until the client has seen it.  Every caller
-- must end (subscribed, or E_UNAVAILABLE), and none may be left waiting.

local uv = require "luv"
local fake = require "fake_redis"
local redis = require "async_mutex.redis"

-- Runs the loop until done() or ms pass; whether done() holds.
local function run_until(done, ms)
  local t = uv.new_timer()
  local over = false
  t:start(ms, 0, function() over = true end)
  while not done() and not over do uv.run("once") end
  t:close()
  uv.run("nowait")
  return done()
end

describe("a subscriber connection lost while subscribe enlists its caller", function()
  it("at each line of subscribe: the caller ends (subscribed or E_UNAVAILABLE), never waits"
    .. " for ever", function()
    local sub_conn                       -- the connection that subscribes
    local srv = fake.start(function(conn, cmd)
      if cmd[1]:upper() == "SUBSCRIBE" then sub_conn = conn end
      return fake.DEFAULT
    end)
    local subscribe = getmetatable(redis.connect({ port = srv.port })).__index.subscribe
    -- its body, which subscribe and ssubscribe share (their tail call)
    for i = 1, math.huge do
      local name, v = debug.getupvalue(subscribe, i)
      if name == nil then break end
      if name == "subscribe_to" then subscribe = v end
    end
    local defined = debug.getinfo(subscribe, "S")
    local outcomes, k, reached = {}, 0, true
    while reached do
      k = k + 1
      reached = false
      sub_conn = nil
      local c = redis.connect({ port = srv.port, reconnectDelay = 1, reconnectDelayMax = 1,
                                 commandTimeout = 2000 })
      -- a first channel, confirmed: the subscriber is connected
      local first
      coroutine.wrap(function() first = c:subscribe("a", function() end) end)()
      assert.is_true(run_until(function() return first ~= nil end, 2000), "no first subscription")
      local old = sub_conn
      local outcome
      local co = coroutine.create(function()
        local events = 0
        debug.sethook(function()
          local info = debug.getinfo(2, "S")
          if info.source ~= defined.source or info.linedefined ~= defined.linedefined then return end
          events = events + 1
          if events ~= k then return end
          reached = true
          debug.sethook()
          old:close()                    -- the server ends the connection
          run_until(function() return sub_conn ~= old end, 1000)   -- seen, and back
        end, "l")
        local ok, err = pcall(c.subscribe, c, "b", function() end)
        debug.sethook()
        outcome = ok and "subscribed" or tostring(err)
      end)
      assert(coroutine.resume(co))
      run_until(function() return outcome ~= nil end, 3000)
      outcomes[#outcomes + 1] = ("line event %d: %s"):format(k, tostring(outcome))
      assert.is_not_nil(outcome, table.concat(outcomes, "\n") .. "\n(the caller still waits)")
      assert.is_true(outcome == "subscribed" or outcome:match("^redis server unavailable") ~= nil,
        outcome)
      c:close()
      run_until(function() return false end, 5)
    end
    srv:stop()
    uv.run()
    -- every line of subscribe was a place of the loss (its line events,
    -- the last one past the end)
    assert.is_true(k > 10, ("only %d line events"):format(k))
  end)
end)
