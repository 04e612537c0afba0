-- async_mutex.redis: the client against a real redis-server started for this
-- file (docs/redis.md).

local uv = require "luv"
local redis_server = require "redis_server"
local am = require "async_mutex"

local h, redis, server, client, with = redis_server.spec_file(setup, teardown)

describe("redis.connect", function()
  it("connects over TCP and over a unix socket", h.async(function()
    local tcp, unix = client(), client({ path = server.path })
    assert.equal("PONG", tcp:call("PING"))
    assert.equal("PONG", unix:call("PING"))
    tcp:close(); unix:close()
  end))

  it("resolves a host name with luv's getaddrinfo", h.async(function()
    local c = client({ host = "localhost" })
    assert.equal("PONG", c:call("PING"))
    c:close()
  end))

  it("resumes nothing when the coroutine is closed while the name resolves", function()
    local errors = {}
    local prev = am.setErrorHandler(function(err) errors[#errors + 1] = tostring(err) end)
    local co = coroutine.create(function() client({ host = "localhost" }) end)
    assert.is_true(coroutine.resume(co))
    local waited = coroutine.status(co) == "suspended"
    assert.is_true(coroutine.close(co))
    local ended = h.run_loop(1000)       -- getaddrinfo's callback comes
    am.setErrorHandler(prev)
    assert.is_true(waited)
    assert.is_true(ended)
    assert.same({}, errors)
  end)

  it("raises E_UNAVAILABLE for a host name that does not resolve", function()
    local ok, err = pcall(redis.connect, { host = "no-such-host.invalid" })
    assert.is_false(ok)
    assert.equal(redis.E_UNAVAILABLE, err)
    h.run(function()                           -- in a coroutine: asynchronously
      ok, err = pcall(redis.connect, { host = "no-such-host.invalid" })
    end)
    assert.is_false(ok)
    assert.equal(redis.E_UNAVAILABLE, err)
  end)

  it("refuses bad options with argument errors", function()
    assert.equal("bad argument #1 to 'connect' (table expected, got boolean)",
      h.error_of(function() redis.connect(true) end))
    assert.equal("bad argument #1 to 'connect' (port must be an integer from 1 to 65535)",
      h.error_of(function() redis.connect({ port = 0 }) end))
    assert.equal("bad argument #1 to 'connect' (host must be a string, got number)",
      h.error_of(function() redis.connect({ host = 1 }) end))
    assert.equal("bad argument #1 to 'connect' (path must be a string, got boolean)",
      h.error_of(function() redis.connect({ path = true }) end))
  end)

  -- docs/redis.md, Connection: TCP keepalive, seen as the kernel shows it
  -- (Linux /proc/net/tcp: an established socket whose keepalive timer
  -- runs has timer kind 2), for this process's sockets to the server.
  local function own_sockets()
    local inodes = {}
    local dir = assert(uv.fs_scandir("/proc/self/fd"))
    for name in function() return uv.fs_scandir_next(dir) end do
      local inode = (uv.fs_readlink("/proc/self/fd/" .. name) or ""):match("^socket:%[(%d+)%]$")
      if inode then inodes[inode] = true end
    end
    return inodes
  end

  local function connections_to(port)
    local own, found = own_sockets(), {}
    for line in io.lines("/proc/net/tcp") do
      local rport, st, timer, inode = line:match(
        "^%s*%d+: %x+:%x+ %x+:(%x+) (%x+) %x+:%x+ (%x+):%x+ %x+%s+%d+%s+%d+%s+(%d+)")
      if rport and tonumber(rport, 16) == port and st == "01" and own[inode] then
        found[inode] = tonumber(timer, 16)
      end
    end
    return found
  end

  it("turns TCP keepalive on for its connections, the subscriber's too", h.async(function()
    local before = connections_to(server.port)
    local c = client()
    assert.equal("PONG", c:call("PING"))
    local s = c:subscribe("spec40-keepalive", function() end)
    local new
    for _ = 1, 100 do               -- a timer of another kind may run a moment
      new = {}
      for inode, timer in pairs(connections_to(server.port)) do
        if not before[inode] then new[#new + 1] = timer end
      end
      if #new == 2 and new[1] == 2 and new[2] == 2 then break end
      h.sleep(20)
    end
    s:unsubscribe()
    c:close()
    assert.same({ 2, 2 }, new)
  end))

  it("keeps no active handle while idle, so uv.run() returns", function()
    local c
    h.run(function()
      c = client()
      assert.equal("OK", c:call("SET", "idle", "1"))
    end)
    assert.same({}, h.active_handles())
    assert.is_true(h.run_loop(1000))
    c:close()
  end)
end)

describe("client:call", function()
  it("returns every reply type as a Lua value", with.client(function(c)
    assert.equal("OK", c:call("SET", "s", "value"))
    assert.equal("value", c:call("GET", "s"))
    assert.is_nil(c:call("GET", "missing"))
    assert.equal(1, c:call("INCR", "i"))
    assert.equal("integer", math.type(c:call("INCR", "i")))
    local t = c:call("MGET", "s", "missing", "s")
    assert.same({ "value", nil, "value", n = 3 }, t)
    assert.same({ n = 0 }, c:call("LRANGE", "nothing", 0, -1))
  end))

  it("writes integers without .0 and floats exactly", with.client(function(c)
    assert.equal("OK", c:call("SET", "n", 42))
    assert.equal("42", c:call("GET", "n"))
    assert.equal("OK", c:call("SET", "n", 3.0))
    assert.equal("3", c:call("GET", "n"))
    assert.equal("OK", c:call("SET", "n", 0.1))
    assert.equal(0.1, tonumber(c:call("GET", "n")))
    -- docs/api.md: 15 digits, or 17 when 15 do not read back; inf as Redis reads it
    assert.equal("OK", c:call("SET", "n", 1 / 3))
    assert.equal("0.33333333333333331", c:call("GET", "n"))
    assert.equal(1 / 3, tonumber(c:call("GET", "n")))
    assert.equal("OK", c:call("SET", "n", -math.huge))
    assert.equal("-inf", c:call("GET", "n"))
    assert.equal(1, c:call("ZADD", "z", math.huge, "top"))
    assert.equal("inf", c:call("ZSCORE", "z", "top"))
  end))

  it("shares its one connection: another coroutine's command joins a MULTI (docs/api.md)",
    with.client(function(c)
      c:call("DEL", "tx:count", "tx:other")
      local in_multi, joined = am.Semaphore.new(0), am.Semaphore.new(0)
      local reply
      h.spawn(function()
        in_multi:acquire()
        reply = c:call("SET", "tx:other", "1")    -- between the MULTI and the EXEC
        joined:release()
      end)
      assert.equal("OK", c:call("MULTI"))
      assert.equal("QUEUED", c:call("INCR", "tx:count"))
      in_multi:release()
      joined:acquire()
      assert.equal("QUEUED", reply)
      assert.equal("OK", c:call("DISCARD"))
      assert.is_nil(c:call("GET", "tx:other"))    -- dropped with the transaction
    end))

  it("is binary safe (NUL bytes, 10 MB values)", with.client(function(c)
    local nul = "a\0b\0\r\n"
    assert.equal("OK", c:call("SET", "bin\0key", nul))
    assert.equal(nul, c:call("GET", "bin\0key"))
    local big = ("0123456789"):rep(1024 * 1024)
    assert.equal("OK", c:call("SET", "big", big))
    assert.equal(big, c:call("GET", "big"))
  end))

  it("raises an error reply as an async_mutex.redis.Error with its code", with.client(function(c)
    c:call("SET", "str", "x")
    local ok, err = pcall(c.call, c, "LPUSH", "str", "y")
    assert.is_false(ok)
    assert.equal("async_mutex.redis.Error", getmetatable(err).__name)
    assert.equal("WRONGTYPE", err.code)
    assert.equal("WRONGTYPE Operation against a key holding the wrong kind of value",
      err.message)
    assert.equal(err.message, tostring(err))
    ok, err = pcall(c.call, c, "NOSUCHCOMMAND")
    assert.is_false(ok)
    assert.equal("ERR", err.code)
    assert.matches("^ERR unknown command", err.message)
    assert.equal("PONG", c:call("PING"))     -- the connection goes on
  end))

  it("answers 100,000 calls from 1,000 coroutines on one connection, each its own",
    with.client(function(c)
      local n = h.load(1000)                  -- 1,000 (fewer when slowed down)
      local per = h.load(100000) // n
      local done, wrong = 0, 0
      for i = 1, n do
        h.spawn(function()
          for j = 1, per do
            local v = ("%d:%d"):format(i, j)
            if c:call("ECHO", v) ~= v then wrong = wrong + 1 end
          end
          done = done + 1
        end)
      end
      h.wait_until(function() return done == n end, 60000)
      assert.equal(0, wrong)
      assert.equal(0, c:pending())
    end, { deadline = 120000 }))

  it("raises E_UNAVAILABLE at once when the connection is refused", h.async(function()
    -- no timeout to wait for: only the refusal itself can end the call
    local port = redis_server.free_port()
    local c = redis.connect({ port = port, connectTimeout = math.huge,
                              commandTimeout = math.huge })
    local ok, err = pcall(c.call, c, "PING")
    assert.is_false(ok)
    assert.equal(redis.E_UNAVAILABLE, err)
    assert.equal(am.E_UNAVAILABLE, err)
    assert.equal("redis server unavailable: connection refused to 127.0.0.1:" .. port,
      tostring(err))
    assert.equal(0, c:pending())               -- nothing was queued
    c:close()
  end))

  it("closes a coroutine that dies after it was resumed with a reply or an error: "
    .. "its <close> releasers run (docs/api.md, Conventions)", h.async(function()
    local c = client()
    local m = am.Mutex.new()
    local reported = {}
    h.with_handler(function(err) reported[#reported + 1] = tostring(err) end, function()
      am.spawn(function()
        local release <close> = m:acquire()
        c:call("PING")                        -- resumed with the reply
        error("after the reply", 0)
      end)
      h.wait_until(function() return #reported == 1 end)
      assert.is_false(m:isLocked())
      local blocked = client({ commandTimeout = math.huge })
      am.spawn(function()
        local release <close> = m:acquire()
        blocked:call("BLPOP", "spec40:nothing", 0)   -- resumed by close()
      end)
      h.tick()
      assert.is_true(m:isLocked())
      blocked:close()                          -- E_UNAVAILABLE escapes it
      h.wait_until(function() return #reported == 2 end)
      assert.is_false(m:isLocked())
    end)
    assert.same({ "after the reply", "redis server unavailable: client closed" }, reported)
    c:close()
  end))

  it("discards the reply of a coroutine closed while waiting", with.client(function(c)
    local co = h.spawn(function() c:call("SET", "closed", "1") end)
    assert.equal("suspended", coroutine.status(co))
    assert.is_true(coroutine.close(co))
    assert.equal("next", c:call("ECHO", "next"))
  end))

  it("refuses bad input with errors at the caller", h.async(function()
    local c = client()
    assert.equal("bad argument #2 to 'call' (string or number expected, got table)",
      h.error_of(function() c:call("SET", {}) end))
    assert.equal("bad argument #1 to 'call' (string or number expected, got no value)",
      h.error_of(function() c:call() end))
    assert.equal("bad argument #3 to 'call' (number must not be NaN)",
      h.error_of(function() c:call("SET", "k", 0 / 0) end))
    assert.equal(0, c:pending())
    c:close()
    local ok, err = pcall(c.call, c, "PING")
    assert.is_false(ok)
    assert.matches("attempt to use a closed redis client", err)
  end))

  it("raises outside a coroutine", function()
    local c = redis.connect({ port = server.port })
    assert.equal("attempt to call redis outside a coroutine",
      h.error_of(function() c:call("PING") end))
    c:close()
  end)
end)

describe("client:eval", function()
  it("runs a script with keys and args, by EVALSHA once it is known", with.client(function(c)
    local script = "return {KEYS[1], ARGV[1], ARGV[2]}"
    assert.same({ "k", "a", "42", n = 3 }, c:eval(script, { "k" }, { "a", 42 }))
    local before = c:call("INFO", "commandstats")
    assert.same({ "k", "b", "1", n = 3 }, c:eval(script, { "k" }, { "b", 1 }))
    local after = c:call("INFO", "commandstats")
    local function calls(info, cmd)
      return tonumber(info:match("cmdstat_" .. cmd .. ":calls=(%d+)") or 0)
    end
    assert.equal(calls(before, "evalsha") + 1, calls(after, "evalsha"))
  end))

  it("falls back to EVAL when the server forgot the script (NOSCRIPT)", with.client(function(c)
    local script = "return 'flushed ' .. ARGV[1]"
    assert.equal("flushed 1", c:eval(script, {}, { 1 }))
    assert.equal("OK", c:call("SCRIPT", "FLUSH"))
    assert.equal("flushed 2", c:eval(script, nil, { 2 }))
  end))

  -- docs/redis.md, Scripts: the SHA1s of the user's scripts are remembered
  -- in a bounded cache (the 128 most recently used at least, 256 at most);
  -- the module's own scripts stay.
  local function calls(info, cmd)
    return tonumber(info:match("cmdstat_" .. cmd .. ":calls=(%d+)") or 0)
  end

  it("keeps memory bounded however many distinct scripts it runs", with.client(function(c)
    local pad = "-- " .. ("x"):rep(8 * 1024) .. "\n"
    local n = math.max(600, h.load(1200))
    local function script(i) return pad .. "return " .. i end
    h.gc()
    local before = collectgarbage("count")
    for i = 1, n do
      assert.equal(i, c:eval(script(i)))
      if i % 300 == 0 then assert.equal("OK", c:call("SCRIPT", "FLUSH")) end
    end
    h.gc()
    local grown = collectgarbage("count") - before        -- KB
    -- unbounded: n scripts of 8 KB kept (at least 4.8 MB); bounded: 256
    assert.is_true(grown < 256 * 9 + 512, ("memory grew by %.0f KB"):format(grown))
    -- the first ones were forgotten, and still run (EVAL, SCRIPT LOAD)
    assert.equal(1, c:eval(script(1)))
    assert.equal("OK", c:call("SCRIPT", "FLUSH"))
  end, { deadline = 20000 }))

  it("runs a recent script by EVALSHA after many others, and recovers from SCRIPT FLUSH", with.client(function(c)
    local mine = "return 'mine ' .. ARGV[1]"
    assert.equal("mine 0", c:eval(mine, nil, { 0 }))
    for i = 1, 300 do
      c:eval("return " .. i)
      if i % 100 == 0 then assert.equal("mine " .. i, c:eval(mine, nil, { i })) end
    end
    local before = c:call("INFO", "commandstats")
    assert.equal("mine x", c:eval(mine, nil, { "x" }))
    local after = c:call("INFO", "commandstats")
    assert.equal(calls(before, "evalsha") + 1, calls(after, "evalsha"))
    assert.equal(calls(before, "eval"), calls(after, "eval"))
    assert.equal("OK", c:call("SCRIPT", "FLUSH"))
    assert.equal("mine y", c:eval(mine, nil, { "y" }))  -- NOSCRIPT, then EVAL
    assert.equal("mine z", c:eval(mine, nil, { "z" }))
  end))

  it("keeps the Redis locks' scripts by EVALSHA however many user scripts ran", with.client(function(c)
    local m = am.RedisMutex.new(c, "spec40-pinned")
    m:acquire()()                                   -- the lock's scripts loaded
    for i = 1, 300 do c:eval("return " .. i) end
    local before = c:call("INFO", "commandstats")
    m:acquire()()
    local after = c:call("INFO", "commandstats")
    assert.equal(calls(before, "eval"), calls(after, "eval"))
    assert.is_true(calls(after, "evalsha") > calls(before, "evalsha"))
    assert.equal("OK", c:call("SCRIPT", "FLUSH"))  -- forgotten by the server
    m:acquire()()
    assert.is_false(m:isLocked())
  end))

  it("raises script errors as Errors", with.client(function(c)
    local ok, err = pcall(c.eval, c, "return redis.call('NOPE')")
    assert.is_false(ok)
    assert.equal("async_mutex.redis.Error", getmetatable(err).__name)
    assert.equal("ERR", err.code)
    ok, err = pcall(c.eval, c, "return redis.error_reply('MINE went wrong')")
    assert.is_false(ok)
    assert.equal("MINE", err.code)
  end))

  it("refuses bad input", with.client(function(c)
    assert.equal("bad argument #1 to 'eval' (string expected, got nil)",
      h.error_of(function() c:eval() end))
    assert.equal("bad argument #2 to 'eval' (table of keys expected, got string)",
      h.error_of(function() c:eval("return 1", "k") end))
    assert.equal("bad argument #3 to 'eval' (args[2] must be a string or number, got table)",
      h.error_of(function() c:eval("return 1", {}, { 1, {} }) end))
    assert.equal("bad argument #1 to 'eval' (async_mutex.redis.Client expected, got table)",
      h.error_of(function() c.eval({}, "return 1") end))
  end))
end)

describe("client:close", function()
  it("raises E_UNAVAILABLE in every call in flight", h.async(function()
    local c = client()
    c:call("PING")
    local errs = {}
    for i = 1, 10 do
      h.spawn(function()
        local ok, err = pcall(c.call, c, "BLPOP", "never", 0)
        errs[i] = not ok and err
      end)
    end
    assert.equal(10, c:pending())
    c:close()
    for i = 1, 10 do assert.equal(redis.E_UNAVAILABLE, errs[i]) end
    c:close()                                  -- twice is harmless
  end))

  it("lets an unreferenced client be collected, closing its connection", function()
    local c
    h.run(function()
      c = client()
      c:call("PING")
    end)
    local weak = setmetatable({ c }, { __mode = "v" })
    c = nil
    h.gc()
    assert.is_nil(weak[1])
    assert.same({}, h.active_handles())
    -- the poll handle's close completes in the loop: a luv handle whose
    -- close is still pending at exit is freed before its close callback
    assert.is_true(h.run_loop(1000))
    assert.equal(0, h.count_handles("uv_poll_t"))
  end)

  -- A coroutine that connects, calls and closes holds the client in a
  -- local only, and the client holds the coroutine in its FIFO only: both
  -- were garbage while the call waited, a collection ended them, and the
  -- rest of the coroutine never ran (spec 83's child lost its holder so,
  -- depending on when the collector stepped).
  it("keeps a client referred to only by its waiting callers until their replies", h.async(function()
    local weak = setmetatable({}, { __mode = "v" })
    local got = {}
    do
      local c = client()
      weak.client = c
      for i = 1, 2 do
        am.spawn(function()
          -- (BLPOP on a missing key answers nil after its timeout)
          got[i] = c:call("BLPOP", "spec40:never", "0.2") == nil and "nil" or "?"
          if i == 2 then c:close() end
        end)
      end
    end
    h.sleep(50)                                 -- both calls wait for their replies
    h.gc()
    assert.is_not_nil(weak.client)
    h.wait_until(function() return got[2] ~= nil end, 5000, "the replies")
    assert.same({ "nil", "nil" }, got)
    h.gc()
    assert.is_nil(weak.client)                  -- and collectable once they came
  end))

  it("lets a client go once its last waiting call failed", h.async(function()
    local weak = setmetatable({}, { __mode = "v" })
    local err
    do
      local c = client()
      weak.client = c
      am.spawn(function()
        local ok, e = pcall(c.call, c, "BLPOP", "spec40:never", "0.2")
        err = not ok and e
      end)
      h.sleep(50)
      c:close()                                 -- the caller raises E_UNAVAILABLE
    end
    assert.equal(redis.E_UNAVAILABLE, err)
    h.gc()
    assert.is_nil(weak.client)
  end))
end)
