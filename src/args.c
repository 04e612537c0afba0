/*
** args.c: the user's arguments: self, weights, priorities, keys, options
** Argument errors have the auxlib's shape, numbered as the user wrote
** them, for plain, keyed and decorated locks alike (docs/semantics.md,
** Errors).
*/

#define LUA_LIB

#include <stdarg.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "async_mutex.h"


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


/*
** luaL_checkudata for argument 1, with the metatable from an upvalue.  A
** decorated lock of type 't' is replaced by its lock: every method but
** the requests is the lock's own (decorated.c).
*/
void *am_checkself (lua_State *L, AmType t) {
  void *p = am_testself(L, 1, t);
  if (p == NULL && am_undecorate(L, t)) p = lua_touserdata(L, 1);
  return p ? p : luaL_checkudata(L, 1, am_tnames[t]);  /* raises */
}


/* {====================================================== positions */

/*
** core.layer(source, wrappers): the Lua layer's chunk name, and its
** public functions that call requests: wrappers[fn] = {name, from,
** shift}: fn is the user's 'name', where the request's argument #n, for
** n >= from, is argument #n + shift.
*/
int am_layer (lua_State *L) {
  State *st = am_getstate(L);
  luaL_checktype(L, 1, LUA_TSTRING);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (st->layer_wrappers == LUA_NOREF) {
    lua_newtable(L);                              /* weak keys: copies of */
    lua_newtable(L);                              /* the layer come and go */
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    st->layer_wrappers = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 1);
    st->layer_source = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_wrappers);
  lua_pushnil(L);
  while (lua_next(L, 2) != 0) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, 3);                             /* wrappers[fn] = spec */
  }
  return 0;
}


/*
** Pushes where a usage error belongs, as luaL_where does: the user's call.
** Level 1 called the C function raising; while it is a function of the
** Lua layer, the user called that one: go up.  The outermost public
** function of the layer passed gives the name and the argument number
** the user sees ('*fname', '*n').
*/
static void where_user (lua_State *L, const char **fname, int *n) {
  State *st = am_getstate(L);
  const char *source;
  lua_Debug ar;
  int level = 1;
  if (st->layer_source == LUA_NOREF) {
    luaL_where(L, 1);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_source);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_wrappers);
  source = lua_tostring(L, -2);
  while (lua_getstack(L, level, &ar)) {
    lua_getinfo(L, "Sf", &ar);                    /* pushes the function */
    if (strcmp(ar.source, source) != 0) {         /* the user's */
      lua_pop(L, 1);
      break;
    }
    if (lua_rawget(L, -2) == LUA_TTABLE) {        /* a public function */
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
      lua_rawgeti(L, -3, 3);
      if (fname != NULL) *fname = lua_tostring(L, -3);  /* anchored */
      if (n != NULL && *n >= lua_tointeger(L, -2))
        *n += (int)lua_tointeger(L, -1);
      lua_pop(L, 3);
    }
    lua_pop(L, 1);
    level++;
  }
  lua_pop(L, 2);
  luaL_where(L, level);
}


/*
** 'bad argument #n to fname (msg)', at the user's call.  'base' is the
** stack index just before the user's first argument (1 for a method:
** self).  Called directly, the position is the caller's, as in
** luaL_argerror (none when the caller is C, such as pcall).
*/
int am_argerror (lua_State *L, int idx, int base, const char *fname,
                 const char *msg) {
  int n = idx - base;
  where_user(L, &fname, &n);
  lua_pushfstring(L, "%sbad argument #%d to '%s' (%s)", lua_tostring(L, -1),
                  n, fname, msg);
  return lua_error(L);
}


/* luaL_error for misuse, at the user's call. */
int am_usage_error (lua_State *L, const char *fmt, ...) {
  va_list argp;
  va_start(argp, fmt);
  where_user(L, NULL, NULL);
  lua_pushvfstring(L, fmt, argp);
  va_end(argp);
  lua_concat(L, 2);
  return lua_error(L);
}

