/*
** request.c: acquire and waitForUnlock, and the releaser
** A request is granted at once when the queue rules allow it (without
** yielding), refused at once for tryAcquire, and otherwise suspends the
** calling coroutine until the scheduler resumes it with an outcome.
*/

#define LUA_LIB

#include <math.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


/* {====================================================== arguments */

/*
** Argument errors in the auxlib's shape.  'base' is the stack index just
** before the user's first argument (1 for a method: self), so the numbers
** are the ones the user wrote, for plain and decorated locks alike.
*/
int am_argerror (lua_State *L, int idx, int base, const char *fname,
                 const char *msg) {
  return luaL_error(L, "bad argument #%d to '%s' (%s)", idx - base, fname,
                    msg);
}


/* A weight: a positive integer (integral floats accepted), default 1. */
lua_Integer am_optweight (lua_State *L, int idx, int base,
                          const char *fname) {
  lua_Integer w;
  int isint;
  if (lua_isnoneornil(L, idx)) return 1;
  w = lua_tointegerx(L, idx, &isint);
  if (lua_type(L, idx) != LUA_TNUMBER || !isint || w <= 0)
    am_argerror(L, idx, base, fname, "weight must be a positive integer");
  return w;
}


/*
** A priority: any number but NaN, default 0; compared exactly as Lua
** compares numbers (async_mutex.h: Key).
*/
static Key optpriority (lua_State *L, int idx, int base,
                        const char *fname) {
  lua_Number p;
  Key k;
  if (lua_isnoneornil(L, idx)) return am_key_number(0);
  if (lua_type(L, idx) != LUA_TNUMBER) {
    lua_pushfstring(L, "priority must be a number, got %s",
                    luaL_typename(L, idx));
    am_argerror(L, idx, base, fname, lua_tostring(L, -1));
  }
  if (lua_isinteger(L, idx)) {
    k.i = lua_tointeger(L, idx);
    k.n = (lua_Number)k.i;
    k.flt = 0;
    return k;
  }
  p = lua_tonumber(L, idx);
  if (p != p)
    am_argerror(L, idx, base, fname, "priority must not be NaN");
  return am_key_number(p);
}

/* }====================================================== */


/* {====================================================== releaser */

/*
** A releaser is a Waiter cut before 'q': 'lock', 'weight' (what a
** semaphore gives back), 'u.value' (a mutex: the grant it ends) and
** 'state', HELD until released.  User value 1 keeps the lock alive.
*/

/* Pushes a releaser for 'weight' of the lock at 'lockidx' ('gen': the
   mutex grant). */
static void push_releaser (lua_State *L, int lockidx, Lock *lk,
                           lua_Integer weight, lua_Integer gen) {
  Waiter *r = (Waiter *)lua_newuserdatauv(L, AM_RELEASER_SIZE, 1);
  r->lock = lk;
  r->weight = weight;
  r->u.value = gen;
  r->state = S_HELD;
  am_pushupvalue(L, UV_RELEASER);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, lockidx);
  lua_setiuservalue(L, -2, 1);
}


/*
** Releases once; later calls, and arguments, are ignored.  A mutex
** releaser only ends its own grant: it is a no-op once 'release()' has
** unlocked the mutex (P3), even if someone else holds it since.  Serves
** __call and __close (on scope exit, error, or coroutine.close).
*/
static int releaser_release (lua_State *L) {
  Waiter *r = (Waiter *)am_checkself(L, UV_RELEASER, AM_RELEASER);
  if (r->state == S_HELD) {
    Lock *lk = r->lock;
    r->state = S_RELEASED;
    if (!lk->is_mutex)
      am_release(L, lk, r->weight);
    else if (lk->value <= 0 && lk->gen == r->u.value)
      am_release(L, lk, 1);
    am_sync(L, lk->st);
  }
  return 0;
}


static int releaser__tostring (lua_State *L) {
  Waiter *r = (Waiter *)am_checkself(L, UV_RELEASER, AM_RELEASER);
  lua_pushfstring(L, "%s (%s): %p", AM_RELEASER,
                  r->state == S_HELD ? "held" : "released", (void *)r);
  return 1;
}

/* }====================================================== */


