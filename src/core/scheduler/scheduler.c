/*
** scheduler.c: the scheduler, per lua_State
** Outcomes (grant, timeout, cancel) are decided synchronously by the
** engine (grant.c, rules.c) and queued here in a ready list (grant.c:
** am_waiter_ready); the coroutines are resumed later, from a luv idle
** handle, in the order the outcomes were decided.  Deadlines of timed
** waiters live in one queue served by a single luv timer.  Both handles are
** created through luv's own Lua API, so uv.walk() and luv's exit-time
** cleanup know them, and both are stopped whenever they have nothing to do,
** so uv.run() returns as soon as user work is done.
** Chores are what the end of a loop turn does besides resuming: report
** the failures of tasks nobody took, close tasks cancelled while they ran
** (task.c).
*/

#define LUA_LIB

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "../../error_text.h"


/*
** How many coroutines one idle callback may resume beyond those ready
** when it starts (all of which it resumes: the readers an RWLock grants
** together run in one iteration).  Waiters made ready while the batch
** runs (a hand-off chain) join the same batch, so a chain costs no loop
** iteration per link; the budget lets I/O in between.
*/
#define BATCH  1024

/* The longest a single timer start may last (ms): luv takes an integer. */
#define MAX_DELAY  1e9


/* {====================================================== luv calls */

static void pushref (lua_State *L, int ref) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
}


/* Calls handle method 'fn' (a luv function) on 'handle', with 'cb'. */
static void call_handle (lua_State *L, int fn, int handle, int cb) {
  pushref(L, fn);
  pushref(L, handle);
  if (cb == LUA_NOREF)
    lua_call(L, 1, 0);
  else {
    pushref(L, cb);
    lua_call(L, 2, 0);
  }
}


/* Loop time in ms, as luv's uv.now() reports it (the timers' clock). */
static lua_Number loop_now (lua_State *L, State *st) {
  lua_Number now;
  pushref(L, st->now);
  lua_call(L, 0, 1);
  now = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return now;
}


/*
** The time now in ms, as luv's uv.hrtime() reads it: the monotonic clock
** the loop's time is taken from (libuv's uv_now is it in whole ms, as of
** the start of the loop turn), read now and to the ns.
*/
static lua_Number clock_now (lua_State *L, State *st) {
  lua_Number now;
  pushref(L, st->hrtime);
  lua_call(L, 0, 1);
  now = lua_tonumber(L, -1) / 1e6;
  lua_pop(L, 1);
  return now;
}


/*
** Is our handle 'handle' (a registry reference) closed or closing?
** Someone else may close it (uv.walk closing every handle, say) while we
** believe it active: the flags 'idle_on' and 'timer_on' are then false,
** and am_sync replaces it.
*/
static int handle_closed (lua_State *L, State *st, int handle) {
  int closing;
  pushref(L, st->is_closing);
  pushref(L, handle);
  lua_call(L, 1, 1);
  closing = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return closing;
}


