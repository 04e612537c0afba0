-- Seeded generator of random operation sequences for the model-based tests.
--
-- A sequence is a plain table, printable as a Lua literal and replayable:
--   { seed = n, locks = { {kind = "mutex"|"sema"|"rw"|"re"|"krw", value = n,
--                          cancel = label}, ... },
--     ops = { {op = "spawn", id = n, lock = i, method = ..., w = n, p = n,
--              key = k (krw), plan = ..., deco = ..., nilargs = bool}, ...  } }
-- deco: {kind = "t"|"try"|"none", ms = n, err = label, lease = {ms = n,
-- from = true|nil, err = label|nil}, sig = 1|2|nil, so = true|nil} (sig:
-- withSignal with that signal, around the plain lock, or around the
-- timeout or tryAcquire when so).
-- Op kinds: spawn, finish, raise, close, call_rel, check, nest, unnest,
-- unscoped, setValue, cancel, abort, gc, turn, poke (see spec/fuzz/model.lua
-- for their meaning).  Ops name actors by
-- the id given at spawn; an op whose target is not in a suitable state when it
-- runs is skipped (so any sub-list of a sequence is a valid sequence, which is
-- what the shrinker needs).
--
-- The generator runs the model on a virtual clock while it generates, so that
-- it can aim ops at actors that are likely to be holding, queued and so on.

local model = require "fuzz.model"

local gen = {}

