/*
** debug.c: the C side of debug mode (docs/debug.md)
** The owner records are kept here, in C (the hot part of debug mode: one
** is made at every grant and ended at every release).  The rest is the
** Lua module async_mutex.debug's: the wait-for graph, lockdep's class
** graph, the reports.  The core tells it what happens, through hooks (Lua
** functions in a table that exists only while debug mode is on, registry
** reference 'State.dbg'), called only when they have work, and lets it
** read the records and the few fields of a lock, a releaser and a waiter
** it needs (core.dbg_*).  Nothing is added to a Waiter; to a Lock, one int
** in padding (Lock.dbg).
**
** Off, the cost is one test of 'am_debug_on' (a global: how many states
** have debug mode on) at each hook site; the hook functions below are
** never entered.  On, each hook runs after the change it reports is
** committed (a grant delivered, a waiter queued, a releaser given back),
** or before anything is decided (a request): the rule "decide, then call
** out" of docs/internals.md holds, since a hook runs Lua code.
*/

#define LUA_LIB
#define _POSIX_C_SOURCE 199309L     /* clock_gettime */

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"
#include "error_text.h"


int am_debug_on = 0;


/*
** The time a grant is recorded at, in ms: the clock of the loop's time
** (libuv reads CLOCK_MONOTONIC for uv.now(), in ms), read now rather than
** cached at the loop's last turn, and without a call into luv.
*/
static lua_Number clock_ms (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (lua_Number)ts.tv_sec * 1e3 + (lua_Number)ts.tv_nsec / 1e6;
}


/*
** The hook table (async_mutex.debug: hook_table): the Lua hooks, then
** flags.
*/
enum { H_REQUEST = 1, H_GRANTED, H_RELEASED, H_CREATED,
       F_TRACEBACK,           /* true: a traceback per grant */
       F_LUA };               /* true: call the granted and released hooks */

/* The flags of the hook table, kept in State.dbg_flags: a grant and a
   release read them without a table access. */
#define DF_TRACEBACK  1
#define DF_LUA        2


/*
** Owner records (docs/debug.md, Owner records) are C structs, the slots
** of one array.  The Lua values a record keeps are anchored in one Lua
** table, 'anchors' (registry reference 'aref'), at A_N * slot + A_*: its
** releaser (which keeps its lock, user value 1), its holder, the function
** that made the request (for its site) and, with the option, a traceback.
** Each record is in two doubly linked chains: its lock's (from Lock.dbg,
** newest first) and its holder's (from the hash 'cos': coroutine ->
** newest record); the hash 'rels' finds it from its releaser (a release
** in any order costs the same: walking the lock's chain made releasing n
** holds of one lock oldest first cost n^2/2 steps).
**
** So a grant and a release change C fields and overwrite slots of the
** array of 'anchors' that exist already: they allocate nothing Lua's
** collector sees (no garbage, no collector step, no memory error to
** protect against), only 'slots', 'cos' and 'rels' may grow (malloc).  Growing
** 'anchors' (doubling, when every slot is used) is the one allocation, and
** is protected.  Lua sees a record as a table made when it reads
** (core.dbg_records), with the fields V_* (async_mutex.debug reads them
** by number).
*/
enum { A_RELEASER = 1, A_HOLDER, A_FN, A_WHERE, A_N = 4 };

enum { V_LOCK = 1, V_REL, V_HOLDER, V_SINCE, V_FN, V_LINE, V_WEIGHT,
       V_WHERE, V_LEASED, V_LOCKID, V_CANON = 13, V_WARNED, V_NFIELDS = 14 };

#define FIRST_SLOTS  16

typedef struct Record {
  Releaser *r;                /* anchored; NULL: a free slot */
  const lua_State *holder;    /* anchored */
  lua_Number since;           /* clock_ms() at the grant */
  lua_Integer serial;         /* DebugRecords.epoch when it was made */
  int line;                   /* of the request in the user's function */
  int next_lock, prev_lock;   /* its lock's chain, -1 at an end; a free
                                 slot: 'next_lock' is the next free one */
  int next_co, prev_co;       /* its holder's chain */
  unsigned int canon : 1;     /* a key taken by acquireAll (on_granted) */
  unsigned int warned : 1;    /* reported as a long hold */
  unsigned int has_fn : 1;    /* anchors A_FN and A_WHERE set (else nil) */
  unsigned int has_where : 1;
} Record;

/* An entry of a pointer hash: a coroutine and its newest record, or a
   releaser and its record. */
typedef struct PtrEntry {
  const void *key;            /* NULL: an empty entry */
  int slot;
  int n;                      /* 'cos': how many records the holder has */
} PtrEntry;

typedef struct PtrHash {      /* open addressing, linear probing */
  PtrEntry *e;
  int cap, n;                 /* 'cap' a power of 2, at least 2 * 'n' */
} PtrHash;

struct DebugRecords {
  Record *slots;
  int cap, n, free;           /* slots, records, first free slot or -1 */
  lua_Integer epoch;          /* records made or ended so far */
  /* recorded_weight's last answer, and what it depended on */
  const Lock *rw_lock;
  lua_Integer rw_epoch, rw_held, rw_value, rw_weight;
  int aref;                   /* registry reference of 'anchors' */
  int rref;                   /* of 'returned' (weak keys): releasers whose
                                 records a Semaphore's unscoped release
                                 ended (am_dbg_returned) */
  PtrHash cos;                /* holder -> its newest record */
  PtrHash rels;               /* releaser -> its record */
  PtrHash credit;             /* Semaphore -> weight its unscoped releases
                                 gave back beyond the records they ended
                                 (am_dbg_returned), in 'slot' */
};


/* {====================================================== pointer hashes */

static unsigned ptr_hash (const void *p) {
  uintptr_t h = (uintptr_t)p >> 4;
  return (unsigned)((h ^ (h >> 15)) * 2654435761u);
}


static PtrEntry *ph_find (const PtrHash *t, const void *key) {
  unsigned mask = (unsigned)t->cap - 1, i;
  if (t->cap == 0) return NULL;
  for (i = ptr_hash(key) & mask; t->e[i].key != NULL; i = (i + 1) & mask)
    if (t->e[i].key == key) return &t->e[i];
  return NULL;
}


