/*
** reentrant.c: the ReentrantMutex kind: the coroutine holding it may
** acquire it again without waiting
** A mutex (value 1 free, 0 held) whose holder is recorded: the coroutine
** the outermost grant was delivered to ('Lock.owner').  Its requests are
** granted at once, past the queue (a holder waiting behind its own waiters
** would wait for ever), each as one more level: 'held' counts the levels.
** Each level has its own releaser; the lock is free when every level is
** given back, in any order, from any coroutine.  Everyone else queues as
** for a Mutex (docs/lockkinds.md, ReentrantMutex).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== the kind */

static int re_fits (const Lock *lk, lua_Integer weight) {
  (void)weight;
  return lk->value > 0;
}


static int re_is_locked (const Lock *lk) {
  return lk->value <= 0;
}


/*
** The outermost grant takes the lock and starts a generation; a nested
** one (its holder's) shares the generation: every level's token is the
** hold's.
*/
static lua_Integer re_take (Lock *lk, lua_Integer weight) {
  (void)weight;
  if (lk->value > 0) {
    lk->value = 0;
    return ++lk->gen;
  }
  return lk->gen;
}


/*
** Gives back one level of the hold 'token'; the last level frees the lock
** and forgets its holder.  ('held' still counts this level: grant.c
** am_give_back takes it off after.)
*/
static int re_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                         int saturate) {
  (void)weight; (void)saturate;
  if (lk->value > 0 || token != lk->gen) return 0;
  if (lk->held <= 1) {
    lk->value = 1;
    lk->owner = NULL;
  }
  return 1;
}


/* A steal ends the hold in place, every level (steal.c). */
static void re_end_holds (Lock *lk) {
  lk->value = 1;
  lk->owner = NULL;
}


static int re_reenters (lua_State *L, Lock *lk, int kind);
static void re_owned (lua_State *L, Lock *lk, int lockidx);

const LockKind am_reentrant_kind = {
  .name = "ReentrantMutex",
  .noun = "a reentrant mutex",
  .type = AM_T_REENTRANT_MUTEX,
  .keyed_type = AM_T_REENTRANT_MUTEX,     /* no keyed form */
  .weighted = 0,
  .returns_value = 0,
  .fits = re_fits,
  .take = re_take,
  .give_back = re_give_back,
  .is_locked = re_is_locked,
  .end_holds = re_end_holds,
  .reentrant = 1,
  .reenters = re_reenters,
  .owned = re_owned,
};

/* }====================================================== */


/*
** Is the running coroutine's request of 'kind' its holder's (waiter.c:
** granted at once, as a new level)?  The holder's waitForUnlock would wait
** for itself: raises.
*/
static int re_reenters (lua_State *L, Lock *lk, int kind) {
  if (lk->owner != L || lk->value > 0) return 0;
  if (kind == W_UNLOCK)
    am_usage_error(L, "attempt to wait for a reentrant mutex that this "
                      "coroutine holds (it would wait for itself)");
  return 1;
}


/*
** The running coroutine now holds 'lk' (at 'lockidx'): it becomes the
** owner.  NOTE: the owner is compared by address, so the lock anchors it
** (user value 2) while it may hold: a collected coroutine's address could
** be reused by a new one.  The anchor stays until the next grant replaces
** it.
*/
static void re_owned (lua_State *L, Lock *lk, int lockidx) {
  lk->owner = L;
  lua_pushthread(L);
  lua_setiuservalue(L, lockidx, 2);
}


#define checkre(L)  ((Lock *)am_checkself(L, AM_T_REENTRANT_MUTEX))


/* ReentrantMutex.new([cancel_error]) */
static int re_new (lua_State *L) {
  Lock *lk;
  lua_settop(L, 1);
  lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 2);
  am_lock_init(lk, &am_reentrant_kind, am_getstate(L), 1);
  am_pushmt(L, AM_T_REENTRANT_MUTEX);
  lua_setmetatable(L, -2);
  if (lua_isnil(L, 1)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  if (am_debugging()) am_debug_observer->created(L, lk->st);
  return 1;
}


/* {====================================================== methods */

/* rm:steal([priority]): steal.c (never by its holder) */
static int re_steal (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_STEAL, .first = 2, .base = 1,
                .fname = "steal"};
  am_steal_decorated(L, AM_T_REENTRANT_MUTEX);
  return am_lock_steal(L, checkre(L), &rq);
}


/* rm:depth(): the levels held (0 when free). */
static int re_depth (lua_State *L) {
  Lock *lk = checkre(L);
  lua_pushinteger(L, lk->value <= 0 ? lk->held : 0);
  return 1;
}


/* rm:isHeldByMe(): does the running coroutine hold it? */
static int re_isHeldByMe (lua_State *L) {
  Lock *lk = checkre(L);
  lua_pushboolean(L, lk->value <= 0 && lk->owner == L);
  return 1;
}


/* }====================================================== */


static int re__tostring (lua_State *L) {
  Lock *lk = (Lock *)luaL_checkudata(L, 1, am_tnames[AM_T_REENTRANT_MUTEX]);
  if (lk->value <= 0)
    lua_pushfstring(L, "%s (locked, depth %I, %d waiting): %p",
                    am_tnames[AM_T_REENTRANT_MUTEX], (LUAI_UACINT)lk->held,
                    (int)lk->queue.count, (void *)lk);
  else
    lua_pushfstring(L, "%s (unlocked, %d waiting): %p", am_tnames[AM_T_REENTRANT_MUTEX],
                    (int)lk->queue.count, (void *)lk);
  return 1;
}


static int dre_acquire (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquire", 0);
}


static int dre_waitForUnlock (lua_State *L) {
  return am_decorated_request(L, W_UNLOCK, "waitForUnlock", 0);
}


/* With the shared methods of lock.c (waitForUnlock, isLocked, cancel,
   __gc). */
const luaL_Reg am_reentrant_methods[] = {
  {"depth", re_depth},
  {"isHeldByMe", re_isHeldByMe},
  {"steal", re_steal},
  {"release", NULL},          /* none: a hold ends by its releaser only */
  {NULL, NULL}
};

const luaL_Reg am_decorated_reentrant_methods[] = {
  {"acquire", dre_acquire},
  {"waitForUnlock", dre_waitForUnlock},
  {NULL, NULL}
};

const luaL_Reg am_reentrant_metamethods[] = {
  {"__tostring", re__tostring},
  {NULL, NULL}
};

const luaL_Reg am_reentrant_class[] = {
  {"new", re_new},
  {NULL, NULL}
};
