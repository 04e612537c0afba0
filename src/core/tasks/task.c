/*
** task.c: tasks (am.spawn) and groups (am.group)
** A task is a coroutine whose body is 'task_body': it calls the user's
** function under a protected call, so that however the coroutine is
** resumed (by the scheduler, by the Redis client, by the user's own luv
** callback) the task records how it ended: its results, or its error
** with the traceback taken where it was raised (docs/semantics.md,
** Tasks).  The task userdata is the handle: join, cancel, status.  Its
** body's frame also marks the task to-be-closed, so a coroutine closed
** before its function returned (t:cancel(), coroutine.close, a group
** cancelling its members) ends the task as canceled, with the releasers
** of the function's own <close> variables run first.
**
** A group is a set of tasks: the first to fail cancels the others, and
** its join raises that error.  Joiners of a task or a group wait on a
** gate: a private semaphore of value 0 (an internal lock, so debug mode
** does not watch it) made at the first join of something still running
** and opened when it ends, so that a joiner is a waiter like any other
** (anchored, counted by am.pending(), listed by am.stranded(), closed by
** coroutine.close).
**
** A failure nobody has taken (no join raised it, no group holds it) is
** reported, to the error handler or stderr, at the end of the loop turn
** after the one it happened in (scheduler.c, chores): a join made in the
** same stretch of code, or by a joiner the failure woke, takes it first.
*/

#define LUA_LIB

#include <assert.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "../../error_text.h"



/*
** LAYOUT: a task is a userdata of 4 bytes with one user value: 60 bytes
** on Lua's heap (docs/bench.md: at most 64 beyond its coroutine).
** User value 1 is the coroutine while the task runs, then what it ended
** with: nothing (nil), its only result, its results packed in a table
** (F_PACKED), or {error, traceback} (failed).  A member of a group has a
** second user value, the group.  The traceback of an error being raised
** goes into a slot of the body's frame, which a new coroutine's stack has
** room for already; a task's gate lives in a registry table, only while
** someone waits for it.
*/
typedef struct Task {
  unsigned char status;         /* T_* */
  unsigned char spare;
  unsigned short flags;         /* F_* */
} Task;

enum { T_LIVE, T_DONE, T_FAILED, T_CANCELED };

#define F_PACKED    0x0001      /* user value 1 is a results table */
#define F_OBSERVED  0x0002      /* its failure was taken: a join raised
                                   it, its group holds it, am.run read it */
#define F_CANCEL    0x0004      /* cancel requested */
#define F_GATE      0x0008      /* has a gate (State.gates) */
#define F_MAIN      0x0010      /* am.run's function: stops the loop when
                                   it fails */
#define F_CHORE     0x0020      /* in the chores list (scheduler.c) */
#define F_REPORTED  0x0040      /* its failure was reported */
#define F_COUNTED   0x0080      /* cancelled while running, still so at
                                   a loop turn: its next wait hands it to
                                   the chores (State.ncanceling) */
#define F_EMPTY     0x0100      /* done with no results (user value 1 nil) */
#define F_GROUP     0x0200      /* a member of a group (user value 2) */

/*
** A group: how many of its members run, and how it stands.  User values:
** 1 its members (a set), 2 the first failure, {error, traceback}.
*/
typedef struct Group {
  lua_Integer live;             /* members that have not ended */
  unsigned short flags;         /* G_* */
} Group;

#define G_CLOSED    0x0001      /* its __close ran: no more spawns */
#define G_FAILED    0x0002      /* a member failed: user value 2 */
#define G_OBSERVED  0x0004      /* a join raised that error */
#define G_GATE      0x0008
#define G_CHORE     0x0010
#define G_REPORTED  0x0020
#define G_CLOSING   0x0040      /* its __close joins it (a guard slot) */

/*
** The registry field of the failure ({error, traceback}) a join raised
** last: a task's message handler that meets its error again gives both
** tracebacks, so that am.run's report of a failure a join passed on
** shows where it was raised first.
*/
#define RETHROWN  "async_mutex rethrown"     /* (no metatable's name) */

/* Raises the error of the failure {error, traceback} on top, again. */
static int rethrow (lua_State *L) {
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, RETHROWN);
  lua_rawgeti(L, -1, 1);
  return lua_error(L);
}

/* The slots of a task's body frame (task_body). */
#define B_TASK   1              /* the task, to-be-closed */
#define B_TB     2              /* the traceback of an error (task_msgh) */
#define B_MSGH   3
#define B_FN     4              /* the function, then its results */


/* By the registry's metatables: chores run from the scheduler's
   callbacks, which lack the module's upvalues (am_testself). */
static Task *totask (lua_State *L, int idx) {
  return (Task *)luaL_testudata(L, idx, AM_TASK);
}

static Group *togroup (lua_State *L, int idx) {
  return (Group *)luaL_testudata(L, idx, AM_GROUP);
}


/* {====================================================== gates */

