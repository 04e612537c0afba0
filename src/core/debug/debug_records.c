/*
** debug_records.c: debug mode's owner records (docs/debug.md, Owner records)
** Made at every grant and ended at every release while debug mode is on
** (debug.c), in the slots of one array, chained by lock and by holder
** (debug.h: the layout); growing the array is the one Lua allocation,
** and it is protected.
*/

#include <assert.h>
#include <limits.h>
#include <stdlib.h>

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "debug.h"


/* The slot of the record of releaser 'r', or -1. */
int am_dbg_find_record (const DebugRecords *d, const Releaser *r) {
  const PtrEntry *e = am_ph_find(&d->rels, r);
  return e != NULL ? e->slot : -1;
}


/*
** Ends the record at 'slot' ('e': its entry in 'rels', or NULL): out of
** its chains and hashes, its anchors cleared (in 'anchors', at 'a'), the
** slot free.  Allocates nothing.
*/
void am_dbg_end_record (lua_State *L, DebugRecords *d, int slot, int a,
                        PtrEntry *e) {
  Record *rec = &d->slots[slot];
  PtrEntry *h;
  if (rec->prev_lock >= 0) d->slots[rec->prev_lock].next_lock = rec->next_lock;
  else rec->r->lock->dbg = rec->next_lock;
  if (rec->next_lock >= 0) d->slots[rec->next_lock].prev_lock = rec->prev_lock;
  h = am_ph_find(&d->cos, rec->holder);
  assert(h != NULL && h->n > 0);
  if (rec->prev_co >= 0) d->slots[rec->prev_co].next_co = rec->next_co;
  else {
    assert(h->slot == slot);
    h->slot = rec->next_co;
  }
  if (--h->n == 0) am_ph_remove(&d->cos, h);
  if (rec->next_co >= 0) d->slots[rec->next_co].prev_co = rec->prev_co;
  if (e == NULL) e = am_ph_find(&d->rels, rec->r);
  assert(e != NULL && e->slot == slot);
  am_ph_remove(&d->rels, e);
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
void am_dbg_prune_lock (lua_State *L, DebugRecords *d, Lock *lk, int a) {
  int s = lk->dbg;
  while (s >= 0) {
    int next = d->slots[s].next_lock;
    if (!am_releaser_live(d->slots[s].r)) am_dbg_end_record(L, d, s, a, NULL);
    s = next;
  }
}


/*
** Doubles the slots when none is free (protected: 'anchors' is made
** anew, a Lua allocation).  A collector step there may run finalizers
** that grant or release, or switch debug mode: what they did stands.
*/
int am_dbg_grow_records (lua_State *L) {
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
DebugRecords *am_dbg_new_records (lua_State *L) {
  DebugRecords *d = (DebugRecords *)calloc(1, sizeof(DebugRecords));
  int i;
  if (d == NULL || (d->slots = (Record *)malloc(FIRST_SLOTS
                                                * sizeof(Record))) == NULL) {
    free(d);
    luaL_error(L, "not enough memory");
    return NULL;                     /* (not reached: luaL_error raises) */
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
** The new record at 'slot' (its releaser and holder set) joins the
** chains and hashes: first in its lock's chain and in its holder's (room
** in the hashes reserved), and its epoch counted.
*/
void am_dbg_link_record (DebugRecords *d, int slot) {
  Record *rec = &d->slots[slot];
  Lock *lk = rec->r->lock;
  PtrEntry *h;
  rec->prev_lock = -1;                        /* first in its lock's chain */
  rec->next_lock = lk->dbg;
  if (lk->dbg >= 0) d->slots[lk->dbg].prev_lock = slot;
  lk->dbg = slot;
  rec->prev_co = -1;                          /* and in its holder's */
  if ((h = am_ph_find(&d->cos, rec->holder)) != NULL) {
    rec->next_co = h->slot;
    d->slots[h->slot].prev_co = slot;
    h->slot = slot;
  }
  else {
    rec->next_co = -1;
    h = am_ph_put(&d->cos, rec->holder, slot);
  }
  h->n++;
  am_ph_put(&d->rels, rec->r, slot);
  d->n++;
  rec->serial = ++d->epoch;
}