/* Adds 'key' (not in 't'; room reserved); returns its entry. */
static PtrEntry *ph_put (PtrHash *t, const void *key, int slot) {
  unsigned mask = (unsigned)t->cap - 1, i;
  for (i = ptr_hash(key) & mask; t->e[i].key != NULL; i = (i + 1) & mask) ;
  t->e[i].key = key;
  t->e[i].slot = slot;
  t->e[i].n = 0;
  t->n++;
  return &t->e[i];
}


/* Room for one more entry (malloc only); returns 0 without memory. */
static int ph_reserve (PtrHash *t) {
  PtrHash nt;
  int i;
  if ((t->n + 1) * 2 <= t->cap) return 1;
  nt.cap = t->cap ? t->cap * 2 : FIRST_SLOTS;
  nt.n = 0;
  nt.e = (PtrEntry *)calloc((size_t)nt.cap, sizeof(PtrEntry));
  if (nt.e == NULL) return 0;
  for (i = 0; i < t->cap; i++)
    if (t->e[i].key != NULL)
      ph_put(&nt, t->e[i].key, t->e[i].slot)->n = t->e[i].n;
  free(t->e);
  *t = nt;
  return 1;
}


/* Removes entry 'e', moving back the entries of its probe run after it. */
static void ph_remove (PtrHash *t, PtrEntry *e) {
  unsigned mask = (unsigned)t->cap - 1;
  unsigned i = (unsigned)(e - t->e), j = i, k;
  for (;;) {
    j = (j + 1) & mask;
    if (t->e[j].key == NULL) break;
    k = ptr_hash(t->e[j].key) & mask;   /* where entry j would like to be */
    if (((j - k) & mask) >= ((j - i) & mask)) {   /* at i or before it */
      t->e[i] = t->e[j];
      i = j;
    }
  }
  t->e[i].key = NULL;
  t->n--;
}

/* }====================================================== */


/* The slot of the record of releaser 'r', or -1. */
static int find_record (const DebugRecords *d, const Releaser *r) {
  const PtrEntry *e = ph_find(&d->rels, r);
  return e != NULL ? e->slot : -1;
}


/*
** Ends the record at 'slot' ('e': its entry in 'rels', or NULL): out of
** its chains and hashes, its anchors cleared (in 'anchors', at 'a'), the
** slot free.  Allocates nothing.
*/
static void end_record (lua_State *L, DebugRecords *d, int slot, int a,
                        PtrEntry *e) {
  Record *rec = &d->slots[slot];
  PtrEntry *h;
  if (rec->prev_lock >= 0) d->slots[rec->prev_lock].next_lock = rec->next_lock;
  else rec->r->lock->dbg = rec->next_lock;
  if (rec->next_lock >= 0) d->slots[rec->next_lock].prev_lock = rec->prev_lock;
  h = ph_find(&d->cos, rec->holder);
  assert(h != NULL && h->n > 0);
  if (rec->prev_co >= 0) d->slots[rec->prev_co].next_co = rec->next_co;
  else {
    assert(h->slot == slot);
    h->slot = rec->next_co;
  }
  if (--h->n == 0) ph_remove(&d->cos, h);
  if (rec->next_co >= 0) d->slots[rec->next_co].prev_co = rec->prev_co;
  if (e == NULL) e = ph_find(&d->rels, rec->r);
  assert(e != NULL && e->slot == slot);
  ph_remove(&d->rels, e);
  lua_pushnil(L);                     /* what it anchored may be collected */
  lua_rawseti(L, a, A_N * slot + A_RELEASER);
  lua_pushnil(L);
  lua_rawseti(L, a, A_N * slot + A_HOLDER);
  if (rec->has_fn) {
    lua_pushnil(L);
    lua_rawseti(L, a, A_N * slot + A_FN);
  }
  if (rec->has_where) {
    lua_pushnil(L);
    lua_rawseti(L, a, A_N * slot + A_WHERE);
  }
  rec->r = NULL;
  rec->next_lock = d->free;
  d->free = slot;
  d->n--;
  d->epoch++;
}


/* Ends the records of 'lk' whose grant an unscoped release ended. */
static void prune_lock (lua_State *L, DebugRecords *d, Lock *lk, int a) {
  int s = lk->dbg;
  while (s >= 0) {
    int next = d->slots[s].next_lock;
    if (!am_releaser_live(d->slots[s].r)) end_record(L, d, s, a, NULL);
    s = next;
  }
}


/*
** Doubles the slots when none is free (protected: 'anchors' is made
** anew, a Lua allocation).  A collector step there may run finalizers
** that grant or release, or switch debug mode: what they did stands.
*/
static int grow_records (lua_State *L) {
  State *st = (State *)lua_touserdata(L, 1);
  DebugRecords *d = st->dbg_recs;
  Record *slots;
  int newcap, i;
  if (d == NULL || d->free >= 0) return 0;
  if (d->cap > INT_MAX / (4 * A_N)) return luaL_error(L, "too many holds");
  newcap = d->cap * 2;
  lua_createtable(L, A_N * newcap, 0);      /* may run finalizers */
  d = st->dbg_recs;
  if (d == NULL || d->free >= 0 || d->cap >= newcap) return 0;
  slots = (Record *)realloc(d->slots, (size_t)newcap * sizeof(Record));
  if (slots == NULL) return luaL_error(L, "not enough memory");
  d->slots = slots;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  for (i = 1; i <= A_N * d->cap; i++) {     /* within both arrays */
    lua_rawgeti(L, -1, i);
    lua_rawseti(L, -3, i);
  }
  lua_pop(L, 1);
  lua_rawseti(L, LUA_REGISTRYINDEX, d->aref);   /* replaces the old one */
  for (i = newcap - 1; i >= d->cap; i--) {
    slots[i].r = NULL;
    slots[i].next_lock = d->free;
    d->free = i;
  }
  d->cap = newcap;
  return 0;
}


