/*
** keyed.c: KeyedMutex, KeyedSemaphore and KeyedRWLock, one lock per key
** A key's lock is created by the first request that needs it and leaves
** the set as soon as it is idle (keyed_settle), so memory follows the
** keys in use, not the keys ever seen.  Every rule of the single locks
** applies per key: the per-key locks are ordinary locks of the set's kind
** (any LockKind), and all of the keyed bookkeeping is in this file.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* The keyed set at 1 (a decorated one is replaced by its set), or raises. */
static Keyed *checkkeyed (lua_State *L) {
  Keyed *kd = am_tokeyed(L, 1);
  int t;
  for (t = AM_FIRST_KEYED; kd == NULL && t < AM_NLOCKTYPES; t++)
    if (am_undecorate(L, (AmType)t)) kd = am_tokeyed(L, 1);
  luaL_argexpected(L, kd != NULL, 1, "keyed lock");
  return kd;
}


#define checkkmutex(L)  ((Keyed *)am_checkself(L, AM_T_KEYED_MUTEX))
#define checkksem(L)    ((Keyed *)am_checkself(L, AM_T_KEYED_SEMAPHORE))
#define checkkrw(L)     ((Keyed *)am_checkself(L, AM_T_KEYED_RWLOCK))


/*
** NOTE: the lock of a key in use is held by its set's map, and its C
** pointer finds it again (am_settle) through the state's 'keyedlocks', a
** table with weak values keyed by the lock's address.  Neither keeps it
** alive: a set that nothing outside refers to is collected with its
** locks, even with keys held (their releasers lost) or values raised.  A
** key's waiters keep their lock, and so its set, alive: they are never
** stranded by a collection (docs/semantics.md, Re-entry).
*/
static void enter_set (lua_State *L, Lock *lk, int idx) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, lk->st->keyedlocks);
  lua_pushvalue(L, idx);
  lua_rawsetp(L, -2, lk);
  lua_pop(L, 1);
  lk->selfref = 0;
}


/*
** Pushes the lock of the key at 'keyidx' (the keyed set is at index 1)
** and returns it; when the key has none, pushes nil and returns NULL, or
** with 'create' makes one, puts it in the set and returns it.
*/
static Lock *getlock (lua_State *L, Keyed *kd, int keyidx, int create) {
  Lock *lk;
  lua_getiuservalue(L, 1, 1);                     /* map */
  lua_pushvalue(L, keyidx);
  if (lua_rawget(L, -2) != LUA_TNIL || !create) {
    lua_remove(L, -2);
    return (Lock *)lua_touserdata(L, -1);
  }
  lua_pop(L, 1);                                  /* map */
  lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 3);
  am_lock_init(lk, kd->kind, kd->st, kd->fresh.value);
  lk->internal = kd->fresh.internal;              /* core.dbg_internal */
  am_pushmt(L, kd->kind->type);
  lua_setmetatable(L, -2);
  lua_getiuservalue(L, 1, 2);
  lua_setiuservalue(L, -2, 1);                    /* its cancel error */
  lua_pushvalue(L, keyidx);
  lua_setiuservalue(L, -2, 2);                    /* its key */
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 3);                    /* its keyed set */
  /* RE-ENTRY: the allocation may have run a finalizer that made the
     key's lock (a tryAcquire of the key): use that one, drop ours */
  lua_pushvalue(L, keyidx);
  if (lua_rawget(L, -3) != LUA_TNIL) {            /* map lock existing */
    lua_replace(L, -3);
    lua_pop(L, 1);
    return (Lock *)lua_touserdata(L, -1);
  }
  lua_pop(L, 1);
  lk->keyed = kd;
  enter_set(L, lk, lua_gettop(L));                /* first: it may raise */
  kd->nkeys++;
  lua_pushvalue(L, keyidx);
  lua_pushvalue(L, -2);
  lua_rawset(L, -4);                              /* map[key] = lock */
  lua_remove(L, -2);                              /* map */
  return lk;
}


