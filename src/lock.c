/*
** lock.c: the queue rules of a semaphore (SEMANTICS.md 1.3-1.9, 2.5)
** Every state change happens here, synchronously: grants, rejections and
** removals.  Resuming the affected coroutines is left to the scheduler.
** Nothing here calls Lua code (see am_sync in sched.c): the entry points
** call am_sync once the change is complete.
*/

#define LUA_LIB

#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


/*
** Immediate-grant rule: no queued acquirer has a priority >= ours, and
** the value covers the weight.  Also "could lock now" for waitForUnlock.
*/
int am_can_lock_now (Lock *lk, lua_Integer weight, const Key *priority) {
  return (lk->queue.n == 0
          || am_key_above(priority, am_queue_firstkey(&lk->queue)))
         && weight <= lk->value;
}


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
** Resolves the waitForUnlock waiters that could lock now (1.6 with P6):
** those whose weight the value covers and, while acquirers are queued,
** whose priority is strictly above the head's.  Heaviest first, then in
** queue order.  Cost depends on the registered weights, not the value.
*/
static void drain_unlock (lua_State *L, Lock *lk) {
  size_t i = lk->nweights;
  int emptied = 0;
  while (lk->nunlock > 0 && i-- > 0) {
    Queue *q = &lk->unlock[i].queue;
    Waiter *w;
    if (lk->unlock[i].weight > lk->value) continue;
    while ((w = am_queue_first(q)) != NULL
           && (lk->queue.n == 0
               || am_key_above(am_queue_firstkey(q),
                               am_queue_firstkey(&lk->queue)))) {
      am_queue_remove(q, w);
      lk->nunlock--;
      am_ready(L, lk->st, w, O_GRANTED);
    }
    if (q->count == 0) emptied = 1;
  }
  if (emptied) compact_weights(lk);
}

/* }====================================================== */


/*
** Puts a new, anchored waiter in its queue; once linked, it is QUEUED.
** Out of memory, it raises with nothing linked, after giving back its
** anchor (a dead coroutine must not stay anchored) and letting a keyed
** lock made for it leave its set.
*/
void am_enqueue (lua_State *L, Lock *lk, Waiter *w, const Key *priority) {
  Queue *q = (w->kind == W_ACQUIRE) ? &lk->queue
                                    : weight_queue(lk, w->weight);
  if (q == NULL || !am_queue_push(q, w, priority)) {
    if (q != NULL && q->count == 0 && w->kind == W_UNLOCK)
      compact_weights(lk);
    am_unanchor(L, w);
    am_settle(L, lk);
    luaL_error(L, "not enough memory");
  }
  if (w->kind == W_UNLOCK) lk->nunlock++;
  w->state = S_QUEUED;
}


/* Takes a QUEUED waiter out of its lock's queue (not the timer queue). */
void am_dequeue (lua_State *L, Lock *lk, Waiter *w) {
  (void)L;
  if (w->kind == W_ACQUIRE)
    am_queue_remove(&lk->queue, w);
  else {
    size_t i = find_weight(lk, w->weight);
    am_queue_remove(&lk->unlock[i].queue, w);
    lk->nunlock--;
    if (lk->unlock[i].queue.count == 0) compact_weights(lk);
  }
}


/*
** Takes 'weight' for a grant; returns what the grant hands out: the value
** before the decrement, or for a mutex the grant's generation, which its
** releaser checks so that it never ends a later holder's grant.
*/
lua_Integer am_take (Lock *lk, lua_Integer weight) {
  lua_Integer value = lk->value;
  lk->value -= weight;                  /* 0 < weight <= value: no overflow */
  /* 'held' saturates: with setValue the grants out may sum beyond
     maxinteger (it only has to stay above 0 while any is out) */
  lk->held = weight > LUA_MAXINTEGER - lk->held ? LUA_MAXINTEGER
                                                : lk->held + weight;
  return lk->is_mutex ? ++lk->gen : value;
}


/* Grants the lock to a waiter taken from the queue (1.3 step 3). */
static void grant (lua_State *L, Lock *lk, Waiter *w) {
  lua_Integer value = am_take(lk, w->weight);
  am_timer_remove(L, lk->st, w);        /* frees 'u' for the value */
  w->u.value = value;
  am_ready(L, lk->st, w, O_GRANTED);
}


/*
** After the value grew or the queue shrank (1.5): grant strictly from the
** head while the value covers it, resolving unlock waiters before each.
*/
void am_dispatch (lua_State *L, Lock *lk) {
  Waiter *head;
  drain_unlock(L, lk);
  while ((head = am_queue_first(&lk->queue)) != NULL
         && head->weight <= lk->value) {
    am_queue_remove(&lk->queue, head);
    grant(L, lk, head);
    drain_unlock(L, lk);
  }
  am_settle(L, lk);
}


