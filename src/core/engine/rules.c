/*
** rules.c: the queue rules off the hot path (docs/semantics.md,
** waitForUnlock, Cancel, Timeouts): waitForUnlock's buckets of waiters by
** weight, cancel, expiry, abort, whether a hold is still in place, and a
** lock's birth and end.  The grant rule, dispatch and giving a grant back
** are grant.c's, with the request and the release that use them (one
** unit, one call per event: docs/internals.md).  Every decision here is
** synchronous; grant.c records each outcome and the scheduler resumes
** the coroutines later.  Nothing here calls Lua code (see am_sync in
** scheduler.c): the entry points call am_sync once the change is complete.
*/

#define LUA_LIB

#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* {====================================================== unlock waiters */

/* Index of the bucket for 'weight', or where it would be inserted. */
static size_t find_weight (Lock *lk, lua_Integer weight) {
  size_t lo = 0, hi = lk->nweights;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (lk->unlock[mid].weight < weight) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}


/*
** The bucket of waitForUnlock waiters of 'weight', created if needed;
** NULL when out of memory.
*/
static Queue *weight_queue (Lock *lk, lua_Integer weight) {
  size_t i = find_weight(lk, weight);
  if (i == lk->nweights || lk->unlock[i].weight != weight) {
    if (lk->nweights == lk->capweights) {
      size_t cap = lk->capweights ? 2 * lk->capweights : 4;
      WeightWaiters *a = (WeightWaiters *)realloc(lk->unlock,
                                                  cap * sizeof(*a));
      if (a == NULL) return NULL;
      lk->unlock = a;
      lk->capweights = cap;
    }
    memmove(lk->unlock + i + 1, lk->unlock + i,
            (lk->nweights - i) * sizeof(*lk->unlock));
    lk->nweights++;
    lk->unlock[i].weight = weight;
    am_queue_init(&lk->unlock[i].queue, 0);
  }
  return &lk->unlock[i].queue;
}


/* Drops the buckets left empty. */
static void compact_weights (Lock *lk) {
  size_t i, j = 0;
  for (i = 0; i < lk->nweights; i++) {
    if (lk->unlock[i].queue.count > 0)
      lk->unlock[j++] = lk->unlock[i];
    else
      am_queue_free(&lk->unlock[i].queue);
  }
  lk->nweights = j;
}


/*
** Resolves the waitForUnlock waiters that could lock now (docs/semantics.md,
** waitForUnlock; the cost is P6's):
** those whose weight the value covers and, while acquirers are queued,
** whose priority is strictly above the head's.  Heaviest first, then in
** queue order.  Cost depends on the registered weights, not the value.
*/
void am_drain_unlock (lua_State *L, Lock *lk) {
  size_t i = lk->nweights;
  int emptied = 0;
  while (lk->nunlock > 0 && i-- > 0) {
    Queue *q = &lk->unlock[i].queue;
    Waiter *w;
    if (!am_fits(lk, lk->unlock[i].weight)) continue;
    while ((w = am_queue_first(q)) != NULL
           && (lk->queue.n == 0
               || am_key_above(am_queue_firstkey(q),
                               am_queue_firstkey(&lk->queue)))) {
      am_queue_remove(q, w);
      lk->nunlock--;
      am_waiter_ready(L, w, O_GRANTED, 0);
    }
    if (q->count == 0) emptied = 1;
  }
  if (emptied) compact_weights(lk);
}


/*
** Links the NEW waitForUnlock waiter 'w' in the bucket of its weight
** (waiter.c then makes it QUEUED); 0 when out of memory, with nothing
** linked and no bucket left empty.
*/
int am_unlock_push (Lock *lk, Waiter *w, const Key *priority) {
  Queue *q = weight_queue(lk, w->r.weight);
  if (q == NULL) return 0;
  if (!am_queue_push(q, w, priority)) {
    if (q->count == 0) compact_weights(lk);
    return 0;
  }
  lk->nunlock++;
  return 1;
}

/* }====================================================== */


/* Takes a QUEUED waiter out of its lock's queue (not the timer queue). */
void am_dequeue (Lock *lk, Waiter *w) {
  if (w->r.kind == W_ACQUIRE)
    am_queue_remove(&lk->queue, w);
  else {
    size_t i = find_weight(lk, w->r.weight);
    am_queue_remove(&lk->unlock[i].queue, w);
    lk->nunlock--;
    if (lk->unlock[i].queue.count == 0) compact_weights(lk);
  }
}


