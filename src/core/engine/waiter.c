/*
** waiter.c: the life of a request, and the releaser it hands out
** A request is granted at once when the queue rules allow it (without
** yielding), refused at once for tryAcquire, and otherwise suspends the
** calling coroutine in a Waiter until the scheduler resumes it with an
** outcome.  Every change of a Waiter's state is made by one small
** function per transition that asserts the state it leaves:
**
**   NEW --queued--> QUEUED --ready--> READY --resuming--> RESUMING
**   RESUMING --(continuation)--> DONE --(hand out)--> HELD --> RELEASED
**   QUEUED, READY --abandon--> DONE          (coroutine closed or dead)
**   NEW --abandon--> NEW, unanchored         (raised before it was queued)
**   QUEUED --detach--> DONE                  (its lock freed by lua_close)
**
** Those a request makes are here (queued, done, held, released, abandon
** from __close); those the engine's rules make from outside a request are
** in grant.c, beneath (ready, detach, a hold ended), and resuming is
** inline in async_mutex.h for the scheduler's loop.  The other files
** only call these: grant.c and rules.c decide the outcomes (ready,
** detach), the scheduler resumes (resuming, or abandon when a coroutine
** cannot be resumed: StateHooks).  The grant rule, dispatch and giving a
** grant back, which a request and a release apply, are grant.c's: one
** unit with this file, which each event (a request, a release, a
** resume) enters once (docs/internals.md, "One contended acquire,
** release and resume").
*/

#define LUA_LIB

#include <assert.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== transitions */

/* NEW -> QUEUED: once linked in its lock's queue (enqueue). */
static void queued (Waiter *w) {
  assert(w->r.state == S_NEW);
  w->r.state = S_QUEUED;
}


/* READY -> RESUMING: am_waiter_resuming, inline in async_mutex.h. */


/* RESUMING -> DONE: the continuation has read the outcome. */
static void done (Waiter *w) {
  assert(w->r.state == S_RESUMING);
  w->r.state = S_DONE;
}


/* DONE -> HELD: an untimed acquire's waiter becomes its releaser. */
static void held (Waiter *w) {
  assert(w->r.state == S_DONE && w->r.kind == W_ACQUIRE && !w->r.timed);
  w->r.state = S_HELD;
}


/* HELD -> RELEASED; returns whether it was HELD (releases once). */
static int released (Releaser *r) {
  if (r->state != S_HELD) return 0;
  r->state = S_RELEASED;
  return 1;
}


/* RELEASED -> LOST: a release found its hold stolen before it. */
static void lost_after_release (Releaser *r) {
  assert(r->state == S_RELEASED);
  r->state = S_LOST;
}


/*
** QUEUED or READY -> DONE: the waiting coroutine was closed (or cannot
** be resumed): it never gets the lock.  A queued request leaves the
** queue; a grant not yet delivered is given back (saturating: this runs
** from __close, and must not raise).  Either way the lock passes on.
** NEW and still anchored (a request that raised before it was queued): it
** gives its anchor back.  In any other state, nothing to do.  Returns
** whether the queues changed.
*/
int am_waiter_abandon (lua_State *L, Waiter *w) {
  Lock *lk = w->r.lock;
  int state = w->r.state;
  if (state == S_NEW) {
    /* an error between its anchoring and its queueing (a hook raising in
       the clock's luv call, memory): the anchor goes, or pending() and the
       coroutine would be kept for good; a key's lock made for it leaves */
    if (w->r.ref != LUA_NOREF) {
      am_unanchor(L, w);
      am_settle(L, lk);
    }
    return 0;
  }
  if (state != S_QUEUED && state != S_READY) return 0;
  if (state == S_QUEUED) {
    am_timer_remove(L, lk->st, w);
    if (w->r.signalled) am_signal_unlink(w);
    am_dequeue(lk, w);
  }
  else
    am_list_unlink(w, 0);               /* from the ready list */
  w->r.state = S_DONE;
  am_unanchor(L, w);
  if (w->r.kind != W_ACQUIRE)
    am_settle(L, lk);
  else if (state == S_QUEUED)
    am_dispatch(L, lk);
  else if (w->r.outcome == O_GRANTED)
    am_give_back(L, lk, w->r.weight, w->r.token, 1);
  return 1;
}


