/*
** debug_deadlock.c: the C side of debug mode's deadlock search
** A request that would wait asks, before anything is decided, whether
** its coroutine would wait for ever (am_dbg_request): the wait-for search
** is the Lua module's; the facts about holds and queues it needs (what a
** lock's recorded holds weigh, whether a request fits beside them, who
** may wait) are read here, without allocating.
*/

#include <assert.h>

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "debug.h"


/* {====================================================== deadlocks */

/*
** The weight of the holds of 'lk' with a live owner record.  The last
** answer is kept while no record was made or ended and nothing was given
** back: a search asks it for each member it looks at, and walking the
** lock's records each time made a search of a Semaphore whose n waiters
** each hold a unit cost n^2 (spec 147).
*/
static lua_Integer recorded_weight (DebugRecords *d, const Lock *lk) {
  lua_Integer w = 0;
  int s;
  if (d->rw_lock == lk && d->rw_epoch == d->epoch && d->rw_held == lk->held
      && d->rw_value == lk->value)
    return d->rw_weight;
  for (s = lk->dbg; s >= 0; s = d->slots[s].next_lock)
    if (am_releaser_live(d->slots[s].r)) w += d->slots[s].r->weight;
  d->rw_lock = lk;
  d->rw_epoch = d->epoch;
  d->rw_held = lk->held;
  d->rw_value = lk->value;
  d->rw_weight = w;
  return w;
}


/*
** Could a request for 'weight' of 'lk' be granted once every holder
** outside a doomed set has given back, the doomed ones holding 'n' of its
** records, of weight 'w', 'writes' of them RWLock writes (docs/debug.md,
** Deadlocks)?  A lock no doomed coroutine holds lets it in (a Semaphore
** used as a signal, which nobody holds, is no part of a cycle).  A hold
** with no record (granted before debug mode, or not delivered yet) counts
** as outside: no false positive.  The one copy of this rule: the request
** hook's and the search's (core.dbg_fits).
*/
int am_dbg_fits_outside (DebugRecords *d, const Lock *lk,
                         lua_Integer weight, lua_Integer n, lua_Integer w,
                         lua_Integer writes) {
  lua_Integer recorded, avail;
  if (n == 0) return 1;
  if (lk->kind == &am_rwlock_kind)  /* a write needs every hold gone; a */
    return weight != AM_RW_WRITE && writes == 0;    /* read, the writer's */
  if (lk->value >= weight) return 1;        /* value + avail >= weight, */
  recorded = d != NULL ? recorded_weight(d, lk) : 0;
  /* what comes back: the recorded holds outside, and those unrecorded */
  avail = (lk->held > recorded ? lk->held : recorded) - w;
  if (lk->value < 0 && weight > LUA_MAXINTEGER + lk->value)  /* without */
    return 0;                                            /* overflow */
  return avail >= weight - lk->value;
}


/*
** Would a waiter of 'lk' be served after a request at 'rq' once queued (an
** acquirer of a lower priority; a waitForUnlock of an equal or lower one:
** docs/semantics.md, Dispatch)?  Nobody waits behind a waitForUnlock.
** The buckets are few (one per priority in use).
*/
static int served_after (const Lock *lk, const Request *rq) {
  size_t i;
  uint32_t j;
  if (rq->kind == W_UNLOCK) return 0;
  for (j = 0; j < lk->queue.n; j++)
    if (am_key_above(&rq->priority, &lk->queue.heap[j]->key)) return 1;
  for (i = 0; i < lk->nweights; i++) {
    const Queue *q = &lk->unlock[i].queue;
    for (j = 0; j < q->n; j++)
      if (!am_key_above(&q->heap[j]->key, &rq->priority)) return 1;
  }
  return 0;
}


/*
** Could coroutine 'co' be a member of a doomed set: is it queued for a
** lock the search follows (async_mutex.debug: doomed_set collects only
** the queues of locks someone holds; a Redis lock's or a task's internal
** one, or a sleep's, has no holder)?  Allocates nothing.
*/
static int may_wait (lua_State *L, const lua_State *co) {
  const Waiter *w;
  if (co == L || !lua_checkstack(L, 2)) return co != L;
  w = am_waiter_of(L, (lua_State *)co);
  return w != NULL && w->r.state == S_QUEUED && !w->r.lock->internal
         && !(w->r.erridx == 0 && w->r.timed);
}


