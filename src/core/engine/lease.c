/*
** lease.c: leased holds (am.withLease): a hold that lasts at most so long
** A leased grant's releaser is a Waiter of kind W_LEASE in the scheduler's
** timer queue (the one heap that serves timeouts: O(log n) a hold), with
** its lease's end as deadline.  The timer queue holds it by address, so it
** is anchored in the registry ('ref') while it is there.  Released in
** time, it leaves the queue; when its deadline passes first, the hold is
** lost: given back at once (the lock passes on, woken from the loop as
** ever), its releaser then returns false and its check() raises the lost
** error (user value 2).  docs/lockkinds.md, Leases.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/*
** Pushes the releaser of a leased grant of 'weight' of 'lk' (at
** 'lockidx'), with the lost error at 'lostidx' (0: E_LOST), whose lease
** ends at 'end' (loop time; 'now' is the loop time now).  Returns 1.
*/
int am_push_lease (lua_State *L, int lockidx, int lostidx, Lock *lk,
                   lua_Integer weight, lua_Integer token, lua_Number now,
                   lua_Number end) {
  Waiter *w = (Waiter *)lua_newuserdatauv(L, AM_TIMED_SIZE, 2);
  w->r = (Releaser){.lock = lk, .weight = weight, .token = token,
                    .state = S_HELD, .lease = 1, .kind = W_LEASE,
                    .outcome = O_GRANTED, .timed = 1, .ref = LUA_NOREF};
  w->q.prev = w->q.next = NULL;
  w->t.prev = w->t.next = NULL;
  w->deadline = 0;
  w->lease = 0;
  am_pushmt(L, AM_T_RELEASER);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, lockidx);
  lua_setiuservalue(L, -2, 1);
  if (lostidx == 0) lua_pushliteral(L, AM_E_LOST);
  else lua_pushvalue(L, lostidx);
  lua_setiuservalue(L, -2, 2);
  lua_pushvalue(L, -1);
  w->r.ref = luaL_ref(L, LUA_REGISTRYINDEX);
  am_timer_add(L, lk->st, w, now, end > now ? end - now : 0);
  am_sync(L, lk->st);                       /* arms the timer */
  return 1;
}


/* A leased releaser given back in time: its lease ends. */
void am_lease_end (lua_State *L, Releaser *r) {
  Waiter *w = (Waiter *)r;
  am_timer_remove(L, r->lock->st, w);
  luaL_unref(L, LUA_REGISTRYINDEX, w->r.ref);
  w->r.ref = LUA_NOREF;
}


/*
** The lease of a held releaser ran out (the scheduler took it out of the
** timer queue): the hold is lost and given back (saturating: nothing may
** raise in a timer callback), and the releaser's anchor dropped.  A hold
** an unscoped release ended first (m:release()) was not lost: its lease
** just ends, its releaser spent (released, as its tostring said).
*/
static void lease_lost (lua_State *L, Waiter *w) {
  int ref = w->r.ref;
  int live, stolen;
  if (w->r.state != S_HELD) return;       /* BUG guard */
  live = am_releaser_live(&w->r);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);               /* the releaser */
  /* a hold a steal ended is lost as well (steal.c): given back then */
  stolen = !live && am_hold_stolen(L, &w->r, lua_gettop(L), 1);
  am_hold_ended(&w->r, live || stolen);
  w->r.ref = LUA_NOREF;
  if (live) am_give_back(L, w->r.lock, w->r.weight, w->r.token, 1);
  if (am_debugging() && !stolen)          /* its owner record ends */
    am_debug_observer->released(L, w->r.lock->st, -1);
  lua_pop(L, 1);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);  /* last: it may be collected */
}


/*
** A timer entry whose deadline passed, out of the timer queue
** (StateHooks.expire: the scheduler names no layer above it): a lease
** ran out, or a timed request's wait did (rules.c: am_expire).  Here,
** above rules.c, so that the rules need not know leases.
*/
void am_timer_expired (lua_State *L, Waiter *w) {
  if (w->r.kind == W_LEASE) lease_lost(L, w);
  else am_expire(L, w);
}


/*
** The check of the releaser at 'idx' (docs/semantics.md, Leases and lost
** holds): raises the lost error (level 0) once the hold was lost (its
** lease ran out, or a steal ended it: steal.c); otherwise returns whether
** the hold is in place (0 once given back, by the releaser or by an
** unscoped release: am_releaser_live).  A lease's lost error is its user
** value 2; any other releaser's, E_LOST.  runExclusive's check once its
** body returned (run.c), and releaser:check()'s.
*/
int am_hold_check (lua_State *L, int idx) {
  Releaser *r = (Releaser *)lua_touserdata(L, idx);
  int live = am_releaser_live(r);
  if (!live && r->state == S_HELD && am_hold_stolen(L, r, idx, 1)) {
    am_hold_ended(r, 1);                /* a steal ended it (steal.c) */
    if (r->lease) {                     /* its lease ends with it */
      am_lease_end(L, r);
      am_sync(L, r->lock->st);
    }
  }
  if (r->state == S_LOST) {
    if (r->lease) lua_getiuservalue(L, idx, 2);
    else lua_pushliteral(L, AM_E_LOST);
    return lua_error(L);
  }
  return live;
}


/* releaser:check(): true while the hold is in place, false once given
   back; raises the lost error once lost (am_hold_check). */
int am_releaser_check (lua_State *L) {
  am_checkself(L, AM_T_RELEASER);
  lua_pushboolean(L, am_hold_check(L, 1));
  return 1;
}
