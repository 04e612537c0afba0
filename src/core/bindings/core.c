/*
** core.c: luaopen_async_mutex_core, the module's only exported symbol
** Opens the per-state scheduler, registers the module's metatables by
** name from one table, and offers the few functions the Lua layer needs.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include <math.h>

#include "../async_mutex.h"


/* core.kind(v): "Mutex", "Semaphore", "RWLock", "ReentrantMutex",
   "KeyedMutex", "KeyedSemaphore", "KeyedRWLock" or nil. */
static int core_kind (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  Keyed *kd = am_tokeyed(L, 1);
  if (lk != NULL) lua_pushstring(L, lk->kind->name);
  else if (kd != NULL) lua_pushfstring(L, "Keyed%s", kd->kind->name);
  else lua_pushnil(L);
  return 1;
}


/*
** setErrorHandler(fn | nil): who hears about errors escaping coroutines
** the module resumed; fn(err, traceback).  Returns the previous handler.
*/
static int core_setErrorHandler (lua_State *L) {
  State *st = am_getstate(L);
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_isfunction(L, 1), 1,
                   "function or nil");
  lua_settop(L, 1);
  if (st->handler == LUA_NOREF) lua_pushnil(L);
  else lua_rawgeti(L, LUA_REGISTRYINDEX, st->handler);
  luaL_unref(L, LUA_REGISTRYINDEX, st->handler);
  st->handler = LUA_NOREF;
  if (!lua_isnil(L, 1)) {
    lua_pushvalue(L, 1);
    st->handler = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 1;
}


/*
** sleep(ms): a timed acquire of weight 1 on a semaphore of value 0 that
** nobody else can reach (upvalue UV_ASLEEP): it can only time out, and a
** timed request with no error index returns nothing when it does
** (request.c, finish_request).  So a sleeper is a timed waiter like any
** other: no luv handle of its own (every deadline shares the scheduler's
** one timer), the cost of a withTimeout request that expires (less: no
** error raised and caught), and the same fate under coroutine.close (its
** deadline leaves the timer queue at once) and spurious resumes (ignored).
** Written in C rather than as a pcall of a timed acquire in Lua, which
** costs a Lua frame per sleeper and an error raised per wake-up: 100,000
** sleepers took 1,425 bytes each with their coroutines that way, 1,369
** as timed waiters under pcall, 1,297 this way.
*/
#define UV_ASLEEP  (AM_NUPVALUES + 1)

static int core_sleep (lua_State *L) {
  Request rq;
  lua_Number ms;
  if (lua_type(L, 1) != LUA_TNUMBER) return luaL_typeerror(L, 1, "number");
  ms = lua_tonumber(L, 1);
  luaL_argcheck(L, ms >= 0 && ms < HUGE_VAL, 1,
                "ms must be a non-negative finite number");
  am_check_yieldable(L, "sleep");
  lua_settop(L, 0);
  lua_pushvalue(L, lua_upvalueindex(UV_ASLEEP));            /* 1: the lock */
  rq = (Request){.kind = W_ACQUIRE, .wait = AM_TIMEOUT, .ms = ms,
                 .erridx = 0,                 /* wake up, do not raise */
                 .first = 2, .base = 1, .fname = "sleep",
                 /* checked by core.sleeper */
                 .lock = (Lock *)lua_touserdata(L, 1), .lockidx = 1,
                 .weight = 1, .priority = {0, 0, 0}};
  return am_request(L, &rq);
}


/* core.sleeper(semaphore): sleep, over that semaphore of value 0. */
static int core_sleeper (lua_State *L) {
  Lock *lk = am_tolock(L, 1);
  int uv;
  luaL_argexpected(L, lk != NULL && lk->kind == &am_semaphore_kind
                   && lk->value == 0 && lk->queue.count == 0, 1,
                   "unused semaphore of value 0");
  for (uv = 1; uv <= AM_NUPVALUES; uv++) lua_pushvalue(L, lua_upvalueindex(uv));
  lua_pushvalue(L, 1);
  lua_pushcclosure(L, core_sleep, AM_NUPVALUES + 1);
  return 1;
}


/* pending(): coroutines the module holds, queued or about to be resumed. */
static int core_pending (lua_State *L) {
  lua_pushinteger(L, (lua_Integer)am_getstate(L)->pending);
  return 1;
}


static const luaL_Reg core_funcs[] = {
  {"acquire", am_core_acquire},
  {"acquireRead", am_core_acquire_read},
  {"acquireWrite", am_core_acquire_write},
  {"limit", am_core_limit},
  {"layer", am_layer},
  {"argerror", am_core_argerror},
  {"typeerror", am_core_typeerror},
  {"usage_error", am_core_usage_error},
  {"unknown_option", am_unknown_option},
  {"cannot_yield", am_cannot_yield},
  {"withTimeout", am_withTimeout},
  {"tryAcquire", am_tryAcquire},
  {"withLease", am_withLease},
  {"withSignal", am_withSignal},
  {"signal", am_signal},
  {"kind", core_kind},
  {"setErrorHandler", core_setErrorHandler},
  {"pending", core_pending},
  {"query", am_query},
  {"spawn", am_spawn},
  {"sleeper", core_sleeper},
  {"group", am_group},
  {"run_main", am_run_main},
  {"outcome", am_outcome},
  {"failure", am_failure},
  {"waiting", am_waiting},
  {"collect", am_collect},
  {"clock", am_core_clock},
  {NULL, NULL}
};


