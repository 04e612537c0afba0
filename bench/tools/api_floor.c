/*
** api_floor.c: the least the Lua API charges for the shape of the hot path
** of a lock (docs/bench.md, "What the API shape costs"), with no lock at
** all: the same calls our acquire and releaser make to hand out a fresh
** releaser and to check their 'self', and nothing else.  Its objects have
** the sizes of ours (async_mutex.h: a Releaser, an untimed Waiter), so
** the allocator and the collector do the same work.
**   cc -shared -fPIC -O3 -fno-plt -I/usr/include/lua5.4 \
**      -o build/bench/api_floor.so bench/tools/api_floor.c   (the Makefile's flags)
**   local f = package.loadlib("build/bench/api_floor.so", "luaopen_api_floor")()
**   local x = f.new()        -- a "lock": a userdata with its own metatable
**   x:fresh()()              -- a releaser: userdata, metatable, user value
**   x:checked()()            -- the same, with both self checks
**   x:waited()()             -- a waited acquire's object, made and handed
**                               out at once (no yield)
**   f.start(uv.new_idle())   -- then, in a coroutine: x:acquire()() waits
**                               as ours does (below), resumed from C;
**                               x:acquire_bare()() without the checks
** bench/scenarios.lua runs these as IMPL `floor` with the flag `shape`.
*/

#include "lua.h"
#include "lauxlib.h"

#include "../../src/core/async_mutex.h"

/* upvalues of every function: the metatables */
#define LOCK_MT     lua_upvalueindex(1)
#define PLAIN_MT    lua_upvalueindex(2)      /* releaser, no check */
#define CHECKED_MT  lua_upvalueindex(3)      /* releaser, checks self */
#define WAITER_MT   lua_upvalueindex(4)      /* __close: a no-op */
#define READY       lua_upvalueindex(5)      /* the ready ring; "idle" */
#define SCHED       lua_upvalueindex(6)      /* its Sched */
#define NUPVALUES   6

/* The ready coroutines, anchored at READY[1 + i % RING] for head <= i <
   tail (bench/floor.lua's list, in C). */
#define RING  1024
typedef struct Sched {
  lua_Integer head, tail;
  int started;
} Sched;

/* am_isself's test (async_mutex.h), on argument 1 against 'mt' */
static void *isself (lua_State *L, int mt) {
  void *p = lua_touserdata(L, 1);
  if (p != NULL && lua_getmetatable(L, 1)) {
    int same = lua_topointer(L, -1) == lua_topointer(L, mt);
    lua_pop(L, 1);
    if (same) return p;
  }
  return NULL;
}

static void *checkself (lua_State *L, int mt, const char *name) {
  void *p = isself(L, mt);
  return p ? p : luaL_checkudata(L, 1, name);     /* raises */
}

/* a fresh releaser of the lock at 1: am_push_releaser's calls */
static Releaser *push_releaser (lua_State *L, int mt, int nuv) {
  Releaser *r = (Releaser *)lua_newuserdatauv(L, sizeof(Releaser), nuv);
  *r = (Releaser){.lock = NULL, .state = S_HELD, .ref = LUA_NOREF};
  lua_pushvalue(L, mt);
  lua_setmetatable(L, -2);
  if (nuv > 0) {
    lua_pushvalue(L, 1);                /* the lock, anchored */
    lua_setiuservalue(L, -2, 1);
  }
  return r;
}