/*
** Puts a new, anchored waiter in its queue (then QUEUED): an acquirer in
** the lock's queue, a waitForUnlock waiter in its weight's (rules.c).
** Out of memory, it raises with nothing linked, after giving back its
** anchor (a dead coroutine must not stay anchored) and letting a keyed
** lock made for it leave its set.
*/
static void enqueue (lua_State *L, Lock *lk, Waiter *w,
                     const Key *priority) {
  int linked = w->r.kind == W_ACQUIRE
               ? am_queue_push(&lk->queue, w, priority)
               : am_unlock_push(lk, w, priority);
  if (!linked) {
    am_unanchor(L, w);
    am_settle(L, lk);
    luaL_error(L, "not enough memory");
  }
}

/* }====================================================== */


/* {====================================================== releaser */

/* The release of the releaser 'r', at 'idx'. */
static AM_HOT_INLINE int release_hold (lua_State *L, Releaser *r,
                                     int idx) {
  int ended;
  if (!released(r)) return 0;           /* given back already, or lost */
  if (r->lease) am_lease_end(L, r);     /* out of the timer queue */
  /* the kind tells whether this grant was still held (its token) */
  ended = am_give_back(L, r->lock, r->weight, r->token, 0);
  am_sync(L, r->lock->st);
  if (!ended && am_hold_stolen(L, r, idx, 1))
    lost_after_release(r);    /* as a lease's end; its record ended then */
  else if (am_debugging()) am_debug_observer->released(L, r->lock->st, idx);
  return ended;
}


/*
** The release of the releaser at 'idx' (runExclusive's when its body
** raised: run.c).
*/
int am_release_hold (lua_State *L, int idx) {
  return release_hold(L, (Releaser *)lua_touserdata(L, idx), idx);
}


/*
** Releases once, returning whether this call ended the hold: later calls
** (and a lost hold's, lease.c) return false, and arguments are ignored
** (docs/semantics.md, Leases and lost holds).  A mutex
** releaser only ends its own grant: it is a no-op once 'release()' has
** unlocked the mutex, even if someone else holds it since
** (docs/semantics.md, Release and P3), and then returns false too (the
** hold was given back already).  Serves __call and __close (on scope
** exit, error, or coroutine.close).
*/
static int releaser_release (lua_State *L) {
  Releaser *r = (Releaser *)lua_touserdata(L, 1);
  /* am_checkself's test, on every release: its metatable stays on the
     stack (only the result on top is returned) */
  if (r == NULL || !lua_getmetatable(L, 1) || !am_is_mt(L, AM_T_RELEASER))
    r = (Releaser *)am_checkself(L, AM_T_RELEASER);   /* raises */
  lua_pushboolean(L, release_hold(L, r, 1));
  return 1;
}


/*
** "async_mutex.Releaser (held|released|lost): 0x...": a hold an unscoped
** release ended shows as released, though its releaser was never called.
*/
static int releaser__tostring (lua_State *L) {
  Releaser *r = (Releaser *)am_checkself(L, AM_T_RELEASER);
  lua_pushfstring(L, "%s (%s): %p", AM_RELEASER,
                  r->state == S_LOST ? "lost"
                  : am_releaser_live(r) ? "held"
                  : r->state == S_HELD && am_hold_stolen(L, r, 1, 0) ? "lost"
                  : "released", (void *)r);
  return 1;
}


