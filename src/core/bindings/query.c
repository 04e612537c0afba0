/*
** query.c: am.query(lock) and km:query([key]), what holds a lock and what
** waits for it, as plain tables (docs/semantics.md, Query)
** A snapshot read from the lock's queue and counts, and from debug mode's
** owner records when it is on: nothing is kept for it, so it costs
** nothing until called, and allocates only when called.
*/

#define LUA_LIB

#include <limits.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* A queued acquirer as a snapshot reports it (its coroutine aside). */
typedef struct PendView {
  lua_Integer weight;
  Key key;
} PendView;


/* The Web Locks mode of a grant or request of 'weight' on 'lk'. */
static const char *mode_of (const Lock *lk, lua_Integer weight) {
  if (lk->kind->weighted) return "weighted";
  if (lk->kind == &am_rwlock_kind && weight == AM_RW_READ) return "shared";
  return "exclusive";
}


/* Sets the fields every entry has: mode, and weight for weighted kinds. */
static void set_mode (lua_State *L, const Lock *lk, lua_Integer weight) {
  lua_pushstring(L, mode_of(lk, weight));
  lua_setfield(L, -2, "mode");
  if (lk->kind->weighted) {
    lua_pushinteger(L, weight);
    lua_setfield(L, -2, "weight");
  }
}


/* Sets field 'f' of the table on top to value 'i' of the table at 't'. */
static void set_from (lua_State *L, int t, lua_Integer i, const char *f) {
  lua_rawgeti(L, t, i);
  lua_setfield(L, -2, f);
}


/*
** The holds in place that no owner record shows (all of them with debug
** mode off, those granted before it was switched on): how many, and the
** weight of each.  The counts say how much is held; the records, which
** of it they show.
*/
static int unrecorded (const Lock *lk, const HoldView *hv, int nrec,
                       lua_Integer *weight) {
  lua_Integer w = 0, reads = 0;
  int i;
  for (i = 0; i < nrec; i++) {
    w += hv[i].weight;
    if (hv[i].weight == AM_RW_READ) reads++;
  }
  if (lk->kind->weighted) {               /* the Semaphore: as one hold */
    *weight = lk->held - w;
    return *weight > 0;
  }
  if (lk->kind == &am_rwlock_kind && lk->value > 0) {    /* readers */
    *weight = AM_RW_READ;
    return lk->value > reads ? (int)(lk->value - reads) : 0;
  }
  *weight = lk->kind == &am_rwlock_kind ? AM_RW_WRITE : 1;
  return lk->kind->is_locked(lk) && nrec == 0;
}


/*
** Pushes the list 'held' of a snapshot: the 'nrec' holds recorded in 'hv'
** (their owners in the table at 'cos', from 1), after 'nextra' holds of
** weight 'xweight' granted unrecorded; a ReentrantMutex's one hold, at
** its depth.
*/
static void push_held (lua_State *L, Lock *lk, int lockidx,
                       const HoldView *hv, int nrec, int cos, int nextra,
                       lua_Integer xweight) {
  int i, h;
  if (lk->kind->reentrant) {          /* one hold, at its depth: levels */
    lua_createtable(L, 1, 0);
    if (lk->kind->is_locked(lk)) {
      lua_createtable(L, 0, 4);
      set_mode(L, lk, 1);
      lua_getiuservalue(L, lockidx, 2);            /* its holder */
      lua_setfield(L, -2, "owner");
      lua_pushinteger(L, lk->held);
      lua_setfield(L, -2, "depth");
      if (nrec > 0) {
        lua_pushnumber(L, hv[nrec - 1].since);       /* the oldest level */
        lua_setfield(L, -2, "since");
      }
      lua_rawseti(L, -2, 1);
    }
    return;
  }
  lua_createtable(L, nextra + nrec, 0);
  /* unrecorded first: granted before debug mode was switched on */
  for (h = 0; h < nextra; h++) {
    lua_createtable(L, 0, 2);
    set_mode(L, lk, xweight);
    lua_rawseti(L, -2, h + 1);
  }
  for (i = nrec - 1; i >= 0; i--) {      /* records: oldest first */
    lua_createtable(L, 0, 4);
    set_mode(L, lk, hv[i].weight);
    set_from(L, cos, i + 1, "owner");
    lua_pushnumber(L, hv[i].since);
    lua_setfield(L, -2, "since");
    lua_rawseti(L, -2, ++h);
  }
}