/*
** Pushes the gate of the task or group at 'idx' (State.gates maps them
** to it), making one when 'make' and there is none; or pushes nil.  A
** gate is a semaphore of value 0 that nobody acquires: its waitForUnlock
** waiters are the joiners, let go by opening it (value 1).  User value 2
** is what it is the gate of (core.waiting names that).
*/
static void push_gate (lua_State *L, State *st, int idx, int make) {
  Lock *lk;
  idx = lua_absindex(L, idx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->gates);
  lua_pushvalue(L, idx);
  if (lua_rawget(L, -2) != LUA_TNIL || !make) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  lk = (Lock *)lua_newuserdatauv(L, sizeof(Lock), 2);
  am_lock_init(lk, &am_semaphore_kind, st, 0);
  lk->internal = 1;                     /* debug mode does not watch it */
  am_pushmt(L, AM_T_SEMAPHORE);         /* its __gc frees its queues */
  lua_setmetatable(L, -2);
  lua_pushliteral(L, AM_E_CANCELED);    /* (nobody cancels a gate) */
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, idx);
  lua_setiuservalue(L, -2, 2);
  lua_pushvalue(L, idx);
  lua_pushvalue(L, -2);
  lua_rawset(L, -4);                    /* gates[obj] = gate */
  lua_remove(L, -2);
}


/*
** Opens the gate of the object at 'idx': its joiners are made ready (a
** waitForUnlock of weight 1 now fits: rules.c, am_drain_unlock), and it leaves the gates
** table (each joiner keeps it on its own stack).
*/
static void open_gate (lua_State *L, State *st, int idx) {
  Lock *lk;
  idx = lua_absindex(L, idx);
  push_gate(L, st, idx, 0);
  lk = (Lock *)lua_touserdata(L, -1);
  if (lk != NULL) {
    lk->value = 1;
    am_dispatch(L, lk);
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->gates);
    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}


/*
** gate_wait(gate): waits until the gate opens, as a waitForUnlock of
** weight 1 (a closure with the module's upvalues: a waiter takes its
** metatable from them).  Its caller checked that the coroutine can yield.
*/
int am_gate_wait (lua_State *L) {
  Request rq = {.kind = W_UNLOCK, .wait = AM_WAIT, .first = 2, .base = 1,
                .fname = "join", .lock = (Lock *)lua_touserdata(L, 1),
                .lockidx = 1, .weight = 1, .priority = {0, 0, 0}};
  lua_settop(L, 1);
  return am_request(L, &rq);
}


/*
** Waits on the gate of the object at index 1 (made if needed), then goes
** on in 'k' (a join's continuation, which looks again).
*/
static int wait_gate (lua_State *L, State *st, lua_KFunction k) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->gate_wait);
  push_gate(L, st, 1, 1);
  lua_callk(L, 1, 0, 0, k);
  return k(L, LUA_OK, 0);
}

/* }====================================================== */


/* {====================================================== ending */

static int cancel_members (lua_State *L, State *st, int gidx);

/*
** Member 'tidx' of the group at 'gidx' ended: it leaves the set; the
** first failure becomes the group's (the task's own is taken, not
** reported) and cancels the others.  When none is left, the group's
** joiners go on.
*/
static void member_ended (lua_State *L, State *st, int gidx, int tidx) {
  Group *g = (Group *)lua_touserdata(L, gidx);
  Task *t = (Task *)lua_touserdata(L, tidx);
  lua_getiuservalue(L, gidx, 1);
  lua_pushvalue(L, tidx);
  lua_pushnil(L);
  lua_rawset(L, -3);                          /* members[t] = nil */
  lua_pop(L, 1);
  g->live--;
  if (t->status == T_FAILED && !(g->flags & G_FAILED)) {
    g->flags |= G_FAILED;
    t->flags |= F_OBSERVED;                   /* the group holds it */
    lua_getiuservalue(L, tidx, 1);            /* {error, traceback} */
    lua_setiuservalue(L, gidx, 2);
    if (!(g->flags & G_CHORE)) {
      g->flags |= G_CHORE;
      am_chore(L, st, gidx);
    }
    cancel_members(L, st, gidx);
  }
  if (g->live == 0 && (g->flags & G_GATE)) {
    g->flags &= ~G_GATE;
    open_gate(L, st, gidx);
  }
}


/*
** The task at 'tidx' has ended (its status and outcome are set): its
** joiners go on, its group hears of it, and a failure nobody holds
** becomes a chore: reported at the end of the next loop turn unless
** someone takes it by then.  am.run's function stops the loop instead
** (init.lua raises its error).
*/
static void report_now (lua_State *L, State *st, int idx);

