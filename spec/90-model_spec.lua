-- Model-based random testing.
--
-- spec/fuzz/model.lua is a small executable model of docs/semantics.md;
-- spec/fuzz/gen.lua generates random operation sequences; spec/fuzz/runner.lua
-- runs each sequence against the real module and the model and compares them
-- after every step.  The first block checks the model itself on hand-written
-- scenarios taken from docs/semantics.md; the second runs the comparison.
--
--   AM_FUZZ_N=20000 AM_FUZZ_SEED=123 make test    more / other sequences
--   make fuzz N=1000000 [J=2] [SEED=...]           the long run, in child processes
--
-- A failure prints the seed, the step, what differed, and the shortest
-- sequence that reproduces it (shrunk by delta debugging, each candidate run
-- in a fresh process), which `lua5.4 spec/fuzz/runner.lua replay FILE` replays.

local h = require "helpers"            -- AM_GC_STRESS=1 applies to this file too
local model = require "fuzz.model"

-- Runs ops (op tables as in gen.lua) on a fresh model; `turn` ops take their
-- loop time from op.at (default: the time of the previous turn), and the
-- loop time of an idle phase that came before their timers from op.before
-- (default: none, the idle phase came after them).
local function run(locks, ops)
  local w = model.new(locks)
  local now = 0
  for _, op in ipairs(ops) do
    if op.at then now = op.at end
    assert(w:applicable(op), "op not applicable: " .. op.op)
    w:apply(op, now, op.before)
  end
  assert.are.same({}, w.violations)
  return w
end

local function spawn(id, lock, method, w, p, extra)
  local op = { op = "spawn", id = id, lock = lock, method = method, w = w or 1, p = p or 0 }
  for k, v in pairs(extra or {}) do op[k] = v end
  return op
end
local TURN = { op = "turn" }