/*
** Pushes the list 'pending' of a snapshot: the 'n' requests copied in
** 'pv', their coroutines in the table at 'cos' from 'from' + 1.
*/
static void push_pending (lua_State *L, Lock *lk, const PendView *pv, int n,
                          lua_Integer from, int cos) {
  int i;
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    lua_createtable(L, 0, 4);
    set_mode(L, lk, pv[i].weight);
    set_from(L, cos, from + i + 1, "owner");
    if (pv[i].key.flt) lua_pushnumber(L, pv[i].key.n);
    else lua_pushinteger(L, pv[i].key.i);
    lua_setfield(L, -2, "priority");
    lua_rawseti(L, -2, i + 1);
  }
}


/*
** Pushes the snapshot of lock 'lk' (at 'lockidx'): { held = {...},
** pending = {...} }.  The queue and the records are copied whole, with no
** allocation in between, into room made first (as core.dbg_queue does:
** a finalizer run by an allocation may queue, cancel or release, and
** free buckets); the tables are made from the copy.
*/
static void push_snapshot (lua_State *L, Lock *lk, int lockidx) {
  State *st = lk->st;
  int base = lua_gettop(L), cos = base + 1, nrec, nextra, i;
  size_t nh = 0, np = 0, nb = 0, n = 0;
  HoldView *hv = NULL;
  PendView *pv;
  Bucket **b;
  lua_Integer xweight = 1;            /* (read only when nextra > 0) */
  luaL_checkstack(L, 8, NULL);
  for (;;) {          /* room, until nothing grew past it meanwhile */
    size_t needh = (size_t)am_dbg_lock_holds(L, st, lk, NULL, 0, 0, 0);
    size_t needp = lk->queue.count, needb = lk->queue.n;
    if (hv != NULL && needh <= nh && needp <= np && needb <= nb) break;
    nh = 2 * (needh > nh ? needh : nh) + 4;
    np = 2 * (needp > np ? needp : np) + 4;
    nb = 2 * (needb > nb ? needb : nb) + 4;
    if (nh + np > (size_t)INT_MAX / 4) luaL_error(L, "too many waiters");
    lua_settop(L, base);
    lua_createtable(L, (int)(nh + np), 0);     /* cos: the coroutines */
    hv = (HoldView *)lua_newuserdatauv(L, nh * sizeof(HoldView)
                                       + np * sizeof(PendView)
                                       + nb * sizeof(Bucket *), 0);
  }
  pv = (PendView *)(void *)(hv + nh);
  b = (Bucket **)(void *)(pv + np);
  /* the copy: nothing allocated until the counts are read */
  nrec = am_dbg_lock_holds(L, st, lk, hv, (int)nh, cos, 0);
  am_queue_ordered(&lk->queue, b);
  for (i = 0; i < (int)lk->queue.n; i++) {
    Waiter *w;
    for (w = am_bucket_next(b[i], NULL); w != NULL;
         w = am_bucket_next(b[i], w)) {
      pv[n].weight = w->r.weight;
      pv[n].key = b[i]->key;
      am_push_anchored(L, w);
      lua_rawseti(L, cos, (lua_Integer)(nh + ++n));
    }
  }
  nextra = lk->freed ? 0 : unrecorded(lk, hv, nrec, &xweight);
  /* the tables */
  lua_createtable(L, 0, 2);                          /* the snapshot */
  push_held(L, lk, lockidx, hv, nrec, cos, nextra, xweight);
  lua_setfield(L, -2, "held");
  push_pending(L, lk, pv, (int)n, (lua_Integer)nh, cos);
  lua_setfield(L, -2, "pending");
  lua_replace(L, cos);                            /* the snapshot */
  lua_settop(L, cos);
}