/* A state's records, none yet (debug mode switched on). */
static DebugRecords *new_records (lua_State *L) {
  DebugRecords *d = (DebugRecords *)calloc(1, sizeof(DebugRecords));
  int i;
  if (d == NULL || (d->slots = (Record *)malloc(FIRST_SLOTS
                                                * sizeof(Record))) == NULL) {
    free(d);
    luaL_error(L, "not enough memory");
  }
  d->cap = FIRST_SLOTS;
  d->free = -1;
  for (i = FIRST_SLOTS - 1; i >= 0; i--) {
    d->slots[i].r = NULL;
    d->slots[i].next_lock = d->free;
    d->free = i;
  }
  d->aref = d->rref = LUA_NOREF;
  return d;
}


/*
** Debug mode off or the state closing: every record goes (their locks'
** chains emptied; the locks are alive still, anchored by the releasers,
** or collected only by lua_close, which frees no memory before every
** finalizer has run).
*/
void am_dbg_close (lua_State *L, State *st) {
  DebugRecords *d = st->dbg_recs;
  int s;
  if (d == NULL) return;
  st->dbg_recs = NULL;
  for (s = 0; s < d->cap; s++)
    if (d->slots[s].r != NULL) d->slots[s].r->lock->dbg = -1;
  if (!st->closed) {
    luaL_unref(L, LUA_REGISTRYINDEX, d->aref);
    luaL_unref(L, LUA_REGISTRYINDEX, d->rref);
  }
  free(d->slots);
  free(d->cos.e);
  free(d->rels.e);
  free(d->credit.e);
  free(d);
}


/*
** Pushes hook 'h' of 'st' and returns 1, or returns 0 (pushing nothing)
** when debug mode is off for this state.
*/
static int push_hook (lua_State *L, State *st, int h) {
  if (st->dbg == LUA_NOREF || st->closed) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dbg);
  lua_rawgeti(L, -1, h);
  lua_remove(L, -2);
  return 1;
}


/*
** Calls the hook pushed with its 'nargs' arguments, protected: a hook
** that fails must not take a grant or a release down with it (the
** change it reports is done).  Its error goes to stderr.  Returns
** whether it ran, its 'nres' results pushed.
*/
static int call_hook (lua_State *L, int nargs, int nres) {
  if (lua_pcall(L, nargs, nres, 0) != LUA_OK) {
    fprintf(stderr, "async_mutex.debug: error in a hook: %s\n",
            lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?");
    fflush(stderr);
    lua_pop(L, 1);
    return 0;
  }
  return 1;
}


/*
** Does the running coroutine hold anything, as recorded?  One that holds
** nothing records no lockdep edge, and only a waiter queued behind its
** request can wait for it (am_dbg_request).
*/
static int holds_any (lua_State *L, State *st) {
  return st->dbg_recs != NULL && ph_find(&st->dbg_recs->cos, L) != NULL;
}


/* A queue key as the Lua number it was (queue.c: canonical keys). */
static void push_key (lua_State *L, const Key *k) {
  if (k->flt) lua_pushnumber(L, k->n);
  else lua_pushinteger(L, k->i);
}


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
static int fits_outside (DebugRecords *d, const Lock *lk,
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
  const PtrEntry *h = ph_find(&d->cos, L);
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
  return fits_outside(d, rq->lock, rq->weight, n, w, writes);
}


/*
** Before a request (acquire or waitForUnlock of the lock at
** rq->lockidx) decides anything: the hook records lockdep's edges and
** looks for the deadlock the request would close if it waited.  It may
** raise E_DEADLOCK; then a keyed lock made for this request leaves its
** set again, and the error propagates to the requester: nothing queued.
** sleep()'s private semaphore (no error value) is not a lock to debug,
** nor is a lock marked internal (core.dbg_internal), nor a
** ReentrantMutex's re-entry by its holder (am_reenters): it is granted at
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
  if (!behind && !holds_any(L, lk->st))   /* nobody would wait for it */
    return;
  search = !am_can_lock_now(lk, rq->weight, &rq->priority)
           && !alone_and_fits(L, d, rq, behind);
  if ((rq->kind == W_UNLOCK && !search)       /* no lockdep edge either */
      || !lua_checkstack(L, 8) || !push_hook(L, lk->st, H_REQUEST))
    return;
  lua_pushvalue(L, rq->lockidx);
  lua_pushinteger(L, rq->weight);
  lua_pushboolean(L, rq->kind == W_UNLOCK);
  lua_pushboolean(L, search);
  lua_pushinteger(L, rq->wait);
  push_key(L, &rq->priority);
  lua_pushboolean(L, behind);
  lua_pushlightuserdata(L, lk);               /* as records name it */
  if (lua_pcall(L, 8, 0, 0) != LUA_OK) {
    am_settle(L, rq->lock);
    lua_error(L);
  }
}

/* }====================================================== */


/*
** The level of the user's frame that made the request: the first Lua
** frame above the request's C function that is not the Lua layer's
** (runExclusive and the like); 0 if none.
*/
static int user_level (lua_State *L, State *st, lua_Debug *ar) {
  int level;
  for (level = 1; lua_getstack(L, level, ar); level++) {
    lua_getinfo(L, "S", ar);
    if (ar->what[0] != 'C' && !am_in_layer(L, st, ar->source))
      return level;
  }
  return 0;
}


/* The traceback of the user's frame (protected: it allocates). */
static int where_traceback (lua_State *L) {
  State *st = (State *)lua_touserdata(L, 1);
  lua_Debug ar;
  int level = user_level(L, st, &ar);
  if (level == 0) return 0;
  luaL_traceback(L, L, NULL, level);
  return 1;
}


/*
** Does a grant of releaser 'r' take credit an unscoped release of its
** Semaphore left (am_dbg_returned)?  Then it gets no record.
*/
static int take_credit (DebugRecords *d, const Releaser *r) {
  PtrEntry *e = ph_find(&d->credit, r->lock);
  if (e == NULL) return 0;
  if (e->slot > r->weight) e->slot -= (int)r->weight;
  else ph_remove(&d->credit, e);
  return 1;
}


