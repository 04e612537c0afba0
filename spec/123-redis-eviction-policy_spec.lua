-- A server that may evict the Redis locks' keys (docs/redis-locks.md,
-- "Eviction"): with maxmemory and an evicting maxmemory-policy, a
-- holder's record can be evicted and a second holder let in.  The locks
-- read the policy (INFO memory) at their first use on each connection of
-- the client and refuse such a server with an error naming
-- maxmemory-policy, or warn once per connection with unsafeEviction =
-- "warn".  Every key of a lock has an expiry, so the volatile-* policies
-- may evict them too: only noeviction (or no maxmemory) is safe.  Before,
-- nothing was checked.

local R = require "lock_redis"

local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec123")

local function configure(c, maxmemory, policy)
  c:call("CONFIG", "SET", "maxmemory", maxmemory)
  c:call("CONFIG", "SET", "maxmemory-policy", policy)
end

local function refusal(policy, bytes)
  return ("the Redis server may evict the lock's keys (maxmemory-policy %s, maxmemory %d):"
    .. " use maxmemory-policy noeviction, or the option unsafeEviction = \"warn\""):format(
    policy, bytes)
end

local function keys_of(c, name) return #c:call("KEYS", name .. "*") end

describe("a server whose maxmemory-policy may evict keys", function()
  it("is refused by every method that asks Redis, with an error naming the policy",
    h.async(function()
      local admin = server:client()
      configure(admin, "10000000", "allkeys-random")
      local c, name = R.one_client(server, fresh_name)
      local m = am.RedisMutex.new(c, name)
      local s = am.RedisSemaphore.new(c, name .. "s", 2)
      local k = am.KeyedRedisMutex.new(c, name .. "k:")
      local e = refusal("allkeys-random", 10000000)
      assert.same({ false, e }, { pcall(m.acquire, m) })
      assert.same({ false, e }, { pcall(m.runExclusive, m, function() end) })
      assert.same({ false, e }, { pcall(m.waitForUnlock, m) })
      assert.same({ false, e }, { pcall(m.isLocked, m) })
      assert.same({ false, e }, { pcall(s.acquire, s, 2) })
      assert.same({ false, e }, { pcall(s.getValue, s) })
      assert.same({ false, e }, { pcall(k.acquire, k, "a") })
      local t, w = am.tryAcquire(m), am.withTimeout(k, 1000)
      assert.same({ false, e }, { pcall(t.acquire, t) })
      assert.same({ false, e }, { pcall(w.acquire, w, "a") })
      assert.equal(0, keys_of(admin, name))  -- nothing was written
      configure(admin, "0", "noeviction")
      c:close(); admin:close()
    end))

  it("is refused under every volatile-* policy too (the locks' keys have expiries), and"
    .. " taken with noeviction or no maxmemory", with.client(function(admin)
      for _, case in ipairs({
        { "10000000", "volatile-lru", false }, { "10000000", "volatile-ttl", false },
        { "10000000", "allkeys-lru", false }, { "10000000", "noeviction", true },
        { "0", "allkeys-lru", true },
      }) do
        configure(admin, case[1], case[2])
        local m, c = R.one_lock(server, fresh_name, am.RedisMutex)
        local ok, err = pcall(m.acquire, m)
        assert.equal(case[3], ok, case[2] .. " with maxmemory " .. case[1] .. ": "
          .. tostring(err))
        if ok then
          assert.is_true(err())
        else
          assert.equal(refusal(case[2], tonumber(case[1])), err)
        end
        c:close()
      end
      configure(admin, "0", "noeviction")
    end))

  it("is read again on each new connection of the client", h.async(function()
    local admin = server:client()
    local c, name = R.one_client(server, fresh_name)
    local m = am.RedisMutex.new(c, name)
    m:acquire()()                          -- read once: safe
    configure(admin, "10000000", "allkeys-lfu")
    m:acquire()()                          -- same connection: not read again
    admin:call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    -- the request that finds the connection gone opens a new one: the
    -- policy is read on it before acquire returns, and the grant given back
    assert.equal(refusal("allkeys-lfu", 10000000), select(2, pcall(m.acquire, m)))
    c:call("PING")                         -- the give-back has reached Redis
    assert.equal(0, admin:call("EXISTS", name .. ":h"))
    configure(admin, "0", "noeviction")
    admin:call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    m:acquire()()
    c:close(); admin:close()
  end))

  it("is not refused when the client may not read it (an ACL without INFO)", with.client(function(admin)
    configure(admin, "10000000", "allkeys-random")
    admin:call("ACL", "SETUSER", "spec123", "on", ">pw", "~*", "&*", "+@all", "-info")
    local c = server:client({ username = "spec123", password = "pw" })
    local m = am.RedisMutex.new(c, fresh_name())
    assert.is_true(m:acquire()())
    c:close()
    admin:call("ACL", "DELUSER", "spec123")
    configure(admin, "0", "noeviction")
  end))
end)

-- A child whose lock takes the server with a warning: two connections,
-- two warnings; the locks work.
local WARN = R.PROLOGUE .. [[
local m = am.RedisMutex.new(client, ARGS[1], { unsafeEviction = "warn" })
local k = am.KeyedRedisMutex.new(client, ARGS[1] .. ":", { unsafeEviction = "warn" })
main(function()
  m:acquire()()
  k:acquire("a")()
  assert(not m:isLocked())
  pcall(client.call, client, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
  pcall(client.call, client, "PING")     -- (may find the connection ended)
  m:acquire()()
  io.stdout:write("ok\n")
end)
]]

describe("the option unsafeEviction = \"warn\"", function()
  it("takes such a server with one warning on stderr per connection", h.async(function()
    local admin = server:client()
    configure(admin, "10000000", "allkeys-random")
    local child = R.child(WARN, { server.path, fresh_name() })
    local rc, out, err = child:wait()
    configure(admin, "0", "noeviction")
    admin:close()
    assert.equal(0, rc, err)
    assert.equal("ok\n", out)
    local line = "async_mutex: warning: the Redis server may evict the Redis locks' keys"
      .. " (maxmemory-policy allkeys-random, maxmemory 10000000): two holders are possible;"
      .. " use maxmemory-policy noeviction (docs/redis-locks.md, \"Eviction\")\n"
    assert.equal(line .. line, err)
  end))

  it("takes only \"error\" or \"warn\"", with.client(function(c)
    assert.equal("bad argument #3 to 'new' (options.unsafeEviction must be \"error\" or"
      .. " \"warn\")", h.error_of(function() am.RedisMutex.new(c, "x", { unsafeEviction = 1 }) end))
    assert.equal("bad argument #4 to 'new' (options.unsafeEviction must be \"error\" or"
      .. " \"warn\")", h.error_of(function()
        am.RedisSemaphore.new(c, "x", 2, { unsafeEviction = "off" }) end))
    am.RedisMutex.new(c, "x", { unsafeEviction = "error" })
  end))
end)