describe("the fuzz model", function()
  local MUTEX = { { kind = "mutex" } }
  local function sema(v) return { { kind = "sema", value = v } } end

  it("hands out the value before the decrement, taken at grant time", function()
    local w = run(sema(0), {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire"),
      { op = "setValue", lock = 1, v = 5 }, TURN,
    })
    assert.are.same({ "got 1 5", "got 2 4" }, w.log)
    assert.are.equal(3, w.locks[1].value)
  end)

  it("grants at once (without queuing) only when no queued entry has priority >= p", function()
    local w = run(sema(1), {
      spawn(1, 1, "acquire", 2),             -- queued: weight 2 > value 1
      spawn(2, 1, "acquire", 1, 0),          -- same priority: head-of-line blocked
      spawn(3, 1, "acquire", 1, 1),          -- higher priority: skips the queue
    })
    assert.are.same({ "got 3 1" }, w.log)
    assert.are.equal("queued", w.actors[2].state)
  end)

  it("dispatches strictly from the head, a heavy high-priority head blocks the rest", function()
    local w = run(sema(1), {
      spawn(1, 1, "acquire", 1, 0), spawn(2, 1, "acquire", 1, 0),   -- 1 holds, 2 queued
      spawn(3, 1, "acquire", 2, 5),                                 -- new head, too heavy
      { op = "call_rel", id = 1 }, TURN,
    })
    assert.are.same({ "got 1 1" }, w.log)
    assert.are.equal(1, w.locks[1].value)
    local w2 = run(sema(1), {
      spawn(1, 1, "acquire", 1, 0), spawn(2, 1, "acquire", 1, 0),
      spawn(3, 1, "acquire", 2, 5), { op = "call_rel", id = 1 },
      { op = "unscoped", lock = 1, w = 2 }, TURN,
    })
    assert.are.same({ "got 1 1", "got 3 3", "got 2 1" }, w2.log)
  end)

  it("resolves waitForUnlock waiters above the head's priority before each grant, heaviest first", function()
    local w = run(sema(0), {
      spawn(1, 1, "acquire", 1, 0),                                   -- queued acquirer
      spawn(2, 1, "wait", 1, 1), spawn(3, 1, "wait", 3, 1), spawn(4, 1, "wait", 2, 1),
      spawn(5, 1, "wait", 1, 0),                                      -- not above the head
      { op = "setValue", lock = 1, v = 3 }, TURN,
    })
    assert.are.same({ "unlocked 3", "unlocked 4", "unlocked 2", "got 1 3", "unlocked 5" }, w.log)
  end)

  it("cancel rejects queued acquirers in queue order and re-evaluates unlock waiters (P4)", function()
    local w = run({ { kind = "mutex", cancel = "cerr1" } }, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire", 1, 0), spawn(3, 1, "acquire", 1, 1),
      { op = "call_rel", id = 1 }, TURN,                              -- 3 holds, 2 queued
      spawn(4, 1, "wait"), { op = "call_rel", id = 3 },               -- 2 granted
      spawn(5, 1, "acquire"), { op = "cancel", lock = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "got 3 -", "got 2 -", "err 5 cerr1" }, w.log)
    assert.are.equal("waiting", w.actors[4].state)  -- 2 holds: cannot lock now
    local w2 = run(MUTEX, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire", 1, 1), spawn(3, 1, "wait", 1, 0),
      { op = "unscoped", lock = 1 },                                  -- 2 granted
      { op = "call_rel", id = 1 },                                    -- stale: 2 still holds (P3)
      spawn(4, 1, "acquire", 1, 5),
    })
    assert.are.same({ "got 1 -" }, w2.log)
    assert.are.equal("queued", w2.actors[4].state)  -- behind 2's grant
  end)

  it("P1: an expired request leaves the queue and lighter entries behind it are granted", function()
    local w = run(sema(1), {
      spawn(1, 1, "acquire", 2, 0, { deco = { kind = "t", ms = 3 } }),
      spawn(2, 1, "acquire", 1, 0),
      { op = "turn", at = 2 },                                        -- not yet
      { op = "turn", at = 3 },
    })
    assert.are.same({ "err 1 E_TIMEOUT", "got 2 1" }, w.log)
    assert.are.equal(0, w.locks[1].value)
  end)

  it("plays a turn's timer and idle phases in the order the loop ran them (libuv's own)", function()
    -- 2 is granted by the release; 3 waits behind it with a deadline at 3
    local ops = {
      spawn(1, 1, "acquire"),
      spawn(2, 1, "runex", 1, 0, { plan = "return" }),
      spawn(3, 1, "acquire", 1, 0, { deco = { kind = "t", ms = 3 } }),
      { op = "call_rel", id = 1 },
    }
    -- timers first (libuv 1.44): 3 times out, then 2 runs and releases
    local timers_first = { table.unpack(ops) }
    timers_first[#timers_first + 1] = { op = "turn", at = 5 }
    local w = run(MUTEX, timers_first)
    assert.are.same({ "got 1 -", "enter 2 -", "done 2", "err 3 E_TIMEOUT" }, w.log)
    assert.are.equal(1, w.locks[1].value)
    -- the idle phase first (libuv >= 1.45): 2 runs and releases, 3 is
    -- granted before its deadline's timer phase (docs/semantics.md,
    -- Timeouts: a grant before the deadline wins)
    local idle_first = { table.unpack(ops) }
    idle_first[#idle_first + 1] = { op = "turn", at = 5, before = 0 }
    local w2 = run(MUTEX, idle_first)
    assert.are.same({ "got 1 -", "enter 2 -", "done 2", "got 3 -" }, w2.log)
    assert.are.equal("holding", w2.actors[3].state)
    -- a timeout settled in the timer phase waits for the next turn's idle phase
    local w3 = run(MUTEX, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire", 1, 0, { deco = { kind = "t", ms = 1 } }),
      { op = "turn", at = 1, before = 0 },
    })
    assert.are.same({ "got 1 -" }, w3.log)
    assert.are.equal("ready", w3.actors[2].state)
    w3:apply({ op = "turn" }, 1, 1)
    assert.are.same({ "got 1 -", "err 2 E_TIMEOUT" }, w3.log)
  end)

  it("fires deadlines in due order, then creation order", function()
    local w = run(MUTEX, {
      spawn(1, 1, "runex", 1, 0, { plan = "hold" }),
      spawn(2, 1, "acquire", 1, 0, { deco = { kind = "t", ms = 5, err = "cerr1" } }),
      spawn(3, 1, "acquire", 1, 0, { deco = { kind = "t", ms = 2 } }),
      spawn(4, 1, "wait", 1, 0, { deco = { kind = "t", ms = 2 } }),
      { op = "turn", at = 6 },
    })
    assert.are.same({ "enter 1 -", "err 3 E_TIMEOUT", "err 4 E_TIMEOUT", "err 2 cerr1" }, w.log)
  end)

  it("P2: a failed try raises at once and queues nothing", function()
    local w = run(MUTEX, {
      spawn(1, 1, "acquire"),
      spawn(2, 1, "acquire", 1, 0, { deco = { kind = "try" } }),
      spawn(3, 1, "wait", 1, 0, { deco = { kind = "try", err = "serr" } }),
      { op = "call_rel", id = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "err 2 E_ALREADY_LOCKED", "err 3 serr" }, w.log)
    assert.are.equal(1, w.locks[1].value)
  end)

  it("P3: a mutex release is a no-op while unlocked, and never makes the value 2", function()
    local w = run(MUTEX, {
      spawn(1, 1, "acquire"), { op = "unscoped", lock = 1 }, { op = "call_rel", id = 1 },
      { op = "unscoped", lock = 1 },
    })
    assert.are.equal(1, w.locks[1].value)
    -- a grant given back by a coroutine closed before it was resumed
    local w2 = run(MUTEX, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire"), { op = "call_rel", id = 1 },
      { op = "unscoped", lock = 1 }, { op = "close", id = 2 },
      spawn(3, 1, "acquire"), spawn(4, 1, "acquire"),
    })
    assert.are.same({ "got 1 -", "got 3 -" }, w2.log)
    assert.are.equal("queued", w2.actors[4].state)
  end)

  it("closing a queued coroutine removes it at once and the lock passes on", function()
    local w = run(sema(1), {
      spawn(1, 1, "acquire", 1), spawn(2, 1, "acquire", 2), spawn(3, 1, "acquire", 1),
      { op = "call_rel", id = 1 },           -- value 1: head (2) too heavy
      { op = "close", id = 2 }, TURN,
    })
    assert.are.same({ "got 1 1", "got 3 1" }, w.log)
  end)

  it("runExclusive releases before the body's error leaves, and reports escapes", function()
    local w = run(MUTEX, {
      spawn(1, 1, "acquire"),
      spawn(2, 1, "runex", 1, 0, { plan = "raise_unprot" }),
      spawn(3, 1, "runex", 1, 0, { plan = "return" }),
      { op = "call_rel", id = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "enter 2 -", "handler raise#2", "enter 3 -", "done 3" }, w.log)
    assert.are.equal(1, w.locks[1].value)
  end)

  it("RWLock: readers share, a reader queues behind a waiting writer, readers at the head enter together", function()
    local RW = { { kind = "rw" } }
    local w = run(RW, {
      spawn(1, 1, "acquire", 1), spawn(2, 1, "acquire", 1),    -- two readers at once
      spawn(3, 1, "acquire", 2),                                -- a writer waits
      spawn(4, 1, "acquire", 1), spawn(5, 1, "acquire", 1),    -- readers behind it
      spawn(6, 1, "wait"),
      { op = "call_rel", id = 1 }, { op = "call_rel", id = 2 }, TURN,
    })
    assert.are.same({ "got 1 -", "got 2 -", "got 3 -" }, w.log)
    assert.are.equal(-1, w.locks[1].value)
    local w2 = run(RW, {
      spawn(1, 1, "acquire", 2), spawn(2, 1, "acquire", 1), spawn(3, 1, "acquire", 1),
      spawn(4, 1, "acquire", 2), { op = "unscoped", lock = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "got 2 -", "got 3 -" }, w2.log)
    assert.are.equal(2, w2.locks[1].value)
    assert.are.equal("queued", w2.actors[4].state)
  end)
end)

describe("the fuzz model of the other lock kinds (docs/lockkinds.md)", function()
  it("ReentrantMutex: the holder nests at once past the queue; the lock is free once every level ended", function()
    local RE = { { kind = "re" } }
    local w = run(RE, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire", 1, 5),     -- 2 queued, high priority
      { op = "nest", id = 1 }, { op = "nest", id = 1 },         -- past 2
      { op = "call_rel", id = 1 },                              -- the outer level, first
      { op = "unnest", id = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "nest 1 2", "nest 1 3", "unnest 1" }, w.log)
    assert.are.equal(1, w.locks[1].levels)
    assert.are.equal("queued", w.actors[2].state)
    local w2 = run(RE, {
      spawn(1, 1, "tbc"), spawn(2, 1, "acquire"), { op = "nest", id = 1 },
      { op = "finish", id = 1 }, TURN,                          -- leaves its level, then its hold
    })
    assert.are.same({ "got 1 -", "nest 1 2", "end 1", "got 2 -" }, w2.log)
    assert.are.equal(w2.actors[2], w2.locks[1].owner)
    assert.is_false(w2:applicable({ op = "nest", id = 1 }))     -- no longer the holder
  end)

  it("leases: a hold that outlasts its lease is given back; its releaser returns false, check raises", function()
    local MUTEX = { { kind = "mutex" } }
    local lease = { kind = "none", lease = { ms = 3 } }
    local w = run(MUTEX, {
      spawn(1, 1, "acquire", 1, 0, { deco = lease }), spawn(2, 1, "acquire"),
      { op = "check", id = 1 }, { op = "turn", at = 2 },
      { op = "turn", at = 3 },                                  -- lost: 2 granted
      { op = "call_rel", id = 1 }, { op = "check", id = 1 },
    })
    assert.are.same({ "got 1 -", "check 1 true", "got 2 -", "rel 1 false", "check 1 E_LOST" }, w.log)
    local w2 = run(MUTEX, {
      spawn(1, 1, "acquire"),
      spawn(2, 1, "runex", 1, 0, { plan = "hold", deco = { kind = "none", lease = { ms = 2, from = true, err = "cerr1" } } }),
      { op = "turn", at = 1 }, { op = "call_rel", id = 1 }, { op = "turn", at = 5 },  -- granted at 5: lease ran out at 2
      { op = "turn", at = 6 }, { op = "finish", id = 2 },
    })
    assert.are.same({ "got 1 -", "enter 2 -", "err 2 cerr1" }, w2.log)
    assert.are.equal(1, w2.locks[1].value)
  end)

  it("abort signals: an abort settles every queued request of its signal in queue order; later ones fail at once", function()
    local LOCKS = { { kind = "mutex" }, { kind = "sema", value = 0 } }
    local sig = { kind = "none", sig = 1 }
    local w = run(LOCKS, {
      spawn(1, 1, "acquire"),                                   -- holds the mutex
      spawn(2, 1, "acquire", 1, 0, { deco = sig }),
      spawn(3, 2, "acquire", 1, 0, { deco = sig }),
      spawn(4, 1, "acquire"),                                   -- no signal: stays
      spawn(5, 1, "wait", 1, 0, { deco = sig }),
      { op = "abort", sig = 1, err = "cerr1" },
      { op = "abort", sig = 1, err = "cerr2" },                 -- once: changes nothing
      { op = "setValue", lock = 2, v = 1 },
      spawn(6, 2, "acquire", 1, 0, { deco = sig }),             -- free, yet fails at once
      TURN, { op = "call_rel", id = 1 }, TURN,
    })
    assert.are.same({ "got 1 -", "err 6 cerr1", "err 2 cerr1", "err 3 cerr1", "err 5 cerr1", "got 4 -" }, w.log)
    assert.are.equal(1, w.locks[2].value)
    -- an aborted head no longer blocks the entries behind it
    local w2 = run({ { kind = "sema", value = 1 } }, {
      spawn(1, 1, "acquire"), spawn(2, 1, "acquire", 2, 0, { deco = sig }), spawn(3, 1, "acquire"),
      { op = "call_rel", id = 1 }, { op = "abort", sig = 1 }, TURN,
    })
    assert.are.same({ "got 1 1", "err 2 E_CANCELED", "got 3 1" }, w2.log)
  end)

  it("KeyedRWLock: an RWLock per key, made on demand and dropped when idle", function()
    local KRW = { { kind = "krw" } }
    local function kspawn(id, method, mode, key) return spawn(id, 1, method, mode, 0, { key = key }) end
    local w = run(KRW, {
      kspawn(1, "acquire", 2, "a"), kspawn(2, "acquire", 1, "a"), kspawn(3, "acquire", 1, "b"),
      { op = "unscoped", lock = 1, key = "a" }, TURN,
    })
    assert.are.same({ "got 1 -", "got 3 -", "got 2 -" }, w.log)
    assert.are.equal(1, w.locks[1].subs.a.value)
    local w2 = run(KRW, { kspawn(1, "wait", 2, "a"), spawn(2, 1, "runex", 1, 0, { key = "b", plan = "return" }) })
    assert.are.same({ "unlocked 1", "enter 2 -", "done 2" }, w2.log)
    assert.are.same({}, w2.locks[1].subs)
  end)
end)

describe("async_mutex against the model", function()
  local runner = require "fuzz.runner"
  local N = tonumber(os.getenv("AM_FUZZ_N") or "")
    or (os.getenv("AM_GC_STRESS") == "1" and 200 or 2000)
  local SEED = tonumber(os.getenv("AM_FUZZ_SEED") or "") or 1

  it(("agrees on %d random sequences (seeds %d..%d)"):format(N, SEED, SEED + N - 1), function()
    local res = runner.run_many({ start = SEED, count = N })
    if not res.ok then
      error(("\n%s\n(%d sequences, %d ops passed before it)"):format(
        res.report, res.sequences, res.ops), 0)
    end
    assert.are.equal(N, res.sequences)
    assert.is_true(res.ops > N * 5)          -- the sequences did something
    h.gc()
  end)
end)
