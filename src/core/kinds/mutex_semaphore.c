/*
** mutex_semaphore.c: the Mutex and Semaphore lock kinds, and their methods
** A Semaphore counts: a grant takes its weight from the value, a release
** gives it back.  A Mutex is a semaphore of value 1 with its own argument
** shapes, whose release only ends the grant it was given for and is a
** no-op while unlocked (docs/semantics.md, Release and P3).  The queue
** rules they share are in rules.c.  runExclusive is added to the method
** tables by the Lua layer (src/async_mutex/init.lua).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== the kinds */

static int value_fits (const Lock *lk, lua_Integer weight) {
  return weight <= lk->value;
}


static int value_is_locked (const Lock *lk) {
  return lk->value <= 0;
}


/* A mutex grant's token is its generation: its releaser ends it only. */
static lua_Integer mutex_take (Lock *lk, lua_Integer weight) {
  lk->value -= weight;
  return ++lk->gen;
}


static int mutex_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                            int saturate) {
  (void)weight; (void)saturate;
  if (lk->value > 0 || (token != AM_UNSCOPED && token != lk->gen))
    return 0;                           /* unlocked, or a later grant's */
  lk->value++;
  return 1;
}


/* A semaphore grant's token is the value before it. */
static lua_Integer sem_take (Lock *lk, lua_Integer weight) {
  lua_Integer value = lk->value;
  lk->value -= weight;
  return value;
}


static int sem_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                          int saturate) {
  /* a releaser's token is the generation of its grant: a steal moved it
     on, and ended the hold (steal.c).  A saturating give-back is always
     of a grant in place (a lease that ran out, a grant not delivered,
     whose token is the value it returns) */
  if (!saturate && token != AM_UNSCOPED && token != lk->gen) return 0;
  /* a key's lock that left its set (keyed.c: am_keyed_settle) is reached
     only by spent releasers: it serves the key no longer, so the call
     gives nothing back (docs/semantics.md, Keyed locks) and says so */
  if (lk->keyed != NULL && lk->selfref == LUA_NOREF) return 0;
  if (lk->value > 0 && weight > LUA_MAXINTEGER - lk->value) {
    if (!saturate) return -1;
    lk->value = LUA_MAXINTEGER;
  }
  else
    lk->value += weight;
  return 1;
}


/* A steal ends the hold in place, if any (steal.c). */
static void mutex_end_holds (Lock *lk) {
  lk->value = 1;
}


/* ... every hold in place: their weight goes back (saturating). */
static void sem_end_holds (Lock *lk) {
  lk->value = lk->value > 0 && lk->held > LUA_MAXINTEGER - lk->value
              ? LUA_MAXINTEGER : lk->value + lk->held;
}


const LockKind am_mutex_kind = {
  .name = "Mutex",
  .noun = "a mutex",
  .type = AM_T_MUTEX,
  .keyed_type = AM_T_KEYED_MUTEX,
  .weighted = 0,
  .returns_value = 0,
  .fits = value_fits,
  .take = mutex_take,
  .give_back = mutex_give_back,
  .is_locked = value_is_locked,
  .end_holds = mutex_end_holds,
};

const LockKind am_semaphore_kind = {
  .name = "Semaphore",
  .noun = "a semaphore",
  .type = AM_T_SEMAPHORE,
  .keyed_type = AM_T_KEYED_SEMAPHORE,
  .weighted = 1,
  .returns_value = 1,
  .fits = value_fits,
  .take = sem_take,
  .give_back = sem_give_back,
  .is_locked = value_is_locked,
  .end_holds = sem_end_holds,
};

/* }====================================================== */


/* The Mutex, Semaphore, RWLock or ReentrantMutex at 'idx', or NULL. */
Lock *am_tolock (lua_State *L, int idx) {
  Lock *lk = (Lock *)am_testself(L, idx, AM_T_MUTEX);
  if (lk == NULL) lk = (Lock *)am_testself(L, idx, AM_T_SEMAPHORE);
  if (lk == NULL) lk = (Lock *)am_testself(L, idx, AM_T_RWLOCK);
  return lk ? lk : (Lock *)am_testself(L, idx, AM_T_REENTRANT_MUTEX);
}


