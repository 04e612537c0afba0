--- async_mutex.redis_lock_acquire: the Redis half of a Redis lock's
-- acquisition (a part of async_mutex.redis_lock_base, which the kinds
-- require): the eviction check, a waiter's requests and its sleep in the
-- Redis queue until the hand-off, the lock's keys; and the steal and
-- query requests.  The rules are in docs/redis-locks.md.  Private.

local core = require "async_mutex.core"
local scripts = require "async_mutex.redis_scripts"
local uv = require "luv"
local am = require "async_mutex"
local hub_m = require "async_mutex.redis_lock_hub"
local lease_m = require "async_mutex.redis_lock_lease"
local rcore = require "async_mutex.redis_core"

local error, ipairs, pcall, setmetatable, tonumber, tostring, type =
  error, ipairs, pcall, setmetatable, tonumber, tostring, type
local min, max, ceil, tointeger = math.min, math.max, math.ceil, math.tointeger
local format = string.format
local hrtime, update_time = uv.hrtime, uv.update_time
local limited = core.acquire
-- The locks made here (bells) are the library's own: debug mode does not
-- watch them (docs/debug.md, Deadlocks).
local internal = core.dbg_internal
local E_UNAVAILABLE = am.E_UNAVAILABLE

-- a part of the Lua layer: an error raised through it stands at the
-- user's call (async_mutex.checks)
require("async_mutex.checks").join_layer()

local CLOSED, NS, eval, release_token, background, random_hex =
  hub_m.CLOSED, hub_m.NS, hub_m.eval, hub_m.release_token, hub_m.background, hub_m.random_hex
local hub_use, hub_unuse, subscribed, subscribe, confirm_grant =
  hub_m.hub_use, hub_m.hub_unuse, hub_m.subscribed, hub_m.subscribe, hub_m.confirm_grant
local new_lease, end_after_close, stolen =
  lease_m.new_lease, lease_m.end_after_close, lease_m.stolen

-- {---------------------------------------------------------- eviction
-- A server that may evict keys when it reaches maxmemory may evict a
-- lock's holders (two holders) or its queue: the locks refuse such a
-- server, or warn about it once per connection with the option
-- unsafeEviction = "warn" (docs/redis-locks.md, "Eviction").  Since every
-- key of a lock has an expiry, the volatile-* policies may evict them
-- too: only noeviction, or no maxmemory at all, is safe.  The policy is
-- read (INFO memory) at the first use of a lock on each connection of the
-- client (get_hub resets it), by one coroutine while the others wait.  A
-- server that does not let us read it (an ACL) is not refused.  The
-- refusal is raised as the request's outcome (at level 0, as
-- E_UNAVAILABLE is): it is the server's, not a misuse at the caller's line.

-- The first line of 'info' with 'field', as a string.
local function info_field(info, field)
  return info:match("\n" .. field .. ":([^\r\n]*)") or info:match("^" .. field .. ":([^\r\n]*)")
end

local function read_policy(hub)
  local ok, info = pcall(hub.client.call, hub.client, "INFO", "memory")
  if not ok then
    if info == E_UNAVAILABLE then error(info, 0) end
    return false                      -- refused (ACL): not checked
  end
  local policy = type(info) == "string" and info_field(info, "maxmemory_policy")
  local limit = type(info) == "string" and tonumber(info_field(info, "maxmemory"))
  if not policy or policy == "noeviction" or limit == 0 then return false end
  return format("maxmemory-policy %s, maxmemory %s", policy, limit or "?")
end

-- Raises if the server may evict the lock's keys and the lock does not
-- take that (unsafeEviction).  Called before a lock's requests while the
-- answer is not known to be safe (hub.evicts ~= false).
local function eviction(lk)
  local hub = lk.hub
  local evicts = hub.evicts
  local warn = lk.unsafe_eviction == "warn"
  -- not read on this connection yet; or refused, then read again at each
  -- use: a lock that refuses sends nothing else, and would never see a
  -- new connection, or a server whose policy was changed
  if evicts == nil or (evicts and not warn) then
    local _ <close> = hub.evicts_gate:acquire()
    -- closed while the coroutine before us read it
    if hub.closed then error(CLOSED, 0) end
    evicts = hub.evicts
    if evicts == nil or (evicts and not warn) then
      evicts = read_policy(hub)
      hub.evicts = evicts
    end
    if not evicts then return end
  end
  if warn then
    if not hub.warned then
      hub.warned = true
      io.stderr:write("async_mutex: warning: the Redis server may evict the Redis locks' keys (",
        evicts, "): two holders are possible; use maxmemory-policy noeviction",
        " (docs/redis-locks.md, \"Eviction\")\n")
    end
    return
  end
  error(format("the Redis server may evict the lock's keys (%s): use maxmemory-policy"
    .. " noeviction, or the option unsafeEviction = \"warn\"", evicts), 0)
