/*
** decorated.c: the requests of withTimeout and tryAcquire's locks
** A limit is a timeout in ms (withTimeout) or false (tryAcquire), with the
** error raised when it is hit.  docs/semantics.md, Timeouts and
** tryAcquire.
*/

#define LUA_LIB

#include <math.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


/*
** core.acquire(lock, limit, err, ...), for acquireAll, and the decorated
** methods below: the lock's request with a limit.  The user's own
** arguments (...) start at index 4 and are numbered from 1 in errors.
*/
static int limited (lua_State *L, int kind, const char *fname) {
  Request rq = {.kind = kind, .wait = AM_TRY, .erridx = 3, .first = 4,
                .base = 3, .fname = fname};
  int keyed = am_tokeyed(L, 1) != NULL;
  Lock *lk = keyed ? NULL : am_tolock(L, 1);
  luaL_argexpected(L, keyed || lk != NULL, 1, "lock");
  if (lua_type(L, 2) == LUA_TNUMBER) {
    rq.ms = lua_tonumber(L, 2);
    luaL_argcheck(L, rq.ms >= 0, 2, "timeout must be a non-negative number");
    rq.wait = (rq.ms == HUGE_VAL) ? AM_WAIT : AM_TIMEOUT;
  }
  else
    luaL_argexpected(L, lua_toboolean(L, 2) == 0, 2, "number or false");
  lua_settop(L, lua_gettop(L) < 3 ? 3 : lua_gettop(L));
  if (keyed) return am_keyed_request(L, &rq);
  return am_lock_request(L, lk, &rq);
}


int am_core_acquire (lua_State *L) {
  return limited(L, W_ACQUIRE, "acquire");
}


/*
** The acquire and waitForUnlock of decorated locks, {lock, limit, err}
** tables.  They are C functions rather than Lua wrappers of the above: a
** Lua frame more would make every timed waiter grow its coroutine's
** stack, and shrink it again when its timeout error is caught (Lua does),
** which doubled the cost of 100,000 timeouts.  Upvalues after the
** module's: the kind's decorated metatable and the kind's name.
*/
#define DECORATED_MT  lua_upvalueindex(AM_NUPVALUES + 1)
#define KIND_NAME     lua_upvalueindex(AM_NUPVALUES + 2)

static int decorated (lua_State *L, int kind, const char *fname) {
  int ok = lua_getmetatable(L, 1) && lua_rawequal(L, -1, DECORATED_MT);
  if (!ok) {
    const char *got = luaL_getmetafield(L, 1, "__name") == LUA_TSTRING
                      ? lua_tostring(L, -1) : luaL_typename(L, 1);
    return luaL_error(L, "bad argument #1 to '%s' (decorated %s expected, "
                      "got %s)", fname, lua_tostring(L, KIND_NAME), got);
  }
  lua_pop(L, 1);
  lua_rawgeti(L, 1, 1);                       /* self ... lock */
  lua_rawgeti(L, 1, 2);                       /* self ... lock limit */
  lua_rawgeti(L, 1, 3);                       /* self ... lock limit err */
  lua_rotate(L, 2, 3);                        /* self lock limit err ... */
  lua_remove(L, 1);
  return limited(L, kind, fname);
}


static int decorated_acquire (lua_State *L) {
  return decorated(L, W_ACQUIRE, "acquire");
}


static int decorated_waitForUnlock (lua_State *L) {
  return decorated(L, W_UNLOCK, "waitForUnlock");
}


/* core.decorate(mt, kind): the acquire and waitForUnlock for 'mt'. */
int am_core_decorate (lua_State *L) {
  int i;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstring(L, 2);
  for (i = 0; i < 2; i++) {
    int uv;
    for (uv = 1; uv <= AM_NUPVALUES; uv++)
      lua_pushvalue(L, lua_upvalueindex(uv));
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, i == 0 ? decorated_acquire : decorated_waitForUnlock,
                     AM_NUPVALUES + 2);
  }
  return 2;
}