-- splitmix64: the same numbers on every platform and Lua build.
local function rng(seed)
  local state = seed
  local function next64()
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return z ~ (z >> 31)
  end
  local r = {}
  function r.int(lo, hi)                  -- uniform in [lo, hi]
    return lo + (next64() >> 1) % (hi - lo + 1)
  end
  function r.pick(list) return list[r.int(1, #list)] end
  function r.chance(p) return r.int(1, 1000000) <= p * 1000000 end
  -- weighted choice: { {w, value}, ... }
  function r.weighted(list)
    local total = 0
    for _, e in ipairs(list) do total = total + e[1] end
    local x = r.int(1, total)
    for _, e in ipairs(list) do
      x = x - e[1]
      if x <= 0 then return e[2] end
    end
  end
  return r
end
gen.rng = rng

local PRIOS = { 0, 0, 0, 0, 1, 1, 2, -1, 0.5 }
local TIMEOUTS = { 0, 0, 1, 1, 2, 3, 5 }
local LEASES = { 1, 1, 2, 3, 5, 8 }
local KEYS = { "a", "b" }
local SLEEPS = { 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 6 }

local function pick_actor(r, w, states, filter)
  local ids = {}
  for _, id in ipairs(w.order) do
    local a = w.actors[id]
    if states[a.state] and (not filter or filter(a)) then ids[#ids + 1] = id end
  end
  if #ids == 0 then return nil end
  return r.pick(ids)
end

-- A decoration: withTimeout or tryAcquire, an abort signal inside or
-- outside it, and (not on a ReentrantMutex) a lease on top of them.
local function gen_deco(r, errs, lock)
  local k = r.weighted({ { 6, "none" }, { 4, "t" }, { 2, "try" } })
  local lease
  if lock.kind ~= "re" and r.chance(0.25) then
    lease = { ms = r.pick(LEASES), from = r.chance(0.3) or nil,
              err = r.chance(0.3) and r.pick(errs) or nil }
  end
  local sig = r.chance(0.3) and r.int(1, 2) or nil
  if k == "none" and not lease and not sig then return nil end
  local d = { kind = k, lease = lease, sig = sig, so = sig and r.chance(0.5) or nil }
  if k == "t" then d.ms = r.pick(TIMEOUTS) end
  if k ~= "none" and r.chance(0.3) then d.err = r.pick(errs) end
  return d
end

--- Returns the sequence for `seed`.  opts.max_ops bounds its length.
function gen.sequence(seed, opts)
  opts = opts or {}
  local r = rng(seed)
  local max_ops = opts.max_ops or 40
  local errs = { "cerr1", "cerr2", "serr" }   -- cerr*: tables, serr: a string
  local locks = {}
  local shape = r.weighted({ { 3, "m" }, { 4, "s" }, { 3, "ms" }, { 3, "r" }, { 2, "mr" },
                             { 3, "e" }, { 1, "me" }, { 3, "k" }, { 1, "sk" } })
  if shape:find("m") then
    locks[#locks + 1] = { kind = "mutex", cancel = r.chance(0.25) and r.pick(errs) or nil }
  end
  if shape:find("s") then
    locks[#locks + 1] = { kind = "sema", value = r.int(-1, 3),
                          cancel = r.chance(0.25) and r.pick(errs) or nil }
  end
  if shape:find("r") then
    locks[#locks + 1] = { kind = "rw", cancel = r.chance(0.25) and r.pick(errs) or nil }
  end
  if shape:find("e") then
    locks[#locks + 1] = { kind = "re", cancel = r.chance(0.25) and r.pick(errs) or nil }
  end
  if shape:find("k") then
    locks[#locks + 1] = { kind = "krw", cancel = r.chance(0.25) and r.pick(errs) or nil }
  end
  local w = model.new(locks)
  local clock = 0
  local ops = {}
  local next_id = 1
  local n = r.int(1, max_ops)
  local function add(op)
    ops[#ops + 1] = op
    if w:applicable(op) then w:apply(op, clock) end
  end
  local exclude = opts.exclude or {}
  for _ = 1, n do
    local kind = r.weighted({
      { 30, "spawn" }, { 14, "turn" }, { 8, "finish" }, { 3, "raise" },
      { 4, "close" }, { 5, "call_rel" }, { 4, "unscoped" }, { 3, "setValue" },
      { 2, "cancel" }, { 2, "gc" }, { 2, "poke" }, { 3, "check" }, { 4, "nest" },
      { 3, "unnest" }, { 3, "abort" },
    })
    local li = r.int(1, #locks)
    local lock = locks[li]
    if exclude[kind] then
      kind = "skip"                         -- drawn anyway: same numbers after
    end
    if kind == "spawn" then
      local method = r.weighted({ { 4, "acquire" }, { 2, "tbc" }, { 4, "runex" }, { 3, "wait" },
                                  { 1, "steal" } })
      local op = {
        op = "spawn", id = next_id, lock = li, method = method,
        w = lock.kind == "sema" and r.weighted({ { 6, 1 }, { 3, 2 }, { 1, 3 } })
          or (lock.kind == "rw" or lock.kind == "krw") and r.weighted({ { 3, 1 }, { 2, 2 } })
          or 1,
        p = r.pick(PRIOS), deco = gen_deco(r, errs, lock), nilargs = r.chance(0.3),
        key = lock.kind == "krw" and r.pick(KEYS) or nil,
      }
      if method == "steal" then op.deco = nil end   -- a steal is the lock's own
      if method == "runex" then
        op.plan = r.weighted({ { 4, "hold" }, { 3, "return" }, { 2, "raise" }, { 1, "raise_unprot" } })
      end
      next_id = next_id + 1
      add(op)
    elseif kind == "turn" then
      local s = r.pick(SLEEPS)
      clock = clock + s
      add({ op = "turn", sleep = s })
    elseif kind == "finish" or kind == "raise" then
      local id = pick_actor(r, w, { holding = true }, kind == "raise" and function(a)
        return a.method ~= "acquire"
      end)
      if id then add({ op = kind, id = id }) end
    elseif kind == "close" then
      local id = pick_actor(r, w, { queued = true, waiting = true, ready = true, holding = true })
      if id then add({ op = "close", id = id }) end
    elseif kind == "call_rel" or kind == "check" then
      local id = pick_actor(r, w, { holding = true, done = true, closed = true }, function(a)
        return a.rel_visible
      end)
      if id then add({ op = kind, id = id }) end
    elseif kind == "nest" or kind == "unnest" then
      local id = pick_actor(r, w, { holding = true }, function(a)
        return a.L.kind == "re"
      end)
      if id then add({ op = kind, id = id }) end
    elseif kind == "unscoped" then
      add({ op = "unscoped", lock = li, w = lock.kind == "sema" and r.int(1, 2) or nil,
            key = lock.kind == "krw" and r.pick(KEYS) or nil,
            via = r.chance(0.2) and gen_deco(r, errs, lock) or nil })
    elseif kind == "setValue" then
      if lock.kind == "sema" then
        add({ op = "setValue", lock = li, v = r.chance(0.05) and (1 << 40) or r.int(-2, 4),
              via = r.chance(0.2) and gen_deco(r, errs, lock) or nil })
      end
    elseif kind == "cancel" then
      add({ op = "cancel", lock = li, key = lock.kind == "krw" and r.pick(KEYS) or nil,
            via = r.chance(0.2) and gen_deco(r, errs, lock) or nil })
    elseif kind == "abort" then
      -- mostly a signal that some queued request carries
      local id = pick_actor(r, w, { queued = true, waiting = true }, function(a)
        return a.deco ~= nil and a.deco.sig ~= nil
      end)
      local sig, aim, err = r.int(1, 2), r.chance(0.8), r.chance(0.4) and r.pick(errs) or nil
      if id and aim then sig = w.actors[id].deco.sig end
      if id or not aim then add({ op = "abort", sig = sig, err = err }) end
    elseif kind == "gc" then
      add({ op = "gc" })
    elseif kind == "poke" then
      local id = pick_actor(r, w, { queued = true, waiting = true, ready = true })
      if id then add({ op = "poke", id = id }) end
    end
  end
  return { seed = seed, locks = locks, ops = ops }
end

--- A sequence as a Lua chunk (`return {...}`), for printing and replay.
function gen.serialize(seq)
  local function val(v)
    if type(v) == "string" then return string.format("%q", v) end
    if type(v) == "table" then
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      local parts = {}
      for _, k in ipairs(keys) do parts[#parts + 1] = k .. " = " .. val(v[k]) end
      return "{ " .. table.concat(parts, ", ") .. " }"
    end
    return tostring(v)
  end
  local out = { "return {", "  seed = " .. tostring(seq.seed) .. ",", "  locks = {" }
  for _, l in ipairs(seq.locks) do out[#out + 1] = "    " .. val(l) .. "," end
  out[#out + 1] = "  },"
  out[#out + 1] = "  ops = {"
  for _, op in ipairs(seq.ops) do out[#out + 1] = "    " .. val(op) .. "," end
  out[#out + 1] = "  },"
  out[#out + 1] = "}"
  return table.concat(out, "\n")
end

return gen