/*
** Is the grant of releaser 'r' still held: not given back, not lost, not
** stolen (a steal moves the lock's generation on: steal.c), and not ended
** by an unscoped release (m:release() ends a mutex's or a write's hold,
** whose token is the lock's generation; a semaphore's holds and an
** RWLock's reads have no owner for it to end)?
*/
int am_releaser_live (const Releaser *r) {
  const Lock *lk = r->lock;
  if (r->state != S_HELD || lk->freed || r->token != lk->gen) return 0;
  return lk->kind->live != NULL ? lk->kind->live(lk, r->weight)
                                : lk->kind->is_locked(lk);
}


/*
** Rejects every queued acquirer, in queue order; holders keep the lock.
** Unlock waiters are then re-evaluated against the empty queue
** (docs/semantics.md, Cancel; P4).
*/
void am_cancel (lua_State *L, Lock *lk) {
  Waiter *w;
  while ((w = am_queue_first(&lk->queue)) != NULL) {
    am_queue_remove(&lk->queue, w);
    am_waiter_ready(L, w, O_CANCELED, 0);
  }
  am_drain_unlock(L, lk);
  am_settle(L, lk);
}


/*
** A waiter whose deadline passed (not a lease's: lease.c,
** am_timer_expired) leaves the queue at once, and the queue
** is re-dispatched, since its removal may unblock others
** (docs/semantics.md, Timeouts; P1).
*/
void am_expire (lua_State *L, Waiter *w) {
  Lock *lk = w->r.lock;
  am_dequeue(lk, w);
  am_waiter_ready(L, w, O_TIMEOUT, 0);
  if (w->r.kind == W_ACQUIRE) am_dispatch(L, lk);
  else am_settle(L, lk);
}


/*
** Aborts signal 's': every waiter in its list (QUEUED) fails with the
** signal's reason (O_ABORTED).  All leave their queues first, so that no
** dispatch below grants one of them in between; then each is READY and
** its lock passes on.  Runs no Lua code and allocates nothing.
*/
void am_abort (lua_State *L, Signal *s) {
  Waiter *w;
  for (w = s->first; w != NULL; w = w->snext)
    am_dequeue(w->r.lock, w);
  while ((w = s->first) != NULL) {
    Lock *lk = w->r.lock;
    am_waiter_ready(L, w, O_ABORTED, 0);        /* out of the list */
    if (w->r.kind == W_ACQUIRE) am_dispatch(L, lk);
    else am_settle(L, lk);
  }
}


/* A new lock of 'kind', of value 'value' (1 for a mutex). */
void am_lock_init (Lock *lk, const LockKind *kind, State *st,
                   lua_Integer value) {
  lk->kind = kind;
  lk->st = st;
  lk->value = value;
  lk->held = 0;
  lk->gen = 1;                  /* no grant's token is AM_UNSCOPED */
  am_queue_init(&lk->queue, 0);
  lk->unlock = NULL;
  lk->nweights = lk->capweights = lk->nunlock = 0;
  lk->freed = 0;
  lk->dbg = -1;
  lk->keyed = NULL;
  lk->selfref = LUA_NOREF;
  lk->internal = 0;
  lk->owner = NULL;
}


/*
** Frees the lock's memory.  NOTE: a lock with queued waiters is collected
** only by lua_close (each waiter's coroutine holds the lock on its stack
** and is anchored).  Its waiters then leave every queue first, as if
** abandoned (grant.c: am_waiter_detach), so that a finalizer run after
** this one (closing their coroutine, releasing the lock) finds an empty
** lock, not freed memory.
*/
void am_lock_free (Lock *lk) {
  Waiter *w;
  size_t i;
  while ((w = am_queue_first(&lk->queue)) != NULL) {
    am_queue_remove(&lk->queue, w);
    am_waiter_detach(w);
  }
  for (i = 0; i < lk->nweights; i++)
    while ((w = am_queue_first(&lk->unlock[i].queue)) != NULL) {
      am_queue_remove(&lk->unlock[i].queue, w);
      am_waiter_detach(w);
    }
  lk->nunlock = 0;
  lk->freed = 1;
  am_queue_free(&lk->queue);
  for (i = 0; i < lk->nweights; i++)
    am_queue_free(&lk->unlock[i].queue);
  free(lk->unlock);
  lk->unlock = NULL;
  lk->nweights = lk->capweights = 0;
}
