-- The Redis client writes requests in the protocol's form itself
-- (`amr_write_command` in src/redis/output.c, docs/redis.md "Connection"), and
-- `core.script` takes a script's arguments as a list or as values (the
-- Redis locks pass values: docs/redis-locks.md, "Benchmark", third pass).
-- Every length header, argument count and byte must reach the server as
-- written, whatever the lengths and counts; the locks' tokens are
-- hex-encoded by `core.hex`.

local core = require "async_mutex.redis_core"

local h, redis, server = require("redis_server").spec_file(setup, teardown)

-- No timeouts: under valgrind, making a thousand arguments in Lua takes
-- longer than a connect timeout, and a megabyte longer than a command one.
local function client()
  return redis.connect { port = server.port, connectTimeout = math.huge,
                         commandTimeout = math.huge }
end

local with = require("redis_server").cases(client)

-- A string of n bytes that shows where it was cut: every byte value in
-- turn, from a start that depends on n (made with few allocations, so that
-- the spec stays quick under AM_GC_STRESS).
local ALL_BYTES = {}
for i = 0, 255 do ALL_BYTES[#ALL_BYTES + 1] = string.char(i) end
ALL_BYTES = table.concat(ALL_BYTES)
local function bytes(n)
  local from = n % 256 + 1
  return ALL_BYTES:rep(n // 256 + 2):sub(from, from + n - 1)
end

describe("a request written by the client", function()
  it("carries every argument length from 0 to 1,100 bytes, and across 10^k, unchanged",
    with.client(function(c)
      local lengths = {}
      for n = 0, 1100 do lengths[#lengths + 1] = n end
      for _, n in ipairs({ 9999, 10000, 10001, 99999, 100000, 1000000 }) do
        lengths[#lengths + 1] = n
      end
      -- all in flight at once: many requests share the output buffer,
      -- which is written while replies are delivered (2 KB at a time)
      local left, me, bad = #lengths, coroutine.running(), {}
      for _, n in ipairs(lengths) do
        h.spawn(function()
          local s = bytes(n)
          local ok, echoed = pcall(c.call, c, "ECHO", s)
          if not ok or echoed ~= s then bad[#bad + 1] = ok and n or tostring(echoed) end
          left = left - 1
          if left == 0 then coroutine.resume(me) end
        end)
      end
      if left > 0 then coroutine.yield() end
      assert.same({}, bad)
    end, { deadline = 20000 }))

  it("carries 1,000 arguments (beyond those kept on the C stack) in order", with.client(function(c)
    local values = {}
    for i = 1, 1000 do values[i] = bytes(i % 40) .. i end
    c:call("DEL", "wire:list")
    assert.equal(1000, c:call("RPUSH", "wire:list", table.unpack(values)))
    local got = c:call("LRANGE", "wire:list", 0, -1)
    assert.equal(1000, got.n)
    for i = 1, 1000 do assert.equal(values[i], got[i]) end
  end))

  it("carries empty strings, NUL bytes, CR LF and numbers as arguments", with.client(function(c)
    assert.same({ "", "\0", "\r\n", "$3\r\nabc", "42", "0.5", n = 6 },
      c:call("EVAL", "return ARGV", 0, "", "\0", "\r\n", "$3\r\nabc", 42, 0.5))
  end))
end)

describe("core.script", function()
  local SCRIPT = "return {KEYS, ARGV}"

  local function list(prefix, n)
    local t = {}
    for i = 1, n do t[i] = prefix .. i end
    return t
  end

  it("sends the same request for its arguments as a list and as values", with.client(function(c)
    for _, counts in ipairs({ { 0, 0 }, { 1, 0 }, { 0, 1 }, { 6, 7 }, { 20, 20 }, { 3, 200 } }) do
      local keys, args = list("k", counts[1]), list("a", counts[2])
      local as_list = core.script(c, "EVAL", SCRIPT, keys, args)
      local as_values = core.script(c, "EVAL", SCRIPT, keys, table.unpack(args))
      assert.same(as_list, as_values)
      assert.equal(counts[1], as_list[1].n)
      assert.equal(counts[2], as_list[2].n)
      for i = 1, counts[1] do assert.equal("k" .. i, as_list[1][i]) end
      for i = 1, counts[2] do assert.equal("a" .. i, as_list[2][i]) end
    end
  end))

  it("writes numbers given as values as call does", with.client(function(c)
    local r = core.script(c, "EVAL", SCRIPT, {}, 42, 3.0, 0.1, 1 / 3, -7)
    assert.same({ "42", "3", "0.1", "0.33333333333333331", "-7", n = 5 }, r[2])
  end))

  it("refuses an argument that is not a string or a number, sending nothing", with.client(function(c)
    local ok, err = pcall(core.script, c, "EVAL", SCRIPT, {}, "a", true)
    assert.is_false(ok)
    assert.matches("string or number expected, got boolean", err, 1, true)
    assert.equal(0, c:pending())
    assert.equal("PONG", c:call("PING"))      -- the connection is intact
  end))
end)

describe("core.hex", function()
  it("writes each byte as two lower-case hexadecimal digits", function()
    assert.equal("", core.hex(""))
    assert.equal("0001ff7f80", core.hex("\0\1\255\127\128"))
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    local expected = {}
    for i = 0, 255 do expected[#expected + 1] = string.format("%02x", i) end
    assert.equal(table.concat(expected), core.hex(table.concat(all)))
  end)
end)
