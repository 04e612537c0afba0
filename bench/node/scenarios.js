// The benchmark scenarios on async-mutex 0.5.0 (the library async_mutex
// ports), mirroring bench/scenarios.lua function by function; one scenario
// per process, printing one JSON line.
//
//   node --expose-gc bench/node/scenarios.js SCENARIO [N] [M | bare]
//
// A Lua coroutine is an async function here: spawn() calls it, and it runs
// until its first await, as spawn() in scenarios.lua creates a coroutine and
// resumes it until its first yield.  Both sides time the same work: the
// loops that start waiters (timeout, cancel, priority) create them inside
// the clock on both sides.  scenarios.lua's `before` variant, which creates
// its coroutines before the clock to time the lock alone, has no counterpart
// here (an async function cannot be created without being started) and is
// never compared with these figures.  uv.run() becomes `await finished`: a
// promise settled by the last worker.
"use strict";

const { Mutex, Semaphore, withTimeout, E_TIMEOUT, E_CANCELED } = require("async-mutex");
const fs = require("fs");

const [scenario, nArg, mArg] = process.argv.slice(2);
// The clock, in nanoseconds: BENCH_CLOCK=cpu (the default) is the process's
// CPU time (run.lua then starts node with --single-threaded-gc, so that the
// collector's work is on the one thread, as in Lua); BENCH_CLOCK=wall is
// the monotonic clock.
const CLOCK = process.env.BENCH_CLOCK === "wall" ? "wall" : "cpu";
const now = CLOCK === "wall"
  ? () => Number(process.hrtime.bigint())
  : () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };

function emit(t) {
  const out = {};
  for (const k of Object.keys(t).sort()) out[k] = t[k];
  out.clock = CLOCK;
  process.stdout.write(JSON.stringify(out) + "\n");
}

// Starts fn(...args) now; it runs until its first await.
function spawn(fn, ...args) {
  const p = fn(...args);
  p.catch((err) => { console.error(err); process.exit(1); });
  return p;
}

// A promise and the function that settles it (the loop running out of work).
function barrier() {
  let done;
  const p = new Promise((resolve) => { done = resolve; });
  return [p, done];
}

// The same pseudo-random sequence in Lua and JS (Park-Miller).
function lcg(seed) {
  let x = seed;
  return (m) => {
    x = (x * 48271) % 2147483647;
    return (x % m) + 1;
  };
}

function fullGc() {
  global.gc();
  global.gc();
}

const rssBytes = () => process.memoryUsage().rss;
const ms = (ns) => ns / 1e6;
const tick = () => new Promise((resolve) => setImmediate(resolve));

const S = {};

// 1. Uncontended acquire + release, n times, and runExclusive (best of 3).
S.uncontended = async (n = 1000000) => {
  const m = new Mutex();
  let bestAcq = Infinity, bestRun = Infinity;
  const noop = () => {};
  for (let r = 0; r < 3; r++) {
    let t0 = now();
    for (let i = 0; i < n; i++) {
      const release = await m.acquire();
      release();
    }
    bestAcq = Math.min(bestAcq, now() - t0);
    t0 = now();
    for (let i = 0; i < n; i++) {
      await m.runExclusive(noop);
    }
    bestRun = Math.min(bestRun, now() - t0);
  }
  emit({ scenario: "uncontended", n, acquire_ns: bestAcq / n, run_ns: bestRun / n });
};

// 2. Hand-off: a holder takes the mutex, ncoro workers each do ncycles
// acquire/release cycles, the holder releases; every acquire waits.
S.handoff = async (ncoro = 1000, ncycles = 100) => {
  const total = ncoro * ncycles;
  let waited = 0, done = 0, tEnd;
  // An acquire waited iff a release happened meanwhile (as in scenarios.lua).
  let releases = 0;
  const [finished, finish] = barrier();
  const m = new Mutex();
  const releaseHolder = await m.acquire();
  const worker = async () => {
    for (let i = 0; i < ncycles; i++) {
      const before = releases;
      const release = await m.acquire();
      if (releases !== before) waited++;
      release();
      releases++;
    }
    done++;
    if (done === ncoro) { tEnd = now(); finish(); }
  };
  for (let i = 0; i < ncoro; i++) spawn(worker);
  const t0 = now();
  releaseHolder();
  releases++;
  await finished;
  emit({ scenario: "handoff", coroutines: ncoro, cycles: ncycles,
         waited_pct: 100 * waited / total, ns: (tEnd - t0) / total,
         per_s: total / ((tEnd - t0) / 1e9) });
};

// 3. A chain: n workers queued behind a holder, each acquires and releases
// with no await in between; from the holder's release until the last is done.
S.chain = async (n = 100000) => {
  let done = 0, tEnd;
  const [finished, finish] = barrier();
  const m = new Mutex();
  const releaseHolder = await m.acquire();
  const worker = async () => {
    const release = await m.acquire();
    release();
    done++;
    if (done === n) { tEnd = now(); finish(); }
  };
  for (let i = 0; i < n; i++) spawn(worker);
  const t0 = now();
  releaseHolder();
  await finished;
  emit({ scenario: "chain", n, ms: ms(tEnd - t0) });
};