end
-- }----------------------------------------------------------

-- {========================================================== acquire
-- The Redis half of an acquisition, run by the holder of the local gate:
-- one ACQUIRE request grants at once or queues this process; a queued
-- waiter then sleeps on a private core Semaphore (its "bell"), rung by the
-- hand-off message, and wakes every waiterTimeout/3 to renew its place
-- (which also catches a lost message).  'deadline' is nil (no bound), the
-- monotonic time (uv.hrtime) at which 'err' is raised, or false (a try).

local REFRESH = setmetatable({}, { __name = "async_mutex.refresh" })

-- Sleeps on 'bell' until it is rung (true) or the monotonic time 'due'
-- (false; at once if it has passed).  The core's timer counts from the
-- loop's time, which lags behind while a callback runs (blocking work
-- before the call): it is brought up to date first, and the callers
-- compare the clock, not the timer, with their deadlines, so that none
-- is ever taken as passed before it has.
local function doze(bell, due)
  local ms = (due - hrtime()) / NS
  if ms <= 0 then return false end
  update_time()
  local ok, e = pcall(limited, bell, ceil(ms), REFRESH)
  if not ok and e ~= REFRESH then error(e, 0) end
  return ok
end

-- The waiter's cleanup when its acquisition does not complete (error,
-- timeout, cancel, coroutine closed): leave the Redis queue, or give back
-- a grant that arrived too late.  In the background: the caller's error is
-- raised at once (after one commandTimeout, not two, when Redis does not
-- answer), and the withdrawal is written before any later request of this
-- client, so the process's next request finds it done.
local Pending = {
  __close = function(w)
    local lk = w.lk
    local hub = lk.hub
    if hub.waiters[w.token] == w then hub.waiters[w.token] = nil end
    lk.waiting[w] = nil
    if w.done then return end
    hub_unuse(hub)
    background(release_token, lk, w.keys, w.token)
  end,
}

