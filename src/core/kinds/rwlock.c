/*
** rwlock.c: the RWLock kind: readers share, a writer is alone
** The value counts the readers holding the lock, or is -1 while a writer
** holds it.  A request's weight is its mode (AM_RW_READ, AM_RW_WRITE).
** Everything about the queue is the engine's (grant.c, rules.c): one queue in priority, then
** arrival order, granted strictly from its head while the head fits, so
** the readers at the head are granted together in one dispatch, a reader
** that arrives while a writer waits (at its priority or above) queues
** behind it, and nobody starves (docs/lockkinds.md, RWLock).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


#define WRITTEN  AM_RW_WRITTEN     /* the value while a writer holds it */


/* {====================================================== the kind */

static int rw_fits (const Lock *lk, lua_Integer mode) {
  return mode == AM_RW_WRITE ? lk->value == 0 : lk->value >= 0;
}


static int rw_is_locked (const Lock *lk) {
  return lk->value != 0;
}


/*
** A write grant's token is its generation, as a mutex's: its releaser,
** and its downgrade, end that grant only.  A read grant's is the
** generation it was granted in: only a steal moves it on while reads are
** held (steal.c), and a read so ended gives nothing back.
*/
static lua_Integer rw_take (Lock *lk, lua_Integer mode) {
  if (mode == AM_RW_WRITE) {
    lk->value = WRITTEN;
    return ++lk->gen;
  }
  lk->value++;
  return lk->gen;
}


/*
** A read gives back one reader.  A write gives the lock back if the
** write it was granted for still holds it (AM_UNSCOPED: any write): a
** no-op after rw:release() ended it, as for a mutex.
*/
static int rw_give_back (Lock *lk, lua_Integer mode, lua_Integer token,
                         int saturate) {
  (void)saturate;
  if (mode == AM_RW_READ) {
    if (lk->value <= 0 || token != lk->gen) return 0;   /* stolen */
    lk->value--;
    return 1;
  }
  if (lk->value != WRITTEN || (token != AM_UNSCOPED && token != lk->gen))
    return 0;
  lk->value = 0;
  return 1;
}


/* A steal ends every hold in place, reads and write (steal.c). */
static void rw_end_holds (Lock *lk) {
  lk->value = 0;
}


/* A write hold is live while the lock is written (rw:release() ends it);
   a read hold while readers hold it. */
static int rw_live (const Lock *lk, lua_Integer weight) {
  return weight == AM_RW_READ ? lk->value > 0 : lk->value == WRITTEN;
}

static int rw_shared (lua_Integer weight) {
  return weight == AM_RW_READ;
}

static int rw_exclusive (const Lock *lk) {
  return lk->value == WRITTEN;
}

static int rw_downgrade (lua_State *L);
static int rw_upgrade (lua_State *L);

/* What every releaser has (core.c); each checks its lock is an RWLock. */
static const luaL_Reg rw_releaser_methods[] = {
  {"downgrade", rw_downgrade},
  {"upgrade", rw_upgrade},
  {NULL, NULL}
};


const LockKind am_rwlock_kind = {
  .name = "RWLock",
  .noun = "a readers-writer lock",
  .type = AM_T_RWLOCK,
  .keyed_type = AM_T_KEYED_RWLOCK,
  .weighted = 0,
  .returns_value = 0,
  .fits = rw_fits,
  .take = rw_take,
  .give_back = rw_give_back,
  .is_locked = rw_is_locked,
  .end_holds = rw_end_holds,
  .live = rw_live,
  .shared = rw_shared,
  .exclusive = rw_exclusive,
  .releaser_methods = rw_releaser_methods,
};

/* }====================================================== */


#define checkrw(L)  ((Lock *)am_checkself(L, AM_T_RWLOCK))


/* RWLock.new([cancel_error]) */
static int rw_new (lua_State *L) {
  Lock *lk;
  lua_settop(L, 1);
  lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 1);
  am_lock_init(lk, &am_rwlock_kind, am_getstate(L), 0);
  am_pushmt(L, AM_T_RWLOCK);
  lua_setmetatable(L, -2);
  if (lua_isnil(L, 1)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  if (am_debugging()) am_debug_observer->created(L, lk->st);
  return 1;
}


/* {====================================================== methods */

static int request (lua_State *L, int kind, const char *fname,
                    lua_Integer mode) {
  Request rq = {.kind = kind, .first = 2, .base = 1, .fname = fname,
                .mode = mode};
  am_parse_lock_request(L, &rq, AM_T_RWLOCK);
  return am_request(L, &rq);
}


static int rw_acquireRead (lua_State *L) {
  return request(L, W_ACQUIRE, "acquireRead", AM_RW_READ);
}


static int rw_acquireWrite (lua_State *L) {
  return request(L, W_ACQUIRE, "acquireWrite", AM_RW_WRITE);
}


static int rw_acquire (lua_State *L) {
  return request(L, W_ACQUIRE, "acquire", AM_RW_WRITE);
}


/* Waits until the lock is free: no reader, no writer (a write could be
   granted now). */
static int rw_waitForUnlock (lua_State *L) {
  return request(L, W_UNLOCK, "waitForUnlock", AM_RW_WRITE);
}


/* rw:steal([priority]) (a write), rw:stealRead([priority]): steal.c */
static int steal (lua_State *L, const char *fname, lua_Integer mode) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = fname, .mode = mode};
  am_steal_decorated(L, AM_T_RWLOCK);
  return am_lock_steal(L, checkrw(L), &rq);
}