/*
** What each metatable holds, by type: metamethods, methods (the __index
** table) and, for public types, the functions of module[class] ('new').
** A decorated type has the methods of the type it decorates, and its own
** requests (decorated.c); its metatable is not registered.
*/
typedef struct TypeReg {
  const char *class;
  const luaL_Reg *metamethods, *methods, *functions;
  int decorated;              /* a decorated type, of type 'decorates' */
  AmType decorates;
} TypeReg;

#define LOCKTYPE(T, C, kind, mm, m, cl, dm)  [AM_T_##T] = {#C, mm, m, cl},
#define DECORATED(T, C, kind, mm, m, cl, dm)  \
  [AM_T_DECORATED_##T] = {.methods = dm, .decorated = 1, \
                          .decorates = AM_T_##T},
static const TypeReg types[AM_NTYPES] = {
  AM_LOCK_KINDS(LOCKTYPE) AM_KEYED_KINDS(LOCKTYPE)
  AM_LOCK_KINDS(DECORATED) AM_KEYED_KINDS(DECORATED)
  [AM_T_RELEASER] = {NULL, am_releaser_metamethods,
                     am_releaser_methods, NULL},
  [AM_T_WAITER] = {NULL, am_waiter_metamethods, NULL, NULL},
  [AM_T_TASK] = {NULL, am_task_metamethods, am_task_methods, NULL},
  [AM_T_GROUP] = {NULL, am_group_metamethods, am_group_methods, NULL},
  [AM_T_SIGNAL] = {NULL, am_signal_metamethods, NULL, NULL},
};

/*
** Sets the functions 'l' into the table at 'idx', each with the module's
** upvalues, which sit at stack indices 1..AM_NUPVALUES, and 'extra' more
** from the top of the stack (popped).
*/
static void setfuncs (lua_State *L, int idx, const luaL_Reg *l, int extra) {
  int i;
  idx = lua_absindex(L, idx);
  for (i = 1; i <= AM_NUPVALUES; i++) {
    lua_pushvalue(L, i);
    lua_insert(L, -1 - extra);
  }
  lua_pushvalue(L, idx);
  lua_insert(L, -1 - AM_NUPVALUES - extra);
  luaL_setfuncs(L, l, AM_NUPVALUES + extra);
  lua_pop(L, 1);
}


/* The LockKind of each lock type (of a keyed set's locks). */
#define KIND(T, C, kind, ...)  [AM_T_##T] = &kind,
static const LockKind *const kinds[AM_NLOCKTYPES] = {
  AM_LOCK_KINDS(KIND) AM_KEYED_KINDS(KIND)
};


/*
** Sets type 't''s functions 'own' into the table at 'idx'.  A lock
** type's have its LockKind as one more upvalue (AM_KIND_UPVALUE); a kind's
** are merged over the ones every kind shares ('shared', lock.c), and a
** NULL function in 'own' removes the shared one of its name.
*/
static void settypefuncs (lua_State *L, int idx, AmType t,
                          const luaL_Reg *shared, const luaL_Reg *own) {
  idx = lua_absindex(L, idx);
  if (t >= AM_NLOCKTYPES) {
    setfuncs(L, idx, own, 0);
    return;
  }
  if (t < AM_NKINDS) {
    lua_pushlightuserdata(L, (void *)kinds[t]);
    setfuncs(L, idx, shared, 1);
  }
  lua_pushlightuserdata(L, (void *)kinds[t]);
  setfuncs(L, idx, own, 1);
  for (; own->name != NULL; own++)
    if (own->func == NULL) {
      lua_pushnil(L);
      lua_setfield(L, idx, own->name);
    }
}


/* What every keyed set has beyond its kind's own methods: km:query(), a
   binding (query.c) that a kind, lower, does not name. */
static const luaL_Reg keyed_methods[] = {
  {"query", am_keyed_query},
  {NULL, NULL}
};


/*
** Fills type 't''s metatable (at its upvalue's stack index): metamethods,
** an __index table of methods; module[class] = {new = ..., methods =
** ..., self = {[metatable] = true, ...}}.  Registered metatables are
** shared by every copy of the module in this lua_State.
*/
static void open_type (lua_State *L, AmType t, int module) {
  const TypeReg *r = &types[t];
  int mt = 2 + t;
  if (r->metamethods != NULL)
    settypefuncs(L, mt, t, am_lock_metamethods, r->metamethods);
  if (r->class == NULL) {                   /* private: methods only */
    if (r->methods != NULL) {
      lua_newtable(L);
      setfuncs(L, -1, r->methods, 0);
      lua_setfield(L, mt, "__index");
    }
    return;
  }
  if (lua_getfield(L, mt, "__index") != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, mt, "__index");
  }
  settypefuncs(L, -1, t, am_lock_methods, r->methods);
  if (t >= AM_FIRST_KEYED && t < AM_NLOCKTYPES)
    settypefuncs(L, -1, t, NULL, keyed_methods);
  lua_createtable(L, 0, 4);                 /* module[class] */
  lua_insert(L, -2);
  lua_setfield(L, -2, "methods");
  settypefuncs(L, -1, t, am_lock_class, r->functions);
  lua_createtable(L, 0, 2);                 /* the metatables of self */
  lua_pushvalue(L, mt);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_setfield(L, -2, "self");
  lua_setfield(L, module, r->class);
}