-- The keys of the lock 'name' (scripts.keys), with the name as field
-- 'name' and the limit the scripts take (a string) as 'limit'.
-- On a Redis Cluster (docs/redis-locks.md, "On a cluster") every key of
-- one lock is in one slot, so that its scripts run on one master: the
-- keys are made from "{name}" unless the name has a hash tag already.
local function has_tag(name)       -- as Redis reads a hash tag: the first {
  local open = name:find("{", 1, true)
  local close = open and name:find("}", open + 1, true)
  return close ~= nil and close > open + 1
end

local function lock_keys(name, s_limit, on_cluster)
  local base = name
  if on_cluster and not has_tag(name) then base = "{" .. name .. "}" end
  local keys = scripts.keys(base)
  keys.name, keys.limit = name, s_limit
  -- the hashed part of its keys: its hand-off channels are in its slot
  if on_cluster then keys.tag = base:match("^[^{]*{([^}]*)}") end
  return keys
end

-- The channel the hand-offs of a waiter with `keys` are published on:
-- the hub's; on a cluster its shard channel in the lock's slot (the
-- scripts SPUBLISH to a channel that begins with "{", and a script may
-- only publish on a shard channel of its own keys' slot).
local function channel_of(lk, keys)
  if not lk.cluster then return lk.hub.channel, nil end
  local ch = keys.channel
  if not ch then
    ch = "{" .. keys.tag .. "}" .. lk.hub.channel
    keys.channel = ch
  end
  return ch, ch
end

-- The keys of the lock 'name' of lk: a plain lock's are made once.
local function keys_of(lk, name)
  if name == lk.name then return lk.keys end
  return lock_keys(name, lk.s_limit, lk.cluster)
end

-- Whether the locks of 'sorted' (acquireAll's {key, name} records) are
-- in more than one slot of lk's cluster.
local function split(lk, sorted)
  local slot
  for _, rec in ipairs(sorted) do
    local s = rcore.keyslot(keys_of(lk, rec[2])[1])
    if slot and s ~= slot then return true end
    slot = s
  end
  return false
end

-- The acquire request of the waiter w (mode "wait", "try" or "again"), by
-- the lock's own script if it has one (redlock.lua's: the acquire script,
-- then more in the same call when it grants).  A
-- request that opened a new connection (on_connected) is followed by the
-- eviction check of that connection: refused, its grant or place in the
-- queue is given back (Pending) as for any error.
--
-- An answer that this waiter does not hold carries n: every grant made
-- before the request has a fence <= n, every later one a larger fence
-- (redis_scripts.lua, acquire).  A grant of this waiter made before the
-- request ended before it (the request would have found it held), and
-- its hand-off message comes on the other connection: it may be read
-- while the request is in flight, or after the answer (the two sockets
-- are read in no set order, and a process that blocks reads both late).
-- So such a message is dropped, and any later one of fence <= n ignored
-- (on_message): a message kept or read from here on is of a grant made
-- after this request, whose lease Redis started after it was sent
-- (docs/redis-locks.md, "Waiting without polling"; spec 126).
local function ask(lk, w, s_weight, mode)
  -- (closed by a finalizer or a hook since the caller looked: a waiter's
  -- outcome, not the closed client's misuse error)
  if lk.hub.closed then error(CLOSED, 0) end
  local r
  if lk.s_hint then                   -- (a RedlockMutex's server: its script's 8th argument)
    r = eval(lk, lk.acquire_script, w.keys, w.token, lk.s_limit, s_weight, lk.s_ttl,
             lk.s_wait, (channel_of(lk, w.keys)), mode, lk.s_hint)
  else
    r = eval(lk, lk.acquire_script, w.keys, w.token, lk.s_limit, s_weight, lk.s_ttl,
             lk.s_wait, (channel_of(lk, w.keys)), mode)
  end
  local n = r[1] ~= 1 and r[3]
  if n then
    n = tointeger(tonumber(n))
    if not w.ended or n > w.ended then w.ended = n end
    if w.fence and w.fence <= n then w.fence, w.value = nil, nil end
  end
  if lk.hub.evicts == nil then eviction(lk) end
  return r
end

-- Sleeps in the Redis queue until the hand-off message comes (nil) or a
-- request of its own is granted (that reply); asks again at every third
-- of waiterTimeout and when the first holder's lease ends ('r' the last
-- reply).  Raises the cancel error, 'err' at the deadline, E_UNAVAILABLE
-- when the client is closed.  Returns the reply that granted (or nil) and
-- the time its request was sent (nil: none sent).
local function wait_in_queue(lk, w, s_weight, deadline, err, r)
  local hub = lk.hub
  local refresh = max(1, lk.wait_ms // 3) * NS
  local sent
  while r[1] ~= 1 and not w.fence do
    local t = hrtime()
    local again = t + refresh
    if r[2] and r[2] >= 0 then again = min(again, t + (r[2] + 1) * NS) end
    repeat
      if not w.canceled then
        local bell = w.bell
        if not bell then
          bell = internal(core.Semaphore.new(0))
          w.bell = bell
        end
        doze(bell, deadline and min(again, deadline) or again)
        -- woken by close(): a grant that came meanwhile is given back
        -- with the close (client_closed)
        if hub.closed then error(CLOSED, 0) end
      end
      if w.fence then return nil, sent end
      if w.canceled then error(lk.cancel_error, 0) end
      t = hrtime()
      if deadline and t >= deadline then error(err, 0) end
    until t >= again
    sent = t
    -- (a message of a grant made before this request, read while it was
    -- in flight, is dropped by ask: the grant has ended)
    r = ask(lk, w, s_weight, "again")
  end
  if r[1] == 1 then return r, sent end
  return nil, sent
end

-- The request's numbers go as strings made once (the client would format
-- them per call), and its arguments as values: no table per request.
-- The waiter record 'w' has four fields while the lock is granted at once
-- (lk, keys, token, done), one hash part of four slots.
--
-- A grant's lease is counted from the request that set it: the one that
-- was answered, or for a hand-off the last request sent, whose answer
-- found this waiter queued: a message is kept only when its grant came
-- after that request (ask), so Redis started that lease later, at the
-- release, and the count here ends first.  But a waiter
-- sleeps up to a third of waiterTimeout between requests, and a hand-off
-- that comes late in that sleep was counted from long ago: when the
-- lease's renewal is due already, the grant is confirmed by one request
-- before acquire() returns (it replaces the renewal that would be sent at
-- once anyway), and counted from it.  So acquire() never returns a lease
-- that is over, or nearly so.  'token': the token to
-- use (redlock.lua sends a request with it behind the acquire's), else a
-- fresh one.
local function redis_acquire(lk, name, weight, deadline, err, token)
  local hub = lk.hub
  if hub.closed then error(CLOSED, 0) end   -- closed while at the gate
  local keys = keys_of(lk, name)
  token = token or hub.id .. ":" .. random_hex()
  local try = deadline == false
  local s_weight = weight == 1 and "1" or tostring(weight)
  -- (done: nothing to withdraw until the first request goes out)
  local w <close> = setmetatable({ lk = lk, keys = keys, token = token, done = true },
                                 Pending)
  -- Known to the hub before the request goes out: the hand-off message
  -- comes on the other connection and may be read before the reply; and
  -- to cancel(), which may come before the reply too (not a try's: it
  -- never waits); and to close(), which gives back what it had in Redis.
  -- The waiter's bell (a core Semaphore) is made only when it has to sleep.
  hub.waiters[token] = w
  if not try then lk.waiting[w] = true end
  if hub.evicts ~= false then
    eviction(lk)
    if w.canceled then error(lk.cancel_error, 0) end
    if deadline and hrtime() >= deadline then error(err, 0) end
  end
  hub_use(hub)
  w.done = false
  local sent = hrtime()
  local r = ask(lk, w, s_weight, try and "try" or "wait")
  local first                       -- the length of the lease Redis granted
  while true do
    if r and r[1] == 1 then
      first = lk.ttl
    elseif w.fence then             -- the hand-off message
      first = min(lk.ttl, lk.wait_ms)
    elseif try then
      w.done = true                 -- refused: never queued, nothing to withdraw
      error(err, 0)
    else
      -- Queued: wait for the hand-off.  Later requests ask again.  The
      -- bound is checked between requests: one that passed while this one
      -- was in flight sends nothing more (the withdrawal goes out with
      -- Pending).
      if deadline and hrtime() >= deadline then error(err, 0) end
      local _, shard = channel_of(lk, w.keys)
      if not subscribed(hub, shard) then
        subscribe(hub, shard)
        sent = hrtime()             -- a hand-off before we listened: ask again
        r = ask(lk, w, s_weight, "again")
      end
      local at
      r, at = wait_in_queue(lk, w, s_weight, deadline, err, r)
      sent = at or sent
      first = r and lk.ttl or min(lk.ttl, lk.wait_ms)
    end
    -- (replicas: a grant by hand-off was written on another process's
    -- connection, which WAIT on this one does not cover: it is confirmed
    -- by asking again, a write of this connection, as a stale one is)
    if hrtime() - sent < first * NS / 3
      and not (lk.replicas and not (r and r[1] == 1)) then break end
    -- Canceled meanwhile (cancel(), or a RedlockMutex's attempt that no
    -- longer needs this server, whose release may have gone out behind
    -- the request already): not asked again, which would take the lock
    -- anew after that release; the token is given back (Pending).
    if w.canceled then error(lk.cancel_error, 0) end
    -- Stale: confirm it by asking again (Redis renews a grant it still
    -- has to ttl from this request, and answers with its fence), or learn
    -- that it ended meanwhile (this process was too slow to take it): the
    -- same request then queues this waiter again, or grants anew, and
    -- late messages of the ended grant, or of any grant made before the
    -- request, are ignored (ask, on_message).  Its answer, not the grant
    -- seen before, gives the fence: a renewal answers only "held", and
    -- the hold it renewed may be a later grant (one that came while it was
    -- in flight, after the first had ended).  A try is never queued: it
    -- renews, and its token can hold no other grant.
    local fence, value
    if r and r[1] == 1 then fence, value = r[2], r[3] else fence, value = w.fence, w.value end
    w.fence = nil
    sent = hrtime()
    if try then
      if eval(lk, scripts.renew, keys, token, lk.s_limit, lk.s_ttl) ~= 1 then
        w.done = true                 -- not held, never queued: nothing to withdraw
        error(err, 0)
      end
      r = { 1, fence, value }
    else
      r = ask(lk, w, s_weight, "again")
    end
  end
  if lk.replicas then confirm_grant(lk) end   -- else given back (Pending)
  w.done = true
  local lease, value, extra
  if r and r[1] == 1 then
    -- (r[4]: what a lock's own acquire script adds to a grant it answers)
    lease, value, extra = new_lease(lk, keys, token, tointeger(tonumber(r[2])), sent, first),
                          tointeger(tonumber(r[3])), r[4]
  else
    lease, value = new_lease(lk, keys, token, w.fence, sent, first), w.value
  end
  -- Closed by a finalizer or a hook since the last look (at an allocation
  -- or a luv call of new_lease): the close gave the token back, as this
  -- waiter's or as the hold's, and the next process may hold already.
  -- The hold is not handed out; it ends here as the close ends holds.
  if hub.closed then
    end_after_close(lease)
    error(CLOSED, 0)
  end
  return lease, value, extra
end

-- }==========================================================

-- {========================================================== steal, query
-- lock:steal on the Redis locks (docs/redis-locks.md, "Steal"): one
-- script ends every hold in place and grants the stealer with a new fence
-- (redis_scripts.lua, steal); the queue keeps its order.  The steal goes
-- around the lock's local gate: it takes no place in the Redis queue,
-- which the gate is there to keep to one per process.  Its request is
-- known to the hub as a waiter's is (close() gives it back), and a grant
-- not confirmed (replicas) or cut off is given back (Pending).  The holds
-- it ended in this process are lost at its answer; the other processes
-- are told by a message on their hand-off channel when they listen, and
-- otherwise at their next renewal or release, which find the hold gone.
local function redis_steal(lk, name, weight)
  local hub = lk.hub
  if hub.closed then error(CLOSED, 0) end
  local keys = keys_of(lk, name)
  local token = hub.id .. ":" .. random_hex()
  local w <close> = setmetatable({ lk = lk, keys = keys, token = token, done = true },
                                 Pending)
  hub.waiters[token] = w
  if hub.evicts ~= false then eviction(lk) end
  hub_use(hub)
  w.done = false
  local sent = hrtime()
  -- (the ended holders' channels: the hub channel's form, see channel_of)
  local prefix = lk.cluster and "{" .. keys.tag .. "}async_mutex:" or "async_mutex:"
  local r = eval(lk, scripts.steal, keys, token, lk.s_limit,
                 weight == 1 and "1" or tostring(weight), lk.s_ttl, prefix)
  if hub.evicts == nil then eviction(lk) end      -- a new connection (see ask)
  local ended = r[4]
  for i = 1, #ended, 2 do stolen(hub, ended[i], tointeger(tonumber(ended[i + 1]))) end
  if lk.replicas then confirm_grant(lk) end       -- else given back (Pending)
  w.done = true
  local lease = new_lease(lk, keys, token, tointeger(tonumber(r[2])), sent, lk.ttl)
  if hub.closed then                  -- (as at the end of redis_acquire)
    end_after_close(lease)
    error(CLOSED, 0)
  end
  return lease, tointeger(tonumber(r[3]))
end

-- am.query on the Redis locks (docs/redis-locks.md, "Query"): the holders
-- and the queue of the lock 'name' as Redis has them, after expiry and
-- dispatch.  'rw': a readers-writer lock's weights name the mode; a
-- semaphore's entries ('weighted') have their weight.
local function redis_query(lk, name, kind)
  local hub = lk.hub
  if hub.evicts ~= false then eviction(lk) end
  if hub.closed then error(CLOSED, 0) end
  local r = eval(lk, scripts.query, keys_of(lk, name), lk.s_limit)
  if hub.evicts == nil then eviction(lk) end
  local now, h, q, c = tonumber(r[1]), r[2], r[3], r[4]
  local function entry(token, weight)
    weight = tointeger(tonumber(weight)) or 1
    local client = token:match("^([^:]+):")
    local e = { owner = token, client = client, mine = client == hub.id }
    if kind == "weighted" then
      e.mode, e.weight = "weighted", weight
    elseif kind == "rw" then
      e.mode = weight == lk.limit and "exclusive" or "shared"
    else
      e.mode = "exclusive"
    end
    return e
  end
  local held = {}
  for i = 1, #h, 2 do
    local ends, weight, fence = h[i + 1]:match("^(%d+) (%d+) (%d+)")
    local e = entry(h[i], weight)
    e.fence, e.ttl = tointeger(tonumber(fence)), tointeger(tonumber(ends) - now)
    held[#held + 1] = e
  end
  -- oldest grant first: fences grow with every grant
  table.sort(held, function(a, b) return a.fence < b.fence end)
  local pending = {}
  for i = 1, #q do pending[i] = entry(q[i], c[i]:match("^(%d+)")) end
  return { held = held, pending = pending }
end
-- }==========================================================

return {
  eviction = eviction, doze = doze, lock_keys = lock_keys, keys_of = keys_of,
  split = split, redis_acquire = redis_acquire, redis_steal = redis_steal,
  redis_query = redis_query,
}
