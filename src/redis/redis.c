/*
** redis.c: async_mutex.redis_core, a Redis connection on luv's loop: the
** module's registration.  A connection is a socket of the client's own,
** watched by a luv poll handle that the Lua layer's hooks make through
** luv's Lua API (src/async_mutex/redis.lua); its callback is a C function
** (event.c), and hiredis's reader parses the replies.  Requests are
** written in the protocol's form into an output buffer of the client and
** sent with send() (output.c).  Calls from any number of coroutines are
** appended to that buffer, written together, and answered in order: a
** FIFO of waiting coroutines pairs each reply with its caller (call.c).
** Nothing here includes a header of luv or libuv, nor links libuv.  The
** files and their jobs: redis.h.  See docs/redis.md.
*/
#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"



/*
** hex(bytes): the bytes in lower-case hexadecimal.  The Redis locks make
** their tokens from it (a gsub over a table, before, cost a tenth of a
** lock cycle's instructions).
*/
static int core_hex (lua_State *L) {
  static const char digit[] = "0123456789abcdef";
  size_t len, k;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, 2 * len);
  for (k = 0; k < len; k++) {
    out[2 * k] = digit[s[k] >> 4];
    out[2 * k + 1] = digit[s[k] & 15];
  }
  luaL_pushresultsize(&b, 2 * len);
  return 1;
}



static const luaL_Reg client_methods[] = {
  {"call", amr_client_call},
  {"close", amr_client_close},
  {"pending", amr_client_pending},
  {NULL, NULL}
};

static const luaL_Reg client_metamethods[] = {
  {"__gc", amr_client__gc},
  {"__close", amr_client_close},
  {"__tostring", amr_client__tostring},
  {NULL, NULL}
};

static const luaL_Reg core_funcs[] = {
  {"new", amr_core_new},
  {"send", amr_core_send},
  {"listen", amr_core_listen},
  {"fail", amr_core_fail},
  {"drop", amr_core_drop},
  {"status", amr_core_status},
  {"state", amr_core_state},
  {"alive", amr_core_alive},
  {"error", amr_core_error},
  {"error_text", amr_core_error_text},
  {"hex", core_hex},
  {"progress", amr_core_progress},
  {"epoch", amr_core_epoch},
  {"now", amr_core_now},
  {"script", amr_core_script},
  {"wait", amr_core_wait},
  {"wake", amr_core_wake},
  {"claim", amr_core_claim},
  {"enlist", amr_core_enlist},
  {"keyslot", amr_keyslot},
  {NULL, NULL}
};


/*
** The module table: the functions above, E_UNAVAILABLE, hooks (filled
** by the Lua layer: open, watch, connected, lost, attempt, message,
** progress, report, now; here: unavailable, E_UNAVAILABLE, WEAK_V) and
** Client (the methods table, which the Lua layer extends).
*/
__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_redis_core (lua_State *L) {
  amr_openerror(L);
  lua_newtable(L);                              /* module */
  lua_newtable(L);                              /* hooks */
  luaL_newmetatable(L, AM_REDIS_CLIENT);        /* module hooks mt */
  lua_pushvalue(L, -2);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, client_metamethods, 2);      /* upvalues: hooks, mt */
  lua_newtable(L);                              /* methods */
  lua_pushvalue(L, -3);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, client_methods, 2);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_setfield(L, -4, "Client");               /* module.Client */
  lua_pushvalue(L, -2);
  lua_setfield(L, -4, "hooks");                 /* module hooks mt */
  luaL_setfuncs(L, core_funcs, 2);              /* module */
  /* E_UNAVAILABLE and its reasons: async_mutex.unavailable (pure Lua,
     shared with async_mutex) */
  lua_getfield(L, -1, "hooks");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "async_mutex.unavailable");
  lua_call(L, 1, 1);                            /* module hooks unav */
  lua_getfield(L, -1, "new");
  lua_setfield(L, -3, "unavailable");
  lua_getfield(L, -1, "E_UNAVAILABLE");
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "E_UNAVAILABLE");         /* hooks.E_UNAVAILABLE */
  lua_setfield(L, -4, "E_UNAVAILABLE");         /* module.E_UNAVAILABLE */
  lua_pop(L, 1);
  lua_newtable(L);                              /* weak values */
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setfield(L, -2, "WEAK_V");
  lua_pop(L, 1);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &amr_ANCHORED) != LUA_TTABLE) {
    lua_newtable(L);            /* (kept if the module is loaded again) */
    lua_rawsetp(L, LUA_REGISTRYINDEX, &amr_ANCHORED);
  }
  lua_pop(L, 1);
  return 1;
}