/*
** A grant was delivered to the running coroutine: its releaser is on
** top.  Its owner record is made here, in C, allocating nothing the
** collector sees (above): the releaser and the holder, the loop time,
** the acquire site (its function and line).  Then, only if there is such
** work, the traceback (the option) and the Lua hook (a key's lock: taken
** by acquireAll?; long holds checked: the timer), which allocate and run
** Lua, protected: the record may be gone once they return.
*/
void am_dbg_granted (lua_State *L, State *st) {
  int top = lua_gettop(L);
  Releaser *r = (Releaser *)lua_touserdata(L, top);
  DebugRecords *d = st->dbg_recs;
  Lock *lk;
  Record *rec;
  PtrEntry *h;
  lua_Debug ar;
  int slot, a, level;
  if (r == NULL || d == NULL || st->dbg == LUA_NOREF || st->closed
      || r->lock->internal || !lua_checkstack(L, 8))
    return;
  if (d->free < 0) {                      /* every slot used: double them */
    lua_pushcfunction(L, grow_records);
    lua_pushlightuserdata(L, st);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) lua_pop(L, 1);
    d = st->dbg_recs;
    /* what ran meanwhile may have ended the grant, or debug mode */
    if (d == NULL || d->free < 0 || !am_releaser_live(r)) {
      if (d != NULL && d->free < 0) {
        fputs("async_mutex.debug: no owner record: not enough memory\n",
              stderr);
        fflush(stderr);
      }
      return;
    }
  }
  if (d->credit.n > 0 && take_credit(d, r)) return;
  if (!ph_reserve(&d->cos) || !ph_reserve(&d->rels)) return;
  lk = r->lock;
  slot = d->free;
  rec = &d->slots[slot];
  d->free = rec->next_lock;
  rec->r = r;
  rec->holder = L;
  rec->since = clock_ms();
  rec->line = 0;
  rec->canon = rec->warned = rec->has_fn = rec->has_where = 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  a = lua_gettop(L);
  lua_pushvalue(L, top);
  lua_rawseti(L, a, A_N * slot + A_RELEASER);
  lua_pushthread(L);
  lua_rawseti(L, a, A_N * slot + A_HOLDER);
  level = user_level(L, st, &ar);
  if (level > 0) {
    lua_getinfo(L, "fl", &ar);                /* pushes the function */
    lua_rawseti(L, a, A_N * slot + A_FN);
    rec->has_fn = 1;
    rec->line = ar.currentline;
  }
  rec->prev_lock = -1;                        /* first in its lock's chain */
  rec->next_lock = lk->dbg;
  if (lk->dbg >= 0) d->slots[lk->dbg].prev_lock = slot;
  lk->dbg = slot;
  rec->prev_co = -1;                          /* and in its holder's */
  if ((h = ph_find(&d->cos, L)) != NULL) {
    rec->next_co = h->slot;
    d->slots[h->slot].prev_co = slot;
    h->slot = slot;
  }
  else {
    rec->next_co = -1;
    h = ph_put(&d->cos, L, slot);
  }
  h->n++;
  ph_put(&d->rels, r, slot);
  d->n++;
  rec->serial = ++d->epoch;
  lua_settop(L, top);
  if (st->dbg_flags & DF_TRACEBACK) {
    lua_pushcfunction(L, where_traceback);
    lua_pushlightuserdata(L, st);
    if (call_hook(L, 1, 1) && (d = st->dbg_recs) != NULL
        && (slot = find_record(d, r)) >= 0) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
      lua_insert(L, -2);
      lua_rawseti(L, -2, A_N * slot + A_WHERE);
      d->slots[slot].has_where = 1;
    }
    lua_settop(L, top);
  }
  if ((lk->keyed != NULL || (st->dbg_flags & DF_LUA))
      && push_hook(L, st, H_GRANTED)) {
    lua_pushboolean(L, lk->keyed != NULL);
    if (call_hook(L, 1, 1) && lua_toboolean(L, -1)
        && (d = st->dbg_recs) != NULL && (slot = find_record(d, r)) >= 0)
      d->slots[slot].canon = 1;               /* taken by acquireAll */
    lua_settop(L, top);
  }
}


/* Records were ended: the Lua hook hears when the last one goes (the
   long-hold timer stops). */
static void ended (lua_State *L, State *st) {
  if (st->dbg_recs->n == 0 && (st->dbg_flags & DF_LUA)
      && lua_checkstack(L, 2) && push_hook(L, st, H_RELEASED))
    call_hook(L, 0, 0);
}


/*
** Marks the releasers on the stack above 'base' as returned (in the weak
** table 'returned'), then drops them.  Protected: the table grows.
*/
static int mark_returned (lua_State *L) {
  int i, n = lua_gettop(L);                 /* 1: returned; 2..n */
  for (i = 2; i <= n; i++) {
    lua_pushvalue(L, i);
    lua_pushboolean(L, 1);
    lua_rawset(L, 1);
  }
  return 0;
}