static void end_task (lua_State *L, State *st, Task *t, int tidx) {
  tidx = lua_absindex(L, tidx);
  if (t->flags & F_COUNTED) {
    t->flags &= ~F_COUNTED;
    st->ncanceling--;
  }
  /* the common case, a task done that nobody joins: nothing to tell */
  if (!(t->flags & (F_GATE | F_GROUP | F_MAIN)) && t->status == T_DONE)
    return;
  if (t->flags & F_GATE) {
    t->flags &= ~F_GATE;
    open_gate(L, st, tidx);
  }
  if (t->flags & F_GROUP) {
    lua_getiuservalue(L, tidx, 2);
    member_ended(L, st, lua_gettop(L), tidx);
    lua_pop(L, 1);
  }
  if (t->flags & F_MAIN) {
    if (t->status != T_DONE) {
      t->flags |= F_OBSERVED;                 /* am.run raises it */
      am_sync(L, st);
      am_stop_loop(L, st);
      return;
    }
  }
  else if (t->status == T_FAILED && !(t->flags & (F_OBSERVED | F_CHORE))) {
    if (st->reporting > 0)        /* raised by a report's own Lua code (an */
      report_now(L, st, tidx);    /* error's __tostring, the handler): at */
    else {                        /* once, so a report that makes failures */
      t->flags |= F_CHORE;        /* recurses, bounded by the C stack, */
      am_chore(L, st, tidx);      /* rather than loop from turn to turn */
    }
  }
  am_sync(L, st);
}

/* }====================================================== */


/* {====================================================== the body */

/*
** The message handler of a task's protected call: it keeps the
** traceback where the error was raised in the body's frame (slot B_TB;
** the outermost frame of this coroutine) and leaves the error value as it
** is, so the <close> variables of the frames it unwinds see the error the
** function raised, as they would outside a task.
*/
static int task_msgh (lua_State *L) {
  lua_Debug ar;
  int level = 1;
  while (lua_getstack(L, level + 1, &ar)) level++;
  lua_settop(L, 1);                           /* err */
  luaL_traceback(L, L, NULL, 1);              /* err tb */
  /* a failure a join raised again: where it was raised first, then here */
  if (lua_getfield(L, LUA_REGISTRYINDEX, RETHROWN) == LUA_TTABLE) {
    lua_rawgeti(L, 3, 1);                     /* err tb failure its_err */
    if (lua_rawequal(L, 4, 1)) {
      lua_rawgeti(L, 3, 2);
      lua_pushliteral(L, "\nraised again by a join:\n");
      lua_pushvalue(L, 2);
      lua_concat(L, 3);
      lua_replace(L, 2);                      /* err tb' */
    }
  }
  lua_settop(L, 2);
  if (!lua_getstack(L, level, &ar) || lua_setlocal(L, &ar, B_TB) == NULL)
    lua_pop(L, 1);                /* (lua_setlocal pops it when it sets) */
  lua_settop(L, 1);
  return 1;
}


/*
** The body of a task's coroutine, and its continuation: calls the
** function (at B_FN, its arguments above) protected, then records the
** outcome in the task.  Stack: task nil msgh fn args... (spawn_task).
*/
static int task_body_k (lua_State *L, int status, lua_KContext ctx) {
  State *st = am_getstate(L);
  Task *t = (Task *)lua_touserdata(L, B_TASK);
  (void)ctx;
  if (status == LUA_OK || status == LUA_YIELD) {
    int nres = lua_gettop(L) - B_MSGH;
    if (t->flags & F_CANCEL) {                /* cancelled while it ran */
      lua_pushnil(L);
      t->status = T_CANCELED;
    }
    else if (nres <= 1) {
      if (nres == 0) {
        lua_pushnil(L);
        t->flags |= F_EMPTY;
      }
      t->status = T_DONE;
    }
    else {
      int i;
      lua_createtable(L, nres, 1);
      for (i = 1; i <= nres; i++) {
        lua_pushvalue(L, B_MSGH + i);
        lua_rawseti(L, -2, i);
      }
      lua_pushinteger(L, nres);
      lua_setfield(L, -2, "n");
      t->flags |= F_PACKED;
      t->status = T_DONE;
    }
  }
  else {                                      /* the error on top */
    lua_createtable(L, 2, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    if (lua_type(L, B_TB) == LUA_TSTRING)
      lua_pushvalue(L, B_TB);
    else                                      /* no handler ran: memory */
      lua_pushliteral(L, "stack traceback:\n\t(none)");
    lua_rawseti(L, -2, 2);
    t->status = T_FAILED;
  }
  lua_setiuservalue(L, B_TASK, 1);            /* no more the coroutine */
  lua_settop(L, B_TASK);
  end_task(L, st, t, B_TASK);
  return 0;
}

int am_task_body (lua_State *L) {
  lua_toclose(L, B_TASK);           /* closed early: task__close ends it */
  if (((Task *)lua_touserdata(L, B_TASK))->flags & F_CANCEL) {
    lua_settop(L, B_MSGH);          /* born canceled (group_spawn): its */
    return task_body_k(L, LUA_OK, 0);          /* function never runs */
  }
  return task_body_k(L, lua_pcallk(L, lua_gettop(L) - B_FN, LUA_MULTRET,
                                   B_MSGH, 0, task_body_k), 0);
}


/*
** Starts fn (at 'first', its arguments above it up to the top) as a new
** task, of the group at 'gidx' (0: none), with 'flags'; runs it up to its
** first yield and leaves the task at 'first' (the top).
*/
static void spawn_task (lua_State *L, int first, int gidx, int flags) {
  State *st = am_getstate(L);
  int n = lua_gettop(L) - first + 1;          /* fn and its arguments */
  int status, nres;
  lua_State *co;
  Task *t;
  if (lua_type(L, first) != LUA_TFUNCTION) {
    if (luaL_getmetafield(L, first, "__call") == LUA_TNIL)
      luaL_typeerror(L, first, "function");
    lua_pop(L, 1);
  }
  co = lua_newthread(L);
  t = (Task *)lua_newuserdatauv(L, sizeof(Task), gidx != 0 ? 2 : 1);
  t->status = T_LIVE;
  t->spare = 0;
  t->flags = (unsigned short)flags;
  am_pushmt(L, AM_T_TASK);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -2);
  lua_setiuservalue(L, -2, 1);                /* the task keeps co */
  if (gidx != 0) {                            /* a member from now on */
    Group *g = (Group *)lua_touserdata(L, gidx);
    t->flags |= F_GROUP;
    lua_pushvalue(L, gidx);
    lua_setiuservalue(L, -2, 2);
    lua_getiuservalue(L, gidx, 1);
    lua_pushvalue(L, -2);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    g->live++;
  }
  lua_rotate(L, first, 2);                    /* co t fn args... */
  if (!lua_checkstack(co, n + 4))
    luaL_error(L, "not enough memory");
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->task_body);
  lua_pushvalue(L, first + 1);                /* t */
  lua_pushnil(L);                             /* B_TB */
  lua_pushcfunction(L, task_msgh);            /* B_MSGH */
  lua_xmove(L, co, 4);
  lua_xmove(L, co, n);                  /* co: body t nil msgh fn args */
  status = lua_resume(co, L, n + 3, &nres);
  if (status == LUA_OK || status == LUA_YIELD)
    lua_pop(co, nres);                        /* nobody reads them */
  else
    am_report(L, st, co);         /* the body's own failure (memory) */
  lua_remove(L, first);                       /* t */
}


