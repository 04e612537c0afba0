-- Shrinking a failing sequence to the shortest one that still fails, each
-- candidate replayed in a fresh process (so that a crash or a hang of the
-- module counts as a failure too, and no state leaks between candidates).
--
-- Works on any sequence that is a table with a list `ops`, where any
-- sub-list of `ops` is a valid sequence (the generators make ops whose target
-- is in the wrong state a no-op).  A fuzzer gives its script, which must
-- replay a serialized sequence with `SCRIPT replay FILE` (exit status 0: it
-- passes), and its serializer.
--
--   local shrink = require "fuzz.shrink"
--   local small, tries = shrink.minimize(seq, fails, { simplify = { "deco" } })
--   local lines = shrink.report(seq, { script = ..., serialize = ..., root = ... })

local shrink = {}

-- Seconds a replay may take: a hang counts as a failure.
shrink.REPLAY_TIMEOUT = 30

local function lua_cmd()
  return os.getenv("LUA") or "lua5.4"
end

--- Replays `seq` in a fresh interpreter (`lua5.4 SCRIPT replay FILE`); true
-- when it passes.
function shrink.replay_in_child(seq, script, serialize)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(serialize(seq), "\n")
  f:close()
  local ok = os.execute(("timeout -s KILL %d %s %s replay %s >/dev/null 2>&1"):format(
    shrink.REPLAY_TIMEOUT, lua_cmd(), script, name))
  os.remove(name)
  return ok == true
end

--- Delta debugging over seq.ops: the shortest sub-list (1-minimal) for which
-- fails(candidate) holds, then each op with the fields of opts.simplify
-- dropped where the failure stays.  Returns the small sequence (the other
-- fields of seq are kept) and the number of candidates tried.
function shrink.minimize(seq, fails, opts)
  opts = opts or {}
  local function with(ops)
    local s = {}
    for k, v in pairs(seq) do s[k] = v end
    s.ops = ops
    return s
  end
  local ops = seq.ops
  local tries = 0
  local function test(cand)
    tries = tries + 1
    return fails(with(cand))
  end
  -- remove chunks of n equal parts, n growing while nothing can go
  local n = 2
  while #ops >= 2 do
    local size = math.ceil(#ops / n)
    local reduced = false
    for i = 1, n do
      local lo, hi = (i - 1) * size + 1, math.min(i * size, #ops)
      if lo > #ops then break end
      local cand = {}
      for j = 1, #ops do
        if j < lo or j > hi then cand[#cand + 1] = ops[j] end
      end
      if #cand < #ops and test(cand) then
        ops = cand
        n = math.max(n - 1, 2)
        reduced = true
        if opts.log then opts.log(("  shrink: %d ops"):format(#ops)) end
        break
      end
    end
    if not reduced then
      if n >= #ops then break end
      n = math.min(n * 2, #ops)
    end
  end
  -- one-at-a-time removal until nothing more can go
  local changed = true
  while changed do
    changed = false
    local i = 1
    while i <= #ops and #ops > 1 do
      local cand = {}
      for j = 1, #ops do if j ~= i then cand[#cand + 1] = ops[j] end end
      if test(cand) then
        ops = cand
        changed = true
      else
        i = i + 1
      end
    end
  end
  -- simplify each op: drop optional fields
  for i = 1, #ops do
    for _, field in ipairs(opts.simplify or {}) do
      if ops[i][field] ~= nil then
        local cand = {}
        for j = 1, #ops do cand[j] = ops[j] end
        local copy = {}
        for k, v in pairs(ops[i]) do copy[k] = v end
        copy[field] = nil
        cand[i] = copy
        if test(cand) then ops = cand end
      end
    end
  end
  return with(ops), tries
end

--- Shrinks a sequence that fails, replaying candidates in fresh processes,
-- and returns the lines of a report: the shortest sequence, where it was
-- written (ROOT/build/NAME-seed-SEED.lua) and how to replay it.  A failure
-- that depends on timing may not show on every run: the number of attempts
-- per candidate adapts to how many the whole sequence needed.
-- how: script (path), replay_cmd (shown to the reader), serialize, root,
-- name (file prefix), simplify (fields, for minimize).
function shrink.report(seq, how)
  local function passes(s) return shrink.replay_in_child(s, how.script, how.serialize) end
  local attempts
  for k = 1, 5 do
    if not passes(seq) then attempts = k break end
  end
  if not attempts then
    return { "the sequence passes when replayed alone (5 attempts): it needs the "
      .. "sequences run before it in the same process, or a timing that did not recur" }
  end
  local per = attempts == 1 and 1 or math.min(5, 2 * attempts)
  local small, tries = shrink.minimize(seq, function(s)
    for _ = 1, per do
      if not passes(s) then return true end
    end
    return false
  end, { simplify = how.simplify })
  local text = how.serialize(small)
  local file = ("%s/build/%s-seed-%s.lua"):format(how.root, how.name, tostring(seq.seed))
  os.execute(("mkdir -p '%s/build'"):format(how.root))
  local f = io.open(file, "w")
  if f then f:write(text, "\n"); f:close() end
  return {
    ("shortest reproducing sequence (%d of %d ops, %d tries%s):"):format(
      #small.ops, #seq.ops, tries, per > 1 and (", flaky: " .. per .. " attempts each") or ""),
    text,
    ("replay: %s %s"):format(how.replay_cmd, f and file or "FILE"),
  }
end

return shrink
