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
#define _POSIX_C_SOURCE 199309L     /* clock_gettime */

#include <stdio.h>
#include <time.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


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
** The hook table (async_mutex.debug: hook_table): the Lua hooks, then the
** tables the hot paths update from C, then flags.
**
** An owner record is a table with the fields R_* (async_mutex.debug reads
** them by number), in two chains: the records of its lock (from
** T_BYLOCK[lock], through R_NEXT_LOCK) and those of its holder (from
** T_HELDBY[coroutine], through R_NEXT_CO).  Keyed by the lock and the
** coroutine, which a pair or a hand-off reuses, the two tables are
** updated in place: a chain per key rather than a set keyed by releaser,
** whose fresh key at each grant would make the table grow and rehash.
** Both hold their keys strongly: a lock whose releaser was dropped (the
** forgotten release) stays in the report with its holder.
*/
enum { H_REQUEST = 1, H_GRANTED, H_WAITING, H_RELEASED, H_UNSCOPED,
       H_CREATED,
       T_BYLOCK,              /* lock -> its first record */
       T_HELDBY,              /* coroutine -> its first record */
       F_TRACEBACK,           /* true: a traceback per grant */
       F_LUA,                 /* true: call the granted and released hooks */
       T_WAITING };           /* coroutine -> what it waits for (weak) */

/* The flags of the hook table, kept in State.dbg_flags: a grant and a
   release read them without a table access. */
#define DF_TRACEBACK  1
#define DF_LUA        2

enum { R_LOCK = 1, R_RELEASER, R_HOLDER, R_SINCE, R_FN, R_LINE, R_WEIGHT,
       R_WHERE, R_NEXT_LOCK, R_NEXT_CO, R_NFIELDS = 14 };



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
** Does the running coroutine hold anything, as recorded?  (The hook table
** at 'D'.)  One that holds nothing can neither close a wait-for cycle
** (nobody waits for it) nor record a lockdep edge: its requests and waits
** need no Lua.
*/
static int holds_any (lua_State *L, int D) {
  int any;
  lua_rawgeti(L, D, T_HELDBY);
  lua_pushthread(L);
  any = lua_rawget(L, -2) == LUA_TTABLE;
  lua_pop(L, 2);
  return any;
}


/* A queue key as the Lua number it was (queue.c: canonical keys). */
static void push_key (lua_State *L, const Key *k) {
  if (k->flt) lua_pushnumber(L, k->n);
  else lua_pushinteger(L, k->i);
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
  if (rq->wait == AM_TRY) return;       /* never waits: never deadlocks */
  if (!lua_checkstack(L, 8) || lk->st->dbg == LUA_NOREF || lk->st->closed)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lk->st->dbg);
  if (!holds_any(L, lua_gettop(L))) {
    lua_pop(L, 1);
    return;
  }
  lua_rawgeti(L, -1, H_REQUEST);
  lua_remove(L, -2);
  would_wait = !(lk->kind->reentrant && lk->owner == L && lk->value <= 0)
               && !am_can_lock_now(lk, rq->weight, &rq->priority);
  lua_pushvalue(L, rq->lockidx);
  lua_pushinteger(L, rq->weight);
  lua_pushboolean(L, rq->kind == W_UNLOCK);
  lua_pushboolean(L, would_wait);
  lua_pushinteger(L, rq->wait);
  push_key(L, &rq->priority);
  if (lua_pcall(L, 6, 0, 0) != LUA_OK) {
    am_settle(L, rq->lock);
    lua_error(L);
  }
}


/*
** The level of the user's frame that made the request: the first Lua
** frame above the request's C function that is not the Lua layer's
** (runExclusive and the like); 0 if none.
*/
static int user_level (lua_State *L, State *st, lua_Debug *ar) {
  const char *layer = NULL;
  int level;
  if (st->layer_source != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_source);
    layer = lua_tostring(L, -1);          /* anchored by the registry */
    lua_pop(L, 1);
  }
  for (level = 1; lua_getstack(L, level, ar); level++) {
    lua_getinfo(L, "S", ar);
    if (ar->what[0] != 'C' && (layer == NULL || strcmp(ar->source, layer) != 0))
      return level;
  }
  return 0;
}


/* Pushes the record at 'rec' (absolute) on the chain map[key]. */
static void push_chain (lua_State *L, int map, int key, int rec, int link) {
  lua_pushvalue(L, key);
  lua_rawget(L, map);
  lua_rawseti(L, rec, link);
  lua_pushvalue(L, key);
  lua_pushvalue(L, rec);
  lua_rawset(L, map);
}


