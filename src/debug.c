/*
** debug.c: the C side of debug mode (docs/debug.md)
** Debug mode is kept by the Lua module async_mutex.debug: owner records,
** the wait-for graph, lockdep's class graph, the reports.  The core only
** tells it what happens, through hooks (Lua functions in a table that
** exists only while debug mode is on, registry reference 'State.dbg'),
** and lets it read the few fields of a lock, a releaser and a waiter it
** needs (core.dbg_*).  Nothing is added to a Waiter or a Lock.
**
** Off, the cost is one test of 'am_debug_on' (a global: how many states
** have debug mode on) at each hook site; the hook functions below are
** never entered.  On, each hook runs after the change it reports is
** committed (a grant delivered, a waiter queued, a releaser given back),
** or before anything is decided (a request): the rule "decide, then call
** out" of docs/internals.md holds, since a hook runs Lua code.
*/

#define LUA_LIB

#include <stdio.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


int am_debug_on = 0;


/* Hooks, by their index in the hook table (async_mutex.debug: HOOKS). */
enum { H_REQUEST = 1, H_GRANTED, H_WAITING, H_RELEASED, H_UNSCOPED,
       H_CREATED };


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
** change it reports is done).  Its error goes to stderr.
*/
static void call_hook (lua_State *L, int nargs) {
  if (lua_pcall(L, nargs, 0, 0) != LUA_OK) {
    fprintf(stderr, "async_mutex.debug: error in a hook: %s\n",
            lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?");
    fflush(stderr);
    lua_pop(L, 1);
  }
}


/*
** Before a request (acquire or waitForUnlock of the lock at
** rq->lockidx) decides anything: the hook records lockdep's edges and
** looks for the deadlock the request would close if it waited.  It may
** raise E_DEADLOCK; then a keyed lock made for this request leaves its
** set again, and the error propagates to the requester: nothing queued.
** sleep()'s private semaphore (no error value) is not a lock to debug.
*/
void am_dbg_request (lua_State *L, const Request *rq) {
  Lock *lk = rq->lock;
  int would_wait;
  if (rq->erridx == 0 && rq->wait == AM_TIMEOUT) return;     /* sleep */
  if (!lua_checkstack(L, 8) || !push_hook(L, lk->st, H_REQUEST)) return;
  would_wait = !(lk->kind->reentrant && lk->owner == L && lk->value <= 0)
               && !am_can_lock_now(lk, rq->weight, &rq->priority);
  lua_pushvalue(L, rq->lockidx);
  lua_pushinteger(L, rq->weight);
  lua_pushboolean(L, rq->kind == W_UNLOCK);
  lua_pushboolean(L, would_wait);
  lua_pushinteger(L, rq->wait);
  if (lua_pcall(L, 5, 0, 0) != LUA_OK) {
    am_settle(L, rq->lock);
    lua_error(L);
  }
}


/*
** A grant was delivered to the running coroutine: its releaser is on
** top, the lock at 'lockidx'.
*/
void am_dbg_granted (lua_State *L, State *st, int lockidx) {
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 4) || !push_hook(L, st, H_GRANTED)) return;
  lua_pushvalue(L, lockidx);
  lua_pushvalue(L, top);                  /* the releaser */
  call_hook(L, 2);
}


/* The running coroutine waits in the waiter at 'widx' for the lock at
   'lockidx' (queued already). */
void am_dbg_waiting (lua_State *L, State *st, int lockidx, int widx) {
  if (!lua_checkstack(L, 4) || !push_hook(L, st, H_WAITING)) return;
  lua_pushvalue(L, lockidx);
  lua_pushvalue(L, widx);
  call_hook(L, 2);
}


/* The releaser at 'idx' was given back, lost or downgraded. */
void am_dbg_released (lua_State *L, State *st, int idx) {
  idx = lua_absindex(L, idx);
  if (!lua_checkstack(L, 3) || !push_hook(L, st, H_RELEASED)) return;
  lua_pushvalue(L, idx);
  call_hook(L, 1);
}


/* An unscoped release (lock:release()) of the lock at 'idx' gave back
   a grant: the records it ended are dropped. */
void am_dbg_unscoped (lua_State *L, State *st, int idx) {
  idx = lua_absindex(L, idx);
  if (!lua_checkstack(L, 3) || !push_hook(L, st, H_UNSCOPED)) return;
  lua_pushvalue(L, idx);
  call_hook(L, 1);
}


/* A lock or keyed set was made (on top): its creation site names it. */
void am_dbg_created (lua_State *L, State *st) {
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 3) || !push_hook(L, st, H_CREATED)) return;
  lua_pushvalue(L, top);
  call_hook(L, 1);
}


/* {====================================================== core.dbg_* */

/*
** core.debug(hooks | nil): debug mode on (the hook table) or off, for
** this state.  Returns whether it was on.
*/
int am_core_debug (lua_State *L) {
  State *st = am_getstate(L);
  int was = st->dbg != LUA_NOREF;
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_istable(L, 1), 1,
                   "table or nil");
  lua_settop(L, 1);
  if (was) {
    luaL_unref(L, LUA_REGISTRYINDEX, st->dbg);
    st->dbg = LUA_NOREF;
    am_debug_on--;
  }
  if (!lua_isnil(L, 1)) {
    st->dbg = luaL_ref(L, LUA_REGISTRYINDEX);
    am_debug_on++;
  }
  lua_pushboolean(L, was);
  return 1;
}


/* Is the grant of releaser 'r' still held (not given back, not ended by
   an unscoped release, not lost)? */
static int releaser_live (const Releaser *r) {
  const Lock *lk = r->lock;
  if (r->state != S_HELD || lk->freed) return 0;
  if (lk->kind == &am_semaphore_kind) return 1;
  if (lk->kind == &am_rwlock_kind && r->weight == AM_RW_READ)
    return lk->value > 0;
  /* a generation's token: Mutex, RWLock write, ReentrantMutex */
  return lk->kind->is_locked(lk) && r->token == lk->gen;
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


/*
** core.dbg_releaser(r): whether its grant is held still, its weight and
** its lock.  Anything else: nothing.
*/
static int dbg_releaser (lua_State *L) {
  Releaser *r = (Releaser *)am_testself(L, 1, AM_T_RELEASER);
  if (r == NULL) return 0;
  lua_pushboolean(L, releaser_live(r));
  lua_pushinteger(L, r->weight);
  return 2;
}


/*
** core.dbg_waiter(w): whether the waiter is still queued (its outcome
** not decided), whether it is timed, whether it is a waitForUnlock, and
** its weight.
** A waiter handed out as a releaser since: false.
*/
static int dbg_waiter (lua_State *L) {
  Waiter *w = (Waiter *)am_testself(L, 1, AM_T_WAITER);
  if (w == NULL) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, w->r.state == S_QUEUED);
  lua_pushboolean(L, w->timed);
  lua_pushboolean(L, w->kind == W_UNLOCK);
  lua_pushinteger(L, w->r.weight);
  return 4;
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


const luaL_Reg am_debug_funcs[] = {
  {"debug", am_core_debug},
  {"dbg_lock", dbg_lock},
  {"dbg_releaser", dbg_releaser},
  {"dbg_waiter", dbg_waiter},
  {"dbg_kind", dbg_kind},
  {NULL, NULL}
};

/* }====================================================== */
