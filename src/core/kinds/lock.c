/*
** lock.c: the methods every lock kind shares, built from its LockKind
** core.c merges these into each kind's tables (the kind table of
** async_mutex.h) before the kind's own, which replace them where a kind
** differs (a ReentrantMutex's acquire, an RWLock's release); a kind's
** NULL entry removes one (a ReentrantMutex has no release).  Each
** function here finds its LockKind in its extra upvalue (core.c), so
** one function serves every kind.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* The kind and type of the lock this method belongs to (core.c). */
#define lockkind(L)  ((const LockKind *)lua_touserdata(L, AM_KIND_UPVALUE))
#define locktype(L)  (lockkind(L)->type)
#define checklock(L)  ((Lock *)am_checkself(L, locktype(L)))


/*
** <Class>.new([cancel_error]), or of a weighted kind new(value
** [, cancel_error]).  An unweighted kind's value starts at 1.  The
** cancel error (default E_CANCELED) is user value 1.
*/
static int lock_new (lua_State *L) {
  const LockKind *kind = lockkind(L);
  lua_Integer value = kind->weighted ? am_checkcount(L, 1) : 1;
  int erridx = kind->weighted ? 2 : 1;
  Lock *lk;
  lua_settop(L, erridx);
  lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 1);
  am_lock_init(lk, kind, am_getstate(L), value);
  am_pushmt(L, kind->type);
  lua_setmetatable(L, -2);
  if (lua_isnil(L, erridx)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, erridx);
  lua_setiuservalue(L, -2, 1);
  if (am_debugging()) am_debug_observer->created(L, lk->st);
  return 1;
}


static int lock_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  am_parse_lock_request(L, &rq, locktype(L));
  return am_request(L, &rq);
}


static int lock_waitForUnlock (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .first = 2, .base = 1,
                .fname = "waitForUnlock"};
  am_parse_lock_request(L, &rq, locktype(L));
  return am_request(L, &rq);
}


static int lock_isLocked (lua_State *L) {
  Lock *lk = checklock(L);
  lua_pushboolean(L, lk->kind->is_locked(lk));
  return 1;
}


/* lock:steal([weight,] [priority]): steal.c */
static int lock_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, locktype(L));
  return am_lock_steal(L, checklock(L), &rq);
}


/*
** An unscoped release: of 'weight' (default 1) for a weighted kind, of
** the hold in place for another (P3: a no-op while unlocked).
*/
static int lock_release (lua_State *L) {
  Lock *lk = checklock(L);
  lua_Integer weight = lk->kind->weighted
                       ? am_optweight(L, 2, 1, "release") : 1;
  am_give_back(L, lk, weight, AM_UNSCOPED, 0);
  am_sync(L, lk->st);
  if (am_debugging()) {
    if (lk->kind->weighted) am_debug_observer->returned(L, lk->st, lk, weight);
    else am_debug_observer->unscoped(L, lk->st, lk);
  }
  return 0;
}


static int lock_cancel (lua_State *L) {
  Lock *lk = checklock(L);
  am_cancel(L, lk);
  am_sync(L, lk->st);
  return 0;
}


/* "async_mutex.Mutex (locked, 0 waiting): 0x...", or of a weighted kind
   "(value 3, 0 waiting)". */
static int lock__tostring (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  if (lk->kind->weighted)
    lua_pushfstring(L, "%s (value %I, %d waiting): %p",
                    am_tnames[lk->kind->type], (LUAI_UACINT)lk->value,
                    (int)lk->queue.count, (void *)lk);
  else
    lua_pushfstring(L, "%s (%s, %d waiting): %p", am_tnames[lk->kind->type],
                    lk->kind->is_locked(lk) ? "locked" : "unlocked",
                    (int)lk->queue.count, (void *)lk);
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


const luaL_Reg am_lock_methods[] = {
  {"acquire", lock_acquire},
  {"waitForUnlock", lock_waitForUnlock},
  {"isLocked", lock_isLocked},
  {"release", lock_release},
  {"cancel", lock_cancel},
  {"steal", lock_steal},
  {NULL, NULL}
};

const luaL_Reg am_lock_metamethods[] = {
  {"__tostring", lock__tostring},
  {"__gc", lock__gc},
  {NULL, NULL}
};

const luaL_Reg am_lock_class[] = {
  {"new", lock_new},
  {NULL, NULL}
};