/* The snapshot of a lock that no key has: nothing held, nothing pending. */
static void push_empty (lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_createtable(L, 0, 0);
  lua_setfield(L, -2, "held");
  lua_createtable(L, 0, 0);
  lua_setfield(L, -2, "pending");
}


/*
** The snapshots of the keyed set at 1: of the key at 2, or (none given)
** of every key in use, as a table key -> snapshot.  The keys and their
** locks are copied first into room made before the walk (a finalizer run
** by an allocation could add a key to the map while lua_next walks it).
*/
static int keyed_query (lua_State *L, Keyed *kd, int base,
                        const char *fname) {
  lua_Integer room = -1, j = 0, i;
  if (!lua_isnoneornil(L, 2)) {
    am_checkkey(L, 2, base, fname);
    lua_settop(L, 2);
    lua_getiuservalue(L, 1, 1);                    /* 3: map */
    lua_pushvalue(L, 2);
    if (lua_rawget(L, 3) == LUA_TNIL) push_empty(L);
    else push_snapshot(L, (Lock *)lua_touserdata(L, 4), 4);
    return 1;
  }
  lua_settop(L, 1);
  lua_getiuservalue(L, 1, 1);                      /* 2: map */
  while (room < kd->nkeys) {
    room = kd->nkeys + 4;
    lua_settop(L, 2);
    lua_createtable(L, (int)(2 * room), 0);       /* 3: key, lock, ... */
  }
  lua_pushnil(L);
  while (lua_next(L, 2) != 0) {
    if (j == room) {                               /* BUG guard: nkeys */
      lua_pop(L, 2);
      break;
    }
    lua_rawseti(L, 3, 2 * j + 2);                  /* the lock */
    lua_pushvalue(L, -1);
    lua_rawseti(L, 3, 2 * ++j - 1);                /* the key */
  }
  lua_createtable(L, 0, (int)j);                   /* 4: the result */
  for (i = 0; i < j; i++) {
    lua_rawgeti(L, 3, 2 * i + 1);                  /* 5: key */
    lua_rawgeti(L, 3, 2 * i + 2);                  /* 6: its lock */
    push_snapshot(L, (Lock *)lua_touserdata(L, 6), 6);
    lua_replace(L, 6);
    lua_rawset(L, 4);
  }
  return 1;
}


/*
** am.query(lock [, key]), and the keyed sets' query method (km:query
** ([key])): a lock or keyed set, plain or decorated, at 1.
*/
static int query (lua_State *L, int base, const char *fname) {
  Lock *lk = am_tolock(L, 1);
  Keyed *kd = lk == NULL ? am_tokeyed(L, 1) : NULL;
  int t;
  for (t = 0; lk == NULL && kd == NULL && t < AM_NTYPES; t++)
    if (am_undecorate(L, (AmType)t)) {     /* its lock or set instead */
      lk = am_tolock(L, 1);
      kd = lk == NULL ? am_tokeyed(L, 1) : NULL;
    }
  if (lk == NULL && kd == NULL)
    am_typeerror(L, 1, base, fname, "async_mutex lock");
  if (kd != NULL) return keyed_query(L, kd, base, fname);
  if (!lua_isnoneornil(L, 2))
    am_argerror(L, 2, base, fname, lua_pushfstring(L,
                "no key expected: a %s has no keys", lk->kind->name));
  lua_settop(L, 1);
  push_snapshot(L, lk, 1);
  return 1;
}


int am_query (lua_State *L) {
  return query(L, 0, "query");
}


/* km:query([key]): the keyed sets' method (self is not counted). */
int am_keyed_query (lua_State *L) {
  return query(L, 1, "query");
}