/*
** A handle of ours that someone closed (a test's teardown closing every
** handle from uv.walk, say) is replaced by a new one: luv would run a
** closed handle's callback through freed references.  Called by am_sync
** only: a finalizer or hook run by these calls cannot replace the handle
** meanwhile (its am_sync returns at once).
*/
static void ensure_open (lua_State *L, State *st, int *handle, int ctor) {
  if (handle_closed(L, st, *handle)) {
    pushref(L, ctor);
    lua_call(L, 0, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, *handle);
    *handle = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}


/*
** RE-ENTRY: a hook run at the call of start may close the handle before
** start runs; libuv would then keep a closed handle in its loop (freed
** later: use after free).  So the handle is checked again after start,
** and one found closed is stopped (out of the loop) and replaced by
** am_sync's next round.
*/
static void start_idle (lua_State *L, State *st) {
  ensure_open(L, st, &st->idle, st->new_idle);
  call_handle(L, st->idle_start, st->idle, st->on_idle);
  st->idle_on = 1;
  if (handle_closed(L, st, st->idle)) {
    call_handle(L, st->idle_stop, st->idle, LUA_NOREF);
    st->idle_on = 0;
  }
}


static void stop_idle (lua_State *L, State *st) {
  call_handle(L, st->idle_stop, st->idle, LUA_NOREF);
  st->idle_on = 0;
}


/*
** (Re)starts the timer for the earliest deadline.  The deadline is read
** before the luv calls, which may run a hook that changes the timer
** queue: am_sync looks again afterwards.
*/
static void arm_timer (lua_State *L, State *st) {
  lua_Number due = am_queue_first(&st->timers)->deadline;
  lua_Number delay = ceil(due - loop_now(L, st));
  if (delay < 0) delay = 0;
  else if (delay > MAX_DELAY) delay = MAX_DELAY;
  ensure_open(L, st, &st->timer, st->new_timer);
  pushref(L, st->timer_start);
  pushref(L, st->timer);
  lua_pushinteger(L, (lua_Integer)delay);
  lua_pushinteger(L, 0);
  pushref(L, st->on_timer);
  lua_call(L, 4, 0);
  st->timer_on = 1;
  st->timer_due = due;
  if (handle_closed(L, st, st->timer)) {      /* as in start_idle */
    call_handle(L, st->timer_stop, st->timer, LUA_NOREF);
    st->timer_on = 0;
  }
}


static void stop_timer (lua_State *L, State *st) {
  call_handle(L, st->timer_stop, st->timer, LUA_NOREF);
  st->timer_on = 0;
}


/* What am_sync does next; decided from C fields alone. */
enum { SYNC_NONE, SYNC_CHECK_IDLE, SYNC_CHECK_TIMER, SYNC_START_IDLE,
       SYNC_STOP_IDLE, SYNC_ARM_TIMER, SYNC_STOP_TIMER };

static int sync_next (State *st) {
  int ready = am_list_first(&st->ready) != NULL
              || st->chore_head != st->chore_tail;   /* chores: idle too */
  /* at each new need of a handle we believe active, check that it is
     (one luv call, only when a waiter became ready outside the idle
     callback, or a deadline was added) */
  if (st->check_idle && ready && st->idle_on && !st->draining)
    return SYNC_CHECK_IDLE;
  if (st->check_timer && st->timers.count > 0 && st->timer_on)
    return SYNC_CHECK_TIMER;
  st->check_idle = st->check_timer = 0;
  if (!st->draining && ready && !st->idle_on)
    return SYNC_START_IDLE;
  if (!st->draining && !ready && st->idle_on)
    return SYNC_STOP_IDLE;
  if (st->timers.count > 0
      && (!st->timer_on
          || am_queue_first(&st->timers)->deadline < st->timer_due))
    return SYNC_ARM_TIMER;
  if (st->timers.count == 0 && st->timer_on)
    return SYNC_STOP_TIMER;
  return SYNC_NONE;
}


/* am_sync's loop, run protected (the state is argument 1). */
static int sync_loop (lua_State *L) {
  State *st = (State *)lua_touserdata(L, 1);
  int next;
  while ((next = sync_next(st)) != SYNC_NONE) {
    switch (next) {
      case SYNC_CHECK_IDLE:
        st->check_idle = 0;
        if (handle_closed(L, st, st->idle)) st->idle_on = 0;
        break;
      case SYNC_CHECK_TIMER:
        st->check_timer = 0;
        if (handle_closed(L, st, st->timer)) st->timer_on = 0;
        break;
      case SYNC_START_IDLE: start_idle(L, st); break;
      case SYNC_STOP_IDLE: stop_idle(L, st); break;
      case SYNC_ARM_TIMER: arm_timer(L, st); break;
      default: stop_timer(L, st); break;
    }
  }
  return 0;
}


/*
** RE-ENTRY (docs/semantics.md, "Re-entry"; docs/internals.md, "Rules the
** code keeps"): the queue rules (grant.c, rules.c) and the ready and timer queues
** never call luv, since a luv function called through Lua may run a debug
** hook or a finalizer, and it may call the module while a queue is half
** updated.  Every entry point instead calls am_sync once its update is
** complete: it brings the idle handle and the timer in line with the
** queues.  The luv calls it makes may run Lua code that changes the
** queues again, so after each call it decides again (sync_next), until
** nothing is left to do.
** Only one am_sync runs at a time ('syncing'): one called back from inside
** a luv call of another returns at once, and the outer one sees what the
** call back changed when it decides again.  Nested, the two would each act
** on a handle and a flag the other changes under it (a handle replaced
** twice, or started and then believed stopped: an active idle handle no
** one stops, and uv.run() spins).  The loop runs protected, so that an
** error (raised by a hook, say) clears 'syncing' before it propagates.
** While the idle callback resumes waiters ('draining'), it decides about
** the idle handle itself.  am_sync (async_mutex.h) calls this only past
** its inline test of the common cases.
*/
void am_sync_slow (lua_State *L, State *st) {
  int status;
  if (st->closed || st->syncing) return;  /* lua_close; or see above */
  if (sync_next(st) == SYNC_NONE) return; /* no luv call */
  st->syncing = 1;
  lua_pushcfunction(L, sync_loop);
  lua_pushlightuserdata(L, st);
  status = lua_pcall(L, 1, 0, 0);
  st->syncing = 0;
  if (status != LUA_OK) lua_error(L);
}

/* }====================================================== */


/* {====================================================== ready list */

/*
** The ready list holds the waiters whose outcome is decided, in the order
** it was decided, linked through the same links as their queue (they
** have left it).  Making a waiter ready never allocates, so it never fails
** half-way through a dispatch.
*/

/*
** Schedules the resumption of a waiter made READY (grant.c); the idle
** handle is started by am_sync.
*/
void am_schedule (State *st, Waiter *w) {
  am_list_append(&st->ready, w, 0);
  if (!st->draining) st->check_idle = 1;
}


/*
** Chores (StateHooks.chore: task.c): the objects at the indices chore_head ..
** chore_tail - 1 of a registry table, each done at the end of the first
** idle callback that starts after it was added (so a failure met in one
** loop turn is reported at the end of the next, once the joiners it woke
** have run).  Adding one allocates, so a caller adds it once its own
** changes are made.  The idle handle runs while some are left (am_sync).
*/
void am_chore (lua_State *L, State *st, int idx) {
  if (st->closed) return;
  idx = lua_absindex(L, idx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->chores);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, st->chore_tail);
  lua_pop(L, 1);
  st->chore_tail++;
  if (!st->draining) st->check_idle = 1;
}


