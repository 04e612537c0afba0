/*
** args.c: the user's arguments: self, weights, priorities, keys
** Argument errors have the auxlib's shape, numbered as the user wrote
** them, for plain, keyed and decorated locks alike (docs/semantics.md,
** Errors).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


/*
** 'bad argument #n to fname (msg)'.  'base' is the stack index just
** before the user's first argument (1 for a method: self).  Like
** luaL_argerror, the message is positioned at the Lua code that called
** the method (level 1 is this C function).
*/
int am_argerror (lua_State *L, int idx, int base, const char *fname,
                 const char *msg) {
  return luaL_error(L, "bad argument #%d to '%s' (%s)", idx - base, fname,
                    msg);
}


/* The userdata at 'idx' if its metatable is type 't''s, or NULL. */
void *am_testself (lua_State *L, int idx, AmType t) {
  void *p = lua_touserdata(L, idx);
  if (p != NULL && lua_getmetatable(L, idx)) {
    int same = lua_rawequal(L, -1, am_mtindex(t));
    lua_pop(L, 1);
    if (same) return p;
  }
  return NULL;
}


/* luaL_checkudata for argument 1, with the metatable from an upvalue. */
void *am_checkself (lua_State *L, AmType t) {
  void *p = am_testself(L, 1, t);
  return p ? p : luaL_checkudata(L, 1, am_tnames[t]);  /* raises */
}


/* A weight: a positive integer (integral floats accepted), default 1. */
lua_Integer am_optweight (lua_State *L, int idx, int base,
                          const char *fname) {
  lua_Integer w;
  int isint;
  if (lua_isnoneornil(L, idx)) return 1;
  w = lua_tointegerx(L, idx, &isint);
  if (lua_type(L, idx) != LUA_TNUMBER || !isint || w <= 0)
    am_argerror(L, idx, base, fname, "weight must be a positive integer");
  return w;
}


/* A priority: any number but NaN, default 0. */
static lua_Number optpriority (lua_State *L, int idx, int base,
                               const char *fname) {
  lua_Number p;
  if (lua_isnoneornil(L, idx)) return 0;
  if (lua_type(L, idx) != LUA_TNUMBER) {
    lua_pushfstring(L, "priority must be a number, got %s",
                    luaL_typename(L, idx));
    am_argerror(L, idx, base, fname, lua_tostring(L, -1));
  }
  p = lua_tonumber(L, idx);
  if (p != p)
    am_argerror(L, idx, base, fname, "priority must not be NaN");
  return p;
}


/* A key is any value usable as a table key: not nil, not NaN. */
void am_checkkey (lua_State *L, int idx, int base, const char *fname) {
  if (lua_isnoneornil(L, idx))
    am_argerror(L, idx, base, fname, "key must not be nil");
  if (lua_type(L, idx) == LUA_TNUMBER) {
    lua_Number n = lua_tonumber(L, idx);
    if (n != n) am_argerror(L, idx, base, fname, "key must not be NaN");
  }
}


/*
** Reads the weight (weighted kinds) and the priority from 'rq->first';
** then checks that a request that may wait can: it needs a coroutine
** that can yield (docs/semantics.md, Coroutines and the loop).
*/
void am_parse_request (lua_State *L, Request *rq, const LockKind *kind) {
  int idx = rq->first;
  rq->weight = kind->weighted ? am_optweight(L, idx++, rq->base, rq->fname)
                              : 1;
  rq->priority = optpriority(L, idx, rq->base, rq->fname);
  if (rq->wait != AM_TRY && !lua_isyieldable(L))
    luaL_error(L, "attempt to %s %s outside a coroutine",
               rq->kind == W_ACQUIRE ? "acquire" : "wait for", kind->noun);
}
