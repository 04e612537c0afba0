-- Limiting concurrency: eight jobs, at most three running at any time.
--
-- A Semaphore with value 3 hands out three permits; runExclusive takes one,
-- runs the job (which may yield, here on a timer) and gives the permit back,
-- even if the job raises.
--
--   make && lua5.4 examples/semaphore_jobs.lua

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local am = require "async_mutex"

local MAX_JOBS = 3
local durations = { 60, 20, 40, 30, 50, 10, 30, 20 }   -- milliseconds
local slots = am.Semaphore.new(MAX_JOBS)
local running, most = 0, 0

local function job(i)
  slots:runExclusive(function(free)     -- free: permits left before ours
    running = running + 1
    most = math.max(most, running)
    print(("job %d starts (permits free: %d, running: %d)")
      :format(i, free, running))
    am.sleep(durations[i])
    running = running - 1
    print(("job %d done"):format(i))
  end)
end

am.run(function()
  local jobs <close> = am.group()       -- joined when this block ends
  for i = 1, #durations do
    jobs:spawn(job, i)                  -- the first three start at once
  end
end)
print(("all %d jobs done, at most %d ran at once (limit %d)")
  :format(#durations, most, MAX_JOBS))
