/*
** client.c: the Client of async_mutex.redis_core: the helpers every file
** of the client uses (its check, its state table, the hooks, whether a
** connection is still its own, its clock, its anchor while calls wait),
** and the methods that read or end it (close, __gc, __tostring, pending;
** core.new, status, state, progress, epoch, now, alive, fail).
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/*
** The registry's key of the set of clients with calls waiting (client ->
** true).  A waiting caller is referenced by its client's FIFO, and the
** client often only by that caller (a local of its function, as a
** coroutine that connects, calls and closes has it): with nothing else
** referring to either, both were garbage together, and a collection
** ended the call with its caller never resumed (docs/redis.md, "Closing
** and exiting").  So a client is anchored from its first waiting call to
** the end of its last, as luv anchors an active handle.
*/
const char amr_ANCHORED = 0;

/*
** Anchors the client at index 'i' ('on'), or lets it go.  Anchoring may
** run a finalizer (the set may grow); letting go allocates nothing.
*/
void amr_anchor (lua_State *L, int i, int on) {
  i = lua_absindex(L, i);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &amr_ANCHORED);
  lua_pushvalue(L, i);
  if (on) lua_pushboolean(L, 1);
  else lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}


/*
** luaL_checkudata, with the metatable compared to the one kept as an
** upvalue: luaL_checkudata looks it up by name in the registry, which
** costs more than a call's formatting (it ran four times per lock cycle).
*/
Client *amr_checkclient (lua_State *L, int i) {
  void *p = lua_touserdata(L, i);
  if (p != NULL && lua_getmetatable(L, i)) {
    int same = lua_rawequal(L, -1, CLIENT_MT);
    lua_pop(L, 1);
    if (same) return (Client *)p;
  }
  return (Client *)luaL_checkudata(L, i, AM_REDIS_CLIENT);   /* raises */
}


/* Pushes the client's state table field `name` (client at index i). */
int amr_getstatefield (lua_State *L, int i, const char *name) {
  lua_getiuservalue(L, i, UV_STATE);
  lua_getfield(L, -1, name);
  lua_remove(L, -2);
  return lua_type(L, -1);
}


/* Calls hooks[name] with the n values on top and `nres` results. */
void amr_callhook (lua_State *L, const char *name, int n, int nres) {
  lua_getfield(L, HOOKS, name);
  lua_insert(L, -(n + 1));
  lua_call(L, n, nres);
}


/*
** Whether the connection's table at index `conn` is still the client's
** (at index i).  RE-ENTRY: every call that can run Lua (a hook, a resumed
** coroutine, a finalizer at an allocation) may close the client or end
** its connection; code that goes on after one looks here first.
*/
int amr_is_current (lua_State *L, int i, int conn) {
  int same;
  lua_getiuservalue(L, i, UV_CONN);
  same = lua_rawequal(L, -1, conn);
  lua_pop(L, 1);
  return same;
}


/*
** The client's clock, in ms: CLOCK_MONOTONIC (POSIX), read for every
** batch of replies (cheap: no system call where the C library reads it
** from the vDSO), and by the Lua layer for its timeouts and back-off
** (core.now), so that every comparison uses one clock.
*/
lua_Integer amr_now_ms (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (lua_Integer)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}




/*
** client:close(): ends the connection; every waiting call raises
** E_UNAVAILABLE ("client closed"); later calls raise "attempt to use a
** closed redis client".
*/
int amr_client_close (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  if (cl->closed) return 0;
  cl->closed = 1;
  lua_settop(L, 1);
  amr_push_unavailable(L, "client closed");
  amr_disconnect(L, 1, cl, 1, FINAL_CLOSE);
  return 0;
}


