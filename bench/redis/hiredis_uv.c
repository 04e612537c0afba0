/*
** hiredis_uv.c: the bare C baseline of bench/redis/run.lua: hiredis's
** asynchronous API on libuv (its bundled adapter), N SETs with
** CONCURRENCY requests in flight on one connection.  Prints one JSON line.
**   hiredis_uv PORT N CONCURRENCY
*/
#include <stdio.h>
#include <stdlib.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libuv.h>

static long left, sent, total;
static uint64_t t0;
static uv_loop_t *loop;

static void on_reply (redisAsyncContext *ac, void *r, void *priv) {
  (void)priv;
  if (r == NULL) { fprintf(stderr, "error: %s\n", ac->errstr); exit(1); }
  if (--left == 0) {
    double s = (uv_hrtime() - t0) / 1e9;
    printf("{\"ops\": %ld, \"seconds\": %f}\n", total, s);
    redisAsyncDisconnect(ac);
    return;
  }
  if (sent < total) {
    sent++;
    redisAsyncCommand(ac, on_reply, NULL, "SET k%ld value", sent % 50);
  }
}

static void on_ping (redisAsyncContext *ac, void *r, void *priv) {
  long conc = (long)priv, i;
  (void)r;
  t0 = uv_hrtime();
  for (i = 0; i < conc && sent < total; i++) {
    sent++;
    redisAsyncCommand(ac, on_reply, NULL, "SET k%ld value", i);
  }
}

int main (int argc, char **argv) {
  redisAsyncContext *ac;
  long conc;
  if (argc < 4) return 2;
  total = left = atol(argv[2]);
  conc = atol(argv[3]);
  loop = uv_default_loop();
  ac = redisAsyncConnect("127.0.0.1", atoi(argv[1]));
  if (ac->err) { fprintf(stderr, "%s\n", ac->errstr); return 1; }
  redisLibuvAttach(ac, loop);
  redisAsyncCommand(ac, on_ping, (void *)conc, "PING");
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}
