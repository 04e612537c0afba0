-- The floor of the benchmarks: a bare coroutine yield and resume through one
-- luv idle handle, with no lock at all.  No lock implementation that defers
-- its wake-ups to the loop can do less per wait than `floor.wait()`.
--
--   local floor = require "floor"
--   floor.wait()      -- in a coroutine: be resumed from the loop, in FIFO order
--
-- The idle callback resumes the ready coroutines in FIFO order and goes on
-- with those readied meanwhile, in the same callback, until none is left
-- (no budget: this is the cheapest possible schedule).  Two arrays are
-- swapped so that both stay in the array part of their tables.

local uv = require "luv"

local resume, yield, running = coroutine.resume, coroutine.yield, coroutine.running
local stderr = io.stderr

local floor = {}

local ready, nready = {}, 0     -- coroutines readied since the batch began
local spare = {}                -- the previous batch's array, reused
local idle = uv.new_idle()
local started = false

local function on_idle()
  repeat
    local batch, n = ready, nready
    ready, nready = spare, 0
    for i = 1, n do
      local co = batch[i]
      batch[i] = nil
      local ok, err = resume(co)
      if not ok then stderr:write("floor: ", tostring(err), "\n") end
    end
    spare = batch
  until nready == 0
  idle:stop()
  started = false
end

--- Suspends the running coroutine until the loop resumes it (FIFO).
function floor.wait()
  nready = nready + 1
  ready[nready] = running()
  if not started then
    started = true
    idle:start(on_idle)
  end
  return yield()
end

return floor