/*
** NOTE: a client with calls waiting is anchored (ANCHORED), so it is
** collected only with none waiting, or at lua_close, where every object
** is finalized: __gc closes the connection and resumes nobody.  It raises
** nothing: the error it passes on is the E_UNAVAILABLE constant, which
** needs no allocation.
*/
int amr_client__gc (lua_State *L) {
  Client *cl = (Client *)lua_touserdata(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    lua_settop(L, 1);
    lua_getfield(L, HOOKS, "E_UNAVAILABLE");
    amr_disconnect(L, 1, cl, 0, FINAL_GC);
  }
  free(cl->out);
  cl->out = NULL;
  cl->outlen = cl->outcap = 0;
  return 0;
}


int amr_client__tostring (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  lua_pushfstring(L, "%s (%s): %p", AM_REDIS_CLIENT,
                  cl->closed ? "closed" : cl->reader ? "connected" : "idle",
                  (void *)cl);
  return 1;
}


/* client:pending(): calls sent or queued whose reply has not come. */
int amr_client_pending (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  lua_pushinteger(L, cl->tail - cl->head);
  return 1;
}


/* new(state [, subscriber]): a client with no connection; state.ref is
   set to a table that holds it weakly (for its connections' callbacks). */
int amr_core_new (lua_State *L) {
  Client *cl;
  int subscriber = lua_toboolean(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  cl = (Client *)lua_newuserdatauv(L, sizeof(Client), NUSERVALUES);
  memset(cl, 0, sizeof *cl);
  cl->fd = -1;
  cl->subscriber = subscriber;
  luaL_setmetatable(L, AM_REDIS_CLIENT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, 2, UV_STATE);
  lua_newtable(L);
  lua_setiuservalue(L, 2, UV_WAITERS);
  lua_createtable(L, 1, 0);                         /* state.ref */
  lua_pushvalue(L, 2);
  lua_rawseti(L, -2, 1);
  lua_getfield(L, HOOKS, "WEAK_V");
  lua_setmetatable(L, -2);
  lua_setfield(L, 1, "ref");
  return 1;
}


/* fail(client, reason): a timeout ended the connection (E_UNAVAILABLE). */
int amr_core_fail (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  const char *reason = luaL_checkstring(L, 2);
  lua_settop(L, 2);
  amr_push_unavailable(L, "%s", reason);
  amr_disconnect(L, 1, cl, 1, FINAL_NOT);
  return 0;
}


/* status(client): "connecting", "connected", "idle" or "closed" */
int amr_core_status (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  lua_pushstring(L, cl->closed ? "closed" : cl->reader == NULL ? "idle"
                 : cl->connecting ? "connecting" : "connected");
  return 1;
}


/*
** alive(handle): false once luv has finalized the handle.  NOTE: at
** lua_close every object is finalized, newest first, so a client's __gc
** runs after its own stream's and timer's; luv then may have cleared the
** pointer its handle userdata holds (its first word: luv's userdata for a
** handle is that pointer, since its first release), and calling a method
** of the handle would crash (luv dereferences it).  The Lua layer asks
** this first.
*/
int amr_core_alive (lua_State *L) {
  void **p = (void **)lua_touserdata(L, 1);
  lua_pushboolean(L, p != NULL && *p != NULL);
  return 1;
}


/* progress(client): now() when replies last came, or a call was sent with
   none in flight; 0: neither yet */
int amr_core_progress (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  lua_pushinteger(L, cl->progress);
  return 1;
}

/* epoch(client): how many of its connections have ended (a reply read
   at one epoch and a call answered at the same came on one connection) */
int amr_core_epoch (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  lua_pushinteger(L, (lua_Integer)cl->epoch);
  return 1;
}

/* now(): the client's clock (ms, monotonic) */
int amr_core_now (lua_State *L) {
  lua_pushinteger(L, amr_now_ms());
  return 1;
}


/* state(client): the Lua layer's table */
int amr_core_state (lua_State *L) {
  amr_checkclient(L, 1);
  lua_getiuservalue(L, 1, UV_STATE);
  return 1;
}