/*
** The lock serving the key of the lock 'lk' at 'lockidx' now.  Lua code
** run since 'lk' was looked up (a finalizer at an allocation) may have
** released the key, and the idle lock left its set: then the key's lock
** in the set replaces 'lk' at 'lockidx', or if the key has none, 'lk'
** goes back into the set.  Runs no Lua code and no collector step (raw
** accesses and luaL_ref only), so a decision taken after it holds.
** The engine calls it as Keyed.recheck (am_keyed_current).
*/
static Lock *keyed_recheck (lua_State *L, Lock *lk, int lockidx) {
  if (lk->selfref != LUA_NOREF) return lk;
  lua_getiuservalue(L, lockidx, 3);               /* set */
  lua_getiuservalue(L, -1, 1);                    /* set map */
  lua_getiuservalue(L, lockidx, 2);               /* set map key */
  if (lua_rawget(L, -2) != LUA_TNIL) {            /* set map lock */
    lk = (Lock *)lua_touserdata(L, -1);
    lua_replace(L, lockidx);
  }
  else {
    lua_pop(L, 1);                                /* set map */
    lua_getiuservalue(L, lockidx, 2);
    lua_pushvalue(L, lockidx);
    lua_rawset(L, -3);                            /* map[key] = lock */
    enter_set(L, lk, lockidx);
    lk->keyed->nkeys++;
  }
  lua_pop(L, 2);
  return lk;
}


/*
** acquire / waitForUnlock of one key: the keyed set at 1, the key at
** 'first', then the lock's own arguments.  A key without a lock is free:
** a request that would be granted at once on a fresh lock needs one only
** to hold the grant.  With 'max_pending', a request that would queue
** behind that many acquirers raises the set's max-pending error instead.
*/
int am_keyed_request (lua_State *L, Request *rq) {
  Keyed *kd = (Keyed *)lua_touserdata(L, 1);
  int first = rq->first;
  Lock *lk;
  am_checkkey(L, first, rq->base, rq->fname);
  rq->first = first + 1;              /* the lock's own arguments */
  am_parse_request(L, rq, kd->kind);
  am_check_signal(L, rq->sigidx);  /* aborted: fails before making a lock */
  lua_settop(L, first + 2);      /* extra arguments: the lock's index fits */
  lk = getlock(L, kd, first, 0);
  if (lk == NULL) {
    int free_now = am_fits(&kd->fresh, rq->weight);
    if (rq->kind == W_UNLOCK && free_now) return 0;
    if (rq->wait == AM_TRY && !free_now) {
      lua_pushvalue(L, rq->erridx);
      return lua_error(L);
    }
    lua_pop(L, 1);
    lk = getlock(L, kd, first, 1);
  }
  rq->lock = lk;
  rq->lockidx = lua_gettop(L);
  if (rq->wait == AM_STEAL) return am_steal(L, rq);    /* never queues */
  if (rq->kind == W_ACQUIRE && rq->wait != AM_TRY && kd->max_pending > 0
      && (lua_Integer)lk->queue.count >= kd->max_pending
      && !am_can_lock_now(lk, rq->weight, &rq->priority)) {
    lua_getiuservalue(L, 1, 3);
    return lua_error(L);
  }
  return am_request(L, rq);
}


/*
** Called (as Keyed.settle, through am_settle) after anything that may leave a keyed lock
** idle (no grant out, no waiter, the value back to the initial one): an
** idle lock leaves its keyed set at once, so the set holds only the keys
** in use.  A later request for its key gets a new lock; the old one can
** only be reached by its spent releasers.
*/
static void keyed_settle (lua_State *L, Lock *lk) {
  if (lk->selfref == LUA_NOREF || lk->held > 0
      || lk->value != lk->keyed->fresh.value || lk->queue.count > 0
      || lk->nunlock > 0)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lk->st->keyedlocks);
  lua_rawgetp(L, -1, lk);                            /* kl lock */
  lua_getiuservalue(L, -1, 3);                       /* kl lock keyed */
  lua_getiuservalue(L, -1, 1);                       /* kl lock keyed map */
  lua_getiuservalue(L, -3, 2);                       /* ... map key */
  lua_pushnil(L);
  lua_rawset(L, -3);                                 /* map[key] = nil */
  lua_pushnil(L);
  lua_rawsetp(L, -5, lk);                            /* kl[lk] = nil */
  lua_pop(L, 4);
  lk->selfref = LUA_NOREF;
  lk->keyed->nkeys--;
}


