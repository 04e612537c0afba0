-- A hand-written pure-Lua mutex and semaphore on luv: the "mini Mutex" that a
-- Lua user would write instead of installing async_mutex, and the baseline of
-- the benchmarks.  Same API subset as async_mutex (see API.draft.md):
--
--   Mutex.new([cancel_error]); m:acquire([priority]) -> release function
--   m:runExclusive(fn [, priority]); m:waitForUnlock([priority])
--   m:isLocked(); m:release(); m:cancel()
--   Semaphore.new(value [, cancel_error]); s:acquire([weight [, priority]])
--   s:runExclusive(fn [, weight [, priority]]); s:waitForUnlock([weight [, priority]])
--   s:isLocked(); s:getValue(); s:setValue(n); s:release([weight]); s:cancel()
--   withTimeout(lock, ms [, err]); tryAcquire(lock [, err])
--
-- The design is the simple one, written with care:
-- * waiters are tables {co, weight, priority}, queued in one FIFO per
--   priority; the distinct priorities are kept in a sorted array (binary
--   search, table.insert), so inserting costs O(log distinct priorities);
-- * ownership passes at release time (value and queue change at once) and the
--   granted coroutines are resumed later from a luv idle handle, in FIFO order,
--   including those readied during the batch;
-- * withTimeout starts one luv timer per waiting request; timed-out and
--   cancelled entries are only marked dead and skipped when they reach the head;
-- * waitForUnlock waiters are a plain list, checked after every dispatch.
-- Argument checking is minimal: this is a benchmark peer, not a library.

local uv = require "luv"

local resume, yield = coroutine.resume, coroutine.yield
local running, status = coroutine.running, coroutine.status
local isyieldable = coroutine.isyieldable
local tinsert, tremove = table.insert, table.remove
local error, pcall, setmetatable = error, pcall, setmetatable

local M = {
  E_TIMEOUT = "timeout while waiting for mutex to become available",
  E_ALREADY_LOCKED = "mutex already locked",
  E_CANCELED = "request for lock canceled",
}

-- The scheduler: waiters to resume, with what to resume them with.
local ready, nready, spare = {}, 0, {}
local idle = uv.new_idle()
local started = false

local function report(co, err)
  io.stderr:write(debug.traceback(co, tostring(err)), "\n")
end

local function on_idle()
  repeat
    local batch, n = ready, nready
    ready, nready = spare, 0
    for i = 1, n do
      local w = batch[i]
      batch[i] = nil
      local ok, err = resume(w.co, w.ok, w.a, w.b)
      if not ok then report(w.co, err) end
    end
    spare = batch
  until nready == 0
  idle:stop()
  started = false
end

local function wake(w, ok, a, b)
  w.ok, w.a, w.b = ok, a, b
  nready = nready + 1
  ready[nready] = w
  if not started then
    started = true
    idle:start(on_idle)
  end
end

-- The queue -----------------------------------------------------------------

-- Appends waiter `w` to the FIFO of its priority.
local function enqueue(self, w)
  local p = w.priority
  local b = self.buckets[p]
  if not b then
    b = { first = 1, last = 0 }
    self.buckets[p] = b
    local prios = self.prios            -- descending; binary search
    local lo, hi = 1, #prios
    while lo <= hi do
      local mid = (lo + hi) // 2
      if prios[mid] > p then lo = mid + 1 else hi = mid - 1 end
    end
    tinsert(prios, lo, p)
  end
  local last = b.last + 1
  b.last = last
  b[last] = w
end

-- Returns the first live waiter and its FIFO, dropping dead entries (timed
-- out, cancelled, coroutine closed) and empty FIFOs on the way; nil if none.
local function head(self)
  local prios = self.prios
  while true do
    local p = prios[1]
    if p == nil then return nil end
    local b = self.buckets[p]
    local i = b.first
    while i <= b.last do
      local w = b[i]
      if not w.dead and status(w.co) == "suspended" then
        b.first = i
        return w, b
      end
      b[i] = nil
      i = i + 1
    end
    self.buckets[p] = nil
    tremove(prios, 1)
  end
