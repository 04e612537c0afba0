--- async_mutex.redlock: RedlockMutex, a mutex held by a quorum of N
-- independent Redis servers (docs/redis-locks.md, "RedlockMutex").
--
-- On each server the lock is a RedisMutex's state (redis_scripts.lua: its
-- FIFO queue, hand-off messages, leases, the eviction check, keys that
-- expire), taken through the same Redis half of an acquisition
-- (redis_lock_base.redis_acquire), one coroutine per server, all at once.
-- The process holds the RedlockMutex when a majority of the servers
-- (quorum = N // 2 + 1) granted it; each server's lease is renewed and
-- lost on its own, and the hold is lost when fewer than a quorum of them
-- are still valid by the local clock: its validity is the quorum-th
-- longest of the leases, each counted from the request that set it (so it
-- is ttl minus the time to acquire minus the drift allowance).
--
-- Fencing over a quorum: each grant draws a number from a counter of the
-- lock on every server it won (N:qf, written only by that server's holder),
-- takes the largest, and makes sure a quorum of servers hold at least that
-- number before acquire() returns.  Any two quorums share a server, and a
-- server's holder draws above what the previous holder there left, so the
-- fences strictly increase (the argument in docs/redis-locks.md).
--
-- A restarted server has forgotten its holds (no persistence): a grant
-- from a server up for less than ttl is not counted (its uptime is read
-- once per connection), so a hold taken before the restart ends (its
-- leases run out) before the server can count towards another.

local am = require "async_mutex"
local core = require "async_mutex.core"
local base = require "async_mutex.redis_lock_base"
local scripts = require "async_mutex.redis_scripts"
local multi = require "async_mutex.redis_multi"
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local uv = require "luv"

local error, getmetatable, ipairs, pairs, pcall, setmetatable, tonumber, tostring, type =
  error, getmetatable, ipairs, pairs, pcall, setmetatable, tonumber, tostring, type
local co_create, co_resume, co_yield, co_status, running, isyieldable = coroutine.create,
  coroutine.resume, coroutine.yield, coroutine.status, coroutine.running, coroutine.isyieldable
local min, max, random, tointeger = math.min, math.max, math.random, math.tointeger
local format = string.format
local hrtime = uv.hrtime
local internal = core.dbg_internal
local typeerror = checks.typeerror
local argerror, check_open = checks.argerror, checks.check_open
local E_UNAVAILABLE = am.E_UNAVAILABLE
local unavailable = require "async_mutex.unavailable"
-- Why a server failed an attempt, besides its client's own errors
local YOUNG = unavailable.new("server up for less than ttl (restarted)")
local DRAW_ENDED = unavailable.new("lease ended before its fence was drawn")
local FENCE_UNSETTLED = unavailable.new("fence not written to a quorum")
local NS = base.NS
local limited = core.acquire

local M = {}

-- draw_qf(hint): the draw of the quorum fence from N:qf (KEYS[7]) for the
-- server's holder, as DRAW below draws it (the counter plus one, or the
-- server's time in us when it is missing), or 'hint' if that is larger;
-- returns it as a string.  The hint (a string of digits, "0": none) is the
-- requester's guess of the draw: the last fence of its RedlockMutex plus
-- one, which it is whenever no other process took the lock since.  Then
-- the draw is one command (SET ... GET writes the hint and returns the
-- counter); a wrong guess costs a second SET.  A larger hint only makes
-- the draw larger, which the fencing argument allows (any draw above the
-- counter); it stays one per grant above a fence drawn, so the counters
-- still keep below the servers' clocks (docs/redis-locks.md).
local DRAW_QF = scripts.SET_GET .. [[
local function draw_qf(hint)
  local v = tonumber(hint)
  local last = set_get(KEYS[7], hint)
  if last then
    last = tonumber(last) + 1
  else
    local t = redis.call('TIME')
    last = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if last <= v then return hint end
  local s = string.format('%d', last)
  redis.call('SET', KEYS[7], s, 'PX', 3600000)
  return s
end
]]

--- ACQUIRE: a server's acquire request, in one call: the acquire script of
-- redis_scripts.lua (its keys and arguments, KEYS[1..6], ARGV[1..7]), and
-- when it grants, the draw of the quorum fence (ARGV[8]: the hint of
-- draw_qf), added to its answer: {1, fence, value, drawn}.  A grant by
-- hand-off draws in the release that grants it (RELEASE), or with DRAW
-- once it is known.
M.ACQUIRE = "local function acquire()\n" .. scripts.acquire .. "\nend\n" .. DRAW_QF .. [[
local r = acquire()
if r[1] == 1 then r[4] = draw_qf(ARGV[8]) end
return r
]]

--- DRAW: KEYS N:h, N:qf; ARGV token.  If the token holds the lock on this
-- server (its lease running), draws the next quorum fence here: the
-- counter plus one, or, when the counter is gone (a restart without
-- persistence, an hour unused), the server's time in us; returns it as a
-- string, else 0.  Only the server's holder writes N:qf.
M.DRAW = [[
local g = redis.call('HGET', KEYS[1], ARGV[1])
if not g then return 0 end
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
if tonumber(string.match(g, '^%d+')) < sec * 1000 + math.floor(usec / 1000) then return 0 end
local last = redis.call('GET', KEYS[2])
local v = last and tonumber(last) + 1 or sec * 1000000 + usec
local s = string.format('%d', v)
redis.call('SET', KEYS[2], s, 'PX', 3600000)
return s
]]

--- RELEASE: the release script of redis_scripts.lua (its keys and
-- arguments), whose hand-off also draws the new holder's quorum fence from
-- N:qf (KEYS[7]), as DRAW would: when the script sends a grant's message
-- (its tell), the token holds the lock here already (its record is written
-- first), so it is this server's holder that the draw is made for; the
-- draw goes in the message's value field, negated ("token fence -drawn"),
-- and the new holder needs no DRAW round trip.  (No hint: the releaser
-- cannot guess the new holder's draw.)
M.RELEASE = scripts.release_telling(DRAW_QF .. [[
local function tell(ch, token, fence)
  redis.call(string.byte(ch) == 123 and 'SPUBLISH' or 'PUBLISH', ch,
             token .. ' ' .. fence .. ' -' .. draw_qf('0'))
end
]])

--- RAISE: KEYS N:h, N:qf; ARGV token, fence.  If the token holds the lock
-- here, the counter is raised to 'fence' (never lowered); returns 1, else 0.
M.RAISE = [[
local g = redis.call('HGET', KEYS[1], ARGV[1])
if not g then return 0 end
local t = redis.call('TIME')
if tonumber(string.match(g, '^%d+')) < tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', 3600000)
end
return 1
]]

-- {========================================================== workers
-- Each server's request waits for its reply in a coroutine of its own
-- (the client pairs a reply with the coroutine that called): n of them
-- per acquisition and n per release.  They are kept once their request
-- is done and run the next one, rather than made anew: a new coroutine
-- is a lua_State, its stack grown by reallocations to the depth of a
-- request, and garbage for the collector (a fifth of a cycle's
-- instructions were in malloc, realloc and free, with one per request).
-- A worker runs one job at a time, fn(a, b, c), which must not raise
-- (the callers' jobs catch what they call); it goes back to the spare
-- list only when the job returns, so a coroutine still waiting for a
-- reply, or left waiting for good, is never handed out.

local spare, nspare, SPARE_MAX = {}, 0, 64
for i = 1, SPARE_MAX do spare[i] = false end     -- (its slots made once)

local function worker(fn, a, b, c)
  local self = running()
  while true do
    if fn then fn(a, b, c) end
    if nspare >= SPARE_MAX then return end
    -- (a spare worker holds nothing of its last job: a lock, a client,
    -- may be collected)
    fn, a, b, c = nil, nil, nil, nil     -- luacheck: ignore 311 (read by no one: let go)
    nspare = nspare + 1
    spare[nspare] = self
    -- (a resume by anyone else, who could not pass a job, runs nothing)
    repeat fn, a, b, c = co_yield() until type(fn) == "function"
  end
end

-- Runs fn(a, b, c) in a worker and returns at its first yield.
local function go(fn, a, b, c)
  local co
  if nspare > 0 then
    co = spare[nspare]
    spare[nspare] = false
    nspare = nspare - 1
    -- RE-ENTRY: a finalizer or a hook that runs between a worker's
    -- return to the list and its yield (and releases a hold) finds it
    -- running: not resumed, the job gets a new one
    if co_status(co) ~= "suspended" then co = co_create(worker) end
  else
    co = co_create(worker)
  end
  local ok, err = co_resume(co, fn, a, b, c)
  if not ok then error(err, 0) end
end

-- base.background's job in a worker: its outcomes dropped (each caller
-- says why that is safe), any other error written to stderr, as
-- base.background does (redis_lock_hub.lua, dropping_errors).
local dropping_errors = base.dropping_errors
local function quietly_release_token(lk, keys, token)
  dropping_errors(base.release_token, lk, keys, token)
end
local function background(fn, a, b) go(dropping_errors, fn, a, b) end

-- Bells: the core Semaphores (of 0) that an acquisition's caller sleeps on
-- until a quorum answers, and a release's until its answers decide it.
-- One of each per cycle, made anew, was a core lock and its userdata per
-- cycle for the collector; so a bell whose wait is over goes back to a
-- spare list and is taken again, but only when nothing can ring it any
-- more (its ringer looks at a flag that is down by then) and it holds no
-- count (a ring after a timed-out wait): a bell is never handed out with
-- a wake-up in it.  A waiter closed while asleep never gives its bell back.
local bells, nbells = {}, 0

local function take_bell()
  if nbells > 0 then
    local b = bells[nbells]
    bells[nbells] = nil
    nbells = nbells - 1
    return b
  end
  return internal(core.Semaphore.new(0))
end

local function give_bell(b)
  if nbells < SPARE_MAX and b:getValue() == 0 then
    nbells = nbells + 1
    bells[nbells] = b
  end
end

-- }==========================================================

local Redlock = { __name = "async_mutex.RedlockMutex" }
local methods = {}
Redlock.__index = methods

-- A server's lock record (redis_lock_base.new_record): never seen by users.
local Server = { __name = "async_mutex.RedlockServer" }

-- {========================================================== servers' age
-- A server restarted without persistence has forgotten the holds it had:
-- counted at once, it could give a second process a quorum while the
-- first still holds one (its leases there are reported lost only at their
-- next renewal).  So a server counts only once it has been up for ttl:
-- every lease a forgotten hold had there has ended by then (they run for
-- at most ttl from a request sent before the restart).  Its uptime is read
-- once per connection (INFO server: whole seconds, and up to a second more
-- than the time elapsed, so the latest start it allows is taken).

local function uptime_of(info)
  return tonumber(info:match("\nuptime_in_seconds:(%d+)") or info:match("^uptime_in_seconds:(%d+)"))
end

-- hrtime (ns) by which the server behind lk's connection had started;
-- false when it cannot be read (an ACL without INFO, another client
-- object): not checked.  Raises E_UNAVAILABLE.
local function started(lk)
  local hub = lk.hub
  if hub.started ~= nil then return hub.started end
  if not hub.started_gate then hub.started_gate = internal(core.Mutex.new()) end
  local _ <close> = hub.started_gate:acquire()
  if hub.closed then error(base.CLOSED, 0) end
  if hub.started == nil then
    local ok, info = pcall(lk.client.call, lk.client, "INFO", "server")
    if not ok and info == E_UNAVAILABLE then error(info, 0) end
    local up = ok and type(info) == "string" and uptime_of(info)
    hub.started = up and hrtime() - max(0, up - 1) * 1e9 or false
  end
  return hub.started
end

local function young(rl, lk)
  local s = lk.hub.started
  return s and hrtime() - s < rl.ttl * NS
end

-- }==========================================================

-- {========================================================== holds
-- A hold: the leases of the servers that granted it (server index ->
-- lease), its fence, its state.  Its releaser has the interface of a
-- Redis lock's (async_mutex.RedisReleaser).

local Hold = { __name = "async_mutex.RedisReleaser" }
local hold_methods = setmetatable({}, { __index = base.lease_methods })
Hold.__index = hold_methods

local hold_of = setmetatable({}, { __mode = "k" })   -- a server's lease -> its hold

-- How many of the leases of 'list' (by server: a lease, or with 'field'
-- a table holding one there; nil: none) are still valid by the local clock.
local function valid_in(list, n, field)
  local t, v = hrtime(), 0
  for i = 1, n do
    local l = list[i]
    if l and field then l = l[field] end
    if l and l.state == "held" and t < l.valid_until then v = v + 1 end
  end
  return v
end

-- How many of the hold's leases are still valid by the local clock.
local function valid(hold) return valid_in(hold.leases, hold.lock.n) end

local function report(err)
  io.stderr:write("async_mutex: error in onLost: ", tostring(err), "\n")
end

local function forget(hold)
  local holds = hold.lock.holds
  for i = 1, #holds do
    if holds[i] == hold then table.remove(holds, i); break end
  end
end

-- Every server's hub is in use from an attempt's start to the end of its
-- hold ('uses': the attempt's or hold's count is taken), as a Redis lock's
-- is while it is waited for or held (redis_lock_hub.lua): a server
-- whose own request ended early (withdrawn when the quorum was reached
-- elsewhere, or its lease given back) keeps its hand-off subscription,
-- rather than dropping it one loop turn later and subscribing again (a
-- round trip, and a request that asks again) at the next acquisition.
local function use_hubs(rl)
  for i = 1, rl.n do base.hub_use(rl.servers[i].hub) end
end

local function unuse_hubs(rec)
  if not rec.uses then return end
  rec.uses = false
  local rl = rec.rl or rec.lock
  for i = 1, rl.n do base.hub_unuse(rl.servers[i].hub) end
end

-- { rec }, to be closed: the uses end also when the waiting coroutine is
-- closed (coroutine.close) or raises.
local UNUSE = { __close = function(g) unuse_hubs(g[1]) end }

-- Fewer than a quorum of the hold's leases are valid: the hold ends.  Lost
-- (onLost, check() raises) unless its leases ended by their clients'
-- close().  The leases still running are let go: a lost hold is not given
-- back early (its holder, told by onLost, may still be in its section),
-- they are no longer renewed, and end in Redis with their leases or at
-- its holder's release (release_hold); after a close they are given back,
-- as the close gives back the others.
local function end_hold(hold, reason)
  if hold.state ~= "held" then return end
  local closed = true
  for _, lease in pairs(hold.leases) do
    if lease.state ~= "released" and not (lease.state == "held"
        and hrtime() < lease.valid_until) then
      closed = false
    end
  end
  hold.state = closed and "released" or "lost"
  forget(hold)
  hold.att = nil
  unuse_hubs(hold)
  for _, lease in pairs(hold.leases) do
    hold_of[lease] = nil
    if lease.state == "held" then
      if closed then background(base.release_lease, lease)
      else base.lose(lease, "expired") end
    end
  end
  local rl = hold.lock
  if not closed and rl.on_lost then
    local ok, err = pcall(rl.on_lost, { name = rl.name, fence = hold.fence, reason = reason,
                                        releaser = hold })
    if not ok then report(err) end
  end
end

-- A server's lease was lost (its local end, or Redis refused its renewal).
local function on_server_lost(info)
  local hold = hold_of[info.releaser]
  if hold and valid(hold) < hold.lock.quorum then end_hold(hold, info.reason) end
end

-- The hold as it is now: one whose quorum of valid leases is gone ends.
local function hold_now(hold)
  if hold.state == "held" and valid(hold) < hold.lock.quorum then end_hold(hold, "expired") end
  return hold
end

-- One server's release of release_hold, below, counted in 'tally'; the
-- releaser is woken once the answers decide it.
local function release_one(tally, lease)
  local ok, r = pcall(base.release_lease, lease)
  if ok and r then tally.had = tally.had + 1 else tally.refused = tally.refused + 1 end
  if tally.waiting and (tally.had >= tally.quorum or tally.n - tally.refused < tally.quorum) then
    tally.waiting = false
    tally.bell:release()
  end
end

-- Releases every server's lease at once: true if a quorum of them still
-- had it (a server that cannot be reached counts as having it: its lease
-- ends by itself); false if the hold had ended, or if so many servers no
-- longer had it that it was lost.  In a coroutine that can yield, the call
-- returns as soon as the answers decide it (a quorum either way), as an
-- acquisition returns with a quorum: the others go on in the background.
local function release_hold(hold)
  if hold_now(hold).state ~= "held" then
    -- a lost hold's leases that the servers may still have (lost by the
    -- local clock) are given back now that its holder is done, each once,
    -- as a RedisMutex's (redis_lock_lease.lua, release_lease)
    if hold.state == "lost" then
      for _, lease in pairs(hold.leases) do base.release_lease(lease) end
    end
    return false
  end
  hold.state = "released"
  forget(hold)
  local rl = hold.lock
  local list = {}
  for _, lease in pairs(hold.leases) do
    hold_of[lease] = nil
    list[#list + 1] = lease
  end
  -- The servers whose request has not answered yet: their tokens are
  -- released now, behind the request on the same connection, so that the
  -- next acquisition's request does not find this one's grant there
  -- (queued behind it, waiting for its late give-back); their answer then
  -- ends the lease here without a request (answered).
  local att = hold.att
  hold.att = nil
  if att then
    for i = 1, rl.n do
      local s = att.srv[i]
      if s and s.state == "pending" and not s.answered then
        s.given_back = true
        local lk = rl.servers[i]
        go(quietly_release_token, lk, base.keys_of(lk, rl.name), s.token)
      end
    end
  end
  -- (the hubs stay in use until the answers: a coroutine that acquires
  -- again at once keeps the subscriptions, as release_lease keeps its own)
  if not isyieldable() then
    unuse_hubs(hold)
    for i = 1, #list do base.release_lease(list[i]) end
    return true
  end
  local _ <close> = setmetatable({ hold }, UNUSE)
  local n, quorum = #list, rl.quorum
  local tally = { n = n, quorum = quorum, had = 0, refused = 0, waiting = false, bell = nil }
  for i = 1, n do go(release_one, tally, list[i]) end
  if tally.had < quorum and n - tally.refused >= quorum then
    local bell = take_bell()
    tally.bell = bell
    tally.waiting = true
    -- (woken once, by the answer that decides it: tally.waiting is down)
    repeat local _ = bell:acquire() until not tally.waiting
    give_bell(bell)
  end
  unuse_hubs(hold)
  if tally.had < quorum then
    hold.state = "lost"
    if rl.on_lost then
      local ok, err = pcall(rl.on_lost, { name = rl.name, fence = hold.fence,
                                          reason = "refused", releaser = hold })
      if not ok then report(err) end
    end
    return false
  end
  return true
end

Hold.__call = release_hold
Hold.__close = release_hold

--- releaser:check(): raises the lost error once the hold was lost; true
-- while a quorum of its servers' leases are valid, false once given back.
function hold_methods.check(hold)
  if getmetatable(hold) ~= Hold then
    return base.lease_methods.check(hold)      -- a plain lease, or the error
  end
  hold_now(hold)
  if hold.state == "lost" then error(hold.lock.lost_error, 0) end
  return hold.state == "held"
end

function Hold.__tostring(hold)
  return format("async_mutex.RedisReleaser (%s, fence %d, %s, %d of %d servers)",
    hold.lock.name, hold.fence, hold.state, valid(hold), hold.lock.n)
end

-- }==========================================================

-- {========================================================== acquire
-- One attempt: a request on every server at once, each in a coroutine of
-- its own ('srv[i]', with its state: "pending", "granted", "drawn",
-- "failed"), and the caller asleep on the attempt's bell until a quorum
-- has drawn its fence, or a quorum can no longer be had.

local TRY = setmetatable({}, { __name = "async_mutex.redlock try" })   -- a server's try failed

-- How long a partial grant may make no progress (a split, see
-- give_back_partial): jittered, so that two processes do not give up
-- together.
local function settle_ms(rl) return rl.settle * (1 + random()) end

local function ring(att)
  if att.asleep then
    att.asleep = false
    att.bell:release()
  end
end

-- The keys of a server's draw and raise: N:h and N:qf (its lock's keys'
-- seventh, made with the record).
local function fence_keys(lk) return lk.fence_keys end

local start                           -- (att, i): a request on server i

-- Ends a lease here without a request: its token's release was sent
-- after the request that granted it, on the same connection (release_hold).
local function drop(lease)
  if lease.state ~= "held" then return end
  lease.state = "released"
  base.stop_timer(lease)
  base.forget(lease)
  base.hub_unuse(lease.lock.hub)
end

-- A server's grant is no good (its draw found no hold, or failed, or the
-- server is too young): given back, and the server failed for this
-- attempt.
local function fail_server(att, s, err)
  if s.state == "failed" then return end
  s.state, s.err = "failed", err
  att.failed = att.failed + 1
  if s.lease then background(base.release_lease, s.lease) end
  s.lease = nil
  ring(att)
end

-- The servers' states.
local function counts(att)
  local drawn, granted, pending = 0, 0, 0
  for i = 1, att.rl.n do
    local st = att.srv[i].state
    if st == "drawn" then drawn = drawn + 1
    elseif st == "granted" then granted = granted + 1
    elseif st == "pending" then pending = pending + 1 end
  end
  return drawn, granted, pending
end

-- Server s drew its fence: the caller is woken when that makes a quorum
-- (it looks for a split at its own times, acquire_quorum).
local function drawn(att, s, value)
  s.draw, s.state = value, "drawn"
  if counts(att) >= att.rl.quorum then ring(att) end
end

-- A server of the hold that drew below its fence ('v', nil: drew nothing),
-- after the quorum had settled it (a late grant or draw): its counter is
-- raised to the fence in the background.  Safety does not need it (the
-- quorum has the fence), but the next grant's draws then agree, and
-- settle_fence has nothing to raise, one round trip fewer.
local function catch_up(att, i, s, v)
  local hold = att.hold
  if not hold or hold.state ~= "held" or (v and v >= hold.fence) then return end
  local lk = att.rl.servers[i]
  base.background(base.eval, lk, M.RAISE, fence_keys(lk), s.token, format("%d", hold.fence))
end

-- Draws the fence of server i's token, granted by hand-off.
local function draw(att, i, s)
  local lk = att.rl.servers[i]
  base.background(function()
    local ok, v = pcall(base.eval, lk, M.DRAW, fence_keys(lk), s.token)
    if att.srv[i] ~= s or att.done or s.state ~= "granted" then
      if ok and att.done and att.srv[i] == s and tonumber(v) ~= 0 then
        catch_up(att, i, s, tonumber(v))
      end
      return
    end
    if not ok then return fail_server(att, s, v) end
    v = tonumber(v)
    if v == 0 then return fail_server(att, s, DRAW_ENDED) end   -- its lease ended
    drawn(att, s, v)
  end)
end

-- Server i answered its request: 'lease' granted, or 'err'.  A grant on a
-- connection whose server's age is not known yet waits for it (one INFO);
-- a grant from a young server is given back.
local function answered(att, i, s, ok, lease, value)
  local rl = att.rl
  local lk = rl.servers[i]
  s.answered = true
  if s.given_back then                  -- its release went out behind it
    if ok then drop(lease) end
    return
  end
  if ok and lk.hub.started == nil and att.srv[i] == s and not att.done then
    local ok2, e = pcall(started, lk)
    if not ok2 then
      background(base.release_lease, lease)
      ok, lease = false, e
    end
  end
  if att.srv[i] ~= s or att.done then
    -- after the attempt: a grant joins the hold, or is given back
    if ok then
      local hold = att.hold
      if att.srv[i] == s and hold and hold_now(hold).state == "held" and not young(rl, lk) then
        hold.leases[i] = lease
        hold_of[lease] = hold
        catch_up(att, i, s, value and tonumber(value))
      else
        background(base.release_lease, lease)
      end
    end
    return
  end
  if not ok then return fail_server(att, s, lease) end
  if young(rl, lk) then
    background(base.release_lease, lease)
    return fail_server(att, s, YOUNG)
  end
  s.lease = lease
  s.state = "granted"
  att.progress = hrtime()
  if value then return drawn(att, s, tonumber(value)) end   -- granted at once: drawn too
  draw(att, i, s)
end

-- Server i's request of the attempt (in a worker).
local function ask_server(att, i, s)
  local rl = att.rl
  local bound                        -- nil: the attempt's caller bounds it
  if att.try then bound = false end
  local ok, lease, value, drew = pcall(base.redis_acquire, rl.servers[i], rl.name, 1, bound, TRY,
                                       s.token)
  -- the draw: made by the grant's request (M.ACQUIRE's answer), or by
  -- the release that handed the lock over (M.RELEASE's message: the
  -- value negated), else nil (another release's hand-off: DRAW)
  if ok and not drew and value and value < 0 then drew = -value end
  answered(att, i, s, ok, lease, drew)
end

function start(att, i)
  local rl = att.rl
  local lk = rl.servers[i]
  -- (the fields an answer adds, named here so that the table is made with
  -- room for them: one allocation, not two resizes per server and attempt)
  local s = { state = "pending", token = lk.hub.id .. ":" .. base.random_hex(),
              answered = nil, lease = nil, draw = nil }
  att.srv[i] = s
  if young(rl, lk) then                           -- known to be young: not asked
    s.state = "failed"
    att.failed = att.failed + 1
    s.err = YOUNG
    return
  end
  go(ask_server, att, i, s)
end

-- Ends the attempt: the servers still waiting are withdrawn (their
-- coroutines raise the cancel error and leave the Redis queues in the
-- background); unless 'keep', the grants are given back.
local function finish(att, keep)
  att.done = true
  local rl = att.rl
  rl.waiting[att] = nil
  for i = 1, rl.n do
    local s = att.srv[i]
    if s.state == "pending" then base.cancel(rl.servers[i], nil, rl.name) end
    if not keep and s.lease then
      background(base.release_lease, s.lease)
      s.lease = nil
    end
  end
end

-- The error of an attempt that cannot reach a quorum: the try's, or a
-- server's own (an eviction refusal), else E_UNAVAILABLE saying why, server
-- by server.
local function failure(att, err)
  local found, why = nil, {}
  for i = 1, att.rl.n do
    local e = att.srv[i].err
    if e == TRY then return err end
    if e ~= nil and e ~= E_UNAVAILABLE and found == nil then found = e end
    if e ~= nil then
      why[#why + 1] = format("#%d %s", i, unavailable.is(e) and e.reason or tostring(e))
    end
  end
  return found or unavailable.new(format("no quorum of %d of %d servers (%s)", att.rl.quorum,
                                         att.rl.n, table.concat(why, "; ")))
end

-- A split: this process has some servers, others have the rest, and
-- nobody may reach a quorum (each waits behind another's grant).  When a
-- partial grant has made no progress for a while (jittered, so that two
-- processes do not give up together), its grants are given back and asked
-- for again, at the tails of their queues: the servers go on to the next
-- waiters, one of which completes its quorum.


local function give_back_partial(att)
  local rl = att.rl
  for i = 1, rl.n do
    local s = att.srv[i]
    if s.state == "granted" or s.state == "drawn" then
      att.srv[i] = nil                 -- superseded: a late answer is given back
      if s.lease then background(base.release_lease, s.lease) end
      start(att, i)
    end
  end
end

-- Makes a quorum's counters hold at least 'fence' (the draws below it
-- raised); true once a quorum has it.
local function settle_fence(att, fence, deadline)
  local rl = att.rl
  local have, asked = 0, 0
  for i = 1, rl.n do
    local s = att.srv[i]
    if s.state == "drawn" then
      if s.draw == fence then
        have = have + 1
      else
        asked = asked + 1
        s.raising = true
        local lk = rl.servers[i]
        base.background(function()
          local ok, r = pcall(base.eval, lk, M.RAISE, fence_keys(lk), s.token, format("%d", fence))
          asked = asked - 1
          if ok and r == 1 then
            have = have + 1
            s.draw = fence
          else
            s.raise_failed = true
          end
          ring(att)
        end)
      end
    end
  end
  while have < rl.quorum do
    if have + asked < rl.quorum then return false end
    att.asleep = true
    if deadline then
      if not base.doze(att.bell, deadline) then att.asleep = false; return nil end
    else
      local _ = att.bell:acquire()
    end
    att.asleep = false
  end
  return true
end

-- Whether fewer than a quorum of the attempt's leases are valid by the
-- local clock: its grants are over (Redlock's validity, ttl minus the time
-- to acquire, is not positive), and the acquisition tries again.
local OVER = setmetatable({}, { __name = "async_mutex.redlock over" })
local function over(att)
  return valid_in(att.srv, att.rl.n, "lease") < att.rl.quorum
end

-- The Redis half of an acquisition, by the holder of the lock's gate:
-- 'deadline' nil (no bound), an hrtime, or false (a try).  Returns the
-- hold, or nil when it was over before it could be handed out.
local function acquire_quorum(rl, deadline, err)
  local try = deadline == false
  local att = { rl = rl, srv = {}, failed = 0, done = false, asleep = false, try = try,
                bell = take_bell(), progress = hrtime(),
                settle = settle_ms(rl) * NS }
  rl.waiting[att] = true
  use_hubs(rl)
  att.uses = true
  local _ <close> = setmetatable({ att }, UNUSE)   -- (kept by the hold on success)
  local ok, res = pcall(function()
    for i = 1, rl.n do start(att, i) end
    while true do
      local have, granted, pending = counts(att)
      if have >= rl.quorum then break end
      if rl.n - att.failed < rl.quorum or (try and pending == 0 and granted == 0) then
        error(failure(att, err), 0)
      end
      if att.canceled then error(rl.cancel_error, 0) end
      local t = hrtime()
      if deadline and t >= deadline then error(err, 0) end
      -- a partial grant that makes no progress for a while: a split,
      -- maybe.  The caller is not woken at each grant (only at a quorum):
      -- it looks every so often while it waits.
      local due = nil
      if not try then
        if t >= att.progress + att.settle then
          if have + granted > 0 then give_back_partial(att) end
          att.progress, att.settle = hrtime(), settle_ms(rl) * NS
        end
        due = att.progress + att.settle
      end
      if deadline then due = due and min(due, deadline) or deadline end
      att.asleep = true
      if due then base.doze(att.bell, due) else local _ = att.bell:acquire() end
      att.asleep = false
    end
    -- the fence: the largest drawn, held by a quorum before it is used
    local fence = 0
    for i = 1, rl.n do
      local s = att.srv[i]
      if s.state == "drawn" and s.draw > fence then fence = s.draw end
    end
    local settled = settle_fence(att, fence, deadline or nil)
    if settled == nil then error(err, 0) end
    -- (a RAISE refused because the grant ended meanwhile: over, below)
    if not settled then error(over(att) and OVER or FENCE_UNSETTLED, 0) end
    return fence
  end)
  -- (asleep down: no ring reaches the bell from here on; it goes back)
  att.asleep = false
  give_bell(att.bell)
  if not ok then
    finish(att, false)
    if res == OVER then return nil end
    error(res, 0)
  end
  -- (the attempt's uses of the hubs become the hold's)
  local hold = setmetatable({ lock = rl, leases = {}, fence = tointeger(res), state = "held",
                              uses = att.uses, att = att }, Hold)
  att.uses = false
  for i = 1, rl.n do
    local s = att.srv[i]
    if s.lease and (s.state == "drawn" or s.state == "granted") then
      hold.leases[i] = s.lease
      hold_of[s.lease] = hold
    end
  end
  att.hold = hold
  -- the next acquisition's guess of its draws, right unless another process
  -- takes the lock in between (ACQUIRE, draw_qf)
  local hint = format("%d", hold.fence + 1)
  for i = 1, rl.n do rl.servers[i].s_hint = hint end
  for i = 1, rl.n do            -- (drawn after settle_fence looked)
    local s = att.srv[i]
    if s.state == "drawn" and not s.raising and hold.leases[i] then catch_up(att, i, s, s.draw) end
  end
  finish(att, true)
  -- Clients closed by a finalizer or a hook since their grants (at an
  -- allocation above): the close gave their tokens back.  With fewer than
  -- a quorum of leases left the hold is not handed out, as redis_acquire
  -- does not hand out its own; the others are given back.  Nor is a hold
  -- whose quorum of leases is over already by the local clock (Redlock's
  -- validity, ttl minus the time to acquire, not positive: a process too
  -- slow to renew them while it waited for the quorum, or stalled since):
  -- its check() would raise at once.  It is given back, and the
  -- acquisition tries again (acquire, below).
  local left, closed = 0, false
  for _, lease in pairs(hold.leases) do
    if lease.state == "held" then left = left + 1
    elseif lease.state == "released" then closed = true end
  end
  if valid(hold) < rl.quorum then
    hold.state = "released"
    hold.att = nil
    unuse_hubs(hold)
    for _, lease in pairs(hold.leases) do
      hold_of[lease] = nil
      -- (one lost already, by its timer, is given back too: the servers
      -- may have it still, release_lease)
      if lease.state ~= "released" then background(base.release_lease, lease) end
    end
    if closed and left < rl.quorum then error(base.CLOSED, 0) end
    return nil                          -- over before it was handed out
  end
  local holds = rl.holds
  holds[#holds + 1] = hold
  return hold
end

-- }==========================================================

-- {========================================================== methods

-- The Redis locks' options but replicas (refused in M.new, below).
local KNOWN = {}
for k in pairs(base.OPTIONS) do if k ~= "replicas" then KNOWN[k] = true end end

local OPTIONS_ORDER = { "ttl", "renew", "wait_ms", "cancel_error", "lost_error",
                        "unsafe_eviction" }

--- RedlockMutex.new(clients, name [, options])
local function new(clients, name, opts)
  if type(clients) ~= "table" or getmetatable(clients) ~= nil then
    typeerror(1, "new", "array of redis clients", clients)
  end
  local n = #clients
  if n == 0 then argerror(1, "new", "array of redis clients must not be empty") end
  local seen = {}
  for i = 1, n do
    local c = clients[i]
    local ok = pcall(function()
      return checks.is_callable(c.eval) and checks.is_callable(c.subscribe)
    end) and checks.is_callable(c.eval) and checks.is_callable(c.subscribe)
    if not ok then
      typeerror(1, "new", format("client #%d: redis client", i), c)
    end
    if seen[c] then
      argerror(1, "new", format("client #%d is client #%d again (each server counts once)",
        i, seen[c]))
    end
    seen[c] = i
  end
  base.check_name(name)
  if type(opts) == "table" and opts.replicas ~= nil then
    -- A quorum of independent masters already outlives the loss of a
    -- minority of them, a failover's included (docs/redis-locks.md,
    -- "Scaling out"): WAIT on each server would add a round trip per
    -- server and guarantee nothing the quorum does not.
    argerror(3, "new", "options.replicas is not for RedlockMutex"
      .. " (its servers are independent masters: the quorum keeps a grant)")
  end
  local o = base.options_of(opts, 3, "new", nil, KNOWN)
  local rl = setmetatable(o, Redlock)
  rl.name, rl.n, rl.quorum = name, n, n // 2 + 1
  rl.clients, rl.servers, rl.holds, rl.waiting = {}, {}, {}, {}
  rl.gate = internal(core.Mutex.new(o.cancel_error))
  -- a split is given up after 10-20 ms with no progress by default (a
  -- three-hundredth of waiterTimeout, from 10 to 50 ms, then up to twice
  -- that): many hand-offs' time
  rl.settle = max(10, min(o.wait_ms // 300, 50))
  for i = 1, n do
    local so = {}
    for _, field in ipairs(OPTIONS_ORDER) do so[field] = o[field] end
    so.on_lost = on_server_lost
    rl.clients[i] = clients[i]
    local lk = base.new_record(Server, clients[i], name, 1, so, false)
    lk.acquire_script, lk.release_script = M.ACQUIRE, M.RELEASE
    lk.keys[7] = name .. ":qf"
    lk.fence_keys = { lk.keys[1], lk.keys[7] }
    lk.s_hint = "0"                   -- (ACQUIRE's hint: none yet)
    rl.servers[i] = lk
  end
  return rl
end

-- The misuse errors of a method that talks to Redis, at its caller's line.
local function check_usable(rl, what)
  for i = 1, rl.n do check_open(rl.clients[i]) end
  if not isyieldable() then usage_error(checks.cannot_yield(what)) end
end

-- How many attempts in a row may win a quorum whose leases are over
-- before it is handed out: a stall of the process is retried, but a ttl
-- shorter than the time its servers take to grant it would be retried for
-- ever (spec 194).
local OVERS_MAX = 3

-- The whole acquisition: the lock's gate (with the decorator's bound),
-- then the servers with what is left of it.
local function acquire(rl, limit, err, priority)
  local deadline = base.deadline_of(limit)
  local gate_release
  if limit == nil then gate_release = rl.gate:acquire(priority)
  else gate_release = limited(rl.gate, limit, err, priority) end
  local _ <close> = gate_release
  for attempt = 1, OVERS_MAX do
    local hold = acquire_quorum(rl, deadline, err)
    if hold then return hold end
    -- (its hold was over before it was handed out: a new attempt, unless
    -- this is a try or its bound has passed)
    if deadline == false or (deadline and hrtime() >= deadline) then error(err, 0) end
    if attempt == OVERS_MAX then
      error(unavailable.new(format("%d quorums in a row were over before they could be handed"
        .. " out (ttl %d ms): a ttl too short for these servers, or a process that stalls",
        OVERS_MAX, rl.ttl)), 0)
    end
  end
end

function methods.acquire(self, priority)
  local rl, limit, err = base.check_self(self, Redlock, "acquire")
  base.check_priority(priority, 1, "acquire")
  check_usable(rl, "acquire a Redis lock")
  local release = acquire(rl, limit, err, priority)
  return release
end

function methods.runExclusive(self, fn, priority)
  local rl, limit, err = base.check_self(self, Redlock, "runExclusive")
  base.check_fn(fn, 1)
  base.check_priority(priority, 2, "runExclusive")
  check_usable(rl, "acquire a Redis lock")
  local release <close> = acquire(rl, limit, err, priority)
  local function done(ok, ...)
    if not ok then
      release()
      error((...), 0)
    end
    if not release() and release.state == "lost" then error(rl.lost_error, 0) end
    return ...
  end
  return done(pcall(fn))
end

--- isLocked(): whether a quorum of the servers have a holder (asked of
-- every server at once; E_UNAVAILABLE when fewer than a quorum answer).
function methods.isLocked(self)
  local rl = base.check_self(self, Redlock, "isLocked")
  check_usable(rl, "ask Redis")
  local results = multi.each(rl.servers, function(lk)
    local ok, used = pcall(base.state, lk, rl.name)
    if ok then return used >= 1 and 1 or 0 end
    if used ~= E_UNAVAILABLE then error(used, 0) end
    return false
  end)
  local replied, locked = 0, 0
  for i = 1, rl.n do
    if results[i] then
      replied = replied + 1
      locked = locked + results[i]
    end
  end
  if replied < rl.quorum then
    error(unavailable.new(format("%d of %d servers answered (quorum %d)", replied, rl.n,
                                 rl.quorum)), 0)
  end
  return locked >= rl.quorum
end

--- release(): ends this process's oldest hold; false if it has none.
function methods.release(self)
  local rl = base.check_self(self, Redlock, "release")
  local hold = rl.holds[1]
  if not hold then return false end
  return release_hold(hold)
end

--- cancel(): rejects this process's waiters with the cancel error.
function methods.cancel(self)
  local rl = base.check_self(self, Redlock, "cancel")
  rl.gate:cancel()
  for att in pairs(rl.waiting) do
    att.canceled = true
    ring(att)
  end
end

--- steal(), am.query: refused (docs/redis-locks.md, "Steal"): a hold here
-- is a quorum of independent servers, and no one script can end it and
-- grant another on all of them at once; nor does one server's queue say
-- who holds.
function methods.steal(self)
  base.check_self(self, Redlock, "steal")
  usage_error("attempt to steal a Redlock mutex (its hold is on several independent servers:"
    .. " no one atomic step can end it everywhere)")
end

function Redlock.__query(self)
  base.check_self(self, Redlock, "query")
  usage_error("attempt to query a Redlock mutex (its holds and queues are on several"
    .. " independent servers)")
end

function Redlock.__tostring(rl)
  return format("async_mutex.RedlockMutex (%s, %d servers, quorum %d)", rl.name, rl.n, rl.quorum)
end

base.decorable(Redlock)

-- }==========================================================

return { RedlockMutex = { new = new } }
