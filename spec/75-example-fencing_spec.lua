-- examples/redis_orders.lua as a user would copy it: its store (two scripts,
-- FENCED_READ and FENCED_WRITE, taken from the example's own text) must
-- keep the promise of its header comment, that a worker paused past its
-- lease cannot sell with a stale stock.  Fencing tokens strictly increase
-- per lock (docs/api.md, "Guarantees and limits"; docs/redis-locks.md), but a
-- store that checks them at writes only still accepts the paused worker's
-- write when it lands between the next holder's read and write; the next
-- holder's write is then accepted too, and one unit is sold twice.  The
-- scenario is played with real RedisMutex grants on a real redis-server,
-- without timing races: the first holder's lease (100 ms, no watchdog) has
-- ended in Redis before the second holder asks.

local R = require "lock_redis"

local am, h, server, fresh_name = R.spec_file(setup, teardown, "spec75")

local ROOT = h.ROOT

local example = h.read_file(ROOT .. "/examples/redis_orders.lua")

--- The text of the script the example assigns to `local name = [[...]]`.
local function script(name)
  return assert(example:match("\nlocal " .. name .. " = %[%[\n(.-)%]%]\n"),
    "examples/redis_orders.lua has no script " .. name)
end

describe("examples/redis_orders.lua's fenced store", function()
  it("refuses the sale of a holder paused past its lease once the next holder has read,"
    .. " and accepts the next holder's", h.async(function()
      local read, write = script("FENCED_READ"), script("FENCED_WRITE")
      local lock, stock = fresh_name(), fresh_name()
      -- two clients: two processes, each with its own place in the queue
      local a, b = server:client(), server:client()
      local paused = am.RedisMutex.new(a, lock, { ttl = 100, renewInterval = 0 })
      local next_holder = am.RedisMutex.new(b, lock)
      a:call("HSET", stock, "units", 10, "fence", 0)

      local old = paused:acquire()
      assert.equal(10, tonumber(a:eval(read, { stock }, { old.fence })))
      am.sleep(250)                     -- paused: the 100 ms lease ends in Redis
      local new = next_holder:acquire()
      assert.is_true(new.fence > old.fence)
      assert.equal(10, tonumber(b:eval(read, { stock }, { new.fence })))

      -- the paused holder wakes and sells from what it read: refused
      assert.equal(0, a:eval(write, { stock }, { 10 - 1, old.fence }))
      assert.is_nil(a:eval(read, { stock }, { old.fence }))
      -- the next holder's sale goes through, and the stock counts one sale
      assert.equal(1, b:eval(write, { stock }, { 10 - 1, new.fence }))
      assert.equal("9", a:call("HGET", stock, "units"))

      assert.is_false(old())            -- its hold was lost
      assert.is_true(new())
      a:call("DEL", stock)
      a:close()
      b:close()
    end))

  it("lets one holder read, then write, with its own fence", h.async(function()
    local read, write = script("FENCED_READ"), script("FENCED_WRITE")
    local stock = fresh_name()
    local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
    c:call("HSET", stock, "units", 3, "fence", 0)
    for left = 3, 1, -1 do
      local release <close> = m:acquire()
      assert.equal(left, tonumber(c:eval(read, { stock }, { release.fence })))
      assert.equal(1, c:eval(write, { stock }, { left - 1, release.fence }))
    end
    assert.equal("0", c:call("HGET", stock, "units"))
    c:call("DEL", stock)
    c:close()
  end))
end)
