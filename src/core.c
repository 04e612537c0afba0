/*
** core.c: luaopen_async_mutex_core, the module's only exported symbol
** Opens the per-state scheduler, registers the lock types, and offers the
** entry points the Lua layer composes into withTimeout and tryAcquire.
*/

#define LUA_LIB

#include <math.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


#define getstate(L)  ((State *)lua_touserdata(L, lua_upvalueindex(1)))


/*
** core.acquire(lock, limit, err, ...) and core.waitForUnlock(...): the
** lock's method with a limit: 'limit' is a timeout in ms, or false for
** tryAcquire; 'err' is raised when the limit is hit.  The user's own
** arguments (...) start at index 4 and are numbered from 1 in errors.
*/
static int limited (lua_State *L, int kind, const char *fname) {
  int mode = AM_TRY;
  lua_Number ms = 0;
  luaL_argexpected(L, am_tolock(L, 1) != NULL, 1, "lock");
  if (lua_type(L, 2) == LUA_TNUMBER) {
    ms = lua_tonumber(L, 2);
    luaL_argcheck(L, ms >= 0, 2, "timeout must be a non-negative number");
    mode = (ms == HUGE_VAL) ? AM_WAIT : AM_TIMEOUT;
  }
  else
    luaL_argexpected(L, lua_toboolean(L, 2) == 0, 2, "number or false");
  lua_settop(L, lua_gettop(L) < 3 ? 3 : lua_gettop(L));
  return am_request(L, kind, 4, 3, fname, mode, ms, 3);
}


static int core_acquire (lua_State *L) {
  return limited(L, W_ACQUIRE, "acquire");
}


static int core_waitForUnlock (lua_State *L) {
  return limited(L, W_UNLOCK, "waitForUnlock");
}


/* core.kind(v): "Mutex", "Semaphore" or nil. */
static int core_kind (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  if (lk == NULL) lua_pushnil(L);
  else lua_pushstring(L, lk->is_mutex ? "Mutex" : "Semaphore");
  return 1;
}


/*
** setErrorHandler(fn | nil): who hears about errors escaping coroutines
** the module resumed; fn(err, traceback).  Returns the previous handler.
*/
static int core_setErrorHandler (lua_State *L) {
  State *st = getstate(L);
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_isfunction(L, 1), 1,
                   "function or nil");
  lua_settop(L, 1);
  if (st->handler == LUA_NOREF) lua_pushnil(L);
  else lua_rawgeti(L, LUA_REGISTRYINDEX, st->handler);
  luaL_unref(L, LUA_REGISTRYINDEX, st->handler);
  st->handler = LUA_NOREF;
  if (!lua_isnil(L, 1)) {
    lua_pushvalue(L, 1);
    st->handler = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 1;
}


/* pending(): coroutines the module holds, queued or about to be resumed. */
static int core_pending (lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getstate(L)->pending);
  return 1;
}


static const luaL_Reg core_funcs[] = {
  {"acquire", core_acquire},
  {"waitForUnlock", core_waitForUnlock},
  {"kind", core_kind},
  {"setErrorHandler", core_setErrorHandler},
  {"pending", core_pending},
  {NULL, NULL}
};


__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_core (lua_State *L) {
  am_state_open(L);                         /* pushes the state */
  lua_newtable(L);
  lua_insert(L, -2);                        /* module, state */
  am_open_request(L);
  am_open_locks(L);
  luaL_setfuncs(L, core_funcs, 1);          /* state as upvalue */
  lua_pushliteral(L, AM_E_TIMEOUT);
  lua_setfield(L, -2, "E_TIMEOUT");
  lua_pushliteral(L, AM_E_ALREADY_LOCKED);
  lua_setfield(L, -2, "E_ALREADY_LOCKED");
  lua_pushliteral(L, AM_E_CANCELED);
  lua_setfield(L, -2, "E_CANCELED");
  return 1;
}