/* {====================================================== constructors */

/* User value 'uv' of the new set (on top) = options[field] or 'dflt'. */
static void setoption (lua_State *L, int optidx, const char *field,
                       const char *dflt, int uv) {
  if (lua_isnoneornil(L, optidx))
    lua_pushstring(L, dflt);
  else if (lua_getfield(L, optidx, field) == LUA_TNIL) {
    lua_pop(L, 1);
    lua_pushstring(L, dflt);
  }
  lua_setiuservalue(L, -2, uv);
}


/* The options a keyed set knows (am_checkoptions refuses any other). */
static const char *const keyed_options[] = {
  "cancelError", "maxPending", "maxPendingError", NULL
};


/*
** new([options]) / new(value [, options]); options: cancelError,
** maxPending (a non-negative integer, 0 = no bound), maxPendingError.
*/
static void newkeyed (lua_State *L, const LockKind *kind, lua_Integer value,
                      int optidx) {
  Keyed *kd;
  lua_Integer max_pending = 0;
  if (!lua_isnoneornil(L, optidx)) {
    luaL_checktype(L, optidx, LUA_TTABLE);
    am_checkoptions(L, optidx, 0, "new", keyed_options);
    if (lua_getfield(L, optidx, "maxPending") != LUA_TNIL) {
      int isint;
      max_pending = lua_tointegerx(L, -1, &isint);
      if (lua_type(L, -1) != LUA_TNUMBER || !isint || max_pending < 0)
        luaL_argerror(L, optidx,
                      "maxPending must be a non-negative integer");
    }
    lua_pop(L, 1);
  }
  kd = (Keyed *)lua_newuserdatauv(L, sizeof(Keyed), 3);
  kd->kind = kind;
  kd->st = am_getstate(L);
  kd->settle = keyed_settle;
  kd->recheck = keyed_recheck;
  am_lock_init(&kd->fresh, kind, kd->st, value);
  kd->max_pending = max_pending;
  kd->nkeys = 0;
  am_pushmt(L, kind->keyed_type);
  lua_setmetatable(L, -2);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);                    /* map */
  setoption(L, optidx, "cancelError", AM_E_CANCELED, 2);
  setoption(L, optidx, "maxPendingError", AM_E_MAX_PENDING, 3);
  if (am_debugging()) am_debug_observer->created(L, kd->st);
}


/* Each set's LockKind, of its locks, is its class functions' upvalue
   (core.c), so that no kind's file is named here. */
#define setkind(L)  ((const LockKind *)lua_touserdata(L, AM_KIND_UPVALUE))

static int kmutex_new (lua_State *L) {
  lua_settop(L, 1);
  newkeyed(L, setkind(L), 1, 1);
  return 1;
}


static int ksem_new (lua_State *L) {
  lua_Integer value = am_checkcount(L, 1);
  lua_settop(L, 2);
  newkeyed(L, setkind(L), value, 2);
  return 1;
}


static int krw_new (lua_State *L) {
  lua_settop(L, 1);
  newkeyed(L, setkind(L), 0, 1);       /* a key without a lock: free */
  return 1;
}

/* }====================================================== */


/* {====================================================== methods */

static int kmutex_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  checkkmutex(L);
  return am_keyed_request(L, &rq);
}


static int ksem_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  checkksem(L);
  return am_keyed_request(L, &rq);
}