/*
** A Semaphore's unscoped release (semaphore:release(w), keyed:release(key,
** w)) gave back 'weight' that no releaser accounts for.  Used in
** async-mutex's way (acquire, then release() rather than the releaser;
** or as a signal: one coroutine acquires, another releases), the grants
** it gives back have records that no releaser will ever end: they stayed
** holds for ever, one more at each such acquire, and the deadlock search
** counted their units as held by their coroutines (two workers that
** released this way: the one asking again while the other's grant was
** being delivered raised E_DEADLOCK; spec 146).  So the release ends
** records of that weight: the releasing coroutine's own on the lock
** first, one of exactly that weight if there is one, then the oldest;
** what it gives back beyond them is credit, which
** the next grants of the lock take instead of a record (a signal released
** before its waiter's grant is delivered), up to what can still be
** granted.  A record so ended may be a hold whose releaser will yet be
** called (a coroutine that holds two, one given back each way): its
** releaser is marked returned, and when it is called, that call ends
** records of its weight in turn (returned_again).  A hold whose record
** ended is no longer seen: it counts as a holder outside, which can hide
** a deadlock, never report one.
*/
void am_dbg_returned (lua_State *L, State *st, Lock *lk,
                      lua_Integer weight) {
  DebugRecords *d = st->dbg_recs;
  lua_Integer left = weight, room;
  int n, s, a, pass, base = lua_gettop(L);
  PtrEntry *e;
  if (d == NULL || lk->internal || !lua_checkstack(L, 8)) return;
  n = d->n;
  lua_pushcfunction(L, mark_returned);
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->rref);
  if (lk->dbg >= 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
    a = lua_gettop(L);
    prune_lock(L, d, lk, a);        /* (a key's lock that left its set) */
    /* its own, newest first, of the weight given back if there is one
       (async-mutex's way gives back what it took); then any that fit
       within what is left, oldest first; then any (ending too much only
       hides a hold) */
    for (pass = 0; pass < 4 && left > 0 && lk->dbg >= 0; pass++) {
      s = lk->dbg;
      if (pass >= 2)                                  /* from the oldest */
        while (d->slots[s].next_lock >= 0) s = d->slots[s].next_lock;
      while (s >= 0 && left > 0) {
        const Record *rec = &d->slots[s];
        int next = pass >= 2 ? rec->prev_lock : rec->next_lock;
        lua_Integer w = rec->r->weight;
        if (pass == 0 ? rec->holder == L && w == left
            : pass == 1 ? rec->holder == L && w <= left
            : pass == 2 ? w <= left : 1) {
          left -= w;
          if (lua_checkstack(L, 2)) lua_rawgeti(L, a, A_N * s + A_RELEASER);
          end_record(L, d, s, a, NULL);
          if (pass == 0) break;
        }
        s = next;
      }
    }
    lua_remove(L, a);
  }
  /* credit, up to what may still be granted: the value and this release
     (its dispatch may have granted it already) */
  room = (lk->value > 0 ? lk->value : 0);
  room = room > INT_MAX - weight ? INT_MAX : room + weight;
  if (left > 0 && ph_reserve(&d->credit)) {
    if ((e = ph_find(&d->credit, lk)) == NULL) e = ph_put(&d->credit, lk, 0);
    e->slot = (int)(left >= room - e->slot ? room : e->slot + left);
  }
  /* the marks last: they allocate, and what runs then may end records
     or debug mode */
  if (lua_gettop(L) > base + 2 && lua_pcall(L, lua_gettop(L) - base - 1,
                                            0, 0) != LUA_OK)
    lua_pop(L, 1);
  lua_settop(L, base);
  if ((d = st->dbg_recs) != NULL && d->n < n) ended(L, st);
}


/*
** Releaser 'r' (at 'idx') of a Semaphore was given back, and has no
** record: if an unscoped release ended it in place of another's
** (am_dbg_returned), this release ends records of its weight in turn.
*/
static void returned_again (lua_State *L, State *st, int idx,
                            const Releaser *r) {
  idx = lua_absindex(L, idx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dbg_recs->rref);
  lua_pushvalue(L, idx);
  if (lua_rawget(L, -2) == LUA_TNIL) {
    lua_pop(L, 2);
    return;
  }
  lua_pop(L, 1);
  lua_pushvalue(L, idx);
  lua_pushnil(L);
  lua_rawset(L, -3);                      /* (removing allocates nothing) */
  lua_pop(L, 1);
  am_dbg_returned(L, st, r->lock, r->weight);
}


/* The releaser at 'idx' was given back, lost or downgraded: its record
   ends. */
void am_dbg_released (lua_State *L, State *st, int idx) {
  Releaser *r = (Releaser *)lua_touserdata(L, idx);
  DebugRecords *d = st->dbg_recs;
  PtrEntry *e;
  if (r == NULL || d == NULL || !lua_checkstack(L, 4)) return;
  if ((e = ph_find(&d->rels, r)) == NULL) {
    if (r->lock->kind == &am_semaphore_kind) returned_again(L, st, idx, r);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  end_record(L, d, e->slot, lua_gettop(L), e);
  lua_pop(L, 1);
  ended(L, st);
}


/* An unscoped release (lock:release()) of 'lk' gave back a grant: the
   records it ended go. */
void am_dbg_unscoped (lua_State *L, State *st, Lock *lk) {
  DebugRecords *d = st->dbg_recs;
  int n;
  if (d == NULL || lk->dbg < 0 || !lua_checkstack(L, 4)) return;
  n = d->n;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  prune_lock(L, d, lk, lua_gettop(L));
  lua_pop(L, 1);
  if (d->n < n) ended(L, st);
}


/*
** A steal ended every hold of 'lk' (steal.c): their records go (none is
** live any more), and so does the credit of its unscoped releases (it
** was for grants the steal ended).  The stealer's grant is recorded after
** (am_dbg_granted).  Allocates nothing.
*/
void am_dbg_stolen (lua_State *L, State *st, Lock *lk) {
  DebugRecords *d = st->dbg_recs;
  PtrEntry *e;
  if (d == NULL || lk->internal) return;
  if ((e = ph_find(&d->credit, lk)) != NULL) ph_remove(&d->credit, e);
  am_dbg_unscoped(L, st, lk);
}


/* A lock or keyed set was made (on top): its creation site names it.  A
   Semaphore's credit left by a collected one at its address goes. */
void am_dbg_created (lua_State *L, State *st) {
  int top = lua_gettop(L);
  const Lock *lk = am_tolock(L, top);
  PtrEntry *e;
  if (lk != NULL && st->dbg_recs != NULL
      && (e = ph_find(&st->dbg_recs->credit, lk)) != NULL)
    ph_remove(&st->dbg_recs->credit, e);
  if (!lua_checkstack(L, 3) || !push_hook(L, st, H_CREATED)) return;
  lua_pushvalue(L, top);
  call_hook(L, 1, 0);
}


/* {====================================================== core.dbg_* */

/*
** core.debug(hooks | nil): debug mode on (the hook table) or off, for
** this state.  Returns whether it was on.  On again (new options), the
** records stay; off, they go.
*/
int am_core_debug (lua_State *L) {
  State *st = am_getstate(L);
  int was, ref = LUA_NOREF, flags = 0;
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_istable(L, 1), 1,
                   "table or nil");
  if (st->closed) {           /* a finalizer at lua_close: nothing to watch */
    lua_pushboolean(L, 0);    /* (records made now would never be freed) */
    return 1;
  }
  lua_settop(L, 1);
  if (!lua_isnil(L, 1)) {
    if (lua_rawgeti(L, 1, F_TRACEBACK) != LUA_TNIL && lua_toboolean(L, -1))
      flags |= DF_TRACEBACK;
    if (lua_rawgeti(L, 1, F_LUA) != LUA_TNIL && lua_toboolean(L, -1))
      flags |= DF_LUA;
    lua_settop(L, 1);
    /* Allocate first: a finalizer run here may switch debug mode on or
       off (core.debug nested); this call came last, so it is committed
       after them, below, from the fields as they are then. */
    lua_pushvalue(L, 1);
    ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (st->dbg_recs == NULL) {         /* the last allocation: may raise */
      DebugRecords *d;
      lua_createtable(L, A_N * FIRST_SLOTS, 0);     /* anchors */
      lua_createtable(L, 0, 0);                     /* returned */
      lua_createtable(L, 0, 1);
      lua_pushliteral(L, "k");
      lua_setfield(L, -2, "__mode");
      lua_setmetatable(L, -2);
      d = new_records(L);
      d->rref = luaL_ref(L, LUA_REGISTRYINDEX);
      d->aref = luaL_ref(L, LUA_REGISTRYINDEX);
      if (st->dbg_recs == NULL) st->dbg_recs = d;
      else {                            /* a finalizer switched it on */
        luaL_unref(L, LUA_REGISTRYINDEX, d->aref);
        luaL_unref(L, LUA_REGISTRYINDEX, d->rref);
        free(d->slots);
        free(d);
      }
    }
  }
  /* commit: nothing below allocates */
  was = st->dbg != LUA_NOREF;
  if (was) {
    luaL_unref(L, LUA_REGISTRYINDEX, st->dbg);
    am_debug_on--;
  }
  st->dbg = ref;
  st->dbg_flags = flags;
  if (ref == LUA_NOREF) am_dbg_close(L, st);
  else am_debug_on++;
  lua_pushboolean(L, was);
  return 1;
}


