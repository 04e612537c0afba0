/*
** debug_read.c: what the Lua module async_mutex.debug reads (core.dbg_*)
** Debug mode on and off (core.debug), and the views of the records, a
** lock, its queue and a waiter that the wait-for graph, lockdep and the
** reports are built from; and the records of a lock for am.query
** (query.c).  Each view is copied before any table is made (an
** allocation may run a finalizer that changes the lock).
*/

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "debug.h"
#include "../../error_text.h"


/* {====================================================== core.dbg_* */

/*
** What the engine and the kinds report to debug mode (async_mutex.h:
** DebugObserver): debug.c's hooks, the request hook (debug_deadlock.c)
** and the end of the records (debug_records.c).
*/
static const DebugObserver observer = {
  .request = am_dbg_request,
  .granted = am_dbg_granted,
  .released = am_dbg_released,
  .unscoped = am_dbg_unscoped,
  .returned = am_dbg_returned,
  .stolen = am_dbg_stolen,
  .created = am_dbg_created,
  .close = am_dbg_close,
};


/*
** core.debug(hooks | nil): debug mode on (the hook table) or off, for
** this state.  Returns whether it was on.  On again (new options), the
** records stay; off, they go.  The observer is installed first, whatever
** follows: no state has records or counts in 'am_debug_on' without it
** (it is the same for every state, and stays).
*/
int am_core_debug (lua_State *L) {
  State *st = am_getstate(L);
  int was, ref = LUA_NOREF, flags = 0;
  am_debug_observer = &observer;
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
      d = am_dbg_new_records(L);
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
** core.dbg_fits(lock, weight, n, w, writes): am_dbg_fits_outside, for the
** search (async_mutex.debug: doomed_set).
*/
static int dbg_fits (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  luaL_argexpected(L, lk != NULL, 1, "lock");
  lua_pushboolean(L, am_dbg_fits_outside(am_getstate(L)->dbg_recs, lk,
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
    am_dbg_push_key(L, &v[j].key);
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
    h = am_ph_find(&d->cos, co);
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
    if (!am_releaser_live(d->slots[s].r)) am_dbg_end_record(L, d, s, 2, NULL);
    else n++;
    s = next;
  }
  lua_settop(L, 1);
  if (d->n < before) am_dbg_ended(L, st);
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
  if (d == NULL || (h = am_ph_find(&d->cos, co)) == NULL) {
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
      && (slot = am_dbg_find_record(st->dbg_recs, r)) >= 0)
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


/* core.dbg_now(): the clock of the owner records' 'since' (am_dbg_clock_ms). */
static int dbg_now (lua_State *L) {
  lua_pushnumber(L, am_dbg_clock_ms());
  return 1;
}


/* Is the value at 'idx' a decorated lock (of any lock type)? */
static int is_decorated (lua_State *L, int idx) {
  int t;
  for (t = 0; t < AM_NLOCKTYPES; t++)
    if (am_testself(L, idx, am_decorated_type(t)) != NULL) return 1;
  return 0;
}


/* core.dbg_kind(v): "lock", "keyed", "decorated" (with its lock) or nil. */
static int dbg_kind (lua_State *L) {
  if (am_tolock(L, 1) != NULL) lua_pushliteral(L, "lock");
  else if (am_tokeyed(L, 1) != NULL) lua_pushliteral(L, "keyed");
  else if (is_decorated(L, 1)) {
    lua_pushliteral(L, "decorated");
    lua_getiuservalue(L, 1, 1);             /* its lock (decorated.c) */
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