/*
** Pushes what a granted acquire returns; returns how many values.
** 'value' is what am_take returned (a mutex: the grant's generation).
*/
static int push_grant (lua_State *L, int lockidx, Lock *lk,
                       lua_Integer weight, lua_Integer value) {
  if (lk->is_mutex) {
    push_releaser(L, lockidx, lk, 1, value);
    return 1;
  }
  lua_pushinteger(L, value);
  push_releaser(L, lockidx, lk, weight, 0);
  return 2;
}


/*
** Returns the grant of an untimed acquire, whose waiter (at 'widx', the
** top, to-be-closed) becomes its releaser.  The waiter's slot is closed
** first, while the waiter's __close (a no-op once DONE) still serves it:
** as a releaser, it would release.  Needs lua_closeslot (on 5.4.4 a
** lua_settop that closes a slot may leave a dangling stack top).  It came
** with Lua 5.4.3, but headers before 5.4.4 all give release number 0, so
** 5.4.0-5.4.3 keep handing out a fresh releaser.
*/
#if LUA_VERSION_RELEASE_NUM >= 50403
#define HAND_OUT_WAITERS  1

static int hand_out_waiter (lua_State *L, Waiter *w, int widx) {
  lua_pushvalue(L, widx);
  lua_closeslot(L, widx);
  w->state = S_HELD;
  am_pushupvalue(L, UV_RELEASER);
  lua_setmetatable(L, -2);
  if (w->lock->is_mutex) return 1;
  lua_pushinteger(L, w->u.value);
  lua_insert(L, -2);
  return 2;
}
#else
#define HAND_OUT_WAITERS  0
#endif


/*
** Continuation of a suspended request, run when the coroutine is resumed.
** A resume by anyone but the scheduler (the waiter is not RESUMING) is
** ignored: the coroutine goes back to waiting.  Otherwise deliver the
** outcome: results of the grant, or the error value itself (level 0).
*/
static int finish_request (lua_State *L, int status, lua_KContext ctx) {
  Waiter *w = (Waiter *)ctx;
  int widx = (w->lockidx > w->erridx ? w->lockidx : w->erridx) + 1;
  (void)status;
  if (w->state != S_RESUMING) {           /* the waiter back on top */
    lua_settop(L, widx);
    return lua_yieldk(L, 0, ctx, finish_request);
  }
  w->state = S_DONE;
  switch (w->outcome) {
    case O_GRANTED:
      if (w->kind == W_UNLOCK) return 0;
#if HAND_OUT_WAITERS
      if (!w->timed) return hand_out_waiter(L, w, widx);
#endif
      return push_grant(L, w->lockidx, w->lock, w->weight, w->u.value);
    case O_TIMEOUT:
      lua_pushvalue(L, w->erridx);
      return lua_error(L);
    default:
      lua_getiuservalue(L, w->lockidx, 1);  /* the lock's cancel error */
      return lua_error(L);
  }
}


static int waiter__close (lua_State *L) {
  Waiter *w = (Waiter *)lua_touserdata(L, 1);
  am_abandon(L, w);
  am_sync(L, w->lock->st);
  return 0;
}


/*
** Reads the user's weight (semaphores) and priority, starting at stack
** index 'first'; 'base' and 'fname' shape the argument errors.
*/
void am_parse_request (lua_State *L, Request *rq, int is_mutex, int first,
                       int base, const char *fname) {
  rq->weight = is_mutex ? 1 : am_optweight(L, first, base, fname);
  rq->priority = optpriority(L, is_mutex ? first : first + 1, base, fname);
}


/* Requests that may wait need a coroutine that can yield (SEMANTICS 2.3). */
void am_check_yieldable (lua_State *L, const Request *rq, int is_mutex) {
  if (rq->mode != AM_TRY && !lua_isyieldable(L))
    luaL_error(L, "attempt to %s %s outside a coroutine",
               rq->kind == W_ACQUIRE ? "acquire" : "wait for",
               is_mutex ? "a mutex" : "a semaphore");
}