/* Does the chores added before 'mark'. */
static void do_chores (lua_State *L, State *st, int mark) {
  while (st->chore_head != mark && !st->closed) {
    int i = st->chore_head++;
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->chores);
    lua_rawgeti(L, -1, i);
    lua_pushnil(L);
    lua_rawseti(L, -3, i);
    st->hooks->chore(L, st, -1);
    lua_pop(L, 2);
  }
}


/*
** Stops the loop (uv.stop()) if it runs: am.run's function failed.  When
** it does not run, a stop would end the next uv.run() at once.
*/
void am_stop_loop (lua_State *L, State *st) {
  int running;
  if (st->closed) return;
  pushref(L, st->loop_mode);
  lua_call(L, 0, 1);
  running = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (running) {
    pushref(L, st->stop);
    lua_call(L, 0, 0);
  }
}


/*
** Anchors: the coroutines of queued and ready waiters, kept alive in the
** stack slots of threads of the state's ("anchor threads", of up to
** ANCHOR_CHUNK slots each).  Slot 'ref' is slot ANCHOR_SLOT(ref) of
** thread ANCHOR_THREAD(ref).  The free slots are a list kept in C, as
** luaL_ref's is in its table ('anchor_next', the head 'free_anchor'); a
** free slot holds the registry (alive as long as the state: a reference
** that keeps nothing else alive, and no thread), copied there in one API
** call.  (Kept in the slots, the list cost each wait three API calls
** more: docs/bench.md.)  Reading or writing a
** stack slot costs a fraction of a table access, and a thread's stack is
** dense: no hash part, no rehash.
*/
/* A thread's stack grows by doubling, so its last chunk may hold up to
   twice the slots in use: small chunks keep that waste, and so an
   anchor's cost, near one slot (16 bytes) a waiting coroutine. */
#ifndef ANCHOR_BITS
#define ANCHOR_BITS      10      /* `make asan` uses 3: chunks cross often */
#endif
#define ANCHOR_CHUNK     (1 << ANCHOR_BITS)
#define ANCHOR_THREAD(st,ref)  ((st)->athreads[((ref) - 1) >> ANCHOR_BITS])
#define ANCHOR_SLOT(ref)       ((((ref) - 1) & (ANCHOR_CHUNK - 1)) + 1)

