-- redis.versioned: versioned values on Redis and their optimistic update,
-- against a real redis-server started for this file (docs/optimistic.md,
-- "Versioned values on Redis").  Contention comes from real concurrency:
-- coroutines on one connection, a second client, and child lua5.4
-- processes.

local redis_server = require "redis_server"
local am = require "async_mutex"

local h, redis, server = redis_server.spec_file(setup, teardown)

local ROOT = h.ROOT

local function client()
  return redis.connect({ path = server.path })
end

local with = require("redis_server").cases(client)

-- A key of its own for each test.
local fresh_key = require("lock_redis").namer("versioned")

--- The elements of an array reply (without its `n`).
local function list(reply)
  return { table.unpack(reply, 1, reply.n or #reply) }
end

local function shquote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- Runs `code` in `n` child lua5.4 processes at once (each given `...` as
-- its arguments, then its index); returns their { rc, stdout, stderr }.
local function children(n, code, ...)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = shquote(a) end
  local runs = {}
  for i = 1, n do
    local errfile = os.tmpname()
    local cmd = ("env LUA_PATH=%s LUA_CPATH=%s timeout -s KILL 60 lua5.4 %s %s %d 2>%s"):format(
      shquote(package.path), shquote(package.cpath), shquote(script),
      table.concat(args, " "), i, shquote(errfile))
    runs[i] = { pipe = assert(io.popen(cmd, "r")), errfile = errfile }
  end
  local results = {}
  for i, run in ipairs(runs) do
    local out = run.pipe:read("a")
    local _, _, rc = run.pipe:close()
    local ef = assert(io.open(run.errfile))
    results[i] = { rc = rc, stdout = out, stderr = ef:read("a") }
    ef:close()
    os.remove(run.errfile)
  end
  os.remove(script)
  return results
end

describe("redis.versioned(client, key)", function()
  it("reads an absent key as nil, version 0, and writes nothing", with.client(function(c)
    local key = fresh_key()
    local v = redis.versioned(c, key)
    local value, version = v:get()
    assert.is_nil(value)
    assert.equal(0, version)
    assert.equal("integer", math.type(version))
    assert.equal(0, c:call("EXISTS", key))
  end))

  it("keeps its key and client, and says so in tostring", with.client(function(c)
    local v = redis.versioned(c, "stock:42")
    assert.equal("stock:42", v.key)
    assert.equal(c, v.client)
    assert.equal("async_mutex.redis.Versioned: stock:42", tostring(v))
  end))

  it("stores value and version in one hash", with.client(function(c)
    local key = fresh_key()
    assert.equal(1, redis.versioned(c, key):set("abc", 0))
    assert.equal("hash", c:call("TYPE", key))
    assert.same({ "abc", "1" }, list(c:call("HMGET", key, "value", "version")))
  end))
end)

describe("versioned:set(value, expected_version)", function()
  it("writes when the version is the expected one and returns the new version",
    with.client(function(c)
      local v = redis.versioned(c, fresh_key())
      assert.equal(1, v:set("3", 0))
      assert.equal(2, v:set("2", 1))
      local value, version = v:get()
      assert.equal("2", value)
      assert.equal(2, version)
    end))

  it("returns false on a stale version and writes nothing", with.client(function(c)
    local v = redis.versioned(c, fresh_key())
    assert.equal(1, v:set("first", 0))
    assert.is_false(v:set("second", 0))
    assert.is_false(v:set("third", 5))
    local value, version = v:get()
    assert.equal("first", value)
    assert.equal(1, version)
  end))

  it("refuses a value changed 3 -> 2 -> 3 since it was read (ABA)", with.client(function(c)
    local key = fresh_key()
    local reader, other = redis.versioned(c, key), redis.versioned(c, key)
    assert.equal(1, other:set(3, 0))
    local value, version = reader:get()            -- reads 3, version 1
    assert.equal("3", value)
    assert.equal(2, other:set(2, 1))               -- 3 -> 2
    assert.equal(3, other:set(3, 2))               -- 2 -> 3
    assert.is_false(reader:set(value - 1, version))  -- the value is 3 again: refused
    value, version = reader:get()
    assert.equal("3", value)
    assert.equal(3, version)
  end))

  it("stores strings as given, binary-safe, and numbers as strings", with.client(function(c)
    local v = redis.versioned(c, fresh_key())
    local cases = {
      { "a\0b\255\n", "a\0b\255\n" }, { "", "" }, { 42, "42" }, { -7, "-7" },
      { 2.0, "2.0" }, { 0.1, "0.1" }, { 1e300, "1e+300" }, { 1 / 3, "0.3333333333333333" },
      { math.maxinteger, "9223372036854775807" },
    }
    for i, case in ipairs(cases) do
      assert.equal(i, v:set(case[1], i - 1))
      local value = v:get()
      assert.equal(case[2], value)
      if type(case[1]) == "number" then assert.equal(case[1], tonumber(value)) end
    end
  end))
end)

describe("versioned:delete(expected_version)", function()
  it("removes the value and keeps the version, incremented (a tombstone)",
    with.client(function(c)
      local key = fresh_key()
      local v = redis.versioned(c, key)
      assert.equal(1, v:set("x", 0))
      assert.equal(2, v:delete(1))
      local value, version = v:get()
      assert.is_nil(value)
      assert.equal(2, version)
      assert.same({ "version" }, list(c:call("HKEYS", key)))
      assert.equal(3, v:set("y", 2))                  -- written again from there
    end))

  it("returns false on a stale version and removes nothing", with.client(function(c)
    local v = redis.versioned(c, fresh_key())
    assert.equal(1, v:set("x", 0))
    assert.is_false(v:delete(0))
    assert.is_false(v:delete(2))
    assert.equal("x", (v:get()))
  end))

  it("of nothing changes nothing: an absent key stays absent, a tombstone's "
    .. "version stays", with.client(function(c)
      local key = fresh_key()
      local v = redis.versioned(c, key)
      assert.equal(0, v:delete(0))
      assert.equal(0, c:call("EXISTS", key))
      assert.equal(1, v:set("x", 0))
      assert.equal(2, v:delete(1))
      assert.equal(2, v:delete(2))
      assert.equal(2, select(2, v:get()))
    end))

  it("makes a write that read before it fail, so a version is never reused (ABA)",
    with.client(function(c)
      local key = fresh_key()
      local writer, deleter = redis.versioned(c, key), redis.versioned(c, key)
      assert.equal(1, deleter:set("5", 0))
      local _, version = writer:get()                  -- version 1
      assert.equal(2, deleter:delete(1))
      assert.is_false(writer:set("4", version))        -- raced the delete: refused
      assert.is_false(writer:set("4", 0))              -- nor is the key "new" again
      local value, now = writer:get()
      assert.is_nil(value)
      assert.equal(2, now)
    end))

  it("fails when a write came in after the read", with.client(function(c)
    local v = redis.versioned(c, fresh_key())
    assert.equal(1, v:set("5", 0))
    local _, version = v:get()
    assert.equal(2, v:set("6", version))
    assert.is_false(v:delete(version))
    assert.equal("6", (v:get()))
  end))

  it("races set from many coroutines: exactly one of each version wins", with.client(function(c)
    local key = fresh_key()
    assert.equal(1, redis.versioned(c, key):set("x", 0))
    local wins, losses, done = {}, 0, 0
    for i = 1, 20 do
      h.spawn(function()
        local v = redis.versioned(c, key)
        local r
        if i % 2 == 0 then r = v:delete(1) else r = v:set("w" .. i, 1) end
        if r then wins[#wins + 1] = i else losses = losses + 1 end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == 20 end)
    assert.equal(1, #wins)
    assert.equal(19, losses)
    local value, version = redis.versioned(c, key):get()
    assert.equal(2, version)
    if wins[1] % 2 == 0 then assert.is_nil(value) else assert.equal("w" .. wins[1], value) end
  end))
end)

describe("versioned:update(fn [, options])", function()
  it("calls fn(value, version, attempt), writes what it returns, returns value and version",
    with.client(function(c)
      local v = redis.versioned(c, fresh_key())
      local args
      local value, version = v:update(function(...)
        args = table.pack(...)
        return 10
      end)
      assert.equal("10", value)
      assert.equal(1, version)
      assert.same({ n = 3, nil, 0, 1 }, args)
      value, version = v:update(function(old, old_version)
        assert.equal("10", old)
        assert.equal(1, old_version)
        return old * 2
      end)
      assert.equal("20", value)
      assert.equal(2, version)
    end))

  it("retries on a conflict with the value read again", with.client(function(c)
    local key = fresh_key()
    local v, other = redis.versioned(c, key), redis.versioned(c, key)
    assert.equal(1, v:set(1, 0))
    local seen = {}
    local value, version = v:update(function(old, old_version, attempt)
      seen[#seen + 1] = { old, old_version, attempt }
      if attempt == 1 then assert.equal(2, other:set(100, 1)) end   -- a writer slips in
      return old + 1
    end)
    assert.same({ { "1", 1, 1 }, { "100", 2, 2 } }, seen)
    assert.equal("101", value)
    assert.equal(3, version)
  end))

  it("raises E_CONFLICT after maxAttempts when the key changes on every attempt, "
    .. "and the loser writes nothing", with.client(function(c)
      local key = fresh_key()
      local v, other = redis.versioned(c, key), redis.versioned(c, key)
      local attempts = 0
      local ok, err = pcall(v.update, v, function(_, version)
        attempts = attempts + 1
        assert(other:set("other " .. attempts, version))   -- someone else wins
        return "loser"
      end, { maxAttempts = 4, maxDelay = 0 })
      assert.is_false(ok)
      assert.equal(am.E_CONFLICT, err)
      assert.equal(4, attempts)
      local value, version = v:get()
      assert.equal("other 4", value)
      assert.equal(4, version)
    end))

  it("writes nothing when fn raises, and raises that error unchanged at once",
    with.client(function(c)
      local key = fresh_key()
      local v = redis.versioned(c, key)
      assert.equal(1, v:set("3", 0))
      local sold_out = setmetatable({}, { __name = "sold out" })
      local calls = 0
      local ok, err = pcall(v.update, v, function()
        calls = calls + 1
        error(sold_out)
      end)
      assert.is_false(ok)
      assert.is_true(rawequal(sold_out, err))
      assert.equal(1, calls)
      assert.same({ "3", "1" }, list(c:call("HMGET", key, "value", "version")))
    end))

  it("raises when fn returns no value, writing nothing, at the caller's line",
    with.client(function(c)
      local key = fresh_key()
      local v = redis.versioned(c, key)
      for _, bad in ipairs({ { nil, "nil" }, { true, "boolean" }, { 0 / 0, "number" } }) do
        local ok, err = pcall(function() v:update(function() return bad[1] end) end)
        assert.is_false(ok)
        assert.matches("^[^:]*49%-versioned_spec%.lua:%d+: ", err)
        assert.equal("update: fn must return a string or finite number, got " .. bad[2],
          h.strip_pos(err))
      end
      assert.equal(0, c:call("EXISTS", key))
    end))

  it("passes the options on to am.optimistic", with.client(function(c)
    local key = fresh_key()
    local v, other = redis.versioned(c, key), redis.versioned(c, key)
    local slept = {}
    local mine = {}
    local ok, err = pcall(v.update, v, function(_, version)
      other:set("x", version)
      return "y"
    end, { maxAttempts = 3, baseDelay = 8, sleep = function(ms) slept[#slept + 1] = ms end,
      random = function() return 0.5 end, conflictError = mine })
    assert.is_false(ok)
    assert.is_true(rawequal(mine, err))
    assert.same({ 4, 8 }, slept)
  end))

  it("counts exactly with 100 coroutines on one connection", with.client(function(c)
    local key = fresh_key()
    local n, per = h.load(100), 10
    local done = 0
    for _ = 1, n do
      h.spawn(function()
        local v = redis.versioned(c, key)
        for _ = 1, per do
          v:update(function(value) return (tonumber(value) or 0) + 1 end,
            { maxAttempts = math.huge })
        end
        done = done + 1
      end)
    end
    h.wait_until(function() return done == n end, 20000)
    local value, version = redis.versioned(c, key):get()
    assert.equal(tostring(n * per), value)
    assert.equal(n * per, version)
  end))
end)

describe("versioned values across processes", function()
  it("4 processes x 50 coroutines x 100 updates of one key end exactly at 20,000",
    function()
      local key = fresh_key()
      local procs, cos, per = 4, 50, 100
      if h.SLOW then cos, per = 10, 20 end
      local results = children(procs, [[
                local uv = require "luv"
        local am = require "async_mutex"
        local redis = require "async_mutex.redis"
        local path, key, cos, per = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4])
        local c = redis.connect({ path = path })
        local done, attempts = 0, 0
        for _ = 1, cos do
          am.spawn(function()
            local v = redis.versioned(c, key)
            for _ = 1, per do
              v:update(function(value)
                attempts = attempts + 1
                return (tonumber(value) or 0) + 1
              end, { maxAttempts = math.huge })
              done = done + 1
            end
          end)
        end
        uv.run()
        c:close()
        uv.run()                                -- let the close complete
        print(done, attempts)
      ]], server.path, key, cos, per)
      local total = 0
      for i, r in ipairs(results) do
        assert.equal(0, r.rc, ("child %d: %s"):format(i, r.stderr))
        assert.equal("", r.stderr)
        local done, attempts = r.stdout:match("^(%d+)\t(%d+)\n$")
        assert.equal(cos * per, tonumber(done), r.stdout)
        assert(tonumber(attempts) >= cos * per)
        total = total + tonumber(done)
      end
      assert.equal(procs * cos * per, total)
      h.run(function()
        local c = client()
        local value, version = redis.versioned(c, key):get()
        assert.equal(tostring(procs * cos * per), value)
        assert.equal(procs * cos * per, version)
        c:close()
      end)
    end)
end)

describe("versioned values and failures", function()
  it("raise a server's error reply unchanged, without retrying", with.client(function(c)
    local plain, odd, foreign = fresh_key(), fresh_key(), fresh_key()
    assert.equal("OK", c:call("SET", plain, "1"))
    c:call("HSET", odd, "version", "x")
    c:call("HSET", foreign, "name", "n", "value", "v")   -- another program's hash
    for _, key in ipairs({ plain, odd, foreign }) do
      local v = redis.versioned(c, key)
      for _, op in ipairs({
        function() v:get() end,
        function() v:set("2", 0) end,
        function() v:delete(0) end,
      }) do
        local ok, err = pcall(op)
        assert.is_false(ok)
        assert.equal("WRONGTYPE", err.code)
      end
      local calls = 0
      local ok, err = pcall(v.update, v, function() calls = calls + 1; return "2" end)
      assert.is_false(ok)
      assert.equal("WRONGTYPE", err.code)
      assert.equal(0, calls)
    end
    assert.equal("1", c:call("GET", plain))
    assert.same({ "n", "v", n = 2 }, c:call("HMGET", foreign, "name", "value"))
    assert.equal(0, c:call("HEXISTS", foreign, "version"))
    -- a hash of other fields only reads as never written, but is not written into
    local other = fresh_key()
    c:call("HSET", other, "name", "n")
    local v = redis.versioned(c, other)
    assert.same({ nil, 0 }, { v:get() })
    for _, op in ipairs({ function() v:set("2", 0) end, function() v:delete(0) end,
      function() v:update(function() return "2" end) end }) do
      local ok, err = pcall(op)
      assert.is_false(ok)
      assert.equal("WRONGTYPE", err.code)
    end
    assert.equal(1, c:call("HLEN", other))            -- only its own field
    assert.equal("n", c:call("HGET", other, "name"))
  end))

  it("raise E_UNAVAILABLE when Redis is down, once, not a retry storm", function()
    local down = redis_server.start()
    local ok, err = pcall(h.run, function()
      local c = redis.connect({ path = down.path })
      local v = redis.versioned(c, "k")
      assert.equal(1, v:set("1", 0))
      -- the server dies while fn computes: the write raises, nothing retries
      local calls = 0
      local ok1, err1 = pcall(v.update, v, function(value)
        calls = calls + 1
        down:kill()
        return value + 1
      end)
      assert.is_false(ok1)
      assert.equal(redis.E_UNAVAILABLE, err1)
      assert.equal(1, calls)
      -- with the server gone, the read raises and fn is never called
      local ok2, err2 = pcall(v.update, v, function() calls = calls + 1; return "x" end)
      assert.is_false(ok2)
      assert.equal(redis.E_UNAVAILABLE, err2)
      assert.equal(1, calls)
      c:close()
    end)
    down:stop()
    assert(ok, err)
  end)
end)

describe("versioned values' bad input", function()
  local c, v
  before_each(function()
    c = client()
    v = redis.versioned(c, "bad-input")
  end)
  after_each(function() h.run(function() c:close() end) end)

  local CASES = {
    { "versioned without a client", function() redis.versioned({}, "k") end,
      "bad argument #1 to 'versioned' (async_mutex.redis.Client expected, got table)" },
    { "versioned with a number key", function() redis.versioned(c, 42) end,
      "bad argument #2 to 'versioned' (string expected, got number)" },
    { "versioned without a key", function() redis.versioned(c) end,
      "bad argument #2 to 'versioned' (string expected, got nil)" },
    { "get on something else", function() v.get({}) end,
      "bad argument #1 to 'get' (async_mutex.redis.Versioned expected, got table)" },
    { "set without a value", function() v:set(nil, 0) end,
      "bad argument #1 to 'set' (string or finite number expected, got nil)" },
    { "set with a table", function() v:set({}, 0) end,
      "bad argument #1 to 'set' (string or finite number expected, got table)" },
    { "set with NaN", function() v:set(0 / 0, 0) end,
      "bad argument #1 to 'set' (string or finite number expected, got number)" },
    { "set with math.huge", function() v:set(math.huge, 0) end,
      "bad argument #1 to 'set' (string or finite number expected, got number)" },
    { "set without a version", function() v:set("x") end,
      "bad argument #2 to 'set' (version must be a non-negative integer)" },
    { "set with version -1", function() v:set("x", -1) end,
      "bad argument #2 to 'set' (version must be a non-negative integer)" },
    { "set with version 1.5", function() v:set("x", 1.5) end,
      "bad argument #2 to 'set' (version must be a non-negative integer)" },
    { "set with version '1'", function() v:set("x", "1") end,
      "bad argument #2 to 'set' (version must be a non-negative integer)" },
    { "set on something else", function() v.set("x", "y", 0) end,
      "bad argument #1 to 'set' (async_mutex.redis.Versioned expected, got string)" },
    { "delete without a version", function() v:delete() end,
      "bad argument #1 to 'delete' (version must be a non-negative integer)" },
    { "delete with version -2", function() v:delete(-2) end,
      "bad argument #1 to 'delete' (version must be a non-negative integer)" },
    { "update without fn", function() v:update() end,
      "bad argument #1 to 'update' (function expected, got no value)" },
    { "update with a string as fn", function() v:update("f") end,
      "bad argument #1 to 'update' (function expected, got string)" },
    { "update with bad options", function() v:update(tostring, { maxAttempts = 0 }) end,
      "bad argument #2 to 'update' (maxAttempts must be a positive integer or math.huge)" },
    { "update with an unknown option", function() v:update(tostring, { retries = 3 }) end,
      "bad argument #2 to 'update' (unknown option 'retries'; options: baseDelay, conflictError, maxAttempts, maxDelay, random, sleep)" },
    { "update on something else", function() v.update(nil, tostring) end,
      "bad argument #1 to 'update' (async_mutex.redis.Versioned expected, got nil)" },
  }

  for _, case in ipairs(CASES) do
    it("raises for " .. case[1] .. ", at the caller's line, writing nothing",
      h.async(function()
        local ok, err = pcall(case[2])
        assert.is_false(ok)
        assert.matches("^[^:]*49%-versioned_spec%.lua:%d+: ", err)
        assert.equal(case[3], h.strip_pos(err))
        assert.equal(0, c:call("EXISTS", "bad-input"))
      end))
  end

  it("raises for update outside a coroutine, before reading", function()
    local ok, err = pcall(function() v:update(function() return "x" end) end)
    assert.is_false(ok)
    assert.matches("49%-versioned_spec%.lua:%d+: attempt to update a versioned value "
      .. "outside a coroutine$", err)
  end)
end)

describe("docs/api.md and types/ on versioned values", function()
  it("document and annotate every method", function()
    local readme = h.read_file(ROOT .. "/docs/api.md")
    local types = h.read_file(ROOT .. "/types/versioned.lua")
    local methods = {}
    for name in pairs(require("async_mutex.versioned").Versioned) do
      methods[#methods + 1] = name
    end
    table.sort(methods)
    assert.same({ "delete", "get", "set", "update" }, methods)
    for _, name in ipairs(methods) do
      assert.truthy(readme:find("versioned:" .. name .. "(", 1, true), name)
      assert.truthy(types:find("\nfunction Versioned:" .. name .. "(", 1, true), name)
    end
    assert.truthy(readme:find("redis.versioned(", 1, true))
  end)
end)

describe("examples/optimistic_stock.lua", function()
  it("sells one item from several processes and never oversells", function()
    local p = assert(io.popen(("cd %s && timeout 60 lua5.4 examples/optimistic_stock.lua 2>&1")
      :format(shquote(ROOT))))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.equal(0, code, out)
    local total = 0
    for sold in out:gmatch("process %d+ sold (%d+)") do total = total + tonumber(sold) end
    assert.equal(100, total, out)
    assert.matches("\nsold 100 of 100, stock left 0, version %d+: nothing oversold\n", out)
  end)
end)
