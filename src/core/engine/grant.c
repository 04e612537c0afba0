/*
** grant.c: the grant rule, dispatch and giving a grant back, and the
** changes of a waiter's state they make from outside its request
** A request and a release apply these rules (waiter.c), and so do the
** queue rules off the hot path (rules.c), a lease's end (lease.c) and a
** steal (steal.c): this file calls none of them but rules.c (the
** waitForUnlock waiters resolved at each dispatch), so the engine's
** files use one another one way (docs/internals.md, "The layers").  The
** transitions here are the ones those make (waiter.c has the diagram and
** the rest): QUEUED -> READY, QUEUED -> DONE at lua_close, and a hold
** ended other than by its releaser.  A counted kind (a Mutex, a
** Semaphore) is asked only what its release gives back.
*/

#define LUA_LIB

#include <assert.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== transitions */

/*
** QUEUED -> READY: its outcome is decided and it has left its lock's
** queue; it leaves the timer queue and joins the scheduler's ready list.
** A grant records its token (what the releaser will give back).
*/
void am_waiter_ready (lua_State *L, Waiter *w, int outcome,
                      lua_Integer token) {
  State *st = w->r.lock->st;
  assert(w->r.state == S_QUEUED);
  if (w->r.timed) am_timer_remove(L, st, w);
  if (w->r.signalled) am_signal_unlink(w);
  w->r.token = token;
  w->r.outcome = (unsigned)outcome;
  w->r.state = S_READY;
  am_schedule(st, w);
}


/*
** HELD -> LOST or RELEASED: a hold ended other than by its releaser's own
** release: its lease ran out or a steal ended it (lost), or it ends as it
** becomes another hold (an RWLock write downgraded: spent, released).
** lease.c and rwlock.c end holds through this, and write no state.
*/
void am_hold_ended (Releaser *r, int lost) {
  assert(r->state == S_HELD);
  r->state = lost ? S_LOST : S_RELEASED;
}


/*
** QUEUED -> DONE at lua_close, when its lock is freed (rules.c:
** am_lock_free) with the waiter still in its queue (taken out already):
** it leaves the timer queue and its anchor, and nothing else happens.
*/
void am_waiter_detach (Waiter *w) {
  assert(w->r.state == S_QUEUED);
  am_timer_remove(NULL, w->r.lock->st, w);
  if (w->r.signalled) am_signal_unlink(w);
  w->r.state = S_DONE;
  am_unanchor(NULL, w);
}

/* }====================================================== */


/* {====================================================== the grant rules */

/* am_fits and am_can_lock_now, the grant rule: inline, in async_mutex.h. */


/*
** Takes a grant of 'weight'; returns its token.  'held' counts grants
** out, for keyed locks to know when a key is idle.  A kind with its own
** rule takes it (LockKind.take); a counted kind's grant takes its weight
** from the value, and its token is the value before it for a kind whose
** acquire returns it (a Semaphore), else a new generation, the grant's
** own (a Mutex's releaser ends only its own grant).
*/
lua_Integer am_take (Lock *lk, lua_Integer weight) {
  /* 'held' saturates: with setValue the grants out may sum beyond
     maxinteger (it only has to stay above 0 while any is out) */
  lk->held = weight > LUA_MAXINTEGER - lk->held ? LUA_MAXINTEGER
                                                : lk->held + weight;
  if (lk->kind->take != NULL) return lk->kind->take(lk, weight);
  lk->value -= weight;
  return lk->kind->returns_value ? lk->value + weight : ++lk->gen;
}


/*
** After the value grew or the queue shrank (docs/semantics.md, Dispatch):
** grant strictly from the head while the kind can grant it, resolving
** unlock waiters (rules.c) before each.
*/
void am_dispatch (lua_State *L, Lock *lk) {
  Waiter *head;
  if (lk->nunlock > 0) am_drain_unlock(L, lk);
  while ((head = am_queue_first(&lk->queue)) != NULL
         && am_fits(lk, head->r.weight)) {
    am_queue_remove(&lk->queue, head);
    am_waiter_ready(L, head, O_GRANTED, am_take(lk, head->r.weight));
    if (lk->nunlock > 0) am_drain_unlock(L, lk);
    /* a counted kind with nothing left grants no weight (each is >= 1):
       a mutex's hand-off takes no second look at the queue */
    if (lk->kind->fits == NULL && lk->value <= 0) break;
  }
  am_settle(L, lk);
}


/*
** The one way a grant goes back: by its releaser (token), by an unscoped
** release (AM_UNSCOPED), or abandoned undelivered ('saturate': must not
** raise).  The kind decides what that gives back (docs/semantics.md,
** Release and P3); if anything, the lock dispatches.  An unscoped release
** counts as giving back a grant.  Returns whether it gave anything back:
** for a releaser's grant, whether that grant was still held (a releaser's
** call returns it).
*/
int am_give_back (lua_State *L, Lock *lk, lua_Integer weight,
                  lua_Integer token, int saturate) {
  int gave = lk->kind->give_back(lk, weight, token, saturate);
  if (gave < 0) luaL_error(L, "semaphore value overflow");
  if (gave > 0) {
    lk->held = lk->held > weight ? lk->held - weight : 0;
    /* nobody to grant nor resolve and no key to settle (an uncontended
       release): what am_dispatch would find, without the call */
    if (lk->queue.n != 0 || lk->nunlock > 0 || lk->keyed != NULL)
      am_dispatch(L, lk);
  }
  return gave > 0;
}

/* }====================================================== */


/* {====================================================== releaser */

/* Pushes a new releaser of 'weight' of the lock at 'lockidx'. */
void am_push_releaser (lua_State *L, int lockidx, Lock *lk,
                           lua_Integer weight, lua_Integer token) {
  Releaser *r = (Releaser *)lua_newuserdatauv(L, sizeof(Releaser), 1);
  *r = (Releaser){.lock = lk, .weight = weight, .token = token,
                  .state = S_HELD, .ref = LUA_NOREF};
  am_pushmt(L, AM_T_RELEASER);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, lockidx);
  lua_setiuservalue(L, -2, 1);
}

/* }====================================================== */
