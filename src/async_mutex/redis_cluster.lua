--- async_mutex.redis_cluster: a Redis Cluster client made of one ordinary
-- client (async_mutex.redis) per node, so that each node's calls keep
-- their pipelining.  redis.connect{cluster = {...}} makes it; it has the
-- client's API (call, eval, subscribe, ssubscribe, pending, close) and
-- routes each command by the slot of its keys.  See docs/redis.md,
-- "Cluster".

local am = require "async_mutex"
local rcore = require "async_mutex.redis_core"
local redis_internal = require("async_mutex.redis")._internal
local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error

local error, getmetatable, ipairs, pairs, pcall, select, setmetatable, tostring, type =
  error, getmetatable, ipairs, pairs, pcall, select, setmetatable, tostring, type
local running, isyieldable, cocreate, coresume = coroutine.running, coroutine.isyieldable,
  coroutine.create, coroutine.resume
local mtype, lower, upper, format = math.type, string.lower, string.upper, string.format
local typeerror = checks.typeerror
local argerror, unknown_option = checks.argerror, checks.unknown_option

local unavailable = rcore.hooks.unavailable
local is_unavailable = require("async_mutex.unavailable").is
local ERROR_MT = getmetatable(rcore.error("ERR x"))

local M = {}

local NSLOTS = 16384
-- Redirections (MOVED, ASK) one call follows before it gives up: a slot
-- moves once per resharding step, so more means nodes that disagree.
local MAX_REDIRECTS = 16
-- CLUSTERDOWN and TRYAGAIN (a slot being migrated, a failover under
-- way) are retried after 25, 50, 100, ... ms, this many times (about 3 s).
local MAX_RETRIES = 7


-- {========================================================== slots
-- A key's slot: CRC16 (XMODEM) of its hash tag (the part between the
-- first '{' and the next '}' when it is not empty), or of the key, mod
-- 16384, as the Redis Cluster specification defines it.  In C
-- (src/redis/slot.c): every command and every lock script needs it, and
-- the CRC in Lua cost about half of a keyed lock cycle's Lua work.
local keyslot = rcore.keyslot
M.keyslot = keyslot

-- An argument as the client sends it (src/redis/call.c, argstring):
-- integers in decimal, floats with %.15g, or %.17g when that loses bits.
local function argtext(v)
  if type(v) == "string" then return v end
  if mtype(v) == "integer" then return tostring(v) end
  local s = format("%.15g", v)
  if tonumber(s) ~= v then s = format("%.17g", v) end
  return s
end
-- }==========================================================