/*
** Pushes what a granted acquire returns (the token first, for kinds that
** return it, then a new releaser); returns how many values.
*/
static int push_grant (lua_State *L, int lockidx, Lock *lk,
                       lua_Integer weight, lua_Integer token) {
  if (!lk->kind->returns_value) {
    am_push_releaser(L, lockidx, lk, weight, token);
    return 1;
  }
  /* a Semaphore: the value; its hold's token is the lock's generation */
  lua_pushinteger(L, token);
  am_push_releaser(L, lockidx, lk, weight, lk->gen);
  return 2;
}

/*
** push_grant for a leased grant: the releaser is a lease's, whose lease
** ends at 'end' (loop time).
*/
static int push_leased_grant (lua_State *L, int lockidx, int lostidx,
                              Lock *lk, lua_Integer weight,
                              lua_Integer token, lua_Number now,
                              lua_Number end) {
  int n = 1;
  if (lk->kind->returns_value) {        /* as push_grant */
    lua_pushinteger(L, token);
    token = lk->gen;
    n = 2;
  }
  am_push_lease(L, lockidx, lostidx, lk, weight, token, now, end);
  return n;
}

/* }====================================================== */


/* {====================================================== the request */

/* The highest stack index a waiting request keeps (the waiter goes just
   above). */
static int top_kept (int lockidx, int erridx, int lostidx, int sigidx) {
  int top = lockidx > erridx ? lockidx : erridx;
  top = top > lostidx ? top : lostidx;
  return top > sigidx ? top : sigidx;
}

#define waiter_top(w)  top_kept((w)->r.lockidx, (w)->r.erridx, \
  (w)->r.lostidx, (w)->r.signalled ? (w)->sigidx : 0)

/* ... most often (every hand-off's) its lock's alone: the three tests,
   of bits in one word, cost less than top_kept's comparisons */
#define waiter_top_fast(w)  \
  ((w)->r.erridx == 0 && (w)->r.lostidx == 0 && !(w)->r.signalled \
   ? (int)(w)->r.lockidx : waiter_top(w))

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
  held(w);
  am_pushmt(L, AM_T_RELEASER);
  lua_setmetatable(L, -2);
  if (!w->r.lock->kind->returns_value) return 1;
  lua_pushinteger(L, w->r.token);       /* as push_grant */
  lua_insert(L, -2);
  w->r.token = w->r.lock->gen;
  return 2;
}
#else
#define HAND_OUT_WAITERS  0
#endif


/*
** Pushes what a canceled request raises: its lock's cancel error, or for
** a grant a steal ended before it was delivered (steal.c), its lost error
** (a lease's, else E_LOST).  Kept out of finish_request's way.
*/
static AM_COLD void push_canceled (lua_State *L, const Waiter *w) {
  if (!w->r.stolen)
    lua_getiuservalue(L, w->r.lockidx, 1);
  else if (w->r.lostidx != 0)
    lua_pushvalue(L, w->r.lostidx);
  else
    lua_pushliteral(L, AM_E_LOST);
}


/*
** Delivers the outcome of the RESUMING waiter 'w' (at 'widx'): pushes the
** results of the grant, or raises the error value itself (level 0).
*/
static int deliver (lua_State *L, Waiter *w, int widx) {
  done(w);
  switch (w->r.outcome) {
    case O_GRANTED: {
      int n;
      if (w->r.kind == W_UNLOCK) return 0;
      if (w->r.lock->kind->owned != NULL)  /* its holder, from now on */
        w->r.lock->kind->owned(L, w->r.lock, w->r.lockidx);
      if (w->r.leased) {                     /* the lease starts (or ran) */
        lua_Number now = am_timer_now(L, w->r.lock->st, 1);
        n = push_leased_grant(L, w->r.lockidx, w->r.lostidx, w->r.lock,
                              w->r.weight, w->r.token, now,
                              w->r.lease_from_request ? w->lease
                                                      : now + w->lease);
      }
#if HAND_OUT_WAITERS
      else if (!w->r.timed && !w->r.signalled)
        n = hand_out_waiter(L, w, widx);
#endif
      else
        n = push_grant(L, w->r.lockidx, w->r.lock, w->r.weight, w->r.token);
      if (am_debugging()) am_debug_observer->granted(L, w->r.lock->st);
      return n;
    }
    case O_TIMEOUT:
      if (w->r.erridx == 0) return 0;       /* a sleep (core.c) is over */
      lua_pushvalue(L, w->r.erridx);
      return lua_error(L);
    default:                  /* canceled, aborted, or stolen (steal.c) */
      if (w->r.outcome == O_ABORTED)
        lua_getiuservalue(L, w->sigidx, 1);   /* the signal's reason */
      else
        push_canceled(L, w);
      return lua_error(L);
  }
}


