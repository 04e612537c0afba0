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


#define getstate(L)  ((State *)lua_touserdata(L, lua_upvalueindex(UV_STATE)))


/*
** core.acquire(lock, limit, err, ...), for acquireAll, and the decorated
** methods below: the lock's request with a limit: 'limit' is a timeout in
** ms, or false for tryAcquire; 'err' is raised when the limit is hit.
** The user's own arguments (...) start at index 4 and are numbered from 1
** in errors.
*/
static int limited (lua_State *L, int kind, const char *fname) {
  int mode = AM_TRY;
  lua_Number ms = 0;
  int keyed = am_tokeyed(L, 1) != NULL;
  Lock *lk = keyed ? NULL : am_tolock(L, 1);
  luaL_argexpected(L, keyed || lk != NULL, 1, "lock");
  if (lua_type(L, 2) == LUA_TNUMBER) {
    ms = lua_tonumber(L, 2);
    luaL_argcheck(L, ms >= 0, 2, "timeout must be a non-negative number");
    mode = (ms == HUGE_VAL) ? AM_WAIT : AM_TIMEOUT;
  }
  else
    luaL_argexpected(L, lua_toboolean(L, 2) == 0, 2, "number or false");
  lua_settop(L, lua_gettop(L) < 3 ? 3 : lua_gettop(L));
  if (keyed) return am_keyed_request(L, kind, 4, 3, fname, mode, ms, 3);
  return am_lock_request(L, lk, kind, 4, 3, fname, mode, ms, 3);
}