end

-- Would a request of `weight` at `priority` be granted right now?
local function could_lock(self, weight, priority)
  local h = self.prios[1] and head(self)
  return (h == nil or h.priority < priority) and weight <= self.value
end

local dispatch

local function releaser(self, weight)
  local done = false
  return function()
    if done then return end
    done = true
    if self.is_mutex and self.value > 0 then return end
    self.value = self.value + weight
    dispatch(self)
  end
end

local function stop_timer(w)
  local t = w.timer
  if t then
    w.timer = false
    t:stop()
    t:close()
  end
end

-- Resumes the waitForUnlock waiters that could lock now.
local function drain_unlock_waiters(self)
  local list = self.unlock_waiters
  local j = 0
  for i = 1, #list do
    local w = list[i]
    list[i] = nil
    if w.dead then                        -- timed out
    elseif could_lock(self, w.weight, w.priority) then
      w.dead = true
      stop_timer(w)
      wake(w, true)
    else
      j = j + 1
      list[j] = w
    end
  end
end

-- Grants from the head while the head fits.
function dispatch(self)
  while true do
    local w, b = head(self)
    if not w or w.weight > self.value then break end
    b[b.first] = nil
    b.first = b.first + 1
    w.dead = true                        -- no longer waiting: timers ignore it
    stop_timer(w)
    local prev = self.value
    self.value = prev - w.weight
    wake(w, true, prev, releaser(self, w.weight))
  end
  if self.unlock_waiters[1] then drain_unlock_waiters(self) end
end

local function on_timeout(self, w, err)
  stop_timer(w)
  if w.dead then return end
  w.dead = true
  dispatch(self)                         -- its removal may unblock others
  local ok, e = resume(w.co, false, err)
  if not ok then report(w.co, e) end
end

-- All fields present from the start: the table is never resized.
local function new_waiter(weight, priority)
  return { co = running(), weight = weight, priority = priority,
           dead = false, timer = false, ok = false, a = false, b = false }
end

local function wait(self, w, timeout, timeout_error)
  if timeout then
    local t = uv.new_timer()
    w.timer = t
    t:start(timeout, 0, function() on_timeout(self, w, timeout_error) end)
  end
  local ok, a, b = yield()
  if not ok then error(a, 0) end
  return a, b
end

-- acquire with an optional timeout (0: fail at once, as tryAcquire does).
local function acquire(self, weight, priority, timeout, timeout_error)
  if not isyieldable() then
    error("attempt to acquire a " .. self.kind .. " outside a coroutine", 3)
  end
  if could_lock(self, weight, priority) then
    local prev = self.value
    self.value = prev - weight
    return prev, releaser(self, weight)
  end
  if timeout == 0 then error(timeout_error, 0) end
  local w = new_waiter(weight, priority)
  enqueue(self, w)
  return wait(self, w, timeout, timeout_error)
end