/* km:steal(key [, priority]), ks:steal(key [, weight [, priority]]):
   steal.c */
static int kmutex_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, AM_T_KEYED_MUTEX);
  checkkmutex(L);
  return am_keyed_request(L, &rq);
}


static int ksem_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, AM_T_KEYED_SEMAPHORE);
  checkksem(L);
  return am_keyed_request(L, &rq);
}


static int kmutex_waitForUnlock (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .first = 2, .base = 1,
                .fname = "waitForUnlock"};
  checkkmutex(L);
  return am_keyed_request(L, &rq);
}


static int ksem_waitForUnlock (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .first = 2, .base = 1,
                .fname = "waitForUnlock"};
  checkksem(L);
  return am_keyed_request(L, &rq);
}


/* isLocked(key): a key without a lock in use has its initial value. */
static int keyed_isLocked (lua_State *L) {
  Keyed *kd = checkkeyed(L);
  Lock *lk;
  am_checkkey(L, 2, 1, "isLocked");
  lk = getlock(L, kd, 2, 0);
  lua_pushboolean(L, lk ? lk->kind->is_locked(lk)
                        : kd->kind->is_locked(&kd->fresh));
  return 1;
}


static int ksem_getValue (lua_State *L) {
  Keyed *kd = checkksem(L);
  Lock *lk;
  am_checkkey(L, 2, 1, "getValue");
  lk = getlock(L, kd, 2, 0);
  lua_pushinteger(L, (lk ? lk : &kd->fresh)->value);
  return 1;
}


/* release(key): unscoped; a no-op while the key is unlocked (P3). */
static int kmutex_release (lua_State *L) {
  Keyed *kd = checkkmutex(L);
  Lock *lk;
  am_checkkey(L, 2, 1, "release");
  lk = getlock(L, kd, 2, 0);
  if (lk != NULL) am_give_back(L, lk, 1, AM_UNSCOPED, 0);
  am_sync(L, kd->st);
  if (am_debugging() && lk != NULL) am_debug_observer->unscoped(L, kd->st, lk);
  return 0;
}


/*
** release(key [, weight]): adds to the key's value, like Semaphore's.  A
** value left above the initial one keeps the key's lock in the set.
*/
static int ksem_release (lua_State *L) {
  Keyed *kd = checkksem(L);
  Lock *lk;
  lua_Integer weight;
  am_checkkey(L, 2, 1, "release");
  weight = am_optweight(L, 3, 1, "release");
  /* a release that overflows must fail before it makes a lock for the
     key, or the lock would stay in the set (am_give_back checks the rest) */
  if (getlock(L, kd, 2, 0) == NULL && kd->fresh.value > 0
      && weight > LUA_MAXINTEGER - kd->fresh.value)
    luaL_error(L, "semaphore value overflow");
  lua_pop(L, 1);
  lk = getlock(L, kd, 2, 1);                /* (on the stack: anchored) */
  am_give_back(L, lk, weight, AM_UNSCOPED, 0);
  am_sync(L, kd->st);
  if (am_debugging()) am_debug_observer->returned(L, kd->st, lk, weight);
  return 0;
}


/* cancel([key]): rejects the queued acquirers of one key, or of all. */
static int keyed_cancel (lua_State *L) {
  Keyed *kd = checkkeyed(L);
  if (!lua_isnoneornil(L, 2)) {
    Lock *lk;
    am_checkkey(L, 2, 1, "cancel");
    lk = getlock(L, kd, 2, 0);
    if (lk != NULL) am_cancel(L, lk);
    am_sync(L, kd->st);
    return 0;
  }
  lua_settop(L, 1);
  lua_getiuservalue(L, 1, 1);                     /* map */
  lua_pushnil(L);
  while (lua_next(L, 2) != 0) {    /* am_cancel may clear the entry: allowed */
    am_cancel(L, (Lock *)lua_touserdata(L, -1));
    lua_pop(L, 1);
  }
  am_sync(L, kd->st);      /* after the traversal: a hook may add keys */
  return 0;
}


