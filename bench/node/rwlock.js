// The read-mostly scenario of bench/lockkinds.lua on Node: npm's
// async-rwlock 1.1.1 (and async-mutex 0.5.0's Mutex doing the same work),
// one scenario per process, printing one JSON line.
//
//   node bench/node/rwlock.js readmostly rwlock|mutex [NCO] [ROUNDS]
//
// NCO async functions (the Lua side's coroutines) each take the lock ROUNDS
// times, reading or writing on the same pattern as bench/lockkinds.lua
// (a write when (i * 31 + r * 17) % 20 == 0: 5%), and hold it across one
// turn of the event loop (setImmediate: the Lua side's am.sleep(0), which
// yields to the loop once).  All are started inside the clock on both
// sides, as am.spawn starts the coroutines there.  The clock is the
// process's CPU time (user + system), as os.clock() on the Lua side; wall
// time too.  Best of 3 rounds in one process (the JIT warm after the
// first), as the Lua side takes the best of 3.
"use strict";

const { RWLock } = require("async-rwlock");
const { Mutex } = require("async-mutex");

const [scenario, kind = "rwlock", ncoArg, roundsArg] = process.argv.slice(2);
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const wall = () => Number(process.hrtime.bigint()) / 1e9;
const tick = () => new Promise((resolve) => setImmediate(resolve));

async function readMostly(nco, rounds) {
  const lock = kind === "rwlock" ? new RWLock() : new Mutex();
  let finished = 0, done;
  const all = new Promise((resolve) => { done = resolve; });
  const c0 = cpu(), w0 = wall();
  for (let i = 1; i <= nco; i++) {
    (async () => {
      for (let r = 1; r <= rounds; r++) {
        const write = (i * 31 + r * 17) % 20 === 0;
        if (kind === "rwlock") {
          if (write) await lock.writeLock(); else await lock.readLock();
          await tick();
          lock.unlock();
        } else {
          const release = await lock.acquire();
          await tick();
          release();
        }
      }
      finished++;
      if (finished === nco) done();
    })().catch((err) => { console.error(err); process.exit(1); });
  }
  await all;
  return [cpu() - c0, wall() - w0];
}

async function main(nco, rounds) {
  let bestCpu = Infinity, bestWall = Infinity, firstCpu;
  for (let i = 0; i < 3; i++) {
    const [c, w] = await readMostly(nco, rounds);
    if (i === 0) firstCpu = c;
    bestCpu = Math.min(bestCpu, c);
    bestWall = Math.min(bestWall, w);
  }
  process.stdout.write(JSON.stringify({
    scenario: "readmostly", kind, coroutines: nco, rounds, cpu_s: bestCpu, wall_s: bestWall,
    first_cpu_s: firstCpu,
  }) + "\n");
}

if (scenario !== "readmostly") {
  console.error("usage: node bench/node/rwlock.js readmostly rwlock|mutex [NCO] [ROUNDS]");
  process.exit(2);
}
main(Number(ncoArg) || 1000, Number(roundsArg) || 10);