/*
** spawn(fn, ...): starts fn(...) as a task at once, up to its first yield,
** and returns the task.  Callable tables are accepted, as runExclusive
** accepts them.
*/
int am_spawn (lua_State *L) {
  spawn_task(L, 1, 0, 0);
  return 1;
}


/* core.run_main(fn, ...): am.run's function as a task, which stops the
   loop when it fails (init.lua: run). */
int am_run_main (lua_State *L) {
  spawn_task(L, 1, 0, F_MAIN);
  return 1;
}

/* }====================================================== */


/* {====================================================== cancel */

/*
** Cancels the task at 'idx': a suspended one is closed now (its <close>
** variables run, then task__close ends it as canceled); one that runs
** (the caller, or one that resumed the caller) is closed at the end of
** the loop turn after its next yield (a chore).  Returns whether it had
** not ended.
*/
static int cancel_task (lua_State *L, State *st, int idx) {
  Task *t = (Task *)lua_touserdata(L, idx);
  lua_State *co;
  idx = lua_absindex(L, idx);
  if (t->status != T_LIVE) return 0;
  t->flags |= F_CANCEL;
  lua_getiuservalue(L, idx, 1);
  co = lua_tothread(L, -1);
  /* NOTE: co stays on this stack while it is closed: the closing drops
     the task's reference (task__close) and its anchor (a waiter's
     __close), and a collection meanwhile must not free it */
  if (co != NULL && lua_status(co) == LUA_YIELD) {
    lua_resetthread(co);            /* runs task__close: the task ends */
    lua_settop(co, 0);              /* (a close error is its outcome) */
  }
  else if (!(t->flags & F_CHORE)) {
    t->flags |= F_CHORE;
    am_chore(L, st, idx);
  }
  lua_pop(L, 1);
  return 1;
}


/* task:cancel(): true if the task had not ended, else false. */
static int task_cancel (lua_State *L) {
  State *st = am_getstate(L);
  am_checkself(L, AM_T_TASK);
  lua_settop(L, 1);
  lua_pushboolean(L, cancel_task(L, st, 1));
  am_sync(L, st);
  return 1;
}


/*
** Cancels every member of the group at 'gidx', from a copy of the set:
** each cancel runs Lua code (<close> variables) that may change it.
** Returns how many had not ended.
*/
static int cancel_members (lua_State *L, State *st, int gidx) {
  int i, n = 0, live = 0;
  gidx = lua_absindex(L, gidx);
  lua_getiuservalue(L, gidx, 1);
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, -3) != 0) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, ++n);
  }
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    live += cancel_task(L, st, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  return live;
}