/*
** Adds an anchor thread for the next chunk.  Making the thread may run
** the collector, and finalizers that wait on locks and so anchor: if
** they added this chunk meanwhile, the new thread is dropped.
*/
static void add_anchor_thread (lua_State *L, State *st) {
  int t = st->nathreads;
  lua_State *T;
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->anchors);
  T = lua_newthread(L);
  /* the chunks after the first at their full size at once: grown by
     doubling, a chunk's stack would end with up to twice the slots it
     holds (the first grows, so that a few waits cost a few slots) */
  if (t > 0 && !lua_checkstack(T, ANCHOR_CHUNK + 2))
    luaL_error(L, "not enough memory");
  if (st->nathreads == t) {
    lua_State **a = (lua_State **)realloc(st->athreads,
                                          (t + 1) * sizeof(*a));
    int *next;
    if (a == NULL) luaL_error(L, "not enough memory");
    st->athreads = a;
    next = (int *)realloc(st->anchor_next,
                          ((size_t)(t + 1) * ANCHOR_CHUNK + 1)
                          * sizeof(*next));
    if (next == NULL) luaL_error(L, "not enough memory");
    st->anchor_next = next;
    lua_rawseti(L, -2, t + 1);
    a[t] = T;
    st->nathreads = t + 1;
  }
  else lua_pop(L, 1);
  lua_pop(L, 1);
}


/* Makes slot st->nanchors + 1, with room above it; returns it. */
static int new_anchor (lua_State *L, State *st) {
  int ref;
  for (;;) {
    if (st->nanchors == INT_MAX)
      luaL_error(L, "too many waiting coroutines");
    ref = st->nanchors + 1;
    if (((ref - 1) >> ANCHOR_BITS) < st->nathreads) break;
    add_anchor_thread(L, st);
  }
  /* from here on nothing runs the collector */
  if (!lua_checkstack(ANCHOR_THREAD(st, ref), 2))
    luaL_error(L, "not enough memory");
  lua_pushboolean(ANCHOR_THREAD(st, ref), 0);
  st->nanchors = ref;
  return ref;
}


/* Anchors the running coroutine 'L', which waits in 'w'. */
void am_anchor (lua_State *L, Waiter *w) {
  State *st = w->r.lock->st;
  int ref = st->free_anchor;
  lua_State *A;
  if (st->closed)                 /* a finalizer run by lua_close */
    luaL_error(L, "attempt to wait for a lock while the Lua state is closing");
  if (ref != 0) {                             /* reuse: never allocates */
    A = ANCHOR_THREAD(st, ref);
    st->free_anchor = st->anchor_next[ref];
  }
  else {
    ref = new_anchor(L, st);                  /* may raise (memory) */
    A = ANCHOR_THREAD(st, ref);
  }
  lua_pushthread(L);
  lua_xmove(L, A, 1);                         /* into the room above */
  lua_replace(A, ANCHOR_SLOT(ref));
  w->r.ref = ref;
  st->pending++;
}


/* The coroutine anchored at 'ref'. */
static lua_State *anchored (State *st, int ref) {
  return lua_tothread(ANCHOR_THREAD(st, ref), ANCHOR_SLOT(ref));
}


/* Gives slot 'ref' back. */
static void drop_anchor (State *st, int ref) {
  lua_copy(ANCHOR_THREAD(st, ref), LUA_REGISTRYINDEX, ANCHOR_SLOT(ref));
  st->anchor_next[ref] = st->free_anchor;
  st->free_anchor = ref;
}


/* Pushes the coroutine anchored by 'w', or nil (debug_read.c's reads). */
void am_push_anchored (lua_State *L, const Waiter *w) {
  State *st = w->r.lock->st;
  lua_State *A;
  if (w->r.ref == LUA_NOREF || st->closed
      || !lua_checkstack(A = ANCHOR_THREAD(st, w->r.ref), 1)) {
    lua_pushnil(L);
    return;
  }
  lua_pushvalue(A, ANCHOR_SLOT(w->r.ref));
  lua_xmove(A, L, 1);
}


/* Pushes a list of the coroutines anchored now (task.c: core.waiting). */
void am_push_anchored_threads (lua_State *L, State *st) {
  int ref, n = 0;
  lua_newtable(L);
  for (ref = 1; ref <= st->nanchors && !st->closed; ref++) {
    lua_State *A = ANCHOR_THREAD(st, ref);
    if (lua_type(A, ANCHOR_SLOT(ref)) == LUA_TTHREAD) {
      lua_pushvalue(A, ANCHOR_SLOT(ref));
      lua_xmove(A, L, 1);
      lua_rawseti(L, -2, ++n);
    }
  }
}