/* }====================================================== */


/* {====================================================== options */

/*
** Pushes the complaint about the key at 'keyidx' of an options table:
** "unknown option 'k'", k as tostring shows it.  The one owner of this
** text: the Lua modules get it through core.unknown_option
** (async_mutex/checks.lua), so a misspelt option reads alike everywhere.
*/
static void push_unknown (lua_State *L, int keyidx) {
  luaL_tolstring(L, keyidx, NULL);
  lua_pushfstring(L, "unknown option '%s'", lua_tostring(L, -1));
  lua_remove(L, -2);
}


/* Whether the key on top is a string among 'known' (NULL-terminated). */
static int is_known (lua_State *L, const char *const known[]) {
  const char *k;
  int i;
  if (lua_type(L, -1) != LUA_TSTRING) return 0;
  k = lua_tostring(L, -1);
  for (i = 0; known[i] != NULL; i++)
    if (strcmp(k, known[i]) == 0) return 1;
  return 0;
}


/*
** Refuses the options table at 'idx' (a table) when it has a key not in
** 'known': "bad argument #n to 'fname' (unknown option 'k')" at the
** user's call, as am_argerror numbers it.  A misspelt option is an error,
** not a default silently kept.
*/
void am_checkoptions (lua_State *L, int idx, int base, const char *fname,
                      const char *const known[]) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    lua_pop(L, 1);                                /* the value */
    if (!is_known(L, known)) {
      push_unknown(L, -1);
      am_argerror(L, idx, base, fname, lua_tostring(L, -1));
    }
  }
}


/*
** core.unknown_option(options, known): the complaint about the first key
** of 'options' that the set 'known' lacks, or nil (checks.unknown_option).
*/
int am_unknown_option (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  lua_pushnil(L);
  while (lua_next(L, 1) != 0) {
    lua_pop(L, 1);                                /* the value */
    lua_pushvalue(L, -1);
    if (lua_gettable(L, 2) == LUA_TNIL || !lua_toboolean(L, -1)) {
      push_unknown(L, 3);
      return 1;
    }
    lua_pop(L, 1);
  }
  lua_pushnil(L);
  return 1;
}

/* }====================================================== */


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


/*
** A count (a value): an integer, numbers only (numeric strings refused,
** like a weight's).
*/
lua_Integer am_checkcount (lua_State *L, int idx) {
  luaL_checktype(L, idx, LUA_TNUMBER);
  return luaL_checkinteger(L, idx);
}


/*
** A priority: any number but NaN, default 0; compared exactly as Lua
** compares numbers (async_mutex.h: Key).
*/
static Key optpriority (lua_State *L, int idx, int base,
                        const char *fname) {
  lua_Number p;
  Key k;
  if (lua_isnoneornil(L, idx)) {           /* the integer 0 */
    k.n = 0;
    k.i = 0;
    k.flt = 0;
    return k;
  }
  if (lua_isinteger(L, idx)) {
    k.i = lua_tointeger(L, idx);
    k.n = (lua_Number)k.i;
    k.flt = 0;
    return k;
  }
  if (lua_type(L, idx) != LUA_TNUMBER) {
    lua_pushfstring(L, "priority must be a number, got %s",
                    luaL_typename(L, idx));
    am_argerror(L, idx, base, fname, lua_tostring(L, -1));
  }
  p = lua_tonumber(L, idx);
  if (p != p)
    am_argerror(L, idx, base, fname, "priority must not be NaN");
  return am_key_number(p);
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
                              : rq->mode ? rq->mode : 1;
  rq->priority = optpriority(L, idx, rq->base, rq->fname);
  if (rq->wait != AM_TRY && !lua_isyieldable(L))
    am_usage_error(L, "attempt to %s %s outside a coroutine",
               rq->kind == W_ACQUIRE ? "acquire" : "wait for", kind->noun);
}
