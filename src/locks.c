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


/* Is the value at 'idx' a userdata with the metatable in upvalue 'uv'? */
static void *testself (lua_State *L, int idx, int uv) {
  void *p = lua_touserdata(L, idx);
  if (p != NULL && lua_getmetatable(L, idx)) {
    int same = lua_rawequal(L, -1, lua_upvalueindex(uv));
    lua_pop(L, 1);
    if (same) return p;
  }
  return NULL;
}


/* luaL_checkudata for argument 1, with the metatable from an upvalue. */
void *am_checkself (lua_State *L, int uv, const char *tname) {
  void *p = testself(L, 1, uv);
  return p ? p : luaL_checkudata(L, 1, tname);   /* raises the message */
}


/* The Mutex or Semaphore at 'idx', or NULL. */
Lock *am_tolock (lua_State *L, int idx) {
  Lock *lk = (Lock *)testself(L, idx, UV_MUTEX);
  return lk ? lk : (Lock *)testself(L, idx, UV_SEMAPHORE);
}


#define checkmutex(L)  ((Lock *)am_checkself(L, UV_MUTEX, AM_MUTEX))
#define checksem(L)    ((Lock *)am_checkself(L, UV_SEMAPHORE, AM_SEMAPHORE))


/*
** Pushes a new lock.
** The cancel error (default E_CANCELED) is user value 1.
*/
void am_init_lock (Lock *lk, State *st, lua_Integer value, int is_mutex) {
  lk->st = st;
  lk->value = value;
  lk->held = 0;
  lk->gen = 0;
  am_queue_init(&lk->queue, 0);
  lk->unlock = NULL;
  lk->nweights = lk->capweights = lk->nunlock = 0;
  lk->is_mutex = is_mutex;
  lk->freed = 0;
  lk->keyed = NULL;
  lk->selfref = LUA_NOREF;
}


static void newlock (lua_State *L, int is_mutex, lua_Integer value,
                     int erridx) {
  Lock *lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 1);
  am_init_lock(lk, (State *)lua_touserdata(L, lua_upvalueindex(UV_STATE)),
               value, is_mutex);
  am_pushupvalue(L, is_mutex ? UV_MUTEX : UV_SEMAPHORE);
  lua_setmetatable(L, -2);
  if (lua_isnoneornil(L, erridx)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, erridx);
  lua_setiuservalue(L, -2, 1);
}


static int mutex_new (lua_State *L) {
  lua_settop(L, 1);                         /* cancel_error */
  newlock(L, 1, 1, 1);
  return 1;
}


/* A count (a value): an integer, numbers only (numeric strings refused,
   like a weight's). */
lua_Integer am_checkcount (lua_State *L, int idx) {
  luaL_checktype(L, idx, LUA_TNUMBER);
  return luaL_checkinteger(L, idx);
}


static int sem_new (lua_State *L) {
  lua_Integer value = am_checkcount(L, 1);
  lua_settop(L, 2);                         /* value, cancel_error */
  newlock(L, 0, value, 2);
  return 1;
}


/* {====================================================== Mutex */

static int mutex_acquire (lua_State *L) {
  return am_lock_request(L, checkmutex(L), W_ACQUIRE, 2, 1, "acquire",
                         AM_WAIT, 0, 0);
}


static int mutex_waitForUnlock (lua_State *L) {
  return am_lock_request(L, checkmutex(L), W_UNLOCK, 2, 1, "waitForUnlock",
                         AM_WAIT, 0, 0);
}


static int mutex_isLocked (lua_State *L) {
  lua_pushboolean(L, checkmutex(L)->value <= 0);
  return 1;
}


static int mutex_release (lua_State *L) {
  Lock *lk = checkmutex(L);
  if (lk->value <= 0) am_release(L, lk, 1);    /* P3 */
  am_sync(L, lk->st);
  return 0;
}


static int mutex_cancel (lua_State *L) {
  Lock *lk = checkmutex(L);
  am_cancel(L, lk);
  am_sync(L, lk->st);
  return 0;
}

/* }====================================================== */


/* {====================================================== Semaphore */

static int sem_acquire (lua_State *L) {
  return am_lock_request(L, checksem(L), W_ACQUIRE, 2, 1, "acquire",
                         AM_WAIT, 0, 0);
}


static int sem_waitForUnlock (lua_State *L) {
  return am_lock_request(L, checksem(L), W_UNLOCK, 2, 1, "waitForUnlock",
                         AM_WAIT, 0, 0);
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
  lk->value = am_checkcount(L, 2);
  am_dispatch(L, lk);
  am_sync(L, lk->st);
  return 0;
}


static int sem_release (lua_State *L) {
  Lock *lk = checksem(L);
  am_release(L, lk, am_optweight(L, 2, 1, "release"));
  am_sync(L, lk->st);
  return 0;
}


static int sem_cancel (lua_State *L) {
  Lock *lk = checksem(L);
  am_cancel(L, lk);
  am_sync(L, lk->st);
  return 0;
}

/* }====================================================== */


static int lock__tostring (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  if (lk->is_mutex)
    lua_pushfstring(L, "%s (%s, %d waiting): %p", AM_MUTEX,
                    lk->value <= 0 ? "locked" : "unlocked",
                    (int)lk->queue.count, (void *)lk);
  else
    lua_pushfstring(L, "%s (value %I, %d waiting): %p", AM_SEMAPHORE,
                    (LUAI_UACINT)lk->value, (int)lk->queue.count, (void *)lk);
  return 1;
}


/*
** NOTE: a lock with waiters is never collected: each waiting coroutine
** holds it on its stack and is itself anchored in the registry.  So __gc
** only frees memory (and at lua_close unlinks the waiters: lock.c).
*/
static int lock__gc (lua_State *L) {
  am_lock_free((Lock *)lua_touserdata(L, 1));
  return 0;
}


const luaL_Reg am_mutex_methods[] = {
  {"acquire", mutex_acquire},
  {"waitForUnlock", mutex_waitForUnlock},
  {"isLocked", mutex_isLocked},
  {"release", mutex_release},
  {"cancel", mutex_cancel},
  {NULL, NULL}
};

const luaL_Reg am_semaphore_methods[] = {
  {"acquire", sem_acquire},
  {"waitForUnlock", sem_waitForUnlock},
  {"isLocked", sem_isLocked},
  {"getValue", sem_getValue},
  {"setValue", sem_setValue},
  {"release", sem_release},
  {"cancel", sem_cancel},
  {NULL, NULL}
};

const luaL_Reg am_lock_metamethods[] = {
  {"__tostring", lock__tostring},
  {"__gc", lock__gc},
  {NULL, NULL}
};


const luaL_Reg am_mutex_class[] = {
  {"new", mutex_new},
  {NULL, NULL}
};

const luaL_Reg am_semaphore_class[] = {
  {"new", sem_new},
  {NULL, NULL}
};
