/*
** mutex_semaphore.c: the Mutex and Semaphore lock kinds, and their methods
** A Semaphore counts: a grant takes its weight from the value, a release
** gives it back.  A Mutex is a semaphore of value 1 with its own argument
** shapes, whose release only ends the grant it was given for and is a
** no-op while unlocked (docs/semantics.md, Release and P3).  Both are
** counted kinds: they leave 'fits' and 'take' to the engine's counting
** rule (grant.c: am_fits, am_take; a Mutex's token is a new generation,
** a Semaphore's the value before), so a hand-off calls one hook of theirs,
** 'give_back'.  runExclusive: run.c.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== the kinds */

static int value_is_locked (const Lock *lk) {
  return lk->value <= 0;
}


static int mutex_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                            int saturate) {
  (void)weight; (void)saturate;
  if (lk->value > 0 || (token != AM_UNSCOPED && token != lk->gen))
    return 0;                           /* unlocked, or a later grant's */
  lk->value++;
  return 1;
}


static int sem_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                          int saturate) {
  /* a releaser's token is the generation of its grant: a steal moved it
     on, and ended the hold (steal.c).  A saturating give-back is always
     of a grant in place (a lease that ran out, a grant not delivered,
     whose token is the value it returns) */
  if (!saturate && token != AM_UNSCOPED && token != lk->gen) return 0;
  /* a key's lock that left its set (keyed.c: keyed_settle) is reached
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


/*
** A semaphore's hold is live while its generation is (a steal moves it
** on), unless its key's lock left the set (docs/semantics.md, Keyed
** locks): it does nothing then.  Its holds are shared, never exclusive.
*/
static int sem_live (const Lock *lk, lua_Integer weight) {
  (void)weight;
  return lk->keyed == NULL || lk->selfref != LUA_NOREF;
}

static int sem_shared (lua_Integer weight) {
  (void)weight;
  return 1;
}

static int sem_exclusive (const Lock *lk) {
  (void)lk;
  return 0;
}

const LockKind am_mutex_kind = {
  .name = "Mutex",
  .noun = "a mutex",
  .type = AM_T_MUTEX,
  .keyed_type = AM_T_KEYED_MUTEX,
  .weighted = 0,
  .returns_value = 0,
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
  .give_back = sem_give_back,
  .is_locked = value_is_locked,
  .end_holds = sem_end_holds,
  .live = sem_live,
  .shared = sem_shared,
  .exclusive = sem_exclusive,
};

/* }====================================================== */


#define checksem(L)    ((Lock *)am_checkself(L, AM_T_SEMAPHORE))


/* runExclusive(self, fn, ...) (decorated.c, run.c). */
static int mutex_runExclusive (lua_State *L) {
  return am_run_request(L, AM_T_MUTEX);
}


static int sem_runExclusive (lua_State *L) {
  return am_run_request(L, AM_T_SEMAPHORE);
}


/*
** The hot path's acquire, direct: the shared one (lock.c) reads its type
** from an upvalue first.  Flattened (AM_FLATTEN): the self check and the
** request (waiter.c) inlined, with this Request's constants (no signal, no
** lease, no timeout, no body) folded in, took an uncontended pair from
** 1,787 instructions to 1,732 and a hand-off from 3,595 to 3,520, for
** 20 KB more code (docs/bench.md, "What the API shape costs").  The
** Semaphore's acquire, off the targets' paths, stays as it was.
*/
static AM_FLATTEN int mutex_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  am_parse_lock_request(L, &rq, AM_T_MUTEX);
  return am_request(L, &rq);
}


static int sem_acquire (lua_State *L) {
  Request rq = {.kind = W_ACQUIRE, .first = 2, .base = 1,
                .fname = "acquire"};
  am_parse_lock_request(L, &rq, AM_T_SEMAPHORE);
  return am_request(L, &rq);
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


/* With the shared methods of lock.c (new, release, cancel, ...). */
const luaL_Reg am_mutex_methods[] = {
  {"acquire", mutex_acquire},
  {NULL, NULL}
};

const luaL_Reg am_semaphore_methods[] = {
  {"acquire", sem_acquire},
  {"getValue", sem_getValue},
  {"setValue", sem_setValue},
  {NULL, NULL}
};

const luaL_Reg am_mutex_class[] = {
  {"runExclusive", mutex_runExclusive},
  {NULL, NULL}
};

const luaL_Reg am_semaphore_class[] = {
  {"runExclusive", sem_runExclusive},
  {NULL, NULL}
};