static int new_lock (lua_State *L) {
  lua_newuserdatauv(L, sizeof(Lock), 1);
  lua_pushvalue(L, LOCK_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* a fresh releaser with no user value (no anchor of its lock) */
static int fresh_bare (lua_State *L) {
  push_releaser(L, PLAIN_MT, 0);
  return 1;
}

/* a fresh releaser, its lock anchored in its user value */
static int fresh (lua_State *L) {
  push_releaser(L, PLAIN_MT, 1);
  return 1;
}

/* the same, after checking self */
static int checked (lua_State *L) {
  checkself(L, LOCK_MT, "api_floor.Lock");
  push_releaser(L, CHECKED_MT, 1);
  return 1;
}

/*
** A waited acquire's object, as hand_out_waiter hands it out: an untimed
** waiter (with its lock in its user value) to-be-closed on the stack, its
** slot closed (its __close called), then made a releaser.  (Ours keeps it
** across the yield; here it is made and handed out in one call.)
*/
static int waited (lua_State *L) {
  Releaser *r;
  checkself(L, LOCK_MT, "api_floor.Lock");
  r = (Releaser *)lua_newuserdatauv(L, AM_UNTIMED_SIZE, 1);
  *r = (Releaser){.lock = NULL, .state = S_NEW, .ref = LUA_NOREF};
  lua_pushvalue(L, WAITER_MT);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, -1);
  lua_closeslot(L, -2);
  r->state = S_HELD;
  lua_pushvalue(L, CHECKED_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/*
** The yield and resume of a hand-off, done as ours does them, from C with
** no lock: acquire(self) checks self, makes the waiter (to-be-closed, its
** lock in its user value), puts the running coroutine in the ready ring
** and yields; the idle callback (drain, from C) resumes it; it hands its
** waiter out as its releaser (waiter.c: hand_out_waiter).
*/
static void call_idle (lua_State *L, int start) {
  lua_getfield(L, READY, "idle");
  lua_getfield(L, -1, start ? "start" : "stop");
  lua_insert(L, -2);
  if (start) lua_getfield(L, READY, "drain");    /* idle:start(drain) */
  lua_call(L, 1 + start, 0);
}

static int finish_wait (lua_State *L, int status, lua_KContext ctx) {
  Releaser *w = (Releaser *)ctx;
  (void)status;
  lua_pushvalue(L, 2);                  /* the waiter, handed out */
  lua_closeslot(L, 2);
  w->state = S_HELD;
  lua_pushvalue(L, w->weight ? CHECKED_MT : PLAIN_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* 'checked': both self checks (its own, its releaser's) */
static int wait (lua_State *L, int checked) {
  Sched *s = (Sched *)lua_touserdata(L, SCHED);
  Releaser *w;
  if (checked) checkself(L, LOCK_MT, "api_floor.Lock");
  lua_settop(L, 1);
  w = (Releaser *)lua_newuserdatauv(L, AM_UNTIMED_SIZE, 1);
  *w = (Releaser){.lock = NULL, .weight = checked, .state = S_NEW,
                  .ref = LUA_NOREF};
  lua_pushvalue(L, WAITER_MT);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushthread(L);                    /* anchored while it waits */
  lua_rawseti(L, READY, 1 + s->tail++ % RING);
  if (!s->started) {
    s->started = 1;
    call_idle(L, 1);
  }
  return lua_yieldk(L, 0, (lua_KContext)w, finish_wait);
}

static int acquire_wait (lua_State *L) {
  return wait(L, 1);
}

static int acquire_wait_bare (lua_State *L) {
  return wait(L, 0);
}

/* The idle callback: resumes the ready coroutines in order, those readied
   meanwhile too (bench/floor.lua's on_idle). */
static int drain (lua_State *L) {
  Sched *s = (Sched *)lua_touserdata(L, SCHED);
  while (s->head < s->tail) {
    int slot = (int)(1 + s->head++ % RING), nres, status;
    lua_State *co;
    lua_rawgeti(L, READY, slot);
    co = lua_tothread(L, -1);
    status = lua_resume(co, L, 0, &nres);
    if (status != LUA_OK && status != LUA_YIELD)
      return luaL_error(L, "api_floor: %s", lua_tostring(co, -1));
    if (nres != 0) lua_pop(co, nres);
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_rawseti(L, READY, slot);
  }
  s->started = 0;
  call_idle(L, 0);
  return 0;
}

/* start(idle): the idle handle the waits are resumed from */
static int start (lua_State *L) {
  lua_pushvalue(L, 1);
  lua_setfield(L, READY, "idle");
  return 0;
}

static int release_plain (lua_State *L) {
  Releaser *r = (Releaser *)lua_touserdata(L, 1);
  int held = r->state == S_HELD;
  r->state = S_RELEASED;
  lua_pushboolean(L, held);
  return 1;
}

/* releaser_release's check: its metatable stays on the stack */
static int release_checked (lua_State *L) {
  Releaser *r = (Releaser *)lua_touserdata(L, 1);
  int held;
  if (r == NULL || !lua_getmetatable(L, 1)
      || lua_topointer(L, -1) != lua_topointer(L, CHECKED_MT))
    r = (Releaser *)luaL_checkudata(L, 1, "api_floor.Releaser");
  held = r->state == S_HELD;
  r->state = S_RELEASED;
  lua_pushboolean(L, held);
  return 1;
}

static int waiter_close (lua_State *L) {
  (void)lua_touserdata(L, 1);
  return 0;
}

LUAMOD_API int luaopen_api_floor (lua_State *L) {
  int i;
  static const char *const names[] = {"api_floor.Lock",
    "api_floor.PlainReleaser", "api_floor.Releaser", "api_floor.Waiter"};
  for (i = 0; i < 4; i++) luaL_newmetatable(L, names[i]);   /* 1..4 */
  lua_createtable(L, RING, 2);                              /* 5: ring */
  *(Sched *)lua_newuserdatauv(L, sizeof(Sched), 0) = (Sched){0, 0, 0};
  lua_newtable(L);                                          /* 7: module */
#define SET(name, f, where)  do { \
    for (i = 1; i <= NUPVALUES; i++) lua_pushvalue(L, i); \
    lua_pushcclosure(L, f, NUPVALUES); lua_setfield(L, where, name); \
  } while (0)
  SET("new", new_lock, 7);
  SET("start", start, 7);
  SET("drain", drain, 5);
  /* lock methods */
  lua_newtable(L);                                          /* 8 */
  SET("fresh_bare", fresh_bare, 8);
  SET("fresh", fresh, 8);
  SET("checked", checked, 8);
  SET("waited", waited, 8);
  SET("acquire", acquire_wait, 8);
  SET("acquire_bare", acquire_wait_bare, 8);
  lua_setfield(L, 1, "__index");
  SET("__call", release_plain, 2);
  SET("__close", release_plain, 2);
  SET("__call", release_checked, 3);
  SET("__close", release_checked, 3);
  SET("__close", waiter_close, 4);
#undef SET
  return 1;
}