/*
** Fills decorated type 'd''s metatable: its __index has the methods of
** the type it decorates, and its own requests, which know their type
** (an extra upvalue); module[class].decorated is that __index.
*/
static void open_decorated (lua_State *L, AmType d, AmType t, int module) {
  int mt = 2 + d;
  lua_getfield(L, module, types[t].class);    /* module[class] */
  lua_newtable(L);                            /* __index */
  lua_getfield(L, -2, "methods");
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {              /* copy the lock's methods */
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -5);
  }
  lua_pop(L, 1);                              /* methods */
  lua_pushinteger(L, d);
  setfuncs(L, -2, types[d].methods, 1);
  lua_pushvalue(L, -1);
  lua_setfield(L, mt, "__index");
  lua_setfield(L, -2, "decorated");
  lua_getfield(L, -1, "self");
  lua_pushvalue(L, mt);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);                          /* self[decorated mt] */
  lua_pop(L, 2);
}


/*
** The closures every task's coroutine runs, and a join waits in, with
** the module's upvalues (task.c), made by the first copy of the module:
** pushing one to start a task allocates nothing.
*/
static void open_tasks (lua_State *L) {
  static const luaL_Reg closures[] = {
    {"body", am_task_body},
    {"gate_wait", am_gate_wait},
    {NULL, NULL}
  };
  State *st = (State *)lua_touserdata(L, 1);
  if (st->task_body != LUA_NOREF) return;
  lua_newtable(L);
  setfuncs(L, -1, closures, 0);
  lua_getfield(L, -1, "body");
  st->task_body = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, -1, "gate_wait");
  st->gate_wait = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
}


/* What the scheduler and the engine call above them (async_mutex.h). */
static const StateHooks hooks = {
  am_waiter_abandon,
  am_timer_expired,
  am_do_chore,
  am_task_waits
};


__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_core (lua_State *L) {
  int t, module;
  lua_settop(L, 0);
  /* the state, a metatable per type and the module, then setfuncs's
     copies of the upvalues and what open_type and open_decorated push:
     past LUA_MINSTACK, which a build without -flto overran (its writes
     past the stack's end hung the first require after luv's) */
  luaL_checkstack(L, 2 * AM_NUPVALUES + 16, "async_mutex.core");
  am_state_open(L, &hooks);                 /* 1: the state */
  for (t = 0; t < AM_NTYPES; t++) {         /* 2 + t: type t's metatable */
    if (!types[t].decorated)
      luaL_newmetatable(L, am_tnames[t]);
    else {                                  /* one per copy of the module */
      lua_createtable(L, 0, 2);
      lua_pushstring(L, am_tnames[t]);
      lua_setfield(L, -2, "__name");
    }
  }
  lua_newtable(L);                          /* the module */
  module = lua_gettop(L);
  setfuncs(L, module, core_funcs, 0);
  open_tasks(L);
  setfuncs(L, module, am_debug_funcs, 0);
  for (t = 0; t < AM_NTYPES; t++)
    if (!types[t].decorated) open_type(L, (AmType)t, module);
  for (t = 0; t < AM_NTYPES; t++)
    if (types[t].decorated)
      open_decorated(L, (AmType)t, types[t].decorates, module);
  lua_getfield(L, 2 + AM_T_RELEASER, "__index");
  for (t = 0; t < AM_NKINDS; t++)           /* a kind's releaser methods */
    if (kinds[t]->releaser_methods != NULL)
      setfuncs(L, -1, kinds[t]->releaser_methods, 0);
  lua_pop(L, 1);
  lua_pushliteral(L, AM_E_TIMEOUT);
  lua_setfield(L, -2, "E_TIMEOUT");
  lua_pushliteral(L, AM_E_ALREADY_LOCKED);
  lua_setfield(L, -2, "E_ALREADY_LOCKED");
  lua_pushliteral(L, AM_E_CANCELED);
  lua_setfield(L, -2, "E_CANCELED");
  lua_pushliteral(L, AM_E_MAX_PENDING);
  lua_setfield(L, -2, "E_MAX_PENDING");
  lua_pushliteral(L, AM_E_LOST);
  lua_setfield(L, -2, "E_LOST");
  lua_pushliteral(L, AM_E_DEADLOCK);
  lua_setfield(L, -2, "E_DEADLOCK");
  return 1;
}