/* count(): how many keys have a lock in use (held or waited for). */
static int keyed_count (lua_State *L) {
  Keyed *kd = checkkeyed(L);
  lua_pushinteger(L, kd->nkeys);
  return 1;
}


/* waiting(key): acquirers queued for the key, and waitForUnlock waiters. */
static int keyed_waiting (lua_State *L) {
  Keyed *kd = checkkeyed(L);
  Lock *lk;
  am_checkkey(L, 2, 1, "waiting");
  lk = getlock(L, kd, 2, 0);
  lua_pushinteger(L, lk ? (lua_Integer)lk->queue.count : 0);
  lua_pushinteger(L, lk ? (lua_Integer)lk->nunlock : 0);
  return 2;
}


/* keys(): a new array of the keys in use. */
static int keyed_keys (lua_State *L) {
  Keyed *kd = checkkeyed(L);
  lua_Integer n = 0;
  lua_settop(L, 1);
  lua_getiuservalue(L, 1, 1);                     /* map */
  lua_createtable(L, (int)kd->nkeys, 0);
  lua_pushnil(L);
  while (lua_next(L, 2) != 0) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, 3, ++n);
  }
  return 1;
}


/* {====================================================== KeyedRWLock
** The RWLock of each key (rwlock.c): the mode of a request is fixed by
** the method (Request.mode), as on a single RWLock. */

static int krw_request (lua_State *L, int kind, const char *fname,
                        lua_Integer mode) {
  Request rq = {.kind = kind, .first = 2, .base = 1, .fname = fname,
                .mode = mode};
  checkkrw(L);
  return am_keyed_request(L, &rq);
}


static int krw_acquireRead (lua_State *L) {
  return krw_request(L, W_ACQUIRE, "acquireRead", AM_RW_READ);
}


static int krw_acquireWrite (lua_State *L) {
  return krw_request(L, W_ACQUIRE, "acquireWrite", AM_RW_WRITE);
}


/* krw:steal(key [, priority]) (a write), krw:stealRead(key [, priority]) */
static int krw_steal_mode (lua_State *L, const char *fname,
                           lua_Integer mode) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = fname, .mode = mode};
  am_steal_decorated(L, AM_T_KEYED_RWLOCK);
  checkkrw(L);
  return am_keyed_request(L, &rq);
}


static int krw_steal (lua_State *L) {
  return krw_steal_mode(L, "steal", AM_RW_WRITE);
}


static int krw_stealRead (lua_State *L) {
  return krw_steal_mode(L, "stealRead", AM_RW_READ);
}


static int krw_acquire (lua_State *L) {
  return krw_request(L, W_ACQUIRE, "acquire", AM_RW_WRITE);
}


/* waitForUnlock(key): until the key is free (a write could be granted). */
static int krw_waitForUnlock (lua_State *L) {
  return krw_request(L, W_UNLOCK, "waitForUnlock", AM_RW_WRITE);
}


/* The RWLock value of the key at 2 (0, free, for a key without a lock). */
static lua_Integer krw_value (lua_State *L, const char *fname) {
  Keyed *kd = checkkrw(L);
  Lock *lk;
  am_checkkey(L, 2, 1, fname);
  lk = getlock(L, kd, 2, 0);
  return lk ? lk->value : kd->fresh.value;
}


static int krw_isWriteLocked (lua_State *L) {
  lua_pushboolean(L, krw_value(L, "isWriteLocked") == AM_RW_WRITTEN);
  return 1;
}


static int krw_readers (lua_State *L) {
  lua_Integer v = krw_value(L, "readers");
  lua_pushinteger(L, v > 0 ? v : 0);
  return 1;
}


/* release(key): ends the key's write hold, as rw:release(); a no-op
   while no writer holds the key. */