/*
** core.dbg_fits(lock, weight, n, w, writes): fits_outside, for the
** search (async_mutex.debug: doomed_set).
*/
static int dbg_fits (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  lua_pushboolean(L, fits_outside(am_getstate(L)->dbg_recs, lk,
                                  luaL_checkinteger(L, 2),
                                  luaL_checkinteger(L, 3),
                                  luaL_checkinteger(L, 4),
                                  luaL_checkinteger(L, 5)));
  return 1;
}


/*
** core.dbg_lock(lock): kind name, value, weight held, queued acquirers,
** waitForUnlock waiters, and for a key's lock its key and keyed set.
*/
static int dbg_lock (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  lua_pushstring(L, lk->kind->name);
  lua_pushinteger(L, lk->value);
  lua_pushinteger(L, lk->held);
  lua_pushinteger(L, (lua_Integer)lk->queue.count);
  lua_pushinteger(L, (lua_Integer)lk->nunlock);
  if (lk->keyed != NULL) {
    lua_getiuservalue(L, 1, 2);
    lua_getiuservalue(L, 1, 3);
    return 7;
  }
  return 5;
}


/* A queued waiter as core.dbg_queue reports it (its coroutine aside). */
typedef struct QueuedView {
  lua_Integer weight;
  Key key;
  int unlock, timed;
} QueuedView;


/* How many buckets the queues of 'lk' have (acquirers', unlock waiters'). */
static size_t count_buckets (const Lock *lk) {
  size_t n = lk->queue.n, i;
  for (i = 0; i < lk->nweights; i++) n += lk->unlock[i].queue.n;
  return n;
}


/*
** Copies the waiters of queue 'q' in queue order into 'out' (from 'n'),
** their coroutines into the table at 't' (its array part, made big
** enough: no allocation), using 'b' for the order of its buckets; returns
** the new count.
*/
static size_t copy_queue (lua_State *L, const Queue *q, Bucket **b,
                          QueuedView *out, size_t n, int t, int unlock) {
  uint32_t i;
  am_queue_ordered(q, b);
  for (i = 0; i < q->n; i++) {
    Waiter *w;
    for (w = am_bucket_next(b[i], NULL); w != NULL;
         w = am_bucket_next(b[i], w)) {
      out[n].weight = w->r.weight;
      out[n].key = b[i]->key;
      out[n].unlock = unlock;
      out[n].timed = w->r.timed;
      am_push_anchored(L, w);
      lua_rawseti(L, t, (lua_Integer)++n);
    }
  }
  return n;
}


/*
** core.dbg_queue(lock): its queued acquirers in queue order (priority
** descending, then arrival: the order the grant rule serves them), then
** its waitForUnlock waiters; each { coroutine, weight, priority, unlock,
** timed } (docs/debug.md, Deadlocks).
** The queues are copied whole, with no allocation in between, into room
** made first: a finalizer run by an allocation may queue, cancel or close
** waiters, and free buckets; walking the queues while making the tables
** read freed buckets, and the room for the buckets made before a finalizer
** added one was overrun (spec 69).
*/
static int dbg_queue (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  QueuedView *v = NULL;
  Bucket **b;
  size_t nw = 0, nb = 0, n, i, j;
  luaL_argexpected(L, lk != NULL, 1, "lock");
  lua_settop(L, 1);
  for (;;) {          /* room, until nothing grew past it meanwhile (it */
    size_t needw = lk->queue.count + lk->nunlock;   /* doubles: a finalizer */
    size_t needb = count_buckets(lk);               /* that queues at every */
    if (v != NULL && needw <= nw && needb <= nb)    /* allocation ends too) */
      break;
    nw = 2 * (needw > nw ? needw : nw) + 8;
    nb = 2 * (needb > nb ? needb : nb) + 8;
    if (nw > (size_t)INT_MAX / 4) return luaL_error(L, "too many waiters");
    lua_settop(L, 1);
    lua_createtable(L, (int)nw, 0);               /* 2: the coroutines */
    v = (QueuedView *)lua_newuserdatauv(L, nw * sizeof(QueuedView)
                                        + nb * sizeof(Bucket *), 0);
  }
  b = (Bucket **)(void *)(v + nw);
  luaL_checkstack(L, 8, NULL);
  n = copy_queue(L, &lk->queue, b, v, 0, 2, 0);   /* no allocation: */
  for (i = 0; i < lk->nweights; i++)              /* the copy */
    n = copy_queue(L, &lk->unlock[i].queue, b, v, n, 2, 1);
  lua_createtable(L, (int)n, 0);                  /* 4: the result */
  for (j = 0; j < n; j++) {
    lua_createtable(L, 5, 0);
    lua_rawgeti(L, 2, (lua_Integer)j + 1);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, v[j].weight);
    lua_rawseti(L, -2, 2);
    push_key(L, &v[j].key);
    lua_rawseti(L, -2, 3);
    lua_pushboolean(L, v[j].unlock);
    lua_rawseti(L, -2, 4);
    lua_pushboolean(L, v[j].timed);
    lua_rawseti(L, -2, 5);
    lua_rawseti(L, 4, (lua_Integer)j + 1);
  }
  return 1;
}


