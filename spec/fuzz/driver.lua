-- The process pool of the fuzzers: `make fuzz N=... [J=...] [SEED=...]` runs
-- N generated sequences in J child processes (chunks of seeds), so that a
-- crash of the C module (a signal, not a Lua error) is caught too: the
-- driver knows the last seed each child started, and has it replayed in a
-- fresh process and shrunk.
--
--   lua5.4 spec/fuzz/runner.lua fuzz N [J [SEED]]
--
-- Prints one progress line per finished chunk (and, while chunks run, one
-- every PROGRESS_S seconds, counting the sequences the children have
-- finished so far) and a closing line
--   fuzz: N sequences, N ops[, N re-entrant calls], S s (N seq/s), seeds A..B: OK
-- or the failure report (seed, message, shortest reproducing sequence).
--
-- A fuzzer that uses the pool gives driver.main its argv and a suite:
--   suite.script          a Lua script that `SCRIPT run FIRST COUNT progress`
--                         runs seeds FIRST..FIRST+COUNT-1 and prints:
--                         "S seed" as each starts, "F seed" when one fails
--                         (its shrinking follows), then either
--                         "OK n sequences n ops ..." (and "n re-entrant calls",
--                         summed when present) and exit 0, or a report
--                         with a "FAILURE" line, "FAILED after n sequences n
--                         ops ..." and exit 1 (runner.lua's `run` command)
--   suite.crash_report    function(seed): the lines that report a crash or a
--                         hang of the child that was running `seed`
--   suite.chunk           (optional) the most seeds one child runs: 20,000
--                         by default; a slow fuzzer takes fewer, so that a
--                         kill loses little and progress shows often

local uv = require "luv"

local driver = {}

-- A child that reports no new seed for this long is hung: killed, reported.
local HANG_S = tonumber(os.getenv("AM_FUZZ_HANG_S") or "") or 60
-- A progress line at least this often (sequences finished, all children).
local PROGRESS_S = tonumber(os.getenv("AM_FUZZ_PROGRESS_S") or "") or 60