/*
** __close of a task.  On the task's own coroutine with no frame below
** (lua_resetthread, coroutine.close), the coroutine is being closed
** before its body returned: the task ends canceled, or failed with the
** error of a <close> variable that raised ('err').  Anywhere else a
** to-be-closed variable of the user's holding the task went out of scope:
** that cancels it.  When the body returns the task has ended already.
*/
static int task__close (lua_State *L) {
  /* NOTE: Lua calls __close only with a value of this metatable; the
     common call, the body's return, has nothing to do (as waiter__close) */
  Task *t = (Task *)lua_touserdata(L, 1);
  State *st;
  lua_Debug ar;
  int own;
  if (t == NULL || t->status != T_LIVE) return 0;
  st = am_getstate(L);
  am_checkself(L, AM_T_TASK);
  lua_getiuservalue(L, 1, 1);
  own = lua_tothread(L, -1) == L && !lua_getstack(L, 1, &ar);
  lua_pop(L, 1);
  if (!own) {
    cancel_task(L, st, 1);
    am_sync(L, st);
    return 0;
  }
  if (lua_isnoneornil(L, 2)) {
    lua_pushnil(L);
    t->status = T_CANCELED;
  }
  else {
    lua_createtable(L, 2, 0);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 1);
    lua_pushliteral(L, "stack traceback:\n\t(raised by a <close> variable "
                       "while the task was closed)");
    lua_rawseti(L, -2, 2);
    t->status = T_FAILED;
  }
  lua_setiuservalue(L, 1, 1);
  end_task(L, st, t, 1);
  return 0;
}

/* }====================================================== */


/* {====================================================== join, status */

/* Pushes the results of the task at 'idx', which is done; returns how
   many. */
static int push_results (lua_State *L, Task *t, int idx) {
  int i, n;
  if (t->flags & F_EMPTY) return 0;
  lua_getiuservalue(L, idx, 1);
  if (!(t->flags & F_PACKED)) return 1;
  lua_getfield(L, -1, "n");
  n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, n, "too many results");
  for (i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -n - 1);
  return n;
}


/* Pushes what the ended task at 'idx' ended with; returns how many, or
   raises its error (level 0, unchanged) or E_CANCELED. */
static int deliver (lua_State *L, Task *t, int idx) {
  switch (t->status) {
    case T_DONE:
      return push_results(L, t, idx);
    case T_FAILED:
      t->flags |= F_OBSERVED;
      lua_getiuservalue(L, idx, 1);
      return rethrow(L);
    default:
      lua_pushliteral(L, AM_E_CANCELED);
      return lua_error(L);
  }
}


static int task_join_k (lua_State *L, int status, lua_KContext ctx) {
  Task *t = (Task *)lua_touserdata(L, 1);
  (void)status; (void)ctx;
  if (t->status != T_LIVE) {
    lua_settop(L, 1);
    return deliver(L, t, 1);
  }
  t->flags |= F_GATE;
  return wait_gate(L, am_getstate(L), task_join_k);
}

/*
** task:join(): waits until the task ends; returns its results, or raises
** its error (the value it raised, unchanged), or E_CANCELED.
*/
static int task_join (lua_State *L) {
  Task *t = (Task *)am_checkself(L, AM_T_TASK);
  lua_settop(L, 1);
  if (t->status == T_LIVE) {
    lua_getiuservalue(L, 1, 1);
    if (lua_tothread(L, -1) == L)
      am_usage_error(L, "attempt to join a task from inside itself");
    lua_pop(L, 1);
    am_check_yieldable(L, "join a task");
  }
  return task_join_k(L, LUA_OK, 0);
}


static const char *const statuses[] = {"", "done", "failed", "canceled"};

/* The status of the task at 'idx', as task:status() names it. */
static const char *status_of (lua_State *L, Task *t, int idx) {
  const char *s;
  if (t->status != T_LIVE) return statuses[t->status];
  lua_getiuservalue(L, idx, 1);
  s = lua_status(lua_tothread(L, -1)) == LUA_YIELD ? "waiting" : "running";
  lua_pop(L, 1);
  return s;
}

/* task:status(): "running", "waiting", "done", "failed" or "canceled". */
static int task_status (lua_State *L) {
  Task *t = (Task *)am_checkself(L, AM_T_TASK);
  lua_pushstring(L, status_of(L, t, 1));
  return 1;
}


static int task__tostring (lua_State *L) {
  Task *t = (Task *)am_checkself(L, AM_T_TASK);
  lua_pushfstring(L, "%s (%s): %p", AM_TASK, status_of(L, t, 1),
                  (void *)t);
  return 1;
}

/* }====================================================== */


/* {====================================================== groups */

/* am.group(): a new, empty group. */
int am_group (lua_State *L) {
  Group *g = (Group *)lua_newuserdatauv(L, sizeof(Group), 2);
  g->live = 0;
  g->flags = 0;
  am_pushmt(L, AM_T_GROUP);
  lua_setmetatable(L, -2);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);
  return 1;
}


/*
** group:spawn(fn, ...): am.spawn, the task a member of the group.  Into
** a group that failed (its other members are being canceled) the task is
** born canceled: fn never runs, as it would be canceled at its first
** yield anyway, and a spawning loop in a member goes on to that yield.
*/
static int group_spawn (lua_State *L) {
  Group *g = (Group *)am_checkself(L, AM_T_GROUP);
  if (g->flags & G_CLOSED)
    am_usage_error(L, "attempt to spawn into a closed group");
  spawn_task(L, 2, 1, (g->flags & G_FAILED) ? F_CANCEL : 0);
  return 1;
}


