--- async_mutex.debug: debug mode (am.debug; docs/debug.md).
-- Off by default; am.debug.enable([options]) or ASYNC_MUTEX_DEBUG=1 at
-- require time turns it on.  While on, the C core calls the hooks of this
-- module (src/core/debug/debug.c): after a grant is delivered, a waiter queued, a
-- releaser given back, a lock made, and before a request decides anything.
-- From them it keeps:
--  * owner records: each hold's holder coroutine, its loop time, where it
--    was acquired (am.debug.holds(), am.debug.report());
--  * a request that would close a wait-for cycle raises E_DEADLOCK at once
--    (detect: the search reads who waits for whom from the queues);
--  * lockdep's graph of lock classes, whose first cycle is reported as a
--    potential deadlock although nothing hung (lockdep);
--  * long holds (options.holdWarning), checked by an unreferenced luv timer
--    that runs only while a hold exists.
-- The core owns the queues; this module only reads them (core.dbg_*).

local uv = require "luv"
local checks = require "async_mutex.checks"

local error, ipairs, pairs, pcall, rawget, select, setmetatable, tostring, type =
  error, ipairs, pairs, pcall, rawget, select, setmetatable, tostring, type
local getinfo, traceback = debug.getinfo, debug.traceback
local getmetatable_raw = debug.getmetatable
local running, status = coroutine.running, coroutine.status
local concat, sort = table.concat, table.sort
local floor, max = math.floor, math.max
local format = string.format
local now                         -- the records' clock: core.dbg_now (install)
-- usage errors at the user's call, the first frame outside the Lua layer
-- (this file is registered as such: install)
local argerror, typeerror         -- core.argerror, core.typeerror (install)
local error_text                  -- an error object's text: core.error_text (install)

local AM_TRY = 2                  -- Request.wait of a tryAcquire (async_mutex.h)
local RW_WRITE = 2                -- an RWLock request's weight for a write

local M = {}
local core                        -- async_mutex.core (install)
local E_DEADLOCK

-- Chunks whose frames are the module's, not the user's: sites skip them.
local OWN = getinfo(1, "S").source
local OURS = { [OWN] = true }
-- Functions that take several keys in canonical order (init.lua's
-- acquireAll): keys they take together are no nesting.
local CANONICAL = {}

