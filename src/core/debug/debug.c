/*
** debug.c: debug mode's hooks, which the C core calls (docs/debug.md)
** The C side of debug mode is in five files: the hooks here (a grant
** makes an owner record, a release ends it); the records themselves
** (debug_records.c, debug_hash.c; their layout in debug.h), kept in C as
** the hot part of debug mode; the request hook's deadlock facts
** (debug_deadlock.c); and what the Lua module reads (debug_read.c,
** core.debug and core.dbg_*).  The rest is the
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

#include "../async_mutex.h"
#include "debug.h"


/*
** The time a grant is recorded at, in ms: the clock of the loop's time
** (libuv reads CLOCK_MONOTONIC for uv.now(), in ms), read now rather than
** cached at the loop's last turn, and without a call into luv.
*/
lua_Number am_dbg_clock_ms (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (lua_Number)ts.tv_sec * 1e3 + (lua_Number)ts.tv_nsec / 1e6;
}


/*
** Pushes hook 'h' of 'st' and returns 1, or returns 0 (pushing nothing)
** when debug mode is off for this state.
*/
int am_dbg_push_hook (lua_State *L, State *st, int h) {
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
int am_dbg_holds_any (lua_State *L, State *st) {
  return st->dbg_recs != NULL && am_ph_find(&st->dbg_recs->cos, L) != NULL;
}


/* A queue key as the Lua number it was (queue.c: canonical keys). */
void am_dbg_push_key (lua_State *L, const Key *k) {
  if (k->flt) lua_pushnumber(L, k->n);
  else lua_pushinteger(L, k->i);
}




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
  PtrEntry *e = am_ph_find(&d->credit, r->lock);
  if (e == NULL) return 0;
  if (e->slot > r->weight) e->slot -= (int)r->weight;
  else am_ph_remove(&d->credit, e);
  return 1;
}


/*
** The records of 'st' with a free slot and room in both hashes for the
** grant of 'r', or NULL: debug mode was switched off, the grant ended
** (both by what a growth's collector step ran), memory ran out, or an
** unscoped release's credit takes it (take_credit: no record).
*/
static DebugRecords *room_for_record (lua_State *L, State *st, Releaser *r) {
  DebugRecords *d = st->dbg_recs;
  if (d->free < 0) {                      /* every slot used: double them */
    lua_pushcfunction(L, am_dbg_grow_records);
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
      return NULL;
    }
  }
  if (d->credit.n > 0 && take_credit(d, r)) return NULL;
  if (!am_ph_reserve(&d->cos) || !am_ph_reserve(&d->rels)) return NULL;
  return d;
}


/*
** The Lua side of a grant recorded (its releaser 'r' at 'top'): its
** traceback, with the option; the granted hook, for a key (acquireAll's
** canonical order) or when the Lua hooks have work.  Each runs Lua: the
** record is looked up again after it.
*/
static void after_grant (lua_State *L, State *st, Releaser *r, int top) {
  Lock *lk = r->lock;
  DebugRecords *d;
  int slot;
  if (st->dbg_flags & DF_TRACEBACK) {
    lua_pushcfunction(L, where_traceback);
    lua_pushlightuserdata(L, st);
    if (call_hook(L, 1, 1) && (d = st->dbg_recs) != NULL
        && (slot = am_dbg_find_record(d, r)) >= 0) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
      lua_insert(L, -2);
      lua_rawseti(L, -2, A_N * slot + A_WHERE);
      d->slots[slot].has_where = 1;
    }
    lua_settop(L, top);
  }
  if ((lk->keyed != NULL || (st->dbg_flags & DF_LUA))
      && am_dbg_push_hook(L, st, H_GRANTED)) {
    lua_pushboolean(L, lk->keyed != NULL);
    if (call_hook(L, 1, 1) && lua_toboolean(L, -1)
        && (d = st->dbg_recs) != NULL && (slot = am_dbg_find_record(d, r)) >= 0)
      d->slots[slot].canon = 1;               /* taken by acquireAll */
    lua_settop(L, top);
  }
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
  DebugRecords *d;
  Record *rec;
  lua_Debug ar;
  int slot, a, level;
  if (r == NULL || st->dbg_recs == NULL || st->dbg == LUA_NOREF
      || st->closed || r->lock->internal || !lua_checkstack(L, 8))
    return;
  if ((d = room_for_record(L, st, r)) == NULL) return;
  slot = d->free;
  rec = &d->slots[slot];
  d->free = rec->next_lock;
  rec->r = r;
  rec->holder = L;
  rec->since = am_dbg_clock_ms();
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
  am_dbg_link_record(d, slot);
  lua_settop(L, top);
  after_grant(L, st, r, top);
}


/* Records were ended: the Lua hook hears when the last one goes (the
   long-hold timer stops). */
void am_dbg_ended (lua_State *L, State *st) {
  if (st->dbg_recs->n == 0 && (st->dbg_flags & DF_LUA)
      && lua_checkstack(L, 2) && am_dbg_push_hook(L, st, H_RELEASED))
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
    /* (a key's lock that left its set) */
    am_dbg_prune_lock(L, d, lk, a);
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
          am_dbg_end_record(L, d, s, a, NULL);
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
  if (left > 0 && am_ph_reserve(&d->credit)) {
    if ((e = am_ph_find(&d->credit, lk)) == NULL)
      e = am_ph_put(&d->credit, lk, 0);
    e->slot = (int)(left >= room - e->slot ? room : e->slot + left);
  }
  /* the marks last: they allocate, and what runs then may end records
     or debug mode */
  if (lua_gettop(L) > base + 2 && lua_pcall(L, lua_gettop(L) - base - 1,
                                            0, 0) != LUA_OK)
    lua_pop(L, 1);
  lua_settop(L, base);
  if ((d = st->dbg_recs) != NULL && d->n < n) am_dbg_ended(L, st);
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
  if ((e = am_ph_find(&d->rels, r)) == NULL) {
    if (r->lock->kind == &am_semaphore_kind) returned_again(L, st, idx, r);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  am_dbg_end_record(L, d, e->slot, lua_gettop(L), e);
  lua_pop(L, 1);
  am_dbg_ended(L, st);
}


/* An unscoped release (lock:release()) of 'lk' gave back a grant: the
   records it ended go. */
void am_dbg_unscoped (lua_State *L, State *st, Lock *lk) {
  DebugRecords *d = st->dbg_recs;
  int n;
  if (d == NULL || lk->dbg < 0 || !lua_checkstack(L, 4)) return;
  n = d->n;
  lua_rawgeti(L, LUA_REGISTRYINDEX, d->aref);
  am_dbg_prune_lock(L, d, lk, lua_gettop(L));
  lua_pop(L, 1);
  if (d->n < n) am_dbg_ended(L, st);
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
  if ((e = am_ph_find(&d->credit, lk)) != NULL) am_ph_remove(&d->credit, e);
  am_dbg_unscoped(L, st, lk);
}


/* A lock or keyed set was made (on top): its creation site names it.  A
   Semaphore's credit left by a collected one at its address goes. */
void am_dbg_created (lua_State *L, State *st) {
  int top = lua_gettop(L);
  const Lock *lk = am_tolock(L, top);
  PtrEntry *e;
  if (lk != NULL && st->dbg_recs != NULL
      && (e = am_ph_find(&st->dbg_recs->credit, lk)) != NULL)
    am_ph_remove(&st->dbg_recs->credit, e);
  if (!lua_checkstack(L, 3) || !am_dbg_push_hook(L, st, H_CREATED)) return;
  lua_pushvalue(L, top);
  call_hook(L, 1, 0);
}