#define checkmutex(L)  ((Lock *)am_checkself(L, AM_T_MUTEX))
#define checksem(L)    ((Lock *)am_checkself(L, AM_T_SEMAPHORE))


/*
** Pushes a new lock of 'kind'.  The cancel error (default E_CANCELED) is
** user value 1.
*/
static void newlock (lua_State *L, const LockKind *kind, lua_Integer value,
                     int erridx) {
  Lock *lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 1);
  am_lock_init(lk, kind, am_getstate(L), value);
  am_pushmt(L, kind->type);
  lua_setmetatable(L, -2);
  if (lua_isnoneornil(L, erridx)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, erridx);
  lua_setiuservalue(L, -2, 1);
  if (am_debugging()) am_dbg_created(L, lk->st);
}


static int mutex_new (lua_State *L) {
  lua_settop(L, 1);                         /* cancel_error */
  newlock(L, &am_mutex_kind, 1, 1);
  return 1;
}


static int sem_new (lua_State *L) {
  lua_Integer value = am_checkcount(L, 1);
  lua_settop(L, 2);                         /* value, cancel_error */
  newlock(L, &am_semaphore_kind, value, 2);
  return 1;
}


/* runExclusive(self, fn, ...) (decorated.c, run.c). */
static int mutex_runExclusive (lua_State *L) {
  return am_run_request(L, AM_T_MUTEX);
}


static int sem_runExclusive (lua_State *L) {
  return am_run_request(L, AM_T_SEMAPHORE);
}


/* {====================================================== Mutex */

static int mutex_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  return am_lock_request(L, checkmutex(L), &rq);
}


static int mutex_waitForUnlock (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .first = 2, .base = 1,
                .fname = "waitForUnlock"};
  return am_lock_request(L, checkmutex(L), &rq);
}


static int mutex_isLocked (lua_State *L) {
  Lock *lk = checkmutex(L);
  lua_pushboolean(L, lk->kind->is_locked(lk));
  return 1;
}


/* m:steal([priority]): steal.c */
static int mutex_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, AM_T_MUTEX);
  return am_lock_steal(L, checkmutex(L), &rq);
}


static int mutex_release (lua_State *L) {
  Lock *lk = checkmutex(L);
  am_give_back(L, lk, 1, AM_UNSCOPED, 0);    /* P3 */
  am_sync(L, lk->st);
  if (am_debugging()) am_dbg_unscoped(L, lk->st, lk);
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
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  return am_lock_request(L, checksem(L), &rq);
}


static int sem_waitForUnlock (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .first = 2, .base = 1,
                .fname = "waitForUnlock"};
  return am_lock_request(L, checksem(L), &rq);
}


static int sem_isLocked (lua_State *L) {
  Lock *lk = checksem(L);
  lua_pushboolean(L, lk->kind->is_locked(lk));
  return 1;
}


/* s:steal([weight [, priority]]): steal.c */
static int sem_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, AM_T_SEMAPHORE);
  return am_lock_steal(L, checksem(L), &rq);
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
  lua_Integer weight = am_optweight(L, 2, 1, "release");
  am_give_back(L, lk, weight, AM_UNSCOPED, 0);
  am_sync(L, lk->st);
  if (am_debugging()) am_dbg_returned(L, lk->st, lk, weight);
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
  if (lk->kind == &am_mutex_kind)
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
** only frees memory (and at lua_close unlinks the waiters: rules.c).
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
  {"steal", mutex_steal},
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
  {"steal", sem_steal},
  {NULL, NULL}
};

const luaL_Reg am_lock_metamethods[] = {
  {"__tostring", lock__tostring},
  {"__gc", lock__gc},
  {NULL, NULL}
};


const luaL_Reg am_mutex_class[] = {
  {"new", mutex_new},
  {"runExclusive", mutex_runExclusive},
  {NULL, NULL}
};

const luaL_Reg am_semaphore_class[] = {
  {"new", sem_new},
  {"runExclusive", sem_runExclusive},
  {NULL, NULL}
};