/*
** Continuation of a suspended request, run when the coroutine is resumed.
** A resume by anyone but the scheduler (the waiter is not RESUMING) is
** ignored: the coroutine goes back to waiting.  Otherwise deliver the
** outcome.
*/
static int finish_request (lua_State *L, int status, lua_KContext ctx) {
  Waiter *w = (Waiter *)ctx;
  int widx = waiter_top_fast(w) + 1;
  (void)status;
  if (w->r.state != S_RESUMING) {         /* the waiter back on top */
    lua_settop(L, widx);
    return lua_yieldk(L, 0, ctx, finish_request);
  }
  return deliver(L, w, widx);
}


/*
** finish_request for runExclusive's request (Request.fnidx): its body
** is kept just below the waiter, and runs once the grant is delivered.
*/
static int finish_run (lua_State *L, int status, lua_KContext ctx) {
  Waiter *w = (Waiter *)ctx;
  int widx = waiter_top(w) + 2;
  (void)status;
  if (w->r.state != S_RESUMING) {
    lua_settop(L, widx);
    return lua_yieldk(L, 0, ctx, finish_run);
  }
  return am_run_body(L, widx - 1, deliver(L, w, widx));
}


static AM_COLD int abandon_on_close (lua_State *L, Waiter *w) {
  if (am_waiter_abandon(L, w))
    am_sync(L, w->r.lock->st);
  return 0;
}

/*
** A DONE waiter (its grant handed out, its slot closed by
** hand_out_waiter: every hand-off) has nothing to do, tested before
** anything else: with am_waiter_abandon inline here, each call saved and
** restored six registers first.
*/
static int waiter__close (lua_State *L) {
  Waiter *w = (Waiter *)lua_touserdata(L, 1);
  if (w->r.state == S_DONE) return 0;
  return abandon_on_close(L, w);
}


