/*
** decorated.c: withTimeout and tryAcquire's decorated locks
** A decorated lock is a userdata holding its lock (user value 1), a limit
** and the error raised when the limit is hit (user value 2).  The limit
** is a timeout in ms (withTimeout), or none at all (tryAcquire: decide
** at once).  Its acquire and waitForUnlock are the lock's requests with
** the limit; every other method is the lock's own, which accepts a
** decorated lock as self (args.c: am_checkself).  docs/semantics.md,
** Timeouts and tryAcquire.
*/

#define LUA_LIB

#include <math.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/*
** User values: 1 the lock, 2 the timeout (or refusal) error, 3 the lost
** error of a lease, 4 the abort signal (withSignal) or nil.  Decorators
** compose: a decorated lock decorated again keeps the limit, the lease or
** the signal it does not replace.
*/
typedef struct Decorated {
  AmType type;                /* of its lock */
  int wait;                   /* AM_TIMEOUT, AM_WAIT (no limit) or AM_TRY */
  lua_Number ms;              /* AM_TIMEOUT: the timeout */
  lua_Number lease;           /* withLease: how long a hold lasts; 0: none */
  int lease_from_request;     /* ... counted from the request */
} Decorated;


/* The type of the lock at 'idx'; returns 0 if it is none. */
static int locktype (lua_State *L, int idx, AmType *t) {
  int i;
  for (i = 0; i < AM_NLOCKTYPES; i++)
    if (am_testself(L, idx, (AmType)i) != NULL) {
      *t = (AmType)i;
      return 1;
    }
  return 0;
}


/* The decorated lock at 'idx', or NULL. */
static Decorated *todecorated (lua_State *L, int idx) {
  int i;
  for (i = 0; i < AM_NLOCKTYPES; i++) {
    void *d = am_testself(L, idx, am_decorated_type(i));
    if (d != NULL) return (Decorated *)d;
  }
  return NULL;
}


/*
** Pushes a new decorated lock of the lock at 1, a copy of it when it is
** decorated already, and returns it.  'fname' names the decorator in
** errors.
*/
static Decorated *decorate (lua_State *L, const char *fname) {
  Decorated *d, *from = todecorated(L, 1);
  AmType t = (AmType)0;                 /* (set by locktype when from is NULL) */
  if (from == NULL && !locktype(L, 1, &t)) {
    am_typeerror(L, 1, 0, fname, "async_mutex lock");
  }
  d = (Decorated *)lua_newuserdatauv(L, sizeof(Decorated), 4);
  if (from != NULL) {
    *d = *from;
    for (t = 1; t <= 4; t++) {
      lua_getiuservalue(L, 1, (int)t);
      lua_setiuservalue(L, -2, (int)t);
    }
  }
  else {
    d->type = t;
    d->wait = AM_WAIT;
    d->ms = 0;
    d->lease = 0;
    d->lease_from_request = 0;
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
  }
  am_pushmt(L, am_decorated_type(d->type));
  lua_setmetatable(L, -2);
  return d;
}


/* Sets user value 'n' of the decorated lock on top: the value at 'idx',
   or 'dflt' when it is nil. */
static void set_error (lua_State *L, int n, int idx, const char *dflt) {
  if (lua_isnil(L, idx)) lua_pushstring(L, dflt);
  else lua_pushvalue(L, idx);
  lua_setiuservalue(L, -2, n);
}


/*
** withTimeout(lock, ms [, timeout_error]): the lock, whose requests raise
** timeout_error when not granted within ms milliseconds.
*/
int am_withTimeout (lua_State *L) {
  Decorated *d;
  lua_Number ms = lua_tonumber(L, 2);
  lua_settop(L, 3);
  if (lua_type(L, 2) != LUA_TNUMBER || !(ms >= 0))
    am_argerror(L, 2, 0, "withTimeout",
                "timeout must be a non-negative number");
  d = decorate(L, "withTimeout");
  d->wait = ms == HUGE_VAL ? AM_WAIT : AM_TIMEOUT;
  d->ms = ms;
  set_error(L, 2, 3, AM_E_TIMEOUT);
  return 1;
}


/*
** tryAcquire(lock [, already_locked_error]): the lock, whose requests
** raise already_locked_error at once when they cannot succeed now.
*/
int am_tryAcquire (lua_State *L) {
  Decorated *d;
  lua_settop(L, 2);
  d = decorate(L, "tryAcquire");
  d->wait = AM_TRY;
  set_error(L, 2, 2, AM_E_ALREADY_LOCKED);
  return 1;
}