local function wait_for_unlock(self, weight, priority, timeout, timeout_error)
  if not isyieldable() then
    error("attempt to wait for a " .. self.kind .. " outside a coroutine", 3)
  end
  if could_lock(self, weight, priority) then return end
  if timeout == 0 then error(timeout_error, 0) end
  local w = new_waiter(weight, priority)
  local list = self.unlock_waiters
  list[#list + 1] = w
  wait(self, w, timeout, timeout_error)
end

local function finish(release, ok, ...)
  release()
  if not ok then error((...), 0) end
  return ...
end

local function release(self, weight)
  if self.is_mutex and self.value > 0 then return end
  self.value = self.value + (weight or 1)
  dispatch(self)
end

local function cancel(self)
  local prios, buckets = self.prios, self.buckets
  self.prios, self.buckets = {}, {}
  for k = 1, #prios do
    local b = buckets[prios[k]]
    for i = b.first, b.last do
      local w = b[i]
      if not w.dead and status(w.co) == "suspended" then
        w.dead = true
        stop_timer(w)
        wake(w, false, self.cancel_error)
      end
    end
  end
  if self.unlock_waiters[1] then drain_unlock_waiters(self) end
end

local function new_state(mt, kind, value, cancel_error)
  return setmetatable({
    kind = kind, is_mutex = kind == "mutex", value = value,
    cancel_error = cancel_error or M.E_CANCELED,
    prios = {}, buckets = {}, unlock_waiters = {},
  }, mt)
end

-- Semaphore -----------------------------------------------------------------

local Semaphore = {}
Semaphore.__index = Semaphore
M.Semaphore = { new = function(value, cancel_error)
  return new_state(Semaphore, "semaphore", value, cancel_error)
end }

function Semaphore:acquire(weight, priority)
  return acquire(self, weight or 1, priority or 0)
end
function Semaphore:runExclusive(fn, weight, priority)
  local value, rel = acquire(self, weight or 1, priority or 0)
  return finish(rel, pcall(fn, value))
end
function Semaphore:waitForUnlock(weight, priority)
  return wait_for_unlock(self, weight or 1, priority or 0)
end
function Semaphore:isLocked() return self.value <= 0 end
function Semaphore:getValue() return self.value end
function Semaphore:setValue(v) self.value = v; dispatch(self) end
Semaphore.release = release
Semaphore.cancel = cancel

-- Mutex: a semaphore of value 1 whose release never goes above 1 ---------------

local Mutex = {}
Mutex.__index = Mutex
M.Mutex = { new = function(cancel_error)
  return new_state(Mutex, "mutex", 1, cancel_error)
end }

function Mutex:acquire(priority)
  local _, rel = acquire(self, 1, priority or 0)
  return rel
end
function Mutex:runExclusive(fn, priority)
  local _, rel = acquire(self, 1, priority or 0)
  return finish(rel, pcall(fn))
end
function Mutex:waitForUnlock(priority)
  return wait_for_unlock(self, 1, priority or 0)
end
function Mutex:isLocked() return self.value <= 0 end
function Mutex:release() release(self, 1) end
Mutex.cancel = cancel

-- Decorators ------------------------------------------------------------------

local function decorate(lock, ms, err)
  local d = {}
  for _, name in ipairs { "release", "cancel", "isLocked", "getValue", "setValue" } do
    local f = lock[name]
    if f then d[name] = function(_, ...) return f(lock, ...) end end
  end
  if lock.is_mutex then
    function d.acquire(_, priority)
      local _, rel = acquire(lock, 1, priority or 0, ms, err)
      return rel
    end
    function d.runExclusive(_, fn, priority)
      local _, rel = acquire(lock, 1, priority or 0, ms, err)
      return finish(rel, pcall(fn))
    end
    function d.waitForUnlock(_, priority)
      return wait_for_unlock(lock, 1, priority or 0, ms, err)
    end
  else
    function d.acquire(_, weight, priority)
      return acquire(lock, weight or 1, priority or 0, ms, err)
    end
    function d.runExclusive(_, fn, weight, priority)
      local value, rel = acquire(lock, weight or 1, priority or 0, ms, err)
      return finish(rel, pcall(fn, value))
    end
    function d.waitForUnlock(_, weight, priority)
      return wait_for_unlock(lock, weight or 1, priority or 0, ms, err)
    end
  end
  return d
end

function M.withTimeout(lock, ms, err)
  return decorate(lock, ms, err or M.E_TIMEOUT)
end

function M.tryAcquire(lock, err)
  return decorate(lock, 0, err or M.E_ALREADY_LOCKED)
end

-- The scheduler, which bench/lua_rwlock.lua shares: wake(w, ok, a, b)
-- resumes w.co with ok, a, b from the idle handle, in order.
M.wake = wake

return M
