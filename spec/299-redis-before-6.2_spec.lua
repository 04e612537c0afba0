-- The Redis locks' scripts on a server older than Redis 6.2 (Debian 11's
-- and Ubuntu 22.04's Redis 6.0), whose SET has no GET option: their
-- number draws (the fences and arrival numbers of N:n, RedlockMutex's
-- quorum fence of N:qf) fall back to a GET and a SET (docs/redis-locks.md,
-- "In Redis").  The Redis 7 of the tests runs them with `redis.pcall`
-- refusing SET ... GET as 6.0 does, before anything is written.

local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local am, _, _, _, with = R.spec_file(setup, teardown, "spec299")

-- Put before a script: its redis.call and redis.pcall answer SET ... GET
-- as Redis 6.0 does (a raised error, an error reply), every other call
-- goes through.
local BEFORE_6_2 = [[
local real = redis
local function refused(cmd, ...)
  return cmd == 'SET' and select(select('#', ...), ...) == 'GET'
end
local redis = setmetatable({
  call = function(cmd, ...)
    if refused(cmd, ...) then error({ err = 'ERR syntax error' }) end
    return real.call(cmd, ...)
  end,
  pcall = function(cmd, ...)
    if refused(cmd, ...) then return { err = 'ERR syntax error' } end
    return real.pcall(cmd, ...)
  end,
}, { __index = real })
]]

local function old(script) return BEFORE_6_2 .. script end

local AHEAD = 1000000000000          -- a counter 11 days ahead of the clock (µs)

local function calls(c, command)
  local stats = c:call("INFO", "commandstats")
  return tonumber(stats:match("cmdstat_" .. command .. ":calls=(%d+)") or "0")
end

-- The fence in a holder's record of N:h ("end weight fence value").
local function record_fence(c, name, token)
  local rec = c:call("HGET", name .. ":h", token)
  return rec and tonumber(rec:match("^%d+ %d+ (%d+)"))
end

describe("on a Redis before 6.2 (SET without GET)", function()
  it("a lock's fences go on rising, through a GET and a SET", with.one_client(function(c, name)
    local function acquire(token, mode)
      return R.eval_script(c, name, old(scripts.acquire), token, "1", "1", "2000", "3000",
        "nobody", mode)
    end
    local gets = calls(c, "get")
    local r = acquire("a", "wait")                -- a free lock: granted at once
    assert.equal(1, r[1])
    local f1 = tonumber(r[2])
    assert.equal(tostring(f1), c:call("GET", name .. ":n"))
    assert.is_true(calls(c, "get") > gets)        -- the fallback ran
    -- a counter ahead of the clock: the next number is above it
    c:call("SET", name .. ":n", tostring(f1 + AHEAD), "PX", "3600000")
    r = acquire("b", "wait")                      -- queued behind a
    assert.equal(0, r[1])
    assert.equal(f1 + AHEAD + 1, tonumber(r[3]))
    -- a's release hands the lock to b, with a fence above every number
    assert.equal(1, R.eval_script(c, name, old(scripts.release), "a", "1"))
    assert.equal(f1 + AHEAD + 2, record_fence(c, name, "b"))
    assert.equal(1, R.eval_script(c, name, old(scripts.release), "b", "1"))
    -- a semaphore's grant by the prelude's path (a limit above 1)
    r = R.eval_script(c, name .. "s", old(scripts.acquire), "s", "3", "1", "2000", "3000",
      "nobody", "wait")
    assert.equal(1, r[1])
    assert.is_true(tonumber(r[2]) > f1)
  end))

  it("RedlockMutex's quorum fence is drawn above the counter and the hint",
     with.one_client(function(c, name)
    -- (a server's own request and its keys, as the RedlockMutex makes them)
    local server1 = rawget(am.RedlockMutex.new({ c }, name), "servers")[1]
    local keys = server1.keys
    assert.equal(name .. ":qf", keys[7])
    local function acquire(token, hint)
      return c:eval(old(server1.acquire_script), keys,
        { token, "1", "1", "2000", "3000", "nobody", "wait", hint })
    end
    c:call("SET", name .. ":qf", "500", "PX", "3600000")
    local r = acquire("a", "0")                  -- no hint: the counter plus one
    assert.equal(1, r[1])
    assert.equal("501", r[4])
    assert.equal(1, R.eval_script(c, name, old(scripts.release), "a", "1"))
    r = acquire("b", "900")                      -- a hint above the counter
    assert.equal("900", r[4])
    assert.equal("900", c:call("GET", name .. ":qf"))
    assert.equal(1, R.eval_script(c, name, old(scripts.release), "b", "1"))
  end))
end)
