/*
** fixed_time.c: time() that always returns one instant, for callgrind
** counts that repeat exactly (docs/debug.md, Measurements).  Lua seeds its
** string hashes with time() and addresses; under `setarch -R` (addresses
** fixed) and with this preloaded, two runs of one script execute the same
** instructions, where they otherwise differ by about 1.5%.
**   cc -shared -fPIC -O2 -o /tmp/fixed_time.so bench/tools/fixed_time.c
**   LD_PRELOAD=/tmp/fixed_time.so setarch -R valgrind --tool=callgrind ...
*/

#include <time.h>

time_t time (time_t *t) {
  if (t != NULL) *t = 1700000000;
  return 1700000000;
}