/*
** Pushes the record at 'slot' as a table (V_* fields), if it is still
** there and of 'lk' or 'co' when given; returns whether it did.  The
** table is made first: its allocation may run finalizers.
*/
static int push_view (lua_State *L, State *st, int slot, const Lock *lk,
                      const lua_State *co) {
  DebugRecords *d;
  const Record *rec;
  int v, a;
  lua_createtable(L, V_NFIELDS, 0);
  v = lua_gettop(L);
  d = st->dbg_recs;
  if (d == NULL || slot >= d->cap || (rec = &d->slots[slot])->r == NULL
      || (lk != NULL && rec->r->lock != lk)
      || (co != NULL && rec->holder != co)) {
    lua_pop(L, 1);
    return 0;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  a = v + 1;
  lua_rawgeti(L, a, A_N * slot + A_RELEASER);
  lua_getiuservalue(L, -1, 1);                /* its lock */
  lua_rawseti(L, v, V_LOCK);
  lua_rawseti(L, v, V_REL);
  lua_rawgeti(L, a, A_N * slot + A_HOLDER);
  lua_rawseti(L, v, V_HOLDER);
  lua_pushnumber(L, rec->since);
  lua_rawseti(L, v, V_SINCE);
  lua_rawgeti(L, a, A_N * slot + A_FN);
  lua_rawseti(L, v, V_FN);
  lua_pushinteger(L, rec->line);
  lua_rawseti(L, v, V_LINE);
  lua_pushinteger(L, rec->r->weight);
  lua_rawseti(L, v, V_WEIGHT);
  lua_rawgeti(L, a, A_N * slot + A_WHERE);
  lua_rawseti(L, v, V_WHERE);
  lua_pushboolean(L, rec->r->lease);
  lua_rawseti(L, v, V_LEASED);
  lua_pushlightuserdata(L, rec->r->lock);     /* (allocates nothing) */
  lua_rawseti(L, v, V_LOCKID);
  lua_pushboolean(L, rec->canon);
  lua_rawseti(L, v, V_CANON);
  lua_pushboolean(L, rec->warned);
  lua_rawseti(L, v, V_WARNED);
  lua_pop(L, 1);                              /* anchors */
  return 1;
}


/* The next record after 'slot' (-1: the first) of the selection. */
static int next_selected (const DebugRecords *d, int slot, const Lock *lk,
                          const lua_State *co) {
  if (lk != NULL) return slot < 0 ? lk->dbg : d->slots[slot].next_lock;
  if (co != NULL) {
    const PtrEntry *h;
    if (slot >= 0) return d->slots[slot].next_co;
    h = ph_find(&d->cos, co);
    return h != NULL ? h->slot : -1;
  }
  for (slot++; slot < d->cap; slot++)
    if (d->slots[slot].r != NULL) return slot;
  return -1;
}


/*
** core.dbg_records([lock | coroutine [, limit]]): the records in place
** (all, of a lock, or of a holder, newest first per lock or holder), as
** tables with the fields V_*; those whose grant an unscoped release ended
** go first.  With 'limit', the newest 'limit' at most.
*/
static int dbg_records (lua_State *L) {
  State *st = am_getstate(L);
  DebugRecords *d = st->dbg_recs;
  const Lock *lk = NULL;
  const lua_State *co = NULL;
  int *list;
  int n = 0, m = 0, s, i, before;
  lua_Integer limit = luaL_optinteger(L, 2, INT_MAX);
  if (!lua_isnoneornil(L, 1)) {
    lk = am_tolock(L, 1);
    if (lk == NULL) co = lua_tothread(L, 1);
    luaL_argexpected(L, lk != NULL || co != NULL, 1, "lock or coroutine");
  }
  lua_settop(L, 1);
  if (d == NULL || (lk != NULL && lk->dbg < 0)) {
    lua_createtable(L, 0, 0);
    return 1;
  }
  before = d->n;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);       /* ends the dead ones */
  for (s = next_selected(d, -1, lk, co); s >= 0 && n < limit; ) {
    int next = next_selected(d, s, lk, co);
    if (!am_releaser_live(d->slots[s].r)) end_record(L, d, s, 2, NULL);
    else n++;
    s = next;
  }
  lua_settop(L, 1);
  if (d->n < before) ended(L, st);
  /* The slots first (what runs at an allocation cannot upset the walk),
     then the tables.  A finalizer run by the list's allocation may make
     records (in slots the walk passes first): the list is made again
     until it has room for every record selected after it was made. */
  for (;;) {                           /* (doubling, as dbg_queue) */
    list = (int *)lua_newuserdatauv(L, (size_t)n * sizeof(int) + 1, 0);
    m = 0;
    if ((d = st->dbg_recs) != NULL)
      for (s = next_selected(d, -1, lk, co); s >= 0 && m < limit;
           s = next_selected(d, s, lk, co))
        m++;
    if (m <= n) break;
    lua_pop(L, 1);
    if (m > INT_MAX / 4) return luaL_error(L, "too many holds");
    n = 2 * m + 8;
  }
  m = 0;
  if (d != NULL)
    for (s = next_selected(d, -1, lk, co); s >= 0 && m < limit;
         s = next_selected(d, s, lk, co))
      list[m++] = s;
  lua_createtable(L, m, 0);
  for (i = 0, n = 0; i < m; i++)
    if (push_view(L, st, list[i], lk, co)) lua_rawseti(L, 3, ++n);
  return 1;
}


