-- Helpers of the Redis lock specs (44-47): a real redis-server per spec, and
-- child lua5.4 processes that take the locks too.
--
--   local R = require "lock_redis"
--   local server = R.server()          -- started at once; server:stop() in teardown
--   local client = server:client()     -- async_mutex.redis client on its socket
--   local child = R.child(code, args)  -- a lua5.4 process, spawned with uv.spawn
--   local rc, out = child:wait()       -- in a coroutine: its exit code and stdout
--
-- A server listens on a unix socket in a temporary directory (no port to
-- collide with) and on a free loopback port; it is stopped by the PID in its
-- pidfile, also when a spec fails (call server:stop() from teardown, which
-- also kills the children a failed test left running).
-- server:pause() / resume() send SIGSTOP / SIGCONT, kill() SIGKILL, and
-- start() starts it again on the same socket and port, empty.

local uv = require "luv"
-- (loaded with this file, so that helpers.run can close the clients a
-- failed test made: see track_clients there)
pcall(require, "async_mutex.redis")

local R = {}

-- Without LD_PRELOAD: under `make asan` the sanitizer runtime is preloaded
-- into this process, and redis-server and redis-cli abort with it.
local function sh(cmd)
  local ok = os.execute("LD_PRELOAD= ; " .. cmd)
  return ok
end

local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function free_port()
  local tcp = uv.new_tcp()
  assert(tcp:bind("127.0.0.1", 0))
  local port = tcp:getsockname().port
  tcp:close()
  return port
end

local Server = {}
Server.__index = Server

-- Runs redis-server once; waits until it answers (true), or until its log
-- says its TCP port was taken (false).
local function launch(self)
  local logged = #(read(self.logfile) or "")
  local cmd = ("redis-server --port %d --bind 127.0.0.1 --unixsocket %s --save '' "
    .. "--appendonly no --daemonize yes --pidfile %s --logfile %s --dir %s"):format(
    self.port, self.path, self.pidfile, self.logfile, self.dir)
  assert(sh(cmd), "could not start redis-server")
  for _ = 1, 500 do
    if sh(("redis-cli -s %s ping >/dev/null 2>&1"):format(self.path)) then
      self.pid = tonumber(read(self.pidfile))
      if self.pid then return true end
    end
    if (read(self.logfile) or ""):find("Address already in use", logged + 1, true) then
      return false
    end
    uv.sleep(5)
  end
  error("redis-server did not start: " .. (read(self.logfile) or "no log"))
end

--- Starts (again) the server; waits until it answers.  A restart finds its
-- TCP port taken when another process's connection got it as its local
-- port meanwhile (a loaded machine): it takes another one.  The clients use
-- the unix socket, which stays.
function Server:start()
  for _ = 1, 5 do
    if launch(self) then return self end
    self.port = free_port()
  end
  error("redis-server did not start: " .. (read(self.logfile) or "no log"))
end

local function signal(self, sig)
  if self.pid then sh(("kill -%s %d 2>/dev/null"):format(sig, self.pid)) end
end

function Server:pause() signal(self, "STOP") end
function Server:resume() signal(self, "CONT") end

--- SIGKILL, and wait until the process is gone.
function Server:kill()
  if not self.pid then return end
  signal(self, "CONT")
  signal(self, "KILL")
  for _ = 1, 400 do                   -- gone, or a zombie nobody reaps
    local stat = read(("/proc/%d/stat"):format(self.pid))
    if not stat or stat:match("^%d+ %b() (%a)") == "Z" then break end
    uv.sleep(2)
  end
  self.pid = nil
  os.remove(self.pidfile)
end

-- The children still running (see R.child), killed by Server:stop.
local live = {}

