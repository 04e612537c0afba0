/*
** slot.c: the Redis Cluster slot of a key (docs/redis.md, "Cluster"),
** for the cluster client (async_mutex/redis_cluster.lua).  In C because
** the client computes it for every command and every lock script: the
** CRC in Lua cost about half of a keyed lock cycle's Lua instructions
** (docs/redis-locks.md, "On a cluster").
*/
#define LUA_LIB

#include <stddef.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"

#define NSLOTS 16384

/*
** CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no
** reflection), as the Redis Cluster specification defines the slot:
** CRC16(key) mod 16384.  By a table of the CRC of each byte value (entry
** i: i << 8 shifted through the polynomial 8 times), built on first use,
** one lookup per byte: the bitwise loop costs 8 steps per byte.  (The
** table's words are written to the same values by any process that
** builds it, so a second build by another Lua state is harmless.)
*/
static unsigned short CRC[256];
static int crc_built = 0;

static void build_crc (void) {
  unsigned i, c;
  int bit;
  for (i = 0; i < 256; i++) {
    c = i << 8;
    for (bit = 0; bit < 8; bit++)
      c = (c & 0x8000) ? ((c << 1) ^ 0x1021) : (c << 1);
    CRC[i] = (unsigned short)(c & 0xffff);
  }
  crc_built = 1;
}

static unsigned crc16 (const unsigned char *s, size_t n) {
  unsigned c = 0;
  size_t i;
  if (!crc_built) build_crc();
  for (i = 0; i < n; i++)
    c = ((c << 8) & 0xffff) ^ CRC[((c >> 8) ^ s[i]) & 0xff];
  return c;
}


/*
** core.keyslot(key): the slot of key (a string), of the part between its
** first '{' and the next '}' when that part is not empty (a hash tag).
*/
int amr_keyslot (lua_State *L) {
  size_t n, open, close;
  const char *k = luaL_checklstring(L, 1, &n);
  for (open = 0; open < n && k[open] != '{'; open++) {}
  if (open < n) {
    for (close = open + 1; close < n && k[close] != '}'; close++) {}
    if (close < n && close > open + 1) {
      k += open + 1;
      n = close - open - 1;
    }
  }
  lua_pushinteger(L, (lua_Integer)(crc16((const unsigned char *)k, n) % NSLOTS));
  return 1;
}