/*
** core.dbg_held_count(co [, serial]): how many records coroutine 'co' has,
** how many of them were made after 'serial' (a record's: its number among
** the records made and ended so far, DebugRecords.epoch), and the newest
** one's serial.  Lockdep reads only the new ones when the counts say none
** ended since (async_mutex.debug: lockdep).  Allocates nothing.
*/
static int dbg_held_count (lua_State *L) {
  const DebugRecords *d = am_getstate(L)->dbg_recs;
  const lua_State *co = lua_tothread(L, 1);
  lua_Integer since = luaL_optinteger(L, 2, LUA_MAXINTEGER);
  const PtrEntry *h;
  int s, newer = 0;
  luaL_argexpected(L, co != NULL, 1, "coroutine");
  if (d == NULL || (h = ph_find(&d->cos, co)) == NULL) {
    lua_pushinteger(L, 0);
    return 1;
  }
  for (s = h->slot; s >= 0 && d->slots[s].serial > since;
       s = d->slots[s].next_co)
    newer++;
  lua_pushinteger(L, h->n);
  lua_pushinteger(L, newer);
  lua_pushinteger(L, d->slots[h->slot].serial);
  return 3;
}


/*
** core.dbg_count(): how many records there are, and how many were made or
** ended so far (a search that read them knows whether they changed since).
*/
static int dbg_count (lua_State *L) {
  const DebugRecords *d = am_getstate(L)->dbg_recs;
  lua_pushinteger(L, d != NULL ? d->n : 0);
  lua_pushinteger(L, d != NULL ? d->epoch : 0);
  return 2;
}


/* core.dbg_warned(releaser): its record was reported as a long hold. */
static int dbg_warned (lua_State *L) {
  State *st = am_getstate(L);
  Releaser *r = (Releaser *)am_testself(L, 1, AM_T_RELEASER);
  int slot;
  if (r != NULL && st->dbg_recs != NULL
      && (slot = find_record(st->dbg_recs, r)) >= 0)
    st->dbg_recs->slots[slot].warned = 1;
  return 0;
}


/*
** core.dbg_internal(lock | keyed set): marks a lock (or every lock of a
** keyed set, now and later) as the library's own, one debug mode does not
** watch: no owner record, no lockdep edge, no wait in the deadlock search.
** The Redis locks mark their gates and bells (docs/debug.md, Deadlocks):
** a wait on one is a wait for Redis, and a bell's grant is never given
** back.  Returns the object.
*/
static int dbg_internal (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  Keyed *kd = lk == NULL ? am_tokeyed(L, 1) : NULL;
  luaL_argexpected(L, lk != NULL || kd != NULL, 1, "lock or keyed set");
  if (lk != NULL) lk->internal = 1;
  else {                        /* its locks copy the mark of 'fresh' */
    kd->fresh.internal = 1;
    lua_getiuservalue(L, 1, 1);                   /* the map key -> lock */
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      ((Lock *)lua_touserdata(L, -1))->internal = 1;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  return 1;
}


/* core.dbg_now(): the clock of the owner records' 'since' (clock_ms). */
static int dbg_now (lua_State *L) {
  lua_pushnumber(L, clock_ms());
  return 1;
}


/* core.dbg_kind(v): "lock", "keyed", "decorated" (with its lock) or nil. */
static int dbg_kind (lua_State *L) {
  if (am_tolock(L, 1) != NULL) lua_pushliteral(L, "lock");
  else if (am_tokeyed(L, 1) != NULL) lua_pushliteral(L, "keyed");
  else if (lua_type(L, 1) == LUA_TUSERDATA && am_core_limit(L) > 0) {
    lua_settop(L, 2);                       /* v, its lock */
    lua_pushliteral(L, "decorated");
    lua_insert(L, 2);
    return 2;
  }
  else lua_pushnil(L);
  return 1;
}


/*
** core.error_text(v): the text of an error object as lua5.4 prints it
** (src/error_text.c; async_mutex.redis_core has the same function): its
** __tostring called protected, so that a report made inside a luv callback
** (the long-hold check) or a request (a deadlock's) cannot raise there.
*/
static int core_error_text (lua_State *L) {
  luaL_checkany(L, 1);
  am_push_error_text(L, 1);
  return 1;
}


const luaL_Reg am_debug_funcs[] = {
  {"error_text", core_error_text},
  {"debug", am_core_debug},
  {"dbg_lock", dbg_lock},
  {"dbg_fits", dbg_fits},
  {"dbg_queue", dbg_queue},
  {"dbg_kind", dbg_kind},
  {"dbg_now", dbg_now},
  {"dbg_records", dbg_records},
  {"dbg_count", dbg_count},
  {"dbg_held_count", dbg_held_count},
  {"dbg_warned", dbg_warned},
  {"dbg_internal", dbg_internal},
  {NULL, NULL}
};

/* }====================================================== */


/*
** query.c: the live owner records of 'lk', newest first.  Copies up to
** 'max' of them into 'out' (weight, since) and pushes their holders into
** the table at 't' (from index 'first' + 1: its array part made big
** enough, so nothing is allocated); returns how many there are, which may
** be more than 'max' (the caller makes more room and asks again).
*/
int am_dbg_lock_holds (lua_State *L, State *st, const Lock *lk,
                       HoldView *out, int max, int t, int first) {
  const DebugRecords *d = st->dbg_recs;
  int s, n = 0;
  if (d == NULL || lk->dbg < 0) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  for (s = lk->dbg; s >= 0; s = d->slots[s].next_lock) {
    const Record *rec = &d->slots[s];
    if (!am_releaser_live(rec->r)) continue;   /* an unscoped release's */
    if (n < max) {
      out[n].weight = rec->r->weight;
      out[n].since = rec->since;
      lua_rawgeti(L, -1, A_N * s + A_HOLDER);
      lua_rawseti(L, t, first + n + 1);
    }
    n++;
  }
  lua_pop(L, 1);
  return n;
}