/*
** acquire / waitForUnlock of the lock at 'rq->lockidx', once the arguments
** are checked: grant now, refuse now (tryAcquire), or suspend the calling
** coroutine until the scheduler resumes it with an outcome.
*/
int am_request (lua_State *L, const Request *rq) {
  Lock *lk = rq->lock;
  Waiter *w;
  int timed, hands_out;
  lua_Number now = 0;
  if (am_can_lock_now(lk, rq->weight, &rq->priority)) {    /* fast path */
    if (rq->kind == W_UNLOCK) return 0;
    return push_grant(L, rq->lockidx, lk, rq->weight, am_take(lk, rq->weight));
  }
  if (rq->mode == AM_TRY) {
    am_settle(L, lk);             /* a keyed lock made for this try */
    lua_pushvalue(L, rq->erridx);
    return lua_error(L);
  }
  /* keep what the continuation reads; the waiter goes just above */
  lua_settop(L, rq->lockidx > rq->erridx ? rq->lockidx : rq->erridx);
  timed = (rq->mode == AM_TIMEOUT);
  hands_out = HAND_OUT_WAITERS && !timed && rq->kind == W_ACQUIRE;
  /* RE-ENTRY (docs/semantics.md, "Re-entry"): allocate first, decide
     after.  Both allocations below may run a collector step, and so a
     user's finalizer, which may release this very lock: the decision
     above is stale until it is taken again below. */
  w = (Waiter *)lua_newuserdatauv(L, timed ? sizeof(Waiter) : AM_UNTIMED_SIZE,
                                  hands_out);
  w->lock = lk;
  w->weight = rq->weight;
  w->u.value = 0;
  w->ref = LUA_NOREF;
  w->state = S_DONE;
  w->kind = (unsigned)rq->kind;
  w->outcome = O_GRANTED;
  w->timed = (unsigned)timed;
  w->lockidx = (unsigned char)rq->lockidx;
  w->erridx = (unsigned char)rq->erridx;
  w->q.prev = w->q.next = NULL;
  if (timed) w->t.prev = w->t.next = NULL;
  am_pushupvalue(L, UV_WAITER);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);            /* coroutine.close while waiting: abandon */
  /* anchored before it is queued: if a later step raises and nothing
     catches it, the dead coroutine and its waiter stay alive while queued */
  am_anchor(L, w);                         /* may run the collector */
  if (timed) now = am_timer_now(L, lk->st);    /* calls luv: a hook may run */
  /* From here until the waiter is QUEUED nothing runs Lua code.  A keyed
     lock may have left its set meanwhile (a finalizer released the key):
     the request goes to the key's lock as it is now. */
  lk = w->lock = am_keyed_current(L, lk, rq->lockidx);
  if (hands_out) {                        /* its future releaser's lock */
    lua_pushvalue(L, rq->lockidx);
    lua_setiuservalue(L, -2, 1);
  }
  if (am_can_lock_now(lk, rq->weight, &rq->priority)) {  /* freed meanwhile */
    am_unanchor(L, w);            /* never queued: its __close is a no-op */
    if (rq->kind == W_UNLOCK) {
      am_settle(L, lk);
      return 0;
    }
    return push_grant(L, rq->lockidx, lk, rq->weight, am_take(lk, rq->weight));
  }
  if (lk->freed) {                 /* a finalizer run by lua_close */
    am_unanchor(L, w);
    luaL_error(L, "attempt to wait for a lock while the Lua state is closing");
  }
  am_enqueue(L, lk, w, &rq->priority);      /* now QUEUED */
  if (timed) am_timer_add(L, lk->st, w, now, rq->ms);
  am_sync(L, lk->st);                      /* arms the timer */
  return lua_yieldk(L, 0, (lua_KContext)w, finish_request);
}


/*
** The common case: the lock 'lk' at index 1, user arguments from index
** 'first', numbered after 'base'; 'erridx' holds the limit's error.
*/
int am_lock_request (lua_State *L, Lock *lk, int kind, int first, int base,
                     const char *fname, int mode, lua_Number ms,
                     int erridx) {
  Request rq;
  rq.kind = kind;
  rq.lock = lk;
  rq.lockidx = 1;
  rq.mode = mode;
  rq.ms = ms;
  rq.erridx = erridx;
  am_parse_request(L, &rq, lk->is_mutex, first, base, fname);
  am_check_yieldable(L, &rq, lk->is_mutex);
  return am_request(L, &rq);
}


const luaL_Reg am_releaser_metamethods[] = {
  {"__call", releaser_release},
  {"__close", releaser_release},
  {"__tostring", releaser__tostring},
  {NULL, NULL}
};

const luaL_Reg am_waiter_metamethods[] = {
  {"__close", waiter__close},
  {NULL, NULL}
};
