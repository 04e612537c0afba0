// The node-redlock peer of bench/redis_locks.lua (redlock 5 on ioredis).
//   node bench.js cycles   PORT N CONC RETRY_DELAY
//   node bench.js pingpong PORT N ID RETRY_DELAY     prints "G id t" / "R id t" (CLOCK_MONOTONIC ns)
//   node bench.js contend  PORT MS ID RETRY_DELAY
// RETRY_DELAY "default" keeps redlock's own (200 ms, jitter 100 ms); a number
// sets retryDelay (and retryJitter to a tenth of it).  retryCount is -1
// (retry until granted), the way a waiting lock behaves.
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock").default;

const [mode, port, a, b, delay] = process.argv.slice(2);
const client = new Redis({ port: Number(port), host: "127.0.0.1" });
const settings = { retryCount: -1 };
if (delay !== "default") {
  settings.retryDelay = Number(delay);
  settings.retryJitter = Math.max(1, Number(delay) / 10);
}
const redlock = new Redlock([client], settings);
const now = () => process.hrtime.bigint();
const TTL = 30000;

async function cycles(n, conc) {
  const each = Math.floor(n / conc);
  const t0 = now();
  await Promise.all(Array.from({ length: conc }, async (_, c) => {
    for (let i = 0; i < each; i++) {
      const lock = await redlock.acquire(["bench:node:cycles:" + c], TTL);
      await lock.release();
    }
  }));
  console.log(JSON.stringify({ ops: each * conc, seconds: Number(now() - t0) / 1e9 }));
}

async function pingpong(n, id) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const lock = await redlock.acquire(["bench:node:pingpong"], TTL);
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
    const lock = await redlock.acquire(["bench:node:contend"], TTL);
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
  client.disconnect();
})().catch((e) => { console.error(e); process.exit(1); });
