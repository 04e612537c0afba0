-- The re-entrancy fuzzer of the Redis client (docs/redis.md, "Re-entry"):
-- random sequences of calls, evals, subscriptions, publishes and closes on
-- a few clients of a fake server (spec/fake_redis.lua, in this process)
-- that misbehaves at random (replies late, split, cut; a connection
-- closed, stalled, answered with garbage; a SUBSCRIBE refused; bursts of
-- messages), during which finalizers (of garbage made at random moments,
-- under collector pressure) and debug hooks ("c" hooks, in the callers and
-- in the main thread, where the client's luv callbacks run)
-- call the client back from inside its own calls: close a client, call,
-- subscribe, unsubscribe, resume a waiting caller from outside (a stray
-- resume), close a waiting caller's coroutine, drop a client.  The checks
-- are what docs/redis.md promises whatever runs in between:
--   - every call ends exactly once: with its own reply (each ECHO carries a
--     token of its own: a reply paired with another call is caught), an
--     E_UNAVAILABLE, an error reply the server sent (WRONGPASS, NOPERM),
--     or "attempt to use a closed redis client" once its client is closed;
--   - a stray resume of a waiting caller returns true and nothing else, and
--     the caller goes on waiting;
--   - a subscription's function is never called after it ended;
--   - once every client is closed and the server stopped, uv.run()
--     returns, every caller has ended, no handle is left active;
--   - and (in a child process, by the driver or spec 106) no crash, and
--     under `make asan` no sanitizer report.
--
--   lua5.4 spec/fuzz/redis_reentrancy.lua run [FIRST [COUNT [progress]]]
--   lua5.4 spec/fuzz/redis_reentrancy.lua fuzz N [J [SEED]]   (`make fuzz`)
--
-- `run` prints "OK n sequences n ops n re-entrant calls" (exit 0) or a
-- FAILURE report naming the seed (exit 1); AM_REENTRY_TRACE=1 prints the
-- failing sequence's trace.  A sequence may depend on the ones before it
-- (the collector's state, garbage left): replay from the same first seed.
-- Timing
-- (the server's timers, the kernel) may differ between runs: a replay may
-- take another path.

local uv = require "luv"

local paths = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/paths.lua")
local root = paths.lua(debug.getinfo(1, "S").source)
paths.build_unless_chosen(root)

local am = require "async_mutex"
local redis = require "async_mutex.redis"
local fake = require "fake_redis"

local R = {}

local rng = require("fuzz.driver").park_miller

local CLOSED = "attempt to use a closed redis client"
-- Bounds of one sequence: hooks that fire at every call would otherwise
-- spawn callers for ever (each reply resumes code that the hooks see).
local MAX_ACTORS, MAX_REENTRIES = 60, 300
local SERVER_ERRORS = { WRONGPASS = true, NOPERM = true }
local CHANNELS = { "a", "b", "c" }

-- One sequence of 'nops' steps for 'seed'.  Returns nil, or the first
-- violation (a string); and the number of steps and re-entrant calls.
function R.run_sequence(seed, nops)
  local rnd = rng(seed)
  local srnd = rng(seed * 31 + 7)          -- the server's own draws
  debug.sethook()
  collectgarbage("incremental", 200, 100, 13)
  collectgarbage("collect")
  collectgarbage("collect")
  local bad
  local reentries, depth = 0, 0
  -- The trace (AM_REENTRY_TRACE=1) is made alike whether printed or not,
  -- so that printing it changes neither the collector's work nor the draws
  -- of `rnd`: a traced replay takes the same path (the kernel and the
  -- server's timers allowing).
  local TRACE = os.getenv("AM_REENTRY_TRACE") == "1"
  local trace = {}
  local function log(...)
    depth = depth + 10
    trace[#trace + 1] = table.concat({ ... }, " ")
    depth = depth - 10
  end
  local function violation(msg)
    bad = bad or ("seed %d: %s"):format(seed, msg)
    log("VIOLATION", msg)
  end
  local reported = {}
  local prev_handler = am.setErrorHandler(function(err, tb)
    -- (a channel refused when it is subscribed again is reported so)
    if not tostring(tb):find("^subscription to channel '%a' refused") then
      reported[#reported + 1] = tostring(err)
    end
  end)

  -- {------------------------------------------------------ the server
  -- Replies in order per connection; a connection "holding" queues them
  -- for a timer; a stalled one answers nothing more.
  local function send(conn, out)
    if conn.closed or conn.stalled or not out then return end
    if conn.held then
      conn.held[#conn.held + 1] = out
      return
    end
    local n = srnd(20)
    if n == 1 then                          -- hold this and what follows
      conn.held = { out }
      local t = uv.new_timer()
      t:start(srnd(5) - 1, 0, function()
        t:close()
        local held = conn.held
        conn.held = nil
        if not conn.closed then conn:write(table.concat(held)) end
      end)
    elseif n == 2 and #out > 1 then         -- split in two writes
      local cut = srnd(#out - 1)
      conn:write(out:sub(1, cut))
      conn:write(out:sub(cut + 1))
    else
      conn:write(out)
    end
  end
  local srv
  srv = fake.start(function(conn, cmd)
    local name = (cmd[1] or ""):upper()
    local n = srnd(100)
    if n <= 2 then conn:close() return nil
    elseif n == 3 then conn:write("?garbage\r\n") conn.stalled = true return nil
    elseif n == 4 then conn.stalled = true return nil
    end
    local out
    if name == "AUTH" then
      out = srnd(8) == 1 and "-WRONGPASS invalid username-password pair\r\n" or "+OK\r\n"
    elseif name == "SUBSCRIBE" then
      if srnd(8) == 1 then
        out = "-NOPERM this user has no permissions to access one of the channels\r\n"
      else
        conn.channels = conn.channels or {}
        local parts = {}
        for i = 2, #cmd do
          conn.channels[cmd[i]] = true
          parts[#parts + 1] = fake.array({ "subscribe", cmd[i], i - 1 })
          if srnd(4) == 1 then                -- a burst on it
            for k = 1, srnd(300) do parts[#parts + 1] = fake.message(cmd[i], "b" .. k) end
          end
        end
        out = table.concat(parts)
      end
    elseif name == "UNSUBSCRIBE" then
      local parts = {}
      for i = 2, #cmd do
        if conn.channels then conn.channels[cmd[i]] = nil end
        parts[#parts + 1] = fake.array({ "unsubscribe", cmd[i], 0 })
      end
      out = table.concat(parts)
    elseif name == "PUBLISH" then
      local count = 0
      for other in pairs(srv.conns) do
        if other.channels and other.channels[cmd[2]] and not other.closed then
          count = count + 1
          send(other, fake.message(cmd[2], cmd[3] or ""))
        end
      end
      out = (":%d\r\n"):format(count)
    elseif name == "EVALSHA" then out = "-NOSCRIPT No matching script\r\n"
    elseif name == "EVAL" then out = ":1\r\n"
    elseif name == "SCRIPT" then out = fake.bulk("0123456789abcdef")
    else out = fake.reply(srv, cmd) end   -- (through send: in order)
    send(conn, out)
    return nil
  end)
  -- }------------------------------------------------------

  local clients, actors, subs = {}, {}, {}
  local tokens = 0

  local function new_client()
    local opts = { port = srv.port, connectTimeout = 300,
                   commandTimeout = ({ 30, 100, 1000 })[rnd(3)],
                   reconnectDelay = rnd(2) == 1 and 0 or 5, reconnectDelayMax = 20,
                   pingInterval = ({ 20, 15000 })[rnd(2)] }
    if rnd(4) == 1 then opts.password = "pw" end
    if rnd(4) == 1 then opts.db = 1 end
    local c = { obj = redis.connect(opts), closed = false }
    depth = depth + 10
    clients[#clients + 1] = c
    depth = depth - 10
    log("client", #clients, tostring(c.obj))
    return c
  end

  local reentrant                         -- forward: a random call back

  -- A hook for the running coroutine (nil: the main thread, where the
  -- client's luv callbacks run): a "c" hook, calling back at random at
  -- function calls (of the client's Lua layer and C part, of luv, of the
  -- caller).  Not a count hook: the Lua layer does not promise to hold at
  -- every VM instruction, only at calls and allocations (docs/redis.md,
  -- "Re-entry").
  local function hook(co)
    local n = rnd(2)
    local function f()
      if rnd(4) == 1 then reentrant("hook") end
    end
    if n == 1 then
      if co then debug.sethook(co, f, "c") else debug.sethook(f, "c") end
    elseif co then debug.sethook(co) else debug.sethook() end
  end

  -- A new actor: a coroutine that calls, evals, publishes or subscribes
  -- once, started now.
  local function spawn()
    local c = clients[rnd(#clients)]
    if not c or #actors >= MAX_ACTORS then return end
    local what = rnd(8)
    local a = { outcomes = 0, client = c }
    tokens = tokens + 1
    local token = ("t%d"):format(tokens)
    local channel = CHANNELS[rnd(#CHANNELS)]
    log("spawn", what, token, tostring(c.obj))
    local function outcome(ok, res, expected)
      log("outcome", a.what, tostring(ok), tostring(res))
      a.outcomes = a.outcomes + 1
      if a.outcomes > 1 then violation(a.what .. " ended twice") end
      if ok then
        if expected ~= nil and res ~= expected then
          violation(("%s returned %s, not %s"):format(a.what, tostring(res), tostring(expected)))
        end
      elseif res == redis.E_UNAVAILABLE then
        if type(res.reason) ~= "string" and res.reason ~= nil then
          violation(a.what .. ": an E_UNAVAILABLE with a reason that is no string")
        end
      elseif res == CLOSED then
        if not c.closed then violation(a.what .. ": closed error on an open client") end
      elseif not (type(res) == "table" and SERVER_ERRORS[res.code]) then
        violation(("%s raised %s"):format(a.what, tostring(res)))
      end
    end
    a.co = coroutine.create(function()
      if rnd(3) == 1 then hook(coroutine.running()) end
      local cl = c.obj
      if what <= 4 then
        a.what = "ECHO " .. token
        local ok, res = pcall(cl.call, cl, "ECHO", token)
        outcome(ok, res, token)
      elseif what == 5 then
        a.what = "eval " .. token
        local ok, res = pcall(cl.eval, cl, "return 1", { "k" }, { token })
        outcome(ok, res, 1)
      elseif what == 6 then
        a.what = "PUBLISH " .. channel .. " " .. token
        local ok, res = pcall(cl.call, cl, "PUBLISH", channel, token)
        outcome(ok, res, nil)
      else
        a.what = "subscribe " .. channel .. " " .. token
        a.settles = true
        local s = { ended = false }
        local ok, res = pcall(cl.subscribe, cl, channel, function()
          if s.ended then violation("a message for an ended subscription") end
        end)
        if ok then
          s.obj = res
          depth = depth + 10
          subs[#subs + 1] = s
          depth = depth - 10
        end
        outcome(ok, res, nil)
      end
    end)
    -- listed only once started (a call back between create and resume
    -- would otherwise find it fresh, not waiting)
    local ok, err = coroutine.resume(a.co)
    depth = depth + 10
    actors[#actors + 1] = a
    depth = depth - 10
    if not ok then violation("actor at spawn: " .. tostring(err)) end
  end

  -- Resumes a waiting actor from outside: it must go on waiting.
  -- (no call back while it looks: a finalizer at one of its allocations
  -- could end the actor between the look and the resume)
  local function stray()
    depth = depth + 10
    local a = actors[rnd(#actors + 1)]
    if a and not a.closed and coroutine.status(a.co) == "suspended" then
      log("stray", a.what)
      local res = table.pack(coroutine.resume(a.co, "stray", rnd(9)))
      if not (res.n == 1 and res[1] == true) then
        violation(("a stray resume of %s returned %s, %s"):format(a.what, tostring(res[1]),
          tostring(res[2])))
      elseif coroutine.status(a.co) ~= "suspended" and not a.settles then
        -- (a call's reply is delivered in one step of C; a subscription's
        -- confirmation is settled first, then resumed: a hook between the
        -- two may resume it first, and it goes on with its outcome)
        violation("a stray resume ended the wait of " .. a.what)
      end
    end
    depth = depth - 10
  end

  local function unsubscribe()
    local s = subs[rnd(#subs + 1)]
    if s and not s.ended then
      s.ended = true
      s.obj:unsubscribe()
    end
  end

  local function close_client()
    local c = clients[rnd(#clients + 1)]
    if c and not c.closed then
      log("close", tostring(c.obj))
      c.closed = true
      c.obj:close()
    end
  end

  -- One call back into the client, from a finalizer or a hook.
  function reentrant(from)
    if depth > 1 or bad or reentries >= MAX_REENTRIES then return end
    depth = depth + 1
    reentries = reentries + 1
    local ok, err = pcall(function()
      local n = rnd(10)
      log("reentrant", from, n)
      if n <= 2 then spawn()
      elseif n == 3 then close_client()
      elseif n == 4 then unsubscribe()
      elseif n <= 6 then stray()
      elseif n == 7 then
        local a = actors[rnd(#actors + 1)]
        if a and not a.closed and coroutine.status(a.co) == "suspended" then
          log("coroutine.close", a.what)
          a.closed = true
          coroutine.close(a.co)
        end
      elseif n == 8 then
        local c = clients[rnd(#clients + 1)]
        if c then
          local _, _ = c.obj:pending(), tostring(c.obj)
        end
      elseif n == 9 then collectgarbage("step", rnd(4) - 1)
      elseif #clients < 4 then new_client() end
    end)
    depth = depth - 1
    if not ok then violation(from .. ": " .. tostring(err)) end
  end

  -- Garbage whose finalizers call back, and a collector step or setting.
  local function garbage()
    for _ = 1, rnd(4) do
      setmetatable({}, { __gc = function() reentrant("finalizer") end })
    end
    local n = rnd(4)
    if n == 1 then collectgarbage("step", rnd(4) - 1)
    elseif n == 2 then collectgarbage("incremental", rnd(3) * 5, 100 + rnd(4) * 100)
    elseif n == 3 then collectgarbage("generational") end
  end

  for _ = 1, rnd(3) do new_client() end
  local steps = 0
  for _ = 1, nops do
    if bad then break end
    steps = steps + 1
    local n = rnd(12)
    log("step", steps, n)
    local ok, err = pcall(function()
      if n <= 4 then spawn()
      elseif n <= 7 then
        if rnd(3) == 1 then uv.sleep(rnd(3) - 1) end
        if rnd(3) == 1 then
          -- one turn that waits, at most a few ms (the server listens: a
          -- turn with nothing to do would wait for ever)
          local t = uv.new_timer()
          t:start(rnd(4) - 1, 0, function() t:close() end)
          uv.run("once")
        else
          uv.run("nowait")
        end
      elseif n == 8 then garbage()
      elseif n == 9 then hook(nil)
      elseif n == 10 then unsubscribe()
      elseif n == 11 then
        if rnd(4) == 1 then close_client() else stray() end
      else reentrant("step") end
    end)
    if not ok then violation("step: " .. tostring(err)) end
  end

  -- The end: no more calls back; every client closed, the server stopped,
  -- the loop run to its end (bounded: a loop that does not return fails).
  debug.sethook()
  depth = 99
  collectgarbage("generational")
  local ok, err = pcall(function()
    for _, s in ipairs(subs) do
      if not s.ended then s.ended = true; s.obj:unsubscribe() end
    end
    for _, c in ipairs(clients) do
      if not c.closed then c.closed = true; c.obj:close() end
    end
    srv:stop()
    local stopped = false
    uv.update_time()          -- (the loop's clock may be seconds behind)
    local guard = uv.new_timer()
    guard:start(5000, 0, function()
      stopped = true
      uv.stop()
    end)
    guard:unref()
    uv.run()
    guard:close()
    uv.run("nowait")
    if stopped then
      local left = {}
      uv.walk(function(hd)
        if hd ~= guard and hd:has_ref() and (hd:is_active() or hd:is_closing()) then
          local due = tostring(hd):match("^uv_timer") and (" due in %d ms"):format(hd:get_due_in()) or ""
          left[#left + 1] = tostring(hd) .. (hd:is_closing() and " (closing)" or "") .. due
        end
      end)
      violation("uv.run() did not return within 5 s: " .. table.concat(left, ", "))
    end
  end)
  if not ok then violation("clean-up: " .. tostring(err)) end
  require("fuzz.driver").check_end(actors, violation, function(a)
    return ("%s (%s)"):format(tostring(a.what), coroutine.status(a.co))
  end)
  if #reported > 0 then violation("reported: " .. reported[1]) end
  am.setErrorHandler(prev_handler)
  if TRACE and bad then require("fuzz.driver").print_trace(trace) end
  return bad, steps, reentries
end

require("fuzz.driver").reentry_script(arg, "redis_reentrancy", root, R.run_sequence)

return R