--- Stops the server for good and removes its directory; kills the children
-- still running, which only a failed test leaves (they would wait for this
-- server's locks for up to their own timers).
function Server:stop()
  for child in pairs(live) do child:kill() end
  self:kill()
  sh(("rm -rf '%s'"):format(self.dir))
end

--- A client of this server (over its unix socket unless opts.tcp).
function Server:client(opts)
  local redis = require "async_mutex.redis"
  local o = { path = self.path }
  if opts and opts.tcp then o = { host = "127.0.0.1", port = self.port } end
  for k, v in pairs(opts or {}) do if k ~= "tcp" then o[k] = v end end
  return redis.connect(o)
end

--- redis-cli against this server; returns its output.
function Server:cli(args)
  local p = assert(io.popen(("LD_PRELOAD= redis-cli -s %s %s 2>&1"):format(self.path, args)))
  local out = p:read("a")
  p:close()
  return out
end

--- The server of a whole spec file (as redis_server.for_file) and a namer
-- of its locks:
--   local server, fresh_name = R.file_server(setup, teardown, "spec44")
function R.file_server(setup, teardown, prefix)
  return require("redis_server").for_file(setup, teardown, R.server), R.namer(prefix)
end

--- The head of a Redis lock spec file in one line: the module, the spec
-- helpers, the file's server, the namer of its locks (R.file_server) and
-- the set-ups of its cases (R.cases):
--   local R = require "lock_redis"
--   local am, h, server, fresh_name, with = R.spec_file(setup, teardown, "spec44")
function R.spec_file(setup, teardown, prefix)
  local server, fresh_name = R.file_server(setup, teardown, prefix)
  return require "async_mutex", require "helpers", server, fresh_name,
    R.cases(server, fresh_name)
end

--- The cases of a spec file whose set-up is a client of `server`
-- (with.client, as redis_server.cases), R.one_client, R.one_lock,
-- R.two_clients, R.two_locks or R.two_keyed_locks on `server` and
-- `fresh_name`, and whose tear-down closes their clients once the body has
-- returned (a failed case's clients are closed by h.run).  Each makes the
-- body of an `it` (h.async(fn, opts)), fn given what the set-up returns:
--   it("...", with.client(function(c) ... end))
--   it("...", with.one_client(function(c, name) ... end))
--   it("...", with.one_lock(am.RedisMutex, function(m, c) ... end))
--   it("...", with.two_clients(function(a, b, name) ... end))
--   it("...", with.two_locks(am.RedisMutex, function(ma, mb, a, b, name) ... end))
--   it("...", with.two_keyed_locks(am.KeyedRedisMutex, function(ka, kb, a, b, prefix) ... end))
function R.cases(server, fresh_name)
  local h = require "helpers"
  local with = require("redis_server").cases(function() return server:client() end)
  function with.one_client(fn, opts)
    return h.async(function()
      local c, name = R.one_client(server, fresh_name)
      fn(c, name)
      c:close()
    end, opts)
  end
  function with.one_lock(class, fn, opts)
    return h.async(function()
      local lock, c = R.one_lock(server, fresh_name, class)
      fn(lock, c)
      c:close()
    end, opts)
  end
  function with.two_clients(fn, opts)
    return h.async(function()
      local a, b, name = R.two_clients(server, fresh_name)
      fn(a, b, name)
      a:close(); b:close()
    end, opts)
  end
  local function two(make)
    return function(class, fn, opts)
      return h.async(function()
        local la, lb, a, b, name = make(server, fresh_name, class)
        fn(la, lb, a, b, name)
        a:close(); b:close()
      end, opts)
    end
  end
  with.two_locks, with.two_keyed_locks = two(R.two_locks), two(R.two_keyed_locks)
  return with
end

--- The set-up of a case with one process: a client of `server` and a
-- fresh lock name.  Returns client, name.
function R.one_client(server, fresh_name)
  return server:client(), fresh_name()
end

--- The same with one lock of `class` on that name (class.new(client, name,
-- ...)).  Returns lock, client.
function R.one_lock(server, fresh_name, class, ...)
  local c, name = R.one_client(server, fresh_name)
  return class.new(c, name, ...), c
end

--- The set-up of a case with two processes: two clients of `server`
-- (a, b) and a fresh lock name.  Returns a, b, name.
function R.two_clients(server, fresh_name)
  return server:client(), server:client(), fresh_name()
end

--- The same with one lock of `class` on that name for each client
-- (class.new(client, name, ...)).  Returns lock_a, lock_b, a, b, name.
function R.two_locks(server, fresh_name, class, ...)
  local a, b, name = R.two_clients(server, fresh_name)
  return class.new(a, name, ...), class.new(b, name, ...), a, b, name
end

--- The same for a keyed lock: its prefix is a fresh name and ":".
-- Returns keyed_a, keyed_b, a, b, prefix.
function R.two_keyed_locks(server, fresh_name, class, ...)
  local a, b, name = R.two_clients(server, fresh_name)
  local prefix = name .. ":"
  return class.new(a, prefix, ...), class.new(b, prefix, ...), a, b, prefix
end

--- The n redis-servers of a RedlockMutex spec file (a list, filled by its
-- setup, stopped by its teardown, resumed first if a test paused one).  A
-- server counts for a Redlock once it has been up for the lock's ttl (read
-- in whole seconds, taken as up to a second less): the setup waits that
-- long for the longest ttl of the file's locks, `max_ttl` ms.
function R.redlock_servers(setup, teardown, n, max_ttl)
  local servers = {}
  setup(function()
    for i = 1, n do servers[i] = R.server() end
    uv.sleep(max_ttl + 1100)
  end)
  teardown(function()
    for _, s in ipairs(servers) do s:resume(); s:stop() end
  end)
  return servers
end

--- The head of a RedlockMutex spec file in one line (as R.spec_file): the
-- module, the spec helpers, its n servers (R.redlock_servers), a namer of
-- its locks, and clients(opts), a new list of one client per server.
--   local am, h, servers, fresh, clients =
--     R.redlock_spec_file(setup, teardown, 3, 1000, "spec194")
function R.redlock_spec_file(setup, teardown, n, max_ttl, prefix)
  local servers = R.redlock_servers(setup, teardown, n, max_ttl)
  local function clients(opts)
    local t = {}
    for i, s in ipairs(servers) do t[i] = s:client(opts) end
    return t
  end
  return require "async_mutex", require "helpers", servers, R.namer(prefix), clients
end

--- A fresh redis-server.
function R.server()
  local dir = os.tmpname()
  os.remove(dir)
  assert(sh(("mkdir -p '%s'"):format(dir)))
  local self = setmetatable({
    dir = dir, path = dir .. "/redis.sock", pidfile = dir .. "/redis.pid",
    logfile = dir .. "/redis.log", port = free_port(),
  }, Server)
  return self:start()
end


-- {========================================================== children

local Child = {}
Child.__index = Child

--- Runs `code` in a new lua5.4 process with this checkout's paths; `args`
-- become its `...` (strings).  Its stdout and stderr are collected.
function R.child(code, args)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(code)
  f:close()
  local self = setmetatable({ out = {}, err = {}, script = script, open = 2,
                              done = false }, Child)
  local stdout, stderr = uv.new_pipe(false), uv.new_pipe(false)
  local argv = { script }
  for i, a in ipairs(args or {}) do argv[i + 1] = tostring(a) end
  local env = { "LUA_PATH=" .. package.path, "LUA_CPATH=" .. package.cpath,
                "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin") }
  for _, name in ipairs({ "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                          "LSAN_OPTIONS", "AM_GC_STRESS", "AM_STRESS_SCALE" }) do
    local v = os.getenv(name)             -- make asan, make gcstress: children too
    if v then env[#env + 1] = name .. "=" .. v end
  end
  local handle, pid
  handle, pid = uv.spawn("lua5.4", {
    args = argv, env = env, stdio = { nil, stdout, stderr },
  }, function(code_, sig)
    self.rc, self.sig = code_, sig
    handle:close()
    self:_finish()
  end)
  assert(handle, pid)
  self.pid = pid
  live[self] = true
  local function reader(pipe, into, notify)
    pipe:read_start(function(err, data)
      assert(not err, err)
      if data then
        into[#into + 1] = data
        if notify and self.on_data then self.on_data(data) end
      else
        pipe:close()
        self.open = self.open - 1
        self:_finish()
      end
    end)
  end
  reader(stdout, self.out, true)
  reader(stderr, self.err, false)
  return self
end

function Child:_finish()
  if self.rc == nil or self.open > 0 or self.done then return end
  self.done = true
  live[self] = nil
  os.remove(self.script)
  self.stderr = table.concat(self.err)
  if self.waiting then
    local co = self.waiting
    self.waiting = nil
    assert(coroutine.resume(co))
  end
end

--- In a coroutine: waits for the process to end; returns its exit code, its
-- stdout and its stderr.
function Child:wait()
  if not self.done then
    self.waiting = coroutine.running()
    coroutine.yield()
  end
  return self.rc, table.concat(self.out), self.stderr, self.sig
end

function Child:kill(sig)
  if not self.done then uv.kill(self.pid, sig or "sigkill") end
end

--- Waits (in a coroutine) until the child's stdout contains `pattern`.
function Child:wait_for(pattern, ms)
  local co = coroutine.running()
  local t = uv.new_timer()
  local found = false
  local function check()
    if not found and table.concat(self.out):find(pattern) then
      found = true
      t:stop()
      t:close()
      self.on_data = nil
      assert(coroutine.resume(co, true))
      return true
    end
  end
  self.on_data = check
  t:start(ms or 10000, 0, function()
    if found then return end
    found = true
    t:close()
    self.on_data = nil
    assert(coroutine.resume(co, false))
  end)
  if check() then return true end
  return coroutine.yield()
end

-- }==========================================================

--- The prologue of a child script: the module, luv, a client of the server
-- whose socket is the first argument, and main(fn) running fn in a
-- coroutine then the loop (exit code 0 on success, 1 on error).
R.PROLOGUE = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local SOCK = ...
local ARGS = { select(2, ...) }
local client = redis.connect { path = SOCK }
-- The longest stall (ms) since the last call: how long this process's loop
-- went without running a timer (starved of CPU, or blocked), or the server
-- left a PING on a connection of its own unanswered since the last call
-- (a PING sent before it and still unanswered counts from the call: a
-- server starved for the whole of a short hold answered none).  Either,
-- past a sixth of a lease, can make a renewal, or a release, reach Redis
-- after the lease's end: the pause no lease survives (docs/redis-locks.md,
-- "Limits"), a fault of a loaded machine, not of the lock, which the
-- no-fault specs tell apart this way.  Started by the first call; its
-- timer is unref'd and main() closes its connection, so that neither
-- keeps the loop running.
local stall_timer, stall_probe, stall_last, stall_since, stall_worst
local pinging                         -- when the PING in flight went out
local function stalls()
  if not stall_timer then
    stall_probe = redis.connect { path = SOCK }
    stall_timer = uv.new_timer()
    stall_timer:start(2, 2, function()
      local now = uv.hrtime()
      stall_worst = math.max(stall_worst, (now - stall_last) / 1e6)
      stall_last = now
      if pinging or not stall_probe then return end
      local probe, t0 = stall_probe, now
      pinging = t0
      coroutine.wrap(function()
        pcall(probe.call, probe, "PING")
        stall_worst = math.max(stall_worst, (uv.hrtime() - math.max(t0, stall_since)) / 1e6)
        pinging = nil
      end)()
    end)
    stall_timer:unref()
  end
  local now = uv.hrtime()
  local worst = stall_worst and math.max(stall_worst, (now - stall_last) / 1e6,
    pinging and (now - math.max(pinging, stall_since)) / 1e6 or 0)
  stall_last, stall_since, stall_worst = now, now, 0
  return worst or 0
end
local function main(fn)
  local failed
  local co = coroutine.create(function()
    local ok, err = xpcall(fn, debug.traceback)
    if not ok then failed = err end
    client:close()
    if stall_probe then stall_probe:close(); stall_probe = nil end
  end)
  local ok, err = coroutine.resume(co)
  if not ok then failed = err end
  uv.run()
  if failed then io.stderr:write(tostring(failed), "\n"); os.exit(1) end
  io.stdout:flush()
  os.exit(0)
end
]]

--- A worker process of the failover specs (203, 243), for R.child: takes
-- the RedisMutex NAME (ttl 2000, waiterTimeout 600, `replicas` REPLICAS,
-- 0: none) for at most RUN ms, until the file STOP exists, holding 20 ms,
-- through a client (commandTimeout 1000, reconnectDelayMax 200) made with
-- `sentinels` (HOW "sentinel": PORTS the sentinels' ports, master
-- "mymaster") or `cluster` (HOW "cluster": PORTS the seeds').  Markers,
-- one write(2) each to LOG (O_APPEND): "B id fence t" and "E id fence t"
-- around each section (t: the monotonic clock at the grant, in ns, which
-- every process reads alike; R.overlaps_in reads them); under Sentinel
-- then "G id fence port", the server that granted (asked in the section:
-- when the connection moved since, the new one).  Prints "grants
-- unavailable others falses", every other error on a line, then the
-- E_UNAVAILABLE reasons (numbers as N) with their counts.
R.FAILOVER_WORKER = [[
local am = require "async_mutex"
local redis = require "async_mutex.redis"
local uv = require "luv"
local HOW, PORTS, NAME, LOG, ID, RUN, REPLICAS, STOP = ...
local nodes = {}
for p in PORTS:gmatch("%d+") do nodes[#nodes + 1] = { host = "127.0.0.1", port = tonumber(p) } end
local opts = { commandTimeout = 1000, reconnectDelayMax = 200 }
if HOW == "cluster" then opts.cluster = nodes else opts.sentinels, opts.master = nodes, "mymaster" end
local client = redis.connect(opts)
local m = am.RedisMutex.new(client, NAME, { ttl = 2000, waiterTimeout = 600,
  replicas = tonumber(REPLICAS) > 0 and tonumber(REPLICAS) or nil })
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
local grants, unavailable, falses, others, reasons = 0, 0, 0, {}, {}
local failed
local function told()
  local s = io.open(STOP)
  if s then s:close() end
  return s ~= nil
end
am.spawn(function()
  local ok, err = pcall(function()
    local stop = uv.hrtime() + tonumber(RUN) * 1e6
    while uv.hrtime() < stop and not told() do
      local got, r = pcall(m.acquire, m)
      if got then
        grants = grants + 1
        local mark = ("%s %d %d\n"):format(ID, r.fence, uv.hrtime())
        f:write("B " .. mark)
        local asked, port
        if HOW ~= "cluster" then asked, port = pcall(client.call, client, "CONFIG", "GET", "port") end
        am.sleep(20)
        f:write("E " .. mark)
        if HOW ~= "cluster" then
          f:write(("G %s %d %s\n"):format(ID, r.fence, asked and port[2] or "?"))
        end
        if not r() then falses = falses + 1 end
      elseif r == am.E_UNAVAILABLE then
        unavailable = unavailable + 1
        local why = (r.reason or "?"):gsub("%d+", "N")
        reasons[why] = (reasons[why] or 0) + 1
        am.sleep(20)
      else
        others[#others + 1] = tostring(r)
        am.sleep(20)
      end
    end
  end)
  if not ok then failed = err end
  client:close()
end)
uv.run()
f:close()
if failed then io.stderr:write(tostring(failed), "\n"); os.exit(1) end
io.stdout:write(("%d %d %d %d\n"):format(grants, unavailable, #others, falses))
for _, e in ipairs(others) do io.stdout:write(e, "\n") end
for why, n in pairs(reasons) do io.stdout:write(("unavailable %d: %s\n"):format(n, why)) end
os.exit(0)
]]

--- Child code after R.PROLOGUE (specs 78 and 196): hold_until_killed(r)
-- says "held" (the line the parent waits for), then keeps the hold `r` a
-- minute: the parent kills the child before, so its client is never
-- closed.
R.HOLD_UNTIL_KILLED = [[
local function hold_until_killed(r)
  io.stdout:write("held\n")
  io.stdout:flush()
  am.sleep(60000)
  r()
end
]]

--- The start of a worker of timed sections (specs 120 and 126): R.PROLOGUE,
-- then its arguments NAME, TTL and WAIT (the lock's ttl and waiterTimeout,
-- ms), N (how many sections), SEED, LOG, ID; math.random seeded; `f`, LOG
-- opened to append unbuffered (each marker one write(2)).
R.TIMED_WORKER_PROLOGUE = R.PROLOGUE .. [[
local NAME, TTL, WAIT, N, SEED, LOG, ID = table.unpack(ARGS)
TTL, WAIT, N = tonumber(TTL), tonumber(WAIT), tonumber(N)
math.randomseed(tonumber(SEED))
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
]]

--- The start of a worker for R.run_workers: R.PROLOGUE, then its arguments
-- NAME (a lock's name, or a keyed lock's prefix), N (how many sections),
-- LOG, ID; math.random seeded with the worker's own seed; `f`, LOG opened
-- to append unbuffered (each marker one write(2)); in_parallel(n, body):
-- body(c) in n coroutines c = 1..n, returning once every one has ended;
-- some_of(keys): 1 or more of `keys` (each with odds 0.4), in keys' order.
R.WORKER_PROLOGUE = R.PROLOGUE .. [[
local NAME, N, LOG, ID, SEED = table.unpack(ARGS)
math.randomseed(tonumber(SEED))
local f = assert(io.open(LOG, "a"))
f:setvbuf("no")
local function in_parallel(n, body)
  local left, done = n, coroutine.running()
  for c = 1, n do
    am.spawn(function()
      body(c)
      left = left - 1
      if left == 0 and coroutine.status(done) == "suspended" then coroutine.resume(done) end
    end)
  end
  if left > 0 then coroutine.yield() end
end
local function some_of(keys)
  local pick = {}
  for _, k in ipairs(keys) do if math.random() < 0.4 then pick[#pick + 1] = k end end
  if #pick == 0 then pick[1] = keys[math.random(#keys)] end
  return pick
end
]]

--- The code of a RedisRWLock worker for R.run_workers (specs 191, 276):
-- `o.coroutines` coroutines each run N sections on the lock NAME (ttl
-- `o.ttl`), a write with odds `o.writes`, else a read, each pausing 0 to
-- `o.pause` ms; each section writes "B mode id fence" at its start and
-- "E mode id fence" at its end (R.rw_overlaps_in reads them).
function R.rw_worker(o)
  return R.WORKER_PROLOGUE .. ([[
local rw = am.RedisRWLock.new(client, NAME, { ttl = %d })
main(function()
  in_parallel(%d, function(c)
    for i = 1, tonumber(N) do
      local write = math.random() < %s
      local release <close> = write and rw:acquireWrite() or rw:acquireRead()
      local mode = write and "W" or "R"
      f:write(("B %%s %%s%%d.%%d %%d\n"):format(mode, ID, c, i, release.fence))
      am.sleep(math.random(0, %d))
      f:write(("E %%s %%s%%d.%%d %%d\n"):format(mode, ID, c, i, release.fence))
    end
  end)
  f:close()
end)
]]):format(o.ttl, o.coroutines, tostring(o.writes), o.pause)
end

--- Runs 4 processes of R.rw_worker(o) (R.run_workers) on the lock `name`
-- of `server`, `sections` sections per coroutine; returns what
-- R.rw_overlaps_in reads in their markers (the file removed).
function R.rw_workers_on(server, name, sections, o)
  local log = R.run_workers(R.rw_worker(o), 4, server.path, name, sections)
  local results = table.pack(R.rw_overlaps_in(log))
  os.remove(log)
  return table.unpack(results, 1, results.n)
end

--- Runs `n` worker processes of `code` (R.child), worker p with the
-- arguments (socket, name, sections, log, "p<p>", a seed), and waits for
-- all; each must exit 0.  Returns `log`, the one file of their markers.
function R.run_workers(code, n, socket, name, sections)
  local log = os.tmpname()
  local children = {}
  for p = 1, n do
    children[p] = R.child(code, { socket, name, sections, log, "p" .. p, os.time() + p })
  end
  for p = 1, n do
    local rc, _, err = children[p]:wait()
    if rc ~= 0 then error(("worker p%d exited with %s: %s"):format(p, tostring(rc), err), 2) end
  end
  return log
end

--- Waits for each of `children` (R.child), which must exit 0 and print n
-- whole numbers first ("3 0 1 ..."); returns their sums, place by place.
function R.sum_counts(children, n)
  local assert = require "luassert"
  local pattern = "^" .. ("(%d+) "):rep(n - 1) .. "(%d+)"
  local sums = {}
  for i = 1, n do sums[i] = 0 end
  for _, child in ipairs(children) do
    local rc, out, err = child:wait()
    assert.equal(0, rc, err)
    local counts = { out:match(pattern) }
    assert.equal(n, #counts, out)
    for i = 1, n do sums[i] = sums[i] + tonumber(counts[i]) end
  end
  return table.unpack(sums, 1, n)
end

--- Spawns a coroutine that acquires `lock` (h.spawn: its error fails the
-- test), notes when it was granted (`clock()`: uv.hrtime unless given)
-- and releases at once.  Returns a function that gives that time, nil
-- before.
function R.grant_time(lock, clock)
  local got
  require("helpers").spawn(function()
    local r = lock:acquire()
    got = (clock or uv.hrtime)()
    r()
  end)
  return function() return got end
end

--- Fences strictly increasing, hold after hold: `n` holds taken in turn
-- (take(i) returns the i-th one's releaser, with its `fence`), each fence
-- above the one before (the first above `last`), each released.
function R.fences_increase(n, last, take)
  for i = 1, n do
    local r = take(i)
    assert(r.fence > last, ("hold %d: fence %s not above %s"):format(i, tostring(r.fence), tostring(last)))
    last = r.fence
    r()
  end
end

--- A renewed lock handed off (specs 202 and 243, locks with replicas):
-- `ma` granted, renewed twice (renewInterval 50), still held; `mb` asked
-- in a coroutine, then, `settle_ms` later, `ma` released: the release
-- succeeds, `mb` is granted with a higher fence and releases.  In a
-- coroutine (h.async).
function R.renewed_hand_off(ma, mb, settle_ms)
  local h, assert = require "helpers", require "luassert"
  local release = ma:acquire()
  h.sleep(130)                                   -- two renewals
  assert.is_true(release:check())
  local got = require("async_mutex").spawn(function()
    local r = mb:acquire()
    local fence = r.fence
    assert.is_true(r())
    return fence
  end)
  h.sleep(settle_ms)
  assert.is_true(release())
  assert.is_true(got:join() > release.fence)
end

-- The number of processes queued in Redis for the lock 'name'.
function R.queued(client, name)
  return client:call("ZCARD", name .. ":q")
end

-- The server's clock in ms (its TIME, the clock the lock scripts use for
-- leases and deadlines).
function R.server_ms(client)
  local t = client:call("TIME")
  return tonumber(t[1]) * 1000 + tonumber(t[2]) // 1000
end

-- A renewal that Redis ran, answered here after the lease's local end:
-- every holder record of 'name' on 'client's server runs 'ms' more (10 s
-- unless said) from now, its N:h with it.  Returns the tokens, sorted.
function R.extend_records(client, name, ms)
  ms = ms or 10000
  local key = name .. ":h"
  local tokens = R.holder_tokens(client, name)
  local until_ms = R.server_ms(client) + ms
  for _, token in ipairs(tokens) do
    local rest = client:call("HGET", key, token):match("^%d+ (.*)$")
    client:call("HSET", key, token, ("%d %s"):format(until_ms, rest))
  end
  client:call("PEXPIRE", key, tostring(ms))
  return tokens
end

-- The release script run directly, with the arguments the locks pass
-- (token, limit: 1 for a mutex), for the specs of the data layout in Redis
-- (docs/redis-locks.md, "In Redis").  Returns 1 if the token held the lock.
function R.release_script(client, name, token, limit)
  local scripts = require "async_mutex.redis_scripts"
  return client:eval(scripts.release, scripts.keys(name), { token, tostring(limit or 1) })
end

--- Runs fn(...) in a coroutine of its own with a call hook that closes
-- `client` at the k-th call made from the files whose names contain one of
-- `files` (the lock code a close may come from; the client's own windows
-- are the client's: docs/redis.md).  Returns a function that tells, once fn
-- has returned, whether the close came and pcall's results (nil before).
function R.with_close_at(k, client, files, fn, ...)
  local h = require "helpers"
  local args = table.pack(...)
  local result, closed
  local calls = 0
  local function in_files(src)
    for _, f in ipairs(files) do
      if src:find(f, 1, true) then return true end
    end
    return false
  end
  h.spawn(function()
    debug.sethook(function()
      local caller = debug.getinfo(3, "S")
      if not (caller and in_files(caller.short_src)) then return end
      calls = calls + 1
      if calls == k then
        debug.sethook()
        closed = true
        client:close()
      end
    end, "c")
    result = table.pack(pcall(fn, table.unpack(args, 1, args.n)))
    debug.sethook()
  end)
  return function()
    if not result then return nil end
    return closed or false, table.unpack(result, 1, result.n)
  end
end

--- Waits (3 s at most) for the end of a run of R.with_close_at whose fn
-- returned a hold, and judges it: nil when fn ended before the close came
-- (it must have succeeded; `client` is closed here), else false, or the
-- problem (a string): fn returned a hold that still checks after the
-- close, or raised an error that is not `closed_error(err)`.
function R.close_outcome(outcome, client, closed_error)
  local h = require "helpers"
  local assert = require "luassert"
  h.wait_until(function() return outcome() ~= nil end, 3000)
  local closed, ok, r = outcome()
  if not closed then
    client:close()
    assert.is_true(ok, r)
    return nil
  end
  if ok then
    if r:check() then return "held after the close" end
  elseif not closed_error(r) then
    return "raised " .. tostring(r)
  end
  return false
end

--- A lock script of async_mutex.redis_scripts run directly on the lock
-- `name`'s keys, with the arguments `...` (strings, as the locks pass them).
function R.eval_script(client, name, script, ...)
  local scripts = require "async_mutex.redis_scripts"
  return client:eval(script, scripts.keys(name), { ... })
end

--- The cases of a spec of random requests run straight on the scripts
-- (specs 278, 298), made with the spec's `it`: for seeds 1 to 3, the case
-- `title` (its %d: the seed) runs run(client, seed', name, ops, ev,
-- server_ms) three times, math.random seeded with seeds made from the
-- seed, each on a lock name of its own made from `prefix` (ev(script,
-- ...): R.eval_script on it; server_ms(): R.server_ms); run returns nil,
-- or what went wrong (the failure).
function R.random_script_cases(it, server, run, prefix, ops, title)
  local h = require "helpers"
  local assert = require "luassert"
  for _, seed in ipairs({ 1, 2, 3 }) do
    it(title:format(seed), h.async(function()
      local c = server:client()
      local _ <close> = h.closing(c)
      local function server_ms() return R.server_ms(c) end
      for round = 1, 3 do
        local seed_r, name = seed * 10 + round, ("%s:%d:%d"):format(prefix, seed, round)
        local function ev(script, ...) return R.eval_script(c, name, script, ...) end
        math.randomseed(seed_r)
        assert.is_nil(run(c, seed_r, name, ops, ev, server_ms))
      end
    end))
  end
end

--- The acquire script run directly, as the locks run it: `token` asks for
-- a lease of `ttl` ms in `mode` ("wait" unless given); o.limit (1: a mutex)
-- and o.weight (1) as the lock's, o.wait the waiter timeout (3000 ms),
-- o.channel the wake-up channel (one nobody listens on).  Returns the
-- script's reply.
function R.acquire_script(client, name, token, ttl, mode, o)
  local scripts = require "async_mutex.redis_scripts"
  o = o or {}
  return client:eval(scripts.acquire, scripts.keys(name),
    { token, tostring(o.limit or 1), tostring(o.weight or 1), tostring(ttl),
      tostring(o.wait or 3000), o.channel or "nobody", mode or "wait" })
end

--- The renew script run directly: `token` asks for a lease of `ttl` ms
-- on a lock of `limit` (1: a mutex).  Returns 1 if the token held it.
function R.renew_script(client, name, token, ttl, limit)
  local scripts = require "async_mutex.redis_scripts"
  return client:eval(scripts.renew, scripts.keys(name), { token, tostring(limit or 1), tostring(ttl) })
end

--- A sorted copy of a reply's list of strings (KEYS, HKEYS).
function R.sorted(t)
  local out = {}
  for i = 1, #t do out[i] = t[i] end
  table.sort(out)
  return out
end

--- The tokens recorded as holders of `name` in Redis (its N:h hash), sorted.
function R.holder_tokens(client, name)
  return R.sorted(client:call("HKEYS", name .. ":h"))
end

-- The scripts the server has run so far (EVAL and EVALSHA requests, from
-- INFO commandstats: the requests of every client, not the commands run
-- inside the scripts).
function R.scripts_run(client)
  local stats = client:call("INFO", "commandstats")
  local n = 0
  for name, calls in stats:gmatch("cmdstat_(%w+):calls=(%d+)") do
    if name == "eval" or name == "evalsha" then n = n + tonumber(calls) end
  end
  return n
end

-- A function returning a new lock name at each call: prefix:1, prefix:2, ...
function R.namer(prefix)
  local n = 0
  return function()
    n = n + 1
    return prefix .. ":" .. n
  end
end

--- Reads a marker file of worker processes ("B id n" and "E id n" lines,
-- each one write(2) to a file opened with O_APPEND): the number of
-- sections that began while another was still running (by the order of
-- the lines), and of sections.  A "P id n" line marks a section whose
-- lease ended in a pause of its process or the server (stalls() in
-- R.PROLOGUE: no lease survives one, docs/redis-locks.md, "Limits"): its
-- overlaps are that pause's, not counted.
function R.overlaps_in(path)
  local paused = {}
  for line in io.lines(path) do
    local id = line:match("^P (.+)$")
    if id then paused[id] = true end
  end
  local inside, overlaps, sections = {}, 0, 0
  for line in io.lines(path) do
    local kind, id = line:match("^(%u) (.+)$")
    if kind == "B" then
      sections = sections + 1
      if not paused[id] then
        for other in pairs(inside) do
          if not paused[other] then overlaps = overlaps + 1 break end
        end
      end
      inside[id] = true
    elseif kind == "E" then
      inside[id] = nil
    end
  end
  return overlaps, sections
end

--- Reads a marker file of readers-writer workers ("B mode id [fence]"
-- and "E mode id [fence]" lines, mode R or W): the number of sections that
-- began beside a write or as a write beside anyone (bad), of reads that
-- began while another section ran (shared), of sections, of writes; and
-- the lines in order, as { kind =, mode =, id =, fence = } (fence: nil
-- where the line has none).
function R.rw_overlaps_in(path)
  local inside, n_in, bad, shared, sections, writes = {}, 0, 0, 0, 0, 0
  local events = {}
  for line in io.lines(path) do
    local kind, mode, id, fence = line:match("^(%u) (%u) (%S+) ?(%d*)$")
    events[#events + 1] = { kind = kind, mode = mode, id = id, fence = tonumber(fence) }
    if kind == "B" then
      sections = sections + 1
      if mode == "W" then
        writes = writes + 1
        if n_in > 0 then bad = bad + 1 end
      else
        for _, m in pairs(inside) do if m == "W" then bad = bad + 1 end end
        if n_in > 0 then shared = shared + 1 end
      end
      inside[id] = mode
      n_in = n_in + 1
    else
      inside[id] = nil
      n_in = n_in - 1
    end
  end
  return bad, shared, sections, writes, events
end

--- The same for the sections of keyed locks ("B key id" and "E key id"
-- lines): the number of sections that began on a key while another
-- section of that key was running or that ended while another was the
-- key's latest (overlaps), and of sections.
function R.key_overlaps_in(path)
  local inside, overlaps, sections = {}, 0, 0
  for line in io.lines(path) do
    local kind, key, id = line:match("^(%u) (%S+) (%S+)$")
    if kind == "B" then
      sections = sections + 1
      if inside[key] then overlaps = overlaps + 1 end
      inside[key] = id
    elseif kind == "E" then
      if inside[key] ~= id then overlaps = overlaps + 1 end
      inside[key] = nil
    end
  end
  return overlaps, sections
end

return R