/*
** Pushes a NEW waiter for 'rq' (to-be-closed, just above what the
** continuation reads).
*/
static Waiter *new_waiter (lua_State *L, const Request *rq, int timed,
                           int hands_out) {
  int leased = rq->lease > 0 && rq->kind == W_ACQUIRE;
  int signalled = rq->sigidx != 0;
  /* only as far as it is used (async_mutex.h: Waiter) */
  Waiter *w = (Waiter *)lua_newuserdatauv(L, signalled ? sizeof(Waiter)
                                             : timed ? AM_TIMED_SIZE
                                             : leased ? AM_LEASED_SIZE
                                             : AM_UNTIMED_SIZE,
                                          hands_out);
  assert(rq->lockidx <= AM_IDX_MAX && rq->erridx <= AM_IDX_MAX
         && rq->lostidx <= AM_IDX_MAX);
  if (hands_out) {      /* every hand-off's: untimed, unleased, no signal */
    /* its constant bits copied whole, where the literal below builds its
       bit fields one by one; no lease, so no lost error (lostidx 0) */
    static const Releaser fresh = {.state = S_NEW, .kind = W_ACQUIRE,
                                   .outcome = O_GRANTED, .ref = LUA_NOREF};
    assert(!timed && !leased && !signalled && rq->lostidx == 0);
    w->r = fresh;
    w->r.lock = rq->lock;
    w->r.weight = rq->weight;
    w->r.lockidx = (unsigned)rq->lockidx;
    w->r.erridx = (unsigned)rq->erridx;
    w->q.prev = w->q.next = NULL;
    goto typed;
  }
  w->r = (Releaser){.lock = rq->lock, .weight = rq->weight, .token = 0,
                    .state = S_NEW, .lease = 0,
                    .kind = (unsigned)rq->kind, .outcome = O_GRANTED,
                    .timed = (unsigned)timed, .leased = (unsigned)leased,
                    .lease_from_request = (rq->lease_from_request != 0),
                    .lockidx = (unsigned)rq->lockidx,
                    .erridx = (unsigned)rq->erridx,
                    .lostidx = (unsigned)rq->lostidx, .ref = LUA_NOREF};
  w->q.prev = w->q.next = NULL;
  if (timed || leased || signalled) w->lease = rq->lease;
  if (timed || signalled) {
    w->t.prev = w->t.next = NULL;
    w->deadline = 0;
  }
  if (signalled) {
    w->r.signalled = 1;
    w->sprev = w->snext = NULL;
    w->sig = NULL;
    w->sigidx = rq->sigidx;
  }
 typed:
  am_pushmt(L, AM_T_WAITER);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);            /* coroutine.close while waiting: abandon */
  return w;
}


/*
** Grants 'rq' on 'lk' now, to the running coroutine: pushes what acquire
** returns (waitForUnlock: nothing; a keyed lock may be idle again).  A
** leased grant's lease starts at 'now' (read before deciding).
*/
static AM_HOT_INLINE int grant_now (lua_State *L, const Request *rq,
                                    Lock *lk, lua_Number now) {
  lua_Integer token;
  int n;
  if (rq->kind == W_UNLOCK) {
    am_settle(L, lk);
    return 0;
  }
  token = am_take(lk, rq->weight);
  if (lk->kind->owned != NULL) lk->kind->owned(L, lk, rq->lockidx);
  if (rq->lease > 0)
    n = push_leased_grant(L, rq->lockidx, rq->lostidx, lk, rq->weight,
                          token, now, now + rq->lease);
  else
    n = push_grant(L, rq->lockidx, lk, rq->weight, token);
  if (am_debugging()) am_debug_observer->granted(L, lk->st);
  return n;
}


/* QUEUED waiter 'w' of 'rq' joins its signal's list. */
static AM_COLD void link_signal (lua_State *L, int sigidx, Waiter *w) {
  am_signal_link((Signal *)lua_touserdata(L, sigidx), w);
}


/*
** A request with a signal, on lock 'lk' (its key's as it is now): if the signal was
** aborted meanwhile (by a finalizer or a hook that the request's own
** allocations or calls ran), it never queues: its waiter 'w' (if made
** already) gives its anchor back, a key's lock made for it leaves its
** set, and the signal's reason is raised.
*/
static AM_COLD void aborted_meanwhile (lua_State *L, int sigidx, Lock *lk,
                                       Waiter *w) {
  if (!((Signal *)lua_touserdata(L, sigidx))->aborted) return;
  if (w != NULL) am_unanchor(L, w);
  am_settle(L, lk);
  am_check_signal(L, sigidx);
}


