-- A debug hook at luv's poll start, or at the ref or unref of the poll
-- handle (docs/redis.md, "Re-entry"), that calls the same client, whose C
-- part then changes what the same poll handle watches (a nested
-- hooks.watch), and then closes the client.  The handle must be closed
-- only once luv is done with the outer call: libuv asserts that a handle
-- it starts or stops is not closing.  Before, the nested call's end marked
-- the handle free, the close closed it, and the outer stop aborted the
-- process (found by the Redis client's re-entrancy fuzzer, seeds 520000..
-- of a run).  The handle is no longer stopped when the client goes idle,
-- only unref'd, and ref'd again at the next call: those are the points now.
-- Each case runs in a child process: an abort fails the case, not the run.

local h = require "helpers"
local redis_server = require "redis_server"

local server = redis_server.for_file(setup, teardown)

local CHILD = [[
local uv = require "luv"
local redis = require "async_mutex.redis"
local PORT, WHICH = %d, %q
local target = ({ start = uv.poll_start, ref = uv.ref, unref = uv.unref })[WHICH]
local c = redis.connect({ port = PORT })
local fired, nested, outcome = false, nil, nil
local function hook()
  if fired or debug.getinfo(2, "f").func ~= target then return end
  fired = true
  debug.sethook()
  -- a call of the same client from a coroutine of its own: it asks the
  -- C part to watch the same handle again (a nested watch), then waits
  coroutine.wrap(function()
    local ok, err = pcall(c.call, c, "PING")
    nested = ok and "PONG" or tostring(err)
  end)()
  c:close()
end
local co = coroutine.create(function()
  debug.sethook(hook, "c")
  local ok, err = pcall(c.call, c, "PING")
  debug.sethook()
  outcome = tostring(err)
end)
debug.sethook(hook, "c")                 -- the main thread: luv's callbacks
assert(coroutine.resume(co))
uv.run()
debug.sethook()
io.write(tostring(fired), "|", tostring(outcome), "|", tostring(nested), "\n")
]]

describe("a debug hook at luv's poll start, ref or unref that calls the client, then closes it", function()
  for _, which in ipairs({ "start", "ref", "unref" }) do
    it(("at %s: no abort, every call ends, uv.run() returns"):format(which), function()
      local res = h.subprocess(CHILD:format(server.port, which), 60)
      h.clean_exit(res)
      local fired, outcome, nested = res.stdout:match("^([^|]*)|([^|]*)|([^|]*)\n$")
      assert.equal("true", fired, res.stdout)
      -- each call ends: with its reply, or with the close
      assert.is_truthy(outcome == "PONG" or outcome:match("^redis server unavailable"), outcome)
      assert.is_truthy(nested == "PONG" or nested:match("^redis server unavailable")
        or nested:match("closed redis client"), nested)
    end)
  end
end)