/*
** withLease(lock, ms [, lost_error [, options]]): the lock, whose holds
** last at most ms milliseconds (lease.c); options.fromRequest counts them
** from the request instead of the grant.
*/
static const char *const lease_options[] = {"fromRequest", NULL};

int am_withLease (lua_State *L) {
  Decorated *d;
  lua_Number ms = lua_tonumber(L, 2);
  int from_request = 0;
  lua_settop(L, 4);
  if (lua_type(L, 2) != LUA_TNUMBER || !(ms > 0) || ms == HUGE_VAL)
    am_argerror(L, 2, 0, "withLease",
                "lease must be a positive finite number");
  if (!lua_isnil(L, 4)) {
    if (lua_type(L, 4) != LUA_TTABLE) {
      lua_pushfstring(L, "options must be a table, got %s",
                      luaL_typename(L, 4));
      am_argerror(L, 4, 0, "withLease", lua_tostring(L, -1));
    }
    am_checkoptions(L, 4, 0, "withLease", lease_options);
    lua_getfield(L, 4, "fromRequest");
    from_request = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  if (am_testself(L, 1, AM_T_REENTRANT_MUTEX) != NULL
      || am_testself(L, 1, AM_T_DECORATED_REENTRANT_MUTEX) != NULL)
    am_argerror(L, 1, 0, "withLease",
                "a ReentrantMutex cannot be leased (its levels are one "
                "hold)");
  d = decorate(L, "withLease");
  d->lease = ms;
  d->lease_from_request = from_request;
  set_error(L, 3, 3, AM_E_LOST);
  return 1;
}


/*
** withSignal(lock, signal): the lock, whose requests fail with the
** signal's reason once it is aborted (signal.c).
*/
int am_withSignal (lua_State *L) {
  if (am_tosignal(L, 2) == NULL) {
    am_typeerror(L, 2, 0, "withSignal", AM_SIGNAL);
  }
  lua_settop(L, 2);
  decorate(L, "withSignal");
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 4);
  return 1;
}


/*
** Rearranges a decorated request (self at 1, the user's arguments from
** 'rq->first') as lock, error, [lost error,] [signal,] arguments, and
** gives 'rq' the decorated lock's limit, lease and signal.  Returns the
** lock.
*/
static void *undecorate (lua_State *L, Decorated *d, Request *rq) {
  rq->wait = d->wait;
  rq->ms = d->ms;
  rq->erridx = 2;
  if (lua_getiuservalue(L, 1, 4) != LUA_TNIL) {  /* self ... signal */
    lua_insert(L, 2);                         /* self signal ... */
    rq->sigidx = d->lease > 0 ? 4 : 3;
    rq->first++;
    rq->base++;
  }
  else lua_pop(L, 1);
  if (d->lease > 0) {
    rq->lease = d->lease;
    rq->lease_from_request = d->lease_from_request;
    rq->lostidx = 3;
    lua_getiuservalue(L, 1, 3);               /* self ... lost */
    lua_insert(L, 2);                         /* self lost ... */
    rq->first++;
    rq->base++;
  }
  lua_getiuservalue(L, 1, 2);                 /* self [lost] ... err */
  lua_insert(L, 2);                           /* self err [lost] ... */
  lua_getiuservalue(L, 1, 1);
  lua_replace(L, 1);                          /* lock err [lost] ... */
  return lua_touserdata(L, 1);
}


/*
** A request of a decorated lock: self at 1, the user's arguments after.
** Rearranged as lock, error, arguments (numbered from 1 after the
** error), then the lock's own request with the limit.  Upvalue after the
** module's: the decorated type the method belongs to.  'mode': what an
** unweighted kind's method asks for (Request.mode).
*/
#define DECORATED_TYPE  lua_upvalueindex(AM_NUPVALUES + 1)

int am_decorated_request (lua_State *L, int kind, const char *fname,
                          lua_Integer mode) {
  AmType t = (AmType)lua_tointeger(L, DECORATED_TYPE);
  Decorated *d = (Decorated *)am_testself(L, 1, t);
  Request rq = {.kind = kind, .erridx = 2, .first = 3, .base = 2,
                .fname = fname, .mode = mode};
  if (d == NULL) {
    return am_typeerror(L, 1, 0, fname,
                        am_tnames[t] + strlen("async_mutex."));
  }
  undecorate(L, d, &rq);
  if (am_tokeyed(L, 1) != NULL) return am_keyed_request(L, &rq);
  return am_lock_request(L, (Lock *)lua_touserdata(L, 1), &rq);
}


