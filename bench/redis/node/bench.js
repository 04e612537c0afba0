// The ioredis peer of bench/redis/run.lua: N SETs with CONCURRENCY callers
// awaiting on one connection.  Prints one JSON line.
//   node bench.js PORT N CONCURRENCY
const Redis = require("ioredis");
const [port, n, conc] = process.argv.slice(2).map(Number);
async function main() {
  const c = new Redis({ port, host: "127.0.0.1", lazyConnect: false });
  await c.ping();
  const per = Math.floor(n / conc);
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: conc }, async (_, i) => {
    for (let j = 0; j < per; j++) await c.set("k" + i, "value");
  }));
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ ops: per * conc, seconds: s }));
  c.disconnect();
}
main();