/*
** Gives 'weight' back.  'held' counts grants out, for keyed locks to know
** when a key is idle; an unscoped release counts as giving back a grant.
*/
void am_release (lua_State *L, Lock *lk, lua_Integer weight) {
  if (lk->value > 0 && weight > LUA_MAXINTEGER - lk->value)
    luaL_error(L, "semaphore value overflow");
  lk->value += weight;
  lk->held = lk->held > weight ? lk->held - weight : 0;
  am_dispatch(L, lk);
}


/*
** Rejects every queued acquirer, in queue order (1.9); holders keep the
** lock.  P4: unlock waiters are then re-evaluated against the empty queue.
*/
void am_cancel (lua_State *L, Lock *lk) {
  Waiter *w;
  while ((w = am_queue_first(&lk->queue)) != NULL) {
    am_queue_remove(&lk->queue, w);
    am_ready(L, lk->st, w, O_CANCELED);
  }
  drain_unlock(L, lk);
  am_settle(L, lk);
}


/*
** P1: a waiter whose deadline passed leaves the queue at once, and the
** queue is re-dispatched, since its removal may unblock others.
*/
void am_expire (lua_State *L, Waiter *w) {
  Lock *lk = w->lock;
  am_dequeue(L, lk, w);
  am_ready(L, lk->st, w, O_TIMEOUT);
  if (w->kind == W_ACQUIRE) am_dispatch(L, lk);
  else am_settle(L, lk);
}


/*
** The waiting coroutine was closed (or cannot be resumed): it never gets
** the lock.  A queued request leaves the queue; a grant not yet delivered
** is given back.  Either way the lock passes on.
*/
void am_abandon (lua_State *L, Waiter *w) {
  Lock *lk = w->lock;
  switch (w->state) {
    case S_QUEUED:
      am_timer_remove(L, lk->st, w);
      am_dequeue(L, lk, w);
      w->state = S_DONE;
      am_unanchor(L, w);
      if (w->kind == W_ACQUIRE) am_dispatch(L, lk);
      else am_settle(L, lk);
      break;
    case S_READY:
      am_list_unlink(w, 0);            /* from the ready list */
      w->state = S_DONE;
      am_unanchor(L, w);
      if (w->kind == W_ACQUIRE && w->outcome == O_GRANTED) {
        /* give the grant back, as its releaser would (a mutex only if
           this grant still holds it); saturating: must not raise */
        if (lk->is_mutex) {
          if (lk->value <= 0 && lk->gen == w->u.value) lk->value++;
        }
        else if (lk->value > 0 && w->weight > LUA_MAXINTEGER - lk->value)
          lk->value = LUA_MAXINTEGER;
        else
          lk->value += w->weight;
        lk->held = lk->held > w->weight ? lk->held - w->weight : 0;
        am_dispatch(L, lk);
      }
      break;
    default:
      break;
  }
}


/*
** Frees the lock's memory.  NOTE: a lock with queued waiters is collected
** only by lua_close (each waiter's coroutine holds the lock on its stack
** and is anchored).  Its waiters then leave every queue first, as if
** abandoned, so that a finalizer run after this one (closing their
** coroutine, releasing the lock) finds an empty lock, not freed memory.
*/
static void detach (Lock *lk, Queue *q, Waiter *w) {
  am_queue_remove(q, w);
  am_timer_remove(NULL, lk->st, w);
  w->state = S_DONE;
  am_unanchor(NULL, w);
}


void am_lock_free (Lock *lk) {
  Waiter *w;
  size_t i;
  while ((w = am_queue_first(&lk->queue)) != NULL)
    detach(lk, &lk->queue, w);
  for (i = 0; i < lk->nweights; i++)
    while ((w = am_queue_first(&lk->unlock[i].queue)) != NULL)
      detach(lk, &lk->unlock[i].queue, w);
  lk->nunlock = 0;
  lk->freed = 1;
  am_queue_free(&lk->queue);
  for (i = 0; i < lk->nweights; i++)
    am_queue_free(&lk->unlock[i].queue);
  free(lk->unlock);
  lk->unlock = NULL;
  lk->nweights = lk->capweights = 0;
}


/*
** Called after anything that may leave a keyed lock idle (no grant out,
** no waiter, the value back to the initial one): an idle lock leaves its
** keyed set at once, so the set holds only the keys in use.  A later
** request for its key gets a new lock; the old one can only be reached by
** its spent releasers.
*/
void am_settle (lua_State *L, Lock *lk) {
  if (lk->keyed == NULL || lk->selfref == LUA_NOREF || lk->held > 0
      || lk->value != lk->keyed->value || lk->queue.count > 0
      || lk->nunlock > 0)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lk->st->keyedlocks);  /* (keyed.c) */
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