void am_unanchor (lua_State *L, Waiter *w) {
  (void)L;
  if (w->r.ref != LUA_NOREF) {
    State *st = w->r.lock->st;
    if (!st->closed) drop_anchor(st, w->r.ref);   /* else: threads freed */
    w->r.ref = LUA_NOREF;
    st->pending--;
  }
}

/* }====================================================== */


/* {====================================================== errors */

/*
** Reports a failure: the error value and the report's text (the error's
** text, then a traceback) on top of the stack, popped; 'who' (0: none)
** the task or group that held it.  It goes to the handler set by
** setErrorHandler, handler(err, text, who), or to stderr as
** "async_mutex: <what>: <text>".  While am.run collects (core.collect),
** 'who', or a record {err, text}, is appended to its list.  Never raises
** (it runs in luv callbacks).
*/
void am_report_error (lua_State *L, State *st, const char *what, int who) {
  int text = lua_gettop(L), err = text - 1;
  int quiet = st->closed || st->closing;   /* lua_close: stderr only */
  if (who != 0) who = lua_absindex(L, who);
  if (st->collect != LUA_NOREF && st->collect_keep && !quiet
      && lua_checkstack(L, 4)) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->collect);
    if (who != 0) lua_pushvalue(L, who);
    else {
      lua_createtable(L, 2, 0);
      lua_pushvalue(L, err);
      lua_rawseti(L, -2, 1);
      lua_pushvalue(L, text);
      lua_rawseti(L, -2, 2);
    }
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
  }
  if (st->handler != LUA_NOREF && !quiet) {
    pushref(L, st->handler);
    lua_pushvalue(L, err);
    lua_pushvalue(L, text);
    if (who != 0) lua_pushvalue(L, who);
    else lua_pushnil(L);
    if (lua_pcall(L, 3, 0, 0) != LUA_OK) {       /* L: err text e */
      const char *e = am_push_error_text(L, -1);  /* L: err text e etext */
      fprintf(stderr, "async_mutex: error in the error handler: %s\n"
              "while reporting: %s\n", e, lua_tostring(L, text));
      fflush(stderr);
    }
  }
  else {
    fprintf(stderr, "async_mutex: %s: %s\n", what, lua_tostring(L, text));
    fflush(stderr);
  }
  lua_settop(L, err - 1);
}