-- {========================================================== nodes

local Cluster = { __name = "async_mutex.redis.ClusterClient" }
Cluster.__index = Cluster

local function check_cluster(self, fname)
  if getmetatable(self) ~= Cluster then
    typeerror(1, fname, "async_mutex.redis.ClusterClient", self)
  end
end

-- The misuse checks every method shares, at its caller's line.
local function check_usable(self, fname, act)
  check_cluster(self, fname)
  if self.closed then usage_error(checks.CLOSED_CLIENT) end
  local _, main = running()
  if main or not isyieldable() then usage_error("attempt to " .. act .. " outside a coroutine") end
end

-- The ordinary client of the node at addr ("host:port"), made at its
-- first use with the cluster's options.
local function node(self, addr)
  local c = self.nodes[addr]
  if c then return c end
  local host, port = addr:match("^(.*):(%d+)$")
  local opts = {}
  for k, v in pairs(self.options) do opts[k] = v end
  opts.host, opts.port = host, tonumber(port)
  c = self.redis.connect(opts)
  -- (a name resolves in a coroutine, where another caller may have made it)
  if self.nodes[addr] then c:close() return self.nodes[addr] end
  if self.closed then c:close() error(unavailable("client closed"), 0) end
  self.nodes[addr], self.addr_of[c] = c, addr
  return c
end

-- The address a node reports (CLUSTER SHARDS, SLOTS, MOVED): an empty or
-- unknown ("?") host means the host of the node that answered.
local function address(host, port, from)
  if host == nil or host == "" or host == "?" then host = from:match("^(.*):%d+$") end
  return host .. ":" .. tostring(port)
end

-- Reads CLUSTER SHARDS (Redis 7) into slots and masters: a flat list of
-- shards, each { "slots", {from, to, ...}, "nodes", {{"id", .., "ip", ..,
-- "port", .., "role", .., "health", ..}, ...} }.
local function read_shards(reply, from, slots, masters)
  for _, shard in ipairs(reply) do
    local f = {}
    for i = 1, #shard, 2 do f[shard[i]] = shard[i + 1] end
    local master
    for _, n in ipairs(f.nodes or {}) do
      local nf = {}
      for i = 1, #n, 2 do nf[n[i]] = n[i + 1] end
      if nf.role == "master" and nf.health ~= "fail" then
        master = address(nf.ip or nf.endpoint, nf.port or nf["tls-port"], from)
      end
    end
    local ranges = f.slots or {}
    if master and #ranges > 0 then
      masters[#masters + 1] = master
      for i = 1, #ranges, 2 do
        for s = ranges[i], ranges[i + 1] do slots[s] = master end
      end
    end
  end
end

-- Reads CLUSTER SLOTS (before Redis 7): { {from, to, {ip, port, id}, replicas...}, ... }.
local function read_slots(reply, from, slots, masters)
  local seen = {}
  for _, range in ipairs(reply) do
    local m = range[3]
    local master = address(m[1], m[2], from)
    if not seen[master] then
      seen[master] = true
      masters[#masters + 1] = master
    end
    for s = range[1], range[2] do slots[s] = master end
  end
end

local function is_error(err, code)
  return getmetatable(err) == ERROR_MT and (code == nil or err.code == code)
end

-- The addresses to ask for the map: the masters known, then the seeds.
local function candidates(self)
  local list, seen = {}, {}
  for _, a in ipairs(self.order) do
    if not seen[a] then seen[a] = true; list[#list + 1] = a end
  end
  for _, a in ipairs(self.seeds) do
    if not seen[a] then seen[a] = true; list[#list + 1] = a end
  end
  return list
end

-- Asks the nodes, one after the other, for the slot map, until one
-- answers: any seed may be down.  Raises E_UNAVAILABLE with the last
-- node's reason when none does.
local function load_map(self)
  local last = "no node to ask"
  for _, addr in ipairs(candidates(self)) do
    local ok, c = pcall(node, self, addr)
    if not ok then
      last = ("%s: %s"):format(addr, rcore.error_text(c))
    else
      local slots, masters = {}, {}
      local okr, reply = pcall(c.call, c, "CLUSTER", "SHARDS")
      if okr then
        read_shards(reply, addr, slots, masters)
      elseif is_error(reply) then           -- before Redis 7: no SHARDS
        okr, reply = pcall(c.call, c, "CLUSTER", "SLOTS")
        if okr then read_slots(reply, addr, slots, masters) end
      end
      if self.closed then error(unavailable("client closed"), 0) end
      if okr and #masters > 0 then
        -- the masters in the order of their first slots
        local order, seen = {}, {}
        for i = 0, NSLOTS - 1 do
          local a = slots[i]
          if a and not seen[a] then seen[a] = true; order[#order + 1] = a end
        end
        self.slots, self.order = slots, order
        self.epoch = self.epoch + 1
        return
      end
      last = okr and ("%s serves no slot"):format(addr)
        or ("%s: %s"):format(addr, rcore.error_text(reply))
    end
  end
  error(unavailable("no node of the cluster gave its slots (" .. last .. ")"), 0)
end

-- Loads the slot map again, once for every caller that saw the map of
-- `epoch` (those who come while one loads wait for it; those who saw an
-- older map than the current one have theirs already).
local function refresh(self, epoch)
  local release = self.gate:acquire()
  local ok, err = true, nil
  if self.epoch == epoch and not self.closed then ok, err = pcall(load_map, self) end
  release()
  if not ok then error(err, 0) end
end

-- A refresh in the background: after a MOVED (the calls retry at once
-- on the address it gives) and after a lost node (a failover may have
-- moved its slots).  One at a time.
local function refresh_later(self)
  if self.refreshing or self.closed then return end
  self.refreshing = true
  local epoch = self.epoch
  am.spawn(function()
    pcall(refresh, self, epoch)
    self.refreshing = false
  end)
end

-- The client of the master of slot (nil: any master).
local function master_of(self, slot)
  if #self.order == 0 then refresh(self, self.epoch) end
  local addr
  if slot then
    addr = self.slots[slot]
    if not addr then refresh(self, self.epoch) addr = self.slots[slot] end
  end
  -- no slot, or a slot no master serves now (the node asked answers
  -- CLUSTERDOWN, or MOVED once one does): any master
  if not addr then
    local masters = self.order
    addr = masters[math.random(#masters)]
  end
  return node(self, addr)
end
-- }==========================================================


-- {========================================================== routing

-- Sends ASKING, then the command fn(c) sends, on c, back to back: the
-- flag ASKING sets lasts for the connection's next command only, and c
-- is shared by every coroutine that calls.  ASKING is sent from a
-- coroutine of its own, which yields inside c:call once the command is
-- in c's output; fn(c) then appends its command right behind it, with no
-- Lua code of anyone else between the two.
local function asking(c)
  local co = cocreate(function() pcall(c.call, c, "ASKING") end)
  coresume(co)
end

-- Runs send(c, ...) on the master of slot, following MOVED (the map is
-- refreshed, the call goes to the new owner at once) and ASK (ASKING,
-- then the command, on the node named), and retrying CLUSTERDOWN and
-- TRYAGAIN a bounded number of times.  A redirected command was not run
-- (the node answered instead), so running it again duplicates nothing;
-- a caller waits for each reply before the next, so its replies come in
-- order.  `what` names the command in the reasons.  Returns the reply and
-- the node's client that answered (the Redis locks' WAIT goes there).
local function route(self, slot, what, send, ...)
  local target              -- the node of an ASK
  local retries, redirects = 0, 0
  while true do
    local c, asked = target or master_of(self, slot), target ~= nil
    if asked then asking(c) end
    target = nil
    local ok, res = pcall(send, c, asked, ...)
    if ok then return res, c end
    if is_error(res) then
      local code = res.code
      if code == "MOVED" or code == "ASK" then
        redirects = redirects + 1
        if redirects > MAX_REDIRECTS then
          error(unavailable(("%s redirected %d times, last: %s"):format(
            what, MAX_REDIRECTS, res.message)), 0)
        end
        local s, host, port = res.message:match("^%u+ (%d+) (.*):(%d+)$")
        local addr = address(host, port, self.addr_of[c])
        if code == "MOVED" then
          self.nmoved = self.nmoved + 1
          self.slots[tonumber(s)] = addr
          refresh_later(self)
        else
          self.nasked = self.nasked + 1
          target = node(self, addr)
        end
      elseif code == "CLUSTERDOWN" or code == "TRYAGAIN" then
        retries = retries + 1
        if retries > MAX_RETRIES then
          error(unavailable(("%s failed %d times: %s"):format(what, retries, res.message)), 0)
        end
        if code == "CLUSTERDOWN" then refresh_later(self) end
        am.sleep(25 * 2 ^ (retries - 1) // 1)
      else
        error(res, 0)
      end
    else
      -- a node lost: a failover may give its slots to another (the next
      -- calls find out); this one may have run, so it is not sent again
      if is_unavailable(res) then refresh_later(self) end
      error(res, 0)
    end
    if self.closed then error(unavailable("client closed"), 0) end
  end
end

-- Commands a cluster client does not send: they need one connection of
-- the user's own (a transaction, a database, a subscription's mode), and
-- every node's connection is shared by all callers (docs/redis.md,
-- "Cluster").
local REFUSED = {}
for _, name in ipairs({ "multi", "exec", "discard", "watch", "unwatch", "select",
    "asking", "readonly", "readwrite", "subscribe", "psubscribe", "ssubscribe",
    "unsubscribe", "punsubscribe", "sunsubscribe", "monitor", "reset", "quit" }) do
  REFUSED[name] = true
end

-- The key positions of a command, from the server's COMMAND INFO (or of
-- its subcommand, `container|sub`): { first, last, step } as the server
-- counts (0: the command's name), movable (COMMAND GETKEYS finds them),
-- or false for a command the server does not know.  Asked once per name.
local function spec_of(info)
  local flags = {}
  for _, f in ipairs(info[3] or {}) do flags[f] = true end
  return { first = info[4], last = info[5], step = info[6], movable = flags.movablekeys }
end

local function command_spec(self, name, subname)
  local specs = self.specs
  local spec = specs[name]
  if spec == nil then
    local reply = route(self, nil, "COMMAND INFO", function(c)
      return c:call("COMMAND", "INFO", name)
    end)
    local info = reply[1]
    if type(info) ~= "table" then
      spec = false
    else
      spec = spec_of(info)
      local subs = info[10]
      if type(subs) == "table" and #subs > 0 then
        spec.subs = {}
        for _, s in ipairs(subs) do spec.subs[lower(s[1])] = spec_of(s) end
      end
    end
    specs[name] = spec
  end
  if spec and spec.subs and subname then
    return spec.subs[name .. "|" .. lower(argtext(subname))] or spec
  end
  return spec
end

-- The slot of the keys of the command argv[1..n] (nil: it has none);
-- keys in different slots are a usage error naming the argument.
local function check_slots(fname, first, keys, where, kind)
  local slot, at
  for i = 1, #keys do
    local s = keyslot(keys[i])
    if slot == nil then
      slot, at = s, i
    elseif s ~= slot then
      argerror(where[i], fname, ("%s%s is in slot %d, not in slot %d of %s%s: on a"
        .. " cluster a %s's keys share one slot (a hash tag: {...})"):format(
        kind(i), format("%q", keys[i]), s, slot, kind(at), format("%q", keys[at]), first))
    end
  end
  return slot
end

local function call_slot(self, n, argv)
  local name = lower(argtext(argv[1]))
  if REFUSED[name] then
    argerror(2, "call", ("%s is not sent by a cluster client (docs/redis.md,"
      .. " \"Cluster\")"):format(upper(name)))
  end
  local spec = command_spec(self, name, argv[2])
  if not spec then return nil end
  local keys, where = {}, {}
  if spec.movable then
    local ok, reply = pcall(route, self, nil, "COMMAND GETKEYS", function(c)
      return c:call("COMMAND", "GETKEYS", table.unpack(argv, 1, n))
    end)
    if not ok then
      -- a command with no key here, or arguments the server refuses (it
      -- says why when the command itself is sent); E_UNAVAILABLE is raised
      if is_error(reply) then return nil end
      error(reply, 0)
    end
    local from = 2
    for _, k in ipairs(reply) do
      for i = from, n do
        if argtext(argv[i]) == k then
          keys[#keys + 1], where[#where + 1], from = k, i + 1, i + 1
          break
        end
      end
    end
  elseif spec.first > 0 then
    local last = spec.last < 0 and n + spec.last or spec.last
    local step = spec.step > 0 and spec.step or 1
    for p = spec.first, last, step do
      if p + 1 > n then break end
      keys[#keys + 1], where[#where + 1] = argtext(argv[p + 1]), p + 2
    end
  end
  -- (not a tail call: the error's level counts this function)
  local slot = check_slots("call", "command", keys, where, function() return "key " end)
  return slot
end

local function plain_call(c, _, ...) return c:call(...) end

--- Sends a command to the master of its keys' slot (any master when it
-- has none) and waits for its reply.
function Cluster.call(self, ...)
  check_usable(self, "call", "call redis")
  local n = select("#", ...)
  if n == 0 then typeerror(2, "call", "string or number") end
  local argv = { ... }
  for i = 1, n do
    local t = type(argv[i])
    if t ~= "string" and t ~= "number" then
      typeerror(i + 1, "call", "string or number", argv[i])
    elseif argv[i] ~= argv[i] then
      argerror(i + 1, "call", "number must not be NaN")
    end
  end
  local slot = call_slot(self, n, argv)
  return (route(self, slot, upper(argtext(argv[1])), plain_call, ...))
end

local run_script, script_call = redis_internal.run_script, rcore.script

local NONE = {}

-- After an ASK, the node runs it by EVAL: it may not know its SHA1, and
-- an EVAL after NOSCRIPT would not follow the ASKING.
local function send_script(c, asked, script, keys, ...)
  if asked then return script_call(c, "EVAL", script, keys, ...) end
  return run_script(c, script, keys, ...)
end

--- Runs a script on the master of its keys' slot (any master when it
-- has no key); its keys must share one slot.
function Cluster.eval(self, script, keys, args)
  check_usable(self, "eval", "call redis")
  if type(script) ~= "string" then
    typeerror(1, "eval", "string", script)
  end
  keys = redis_internal.check_list(keys, 2, "keys") or NONE
  args = redis_internal.check_list(args, 3, "args") or NONE
  local texts, where = {}, {}
  for i = 1, #keys do texts[i], where[i] = argtext(keys[i]), 2 end
  local slot = check_slots("eval", "script", texts, where, function(i)
    return ("keys[%d] "):format(i)
  end)
  return (route(self, slot, "script", send_script, script, keys, args))
end

--- Subscribes fn to the (classic) channel: a message published on any
-- node reaches every node, so the subscription is on one node, the
-- master of the channel's slot.
function Cluster.subscribe(self, channel, fn)
  check_usable(self, "subscribe", "subscribe")
  if type(channel) ~= "string" then
    typeerror(1, "subscribe", "string", channel)
  end
  if not checks.is_callable(fn) then
    typeerror(2, "subscribe", "function", fn)
  end
  return master_of(self, keyslot(channel)):subscribe(channel, fn)
end

-- A subscription to a shard channel: the one of the node that serves the
-- channel's slot now (inner), replaced when that node loses the slot.
local ShardSubscription = { __name = "async_mutex.redis.ShardSubscription" }
ShardSubscription.__index = ShardSubscription

-- Subscribes cs on the master of its channel's slot, following MOVED
-- (the slot's new owner) and waiting out ASK, TRYAGAIN and CLUSTERDOWN
-- (a slot being moved), a bounded number of times.
local function shard_subscribe(self, cs)
  local slot = keyslot(cs.channel)
  local tries = 0
  while true do
    local c = master_of(self, slot)
    local ok, s = pcall(c.ssubscribe, c, cs.channel, cs.fn)
    if ok then
      if not cs.active or self.closed then s:unsubscribe() return end
      cs.inner = s
      -- the node lost the slot (and ended the subscription): at the new
      -- owner, once the map says who it is; messages between are lost
      s.on_dropped = function()
        if not cs.active or self.closed then return end
        local again, err = pcall(function()
          refresh(self, self.epoch)
          shard_subscribe(self, cs)
        end)
        if not again then
          rcore.hooks.report(err, ("shard channel '%s' not subscribed again: %s"):format(
            cs.channel, rcore.error_text(err)))
        end
      end
      return
    end
    tries = tries + 1
    if not is_error(s) or tries > MAX_REDIRECTS then error(s, 0) end
    local code = s.code
    if code == "MOVED" then
      local _, host, port = s.message:match("^%u+ (%d+) (.*):(%d+)$")
      self.slots[slot] = address(host, port, self.addr_of[c])
      refresh_later(self)
    elseif code == "ASK" or code == "TRYAGAIN" or code == "CLUSTERDOWN" then
      am.sleep(25 * tries)
    else
      error(s, 0)
    end
    if self.closed then error(unavailable("client closed"), 0) end
  end
end

--- Subscribes fn to the shard channel (SSUBSCRIBE, Redis 7) on the master
-- of its slot, and again on the slot's next owner when the slot moves.
function Cluster.ssubscribe(self, channel, fn)
  check_usable(self, "ssubscribe", "subscribe")
  if type(channel) ~= "string" then
    typeerror(1, "ssubscribe", "string", channel)
  end
  if not checks.is_callable(fn) then
    typeerror(2, "ssubscribe", "function", fn)
  end
  local cs = setmetatable({ channel = channel, fn = fn, active = true, inner = false },
    ShardSubscription)
  shard_subscribe(self, cs)
  return cs
end

--- Ends the subscription; never waits.
function ShardSubscription.unsubscribe(self)
  if getmetatable(self) ~= ShardSubscription then
    typeerror(1, "unsubscribe", "async_mutex.redis.ShardSubscription", self)
  end
  if not self.active then return end
  self.active = false
  if self.inner then self.inner:unsubscribe() end
end

--- Calls sent or queued whose reply has not come yet, on every node.
function Cluster.pending(self)
  check_cluster(self, "pending")
  local n = 0
  for _, c in pairs(self.nodes) do n = n + c:pending() end
  return n
end

--- The slot of a key (CRC16 of its hash tag, or of the key).
function Cluster.keyslot(self, key)
  check_cluster(self, "keyslot")
  if type(key) ~= "string" and type(key) ~= "number" then
    typeerror(1, "keyslot", "string or number", key)
  end
  return keyslot(argtext(key))
end

--- The ordinary clients of the masters, in the order of their first
-- slots: to run a command on every master (SCAN, DBSIZE, FLUSHALL).
function Cluster.masters(self)
  check_usable(self, "masters", "call redis")
  if #self.order == 0 then refresh(self, self.epoch) end
  local list = {}
  for i, addr in ipairs(self.order) do list[i] = node(self, addr) end
  return list
end

--- The redirections followed so far: MOVED, then ASK.
function Cluster.redirections(self)
  check_cluster(self, "redirections")
  return self.nmoved, self.nasked
end

--- Closes every node's connections: calls in flight raise E_UNAVAILABLE.
function Cluster.close(self)
  check_cluster(self, "close")
  if self.closed then return end
  self.closed = true
  for _, c in pairs(self.nodes) do c:close() end
  -- its Redis locks end their holds and wake their waiters, as an
  -- ordinary client's do (docs/redis-locks.md, "Closing the client")
  if self.on_close then self.on_close() end
end
Cluster.__close = Cluster.close

function Cluster.__tostring(self)
  return ("async_mutex.redis.ClusterClient (%d masters)"):format(#self.order)
end

-- }==========================================================


-- {========================================================== connect

-- The options of redis.connect that a cluster passes to each node's
-- client; host, port and path come from the cluster, and a cluster has
-- one database.
local NODE_OPTIONS = {
  password = true, username = true, connectTimeout = true, commandTimeout = true,
  reconnectDelay = true, reconnectDelayMax = true, pingInterval = true,
}

--- redis.connect{cluster = {{host =, port =}, ...}, ...}: `redis` is the
-- async_mutex.redis module.  Called as connect's tail call: argument
-- errors are raised at connect's caller's line.  Connects nothing yet:
-- the first call loads the slot map.
function M.connect(redis, options)
  local seeds = options.cluster
  local known = { cluster = true }
  for k in pairs(NODE_OPTIONS) do known[k] = true end
  local unknown = unknown_option(options, known)
  if unknown then
    local name = unknown:match("'(.-)'")
    if name == "host" or name == "port" or name == "path" or name == "db" then
      argerror(1, "connect", ("cluster excludes %s"):format(name))
    end
    argerror(1, "connect", unknown)
  end
  if type(seeds) ~= "table" or #seeds == 0 then
    argerror(1, "connect", "cluster must be a non-empty list of {host =, port =}")
  end
  local opts = {}
  for k in pairs(NODE_OPTIONS) do opts[k] = options[k] end
  -- the node options checked once, here, by connect's own checks (its
  -- client, never used, connects nothing), raised at the caller's line
  local ok, err = pcall(redis.connect, opts)
  if not ok then
    if type(err) == "string" then err = err:gsub("^[^\n:]+:%d+: ", "", 1) end
    usage_error(err)
  end
  err:close()
  local list = {}
  for i, s in ipairs(seeds) do
    local host, port = type(s) == "table" and s.host or nil, type(s) == "table" and s.port or nil
    if host == nil then host = "127.0.0.1" end
    if type(s) ~= "table" or type(host) ~= "string" or mtype(port) ~= "integer"
        or port < 1 or port > 65535 then
      argerror(1, "connect", ("cluster[%d] must be {host = string, port = integer"
        .. " from 1 to 65535}"):format(i))
    end
    list[i] = host .. ":" .. port
  end
  return setmetatable({
    redis = redis, options = opts, seeds = list,
    nodes = {}, addr_of = {}, slots = {}, order = {}, epoch = 0, specs = {},
    gate = am.Mutex.new(), refreshing = false, closed = false, nmoved = 0, nasked = 0,
    on_close = false,          -- set by the Redis locks (redis_lock_hub.lua)
  }, Cluster)
end

M.Cluster = Cluster

-- What the Redis locks (redis_lock_*.lua) use of the cluster client (not
-- API; written here only): the client test, and the three below.
M._internal = {}
M._internal.is_cluster = function(v) return getmetatable(v) == Cluster end
-- The Redis locks' scripts (redis_lock_hub.lua, eval): keys that share a slot
-- by construction (a lock's, or those of several locks of one slot), args
-- as values, all checked by the locks: routed by the first key, with none
-- of eval's checks or lists (one lock cycle is two scripts).  Returns the
-- reply and the client of the node that ran the script: the locks'
-- `replicas` confirm its writes by WAIT on that node's connection.
M._internal.script = function(self, script, keys, ...)
  if self.closed then error(unavailable("client closed"), 0) end
  return route(self, keyslot(keys[1]), "script", send_script, script, keys, ...)
end
-- A new cluster client like `client` (closed), and its commandTimeout:
-- the Redis locks give a closed client's holds back on it.
M._internal.sibling = function(client)
  local opts = { cluster = {} }
  for k, v in pairs(client.options) do opts[k] = v end
  for i, addr in ipairs(client.seeds) do
    local host, port = addr:match("^(.*):(%d+)$")
    opts.cluster[i] = { host = host, port = tonumber(port) }
  end
  local c = M.connect(client.redis, opts)
  -- the slot map is known: no need to ask for it again
  c.slots, c.order, c.epoch = client.slots, client.order, client.epoch
  return c, M._internal.command_timeout(client)
end
-- The commandTimeout of the nodes' clients.
M._internal.command_timeout = function(client)
  return client.options.commandTimeout or redis_internal.default_command_timeout
end

return M
