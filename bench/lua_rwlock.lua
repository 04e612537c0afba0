-- A hand-written pure-Lua readers-writer lock on luv: what a Lua user would
-- write instead of async_mutex's RWLock, and its peer in bench/lockkinds.lua.
--
--   local RWLock = require("lua_rwlock")   -- (bench/ on package.path)
--   local rw = RWLock.new()
--   local release = rw:acquireRead()       -- or rw:acquireWrite()
--   release()
--
-- The simple design, written with care, with the same queue discipline as
-- async_mutex's RWLock (docs/lockkinds.md), so that both do the same work:
-- * one FIFO queue of waiters {co, write}, a ring of two indices (no
--   table.remove from the front); a reader is granted at once only when no
--   writer holds or waits, a writer only when nobody holds or waits;
-- * a release grants from the head: every reader at the head together, or
--   one writer; the granted coroutines are resumed later, from a luv idle
--   handle, in grant order (the ones readied meanwhile in the same batch),
--   by the scheduler of the pure-Lua mutex (bench/lua_mutex.lua);
-- * a releaser is a closure that releases once.
-- No priorities, timeouts or cancel: the benchmark uses none.

-- The pure-Lua mutex's scheduler: wake(w, true) resumes w.co later, from
-- its luv idle handle, in order.
local wake = require("lua_mutex").wake

local yield, running = coroutine.yield, coroutine.running

local RWLock = {}
RWLock.__index = RWLock

function RWLock.new()
  -- readers: how many hold it; writing: a writer holds it; queue[head..tail]
  return setmetatable({ readers = 0, writing = false, queue = {}, head = 1, tail = 0 }, RWLock)
end

local release_read, release_write

-- Grants from the head of the queue: the readers there, or one writer.
local function dispatch(self)
  local q = self.queue
  while self.head <= self.tail and not self.writing do
    local w = q[self.head]
    if w.write then
      if self.readers > 0 then return end
      self.writing = true
    else
      self.readers = self.readers + 1
    end
    q[self.head] = nil
    self.head = self.head + 1
    wake(w, true)
  end
end

local function releaser(self, fn)
  local done = false
  return function()
    if done then return false end
    done = true
    fn(self)
    return true
  end
end

function release_read(self)
  self.readers = self.readers - 1
  if self.readers == 0 then dispatch(self) end
end

function release_write(self)
  self.writing = false
  dispatch(self)
end

local function wait(self, write)
  self.tail = self.tail + 1
  self.queue[self.tail] = { co = running(), write = write }
  yield()
end

function RWLock:acquireRead()
  if not self.writing and self.head > self.tail then
    self.readers = self.readers + 1
  else
    wait(self, false)
  end
  return releaser(self, release_read)
end

function RWLock:acquireWrite()
  if not self.writing and self.readers == 0 and self.head > self.tail then
    self.writing = true
  else
    wait(self, true)
  end
  return releaser(self, release_write)
end

RWLock.acquire = RWLock.acquireWrite

return RWLock