/*
** Unlinks from the chain map[key] (through field 'link') the record that
** is the value at 'v' ('field' 0), or whose field 'field' is; pushes it,
** or returns 0, pushing nothing.  Indices absolute.  The head is the
** usual case: the latest hold of the lock or coroutine.
*/
static int unlink_chain (lua_State *L, int map, int key, int link,
                         int field, int v) {
  /* two slots, reused along the chain: a long chain (a semaphore's many
     holds) must not grow the stack by one slot per record */
  int base = lua_gettop(L), prev = base + 1, node = base + 2;
  lua_pushnil(L);                             /* no previous record yet */
  lua_pushvalue(L, key);
  lua_rawget(L, map);
  while (lua_type(L, node) == LUA_TTABLE) {
    int hit;
    if (field == 0) hit = lua_rawequal(L, node, v);
    else {
      lua_rawgeti(L, node, field);
      hit = lua_rawequal(L, -1, v);
      lua_pop(L, 1);
    }
    if (hit) {
      if (lua_isnil(L, prev)) {
        lua_pushvalue(L, key);
        lua_rawgeti(L, node, link);
        lua_rawset(L, map);                   /* map[key] = its next */
      }
      else {
        lua_rawgeti(L, node, link);
        lua_rawseti(L, prev, link);
      }
      lua_replace(L, prev);                   /* the record, at base + 1 */
      return 1;
    }
    lua_copy(L, node, prev);
    lua_rawgeti(L, node, link);
    lua_replace(L, node);
  }
  lua_settop(L, base);
  return 0;
}