local opts                        -- the options while on, else nil
-- An owner record as core.dbg_records makes it (src/core/debug/debug.h: V_*; the
-- records themselves are C structs), then this module's caches.
local LOCK, REL, HOLDER, SINCE, FN, LINE, WEIGHT, WHERE, LEASED, LOCKID = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
local SITE, CANON, WARNED = 11, 13, 14
local WEAKK = { __mode = "k" }
local names = setmetatable({}, WEAKK)       -- lock or keyed set -> name
local created = setmetatable({}, WEAKK)     -- lock or keyed set -> creation site
local classof = setmetatable({}, WEAKK)     -- lock -> its class id (a cache)
-- lockdep: classes by id, edges[from][to] = edge; cycles reported, by key
local classes, nclasses = {}, 0
local edges, nedges = {}, 0
local reported = {}
local timer, timer_on             -- long holds (the state's one timer: get_timer)

-- At lua_close, a finalizer that runs after luv's loop may switch debug
-- mode: the timer is no handle then, and only the flag changes.
local function stop_timer()
  local ok, closing = pcall(timer.is_closing, timer)
  if ok and not closing then timer:stop() end
  timer_on = false
end


-- {========================================================== sites

--- The user's frame nearest to the top of the stack, from 'level' up
-- (C functions and the module's own chunks skipped): "file:line", level.
local function user_frame(level)
  level = (level or 2) + 1
  while true do
    local info = getinfo(level, "Sl")
    if not info then return "?", nil end
    if info.what ~= "C" and not OURS[info.source] then
      return info.short_src .. ":" .. info.currentline, level - 1
    end
    level = level + 1
  end
end

--- Is the request being made by one of the CANONICAL functions?
local function from_canonical()
  local level = 2
  while true do
    local info = getinfo(level, "Sf")
    if not info then return false end
    if info.what ~= "C" and info.source ~= OWN then return CANONICAL[info.func] == true end
    level = level + 1
  end
end

-- }==========================================================


-- {========================================================== locks

--- What a lock is: its kind's name (Keyed... for a key's lock), the object
-- the user holds (a key's lock: its keyed set) and the key.
local function lock_info(lock)
  local kind, value, held, queued, unlocking, key, set = core.dbg_lock(lock)
  if set ~= nil then kind = "Keyed" .. kind end
  return { kind = kind, value = value, held = held, waiters = queued + unlocking,
           key = key, set = set, object = set or lock }
end

--- A user's value in a report (a key, an error): its tostring, but a
-- __tostring that raises, yields or returns no string cannot raise here (a
-- report is made in a request, or in the long-hold timer's luv callback,
-- where an error ends the process): the shared error text
-- (src/error_text.c) calls it protected.
local function text_of(v)
  local mt = getmetatable_raw(v)
  if mt ~= nil and rawget(mt, "__tostring") ~= nil then return error_text(v) end
  return tostring(v)
end

--- A lock's name in reports: its given name, else its kind and creation site.
local function label(lock, info)
  info = info or lock_info(lock)
  local obj = info.object
  local s
  if names[obj] then s = format("%s %q", info.kind, names[obj])
  elseif created[obj] then s = info.kind .. " created at " .. created[obj]
  else s = tostring(obj) end
  if info.set ~= nil then s = s .. " key " .. text_of(info.key) end
  return s
end
M.label = label                   -- am.run's reports name locks as these do

--- Its lockdep class: a named lock's name, else its creation site, else the
-- lock itself (made before debug mode was on).  One class for all the keys of a
-- keyed set.  Returns the class id and its label.
local function class_of(lock)
  local cached = classof[lock]
  if cached then return cached end
  local info = lock_info(lock)
  local obj = info.object
  local id, lab
  if names[obj] then
    id, lab = "name:" .. names[obj], format("%s %q", info.kind, names[obj])
  elseif created[obj] then
    id = "site:" .. info.kind .. "@" .. created[obj]
    lab = info.kind .. " created at " .. created[obj]
  else
    id, lab = "object:" .. format("%p", obj), tostring(obj)
  end
  if not classes[id] then
    classes[id] = lab
    nclasses = nclasses + 1
  end
  classof[lock] = id
  return id
end

-- }==========================================================


-- {========================================================== records

--- "file:line" of a record's acquire (made lazily from its function).
local function site_of(rec)
  local site = rec[SITE]
  if not site then
    local fn = rec[FN]
    site = fn and (getinfo(fn, "S").short_src .. ":" .. tostring(rec[LINE])) or "?"
    rec[SITE] = site
  end
  return site
end

--- The records in place now (copies: what a hook does meanwhile, such as
-- a report handler that releases, cannot upset the traversal); of 'lock'
-- only, when given.  Those an unscoped release ended go (in C).
local function records(lock)
  return core.dbg_records(lock)
end
local holders_of = records

--- The records of coroutine 'co' (copies), or nil when it holds nothing.
local function held_by(co)
  local out = core.dbg_records(co)
  if out[1] == nil then return nil end
  return out
end

local function thread_traceback(co)
  if co == running() then
    local _, level = user_frame(2)
    return (traceback("", level or 2):gsub("^\n", ""))
  end
  if status(co) == "dead" then return "(dead coroutine)" end
  return (traceback(co, "", 0):gsub("^\n", ""))
end

local function describe_thread(co)
  local _, main = running()
  return format("%s (%s)", text_of(co), co == main and "main" or status(co))
end

-- }==========================================================


-- {========================================================== reports

-- Debug mode switched off meanwhile (a hook or a finalizer called disable()
-- while the report was made): no report, to stderr least of all.
local function emit(kind, text, info)
  local o = opts                  -- (a count hook may run between two lines)
  if not o then return end
  local handler = o.onReport
  if handler then
    local ok, err = pcall(handler, kind, text, info)
    if not ok then
      io.stderr:write("async_mutex.debug: error in onReport: ", text_of(err), "\n")
    end
  else
    io.stderr:write(text, "\n")
  end
end

local function indent(s, pad)
  return pad .. s:gsub("\n", "\n" .. pad)
end

--- One hold, as holds() returns it.
local function view(rec, info)
  info = info or lock_info(rec[LOCK])
  local mode
  if info.kind:find("RWLock$") then mode = rec[WEIGHT] == RW_WRITE and "write" or "read" end
  return {
    lock = info.object, kind = info.kind, key = info.key, name = label(rec[LOCK], info),
    holder = rec[HOLDER], since = rec[SINCE], where = rec[WHERE] and rec[WHERE]:gsub("^\n", "") or site_of(rec),
    site = site_of(rec), waiters = info.waiters, weight = rec[WEIGHT], mode = mode,
  }
end

--- The text of one hold: what, by whom, for how long, where.
local function hold_text(v, t)
  local lines = {
    format("%s%s held for %d ms by %s, %d waiting", v.name,
      v.mode and " (" .. v.mode .. ")" or "", floor(t - v.since),
      describe_thread(v.holder), v.waiters),
    "  acquired at " .. (v.where == v.site and v.site or v.site .. "\n" .. indent(v.where, "    ")),
    "  holder now:\n" .. indent(thread_traceback(v.holder), "    "),
  }
  return concat(lines, "\n")
end

-- }==========================================================


-- {========================================================== long holds

local function check_long()
  local o = opts
  local limit = o and o.holdWarning
  if not limit then                   -- switched off or on anew meanwhile
    if timer_on then stop_timer() end
    return
  end
  local t = now()
  for _, rec in ipairs(records()) do
    if opts ~= o then break end       -- switched meanwhile (emit, a hook)
    if not rec[WARNED] and t - rec[SINCE] >= limit then
      core.dbg_warned(rec[REL])
      local v = view(rec)
      emit("long-hold", "async_mutex.debug: long hold (over " .. limit .. " ms): "
        .. hold_text(v, t), v)
    end
  end
end

--- The long-hold timer: one per Lua state, kept in the registry and never
-- closed by us (only stopped), so that no copy of this module can drop it
-- while luv still has it in its loop (a handle collected there is freed
-- under libuv's feet).  One that someone else closed (uv.walk) is replaced,
-- and kept referenced too.
local REG = debug.getregistry()
local TIMER_KEY = "async_mutex.debug timer"

local function get_timer()
  local t = REG[TIMER_KEY]
  if not t or t:is_closing() then
    if t then
      local old = REG[TIMER_KEY .. "s closed"] or {}
      old[#old + 1] = t
      REG[TIMER_KEY .. "s closed"] = old
    end
    t = uv.new_timer()
    t:unref()                     -- never keeps uv.run() going
    REG[TIMER_KEY] = t
  end
  return t
end

-- get_timer may allocate (finalizers) and call luv (hooks): what they
-- switched counts, read after it.
local function start_timer()
  local t = get_timer()
  local o = opts
  local hw = o and o.holdWarning
  if not hw then return end
  timer = t
  local every = max(1, floor(hw / 4))
  timer_on = true
  timer:start(every, every, check_long)
end

-- }==========================================================


-- {========================================================== deadlocks

--- A record that may keep a member of a doomed set waiting: not leased (a
-- leased hold ends by itself, docs/lockkinds.md, Leases: whoever waits for
-- it is let in at its lease's end at the latest).
local function binding(rec) return not rec[LEASED] end

--- What the search knows of a lock members wait for or hold: how many
-- wait for it, the members waiting for it ('nodes'), and what the members
-- still doomed hold of it ('inside': records, their weight, and RWLock
-- writes among them).
local function lock_facts(lock)
  local _, _, _, queued, unlocking = core.dbg_lock(lock)
  return { waiters = queued + unlocking, nodes = {}, inside = 0, inside_w = 0, writers = 0 }
end

--- Could a request for 'weight' of 'lock' (facts 'f') be granted once every
-- holder not doomed has given back?  The rule is C's (src/core/debug/debug_deadlock.c,
-- fits_outside), which the request hook applies too.
local function could_fit(lock, f, weight)
  return core.dbg_fits(lock, weight, f.inside, f.inside_w, f.writers)
end

--- The coroutines a request of 'R' for (lock, weight) at 'priority' would
-- leave waiting for ever, R first, or nil (docs/debug.md, Deadlocks): the
-- greatest set of waiting coroutines (R among them, as if it waited) none
-- of which can be granted on the releases of the holders outside the set.
-- 'held': R's records; 'behind': someone would be queued behind R's
-- request (src/core/debug/debug_deadlock.c, served_after).
--
-- Every earlier request that could wait was searched too, so no such set
-- exists before R's: one that R's request makes holds R and only
-- coroutines that wait for R, directly or through others.  So the search starts from R and
-- follows "waits for" backwards (who waits for a lock a member holds, who
-- would be queued behind R), never through every waiter ahead: a request
-- that nobody waits for costs a few reads, however long the queues.
local function doomed_set(R, lock, weight, unlock, priority, held, behind)
  local facts, queues = {}, {}
  local function facts_of(l)
    local f = facts[l]
    if not f then f = lock_facts(l); facts[l] = f end
    return f
  end
  local function queue_of(l)            -- one copy per lock: one order
    local q = queues[l]
    if not q then q = core.dbg_queue(l); queues[l] = q end
    return q
  end
  -- node: { id =, lock =, weight =, prio =, unlock =, index = (queued),
  -- recs = (its binding records) }
  local nodes, order, all_added = {}, {}, {}
  local function add(id, l, w, prio, unl, index)
    local n = { id = id, lock = l, weight = w, prio = prio, unlock = unl, index = index }
    nodes[id] = n
    order[#order + 1] = n
    local f = facts_of(l)
    f.nodes[#f.nodes + 1] = n
  end
  -- the waiters of 'l' (every one, or those served after R's request)
  local function add_waiters(l, after_R)
    if not after_R then all_added[l] = true end
    for j, e in ipairs(queue_of(l)) do
      local id = e[1] or e
      if not nodes[id] and (not after_R
          or (e[4] and not (e[3] > priority)) or (not e[4] and e[3] < priority)) then
        add(id, l, e[2], e[3], e[4], j)
      end
    end
  end
  add(R, lock, weight, priority, unlock, nil)
  if behind then add_waiters(lock, true) end
  local i = 1
  while i <= #order do
    local n = order[i]
    local recs = {}
    local all = n.id == R and held or (type(n.id) == "thread" and records(n.id)) or {}
    for _, rec in ipairs(all) do
      if binding(rec) then
        recs[#recs + 1] = rec
        local l = rec[LOCK]
        if not all_added[l] and facts_of(l).waiters > 0 then add_waiters(l, false) end
      end
    end
    n.recs = recs
    i = i + 1
  end
  -- What the members hold of the locks members wait for; and each
  -- member's predecessor: the member the grant rule serves last before it
  -- (docs/semantics.md, Dispatch): an acquirer's, the member acquirer
  -- before it; a waitForUnlock's, the last member acquirer of an equal or
  -- higher priority.  Served only once its predecessor is (which was
  -- served once its own was), a member waits for every member ahead.
  for _, n in ipairs(order) do
    for _, rec in ipairs(n.recs) do
      local f = facts[rec[LOCK]]
      if f and f.nodes[1] then
        f.inside = f.inside + 1
        f.inside_w = f.inside_w + rec[WEIGHT]
        if rec[WEIGHT] == RW_WRITE then f.writers = f.writers + 1 end
      end
    end
  end
  for l, f in pairs(facts) do
    local acq, unl = {}, {}
    for _, n in ipairs(f.nodes) do
      if n.unlock then unl[#unl + 1] = n else acq[#acq + 1] = n end
    end
    if l == lock and not unlock and #acq > 1 then
      -- R's place once queued: after every acquirer of its priority or above
      local at = 0.5
      for j, e in ipairs(queue_of(l)) do
        if not e[4] and e[3] >= priority then at = j + 0.5 end
      end
      nodes[R].index = at
      sort(acq, function(a, b) return a.index < b.index end)
    end
    for k, n in ipairs(acq) do
      n.pred = acq[k - 1]
      if k > 1 then acq[k - 1].next = { n } end
    end
    for _, n in ipairs(unl) do
      for k = #acq, 1, -1 do
        local p = acq[k]
        if p.prio >= n.prio then
          n.pred = p
          p.next = p.next or {}
          p.next[#p.next + 1] = n
          break
        end
      end
    end
    f.acq, f.unl, f.head = acq, unl, 1
  end
  -- Every member doomed; clear one whose predecessor is clear and whose
  -- request fits once the holders not doomed give back.  What it holds then
  -- counts as outside: of each such lock, the first member acquirer still
  -- doomed (only it can be served next) and the waitForUnlock members are
  -- looked at again; and so are the members it was served before.
  local doomed = {}
  for _, n in ipairs(order) do doomed[n.id] = true end
  local work = {}
  for k = #order, 1, -1 do work[#work + 1] = order[k] end
  local w = #work
  local function push(n)
    if n and doomed[n.id] then w = w + 1; work[w] = n end
  end
  while w > 0 do
    local n = work[w]
    work[w] = nil
    w = w - 1
    if doomed[n.id] and not (n.pred and doomed[n.pred.id])
        and could_fit(n.lock, facts[n.lock], n.weight) then
      if n.id == R then return nil end
      doomed[n.id] = nil
      for _, rec in ipairs(n.recs) do
        local f = facts[rec[LOCK]]
        if f and f.nodes[1] then
          f.inside = f.inside - 1
          f.inside_w = f.inside_w - rec[WEIGHT]
          if rec[WEIGHT] == RW_WRITE then f.writers = f.writers - 1 end
          while f.acq[f.head] and not doomed[f.acq[f.head].id] do f.head = f.head + 1 end
          push(f.acq[f.head])
          for _, m in ipairs(f.unl) do push(m) end
        end
      end
      for _, m in ipairs(n.next or {}) do push(m) end
    end
  end
  -- the members, each with the nearest doomed member it is queued behind
  local members = {}
  for _, n in ipairs(order) do
    if doomed[n.id] and type(n.id) == "thread" then
      local p = n.pred
      local behind_of = p and doomed[p.id] and type(p.id) == "thread" and { p.id } or {}
      members[#members + 1] = { coroutine = n.id, lock = n.lock, behind = behind_of }
    end
  end
  return members, doomed, facts
end

--- Has nothing a search read changed since: no record made or ended
-- (core.dbg_count's epoch), no waiter come or gone on a lock it read?
local function unchanged(epoch, facts)
  for l, f in pairs(facts) do
    local _, _, _, queued, unlocking = core.dbg_lock(l)
    if queued + unlocking ~= f.waiters then return false end
  end
  return select(2, core.dbg_count()) == epoch
end

local function deadlock_report(R, lock, members, doomed)
  local lines = { format("async_mutex.debug: deadlock: %s requested %s and would wait for ever",
    describe_thread(R), label(lock)) }
  local info = { kind = "deadlock", lock = lock_info(lock).object, requester = R, cycle = {} }
  for n, m in ipairs(members) do
    local holders = {}
    for _, rec in ipairs(holders_of(m.lock)) do
      if doomed[rec[HOLDER]] and binding(rec) then
        holders[#holders + 1] = format("%s (acquired at %s)", describe_thread(rec[HOLDER]), site_of(rec))
      end
    end
    local tb = thread_traceback(m.coroutine)
    local behind = {}
    for k, co in ipairs(m.behind) do behind[k] = describe_thread(co) end
    lines[#lines + 1] = format("  %d. %s %s %s, held by %s%s", n, describe_thread(m.coroutine),
      m.coroutine == R and "requests" or "waits for", label(m.lock),
      #holders > 0 and concat(holders, ", ") or "none of them",
      #behind > 0 and ", queued behind " .. concat(behind, ", ") or "")
    lines[#lines + 1] = indent(tb, "     ")
    info.cycle[n] = { coroutine = m.coroutine, lock = lock_info(m.lock).object,
                      key = lock_info(m.lock).key, traceback = tb }
  end
  return concat(lines, "\n"), info
end

-- }==========================================================


-- {========================================================== lockdep

--- A path of edges from class 'from' to class 'to', or nil.
local function path(from, to)
  local seen = { [from] = true }
  local function dfs(c, acc)
    for nxt, e in pairs(edges[c] or {}) do
      if not seen[nxt] then
        seen[nxt] = true
        acc[#acc + 1] = e
        if nxt == to or dfs(nxt, acc) then return true end
        acc[#acc] = nil
      end
    end
    return false
  end
  local acc = {}
  if from == to then return acc end
  if dfs(from, acc) then return acc end
  return nil
end

local function edge_line(e)
  return format("  %s (acquired at %s)\n    -> %s (acquired at %s)",
    classes[e.from], e.from_site, classes[e.to], e.to_site)
end

local function report_once(key, kind, text, info)
  if reported[key] then return end
  reported[key] = true
  emit(kind, text, info)
end

--- A record of 'co' of class 'ca' (on a lock other than 'lockid', and not
-- taken by acquireAll when 'plain'), for a report's sites: read only when
-- an edge is new or a report made.
local function record_of(co, ca, lockid, plain)
  for _, rec in ipairs(records(co)) do
    if rec[LOCKID] ~= lockid and not (plain and rec[CANON])
        and class_of(rec[LOCK]) == ca then
      return rec
    end
  end
end

--- The request of the running coroutine 'co' for 'lock' (its records name
-- it 'lockid'), after class 'ca' held as 'rec' (nil: read it if needed).
local function follow(co, lock, lockid, ca, cb, rec, canonical)
  if ca == cb then
    if reported["nest:" .. cb] then return end
    rec = rec or record_of(co, ca, lockid, canonical)
    if not rec then return end
    local site = (user_frame(3))
    local binfo = lock_info(lock)
    local what = binfo.set ~= nil
      and "two keys of one keyed lock taken by separate nested acquires (use acquireAll)"
      or "two locks of one class taken nested (name them apart if their order is fixed)"
    report_once("nest:" .. cb, "inversion", format(
      "async_mutex.debug: possible deadlock: %s\n  %s: %s (acquired at %s)\n  then %s (acquired at %s)",
      what, classes[cb], label(rec[LOCK]), site_of(rec), label(lock, binfo), site),
      { kind = "inversion", classes = { classes[cb] }, sites = { site_of(rec), site } })
  elseif not (edges[ca] and edges[ca][cb]) then
    rec = rec or record_of(co, ca, lockid)
    if not rec then return end
    local back = path(cb, ca)
    local e = { from = ca, to = cb, from_site = site_of(rec), to_site = (user_frame(3)) }
    edges[ca] = edges[ca] or {}
    edges[ca][cb] = e
    nedges = nedges + 1
    if back then
      local cycle = { e }
      for _, b in ipairs(back) do cycle[#cycle + 1] = b end
      local ids, lines, sites = {}, {}, {}
      for n, cy in ipairs(cycle) do
        ids[n] = cy.from
        lines[n] = edge_line(cy)
        sites[n] = { from = classes[cy.from], to = classes[cy.to],
                     from_site = cy.from_site, to_site = cy.to_site }
      end
      sort(ids)
      report_once("cycle:" .. concat(ids, "\0"), "inversion",
        "async_mutex.debug: possible deadlock: lock order inversion (lockdep), "
        .. "locks taken in a cycle of orders:\n" .. concat(lines, "\n"),
        { kind = "inversion", edges = sites })
    end
  end
end

-- A coroutine that holds more than SMALL records: the classes it holds as
-- lockdep last counted them, memo[co] = { n = records counted, s = the
-- newest one's serial, [class] = { l1 = a lock's id, multi = records on
-- another lock too, p1, pmulti = the same of those not taken by
-- acquireAll } }.  Lock ids are light userdata: the cache keeps nothing
-- alive.
local SMALL = 8
local memo = setmetatable({}, WEAKK)

--- Adds records 'recs' to the count 'm'.
local function count(m, recs)
  for _, rec in ipairs(recs) do
    local ca, id = class_of(rec[LOCK]), rec[LOCKID]
    local c = m[ca]
    if not c then
      c = {}
      m[ca] = c
    end
    if not c.l1 then c.l1 = id elseif c.l1 ~= id then c.multi = true end
    if not rec[CANON] then
      if not c.p1 then c.p1 = id elseif c.p1 ~= id then c.pmulti = true end
    end
  end
  m.n = m.n + #recs
end

--- The running coroutine 'co' requests 'lock' ('lockid').  For each class
-- it holds (not by the lock requested itself): the edge to the lock's
-- class, or a report of two of one class taken nested.  A coroutine that
-- holds many locks is looked at by class: counted again only from the
-- records made since the last count, while none ended (core.dbg_held_count;
-- the core ends a record as its grant ends, so counts that add up hold
-- only live ones).  Each acquire read every record: a coroutine taking n
-- locks one by one paid n^2/2 (acquireAll of 2,000 keys: 187 times its
-- instructions with debug mode off; spec 147).
local function lockdep(co, lock, lockid)
  local cb = class_of(lock)
  local m = memo[co]
  local total, newer, serial = core.dbg_held_count(co, m and m.s)
  if total <= SMALL then
    memo[co] = nil
    local canonical
    for _, rec in ipairs(records(co)) do
      if rec[LOCKID] ~= lockid then
        local ca = class_of(rec[LOCK])
        if ca ~= cb then follow(co, lock, lockid, ca, cb, rec)
        elseif not reported["nest:" .. cb] then     -- (frames read once)
          if canonical == nil then canonical = from_canonical() end
          if not (canonical and rec[CANON]) then follow(co, lock, lockid, ca, cb, rec) end
        end
      end
    end
    return
  end
  if m and total == m.n + newer then
    if newer > 0 then count(m, core.dbg_records(co, newer)) end
  else
    m = { n = 0 }
    memo[co] = m
    count(m, records(co))
  end
  m.s = serial
  for ca, c in pairs(m) do
    if type(c) == "table" then
      if ca ~= cb then
        follow(co, lock, lockid, ca, cb)
      elseif not reported["nest:" .. cb] then
        local canonical = from_canonical()
        if canonical then
          if c.pmulti or (c.p1 and c.p1 ~= lockid) then
            follow(co, lock, lockid, ca, cb, nil, true)
          end
        elseif c.multi or c.l1 ~= lockid then
          follow(co, lock, lockid, ca, cb)
        end
      end
    end
  end
end

-- }==========================================================


-- {========================================================== hooks
-- Called by the C core (src/core/debug/debug.c), in this order in the table.

-- Each hook first checks that debug mode is on still: a "c" hook at its
-- call may have switched it off.
local function on_request(lock, weight, unlock, would_wait, wait, priority, behind, lockid)
  local o = opts
  if wait == AM_TRY or not o then return end            -- never waits: never deadlocks
  local co = running()
  if not unlock then lockdep(co, lock, lockid) end
  if would_wait then
    -- The search and the report run Lua, and so maybe a count hook or a
    -- finalizer at an allocation, which may let a member in after the
    -- search read its queue (a release, a cancel, a coroutine closed):
    -- the request would then be served, yet raised E_DEADLOCK (spec 148).
    -- So a deadlock stands only if nothing it read changed meanwhile;
    -- else the search is made again.  One that never settles lets the
    -- request wait, as it would with debug mode off.
    for _ = 1, 4 do
      local epoch = select(2, core.dbg_count())
      local members, doomed, facts = doomed_set(co, lock, weight, unlock, priority,
                                                held_by(co) or {}, behind)
      -- switched off (or on anew) meanwhile: what the search read may be
      -- half gone; the request waits as it would with debug mode off
      if not members or opts ~= o then return end
      -- (changed during the search already: searched again before the
      -- report, whose tracebacks cost more than the search)
      if unchanged(epoch, facts) then
        local text, info = deadlock_report(co, lock, members, doomed)
        -- (switched off while the report was made: decided, still raised;
        -- emit drops the report)
        if opts ~= o or unchanged(epoch, facts) then
          emit("deadlock", text, info)
          error(E_DEADLOCK, 0)
        end
      end
    end
  end
end

-- The record was made by the C core (src/core/debug/debug.c); this runs for a key's
-- lock ('keyed': was it taken by acquireAll? the record keeps the answer)
-- and while long holds are checked.
local function on_granted(keyed)
  local o = opts
  local hw = o and o.holdWarning
  if hw and not timer_on then start_timer() end
  if keyed then return from_canonical() end
end

-- The last record ended (src/core/debug/debug.c): the check stops.
local function on_released()
  if timer_on then stop_timer() end
end

local function on_created(obj)
  created[obj] = (user_frame())
end

--- The table core.debug() takes (src/core/debug/debug.h: its layout): the hooks, the
-- flags.
local function hook_table(o)
  return { on_request, on_granted, on_released, on_created,
           o.traceback,
           o.holdWarning ~= nil }           -- the Lua hooks have work
end

-- }==========================================================


-- {========================================================== the API

local function no_arguments(fname, ...)
  if select("#", ...) > 0 then typeerror(1, fname, "no argument", (...)) end
end

--- The lock object at argument 1 of 'fname' (a decorated lock's lock), or
-- raises.
local function check_lock(fname, v)
  local what, inner = core.dbg_kind(v)
  if what == "decorated" then return inner end
  if what == nil then
    local name = checks.typename(v)
    -- a Redis lock is one, but its holders are in Redis (docs/api.md, Debugging
    -- a hang): say so rather than "async_mutex lock expected"
    if checks.REDIS_LOCKS[name] then
      argerror(1, fname, "debug mode watches the local locks, not a Redis lock, got " .. name)
    end
    typeerror(1, fname, "async_mutex lock", v)
  end
  return v
end

local function clear()
  classes, nclasses, edges, nedges, reported = {}, 0, {}, 0, {}
  memo = setmetatable({}, WEAKK)
  if timer then stop_timer() end
end

-- Every option enable knows: a misspelt one (`tracebak`) is an error.
local MAX_MS = 2 ^ 40
local OPTIONS = { traceback = true, holdWarning = true, onReport = true }

--- enable([options]): debug mode on.  options.traceback: capture a traceback
-- at each grant; options.holdWarning: ms after which a hold is reported
-- (once); options.onReport(kind, text, info): who hears reports (default:
-- stderr).  Enabling again replaces the options and keeps the records.
function M.enable(options)
  if options ~= nil and type(options) ~= "table" then
    typeerror(1, "enable", "table", options)
  end
  options = options or {}
  local unknown = checks.unknown_option(options, OPTIONS)
  if unknown then argerror(1, "enable", unknown) end
  local hw = options.holdWarning
  if hw ~= nil and (type(hw) ~= "number" or not (hw > 0)) then
    argerror(1, "enable", "holdWarning must be a positive number of ms")
  end
  -- the check's luv timer takes whole ms below 2^63 (holdWarning / 4):
  -- refused here, at the caller's line, rather than by every grant's hook;
  -- the bound is the Redis locks' and client's (2^40 ms, about 34 years)
  if hw ~= nil and hw > MAX_MS then
    argerror(1, "enable", "holdWarning must be at most 2^40")
  end
  local tb = options.traceback
  if tb ~= nil and type(tb) ~= "boolean" then
    argerror(1, "enable", "traceback must be a boolean")
  end
  local on = options.onReport
  if on ~= nil and not checks.is_callable(on) then
    argerror(1, "enable", "onReport must be a function")
  end
  local o = { traceback = tb == true, holdWarning = hw, onReport = on }
  opts = o
  core.debug(hook_table(o))
  -- a finalizer run by those allocations may have switched it off (or on
  -- with other options): this call came last, its options stand
  opts = o
  if timer_on and not hw then stop_timer()
  elseif hw and core.dbg_count() > 0 then start_timer() end
end

--- disable(): debug mode off; every record and lockdep's graph are dropped.
function M.disable(...)
  no_arguments("disable", ...)
  core.debug(nil)
  opts = nil
  clear()
end

--- isEnabled(): whether debug mode is on.
function M.isEnabled(...)
  no_arguments("isEnabled", ...)
  return opts ~= nil
end

--- name(lock, name): names a lock (or keyed set) in reports; a named lock is
-- its own lockdep class.  Returns the lock.
function M.name(lock, name)
  local obj = check_lock("name", lock)
  if type(name) ~= "string" then
    typeerror(2, "name", "string", name)
  end
  names[obj] = name
  classof = setmetatable({}, WEAKK)
  memo = setmetatable({}, WEAKK)            -- counted by the old classes
  return lock
end

--- holds([lock]): the holds in place, oldest first, as plain tables; of one
-- lock (or keyed set) only when given.
function M.holds(lock)
  local only = lock ~= nil and check_lock("holds", lock) or nil
  local out = {}
  for _, rec in ipairs(records()) do
    local info = lock_info(rec[LOCK])
    if only == nil or info.object == only then out[#out + 1] = view(rec, info) end
  end
  sort(out, function(a, b)
    if a.since ~= b.since then return a.since < b.since end
    return a.site < b.site
  end)
  return out
end

--- report([lock]): the text a person reads when the server hangs.
function M.report(lock)
  if lock ~= nil then check_lock("report", lock) end
  local t = now()
  local list = M.holds(lock)
  local lines = { format("async_mutex debug report (debug mode %s, clock %d ms): %d hold%s",
    opts and "on" or "off", floor(t), #list, #list == 1 and "" or "s") }
  for _, v in ipairs(list) do lines[#lines + 1] = hold_text(v, t) end
  lines[#lines + 1] = format("lockdep: %d classes, %d edges", nclasses, nedges)
  return concat(lines, "\n")
end

-- }==========================================================


--- install(am, core, source, canonical): am.debug and am.E_DEADLOCK; the
-- layer's chunk 'source' and its functions 'canonical' (acquireAll's).
function M.install(am, c, source, canonical)
  core = c
  now = c.dbg_now
  argerror, typeerror = c.argerror, c.typeerror
  c.layer(OWN, {})
  error_text = c.error_text
  E_DEADLOCK = c.E_DEADLOCK
  OURS[source] = true
  for _, f in ipairs(canonical) do CANONICAL[f] = true end
  am.E_DEADLOCK = E_DEADLOCK
  am.debug = {
    enable = M.enable, disable = M.disable, isEnabled = M.isEnabled,
    name = M.name, holds = M.holds, report = M.report,
  }
  local env = os.getenv("ASYNC_MUTEX_DEBUG")
  if env ~= nil and env ~= "" and env ~= "0" and not opts then M.enable() end
  return am.debug
end

return M
