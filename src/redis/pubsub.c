/*
** pubsub.c: what a subscriber client does beyond a client's calls (a
** command sent with no caller waiting, reading while idle, its drop), and
** the raw steps the Lua layer's subscriptions need in one piece
** (core.claim, core.enlist).
*/
#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/*
** send(client, ...): a subscriber's command (SUBSCRIBE, ...), sent with
** no caller waiting; connects first if needed.  Returns true; or false
** and the E_UNAVAILABLE when no connection can be had now, or the client
** is closed: a subscriber is closed by its client's finalizer (amr_core_drop),
** which may run between the caller's look at status() and this call
** (spec/86).
*/
int amr_core_send (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  if (cl->closed) {
    lua_pushboolean(L, 0);
    amr_push_unavailable(L, "client closed");
    return 2;
  }
  if (!amr_append(L, cl, 0)) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  if (!cl->in_event) {
    int e = amr_flush(cl);
    if (e != 0) amr_fail_errno(L, 1, cl, e);
    else amr_update_watch(L, 1, cl);
  }
  lua_pushboolean(L, 1);
  return 1;
}


/* listen(client, on): whether a subscriber keeps reading when idle. */
int amr_core_listen (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  cl->listening = lua_toboolean(L, 2);
  if (!cl->in_event) amr_update_watch(L, 1, cl);
  return 0;
}

/* drop(client): a subscriber whose client was collected: closes it
   without resuming anyone (see amr_client__gc) */
int amr_core_drop (lua_State *L) {
  Client *cl = amr_checkclient(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    lua_settop(L, 1);
    lua_getfield(L, HOOKS, "E_UNAVAILABLE");
    amr_disconnect(L, 1, cl, 0, FINAL_GC);
  }
  return 0;
}



/*
** claim(t, key, v): t[key] if it is set (not false or nil), else v, stored
** there; raw accesses, in one step no hook can come between (the Lua
** layer's subscriber, made once per client: a second one made meanwhile
** by a hook would be left open).
*/
int amr_core_claim (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 3);
  lua_pushvalue(L, 2);
  lua_rawget(L, 1);
  if (lua_toboolean(L, -1)) return 1;
  lua_pop(L, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, 1);
  return 1;                                          /* v */
}


/*
** enlist(sub, channel, rec, fresh): the Lua layer's wait for a channel's
** confirmation (redis.lua, subscribe).  Appends rec to sub.waiting[channel],
** or, when no wait is there, returns nothing if the channel is subscribed
** already (sub.channels[channel]: confirmed), else stores fresh (a list
** made by the caller, holding rec) there.  Returns the list.  Raw accesses
** and no allocation, in one step no hook or finalizer can come between: a
** lost connection settles and replaces sub.waiting, a confirmation removes
** the channel's list, and a record stored after either would wait for ever.
*/
int amr_core_enlist (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 4);
  if (lua_getfield(L, 1, "waiting") != LUA_TTABLE)     /* 5: sub.waiting */
    return luaL_error(L, "BUG: enlist: sub.waiting is no table");
  lua_pushvalue(L, 2);
  if (lua_rawget(L, 5) == LUA_TTABLE) {                /* 6: its list */
    lua_pushvalue(L, 3);
    lua_rawseti(L, 6, (lua_Integer)lua_rawlen(L, 6) + 1);
    return 1;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "channels") == LUA_TTABLE) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) != LUA_TNIL) return 0;       /* confirmed */
  }
  lua_settop(L, 5);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 4);
  lua_rawset(L, 5);
  lua_pushvalue(L, 4);
  return 1;
}