function driver.main(argv, suite)
  local n = tonumber(argv[2]) or 100000
  local jobs = tonumber(argv[3]) or tonumber(os.getenv("J") or "") or 2
  local start = tonumber(argv[4]) or tonumber(os.getenv("SEED") or "")
    or (os.time() % 100000) * 100000
  local chunk = math.max(1, math.min(suite.chunk or 20000, math.ceil(n / jobs)))
  local lua = os.getenv("LUA") or "lua5.4"
  local script = suite.script
  io.stdout:setvbuf("line")
  print(("fuzz: %d sequences from seed %d, %d jobs, chunks of %d"):format(n, start, jobs, chunk))

  local t0 = uv.hrtime()
  local next_seed, last_seed = start, start + n - 1
  local total_seq, total_ops = 0, 0
  local total_re                            -- re-entrant calls, if counted
  local running = 0
  local children = {}                       -- handle -> watchdog check
  local started = {}                        -- handle -> seeds started in its chunk
  local failure                             -- text of the first failure
  local crashed                             -- { seed = n, how = ... }

  local function launch()
    if failure or crashed or next_seed > last_seed then return false end
    local first = next_seed
    local count = math.min(chunk, last_seed - first + 1)
    next_seed = first + count
    local out = uv.new_pipe(false)
    local buf, lines, last = "", {}, nil
    local exited, eof, code, signal = false, false, nil, nil
    local seen = uv.now()                    -- last progress line (loop time)
    local handle, hung, shrinking
    local function finish()
      started[handle] = nil                 -- (counted in total_seq below)
      local text = table.concat(lines, "\n")
      local seqs, ops = text:match("OK (%d+) sequences (%d+) ops")
      if code == 0 and seqs then
        total_seq, total_ops = total_seq + tonumber(seqs), total_ops + tonumber(ops)
        local re = text:match("OK %d+ sequences %d+ ops (%d+) re%-entrant calls")
        if re then total_re = (total_re or 0) + tonumber(re) end
        local secs = (uv.hrtime() - t0) / 1e9
        print(("  seeds %d..%d ok; total %d sequences, %d ops, %.0f s"):format(
          first, first + count - 1, total_seq, total_ops, secs))
      elseif hung then
        crashed = crashed or { seed = last or first, text = text,
          how = ("no progress for %d s (hang), killed"):format(HANG_S) }
      elseif code == 1 and text:find("FAILURE", 1, true) then
        failure = failure or text:match("(FAILURE.*)$") or text
        local fs, fo = text:match("FAILED after (%d+) sequences (%d+) ops")
        if fs then total_seq, total_ops = total_seq + tonumber(fs), total_ops + tonumber(fo) end
      else
        crashed = crashed or { seed = last or first, how = (signal or 0) ~= 0
          and ("signal " .. signal) or ("exit code " .. tostring(code)), text = text }
      end
      launch()
    end
    handle = uv.spawn(lua, {
      args = { script, "run", tostring(first), tostring(count), "progress" },
      stdio = { nil, out, 2 },
    }, function(c, sig)
      handle:close()
      running = running - 1
      exited, code, signal = true, c, sig
      if eof then finish() end
    end)
    if not handle then error("cannot spawn " .. lua) end
    running = running + 1
    children[handle] = function()            -- watchdog: a hung sequence
      if not exited and not hung and not shrinking and uv.now() - seen > HANG_S * 1000 then
        hung = true
        handle:kill("sigkill")
      end
    end
    out:read_start(function(err, data)
      if err or not data then
        out:close()
        eof = true
        if exited then finish() end
        return
      end
      buf = buf .. data
      for line in buf:gmatch("([^\n]*)\n") do
        local s = line:match("^S (%d+)$")
        if s then
          last, seen = tonumber(s), uv.now()
          started[handle] = last - first    -- (those before 'last' are done)
        elseif line:match("^F %d+$") then shrinking = true  -- a failure: shrinking takes a while
        else lines[#lines + 1] = line end
      end
      buf = buf:match("[^\n]*$")
    end)
    return true
  end

  for _ = 1, jobs do launch() end
  local watchdog = uv.new_timer()
  local reported = uv.now()
  watchdog:start(1000, 1000, function()
    for h, check in pairs(children) do
      if h:is_closing() then children[h] = nil started[h] = nil else check() end
    end
    if uv.now() - reported >= PROGRESS_S * 1000 and running > 0 then
      reported = uv.now()
      local done = total_seq
      for _, k in pairs(started) do done = done + k end
      print(("  ... %d sequences done, %.0f s"):format(done, (uv.hrtime() - t0) / 1e9))
    end
    if running == 0 then watchdog:close() end
  end)
  uv.run()
  local secs = (uv.hrtime() - t0) / 1e9

  if crashed then
    print(("CRASH (%s) in the child running seed %d; its output:\n%s"):format(
      crashed.how, crashed.seed, crashed.text))
    for _, line in ipairs(suite.crash_report(crashed.seed)) do print(line) end
    return 1
  end
  if failure then
    print(failure)
    print(("fuzz: FAILED after %d sequences, %d ops, %.0f s"):format(total_seq, total_ops, secs))
    return 1
  end
  print(("fuzz: %d sequences, %d ops%s, %.0f s (%.0f seq/s), seeds %d..%d: OK"):format(
    total_seq, total_ops, total_re and (", %d re-entrant calls"):format(total_re) or "",
    secs, total_seq / secs, start, last_seed))
  return 0
end

--- Park-Miller, the re-entrancy fuzzers' draws: the same sequence for a
-- seed, whatever the platform.  rng(seed) returns rnd, and rnd(n) a whole
-- number from 1 to n.
function driver.park_miller(seed)
  local x = seed % 2147483646 + 1
  return function(n)
    x = x * 48271 % 2147483647
    return x % n + 1
  end
end

--- The end of a re-entrancy fuzzer's sequence: violation(text) for each
-- actor that did not end exactly once (those closed on purpose, a.closed,
-- aside), named by describe(a), and for each handle left active.
function driver.check_end(actors, violation, describe)
  for _, a in ipairs(actors) do
    if not a.closed and coroutine.status(a.co) ~= "dead" then
      violation(("an actor never ended: %s"):format(describe(a)))
    elseif not a.closed and a.outcomes ~= 1 then
      violation(("%s ended %d times"):format(describe(a), a.outcomes))
    end
  end
  uv.walk(function(hd)
    if hd:is_active() and not hd:is_closing() then
      local t = tostring(hd)
      if t:match("^uv_timer") then
        t = t .. (" (due in %d ms%s)"):format(hd:get_due_in(), hd:has_ref() and "" or ", unreferenced")
      end
      violation("an active handle left: " .. t)
    end
  end)
end

--- The command line of a re-entrancy fuzzer (spec/fuzz/reentrancy.lua,
-- spec/fuzz/redis_reentrancy.lua): `fuzz N [J [SEED]]` through the pool
-- above, `run [FIRST [COUNT [progress]]]` in this process, printing what
-- suite.script must print (see the top of this file).  run_sequence(seed,
-- length) returns the failure's text or nil, the ops run, the re-entrant
-- calls made.
function driver.reentry_main(argv, script, run_sequence)
  if argv[1] == "fuzz" then
    return driver.main(argv, {
      script = script,
      chunk = 1000,                         -- (tens of seconds each)
      crash_report = function(seed)
        return { ("replay: lua5.4 %s run %d 1"):format(script, seed) }
      end,
    })
  end
  local first, count = tonumber(argv[2]) or 1, tonumber(argv[3]) or 1000
  local progress = argv[4] == "progress"
  io.stdout:setvbuf("line")
  local ops, reentries = 0, 0
  for seed = first, first + count - 1 do
    if progress then io.write("S ", seed, "\n") io.flush() end
    local bad, steps, re = run_sequence(seed, 20 + seed % 41)
    ops, reentries = ops + steps, reentries + re
    if bad then
      print("F " .. seed)
      print("FAILURE " .. bad)
      print(("FAILED after %d sequences %d ops"):format(seed - first, ops))
      return 1
    end
  end
  print(("OK %d sequences %d ops %d re-entrant calls"):format(count, ops, reentries))
  return 0
end

--- The end of a re-entrancy fuzzer's file, spec/fuzz/<name>.lua (`root`
-- the repository): run as a script (argv[0] ends with "<name>.lua"), the
-- process runs reentry_main and exits with its status; required, nothing.
function driver.reentry_script(argv, name, root, run_sequence)
  if argv and argv[0] and argv[0]:find(name .. "%.lua$") then
    os.exit(driver.reentry_main(argv, root .. "/spec/fuzz/" .. name .. ".lua", run_sequence), true)
  end
end

--- A failing sequence's trace, a line each, to stderr.
function driver.print_trace(trace)
  for _, line in ipairs(trace) do io.stderr:write(line, "\n") end
end

return driver
