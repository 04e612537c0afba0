// The node-redlock peer of bench/redis_locks.lua (redlock 5 on ioredis).
//   node bench.js cycles   PORT N CONC RETRY_DELAY
//   node bench.js pingpong PORT N ID RETRY_DELAY     prints "G id t" / "R id t" (CLOCK_MONOTONIC ns)
//   node bench.js contend  PORT MS ID RETRY_DELAY
// RETRY_DELAY "default" keeps redlock's own (200 ms, jitter 100 ms); a number
// sets retryDelay (and retryJitter to a tenth of it).  retryCount is -1
// (retry until granted), the way a waiting lock behaves.  PORT may list
// several servers, comma-separated: a quorum of them (bench/redis_kinds.lua).
// Over several servers retryCount keeps its default (10) and a failed
// acquire is asked again: with -1, a request that won a minority of the
// servers (two processes asking at once) keeps its own keys there while it
// retries, and nobody gets a quorum until they expire (TTL, 30 s); a
// failed acquire gives them back (redlock's own catch), as a user's loop
// over ExecutionError would.
"use strict";
const Redis = require("ioredis");
const { default: Redlock, ExecutionError } = require("redlock");

const [mode, port, a, b, delay] = process.argv.slice(2);
const clients = port.split(",").map((p) => new Redis({ port: Number(p), host: "127.0.0.1" }));
const settings = clients.length > 1 ? {} : { retryCount: -1 };
if (delay !== "default") {
  settings.retryDelay = Number(delay);
  settings.retryJitter = Math.max(1, Number(delay) / 10);
}
const redlock = new Redlock(clients, settings);
const now = () => process.hrtime.bigint();
const TTL = 30000;

// A lock on 'key', asked again until granted.
async function take(key) {
  for (;;) {
    try {
      return await redlock.acquire([key], TTL);
    } catch (e) {
      if (!(e instanceof ExecutionError)) throw e;
    }
  }
}

async function cycles(n, conc) {
  const each = Math.floor(n / conc);
  const t0 = now();
  await Promise.all(Array.from({ length: conc }, async (_, c) => {
    for (let i = 0; i < each; i++) {
      const lock = await take("bench:node:cycles:" + c);
      await lock.release();
    }
  }));
  console.log(JSON.stringify({ ops: each * conc, seconds: Number(now() - t0) / 1e9 }));
}

async function pingpong(n, id) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const lock = await take("bench:node:pingpong");
    out.push(`G ${id} ${now()}`);
    await new Promise((r) => setTimeout(r, 1));
    out.push(`R ${id} ${now()}`);
    await lock.release();
  }
  console.log(out.join("\n"));
}

async function contend(ms, id) {
  let count = 0, maxWait = 0;
  const stop = now() + BigInt(ms) * 1000000n;
  while (now() < stop) {
    const t = now();
    const lock = await take("bench:node:contend");
    const w = Number(now() - t) / 1e6;
    if (w > maxWait) maxWait = w;
    count++;
    await lock.release();
  }
  console.log(JSON.stringify({ id, count, max_wait_ms: maxWait }));
}

(async () => {
  if (mode === "cycles") await cycles(Number(a), Number(b));
  else if (mode === "pingpong") await pingpong(Number(a), b);
  else if (mode === "contend") await contend(Number(a), b);
  clients.forEach((c) => c.disconnect());
})().catch((e) => { console.error(e); process.exit(1); });