static int rw_steal (lua_State *L) {
  return steal(L, "steal", AM_RW_WRITE);
}


static int rw_stealRead (lua_State *L) {
  return steal(L, "stealRead", AM_RW_READ);
}


static int rw_isWriteLocked (lua_State *L) {
  lua_pushboolean(L, checkrw(L)->value == WRITTEN);
  return 1;
}


static int rw_readers (lua_State *L) {
  Lock *lk = checkrw(L);
  lua_pushinteger(L, lk->value > 0 ? lk->value : 0);
  return 1;
}


/*
** rw:release(): ends the write hold, whoever holds it, as Mutex:release()
** does; a no-op while no writer holds the lock (readers end their holds
** with their releasers only).
*/
static int rw_release (lua_State *L) {
  Lock *lk = checkrw(L);
  am_give_back(L, lk, AM_RW_WRITE, AM_UNSCOPED, 0);
  am_sync(L, lk->st);
  if (am_debugging()) am_debug_observer->unscoped(L, lk->st, lk);
  return 0;
}


/* }====================================================== */


/*
** write_release:downgrade(): the write hold becomes a read hold, with no
** moment in between where another writer could enter; returns the read
** hold's releaser, and the write releaser is spent.  Readers queued at
** the head join at once (dispatch).  Raises for a releaser of any other
** hold, or one whose write hold has ended.
*/
static int rw_downgrade (lua_State *L) {
  Releaser *r = (Releaser *)am_checkself(L, AM_T_RELEASER);
  Lock *lk = r->lock;
  if (lk->kind != &am_rwlock_kind || r->weight != AM_RW_WRITE)
    return am_usage_error(L, "attempt to downgrade a releaser that is not "
                             "a readers-writer lock's write hold");
  if (r->lease)
    return am_usage_error(L, "attempt to downgrade a leased write hold");
  if (r->state != S_HELD || lk->value != WRITTEN || r->token != lk->gen)
    return am_usage_error(L, "attempt to downgrade a write hold that has "
                             "ended");
  am_hold_ended(r, 0);                  /* spent: the read hold follows */
  lk->value = 1;                        /* the writer, now a reader */
  lk->held -= AM_RW_WRITE - AM_RW_READ;
  lua_getiuservalue(L, 1, 1);           /* the lock, for the new releaser */
  am_push_releaser(L, lua_gettop(L), lk, AM_RW_READ, lk->gen);
  am_dispatch(L, lk);
  am_sync(L, lk->st);
  if (am_debugging()) {             /* one record ends, a read one starts */
    am_debug_observer->released(L, lk->st, 1);
    am_debug_observer->granted(L, lk->st);
  }
  return 1;
}


/*
** releaser:upgrade(): not offered.  Two readers that both upgrade would
** each wait for the other's read hold to end: a deadlock the lock cannot
** break.  Raises, to say so where the user would try it.
*/
static int rw_upgrade (lua_State *L) {
  am_checkself(L, AM_T_RELEASER);
  return am_usage_error(L, "attempt to upgrade a read hold: not offered "
                           "(two upgraders would deadlock); release it, "
                           "then acquireWrite");
}


static int rw__tostring (lua_State *L) {
  Lock *lk = (Lock *)luaL_checkudata(L, 1, am_tnames[AM_T_RWLOCK]);
  if (lk->value == WRITTEN)
    lua_pushfstring(L, "%s (write-locked, %d waiting): %p", am_tnames[AM_T_RWLOCK],
                    (int)lk->queue.count, (void *)lk);
  else
    lua_pushfstring(L, "%s (%I readers, %d waiting): %p", am_tnames[AM_T_RWLOCK],
                    (LUAI_UACINT)lk->value, (int)lk->queue.count,
                    (void *)lk);
  return 1;
}


/* NOTE: as lock__gc (mutex_semaphore.c): a lock with waiters is never
   collected, so __gc only frees memory. */
/* A decorated RWLock's requests (decorated.c): with its limit. */
static int drw_acquire (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquire", AM_RW_WRITE);
}


static int drw_acquireRead (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquireRead", AM_RW_READ);
}


static int drw_acquireWrite (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquireWrite", AM_RW_WRITE);
}


static int drw_waitForUnlock (lua_State *L) {
  return am_decorated_request(L, W_UNLOCK, "waitForUnlock", AM_RW_WRITE);
}


/* With the shared methods of lock.c (isLocked, cancel, __gc). */
const luaL_Reg am_rwlock_methods[] = {
  {"acquire", rw_acquire},
  {"acquireRead", rw_acquireRead},
  {"acquireWrite", rw_acquireWrite},
  {"waitForUnlock", rw_waitForUnlock},
  {"isWriteLocked", rw_isWriteLocked},
  {"readers", rw_readers},
  {"release", rw_release},
  {"steal", rw_steal},
  {"stealRead", rw_stealRead},
  {NULL, NULL}
};

const luaL_Reg am_decorated_rwlock_methods[] = {
  {"acquire", drw_acquire},
  {"acquireRead", drw_acquireRead},
  {"acquireWrite", drw_acquireWrite},
  {"waitForUnlock", drw_waitForUnlock},
  {NULL, NULL}
};

const luaL_Reg am_rwlock_metamethods[] = {
  {"__tostring", rw__tostring},
  {NULL, NULL}
};

const luaL_Reg am_rwlock_class[] = {
  {"new", rw_new},
  {NULL, NULL}
};