// 4. n waiters on a held lock through withTimeout(lock, timeout): all expire.
// enqueue: the starting loop; expire: from the first raise to the last.
S.timeout = async (n = 100000, timeout = 50) => {
  let raised = 0, tFirst, tLast;
  const [finished, finish] = barrier();
  const m = new Mutex();
  const releaseHolder = await m.acquire();
  const tm = withTimeout(m, timeout);
  const worker = async () => {
    try {
      await tm.acquire();
      throw new Error("acquired");
    } catch (err) {
      if (err !== E_TIMEOUT) throw err;
    }
    raised++;
    if (raised === 1) tFirst = now();
    if (raised === n) { tLast = now(); finish(); }
  };
  await tick();                                   // uv.update_time()
  const t0 = now();
  for (let i = 0; i < n; i++) spawn(worker);
  const tEnq = now() - t0;
  await finished;
  // The holder is not released: async-mutex would then grant and release its
  // 100,000 phantom requests (its issue #54), which is not what is measured.
  if (!releaseHolder) throw new Error("lost");
  emit({ scenario: "timeout", n, timeout_ms: timeout,
         enqueue_ms: ms(tEnq), expire_ms: ms(tLast - tFirst),
         work_ms: ms(tEnq + tLast - tFirst), total_ms: ms(tLast - t0) });
};

// 5. n waiters, then cancel(): from cancel() until the last one has raised.
S.cancel = async (n = 100000) => {
  let raised = 0, tLast;
  const [finished, finish] = barrier();
  const m = new Mutex();
  const releaseHolder = await m.acquire();
  const worker = async () => {
    try {
      await m.acquire();
      throw new Error("acquired");
    } catch (err) {
      if (err !== E_CANCELED) throw err;
    }
    raised++;
    if (raised === n) { tLast = now(); finish(); }
  };
  const t0 = now();
  for (let i = 0; i < n; i++) spawn(worker);
  const tEnq = now() - t0;
  const t1 = now();
  m.cancel();
  await finished;
  releaseHolder();
  emit({ scenario: "cancel", n, enqueue_ms: ms(tEnq), cancel_ms: ms(tLast - t1) });
};

// 6. n waiters with random priorities 1..1000 behind a holder, then drained
// (each acquires and releases); checks that they ran in priority order.
S.priority = async (n = 100000) => {
  const rand = lcg(42);
  let done = 0, tLast, lastPrio = Infinity, inversions = 0;
  const [finished, finish] = barrier();
  const m = new Mutex();
  const releaseHolder = await m.acquire();
  const worker = async (prio) => {
    const release = await m.acquire(prio);
    if (prio > lastPrio) inversions++;
    lastPrio = prio;
    release();
    done++;
    if (done === n) { tLast = now(); finish(); }
  };
  const t0 = now();
  for (let i = 0; i < n; i++) spawn(worker, rand(1000));
  const tEnq = now() - t0;
  const t1 = now();
  releaseHolder();
  await finished;
  if (inversions !== 0) throw new Error("priority order broken");
  emit({ scenario: "priority", n, enqueue_ns: tEnq / n, drain_ns: (tLast - t1) / n });
};

// 7. A Semaphore of `value`; n workers acquire random weights 1..8 behind a
// holder of the whole value, and release at once; from the holder's release.
S.semaphore = async (n = 10000, value = 16) => {
  const rand = lcg(7);
  let done = 0, tLast;
  const [finished, finish] = barrier();
  const s = new Semaphore(value);
  const [, releaseHolder] = await s.acquire(value);
  const worker = async (weight) => {
    const [, release] = await s.acquire(weight);
    release();
    done++;
    if (done === n) { tLast = now(); finish(); }
  };
  for (let i = 0; i < n; i++) spawn(worker, rand(8));
  const t0 = now();
  releaseHolder();
  await finished;
  if (s.getValue() !== value) throw new Error("value not restored");
  emit({ scenario: "semaphore", n, value, ms: ms(tLast - t0) });
};

// 8. Memory: n workers waiting on a held mutex ("bare": n async functions
// suspended on one never-settled promise), V8 heap after a full GC and RSS.
// The lock (or the promise) is used after the measurement: V8 collects what
// a suspended function will not use again, waiters included.
S.memory = async (n = 100000, bare = false) => {
  let body, m, never;
  if (bare) {
    never = new Promise(() => {});
    body = async () => { await never; };
  } else {
    m = new Mutex();
    await m.acquire();
    body = async () => {
      const release = await m.acquire();
      release();
    };
  }
  const cos = new Array(n).fill(false);       // the anchor array, preallocated
  await tick();
  fullGc();
  const heap0 = process.memoryUsage().heapUsed, rss0 = rssBytes();
  for (let i = 0; i < n; i++) cos[i] = spawn(body);
  await tick();
  fullGc();
  const heap1 = process.memoryUsage().heapUsed, rss1 = rssBytes();
  if (!(bare ? never instanceof Promise : m.isLocked())) throw new Error("lost");
  emit({ scenario: "memory", n, bare, heap_b: (heap1 - heap0) / n,
         rss_b: (rss1 - rss0) / n, rss_mb: rss1 / 2 ** 20, anchored: cos.length });
};

const f = S[scenario];
if (!f) throw new Error("unknown scenario " + scenario);
const num = (s) => (s === undefined ? undefined : Number(s));
f(num(nArg), mArg === "bare" ? true : num(mArg))
  .catch((err) => { console.error(err); process.exit(1); });