/*
** A coroutine we resumed died with an error (on top of its stack).  It
** must not take the process down (an error escaping a luv callback makes
** luv exit) nor stop the rest of the batch, and it must not be
** swallowed: pass it with its traceback to am_report_error.  Then close
** the dead coroutine, so its pending to-be-closed variables (releasers)
** run.  (A task never dies so: its body catches its errors, task.c.)
*/
void am_report (lua_State *L, State *st, lua_State *co) {
  const char *msg;
  int base = lua_gettop(L);
  st->reporting++;                  /* (task.c, end_task) */
  if (lua_checkstack(co, 1)) {        /* a dead coroutine has no room left */
    lua_pushvalue(co, -1);
    lua_xmove(co, L, 1);                        /* L: err */
  }
  else
    lua_pushliteral(L, "(error object lost: not enough memory)");
  /* the traceback first: the error's __tostring (run by
     am_push_error_text) is Lua code, and may close the dead coroutine */
  luaL_traceback(L, co, NULL, 0);               /* L: err tb0 */
  msg = am_push_error_text(L, base + 1);        /* L: err tb0 msg */
  lua_insert(L, -2);                            /* L: err msg tb0 */
  lua_pushfstring(L, "%s\n%s", msg, lua_tostring(L, -1));
  lua_remove(L, -2);                            /* L: err msg tb */
  lua_remove(L, -2);                            /* L: err tb */
  /* an errored thread resets with its own error; another one on top
     means one of its __close handlers failed too */
  lua_resetthread(co);
  if (lua_gettop(co) > 0) {
    lua_xmove(co, L, 1);
    if (!lua_rawequal(L, base + 1, -1)) {
      fprintf(stderr, "async_mutex: error closing a dead coroutine: %s\n",
              am_push_error_text(L, -1));
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_settop(co, 0);
  am_report_error(L, st, "error in a resumed coroutine", 0);
  lua_settop(L, base);
  st->reporting--;
}

/* }====================================================== */


/* {====================================================== callbacks */

/*
** Idle callback: resume the ready coroutines in order.  Upvalue 1 is the
** state.  'w' may be collected once its coroutine runs, so everything
** needed from it is read first.
*/
/* How many waiters the ready list holds (O(n): once a batch, which
   resumes them all). */
static size_t count_ready (State *st) {
  size_t n = 0;
  void *p = st->ready.ends.next;
  while (!((uintptr_t)p & 1)) {               /* a tag: back at the list */
    n++;
    p = ((Waiter *)p)->q.next;
  }
  return n;
}


static int on_idle (lua_State *L) {
  State *st = (State *)lua_touserdata(L, AM_STATE_UPVALUE);
  size_t budget;
  int mark;
  if (st->closed) return 0;
  if (st->draining || st->syncing) {
    /* uv.run() inside a coroutine we resumed (or inside a hook run by a
       luv call of am_sync): the waiters are resumed once that coroutine
       yields back to us, not from this nested run.  The idle handle stops
       meanwhile (left active, the nested run would spin and never
       return); the outer call restarts it (am_sync). */
    stop_idle(L, st);
    return 0;
  }
  st->draining = 1;
  mark = st->chore_tail;                  /* chores due at this turn's end */
  budget = count_ready(st) + BATCH;
  while (budget-- > 0) {
    Waiter *w = am_list_first(&st->ready);
    lua_State *co;
    int nres, status, ref;
    if (w == NULL) break;
    ref = w->r.ref;
    co = anchored(st, ref);
    if (lua_status(co) != LUA_YIELD) {        /* cannot run: give back */
      st->hooks->abandon(L, w);
      continue;
    }
    am_waiter_resuming(w);
    w->r.ref = LUA_NOREF;                       /* no longer pending */
    st->pending--;
    status = lua_resume(co, L, 0, &nres);     /* its slot keeps it alive */
    if (status == LUA_OK || status == LUA_YIELD) {
      if (nres != 0) lua_pop(co, nres);     /* a wait again yields none */
      drop_anchor(st, ref);
    }
    else {
      am_report(L, st, co);                   /* still in its slot */
      drop_anchor(st, ref);
    }
  }
  do_chores(L, st, mark);
  st->draining = 0;
  /* a waiter resumed may have closed our handle (uv.walk): check it when
     some are left for the next round */
  st->check_idle = am_list_first(&st->ready) != NULL
                   || st->chore_head != st->chore_tail;
  am_sync(L, st);                 /* stops the idle handle if all are done */
  return 0;
}


/* Timer callback: every waiter whose deadline has passed times out. */
static int on_timer (lua_State *L) {
  State *st = (State *)lua_touserdata(L, AM_STATE_UPVALUE);
  lua_Number now;
  Waiter *w;
  if (st->closed) return 0;
  /* a one-shot timer fired; cleared before the luv call, where a hook
     may arm it again */
  st->timer_on = 0;
  now = loop_now(L, st);
  while ((w = am_queue_first(&st->timers)) != NULL && w->deadline <= now) {
    am_queue_remove(&st->timers, w);
    st->hooks->expire(L, w);
  }
  am_sync(L, st);                             /* re-arms, starts the idle */
  return 0;
}

/* }====================================================== */


/* {====================================================== timers */

/*
** The time a timed request of 'ms' starts from (ms), so that its
** deadline never passes early: the clock read now, not the loop's time
** cached at the start of its turn, which blocking work since may have
** left far behind (docs/semantics.md, Timeouts).  A wait of 0 needs no
** clock: the cached time serves, and it ends at the next timer phase.
** It calls luv, so a request reads it before it decides anything (a hook
** may run).
*/
lua_Number am_timer_now (lua_State *L, State *st, lua_Number ms) {
  return ms > 0 ? clock_now(L, st) : loop_now(L, st);
}


/*
** core.clock([fn]): the clock timed requests start from, a function that
** returns ns as uv.hrtime() does (nil: uv.hrtime itself); returns the one
** before.  Not part of the API: specs of the queues' order (spec/fuzz,
** specs 22 and 31) pin deadlines to the loop's cached time with it, as
** the model they check counts them.
*/
int am_core_clock (lua_State *L) {
  State *st = am_getstate(L);
  luaL_argexpected(L, lua_isnoneornil(L, 1) || lua_isfunction(L, 1), 1,
                   "function or nil");
  lua_settop(L, 1);
  pushref(L, st->hrtime);
  if (lua_isnil(L, 1)) pushref(L, st->hrtime_luv);
  else lua_pushvalue(L, 1);
  lua_rawseti(L, LUA_REGISTRYINDEX, st->hrtime);
  return 1;
}


/*
** Adds a waiter that is already in its lock's queue to the timer queue,
** with the deadline 'now' + 'ms' ('now' from am_timer_now).  Calls no Lua:
** am_sync (re)starts the luv timer when this deadline is the new
** earliest.  The timer fires when the loop's time (whole ms, never ahead
** of the clock) reaches the deadline: never early.
*/
void am_timer_add (lua_State *L, State *st, Waiter *w, lua_Number now,
                   lua_Number ms) {
  Key key;
  w->deadline = now + ms;
  /* keyed by the duration the deadline holds after rounding, so that two
     durations within an ulp of 'now' share one list (arrival order) */
  key = am_key_number(w->deadline - now);
  if (!am_queue_push(&st->timers, w, &key))
    luaL_error(L, "not enough memory");
  st->check_timer = 1;
}


/*
** Removes a waiter from the timer queue, if it is there.  am_sync stops
** the timer when no deadline is left (so it never keeps the loop alive);
** otherwise it may fire early once and is re-armed then.
*/
void am_timer_remove (lua_State *L, State *st, Waiter *w) {
  (void)L;
  if (!w->r.timed || w->t.next == NULL) return;
  am_queue_remove(&st->timers, w);
}

/* }====================================================== */


/* {====================================================== state */

/*
** Debug mode's observer and how many states have it on (async_mutex.h:
** DebugObserver), global so that a report site tests one word without
** reaching its State; defined here, in the lowest layer that reads them
** (a state's __gc ends its debug mode).  core.debug installs the observer
** and counts the states (debug_read.c).
*/
const DebugObserver *am_debug_observer = NULL;
int am_debug_on = 0;


/*
** NOTE: the state is collected only by lua_close (the registry holds it),
** before luv's loop (its __gc is set after luv is loaded, and finalizers
** run newest first).  Finalizers that run after it may still call the
** module (docs/semantics.md, Re-entry): 'closed' makes every later
** request to wait raise, and the module call luv no more.  The waiters
** still in the timer queue are unlinked from it before it is freed, so
** that a grant made then does not touch it.
*/
static int state__gc (lua_State *L) {
  State *st = (State *)lua_touserdata(L, 1);
  Waiter *w;
  /* failures of tasks not reported yet (the loop did not run again):
     to stderr now, with no handler (am_report_error, closed) */
  st->closing = 1;
  do_chores(L, st, st->chore_tail);
  st->closed = 1;
  if (st->dbg != LUA_NOREF) {         /* debug mode ends with the state */
    st->dbg = LUA_NOREF;
    am_debug_on--;
  }
  if (st->dbg_recs != NULL)           /* its owner records */
    am_debug_observer->close(L, st);
  while ((w = am_queue_first(&st->timers)) != NULL)
    am_queue_remove(&st->timers, w);
  am_queue_free(&st->timers);
  free(st->athreads);
  free(st->anchor_next);
  st->athreads = NULL;
  st->anchor_next = NULL;
  st->nathreads = 0;
  return 0;
}


/* Pushes luv's field 'name' of the object at 'idx' and returns a ref. */
static int ref_field (lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  if (lua_isnil(L, -1))
    luaL_error(L, "luv has no '%s'", name);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}


/*
** Pushes luv's module table.  NOTE: luv runs every callback on the thread
** that first required it; if that were a coroutine that later died, later
** callbacks would run on a dead state.  So when luv is not loaded yet and
** we are not on the main thread, require it on a thread of our own that
** stays anchored for good.
*/
static void require_luv (lua_State *L) {
  lua_State *T;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, "luv") == LUA_TTABLE) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 2);
  if (lua_pushthread(L)) {                    /* main thread */
    lua_pop(L, 1);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "luv");
    lua_call(L, 1, 1);
    return;
  }
  lua_pop(L, 1);
  T = lua_newthread(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "async_mutex.luv_thread");
  lua_getglobal(T, "require");
  lua_pushliteral(T, "luv");
  if (lua_pcall(T, 1, 1, 0) != LUA_OK) {
    lua_xmove(T, L, 1);
    lua_error(L);
  }
  lua_xmove(T, L, 1);
}