static int group_join_k (lua_State *L, int status, lua_KContext ctx) {
  Group *g = (Group *)lua_touserdata(L, 1);
  (void)status; (void)ctx;
  if (g->live == 0) {
    if (g->flags & G_FAILED) {
      g->flags |= G_OBSERVED;
      lua_getiuservalue(L, 1, 2);
      return rethrow(L);
    }
    return 0;
  }
  g->flags |= G_GATE;
  return wait_gate(L, am_getstate(L), group_join_k);
}

/*
** group:join(): waits until every member has ended; raises the first
** failure (the value raised, unchanged), which cancelled the others.
*/
static int group_join (lua_State *L) {
  Group *g = (Group *)am_checkself(L, AM_T_GROUP);
  lua_settop(L, 1);
  if (g->live > 0) am_check_yieldable(L, "join a group");
  return group_join_k(L, LUA_OK, 0);
}


/* group:cancel(): cancels every member; true if one had not ended. */
static int group_cancel (lua_State *L) {
  State *st = am_getstate(L);
  am_checkself(L, AM_T_GROUP);
  lua_settop(L, 1);
  lua_pushboolean(L, cancel_members(L, st, 1) > 0);
  am_sync(L, st);
  return 1;
}


/*
** __close of a group: it takes no more members, then joins them, raising
** the first failure.  An error leaving the block (or a close where the
** coroutine cannot wait: the owner itself cancelled, coroutine.close)
** cancels the members instead, and the error goes on.  While it joins,
** the group is to-be-closed once more, in this frame: when the coroutine
** is closed during the join (a nested group's owner cancelled with its
** own group), that second close cancels the members; when the join ends,
** it finds none left.
*/
static int group__close (lua_State *L) {
  State *st = am_getstate(L);
  Group *g = (Group *)am_checkself(L, AM_T_GROUP);
  if (g->flags & G_CLOSING) {                 /* the guard slot below */
    g->flags &= ~G_CLOSING;
    lua_settop(L, 1);
    if (g->live > 0) cancel_members(L, st, 1);
    am_sync(L, st);
    return 0;
  }
  g->flags |= G_CLOSED;
  if (!lua_isnoneornil(L, 2) || !lua_isyieldable(L)) {
    lua_settop(L, 1);
    cancel_members(L, st, 1);
    am_sync(L, st);
    return 0;
  }
  lua_settop(L, 1);
  if (g->live == 0) return group_join_k(L, LUA_OK, 0);
  g->flags |= G_CLOSING;
  lua_pushvalue(L, 1);
  lua_toclose(L, 2);
  return group_join_k(L, LUA_OK, 0);
}


static int group__tostring (lua_State *L) {
  Group *g = (Group *)am_checkself(L, AM_T_GROUP);
  if (g->live > 0)
    lua_pushfstring(L, "%s (%I running): %p", AM_GROUP,
                    (LUAI_UACINT)g->live, (void *)g);
  else
    lua_pushfstring(L, "%s (%s): %p", AM_GROUP,
                    (g->flags & G_FAILED) ? "failed" : "done", (void *)g);
  return 1;
}

/* }====================================================== */


/* {====================================================== chores */

/*
** Replaces the failure {error, traceback} on top with the error value
** and the report's text: "text\ntraceback", the text as lua5.4 prints
** an error (error_text.c).
*/
static void push_report (lua_State *L) {
  const char *msg;
  lua_rawgeti(L, -1, 1);                      /* wrapper err */
  msg = am_push_error_text(L, -1);            /* wrapper err msg */
  lua_rawgeti(L, -3, 2);                      /* wrapper err msg tb */
  lua_pushfstring(L, "%s\n%s", msg, lua_tostring(L, -1));
  lua_replace(L, -5);                         /* text err msg tb */
  lua_pop(L, 2);                              /* text err */
  lua_insert(L, -2);                          /* err text */
}


/*
** Pushes the error value and the report's text of the failure held by
** the task, group or record at 'idx'; returns 1, or 0 (pushing nothing)
** when it holds none that nobody took.
*/
static int push_failure (lua_State *L, int idx) {
  Task *t = totask(L, idx);
  Group *g = t == NULL ? togroup(L, idx) : NULL;
  idx = lua_absindex(L, idx);
  if (t != NULL) {
    if (t->status != T_FAILED || (t->flags & F_OBSERVED)) return 0;
    lua_getiuservalue(L, idx, 1);
  }
  else if (g != NULL) {
    if (!(g->flags & G_FAILED) || (g->flags & G_OBSERVED)) return 0;
    lua_getiuservalue(L, idx, 2);
  }
  else if (lua_type(L, idx) == LUA_TTABLE) {  /* a record: {err, text} */
    lua_rawgeti(L, idx, 1);
    lua_rawgeti(L, idx, 2);
    return 1;
  }
  else return 0;
  push_report(L);
  return 1;
}


