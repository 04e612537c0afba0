/*
** locks.c: the Mutex and Semaphore userdata
** A Mutex is a Semaphore of value 1 with its own argument shapes and a
** release that is a no-op while unlocked (P3).  runExclusive is added to
** the method tables by the Lua layer (src/async_mutex/init.lua).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


/* The Mutex or Semaphore at 'idx', or NULL. */
Lock *am_tolock (lua_State *L, int idx) {
  Lock *lk = (Lock *)luaL_testudata(L, idx, AM_MUTEX);
  return lk ? lk : (Lock *)luaL_testudata(L, idx, AM_SEMAPHORE);
}


#define checkmutex(L)  ((Lock *)luaL_checkudata(L, 1, AM_MUTEX))
#define checksem(L)    ((Lock *)luaL_checkudata(L, 1, AM_SEMAPHORE))


/*
** Pushes a new lock.  Upvalue 1 of the calling constructor is the state.
** The cancel error (default E_CANCELED) is user value 1.
*/
static void newlock (lua_State *L, int is_mutex, lua_Integer value,
                     int erridx) {
  Lock *lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 1);
  lk->st = (State *)lua_touserdata(L, lua_upvalueindex(1));
  lk->value = value;
  am_heap_init(&lk->queue, 0);
  lk->unlock = NULL;
  lk->nweights = lk->capweights = lk->nunlock = 0;
  lk->is_mutex = is_mutex;
  luaL_setmetatable(L, is_mutex ? AM_MUTEX : AM_SEMAPHORE);
  if (lua_isnoneornil(L, erridx)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, erridx);
  lua_setiuservalue(L, -2, 1);
}


static int mutex_new (lua_State *L) {
  newlock(L, 1, 1, 1);
  return 1;
}


static int sem_new (lua_State *L) {
  lua_Integer value = luaL_checkinteger(L, 1);
  newlock(L, 0, value, 2);
  return 1;
}


/* {====================================================== Mutex */

static int mutex_acquire (lua_State *L) {
  checkmutex(L);
  return am_request(L, W_ACQUIRE, 2, 1, "acquire", AM_WAIT, 0, 0);
}


static int mutex_waitForUnlock (lua_State *L) {
  checkmutex(L);
  return am_request(L, W_UNLOCK, 2, 1, "waitForUnlock", AM_WAIT, 0, 0);
}


static int mutex_isLocked (lua_State *L) {
  lua_pushboolean(L, checkmutex(L)->value <= 0);
  return 1;
}


static int mutex_release (lua_State *L) {
  Lock *lk = checkmutex(L);
  if (lk->value <= 0) am_release(L, lk, 1);    /* P3 */
  return 0;
}


static int mutex_cancel (lua_State *L) {
  am_cancel(L, checkmutex(L));
  return 0;
}

/* }====================================================== */


/* {====================================================== Semaphore */

static int sem_acquire (lua_State *L) {
  checksem(L);
  return am_request(L, W_ACQUIRE, 2, 1, "acquire", AM_WAIT, 0, 0);
}


static int sem_waitForUnlock (lua_State *L) {
  checksem(L);
  return am_request(L, W_UNLOCK, 2, 1, "waitForUnlock", AM_WAIT, 0, 0);
}


static int sem_isLocked (lua_State *L) {
  lua_pushboolean(L, checksem(L)->value <= 0);
  return 1;
}


static int sem_getValue (lua_State *L) {
  lua_pushinteger(L, checksem(L)->value);
  return 1;
}


static int sem_setValue (lua_State *L) {
  Lock *lk = checksem(L);
  lk->value = luaL_checkinteger(L, 2);
  am_dispatch(L, lk);
  return 0;
}


static int sem_release (lua_State *L) {
  Lock *lk = checksem(L);
  am_release(L, lk, am_optweight(L, 2, 1, "release"));
  return 0;
}


static int sem_cancel (lua_State *L) {
  am_cancel(L, checksem(L));
  return 0;
}

/* }====================================================== */


static int lock__tostring (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  if (lk->is_mutex)
    lua_pushfstring(L, "%s (%s, %d waiting): %p", AM_MUTEX,
                    lk->value <= 0 ? "locked" : "unlocked",
                    (int)lk->queue.n, (void *)lk);
  else
    lua_pushfstring(L, "%s (value %I, %d waiting): %p", AM_SEMAPHORE,
                    (LUAI_UACINT)lk->value, (int)lk->queue.n, (void *)lk);
  return 1;
}


/*
** NOTE: a lock with waiters is never collected: each waiting coroutine
** holds it on its stack and is itself anchored in the registry.  So __gc
** only frees memory, and never touches another object.
*/
static int lock__gc (lua_State *L) {
  am_lock_free((Lock *)lua_touserdata(L, 1));
  return 0;
}


static const luaL_Reg mutex_methods[] = {
  {"acquire", mutex_acquire},
  {"waitForUnlock", mutex_waitForUnlock},
  {"isLocked", mutex_isLocked},
  {"release", mutex_release},
  {"cancel", mutex_cancel},
  {NULL, NULL}
};

static const luaL_Reg sem_methods[] = {
  {"acquire", sem_acquire},
  {"waitForUnlock", sem_waitForUnlock},
  {"isLocked", sem_isLocked},
  {"getValue", sem_getValue},
  {"setValue", sem_setValue},
  {"release", sem_release},
  {"cancel", sem_cancel},
  {NULL, NULL}
};

static const luaL_Reg lock_metamethods[] = {
  {"__tostring", lock__tostring},
  {"__gc", lock__gc},
  {NULL, NULL}
};


/*
** Sets module[name] = {new = constructor, methods = methods table}.
** Stack: module, state.  Metatables are shared by every copy of the
** module in this lua_State (re-require keeps them).
*/
static void open_type (lua_State *L, const char *tname, const char *name,
                       const luaL_Reg *methods, lua_CFunction ctor) {
  luaL_newmetatable(L, tname);
  luaL_setfuncs(L, lock_metamethods, 0);
  if (lua_getfield(L, -1, "__index") != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "__index");
  }
  luaL_setfuncs(L, methods, 0);             /* stack: module st mt methods */
  lua_createtable(L, 0, 2);
  lua_insert(L, -2);
  lua_setfield(L, -2, "methods");
  lua_pushvalue(L, -3);                     /* state */
  lua_pushcclosure(L, ctor, 1);
  lua_setfield(L, -2, "new");
  lua_setfield(L, -4, name);
  lua_pop(L, 1);                            /* metatable */
}


void am_open_locks (lua_State *L) {
  open_type(L, AM_MUTEX, "Mutex", mutex_methods, mutex_new);
  open_type(L, AM_SEMAPHORE, "Semaphore", sem_methods, sem_new);
}