/* A new state, every field valid, nothing allocated yet. */
static void init_state (State *st) {
  am_list_init(&st->ready);
  am_queue_init(&st->timers, 1);
  st->pending = 0;
  st->timer_due = 0;
  st->idle_on = st->timer_on = st->draining = st->closed = 0;
  st->syncing = 0;
  st->check_idle = st->check_timer = 0;
  st->idle = st->timer = st->idle_start = st->idle_stop = LUA_NOREF;
  st->timer_start = st->timer_stop = st->now = LUA_NOREF;
  st->new_idle = st->new_timer = st->is_closing = LUA_NOREF;
  st->on_idle = st->on_timer = st->handler = LUA_NOREF;
  st->layer_sources = st->layer_wrappers = LUA_NOREF;
  st->anchors = st->keyedlocks = st->stolen = LUA_NOREF;
  st->dbg = LUA_NOREF;
  st->dbg_flags = 0;
  st->dbg_recs = NULL;
  st->athreads = NULL;
  st->anchor_next = NULL;
  st->nathreads = st->nanchors = st->free_anchor = 0;
  st->hrtime = st->hrtime_luv = st->stop = st->loop_mode = LUA_NOREF;
  st->task_body = st->gate_wait = st->gates = st->chores = LUA_NOREF;
  st->collect = LUA_NOREF;
  st->collect_keep = 0;
  st->chore_head = st->chore_tail = 1;
  st->ncanceling = 0;
  st->reporting = 0;
  st->closing = 0;
}