/* Reports the failure of the task or group at 'idx' if nobody took it. */
static void report_now (lua_State *L, State *st, int idx) {
  Task *t = totask(L, idx);
  Group *g = t == NULL ? togroup(L, idx) : NULL;
  idx = lua_absindex(L, idx);
  if ((t != NULL && (t->flags & F_REPORTED))
      || (g != NULL && (g->flags & G_REPORTED)))
    return;
  st->reporting++;
  if (push_failure(L, idx)) {
    if (t != NULL) t->flags |= F_REPORTED;
    else if (g != NULL) g->flags |= G_REPORTED;
    am_report_error(L, st, t != NULL ? "error in a task"
                                     : "error in a task of a group", idx);
  }
  st->reporting--;
}


/*
** One chore (scheduler.c runs them at the end of a loop turn), the object
** at 'idx': a task cancelled while it ran is closed now that it waits; a
** failure nobody took by now is reported.
*/
void am_do_chore (lua_State *L, State *st, int idx) {
  Task *t = totask(L, idx);
  Group *g = t == NULL ? togroup(L, idx) : NULL;
  idx = lua_absindex(L, idx);
  if (t != NULL) {
    t->flags &= ~F_CHORE;
    if (t->status == T_LIVE) {
      lua_State *co;
      if (!(t->flags & F_CANCEL) || st->closing) return;  /* (lua_close) */
      lua_getiuservalue(L, idx, 1);
      co = lua_tothread(L, -1);
      lua_pop(L, 1);                          /* (the task keeps it) */
      if (co != NULL && lua_status(co) == LUA_YIELD)
        cancel_task(L, st, idx);
      else if (!(t->flags & F_COUNTED)) {     /* it runs still (a nested
                                                 uv.run): at its next wait */
        t->flags |= F_COUNTED;
        st->ncanceling++;
      }
      return;
    }
    report_now(L, st, idx);
  }
  else if (g != NULL) {
    g->flags &= ~G_CHORE;
    report_now(L, st, idx);
  }
}


/*
** Pushes the task whose coroutine is 'co' (its body's frame, the
** outermost), or nil.
*/
static void push_task_of (lua_State *L, State *st, lua_State *co) {
  lua_Debug ar;
  int level = 0, found = 0;
  if (!lua_checkstack(co, 2)) {
    lua_pushnil(L);
    return;
  }
  while (lua_getstack(co, level + 1, &ar)) level++;
  if (lua_getstack(co, level, &ar) && lua_getinfo(co, "f", &ar)) {
    lua_rawgeti(co, LUA_REGISTRYINDEX, st->task_body);
    found = lua_rawequal(co, -1, -2);
    lua_pop(co, 2);
  }
  if (found && lua_getlocal(co, &ar, B_TASK) != NULL)
    lua_xmove(co, L, 1);
  else
    lua_pushnil(L);
}


/*
** A coroutine about to wait (waiter.c, suspend) while some task cancelled
** as it ran is still to be closed (State.ncanceling): if it is that task,
** it is closed at the end of the loop turn after this yield.
*/
void am_task_waits (lua_State *L, State *st) {
  Task *t;
  push_task_of(L, st, L);
  t = totask(L, -1);
  if (t != NULL && (t->flags & F_COUNTED)) {
    t->flags &= ~F_COUNTED;
    st->ncanceling--;
    if (!(t->flags & F_CHORE)) {
      t->flags |= F_CHORE;
      am_chore(L, st, -1);
    }
  }
  lua_pop(L, 1);
}

/* }====================================================== */


/* {====================================================== am.run's reads */

/*
** core.outcome(task): its status, then its results ("done"), or its
** error and the report's text ("failed"; it is taken: am.run raises it).
*/
int am_outcome (lua_State *L) {
  Task *t = (Task *)luaL_checkudata(L, 1, AM_TASK);
  lua_settop(L, 1);
  lua_pushstring(L, status_of(L, t, 1));
  if (t->status == T_DONE) return 1 + push_results(L, t, 1);
  if (t->status == T_FAILED) {
    t->flags |= F_OBSERVED;
    lua_getiuservalue(L, 1, 1);
    push_report(L);
    return 3;
  }
  return 1;
}


/*
** core.failure(x): the error value and the report's text of a failure
** nobody took, held by x (a task, a group, or a record {err, text} of an
** error in a coroutine the module resumed); nothing otherwise.
*/
int am_failure (lua_State *L) {
  lua_settop(L, 1);
  return push_failure(L, 1) ? 2 : 0;
}


/* What a waiter waits for, as core.waiting names it. */
static const char *what_of (const Waiter *w, int joined) {
  if (joined) return "join";
  if (w->r.kind == W_UNLOCK) return "waitForUnlock";
  if (w->r.timed && w->r.erridx == 0) return "sleep";   /* core.c, sleep */
  return "acquire";
}


/*
** Pushes where coroutine 'co' waits: "file:line" of its first frame that
** is Lua code outside the module's Lua layer, or nil.
*/
static void push_where (lua_State *L, State *st, lua_State *co) {
  lua_Debug ar;
  int level;
  for (level = 0; lua_getstack(co, level, &ar); level++) {
    if (!lua_getinfo(co, "Sl", &ar) || ar.currentline < 0) continue;
    if (am_in_layer(L, st, ar.source)) continue;
    lua_pushfstring(L, "%s:%d", ar.short_src, ar.currentline);
    return;
  }
  lua_pushnil(L);
}


