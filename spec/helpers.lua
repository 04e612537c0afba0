-- Test helpers: run a spec body as a coroutine on luv's loop, with a deadline,
-- and check that the loop is left with nothing active.
--
--   local h = require "helpers"
--   it("waits", h.async(function() ... h.sleep(10) ... end))
--
-- busted runs bodies on the main thread, which cannot yield; h.async wraps the
-- body in a coroutine, runs uv.run() until the loop is idle, then re-raises the
-- body's error (with its traceback), fails if the body never finished, and
-- fails if a handle other than the module's stopped ones is still active.

local uv = require "luv"

local helpers = {}

-- GC stress: AM_GC_STRESS=1 runs every spec with the collector in incremental
-- mode at its most aggressive (a collection step at nearly every allocation).
if os.getenv("AM_GC_STRESS") == "1" then
  collectgarbage("incremental", 1, 1000)
end

helpers.DEFAULT_DEADLINE = 5000

local function active_handles(except)
  local names = {}
  uv.walk(function(h)
    if h ~= except and not h:is_closing() and h:is_active() then
      names[#names + 1] = tostring(h)
    end
  end)
  return names
end
helpers.active_handles = function() return active_handles(nil) end

--- Runs `body(...)` in a coroutine on the loop; returns what it returned.
-- opts.deadline (ms) bounds the run; opts.allow_active skips the handle check.
function helpers.run(body, opts)
  opts = opts or {}
  local finished, ok, result = false, nil, nil
  local co = coroutine.create(function()
    local packed = table.pack(xpcall(body, debug.traceback))
    finished, ok = true, packed[1]
    result = ok and table.pack(table.unpack(packed, 2, packed.n)) or packed[2]
  end)
  local timed_out = false
  local deadline = uv.new_timer()
  deadline:start(opts.deadline or helpers.DEFAULT_DEADLINE, 0, function()
    timed_out = true
    uv.stop()
  end)
  deadline:unref()                       -- do not keep uv.run() alive by itself
  local started, err = coroutine.resume(co)
  if not started then error(err, 0) end
  if not finished or not opts.no_loop then uv.run() end
  local left = active_handles(deadline)
  deadline:close()
  uv.run("nowait")                       -- let the close complete
  if timed_out then
    error(("deadline of %d ms passed, body %s"):format(
      opts.deadline or helpers.DEFAULT_DEADLINE,
      finished and "finished" or "still suspended"), 0)
  end
  if not finished then
    error("body never finished: the loop ran out of work with it suspended", 0)
  end
  if not ok then error(result, 0) end
  if not opts.allow_active and #left > 0 then
    error("handles left active after the body: " .. table.concat(left, ", "), 0)
  end
  return table.unpack(result, 1, result.n)
end

--- Wraps a spec body for `it(...)`.
function helpers.async(body, opts)
  return function() return helpers.run(body, opts) end
end

--- Suspends the running coroutine for `ms` milliseconds of loop time.
function helpers.sleep(ms)
  local co = coroutine.running()
  local t = uv.new_timer()
  t:start(ms, 0, function()
    t:close()
    local ok, err = coroutine.resume(co)
    if not ok then error(err, 0) end
  end)
  coroutine.yield()
end

--- Suspends the running coroutine until the next loop iteration (a 0 ms timer:
-- everything the module deferred to its idle handle before this call has
-- been resumed by then).
function helpers.tick(n)
  for _ = 1, n or 1 do helpers.sleep(0) end
end

--- Starts `fn(...)` in a new coroutine right now (on the current thread's
-- behalf) and returns the coroutine.  Errors escaping it are raised.
function helpers.spawn(fn, ...)
  local co = coroutine.create(fn)
  local ok, err = coroutine.resume(co, ...)
  if not ok then error(debug.traceback(co, err), 0) end
  return co
end

--- Full collection, twice (finalizers run in the first, memory freed in the second).
function helpers.gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

return helpers