static int core_acquire (lua_State *L) {
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
#define UV_DECORATED  (UV_COUNT + 1)
#define UV_KINDNAME   (UV_COUNT + 2)

static int decorated (lua_State *L, int kind, const char *fname) {
  int ok = lua_getmetatable(L, 1)
           && lua_rawequal(L, -1, lua_upvalueindex(UV_DECORATED));
  if (!ok) {
    const char *got = luaL_getmetafield(L, 1, "__name") == LUA_TSTRING
                      ? lua_tostring(L, -1) : luaL_typename(L, 1);
    return luaL_error(L, "bad argument #1 to '%s' (decorated %s expected, "
                      "got %s)", fname,
                      lua_tostring(L, lua_upvalueindex(UV_KINDNAME)), got);
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


/*
** The other methods of decorated locks (isLocked, release, setValue, ...):
** the lock's own C function, upvalue UV_TARGET, called in this frame with
** the lock in place of 'self', so that its argument errors name the
** method and point at the user's line, as on the plain lock.
*/
#define UV_TARGET  (UV_COUNT + 3)
#define UV_METHOD  (UV_COUNT + 4)

static int decorated_forward (lua_State *L) {
  lua_CFunction target = lua_tocfunction(L, lua_upvalueindex(UV_TARGET));
  int ok = lua_getmetatable(L, 1)
           && lua_rawequal(L, -1, lua_upvalueindex(UV_DECORATED));
  if (!ok) {
    const char *got = luaL_getmetafield(L, 1, "__name") == LUA_TSTRING
                      ? lua_tostring(L, -1) : luaL_typename(L, 1);
    return luaL_error(L, "bad argument #1 to '%s' (decorated %s expected, "
                      "got %s)", lua_tostring(L, lua_upvalueindex(UV_METHOD)),
                      lua_tostring(L, lua_upvalueindex(UV_KINDNAME)), got);
  }
  lua_pop(L, 1);
  lua_rawgeti(L, 1, 1);
  lua_replace(L, 1);                          /* self -> its lock */
  return target(L);
}


/*
** core.forward(mt, kind, f, name): the C method 'f' of 'kind', called
** 'name', for decorated locks.
*/
static int core_forward (lua_State *L) {
  int uv;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstring(L, 2);
  luaL_argexpected(L, lua_tocfunction(L, 3) != NULL, 3, "C function");
  luaL_checkstring(L, 4);
  for (uv = 1; uv <= UV_COUNT; uv++) am_pushupvalue(L, uv);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_pushvalue(L, 4);
  lua_pushcclosure(L, decorated_forward, UV_COUNT + 4);
  return 1;
}


/* core.decorate(mt, kind): the acquire and waitForUnlock for 'mt'. */
static int core_decorate (lua_State *L) {
  int i;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstring(L, 2);
  for (i = 0; i < 2; i++) {
    int uv;
    for (uv = 1; uv <= UV_COUNT; uv++) am_pushupvalue(L, uv);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, i == 0 ? decorated_acquire : decorated_waitForUnlock,
                     UV_COUNT + 2);
  }
  return 2;
}


/* core.kind(v): "Mutex", "Semaphore", "KeyedMutex", "KeyedSemaphore" or nil. */
static int core_kind (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  Keyed *kd = am_tokeyed(L, 1);
  if (lk != NULL) lua_pushstring(L, lk->is_mutex ? "Mutex" : "Semaphore");
  else if (kd != NULL)
    lua_pushstring(L, kd->is_mutex ? "KeyedMutex" : "KeyedSemaphore");
  else lua_pushnil(L);
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
  {"kind", core_kind},
  {"decorate", core_decorate},
  {"forward", core_forward},
  {"setErrorHandler", core_setErrorHandler},
  {"pending", core_pending},
  {NULL, NULL}
};


/*
** Sets the functions 'l' into the table at 'idx', each with the module's
** upvalues, which sit at stack indices 1..UV_COUNT.
*/
static void setfuncs (lua_State *L, int idx, const luaL_Reg *l) {
  int i;
  lua_pushvalue(L, idx);
  for (i = 1; i <= UV_COUNT; i++) lua_pushvalue(L, i);
  luaL_setfuncs(L, l, UV_COUNT);
  lua_pop(L, 1);
}


/*
** Registers a lock type: its metatable (at 'mt') gets the metamethods and
** an __index table of methods; module[name] = {new = ctor, methods = ...}.
** Metatables are shared by every copy of the module in this lua_State.
*/
static void open_type (lua_State *L, int mt, const char *name,
                       const luaL_Reg *metamethods, const luaL_Reg *methods,
                       const luaL_Reg *class) {
  setfuncs(L, mt, metamethods);
  if (lua_getfield(L, mt, "__index") != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, mt, "__index");
  }
  setfuncs(L, lua_gettop(L), methods);
  lua_createtable(L, 0, 2);                 /* module[name] */
  lua_insert(L, -2);
  lua_setfield(L, -2, "methods");
  setfuncs(L, lua_gettop(L), class);
  lua_setfield(L, -2, name);
}


__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_core (lua_State *L) {
  lua_settop(L, 0);
  am_state_open(L);                         /* 1: state */
  luaL_newmetatable(L, AM_MUTEX);           /* 2 */
  luaL_newmetatable(L, AM_SEMAPHORE);       /* 3 */
  luaL_newmetatable(L, AM_RELEASER);        /* 4 */
  luaL_newmetatable(L, AM_WAITER);          /* 5 */
  luaL_newmetatable(L, AM_KEYED_MUTEX);     /* 6 */
  luaL_newmetatable(L, AM_KEYED_SEMAPHORE); /* 7 */
  setfuncs(L, UV_RELEASER, am_releaser_metamethods);
  setfuncs(L, UV_WAITER, am_waiter_metamethods);
  lua_newtable(L);                          /* 8: the module */
  setfuncs(L, 8, core_funcs);
  open_type(L, UV_MUTEX, "Mutex", am_lock_metamethods, am_mutex_methods,
            am_mutex_class);
  open_type(L, UV_SEMAPHORE, "Semaphore", am_lock_metamethods,
            am_semaphore_methods, am_semaphore_class);
  open_type(L, UV_KEYED_MUTEX, "KeyedMutex", am_keyed_metamethods,
            am_keyed_mutex_methods, am_keyed_mutex_class);
  open_type(L, UV_KEYED_SEMAPHORE, "KeyedSemaphore", am_keyed_metamethods,
            am_keyed_semaphore_methods, am_keyed_semaphore_class);
  lua_pushliteral(L, AM_E_TIMEOUT);
  lua_setfield(L, -2, "E_TIMEOUT");
  lua_pushliteral(L, AM_E_ALREADY_LOCKED);
  lua_setfield(L, -2, "E_ALREADY_LOCKED");
  lua_pushliteral(L, AM_E_CANCELED);
  lua_setfield(L, -2, "E_CANCELED");
  lua_pushliteral(L, AM_E_MAX_PENDING);
  lua_setfield(L, -2, "E_MAX_PENDING");
  return 1;
}