/*
** The NEW waiter 'w' of 'rq', anchored and decided, joins the queue of
** 'lk' (and the timer queue, from 'now', and its signal's list), and the
** calling coroutine waits until the scheduler resumes it with an outcome
** (finish_request, or runExclusive's finish_run).
*/
static int wait_queued (lua_State *L, Request *rq, Lock *lk, Waiter *w,
                        lua_Number now) {
  if (lk->freed) {                 /* a finalizer run by lua_close */
    am_unanchor(L, w);
    am_usage_error(L,
                   "attempt to wait for a lock while the Lua state is closing");
  }
  enqueue(L, lk, w, &rq->priority);
  queued(w);
  if (rq->wait == AM_TIMEOUT) am_timer_add(L, lk->st, w, now, rq->ms);
  if (rq->sigidx != 0) link_signal(L, rq->sigidx, w);
  /* a task cancelled while it ran is closed once it waits (task.c) */
  if (lk->st->ncanceling > 0) lk->st->hooks->task_waits(L, lk->st);
  am_sync(L, lk->st);                      /* arms the timer */
  return lua_yieldk(L, 0, (lua_KContext)w,
                    rq->fnidx != 0 ? finish_run : finish_request);
}


/*
** Suspends the calling coroutine in a new waiter for 'rq', queued, until
** the scheduler resumes it with an outcome (finish_request).
*/
static int suspend (lua_State *L, Request *rq) {
  Lock *lk = rq->lock;
  int timed = (rq->wait == AM_TIMEOUT);
  int leased = rq->lease > 0 && rq->kind == W_ACQUIRE;
  int hands_out = HAND_OUT_WAITERS && !timed && !leased
                  && rq->sigidx == 0 && rq->kind == W_ACQUIRE;
  int clocked, precise;
  int top = top_kept(rq->lockidx, rq->erridx, rq->lostidx, rq->sigidx)
            + (rq->fnidx != 0);
  lua_Number now = 0, need;
  Waiter *w;
  /* keep what the continuation reads (and runExclusive's body, just
     above it); the waiter goes just above.  Most often (m:acquire()) the
     stack is that already, and lua_gettop costs less than lua_settop */
  assert(rq->fnidx == 0 || rq->fnidx == top);
  if (lua_gettop(L) != top) lua_settop(L, top);
  /* RE-ENTRY (docs/semantics.md, "Re-entry"): allocate first, decide
     after.  Both allocations below may run a collector step, and so a
     user's finalizer, which may release this very lock: the decision
     taken before is stale until it is taken again below. */
  w = new_waiter(L, rq, timed, hands_out);
  /* anchored before it is queued: if a later step raises and nothing
     catches it, the dead coroutine and its waiter stay alive while queued;
     if a step before the queueing raises, the waiter's __close gives the
     anchor back (am_waiter_abandon) */
  am_anchor(L, w);                         /* may run the collector */
  /* the clock, if the wait needs it (a lease counted from the grant
     reads it when the grant comes); a wait of 0 ms reads the loop's
     cached time, which a lease never starts from ('precise') */
  clocked = timed || (leased && rq->lease_from_request);
  need = (leased && rq->lease_from_request) ? rq->lease : rq->ms;
  precise = clocked && need > 0;
  if (clocked)
    now = am_timer_now(L, lk->st, need);   /* calls luv: a hook may run */
  if (leased && rq->lease_from_request)
    w->lease = now + rq->lease;            /* the lease's end */
 decide:
  /* From here until the waiter is QUEUED nothing runs Lua code.  A keyed
     lock may have left its set meanwhile (a finalizer released the key):
     the request goes to the key's lock as it is now. */
  lk = w->r.lock = am_keyed_current(L, lk, rq->lockidx);
  if (rq->sigidx != 0) aborted_meanwhile(L, rq->sigidx, lk, w);
  if (hands_out) {                        /* its future releaser's lock */
    lua_pushvalue(L, rq->lockidx);
    lua_setiuservalue(L, -2, 1);
  }
  if (am_can_lock_now(lk, rq->weight, &rq->priority)) {  /* freed meanwhile */
    if (leased && !precise) {     /* its lease starts now: the clock (Lua) */
      now = am_timer_now(L, lk->st, rq->lease);
      clocked = precise = 1;
      goto decide;                             /* then decide again */
    }
    am_unanchor(L, w);            /* never queued: its __close is a no-op */
    return grant_now(L, rq, lk, now);
  }
  return wait_queued(L, rq, lk, w, now);
}