/*
** Is the running coroutine's request at 'rq' clear of any deadlock without
** a search?  Then no set it closes can be doomed (async_mutex.debug,
** doomed_set), and most requests that wait are so decided here, in C.  A
** leased hold ends by itself: it keeps nobody waiting for ever.
**  - Nobody waits for it (no waiter of a lock it holds, none queued behind
**    its request: 'behind'), and its own holds leave room for it.
**  - Only the waiters its request goes ahead of (by priority) would wait
**    for it, and no holder of the lock waits for anything: those waiters
**    cannot keep it waiting, since whatever is ahead of it on the lock
**    waits only for holders outside, as it does (a high-priority request
**    behind a holder that runs, ahead of a long queue: the search copied
**    the whole queue each time, spec 147).
*/
static int alone_and_fits (lua_State *L, DebugRecords *d,
                           const Request *rq, int behind) {
  const PtrEntry *h = am_ph_find(&d->cos, L);
  lua_Integer n = 0, w = 0, writes = 0;
  int s;
  for (s = h != NULL ? h->slot : -1; s >= 0; s = d->slots[s].next_co) {
    const Releaser *r = d->slots[s].r;
    if (r->lease || !am_releaser_live(r)) continue;
    if (r->lock->queue.count + r->lock->nunlock > 0) return 0;
    if (r->lock == rq->lock) {
      n++;
      w += r->weight;
      if (r->weight == AM_RW_WRITE) writes++;
    }
  }
  if (behind) {     /* (so it holds none of the lock: it has waiters) */
    for (s = rq->lock->dbg; s >= 0; s = d->slots[s].next_lock) {
      const Record *rec = &d->slots[s];
      if (!rec->r->lease && am_releaser_live(rec->r)
          && may_wait(L, rec->holder))
        return 0;
    }
    return 1;
  }
  return am_dbg_fits_outside(d, rq->lock, rq->weight, n, w, writes);
}


/*
** Before a request (acquire or waitForUnlock of the lock at
** rq->lockidx) decides anything: the hook records lockdep's edges and
** looks for the deadlock the request would close if it waited.  It may
** raise E_DEADLOCK; then a keyed lock made for this request leaves its
** set again, and the error propagates to the requester: nothing queued.
** sleep()'s private semaphore (no error value) is not a lock to debug,
** nor is a lock marked internal (core.dbg_internal), nor a
** ReentrantMutex's re-entry by its holder (its kind's reenters): it is granted at
** once, past the queue, so it never waits and orders nothing (lockdep
** recorded the lock once, when it was first taken).  Nor a request nobody
** would wait for: its coroutine holds nothing, and no waiter would be
** queued behind it.  (One that holds nothing but goes ahead of a waiter,
** by priority, can close a cycle: a Semaphore waiter it needs the unit
** of, queued behind it; spec 141.)  A request that would wait is searched
** in Lua only when C could not clear it (alone_and_fits); a waitForUnlock
** so cleared needs no Lua (it records no edge).
*/
void am_dbg_request (lua_State *L, const Request *rq) {
  Lock *lk = rq->lock;
  DebugRecords *d = lk->st->dbg_recs;
  int behind, search;
  if (d == NULL) return;                /* off for this state */
  if (rq->erridx == 0 && rq->wait == AM_TIMEOUT) return;     /* sleep */
  if (lk->internal) return;
  if (rq->wait == AM_TRY) return;       /* never waits: never deadlocks */
  if (lk->kind->reentrant && lk->owner == L && lk->value <= 0) return;
  behind = served_after(lk, rq);
  if (!behind && !am_dbg_holds_any(L, lk->st))   /* nobody would wait for it */
    return;
  search = !am_can_lock_now(lk, rq->weight, &rq->priority)
           && !alone_and_fits(L, d, rq, behind);
  if ((rq->kind == W_UNLOCK && !search)       /* no lockdep edge either */
      || !lua_checkstack(L, 8) || !am_dbg_push_hook(L, lk->st, H_REQUEST))
    return;
  lua_pushvalue(L, rq->lockidx);
  lua_pushinteger(L, rq->weight);
  lua_pushboolean(L, rq->kind == W_UNLOCK);
  lua_pushboolean(L, search);
  lua_pushinteger(L, rq->wait);
  am_dbg_push_key(L, &rq->priority);
  lua_pushboolean(L, behind);
  lua_pushlightuserdata(L, lk);               /* as records name it */
  if (lua_pcall(L, 8, 0, 0) != LUA_OK) {
    am_settle(L, rq->lock);
    lua_error(L);
  }
}

/* }====================================================== */