/*
** A grant was delivered to the running coroutine: its releaser is on
** top, the lock at 'lockidx'.  Its owner record is made here, in C (the
** cost of debug mode is mostly this): the lock, the releaser, the holder,
** the loop time, the acquire site (function and line; a traceback with
** the option), the weight; indexed by releaser, lock and holder.  The Lua
** hook runs only when it has work (a key's lock, a long-hold check).
*/
static int record_grant (lua_State *L) {
  const int D = 1, lockidx = 2, top = 3;
  State *st = (State *)lua_touserdata(L, 4);
  Releaser *r = (Releaser *)lua_touserdata(L, top);
  Lock *lk = r->lock;
  int rec, co, level;
  lua_Debug ar;
  lua_createtable(L, R_NFIELDS, 0);
  rec = lua_gettop(L);
  lua_pushvalue(L, lockidx);
  lua_rawseti(L, rec, R_LOCK);
  lua_pushvalue(L, top);
  lua_rawseti(L, rec, R_RELEASER);
  lua_pushthread(L);
  co = lua_gettop(L);
  lua_pushvalue(L, co);
  lua_rawseti(L, rec, R_HOLDER);
  lua_pushnumber(L, clock_ms());
  lua_rawseti(L, rec, R_SINCE);
  lua_pushinteger(L, r->weight);
  lua_rawseti(L, rec, R_WEIGHT);
  level = user_level(L, st, &ar);
  if (level > 0) {
    lua_getinfo(L, "fl", &ar);                /* pushes the function */
    lua_rawseti(L, rec, R_FN);
    lua_pushinteger(L, ar.currentline);
    lua_rawseti(L, rec, R_LINE);
    if (st->dbg_flags & DF_TRACEBACK) {
      luaL_traceback(L, L, NULL, level);
      lua_rawseti(L, rec, R_WHERE);
    }
  }
  lua_rawgeti(L, D, T_BYLOCK);
  push_chain(L, lua_gettop(L), lockidx, rec, R_NEXT_LOCK);
  lua_pop(L, 1);
  lua_rawgeti(L, D, T_HELDBY);
  push_chain(L, lua_gettop(L), co, rec, R_NEXT_CO);
  lua_pop(L, 1);
  if (lua_toboolean(L, 5)) {                /* it waits no more */
    lua_rawgeti(L, D, T_WAITING);
    lua_pushvalue(L, co);
    lua_pushnil(L);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
  if (lk->keyed != NULL || (st->dbg_flags & DF_LUA)) {
    lua_rawgeti(L, D, H_GRANTED);
    lua_pushvalue(L, rec);
    call_hook(L, 1);
  }
  return 0;
}


/*
** (record_grant makes the record, protected: it allocates, and a memory
** error there must not lose the grant being delivered.)
*/
void am_dbg_granted (lua_State *L, State *st, int lockidx, int waited) {
  int top = lua_gettop(L);
  Releaser *r = (Releaser *)lua_touserdata(L, top);
  if (r == NULL || st->dbg == LUA_NOREF || st->closed
      || !lua_checkstack(L, 20))
    return;
  lockidx = lua_absindex(L, lockidx);
  lua_pushcfunction(L, record_grant);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dbg);
  lua_pushvalue(L, lockidx);
  lua_pushvalue(L, top);
  lua_pushlightuserdata(L, st);
  lua_pushboolean(L, waited);
  if (lua_pcall(L, 5, 0, 0) != LUA_OK) {
    fprintf(stderr, "async_mutex.debug: no owner record: %s\n",
            lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?");
    fflush(stderr);
  }
  lua_settop(L, top);
}


/* The running coroutine waits in the waiter at 'widx' for the lock at
   'lockidx' (queued already): recorded if it holds anything. */
void am_dbg_waiting (lua_State *L, State *st, int lockidx, int widx) {
  if (!lua_checkstack(L, 6) || st->dbg == LUA_NOREF || st->closed) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dbg);
  if (!holds_any(L, lua_gettop(L))) {       /* nobody can wait for it */
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  push_hook(L, st, H_WAITING);
  lua_pushvalue(L, lockidx);
  lua_pushvalue(L, widx);
  call_hook(L, 2);
}


/* The releaser at 'idx' was given back, lost or downgraded: its record
   ends (in C, as it was made). */
void am_dbg_released (lua_State *L, State *st, int idx) {
  int top = lua_gettop(L);
  int D, rec;
  idx = lua_absindex(L, idx);
  if (st->dbg == LUA_NOREF || st->closed || !lua_checkstack(L, 12)) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->dbg);
  D = lua_gettop(L);
  lua_rawgeti(L, D, T_BYLOCK);
  lua_getiuservalue(L, idx, 1);             /* its lock */
  if (unlink_chain(L, D + 1, D + 2, R_NEXT_LOCK, R_RELEASER, idx)) {
    rec = lua_gettop(L);
    lua_rawgeti(L, D, T_HELDBY);
    lua_rawgeti(L, rec, R_HOLDER);
    unlink_chain(L, rec + 1, rec + 2, R_NEXT_CO, 0, rec);
    lua_settop(L, rec);
    lua_pushnil(L);                           /* ended: no releaser */
    lua_rawseti(L, rec, R_RELEASER);
    if (st->dbg_flags & DF_LUA) {
      lua_rawgeti(L, D, H_RELEASED);
      lua_pushvalue(L, rec);
      call_hook(L, 1);
    }
  }
  lua_settop(L, top);
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
  st->dbg_flags = 0;
  if (!lua_isnil(L, 1)) {
    if (lua_rawgeti(L, 1, F_TRACEBACK) != LUA_TNIL && lua_toboolean(L, -1))
      st->dbg_flags |= DF_TRACEBACK;
    if (lua_rawgeti(L, 1, F_LUA) != LUA_TNIL && lua_toboolean(L, -1))
      st->dbg_flags |= DF_LUA;
    lua_settop(L, 1);
    st->dbg = luaL_ref(L, LUA_REGISTRYINDEX);
    am_debug_on++;
  }
  lua_pushboolean(L, was);
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


/*
** core.dbg_releaser(r): whether its grant is held still, its weight and
** its lock.  Anything else: nothing.
*/
static int dbg_releaser (lua_State *L) {
  Releaser *r = (Releaser *)am_testself(L, 1, AM_T_RELEASER);
  if (r == NULL) return 0;
  lua_pushboolean(L, am_releaser_live(r));
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
  lua_pushboolean(L, w->r.timed);
  lua_pushboolean(L, w->r.kind == W_UNLOCK);
  lua_pushinteger(L, w->r.weight);
  return 4;
}


/*
** Appends to the table at 't' (from 'n' + 1) the waiters of queue 'q' in
** queue order, each as { coroutine, weight, priority, unlock, timed };
** returns the new count.
*/
static int push_queue (lua_State *L, const Queue *q, int t, int n,
                       int unlock) {
  Bucket **b;
  uint32_t i;
  if (q->n == 0) return n;
  b = (Bucket **)lua_newuserdatauv(L, q->n * sizeof(*b), 0);
  am_queue_ordered(q, b);
  for (i = 0; i < q->n; i++) {
    Waiter *w;
    for (w = am_bucket_next(b[i], NULL); w != NULL;
         w = am_bucket_next(b[i], w)) {
      lua_createtable(L, 5, 0);
      am_push_anchored(L, w);
      lua_rawseti(L, -2, 1);
      lua_pushinteger(L, w->r.weight);
      lua_rawseti(L, -2, 2);
      push_key(L, &b[i]->key);
      lua_rawseti(L, -2, 3);
      lua_pushboolean(L, unlock);
      lua_rawseti(L, -2, 4);
      lua_pushboolean(L, w->r.timed);
      lua_rawseti(L, -2, 5);
      lua_rawseti(L, t, ++n);
    }
  }
  lua_pop(L, 1);
  return n;
}


/*
** core.dbg_queue(lock): its queued acquirers in queue order (priority
** descending, then arrival: the order the grant rule serves them), then
** its waitForUnlock waiters; each { coroutine, weight, priority, unlock,
** timed } (docs/debug.md, Deadlocks).
*/
static int dbg_queue (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  int n;
  size_t i;
  luaL_argexpected(L, lk != NULL, 1, "lock");
  luaL_checkstack(L, 6, NULL);
  lua_createtable(L, (int)(lk->queue.count + lk->nunlock), 0);
  n = push_queue(L, &lk->queue, 2, 0, 0);
  for (i = 0; i < lk->nweights; i++)
    n = push_queue(L, &lk->unlock[i].queue, 2, n, 1);
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


const luaL_Reg am_debug_funcs[] = {
  {"debug", am_core_debug},
  {"dbg_lock", dbg_lock},
  {"dbg_releaser", dbg_releaser},
  {"dbg_waiter", dbg_waiter},
  {"dbg_queue", dbg_queue},
  {"dbg_kind", dbg_kind},
  {"dbg_now", dbg_now},
  {NULL, NULL}
};

/* }====================================================== */