/*
** The debug observer's request hook, given a Request of its own made of
** the fields it reads (debug_deadlock.c: am_dbg_request; any other field
** is 0): the calls a request makes take its fields, never its address,
** nor copy it whole, so that a flattened acquire (mutex_semaphore.c)
** keeps its constant fields in registers, or folds them away, instead of
** writing them all first and reading them back from memory after every
** call (docs/bench.md, "What the API shape costs").
*/
static AM_COLD void debug_request (lua_State *L, int kind, int wait,
                                   int erridx, Lock *lk, int lockidx,
                                   lua_Integer weight, Key priority) {
  Request rq = {.kind = kind, .wait = wait, .erridx = erridx, .lock = lk,
                .lockidx = lockidx, .weight = weight, .priority = priority};
  am_debug_observer->request(L, &rq);
}


/*
** acquire / waitForUnlock of 'rq->lock' (at 'rq->lockidx'), once the
** arguments are checked: grant now, refuse now (tryAcquire), or suspend
** the calling coroutine until the scheduler resumes it with an outcome.
*/
int am_request (lua_State *L, Request *rq) {
  lua_Number now = 0;
  /* aborted: fails at once (and if aborted by what runs below, before it
     queues: suspend) */
  if (rq->sigidx != 0) am_check_signal(L, rq->sigidx);
  if (am_debugging())                     /* may raise E_DEADLOCK */
    debug_request(L, rq->kind, rq->wait, rq->erridx, rq->lock, rq->lockidx,
                  rq->weight, rq->priority);
  if (rq->lease > 0 && rq->kind == W_ACQUIRE
      && am_can_lock_now(rq->lock, rq->weight, &rq->priority)) {
    /* a grant now starts its lease: the clock first (it calls luv, so a
       hook may run and change the lock), then decide again below.  A
       request that waits reads it only if it must (suspend), so that the
       clock's Lua call leaves no frame behind in a waiting coroutine. */
    now = am_timer_now(L, rq->lock->st, rq->lease);
  }
  /* RE-ENTRY: both calls above may run Lua code (a hook), which may have
     dropped a key's lock from its set (a cancel settling the idle lock
     made for this request) and given the key a new one: decide on the
     key's lock as it is now (docs/internals.md, Decide, then commit) */
  rq->lock = am_keyed_current(L, rq->lock, rq->lockidx);
  if (rq->lock->kind->reenters != NULL
      && rq->lock->kind->reenters(L, rq->lock, rq->kind))
    return grant_now(L, rq, rq->lock, now);     /* its holder, once more */
  if (am_can_lock_now(rq->lock, rq->weight, &rq->priority))  /* fast path */
    return grant_now(L, rq, rq->lock, now);
  if (rq->wait == AM_TRY) {
    am_settle(L, rq->lock);       /* a keyed lock made for this try */
    lua_pushvalue(L, rq->erridx);
    return lua_error(L);
  }
  return suspend(L, rq);
}


/*
** The request of a plain lock 'lk' at index 1: parses the user's
** arguments, then requests.
*/
int am_lock_request (lua_State *L, Lock *lk, Request *rq) {
  rq->lock = lk;
  rq->lockidx = 1;
  am_parse_request(L, rq, lk->kind);
  return am_request(L, rq);
}

/* }====================================================== */


const luaL_Reg am_releaser_metamethods[] = {
  {"__call", releaser_release},
  {"__close", releaser_release},
  {"__tostring", releaser__tostring},
  {NULL, NULL}
};

/* Methods of a releaser; each checks that its lock kind offers it. */
const luaL_Reg am_releaser_methods[] = {
  {"check", am_releaser_check},
  {NULL, NULL}
};

const luaL_Reg am_waiter_metamethods[] = {
  {"__close", waiter__close},
  {NULL, NULL}
};
