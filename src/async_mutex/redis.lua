--- async_mutex.redis: a Redis client on luv's loop, driven by hiredis.
-- The C part (async_mutex.redis_core) owns the connection, the FIFO of
-- waiting coroutines and the yield and resume of `call`; this layer
-- resolves host names with luv, gives the C part its luv poll handles
-- (through luv's Lua API), and composes calls into `eval`.
-- See docs/redis.md.

-- The C part is built only where hiredis is installed (README, "Install
-- with luarocks"): without it, this says so rather than "module not found".
local found, core = pcall(require, "async_mutex.redis_core")
if not found then
  local why = tostring(core)
  if why:find("module 'async_mutex.redis_core' not found", 1, true) then
    why = "not installed"
  end
  error("async_mutex.redis needs its C part, async_mutex.redis_core, built only where"
    .. " hiredis is installed (Debian: libhiredis-dev): install hiredis, then reinstall"
    .. " async-mutex (async_mutex.redis_core: " .. why .. ")", 2)
end
local uv = require "luv"
local am_spawn, sleep_ms = require("async_mutex").spawn, require("async_mutex").sleep

local error, getmetatable, ipairs, pairs, pcall, rawget, setmetatable, tostring, type =
  error, getmetatable, ipairs, pairs, pcall, rawget, setmetatable, tostring, type
local running, isyieldable = coroutine.running, coroutine.isyieldable
local mtype, unpack, traceback = math.type, table.unpack, debug.traceback
local next = next

local M = {
  E_UNAVAILABLE = core.E_UNAVAILABLE,
}

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local typeerror = checks.typeerror
local typename, is_callable, argerror, unknown_option, check_open =
  checks.typename, checks.is_callable, checks.argerror, checks.unknown_option, checks.check_open

local Client = core.Client               -- the methods of every client


-- {========================================================== hooks
-- What the C part calls (docs/redis.md): the luv poll handle of each
-- connection (made, started, stopped and closed through luv's Lua API; its
-- callback is a C function of the C part) and the client's timer; the
-- back-off between connection attempts; the messages of a subscriber; the
-- report of an error escaping a coroutine it resumed.  `state` is the
-- client's table (its C user value); `conn` a connection's table (made by
-- the C part: poll, dead, and the callbacks on_event and on_closed).
-- Callbacks hold the client through the weak state.ref, so that an
-- unreferenced client can be collected (its __gc ends the connection).

local hooks = core.hooks
-- The fields of a client's state that hold its subscribers (pub/sub,
-- below): classic channels, and shard channels (SSUBSCRIBE).
local SUBSCRIBERS = { "sub", "ssub" }
local status, fail, alive, progress = core.status, core.fail, core.alive, core.progress
local error_text = core.error_text       -- an error object's text, never raising
local unavailable = hooks.unavailable    -- an E_UNAVAILABLE that says why
local is_unavailable = require("async_mutex.unavailable").is
local WEAK_K = { __mode = "k" }
local ceil, max, min, random, huge = math.ceil, math.max, math.min, math.random, math.huge
-- The client's clock (ms, monotonic): when replies came (progress), when
-- a timer was armed, when the back-off ends.  The C part's, which reads
-- it for every batch of replies at the cost of a system clock read (luv's
-- uv.now, a registry lookup through luv's context, cost more than the
-- rest of a reply's handling); luv's timers only schedule the checks.
local now = core.now

-- Sentinel (below): what the hooks ask of a client that follows a master.
local sentinel_attempt, sentinel_lost, sentinel_wait

-- close_handle(h): closes a luv handle, safely even when the script ends
-- before the loop runs again (docs/redis.md, "Closing and exiting").  A
-- handle whose close is still pending at lua_close is freed by luv's
-- finalizer while libuv still queues it, and luv's own loop finalizer then
-- runs its close callback on freed memory (a segfault).  So each pending
-- close is anchored by a guard object, newer than the handle: at lua_close
-- finalizers run newest first, and a guard still pending runs the loop
-- once (uv.run "nowait"), which completes every pending close before any
-- handle is finalized.  Guards are referenced until their close completes,
-- so no ordinary collection ever runs that finalizer.
-- At lua_close a guard made then gets no finalizer (Lua registers none
-- once lua_close has begun), and a client whose finalizer was already due
-- (collected by a cycle that had not finished) runs first and closes its
-- handles then.  So a spare guard, the newest of all, is made after each
-- handle of a client (fresh_guard): still referenced (as `spare`) when it
-- is finalized, which only lua_close does, it completes those closes
-- before luv finalizes the handles (spec 71).
local pending = {}
local spare
local GUARD = { __gc = function(guard)
  if pending[guard] or (guard == spare and next(pending)) then
    pending = {}
    uv.run("nowait")
  end
end }
local function fresh_guard() spare = setmetatable({}, GUARD) end

-- `after` (optional) runs once the close is complete; at once if luv has
-- finalized the handle already, or someone else is closing it.  A handle
-- this closes already is left to that close (and its `after`).
local ours = setmetatable({}, WEAK_K)     -- handles closed here

local function close_handle(h, after)
  if ours[h] then return end
  if not alive(h) or h:is_closing() then
    if after then after() end
    return
  end
  ours[h] = true
  local guard = setmetatable({}, GUARD)
  pending[guard] = true
  h:close(function()
    pending[guard] = nil
    if after then after() end
  end)
end

-- RE-ENTRY: a debug hook may run at any instruction of this file, and a
-- finalizer at any allocation, and close the client: the timers are read
-- once into locals (luv's timer methods accept a closing timer; a field
-- read again may be nil by then), through these.
local function stop_timer(t)
  if t and alive(t) then t:stop() end
end
local function start_timer(t, ms, fn)
  if t and alive(t) then t:start(ms, 0, fn) end
end

-- An error escaped a coroutine resumed by this module: it goes to the
-- handler set with async_mutex.setErrorHandler, as the locks' do.
function hooks.report(err, tb)
  local am = package.loaded.async_mutex
  local handler
  if type(am) == "table" and am.setErrorHandler then
    handler = am.setErrorHandler(nil)
    am.setErrorHandler(handler)
  end
  if handler then
    local ok, herr = pcall(handler, err, tb)
    if ok then return end
    tb = tb .. "\nand in the error handler: " .. error_text(herr)
  end
  io.stderr:write("async_mutex.redis: error in a resumed coroutine: ", tb, "\n")
end
local report = hooks.report

-- Resumes co if it is suspended (core.wake: the look and the resume are
-- one step of C, which a hook cannot come between); an error escaping it
-- is reported, after co is closed so that its pending to-be-closed
-- variables (releasers) run, as for every coroutine the module resumes
-- (docs/api.md, Conventions).
local wake = core.wake

-- Whether calls wait for replies (a subscriber: also confirmations and
-- its health check's PING, state.awaits).
local function busy(state, client)
  return client:pending() > 0 or (state.awaits ~= nil and state.awaits())
end

-- A number of ms as the reasons write it: whole, or as %g.
local function ms_text(ms)
  return ms == ms // 1 and ("%d"):format(ms) or ("%g"):format(ms)
end

-- The timer: while connecting, fails the attempt after connectTimeout;
-- while calls wait, fails the connection when no reply came for
-- commandTimeout ms (then every waiting call raises E_UNAVAILABLE).
local function on_timer(state)
  local client = state.ref[1]
  if not client then return end
  local st, t = status(client), now()
  local limit, since
  if st == "connecting" then
    limit, since = state.connectTimeout, state.armed_at
  elseif st == "connected" and busy(state, client) then
    limit, since = state.commandTimeout, max(state.armed_at, progress(client))
  else
    state.timing = false
    return
  end
  if limit == huge then
    state.timing = false
  elseif t - since >= limit then
    state.timing = false
    fail(client, st == "connecting"
      and ("no connection to %s within %s ms"):format(state.addr, ms_text(limit))
      or ("no reply from %s within %s ms"):format(state.addr, ms_text(limit)))
  else                         -- (no timer: a finalizer closed the client)
    start_timer(state.timer, ceil(limit - (t - since)), state.on_timer)
  end
end

local function arm(state, connecting)
  local limit = connecting and state.connectTimeout or state.commandTimeout
  if limit == huge then
    stop_timer(state.timer)
    state.timing = false
    return
  end
  -- RE-ENTRY: the allocations here may run a finalizer that closes this
  -- client (a subscriber dropped by its client's, see ping_tick): a timer
  -- made meanwhile is closed, none is started
  -- (and a timer made meanwhile, by a hook that armed it, is kept: the
  -- look and the store have no call between them)
  if not state.timer then
    local t = uv.new_timer()
    fresh_guard()
    if not state.on_timer then state.on_timer = function() on_timer(state) end end
    local client = state.ref and state.ref[1]
    local closed = not client or status(client) == "closed"
    if closed or state.timer then close_handle(t) else state.timer = t end
    if closed then return end
    if state.background then t:unref() end
  end
  uv.update_time()    -- luv's timers count from the loop's clock: as of now
  state.armed_at = now()
  local client = state.ref and state.ref[1]
  if not client or status(client) == "closed" then return end
  state.timing = true
  start_timer(state.timer, ceil(limit), state.on_timer)
end

-- A wait (a confirmation, a pong) about to begin on a connection that
-- awaits nothing: its commandTimeout counts from now.  The timer may run
-- on from an earlier wait (it stops once a batch of replies is handled),
-- and the time since that wait's last reply is no part of this one.
-- (client:call does the same in C: progress.)
local function wait_begins(state, client)
  if state.timing and not busy(state, client) then state.armed_at = now() end
end

-- open(state, conn, fd): the poll handle of a new connection, on fd (the
-- socket, or on Linux the epoll set that holds it), made by luv (so that
-- uv.walk and luv's exit handle it as any other); true, or nil and luv's
-- error.  Looked up in `uv` at each call.  RE-ENTRY: a finalizer at the
-- handle's allocation may end this connection: hooks.lost then leaves the
-- fds to this function (conn.opening), which closes the handle, if made,
-- and the fds after it; a connection ended before it starts is not
-- touched (its fds are closed: a number that may be another file's now).
function hooks.open(state, conn, fd)
  if conn.dead then return nil, "closed" end
  conn.opening = true
  local p, err, name = uv.new_poll(fd)
  if p then fresh_guard() end
  conn.opening = false
  if p then conn.poll = p end
  if conn.dead then
    if p then close_handle(p, conn.on_closed) else conn.on_closed() end
    return nil, "closed"
  end
  if not p then return nil, name or err end
  -- a background connection (the watch on the sentinels' +switch-master)
  -- never keeps uv.run() from returning
  if state.background then p:unref() end
  return true
end

-- progress(state): replies came to a subscriber, which stays readable when
-- idle: its timer stops once no confirmation is awaited.
function hooks.progress(state)
  if state.timing and not busy(state, state.ref[1]) then
    -- (busy() runs Lua: a finalizer there may have closed the client, and
    -- its timer with it)
    if state.timing then stop_timer(state.timer) end
    state.timing = false
  end
end

-- watch(state, conn, connecting, events, active): what the poll handle
-- now watches ("r", "w", "rw"; nil: nothing), and whether anything is
-- awaited (the connect, replies, a subscriber's messages, output).  The
-- handle keeps watching a connection while it is idle (an end of file is
-- seen at once), but only an active one keeps the loop running: it is
-- unref'd when idle, and ref'd again at the next call, which starts
-- nothing and makes no system call (docs/redis.md, Connection).  The
-- timer runs while something is awaited (the connect, or replies).
function hooks.watch(state, conn, connecting, events, active)
  local p = conn and conn.poll
  if p then
    -- RE-ENTRY: a finalizer or a debug hook may end this connection at
    -- any moment, also inside luv's start (it refs the callback, an
    -- allocation, before it starts the handle).  While conn.busy (a count:
    -- such a hook may call the client, and so this function, again for
    -- the same handle), hooks.lost leaves the handle to this function,
    -- whose outermost call closes it once luv is done with it: libuv
    -- asserts that a handle it starts or stops is not closing.
    conn.busy = (conn.busy or 0) + 1
    if not conn.dead and events ~= conn.events then
      if events then p:start(events, conn.on_event) else p:stop() end
      conn.events = events
    end
    -- (a background connection, the watch on the sentinels'
    -- +switch-master, never keeps the loop running: unref'd at its open)
    if not conn.dead and not state.background then
      if active then p:ref() else p:unref() end
    end
    conn.busy = conn.busy - 1
    if conn.dead and conn.busy == 0 then close_handle(p, conn.on_closed) end
  end
  if active then
    if not state.timing then
      local client = state.ref[1]
      if connecting or busy(state, client) then arm(state, connecting) end
    end
  elseif state.timing then
    stop_timer(state.timer)
    state.timing = false
  end
end

-- stale(conn): the handle's callback found no client for this connection
-- (the client was collected and its finalizer, which closes the handle,
-- has not run yet; or the connection is no longer its client's).  Idle,
-- the handle watches on: an end of file nobody reads would wake the loop
-- at every iteration, so it stops watching (the finalizer, or hooks.lost,
-- closes it).  RE-ENTRY: as in hooks.watch, conn.busy keeps a finalizer
-- or a debug hook from closing the handle under luv's stop.
function hooks.stale(conn)
  local p = conn.poll
  if not p or conn.dead or not conn.events then return end
  conn.busy = (conn.busy or 0) + 1
  if not conn.dead and conn.events then
    p:stop()
    conn.events = nil
  end
  conn.busy = conn.busy - 1
  if conn.dead and conn.busy == 0 then close_handle(p, conn.on_closed) end
end

function hooks.connected(state)
  state.failures = 0
  state.next_attempt = 0
  if busy(state, state.ref[1]) then arm(state, false)
  elseif state.timing then
    stop_timer(state.timer)
    state.timing = false
  end
  if state.on_connected then state.on_connected() end
end

-- lost(state, conn, was_connected, final, err): the connection ended
-- (conn: its table, nil if the attempt failed before there was one; final: "close" or "gc" when
-- the client itself ends; err: what its callers raise).  A connection
-- that had been established may be retried at once; a failed attempt
-- delays the next one: capped exponential back-off, with jitter (half to
-- all of it), and calls meanwhile raise E_UNAVAILABLE with err's reason.
function hooks.lost(state, conn, was_connected, final, err)
  if conn then
    -- the fds the handle watched are closed once its close is complete
    -- (conn.on_closed; docs/redis.md, "Closing and exiting")
    conn.dead = true
    -- (while busy, hooks.watch closes them; while opening, hooks.open)
    if not conn.busy or conn.busy == 0 then
      if conn.poll then
        close_handle(conn.poll, conn.on_closed)
      elseif not conn.opening then
        conn.on_closed()
      end
    end
  end
  local timer = state.timer
  if timer then
    state.timing = false
    stop_timer(timer)
    if final then
      state.timer = nil
      close_handle(timer)
    end
  end
  if was_connected then
    state.failures = 0
    state.next_attempt = 0
  elseif not final then
    local f = (state.failures or 0) + 1
    state.failures = f
    local delay = min(state.reconnectDelayMax, state.reconnectDelay * 2 ^ (f - 1))
    state.next_attempt = now() + delay * (0.5 + 0.5 * random())
    state.failure = type(err) == "table" and rawget(err, "reason") or error_text(err)
  end
  local sentinel = state.sentinel
  if sentinel then sentinel_lost(sentinel, state, final) end
  if state.on_lost then state.on_lost(was_connected, final, err) end
  for _, field in ipairs(SUBSCRIBERS) do
    local sub = state[field]
    if final and sub and not sub.closed then
      if final == "gc" then core.drop(sub.client) else sub.client:close() end
    end
  end
  -- close(): the Redis locks of this client end their holds and wake their
  -- waiters (docs/redis-locks.md, "Closing the client"); a finalizer
  -- resumes nobody, so "gc" tells them nothing (they are garbage too)
  if final == "close" and state.on_close then state.on_close() end
end

-- attempt(state, canwait): nil when a new connection may be tried now;
-- else why not (the last attempt's failure, and when the next one may
-- come); or, for a client that follows a master through Sentinel while
-- it is being found, a record for a caller that can wait (canwait: the C
-- part's call then waits for record.done and tries again).
function hooks.attempt(state, canwait)
  local wait = (state.next_attempt or 0) - now()
  if wait > 0 then
    return ("%s (next attempt in %d ms)"):format(state.failure or "no connection", ceil(wait))
  end
  local sentinel = state.sentinel
  if sentinel then return sentinel_attempt(sentinel, state, canwait) end
  return nil
end

function hooks.message(state, reply)
  if state.on_message then state.on_message(reply) end
end

-- }==========================================================


-- {========================================================== connect

-- The numeric address of `host`: at once when it is one already; else
-- by luv's asynchronous getaddrinfo when called in a coroutine (which
-- waits: a stray resume of it goes on waiting), or its synchronous form
-- outside one.  IPv4 is preferred.  nil and luv's error when it does not
-- resolve.
local function resolve(host)
  local hints = { socktype = "stream", numerichost = true }
  local res, err, name = uv.getaddrinfo(host, nil, hints)
  if not res then
    hints.numerichost = nil
    local co, main = running()
    if main or not isyieldable() then
      res, err, name = uv.getaddrinfo(host, nil, hints)
    else
      local rec = { done = false }
      uv.getaddrinfo(host, nil, hints, function(e, r)
        res, name, rec.done = r, e, true
        -- (a coroutine closed meanwhile is dead: nothing to resume)
        wake(co)
      end)
      core.wait(rec)
    end
  end
  if type(res) ~= "table" or not res[1] then return nil, name or err end
  for _, a in ipairs(res) do
    if a.family == "inet" then return a.addr end
  end
  return res[1].addr
end


-- {========================================================== Sentinel
-- A client made with `sentinels` and `master` follows that master
-- (docs/redis.md, "Sentinel").  Its state, and those of its subscriber
-- and siblings, share one record S: the sentinels (addresses, and a
-- client of each, made when first asked), the master's name, the master
-- found (S.master: host, port, addr; nil while unknown), the coroutines
-- waiting for it, and the back-off of failed searches.  A search asks the
-- sentinels in turn (`SENTINEL get-master-addr-by-name`), starting with
-- the one that answered last, and confirms the answer with `ROLE` on a
-- connection of its own: a server that says it is a replica is not used.
-- It is made again after any loss of a connection to the master, on
-- `+switch-master` (heard on a sentinel, below) and on a READONLY answer.

local concat = table.concat
local PASSES = 3          -- a search asks every sentinel up to this often

-- The reason an error gives (an E_UNAVAILABLE's, or an error reply's text).
local function reason_of(err)
  return type(err) == "table" and rawget(err, "reason") or error_text(err)
end

-- A client of sentinel i (made once, reused: idle, it keeps no loop running).
local function sentinel_client(S, i)
  local sen = S.sentinels[i]
  local c = sen.client
  if c and status(c) ~= "closed" then return c end
  local st = {}
  for k, v in pairs(S.timing) do st[k] = v end
  st.host, st.port, st.addr, st.setup = sen.host, sen.port, sen.addr, S.sentinel_setup
  st.background_sub = true    -- its +switch-master watch keeps no loop
  st.sub = false
  c = core.new(st)
  sen.client = c
  return c
end

-- The role of the server at host:port (ROLE's first element), or nil and
-- why not; asked on a connection of its own, closed after.
local function role_of(S, host, port, addr)
  local st = {}
  for k, v in pairs(S.timing) do st[k] = v end
  st.host, st.port, st.addr, st.setup, st.sub = host, port, addr, S.setup, false
  local c = core.new(st)
  local ok, reply = pcall(Client.call, c, "ROLE")
  c:close()
  if not ok then return nil, reason_of(reply) end
  if type(reply) ~= "table" or type(reply[1]) ~= "string" then
    return nil, "no role in its answer to ROLE"
  end
  return reply[1]
end

local function addr_text(host, port)
  return (host:find(":", 1, true) and "[%s]:%d" or "%s:%d"):format(host, port)
end

-- One pass over the sentinels: the master confirmed, or nil and why not.
local function search_once(S)
  local n = #S.sentinels
  local down, unknown, notes, tried = {}, 0, {}, {}
  for k = 0, n - 1 do
    local i = (S.first + k - 1) % n + 1
    local sen = S.sentinels[i]
    local ok, reply = pcall(Client.call, sentinel_client(S, i),
      "SENTINEL", "get-master-addr-by-name", S.name)
    if S.closed then return nil, "client closed" end
    if not ok then
      -- (the sentinel's own back-off is the search's pacing: not said)
      down[#down + 1] = ("%s (%s)"):format(sen.addr,
        (reason_of(reply):gsub(" %(next attempt in %d+ ms%)$", "")))
    elseif reply == nil then
      unknown = unknown + 1
    elseif type(reply) == "table" and type(reply[1]) == "string" and reply[2] then
      local port = math.tointeger(tonumber(reply[2]))
      local host = resolve(reply[1])
      local addr = port and addr_text(reply[1], port)
      if not (host and port) then
        notes[#notes + 1] = ("sentinel %s named %s:%s, which does not resolve"):format(
          sen.addr, reply[1], tostring(reply[2]))
      elseif not tried[addr] then
        tried[addr] = true
        local role, why = role_of(S, host, port, addr)
        if S.closed then return nil, "client closed" end
        if role == "master" then
          S.first = i
          return { host = host, port = port, addr = addr, sentinel = i }
        end
        notes[#notes + 1] = role and ("master %s at %s says it is a %s"):format(S.name, addr, role)
          or ("master %s at %s: %s"):format(S.name, addr, why)
      end
    end
  end
  if #down == n then return nil, "no sentinel reachable: " .. concat(down, ", ") end
  if #notes == 0 then return nil, ("master %s unknown to the sentinels"):format(S.name) end
  return nil, concat(notes, "; ")
end

local watch_switches

-- The search, in a coroutine of its own (S.searching while it runs): up
-- to PASSES passes, with the client's back-off delays between them; then
-- the waiting callers are woken (they try again: the master found is
-- connected to, else they raise the reason, with the next attempt's time).
local function search(S)
  -- The search's coroutine, held by S while it runs: when it waits on
  -- role_of's connection, which nothing else refers to, that client and
  -- this coroutine would otherwise be garbage together, and a collection
  -- would end the search with its callers left waiting (docs/redis.md,
  -- "Sentinel")
  S.searching = running()
  local master, why
  for pass = 1, PASSES do
    local ok
    ok, master, why = pcall(search_once, S)
    if not ok then master, why = nil, "search failed: " .. error_text(master) end
    if master or S.closed or pass == PASSES then break end
    sleep_ms(min(S.timing.reconnectDelayMax, S.timing.reconnectDelay * 2 ^ (pass - 1)))
    if S.closed then break end
  end
  S.searching = false
  if S.closed then master, why = nil, "client closed" end
  if master then
    S.master, S.failures, S.next_attempt = master, 0, 0
  else
    local f = (S.failures or 0) + 1
    S.failures, S.failure = f, why
    local delay = min(S.timing.reconnectDelayMax, S.timing.reconnectDelay * 2 ^ (f - 1))
    S.next_attempt = now() + delay * (0.5 + 0.5 * random())
  end
  local waiting = S.waiting
  S.waiting = {}
  local err = not master and unavailable(why) or nil
  for _, rec in ipairs(waiting) do
    rec.done, rec.err = true, err
    wake(rec.co)
  end
  if master and not S.closed then watch_switches(S, master.sentinel) end
end

local function start_search(S)
  if S.searching or S.closed then return end
  S.searching = true        -- (then the search's coroutine: see search)
  am_spawn(search, S)
end

-- hooks.attempt for a client that follows a master: connect to the
-- master found; else start a search, and let a caller that can wait do so.
function sentinel_attempt(S, state, canwait)
  if S.closed then return "client closed" end
  local m = S.master
  if m then
    S.followers[state] = true
    state.host, state.port, state.addr = m.host, m.port, m.addr
    return nil
  end
  local wait = (S.next_attempt or 0) - now()
  if wait > 0 then
    return ("%s (next attempt in %d ms)"):format(S.failure, ceil(wait))
  end
  if canwait then
    local rec = { co = running(), done = false }
    S.waiting[#S.waiting + 1] = rec
    start_search(S)
    return rec
  end
  -- (a subscriber's SUBSCRIBE, sent by core.send, cannot wait: it is
  -- sent again after its back-off)
  start_search(S)
  state.failure = ("master %s being found by the sentinels"):format(S.name)
  state.next_attempt = now() + max(1, state.reconnectDelay)
  return state.failure
end

-- Waits (in a coroutine) until a search for the master ends.
function sentinel_wait(S)
  if S.closed or S.master or (S.next_attempt or 0) > now() then return end
  local rec = { co = running(), done = false }
  S.waiting[#S.waiting + 1] = rec
  start_search(S)
  core.wait(rec)
  if rec.err then error(rec.err, 0) end
end

-- Ends what S holds (the client that made it was closed or collected):
-- its sentinels' clients and their watch; waiting callers are woken (they
-- find their client closed).
local function sentinel_close(S, final)
  if S.closed then return end
  S.closed = true
  S.master = nil
  for _, sen in ipairs(S.sentinels) do
    local c = sen.client
    if c then
      if final == "gc" then core.drop(c) else c:close() end
    end
  end
  local waiting = S.waiting
  S.waiting = {}
  if final ~= "gc" then
    for _, rec in ipairs(waiting) do
      rec.done = true
      wake(rec.co)
    end
  end
end

-- hooks.lost for a client that follows a master: a lost connection to the
-- master found means it is looked for again before the next one.
function sentinel_lost(S, state, final)
  if final then
    if state.owns_sentinel then sentinel_close(S, final) end
    return
  end
  local m = S.master
  if m and state.host == m.host and state.port == m.port then S.master = nil end
end

-- Ends every connection of the clients that follow S to the master
-- they use (their callers raise E_UNAVAILABLE with `why`), which is then
-- looked for again.
local function drop_master(S, why)
  S.master = nil
  -- (a copy: fail resumes callers, whose new connections add followers)
  local clients = {}
  for state in pairs(S.followers) do
    clients[#clients + 1] = state.ref and state.ref[1]
  end
  for _, client in ipairs(clients) do
    local st = status(client)
    if st == "connected" or st == "connecting" then fail(client, why) end
  end
end

-- +switch-master "NAME old-ip old-port new-ip new-port", heard on one
-- sentinel (a failover ended): the clients drop the old master.
local function on_switch(S, message)
  local name, _, _, host, port = message:match("^(%S+) (%S+) (%S+) (%S+) (%S+)$")
  if name ~= S.name or S.closed then return end
  drop_master(S, ("master %s switched to %s:%s"):format(name, host, port))
end

-- Subscribes to +switch-master on sentinel i (the one that answered),
-- unless a watch on another is connected.  Its connection keeps no loop
-- running (background): a client nobody uses lets uv.run() return.
function watch_switches(S, i)
  local w = S.watch
  if w then
    -- (w.sub: nil while its subscribe waits for the confirmation)
    if w.index == i or not w.sub or status(w.sub.sub.client) == "connected" then return end
    S.watch = nil
    w.sub:unsubscribe()
  end
  w = { index = i }
  S.watch = w
  local ok, sub = pcall(Client.subscribe, sentinel_client(S, i), "+switch-master",
    function(message) on_switch(S, message) end)
  if ok and S.watch == w and not S.closed then w.sub = sub
  else
    if ok then sub:unsubscribe() end
    if S.watch == w then S.watch = nil end
  end
end

-- READONLY from a client that follows a master: the server was demoted
-- (a failover); its connections are ended, the master looked for again,
-- and the caller raises E_UNAVAILABLE with that reason.  Any other
-- client raises the error reply as it is.
function hooks.readonly(state, _, err)
  local S = state.sentinel
  if not S then return err end
  local why = ("master %s at %s answered READONLY: a replica now"):format(S.name, state.addr)
  drop_master(S, why)
  return unavailable(why)
end

-- }==========================================================


local DEFAULTS = {
  connectTimeout = 2000, commandTimeout = 5000,
  reconnectDelay = 50, reconnectDelayMax = 2000, pingInterval = 15000,
}

-- Every option connect knows: a misspelt one (`commandTimout`) is an
-- error, not a default silently kept.
local OPTIONS = {
  host = true, port = true, path = true, password = true, username = true, db = true,
  sentinels = true, master = true, sentinelPassword = true, sentinelUsername = true,
}
local SENTINEL_FIELDS = { host = true, port = true }

-- A port as connect takes it (a whole float too), or nil.
local function port_of(port)
  -- (a whole float is taken: 6379.0 // 1 is still a float)
  if mtype(port) == "float" then port = math.tointeger(port) or port end
  if mtype(port) ~= "integer" or port < 1 or port > 65535 then return nil end
  return port
end

-- The sentinels and master of connect's options, checked (Sentinel,
-- above): the record S their clients share, or nil without them.
local function sentinel_options(options, state)
  local list, name = options.sentinels, options.master
  local spass, suser = options.sentinelPassword, options.sentinelUsername
  for _, k in ipairs({ "sentinelPassword", "sentinelUsername" }) do
    if options[k] ~= nil and type(options[k]) ~= "string" then
      argerror(1, "connect", ("%s must be a string, got %s"):format(k, typename(options[k])))
    end
  end
  if list == nil and name == nil then
    if spass or suser then
      argerror(1, "connect", (spass and "sentinelPassword" or "sentinelUsername")
        .. " needs sentinels")
    end
    return nil
  end
  if list == nil then argerror(1, "connect", "master needs sentinels") end
  if name == nil then argerror(1, "connect", "sentinels needs master") end
  if options.host ~= nil or options.port ~= nil or options.path ~= nil then
    -- the sentinels name the master: a fixed address would contradict them
    argerror(1, "connect", "sentinels excludes host, port and path")
  end
  if type(name) ~= "string" or name == "" then
    argerror(1, "connect", "master must be a non-empty string")
  end
  if suser and not spass then
    argerror(1, "connect", "sentinelUsername needs a sentinelPassword")
  end
  if type(list) ~= "table" or getmetatable(list) ~= nil or #list == 0 then
    argerror(1, "connect", "sentinels must be a non-empty list of {host =, port =}")
  end
  local sentinels = {}
  for i = 1, #list do
    local e = list[i]
    if type(e) ~= "table" then
      argerror(1, "connect", ("sentinels[%d] must be a table {host =, port =}, got %s"):format(
        i, typename(e)))
    end
    local unknown = unknown_option(e, SENTINEL_FIELDS)
    if unknown then argerror(1, "connect", ("sentinels[%d]: %s"):format(i, unknown)) end
    if type(e.host) ~= "string" then
      argerror(1, "connect", ("sentinels[%d].host must be a string, got %s"):format(
        i, typename(e.host)))
    end
    local port = port_of(e.port)
    if not port then
      argerror(1, "connect", ("sentinels[%d].port must be an integer from 1 to 65535"):format(i))
    end
    sentinels[i] = { name = e.host, port = port, addr = addr_text(e.host, port) }
  end
  -- the names resolved last: every usage error comes before any lookup
  for _, sen in ipairs(sentinels) do
    local addr, err = resolve(sen.name)
    if not addr then
      error(unavailable(("name not resolved: %s (%s)"):format(sen.name, tostring(err or "?"))), 0)
    end
    sen.host = addr
  end
  local timing = {}
  for k in pairs(DEFAULTS) do timing[k] = state[k] end
  local ssetup = {}
  if spass then
    ssetup[1] = suser and { "AUTH", suser, spass } or { "AUTH", spass }
  end
  return {
    name = name, sentinels = sentinels, first = 1, timing = timing,
    setup = state.setup, sentinel_setup = ssetup,
    master = nil, searching = false, waiting = {}, failures = 0, next_attempt = 0,
    followers = setmetatable({}, WEAK_K), closed = false,
  }
end
for name in pairs(DEFAULTS) do OPTIONS[name] = true end

-- The timeouts must be positive: 0 would fail every connection or every
-- call at once (a user meaning "no timeout" writes math.huge).  The
-- back-off delays may be 0 (retry at once), but must be finite: an
-- infinite one would end every attempt to reconnect after one failure.
local POSITIVE = { connectTimeout = "no timeout", commandTimeout = "no timeout",
  pingInterval = "no ping" }

-- A finite value must fit a luv timer once rounded up to whole ms: above
-- 2^40 ms (about 34 years, the cap of the locks' ttl) it is refused here,
-- at the caller's line, not deep in a timer's start at the first call.
local MAX_MS = 2 ^ 40

local function check_ms(options, name)
  local v = options[name]
  if v == nil then return DEFAULTS[name] end
  if POSITIVE[name] then
    if type(v) ~= "number" or not (v > 0) then
      argerror(1, "connect", ("%s must be a positive number (math.huge: %s)"):format(
        name, POSITIVE[name]))
    elseif v > MAX_MS and v ~= huge then
      argerror(1, "connect", ("%s must be at most 2^40 (math.huge: %s)"):format(
        name, POSITIVE[name]))
    end
  elseif type(v) ~= "number" or not (v >= 0) or v == huge then
    argerror(1, "connect", name .. " must be a non-negative finite number")
  elseif v > MAX_MS then
    argerror(1, "connect", name .. " must be at most 2^40")
  end
  return v
end

local function check_string(options, name)
  local v = options[name]
  if v ~= nil and type(v) ~= "string" then
    argerror(1, "connect", ("%s must be a string, got %s"):format(name, typename(v)))
  end
  return v
end

--- Creates a client for the server at `options.host`/`options.port` or
-- at the unix socket `options.path` (no options: 127.0.0.1:6379).
-- Connects at the first call.
function M.connect(options)
  if options == nil then options = {} end     -- every option has a default
  if type(options) ~= "table" then
    typeerror(1, "connect", "table", options)
  end
  -- a Redis Cluster (docs/redis.md, "Cluster"): a tail call, so that its
  -- argument errors are raised at connect's caller's line
  if options.cluster ~= nil then return require("async_mutex.redis_cluster").connect(M, options) end
  local unknown = unknown_option(options, OPTIONS)
  if unknown then argerror(1, "connect", unknown) end
  local state = {}
  for name in pairs(DEFAULTS) do state[name] = check_ms(options, name) end
  local password = check_string(options, "password")
  local username = check_string(options, "username")
  if username and not password then
    argerror(1, "connect", "username needs a password")
  end
  local db = options.db
  if db ~= nil and (mtype(db) ~= "integer" or db < 0) then
    argerror(1, "connect", "db must be a non-negative integer")
  end
  -- sent first on every connection (docs/redis.md, Connection)
  local setup = {}
  if password then
    setup[#setup + 1] = username and { "AUTH", username, password } or { "AUTH", password }
  end
  if db and db ~= 0 then setup[#setup + 1] = { "SELECT", tostring(db) } end
  state.setup = setup
  state.sub = false         -- its subscriber, made by the first subscribe
  state.ssub = false        -- its shard channels' subscriber (ssubscribe)
  local sentinel = sentinel_options(options, state)
  if sentinel then
    -- the address is the master's, found at the first call
    state.sentinel, state.owns_sentinel = sentinel, true
    state.addr = ("master %s"):format(sentinel.name)
    return core.new(state)
  end
  local path = check_string(options, "path")
  local host, port
  if path ~= nil and (options.host ~= nil or options.port ~= nil) then
    -- one address: which of the two the user meant cannot be guessed
    argerror(1, "connect", "path excludes host and port")
  end
  if path == nil then
    host, port = options.host, options.port
    if host == nil then host = "127.0.0.1" end
    if port == nil then port = 6379 end
    if type(host) ~= "string" then
      argerror(1, "connect", "host must be a string, got " .. typename(host))
    end
    port = port_of(port)
    if not port then
      argerror(1, "connect", "port must be an integer from 1 to 65535")
    end
  end
  if path then
    state.path = path
    state.addr = path
  else
    local addr, err = resolve(host)
    if not addr then
      error(unavailable(("name not resolved: %s (%s)"):format(host, tostring(err or "?"))), 0)
    end
    state.host, state.port = addr, port
    -- as the reasons of E_UNAVAILABLE name it: the name the user gave
    state.addr = (addr:find(":", 1, true) and "[%s]:%d" or "%s:%d"):format(host, port)
  end
  return core.new(state)               -- sets state.ref (weak)
end

-- }==========================================================


-- {========================================================== pub/sub
-- Subscriptions live on a second connection of the client, opened by the
-- first subscribe and shared by all (docs/redis.md, Pub/sub).  Its
-- state: sub.client (a core client in subscriber mode), sub.channels
-- (channel -> list of Subscriptions), sub.waiting (channel -> coroutines
-- waiting for the server's confirmation), sub.sent (the channels of each
-- SUBSCRIBE sent and not answered yet, oldest first: the server answers
-- each channel with its confirmation, in order, or the whole command with
-- one error).  After a lost connection the confirmed channels are
-- subscribed again, with the client's back-off.

local Subscription = { __name = "async_mutex.redis.Subscription" }

-- The two kinds of channel, each on a subscriber connection of its own:
-- classic ones (SUBSCRIBE, a PUBLISH reaches every node of a cluster) and
-- shard channels (SSUBSCRIBE, Redis 7: a SPUBLISH stays on the shard of
-- the channel's slot, and a node that loses the slot ends its
-- subscriptions with a "sunsubscribe" of its own).
local CLASSIC = { field = "sub", sub = "SUBSCRIBE", unsub = "UNSUBSCRIBE",
  message = "message", confirm = "subscribe", fname = "subscribe" }
local SHARDED = { field = "ssub", sub = "SSUBSCRIBE", unsub = "SUNSUBSCRIBE",
  message = "smessage", confirm = "ssubscribe", fname = "ssubscribe" }
Subscription.__index = Subscription

local is_client do
  local mt = getmetatable(core.new({}))
  is_client = function(v) return getmetatable(v) == mt end
end

local function check_client(self, fname)
  if not is_client(self) then
    typeerror(1, fname, "async_mutex.redis.Client", self)
  end
end


-- Settles a list of waits for a confirmation: each waiter's record gets
-- the outcome (ok, err), then its coroutine is resumed if it waits
-- (in core.wait, which looks at the record: a stray resume finds it
-- unsettled and goes on waiting; a wait settled while its coroutine was
-- not suspended, by a hook or finalizer in it, does not begin).
local function settle(list, ok, err)
  for _, rec in ipairs(list) do
    if not rec.done then
      rec.done, rec.ok, rec.err = true, ok, err
      wake(rec.co)
    end
  end
end

-- The waits for `channel`'s confirmation, settled.
local function confirm(sub, channel, ok, err)
  local list = sub.waiting[channel]
  if not list then return end
  sub.waiting[channel] = nil
  settle(list, ok, err)
end

-- A subscriber left with no channel stops reading (and pinging): an
-- idle one keeps no loop running.
local function stop_if_none(sub)
  if not next(sub.channels) and not sub.closed then
    core.listen(sub.client, false)
    stop_timer(sub.ping)
  end
end

-- The server refused a SUBSCRIBE (an error reply, such as NOPERM from an
-- ACL): its channels' subscriptions end, the coroutines waiting for them
-- raise that error, and one with nobody waiting (subscribed again after a
-- lost connection) is reported to the error handler.  The connection and
-- the other channels go on.
local function refused(sub, list, err)
  for _, channel in ipairs(list) do
    local subs = sub.channels[channel]
    if subs then
      sub.channels[channel] = nil
      for _, s in ipairs(subs) do s.active = false end
      if sub.waiting[channel] then
        confirm(sub, channel, false, err)
      else
        report(err, traceback(("subscription to channel '%s' refused: %s"):format(
          channel, error_text(err))))
      end
    end
  end
  stop_if_none(sub)
end

local function channel_list(sub)
  local list = {}
  for channel in pairs(sub.channels) do list[#list + 1] = channel end
  table.sort(list)
  return list
end

-- Subscribes again to every channel (after a lost connection), now or
-- when the back-off allows; tries again while it fails.
local function restore(sub)
  if sub.closed or sub.scheduled or not next(sub.channels) then return end
  local state = sub.state
  local delay = ceil(max(0, (state.next_attempt or 0) - now()))
  sub.scheduled = true
  if not sub.retry then
    -- (a hook or finalizer at that call may have closed the subscriber, or
    -- made its timer: the look and the store have no call between them)
    local t = uv.new_timer()
    fresh_guard()
    if sub.closed or sub.retry then
      close_handle(t)
      if sub.closed then return end
    else
      sub.retry = t
      if state.background then t:unref() end
    end
  end
  if not sub.on_retry then
    sub.on_retry = function()
      sub.scheduled = false
      if sub.closed or not next(sub.channels) then return end
      if status(sub.client) ~= "idle" then return end
      -- one SUBSCRIBE a channel: a server that now refuses one (an ACL
      -- changed meanwhile) answers that command with an error, and only that
      -- channel's subscriptions end
      for _, channel in ipairs(channel_list(sub)) do
        if not core.send(sub.client, sub.kind.sub, channel) then
          restore(sub)
          return
        end
        if sub.closed then return end
        sub.sent[#sub.sent + 1] = { channel }      -- answered in order
      end
    end
    if sub.closed then return end              -- (closed at that allocation)
  end
  start_timer(sub.retry, delay, sub.on_retry)
end


-- Callbacks that never yield (the Redis locks' hand-off messages, see
-- async_mutex.redis_lock) are called directly, not in a coroutine of their
-- own: they are on the path of every hand-off.  Errors are reported alike.
local direct = setmetatable({}, WEAK_K)

-- RE-ENTRY: a new coroutine is an allocation, where a finalizer may end
-- the subscription: the function is called through s.call, which looks at
-- s.active again once the coroutine runs (an ended subscription's function
-- is never called).
local function deliver(s, message, channel)
  local fn = s.fn
  if direct[fn] then
    local ok, err = pcall(fn, message, channel)
    if not ok then report(err, traceback(error_text(err))) end
  else
    am_spawn(s.call, message, channel)
  end
end

local ERROR_MT = getmetatable(core.error("ERR x"))

-- The first command of sub.sent has had its answer for `channel`.
local function answered(sub, channel)
  local head = sub.sent[1]
  if not head then return end
  for i = 1, #head do
    if head[i] == channel then
      table.remove(head, i)
      break
    end
  end
  if #head == 0 then table.remove(sub.sent, 1) end
end

-- The server ended a shard channel's subscriptions (its node lost the
-- channel's slot): they end here too, and each one's on_dropped (set by
-- the cluster client, which subscribes again at the slot's new owner) is
-- called, in a coroutine of its own.
local function dropped(sub, channel)
  local list = sub.channels[channel]
  if not list then return end
  sub.channels[channel] = nil
  for _, s in ipairs(list) do
    if s.active then
      s.active = false
      if s.on_dropped then am_spawn(s.on_dropped, s) end
    end
  end
  stop_if_none(sub)
end

local function on_message(sub, reply)
  if type(reply) ~= "table" then return end
  if getmetatable(reply) == ERROR_MT then      -- a SUBSCRIBE refused
    local list = table.remove(sub.sent, 1)
    if list then refused(sub, list, reply) end
    return
  end
  local kind = reply[1]
  if kind == sub.kind.message then
    local list = sub.channels[reply[2]]
    if not list then return end
    if #list == 1 then               -- the usual case: no copy needed
      local s = list[1]
      if s.active then deliver(s, reply[3], reply[2]) end
      return
    end
    for _, s in ipairs({ unpack(list) }) do
      if s.active then deliver(s, reply[3], reply[2]) end
    end
  elseif kind == sub.kind.confirm then
    answered(sub, reply[2])
    confirm(sub, reply[2], true)
  elseif kind == "pong" then
    sub.pinging = false                -- hooks.progress stops the timer
  elseif kind == "sunsubscribe" then
    local channel = reply[2]
    local n = sub.leaving[channel]
    if n then                          -- the answer to our own SUNSUBSCRIBE
      sub.leaving[channel] = n > 1 and n - 1 or nil
    else
      dropped(sub, channel)
    end
  end
end

-- The health check of a subscriber (docs/redis.md, Pub/sub): it only
-- reads, so a connection that went silent (a server paused, a network
-- that drops everything) would be noticed by nothing.  Every pingInterval
-- ms, a subscriber that heard nothing for that long sends PING; the
-- pong is awaited as a confirmation is (busy), so commandTimeout without
-- any reply fails the connection, and the channels are subscribed again.
local function ping_tick(sub)
  local client, state, timer = sub.client, sub.state, sub.ping
  if sub.closed or not next(sub.channels) then return end    -- not armed again
  local every = state.pingInterval
  local delay = every
  if not (sub.pinging or next(sub.waiting) or status(client) ~= "connected") then
    -- Each call below may run finalizers (the collector steps when the
    -- stack grows), and the client's finalizer closes this subscriber
    -- (core.drop, sub.ping closed and nil): send() then returns false,
    -- and sub.closed is looked at again before anything else is done.
    local quiet = now() - progress(client)
    if quiet < every then                 -- heard lately: look again when due
      delay = every - quiet
    else
      wait_begins(state, client)
      if core.send(client, "PING") and not sub.closed then
        sub.pinging = true
        if not state.timing then arm(state, false) end
      end
    end
  end
  if sub.closed then return end
  start_timer(timer, ceil(delay), sub.on_ping)
end

local function start_pings(sub)
  local every = sub.state.pingInterval
  if every == huge or sub.closed then return end
  if not sub.ping then
    -- (a hook or finalizer at that call may have closed this subscriber,
    -- or made its timer: the look and the store have no call between them)
    local t = uv.new_timer()
    fresh_guard()
    if sub.closed or sub.ping then
      close_handle(t)
    else
      sub.ping = t
      t:unref()                          -- the subscription keeps the loop
    end
  end
  if not sub.on_ping then sub.on_ping = function() ping_tick(sub) end end
  if sub.closed then return end
  local t = sub.ping
  if t and alive(t) and not t:is_active() then t:start(ceil(every), 0, sub.on_ping) end
end

-- The state of another connection to the server of `state`'s client,
-- with its set-up commands and timing options: its subscriber's, and the
-- one on which the Redis locks give back a closed client's holds
-- (sibling, below).
local function same_server(state)
  return {
    host = state.host, port = state.port, path = state.path, addr = state.addr,
    setup = state.setup,
    connectTimeout = state.connectTimeout, commandTimeout = state.commandTimeout,
    reconnectDelay = state.reconnectDelay, reconnectDelayMax = state.reconnectDelayMax,
    pingInterval = state.pingInterval,
    sentinel = state.sentinel, background = state.background_sub,
  }
end

local function sibling(client)
  return core.new(same_server(core.state(client)))   -- sets state.ref (weak)
end

local function subscriber(self, kind)
  local state = core.state(self)
  local sub = state[kind.field]
  if sub then return sub end
  local sstate = same_server(state)
  sub = { state = sstate, channels = {}, waiting = {}, sent = {}, kind = kind, leaving = {} }
  sub.client = core.new(sstate, true)
  sstate.on_message = function(reply) on_message(sub, reply) end
  sstate.awaits = function() return sub.pinging or next(sub.waiting) ~= nil end
  sstate.on_lost = function(_, final, err)
    -- calls waiting for a confirmation fail, with E_UNAVAILABLE and the
    -- connection's reason (but a finalizer resumes nobody: they are
    -- garbage too); confirmed channels come back
    if not is_unavailable(err) then       -- AUTH or SELECT refused
      err = unavailable(("set-up refused by %s (%s)"):format(sstate.addr, error_text(err)))
    end
    local waiting = sub.waiting
    sub.waiting = {}
    sub.sent = {}
    sub.leaving = {}                      -- (no answer will come)
    sub.pinging = false
    -- (each list settled where it is: a coroutine woken here may subscribe
    -- again, into the new sub.waiting, which must keep what it enlists)
    for channel, list in pairs(waiting) do
      if final ~= "gc" then settle(list, false, err) end
      local subs = sub.channels[channel]
      if subs and #subs == 0 then sub.channels[channel] = nil end
    end
    -- at lua_close luv may have finalized the timer already (alive)
    if not next(sub.channels) then stop_timer(sub.ping) end
    if final then
      sub.closed = true
      if sub.retry then close_handle(sub.retry) end
      if sub.ping then close_handle(sub.ping) end
      sub.retry, sub.ping = nil, nil
    else
      restore(sub)
    end
  end
  -- RE-ENTRY: a hook or a finalizer at one of the calls above may have
  -- made the client's subscriber (a subscribe of its own), or closed the
  -- client (whose close closes only the subscriber it saw): one claim, in
  -- one step of C, then a look at the client
  local claimed = core.claim(state, kind.field, sub)
  if claimed ~= sub then
    core.drop(sub.client)                  -- (never connected)
    return claimed
  end
  if status(self) == "closed" and not sub.closed then sub.client:close() end
  return sub
end

-- Client.subscribe and Client.ssubscribe, as their tail call (so that
-- the levels of its errors are theirs): `kind` is CLASSIC or SHARDED.
local function subscribe_to(self, channel, fn, kind)
  local fname = kind.fname
  check_client(self, fname)
  if type(channel) ~= "string" then
    typeerror(1, fname, "string", channel)
  end
  if not is_callable(fn) then
    typeerror(2, fname, "function", fn)
  end
  check_open(self)
  local co, main = running()
  if main or not isyieldable() then
    usage_error("attempt to subscribe outside a coroutine")
  end
  local sub = subscriber(self, kind)
  -- a subscriber that follows a master through Sentinel: the master found
  -- first (its SUBSCRIBE is sent by core.send, which cannot wait)
  local sentinel = sub.state.sentinel
  if sentinel and not sentinel.master and status(sub.client) == "idle" then
    sentinel_wait(sentinel)
  end
  local s = setmetatable({ channel = channel, fn = fn, active = true, sub = sub,
    on_dropped = false }, Subscription)
  s.call = function(message, ch)
    if s.active then return fn(message, ch) end
  end
  -- RE-ENTRY: a lost connection settles every wait in sub.waiting and
  -- replaces the table; a hook or a finalizer (at an allocation) can end
  -- the connection, or bring the channel's confirmation, between any two
  -- steps here.  So the caller's record is among the waits before its
  -- SUBSCRIBE can be answered or lost (a record stored after a loss, in a
  -- list the loss dropped, or after the answer, would wait for ever), and
  -- the look at the waits and the store are one step of C.
  local rec = { co = co, done = false }
  local fresh = { s }
  wait_begins(sub.state, sub.client)
  local waiting = core.enlist(sub, channel, rec, { rec })
  local list = sub.channels[channel]
  if not waiting then                      -- confirmed already: no wait
    if not list then return subscribe_to(self, channel, fn, kind) end  -- (ended since)
    list[#list + 1] = s
    return s
  end
  if list then
    list[#list + 1] = s
  else
    list = fresh
    sub.channels[channel] = list
    local sent, err = core.send(sub.client, kind.sub, channel)
    if not sent then
      rec.done = true
      for i = #waiting, 1, -1 do
        if waiting[i] == rec then table.remove(waiting, i) end
      end
      if sub.waiting[channel] == waiting and #waiting == 0 then sub.waiting[channel] = nil end
      if sub.channels[channel] == list then sub.channels[channel] = nil end
      error(err, 0)
    end
    if not sub.closed then sub.sent[#sub.sent + 1] = { channel } end
    core.listen(sub.client, true)
    start_pings(sub)
  end
  -- RE-ENTRY: the subscriber may have been closed by Lua code run since
  -- the look above (a hook, a finalizer): nobody would settle this wait
  if sub.closed and not rec.done then
    rec.done, rec.ok, rec.err = true, false, unavailable("client closed")
  end
  -- A coroutine closed (coroutine.close) while it waits never gets its
  -- subscription: it ends here, or fn would be called for ever with
  -- nobody holding the subscription to end it, and the loop never return.
  local _ <close> = setmetatable({}, { __close = function()
    if rec.done then return end
    rec.done = true
    for i = #waiting, 1, -1 do
      if waiting[i] == rec then table.remove(waiting, i) end
    end
    s:unsubscribe()
  end })
  core.wait(rec)
  if not rec.ok then
    s:unsubscribe()
    error(rec.err, 0)
  end
  return s
end

--- Subscribes fn(message, channel) to `channel`; waits (in a coroutine)
-- until the server confirms, unless the channel is subscribed already.
-- Returns a Subscription (sub:unsubscribe()).
function Client.subscribe(self, channel, fn)
  return subscribe_to(self, channel, fn, CLASSIC)
end

--- The same for a shard channel (SSUBSCRIBE, Redis 7; SPUBLISH publishes).
function Client.ssubscribe(self, channel, fn)
  return subscribe_to(self, channel, fn, SHARDED)
end

--- Ends this subscription; the channel is unsubscribed when it was its
-- last one.  Never waits; calling it twice does nothing.
function Subscription.unsubscribe(self)
  if getmetatable(self) ~= Subscription then
    typeerror(1, "unsubscribe", "async_mutex.redis.Subscription", self)
  end
  if not self.active then return end
  self.active = false
  local sub, channel = self.sub, self.channel
  local list = sub.channels[channel]
  if not list then return end
  for i = #list, 1, -1 do
    if list[i] == self then table.remove(list, i) end
  end
  if #list > 0 then return end
  sub.channels[channel] = nil
  if status(sub.client) == "connected" or status(sub.client) == "connecting" then
    -- (its "sunsubscribe" answer is then ours, not the server's own: dropped)
    if core.send(sub.client, sub.kind.unsub, channel) and sub.kind == SHARDED then
      sub.leaving[channel] = (sub.leaving[channel] or 0) + 1
    end
  end
  if not next(sub.channels) then
    core.listen(sub.client, false)
    stop_timer(sub.ping)
    -- nothing left to subscribe again: a pending retry (up to
    -- reconnectDelayMax away) would keep uv.run() from returning
    if sub.scheduled and sub.retry then   -- (none once closed)
      sub.scheduled = false
      stop_timer(sub.retry)
    end
  end
end

-- }==========================================================


-- {========================================================== eval

-- {---------------------------------------------------------- SHA1s
-- script -> its SHA1 as the server computed it (SCRIPT LOAD), for
-- EVALSHA; one cache for every client (a script's SHA1 is the same on
-- every server).  Two parts, so that memory stays bounded whatever
-- scripts the user runs (docs/redis.md, Scripts):
--  * pinned: the module's own scripts (Redis locks, versioned values), a
--    fixed set, remembered for good (false until first loaded);
--  * the user's (client:eval): at most 2 * USER_SCRIPTS, in two
--    generations: a script is looked up in the recent one, then in the
--    older one (and moved to the recent one); when the recent one is full
--    it becomes the older one and the older one is dropped.  So the
--    USER_SCRIPTS most recently used are always kept, at O(1) a call.  A
--    forgotten script runs as a new one: EVAL, then SCRIPT LOAD.
-- Strings are never taken out of a weak table (Lua 5.4 manual, 2.5.4):
-- the bound is the only thing that ends an entry.
local USER_SCRIPTS = 128
local pinned = {}
local recent, older, nrecent = {}, {}, 0

local function pin(scripts)
  for _, script in pairs(scripts) do
    if type(script) == "string" then pinned[script] = false end
  end
end

-- The SHA1 of 'script' if known, else nil.
local function sha_of(script)
  local sha = pinned[script]
  if sha ~= nil then return sha or nil end
  sha = recent[script]
  if sha == nil then
    sha = older[script]
    if sha ~= nil then                     -- used again: recent now
      older[script] = nil
      if nrecent >= USER_SCRIPTS then older, recent, nrecent = recent, {}, 0 end
      recent[script], nrecent = sha, nrecent + 1
    end
  end
  return sha
end

local function remember(script, sha)
  if pinned[script] ~= nil then
    pinned[script] = sha
    return
  end
  if nrecent >= USER_SCRIPTS then older, recent, nrecent = recent, {}, 0 end
  recent[script], nrecent = sha, nrecent + 1
end
-- }----------------------------------------------------------

-- The list (keys or args of eval) checked: strings and numbers.  A table
-- with a metatable (a __len or __index of its own) is read once, into a
-- plain list: what was checked is what is sent.
local function check_list(list, n, what)
  if list == nil then return nil end
  if type(list) ~= "table" then
    typeerror(n, "eval", "table of " .. what, list)
  end
  local len = #list
  if mtype(len) ~= "integer" or len < 0 then
    argerror(n, "eval", ("%s has no valid length"):format(what))
  end
  local plain = getmetatable(list) == nil
  local out = plain and list or {}
  for i = 1, len do
    local v = list[i]
    local t = type(v)
    if t ~= "string" and t ~= "number" then
      argerror(n, "eval", ("%s[%d] must be a string or number, got %s"):format(
        what, i, typename(v)))
    end
    if v ~= v then   -- NaN: refused here, where the message names eval
      argerror(n, "eval", ("%s[%d] must not be NaN"):format(what, i))
    end
    if not plain then out[i] = v end
  end
  return out
end

local function is_noscript(err)
  return getmetatable(err) == ERROR_MT and err.code == "NOSCRIPT"
end

local script_call = core.script

-- Runs `script` with the list `keys` and the args (checked by the
-- caller): one list, or the values themselves (core.script takes both; the
-- Redis locks pass values, a table less per request).  EVALSHA, and EVAL
-- when the server does not know the script (NOSCRIPT: restarted, flushed).
-- The one owner of that rule: client:eval and the Redis locks
-- (async_mutex.redis_lock, through _internal.run_script) use it.
local function run_script(self, script, keys, ...)
  local sha = sha_of(script)
  if sha then
    local ok, res = pcall(script_call, self, "EVALSHA", sha, keys, ...)
    if ok then return res end
    if not is_noscript(res) then error(res, 0) end
  end
  local reply = script_call(self, "EVAL", script, keys, ...)
  if not sha then
    -- the next time: EVALSHA with the SHA1 the server computes
    local ok, s = pcall(self.call, self, "SCRIPT", "LOAD", script)
    if ok then remember(script, s) end
  end
  return reply
end

local NONE = {}

--- Runs a Lua script on the server: EVALSHA, and EVAL when the server
-- does not know the script (NOSCRIPT: restarted, flushed).
function Client.eval(self, script, keys, args)
  check_client(self, "eval")
  if type(script) ~= "string" then
    typeerror(1, "eval", "string", script)
  end
  keys = check_list(keys, 2, "keys")
  args = check_list(args, 3, "args")
  -- call's own misuse errors, here at eval's caller's line (call would
  -- raise them at this file's)
  check_open(self)
  local _, main = running()
  if main or not isyieldable() then
    usage_error("attempt to call redis outside a coroutine")
  end
  return run_script(self, script, keys or NONE, args or NONE)
end

-- }==========================================================

-- Versioned values for optimistic concurrency (docs/optimistic.md).
local versioned = require "async_mutex.versioned"
M.versioned = versioned.versioned

-- The module's own scripts keep their SHA1 for good (SHA1s, above).
pin(require "async_mutex.redis_scripts")
pin(versioned.scripts)

-- What the other Redis modules use of this one's insides (private, as its
-- leading underscore says; read
-- by redis_cluster.lua, redis_lock_*.lua and checks.lua, written here
-- only): the one owner of closing a luv handle (the Redis locks' timers
-- too), the client test, callbacks called directly (the Redis locks'
-- hand-off messages), eval's list check and script call (the cluster
-- client's eval), a new client of the same server (the Redis locks give a
-- closed client's holds back on it), and the default commandTimeout (a
-- cluster client's nodes have it unless told otherwise).
M._internal = {
  close_handle = close_handle, is_client = is_client, direct_callbacks = direct,
  check_list = check_list, run_script = run_script, sibling = sibling,
  default_command_timeout = DEFAULTS.commandTimeout,
}

return M