/*
** The waiter of coroutine 'co', anchored by the scheduler: the
** to-be-closed userdata at the top of its waiting frame (waiter.c,
** suspend), if it has the waiters' metatable; else NULL.  (Debug mode's
** request hook asks it too: debug_deadlock.c, alone_and_fits.)
*/
Waiter *am_waiter_of (lua_State *L, lua_State *co) {
  int top = lua_gettop(co), same;
  void *p;
  if (top < 1 || lua_status(co) != LUA_YIELD || !lua_checkstack(co, 1))
    return NULL;
  p = lua_touserdata(co, top);
  if (p == NULL || !lua_getmetatable(co, top)) return NULL;
  lua_xmove(co, L, 1);
  same = lua_rawequal(L, -1, am_mtindex(AM_T_WAITER));
  lua_pop(L, 1);
  return same ? (Waiter *)p : NULL;
}


/*
** core.waiting(): the coroutines the module holds that wait now (queued
** for a lock, joining a task or a group, sleeping), one record each:
** {thread, task = the task it runs or nil, what = "acquire" |
** "waitForUnlock" | "join" | "sleep", lock = the lock (a key's lock for a
** keyed request) or the task or group joined, weight, timed, where =
** "file:line" or nil}, in the order of their anchors.
*/
int am_waiting (lua_State *L) {
  State *st = am_getstate(L);
  int i, n, out = 0;
  lua_settop(L, 0);
  am_push_anchored_threads(L, st);            /* 1: the threads */
  n = (int)lua_rawlen(L, 1);
  lua_createtable(L, n, 0);                   /* 2: the records */
  for (i = 1; i <= n; i++) {
    lua_State *co;
    Waiter *w;
    int joined = 0;
    lua_rawgeti(L, 1, i);
    co = lua_tothread(L, -1);
    w = am_waiter_of(L, co);
    if (w == NULL || w->r.state != S_QUEUED) {
      lua_pop(L, 1);
      continue;
    }
    lua_createtable(L, 0, 8);                 /* 3: thread; 4: record */
    lua_pushvalue(L, 3);
    lua_setfield(L, 4, "thread");
    push_task_of(L, st, co);
    lua_setfield(L, 4, "task");
    if (!lua_checkstack(co, 2)) luaL_error(L, "not enough memory");
    lua_pushvalue(co, (int)w->r.lockidx);
    lua_xmove(co, L, 1);                      /* 5: the lock */
    if (w->r.lock->internal && w->r.kind == W_UNLOCK) {
      lua_getiuservalue(L, 5, 2);             /* a gate: what it is of? */
      if (totask(L, 6) != NULL || togroup(L, 6) != NULL) {
        joined = 1;
        lua_replace(L, 5);
      }
      else lua_pop(L, 1);
    }
    lua_setfield(L, 4, "lock");
    lua_pushstring(L, what_of(w, joined));
    lua_setfield(L, 4, "what");
    lua_pushinteger(L, w->r.weight);
    lua_setfield(L, 4, "weight");
    lua_pushboolean(L, w->r.timed);
    lua_setfield(L, 4, "timed");
    push_where(L, st, co);
    lua_setfield(L, 4, "where");
    lua_rawseti(L, 2, ++out);
    lua_settop(L, 2);
  }
  return 1;
}


/*
** core.collect(list | nil [, keep]): from now on every failure reported
** (to the handler or stderr) is also appended to 'list', when 'keep': the
** task or group that held it, or a record {err, text} for a coroutine the
** module resumed.  Returns the list set before.  am.run sets one while it
** runs (without 'keep' when it only reports: a server that runs for days
** then keeps nothing per failure).
*/
int am_collect (lua_State *L) {
  State *st = am_getstate(L);
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_istable(L, 1), 1,
                   "table or nil");
  st->collect_keep = lua_toboolean(L, 2);
  lua_settop(L, 1);
  if (st->collect == LUA_NOREF) lua_pushnil(L);
  else lua_rawgeti(L, LUA_REGISTRYINDEX, st->collect);
  luaL_unref(L, LUA_REGISTRYINDEX, st->collect);
  st->collect = LUA_NOREF;
  if (!lua_isnil(L, 1)) {
    lua_pushvalue(L, 1);
    st->collect = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 1;
}

/* }====================================================== */


const luaL_Reg am_task_methods[] = {
  {"join", task_join},
  {"cancel", task_cancel},
  {"status", task_status},
  {NULL, NULL}
};

const luaL_Reg am_task_metamethods[] = {
  {"__close", task__close},
  {"__tostring", task__tostring},
  {NULL, NULL}
};

const luaL_Reg am_group_methods[] = {
  {"spawn", group_spawn},
  {"join", group_join},
  {"cancel", group_cancel},
  {NULL, NULL}
};

const luaL_Reg am_group_metamethods[] = {
  {"__close", group__close},
  {"__tostring", group__tostring},
  {NULL, NULL}
};