/*
** A steal (steal.c) through the lock or keyed set of type 't' at 1: a
** decorated one's limit and lease do not apply to it.  Those that would
** say something it cannot do are refused, as Web Locks refuses steal with
** ifAvailable or a signal: a try (it takes the lock whoever holds it), a
** signal (it never waits, so nothing would abort it) and a lease (its
** hold has none).  A timeout is moot: it never waits.
*/
void am_steal_decorated (lua_State *L, AmType t) {
  Decorated *d = (Decorated *)am_testself(L, 1, am_decorated_type(t));
  if (d == NULL) return;
  if (d->wait == AM_TRY)
    am_usage_error(L, "attempt to steal through tryAcquire (a steal takes "
                      "the lock whoever holds it)");
  if (d->lease > 0)
    am_usage_error(L, "attempt to steal through withLease (a stolen hold "
                      "has no lease)");
  if (lua_getiuservalue(L, 1, 4) != LUA_TNIL)
    am_usage_error(L, "attempt to steal through withSignal (a steal never "
                      "waits)");
  lua_pop(L, 1);
}


static int decorated_acquire (lua_State *L) {
  return am_decorated_request(L, W_ACQUIRE, "acquire", 0);
}


static int decorated_waitForUnlock (lua_State *L) {
  return am_decorated_request(L, W_UNLOCK, "waitForUnlock", 0);
}


/*
** runExclusive(self, fn, ...) of a Mutex or Semaphore ('t'), plain or
** decorated: checks self and fn, acquires, with the arguments numbered as
** runExclusive's (fn is #1), then runs fn (run.c).  fn stays on the stack
** just above what the request keeps (Request.fnidx): at 2 for a plain
** lock; a decorated one's limit, lost error and signal go below it.
*/
int am_run_request (lua_State *L, AmType t) {
  Request rq = {.kind = W_ACQUIRE, .first = 3, .base = 1,
                .fname = "runExclusive"};
  Decorated *d = NULL;
  void *lk = am_testself(L, 1, t);
  if (lk == NULL && (d = (Decorated *)am_testself(L, 1,
                                                  am_decorated_type(t)))
                    == NULL)
    return am_typeerror(L, 1, 0, "runExclusive", am_tnames[t]);
  if (lua_type(L, 2) != LUA_TFUNCTION) {
    if (luaL_getmetafield(L, 2, "__call") == LUA_TNIL)
      return am_typeerror(L, 2, 1, "runExclusive", "function");
    lua_pop(L, 1);
  }
  if (d != NULL) {
    rq.first = 4;
    rq.base = 2;
    lk = undecorate(L, d, &rq);
  }
  rq.fnidx = rq.first - 1;
  return am_run_body(L, rq.fnidx, am_lock_request(L, (Lock *)lk, &rq));
}


/*
** core.limit(d): the lock, the limit (ms, math.huge, or false for a try),
** the error and the signal (or nil) of a decorated lock d; nothing for
** anything else.  For acquireAll, whose timeout bounds the whole
** acquisition.
*/
int am_core_limit (lua_State *L) {
  Decorated *d = todecorated(L, 1);
  if (d == NULL) return 0;
  lua_getiuservalue(L, 1, 1);
  if (d->wait == AM_TRY) lua_pushboolean(L, 0);
  else lua_pushnumber(L, d->wait == AM_WAIT ? HUGE_VAL : d->ms);
  lua_getiuservalue(L, 1, 2);
  lua_getiuservalue(L, 1, 4);
  return 4;
}


/*
** core.acquire(lock, limit, err, ...), for acquireAll (and the Redis
** locks' gates): the lock's request with a limit: a timeout in ms, or
** false to decide at once.  The user's own arguments (...) start at index
** 4 and are numbered from 1 in errors.  'mode': an unweighted kind's mode
** (Request.mode); core.acquireRead and core.acquireWrite serve a
** KeyedRWLock's.
*/
static int core_acquire (lua_State *L, lua_Integer mode) {
  Request rq = {.kind = W_ACQUIRE, .wait = AM_TRY, .erridx = 3, .first = 4,
                .base = 3, .fname = "acquire", .mode = mode};
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
  return core_acquire(L, 0);
}


int am_core_acquire_read (lua_State *L) {
  return core_acquire(L, AM_RW_READ);
}


int am_core_acquire_write (lua_State *L) {
  return core_acquire(L, AM_RW_WRITE);
}


const luaL_Reg am_decorated_methods[] = {
  {"acquire", decorated_acquire},
  {"waitForUnlock", decorated_waitForUnlock},
  {NULL, NULL}
};