/*
** The luv functions and handles the state uses (luv's module table at
** 'luv'), and our callbacks, with the state (at 'sti') as upvalue.
*/
static void open_luv (lua_State *L, State *st, int sti, int luv) {
  st->now = ref_field(L, luv, "now");
  st->hrtime = ref_field(L, luv, "hrtime");
  st->hrtime_luv = ref_field(L, luv, "hrtime");
  st->stop = ref_field(L, luv, "stop");
  st->loop_mode = ref_field(L, luv, "loop_mode");
  st->new_idle = ref_field(L, luv, "new_idle");
  st->new_timer = ref_field(L, luv, "new_timer");
  st->is_closing = ref_field(L, luv, "is_closing");
  lua_getfield(L, luv, "new_idle");
  lua_call(L, 0, 1);
  st->idle_start = ref_field(L, -1, "start");
  st->idle_stop = ref_field(L, -1, "stop");
  st->idle = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, luv, "new_timer");
  lua_call(L, 0, 1);
  st->timer_start = ref_field(L, -1, "start");
  st->timer_stop = ref_field(L, -1, "stop");
  st->timer = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, sti);
  lua_pushcclosure(L, on_idle, 1);
  st->on_idle = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, sti);
  lua_pushcclosure(L, on_timer, 1);
  st->on_timer = luaL_ref(L, LUA_REGISTRYINDEX);
}


/* A new table with weak 'mode' ("k", "v"), referenced in the registry. */
static int weak_table (lua_State *L, const char *mode) {
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}


/*
** Returns the state of this lua_State, creating it (and the luv handles)
** on first use, and pushes the state userdata.  'hooks': the layers
** above, which every copy of the module gives alike.
*/
State *am_state_open (lua_State *L, const StateHooks *hooks) {
  State *st;
  int sti, luv;
  if (lua_getfield(L, LUA_REGISTRYINDEX, AM_STATE_KEY) == LUA_TUSERDATA)
    return (State *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  st = (State *)lua_newuserdatauv(L, sizeof(State), 0);
  init_state(st);
  st->hooks = hooks;
  sti = lua_gettop(L);
  lua_newtable(L);
  st->anchors = luaL_ref(L, LUA_REGISTRYINDEX);
  st->keyedlocks = weak_table(L, "v");        /* keyed.c: enter_set */
  st->gates = weak_table(L, "k");             /* task.c: push_gate */
  st->stolen = weak_table(L, "k");            /* steal.c */
  lua_newtable(L);                            /* am_chore */
  st->chores = luaL_ref(L, LUA_REGISTRYINDEX);
  require_luv(L);
  luv = lua_gettop(L);
  /* the __gc now, after luv's (see state__gc) */
  luaL_newmetatable(L, AM_STATE);
  lua_pushcfunction(L, state__gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, sti);
  open_luv(L, st, sti, luv);
  lua_settop(L, sti);
  lua_pushvalue(L, sti);
  lua_setfield(L, LUA_REGISTRYINDEX, AM_STATE_KEY);
  return st;
}

/* }====================================================== */