static int krw_release (lua_State *L) {
  Keyed *kd = checkkrw(L);
  Lock *lk;
  am_checkkey(L, 2, 1, "release");
  lk = getlock(L, kd, 2, 0);
  if (lk != NULL) am_give_back(L, lk, AM_RW_WRITE, AM_UNSCOPED, 0);
  am_sync(L, kd->st);
  if (am_debugging() && lk != NULL) am_debug_observer->unscoped(L, kd->st, lk);
  return 0;
}


/* A decorated KeyedRWLock's requests (decorated.c): with its limit. */
static int dkrw_acquire (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquire", AM_RW_WRITE);
}


static int dkrw_acquireRead (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquireRead", AM_RW_READ);
}


static int dkrw_acquireWrite (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquireWrite", AM_RW_WRITE);
}


static int dkrw_waitForUnlock (lua_State *L) {
  return am_decorated_request(L, W_UNLOCK, "waitForUnlock", AM_RW_WRITE);
}

/* }====================================================== */


static int keyed__tostring (lua_State *L) {
  Keyed *kd = am_tokeyed(L, 1);
  luaL_argexpected(L, kd != NULL, 1, "keyed lock");
  lua_pushfstring(L, "%s (%I keys in use): %p",
                  am_tnames[kd->kind->keyed_type],
                  (LUAI_UACINT)kd->nkeys, (void *)kd);
  return 1;
}

/* }====================================================== */


const luaL_Reg am_keyed_mutex_methods[] = {
  {"acquire", kmutex_acquire},
  {"waitForUnlock", kmutex_waitForUnlock},
  {"isLocked", keyed_isLocked},
  {"release", kmutex_release},
  {"cancel", keyed_cancel},
  {"steal", kmutex_steal},
  {"count", keyed_count},
  {"waiting", keyed_waiting},
  {"keys", keyed_keys},
  {NULL, NULL}
};

const luaL_Reg am_keyed_semaphore_methods[] = {
  {"acquire", ksem_acquire},
  {"waitForUnlock", ksem_waitForUnlock},
  {"isLocked", keyed_isLocked},
  {"getValue", ksem_getValue},
  {"release", ksem_release},
  {"cancel", keyed_cancel},
  {"steal", ksem_steal},
  {"count", keyed_count},
  {"waiting", keyed_waiting},
  {"keys", keyed_keys},
  {NULL, NULL}
};

const luaL_Reg am_keyed_rwlock_methods[] = {
  {"acquire", krw_acquire},
  {"acquireRead", krw_acquireRead},
  {"acquireWrite", krw_acquireWrite},
  {"waitForUnlock", krw_waitForUnlock},
  {"isLocked", keyed_isLocked},
  {"isWriteLocked", krw_isWriteLocked},
  {"readers", krw_readers},
  {"release", krw_release},
  {"cancel", keyed_cancel},
  {"steal", krw_steal},
  {"stealRead", krw_stealRead},
  {"count", keyed_count},
  {"waiting", keyed_waiting},
  {"keys", keyed_keys},
  {NULL, NULL}
};

const luaL_Reg am_decorated_keyed_rwlock_methods[] = {
  {"acquire", dkrw_acquire},
  {"acquireRead", dkrw_acquireRead},
  {"acquireWrite", dkrw_acquireWrite},
  {"waitForUnlock", dkrw_waitForUnlock},
  {NULL, NULL}
};

/*
** NOTE: a keyed set needs no __gc: it owns no C memory, and its locks,
** held in its map, free their own.
*/
const luaL_Reg am_keyed_metamethods[] = {
  {"__tostring", keyed__tostring},
  {NULL, NULL}
};

const luaL_Reg am_keyed_mutex_class[] = {
  {"new", kmutex_new},
  {NULL, NULL}
};

const luaL_Reg am_keyed_semaphore_class[] = {
  {"new", ksem_new},
  {NULL, NULL}
};

const luaL_Reg am_keyed_rwlock_class[] = {
  {"new", krw_new},
  {NULL, NULL}
};
