/*
** args.c: the user's arguments: self, weights, priorities, keys, options
** Argument errors have the auxlib's shape, numbered as the user wrote
** them, for plain, keyed and decorated locks alike (docs/semantics.md,
** Errors).
*/

#define LUA_LIB

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/*
** The module's metatable names (registry keys and __name), by type: what
** argument errors name; core.c registers the metatables under them.
*/
#define TNAME(T, C, ...)  [AM_T_##T] = "async_mutex." #C,
#define DNAME(T, C, ...)  [AM_T_DECORATED_##T] = "async_mutex.decorated " #C,
const char *const am_tnames[AM_NTYPES] = {
  AM_LOCK_KINDS(TNAME) AM_KEYED_KINDS(TNAME)
  AM_LOCK_KINDS(DNAME) AM_KEYED_KINDS(DNAME)
  [AM_T_RELEASER] = AM_RELEASER,
  [AM_T_WAITER] = AM_WAITER,
  [AM_T_TASK] = AM_TASK,
  [AM_T_GROUP] = AM_GROUP,
  [AM_T_SIGNAL] = AM_SIGNAL,
};



/*
** The index of the lock type, from 'first' to 'last', whose metatable
** the value at 'idx' has, or -1.
*/
static int whichtype (lua_State *L, int idx, int first, int last) {
  int t, found = -1;
  if (lua_touserdata(L, idx) != NULL && lua_getmetatable(L, idx)) {
    const void *mt = lua_topointer(L, -1);
    for (t = first; t <= last && found < 0; t++)
      if (mt == lua_topointer(L, am_mtindex(t))) found = t;
    lua_pop(L, 1);
  }
  return found;
}


/* The lock of any kind at 'idx' (not a keyed set), or NULL. */
Lock *am_tolock (lua_State *L, int idx) {
  return whichtype(L, idx, 0, AM_NKINDS - 1) >= 0
         ? (Lock *)lua_touserdata(L, idx) : NULL;
}


/* The keyed set of any kind at 'idx', or NULL. */
Keyed *am_tokeyed (lua_State *L, int idx) {
  return whichtype(L, idx, AM_FIRST_KEYED, AM_NLOCKTYPES - 1) >= 0
         ? (Keyed *)lua_touserdata(L, idx) : NULL;
}


/* The userdata at 'idx' if its metatable is type 't''s, or NULL. */
void *am_testself (lua_State *L, int idx, AmType t) {
  return am_isself(L, idx, t);
}


/*
** If argument 1 is a decorated lock of lock type 't' (decorated.c),
** replaces it by its lock (its user value 1) and returns 1; otherwise 0.
*/
int am_undecorate (lua_State *L, AmType t) {
  if (t >= AM_NLOCKTYPES || am_isself(L, 1, am_decorated_type(t)) == NULL)
    return 0;
  lua_getiuservalue(L, 1, 1);
  lua_replace(L, 1);
  return 1;
}


/*
** luaL_checkudata for argument 1, with the metatable from an upvalue.  A
** decorated lock of type 't' is replaced by its lock: every method but
** the requests is the lock's own (decorated.c).
*/
void *am_checkself (lua_State *L, AmType t) {
  void *p = am_isself(L, 1, t);
  if (p == NULL && am_undecorate(L, t)) p = lua_touserdata(L, 1);
  return p ? p : luaL_checkudata(L, 1, am_tnames[t]);  /* raises */
}


/* {====================================================== positions */

/*
** core.layer(source, wrappers): a chunk of the Lua layer (the module's
** Lua files that raise on the user's behalf: init.lua, debug.lua), whose
** frames errors pass over to find the user's call; and its public
** functions that call requests: wrappers[fn] = {name, from, shift}: fn
** is the user's 'name', where the request's argument #n, for n >= from,
** is argument #n + shift.  The chunks are a list (State.layer_sources).
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
    lua_newtable(L);
    st->layer_sources = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  if (!am_in_layer(L, st, lua_tostring(L, 1))) {  /* a chunk loaded again */
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_sources);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
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
** Whether 'source' is a chunk of the Lua layer.  Allocates nothing (so
** no finalizer runs): it serves the reports of debug mode and am.run too.
*/
int am_in_layer (lua_State *L, State *st, const char *source) {
  int i;
  if (st->layer_sources == LUA_NOREF) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_sources);
  for (i = 1; lua_rawgeti(L, -1, i) == LUA_TSTRING; i++) {
    int same = strcmp(lua_tostring(L, -1), source) == 0;
    lua_pop(L, 1);
    if (same) {
      lua_pop(L, 1);
      return 1;
    }
  }
  lua_pop(L, 2);
  return 0;
}


/*
** Pushes where a usage error belongs, as luaL_where does: the user's call.
** Level 1 called the C function raising; while it is a function of the
** Lua layer, the user called that one: go up.  The outermost public
** function of the layer passed gives the name and the argument number
** the user sees ('*fname', '*n'; NULL: keep them).
*/
static void where_user (lua_State *L, const char **fname, int *n) {
  State *st = am_getstate(L);
  lua_Debug ar;
  int level = 1;
  if (st->layer_wrappers == LUA_NOREF) {
    luaL_where(L, 1);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->layer_wrappers);
  while (lua_getstack(L, level, &ar)) {
    lua_getinfo(L, "Sf", &ar);                    /* pushes the function */
    if (!am_in_layer(L, st, ar.source)) {         /* the user's */
      lua_pop(L, 1);
      break;
    }
    if (fname != NULL && lua_rawget(L, -2) == LUA_TTABLE) {  /* public */
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
      lua_rawgeti(L, -3, 3);
      *fname = lua_tostring(L, -3);               /* anchored */
      if (*n >= lua_tointeger(L, -2))
        *n += (int)lua_tointeger(L, -1);
      lua_pop(L, 3);
    }
    lua_pop(L, 1);
    level++;
  }
  lua_pop(L, 1);
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


/* __name of the value at 'idx', or its type name. */
static const char *typename_of (lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING)
    return lua_tostring(L, -1);
  return luaL_typename(L, idx);
}


/* am_argerror saying "<expected> expected, got <the type at idx>". */
int am_typeerror (lua_State *L, int idx, int base, const char *fname,
                  const char *expected) {
  lua_pushfstring(L, "%s expected, got %s", expected, typename_of(L, idx));
  return am_argerror(L, idx, base, fname, lua_tostring(L, -1));
}


/*
** The one argument error of the Lua modules: core.argerror(n, fname, msg
** [, level]) raises "bad argument #n to 'fname' (msg)" at the user's call
** (the first frame outside the Lua layer: core.layer), or given a level,
** at that one (1: the caller of core.argerror, as error()'s).
** core.typeerror(n, fname, expected, value) raises it saying "<expected>
** expected, got <value's __name or type>" ("no value" when there is
** none).  The names are the caller's own, and its argument numbers.
*/
static int raise_argerror (lua_State *L, int n, const char *fname,
                           const char *msg, int level) {
  if (level > 0) luaL_where(L, level);
  else where_user(L, NULL, NULL);
  lua_pushfstring(L, "%sbad argument #%d to '%s' (%s)", lua_tostring(L, -1),
                  n, fname, msg);
  return lua_error(L);
}

int am_core_argerror (lua_State *L) {
  int n = (int)luaL_checkinteger(L, 1);
  const char *fname = luaL_checkstring(L, 2);
  const char *msg = luaL_checkstring(L, 3);
  return raise_argerror(L, n, fname, msg, (int)luaL_optinteger(L, 4, 0));
}

int am_core_typeerror (lua_State *L) {
  int n = (int)luaL_checkinteger(L, 1);
  const char *fname = luaL_checkstring(L, 2);
  const char *expected = luaL_checkstring(L, 3);
  lua_pushfstring(L, "%s expected, got %s", expected, typename_of(L, 4));
  return raise_argerror(L, n, fname, lua_tostring(L, -1), 0);
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

/* core.usage_error(msg): the Lua modules' misuse errors, at the user's
** call as the core's (am_usage_error). */
int am_core_usage_error (lua_State *L) {
  return am_usage_error(L, "%s", luaL_checkstring(L, 1));
}


/*
** A request that may wait needs a coroutine that can yield (docs/
** semantics.md, Coroutines and the loop).  The main thread (a luv
** callback runs there too) is "outside a coroutine"; a coroutine running
** a function Lua cannot yield across (a metamethod, a table.sort
** comparator, a debug hook, a finalizer) is told so: it is inside a
** coroutine, and the fix is to call from the coroutine's own code.
** Pushes the complaint about attempting 'act' ("acquire a mutex") here,
** or nothing when the running coroutine can yield; returns whether it
** pushed one.  The one owner of these words: the Lua modules get them
** through core.cannot_yield (async_mutex/checks.lua).
*/
static int push_cannot_yield (lua_State *L, const char *act) {
  int main;
  if (lua_isyieldable(L)) return 0;
  main = lua_pushthread(L);
  lua_pop(L, 1);
  if (main)
    lua_pushfstring(L, "attempt to %s outside a coroutine", act);
  else
    lua_pushfstring(L, "attempt to %s where the coroutine cannot yield "
                    "(inside a metamethod or a function called from C, "
                    "such as a table.sort comparator)", act);
  return 1;
}


/* Raises the complaint of push_cannot_yield at the user's call, if any. */
void am_check_yieldable (lua_State *L, const char *act) {
  if (push_cannot_yield(L, act))
    am_usage_error(L, "%s", lua_tostring(L, -1));
}


/* core.cannot_yield(act): that complaint, or nil when the caller's
   coroutine can yield. */
int am_cannot_yield (lua_State *L) {
  const char *act = luaL_checkstring(L, 1);
  if (!push_cannot_yield(L, act)) lua_pushnil(L);
  return 1;
}

/* }====================================================== */


/* {====================================================== options */

/* How many option names a complaint lists, at most. */
#define MAX_OPTIONS  64
/* Names longer than this get no suggestion. */
#define MAX_NAME     64

static int cmp_names (const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}


/*
** The edit distance between 'a' and 'b', ignoring case: insertions,
** deletions, substitutions and swaps of two neighbours (optimal string
** alignment).  Both at most MAX_NAME long.
*/
static size_t distance (const char *a, size_t la, const char *b, size_t lb) {
  unsigned char d[MAX_NAME + 1][MAX_NAME + 1];    /* each at most 64 */
  size_t i, j;
  for (i = 0; i <= la; i++) d[i][0] = (unsigned char)i;
  for (j = 0; j <= lb; j++) d[0][j] = (unsigned char)j;
  for (i = 1; i <= la; i++)
    for (j = 1; j <= lb; j++) {
      int ca = tolower((unsigned char)a[i - 1]);
      int cb = tolower((unsigned char)b[j - 1]);
      size_t best = (size_t)d[i - 1][j - 1] + (ca != cb);
      if ((size_t)d[i - 1][j] + 1 < best) best = (size_t)d[i - 1][j] + 1;
      if ((size_t)d[i][j - 1] + 1 < best) best = (size_t)d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2])
          && tolower((unsigned char)a[i - 2]) == cb
          && (size_t)d[i - 2][j - 2] + 1 < best)
        best = (size_t)d[i - 2][j - 2] + 1;
      d[i][j] = (unsigned char)best;
    }
  return d[la][lb];
}


/* Does 'p' (length 'lp') begin 's', ignoring case? */
static int is_prefix (const char *p, size_t lp, const char *s) {
  size_t i;
  for (i = 0; i < lp; i++)
    if (s[i] == '\0'
        || tolower((unsigned char)p[i]) != tolower((unsigned char)s[i]))
      return 0;
  return 1;
}


/*
** The option 'key' most likely meant, among 'names' (sorted): the nearest
** by edit distance, if near enough for its length (a typo, a swap, a
** wrong case: 'maxPendng', 'tll', 'onlost'), or one it begins or that
** begins it ('renew', 'ttlMs'); NULL if none.
*/
static const char *nearest (const char *key, const char *const names[],
                            int n) {
  size_t lk = strlen(key), limit, best = (size_t)-1;
  const char *found = NULL;
  int i;
  if (lk == 0 || lk > MAX_NAME) return NULL;
  limit = lk <= 3 ? 1 : lk <= 8 ? 2 : 3;
  for (i = 0; i < n; i++) {
    size_t ln = strlen(names[i]), d;
    if (ln > MAX_NAME) continue;
    d = distance(key, lk, names[i], ln);
    if (d > limit && !(lk >= 3 && is_prefix(key, lk, names[i]))
        && !(ln >= 3 && is_prefix(names[i], ln, key)))
      continue;
    if (d < best) {
      best = d;
      found = names[i];
    }
  }
  return found;
}


/*
** Pushes the complaint about the key at 'keyidx' of an options table,
** with the 'n' names it takes: "unknown option 'k'; did you mean 'x'?
** options: a, b, x" ("unknown option 'k'; options: a, b, x" when none is
** near: nearest), k as tostring shows it.  The one owner of this text:
** the Lua modules get it through core.unknown_option
** (async_mutex/checks.lua), so a misspelt option reads alike everywhere.
*/
static void push_unknown (lua_State *L, int keyidx, const char *names[],
                          int n) {
  luaL_Buffer b;
  const char *key, *near = NULL;
  int i;
  keyidx = lua_absindex(L, keyidx);
  qsort((void *)names, (size_t)n, sizeof(names[0]), cmp_names);
  key = luaL_tolstring(L, keyidx, NULL);
  if (lua_type(L, keyidx) == LUA_TSTRING) near = nearest(key, names, n);
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "unknown option '%s'", key);
  luaL_addvalue(&b);
  if (near != NULL) {
    lua_pushfstring(L, "; did you mean '%s'?", near);
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, n == 0 ? "; it takes no options"
                     : near != NULL ? " options: " : "; options: ");
  for (i = 0; i < n; i++) {
    if (i > 0) luaL_addstring(&b, ", ");
    luaL_addstring(&b, names[i]);
  }
  luaL_pushresult(&b);
  lua_remove(L, -2);                              /* the key's text */
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
** 'known': "bad argument #n to 'fname' (unknown option 'k'; ...)" at the
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
      const char *names[MAX_OPTIONS];
      int n = 0;
      while (known[n] != NULL && n < MAX_OPTIONS) {
        names[n] = known[n];
        n++;
      }
      push_unknown(L, -1, names, n);
      am_argerror(L, idx, base, fname, lua_tostring(L, -1));
    }
  }
}


/*
** core.unknown_option(options, known): the complaint about the first key
** of 'options' that the set 'known' lacks (a key with a true value), or
** nil (checks.unknown_option).
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
      const char *names[MAX_OPTIONS];             /* anchored by 'known' */
      int n = 0;
      lua_pop(L, 1);
      lua_pushnil(L);
      while (lua_next(L, 2) != 0) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_toboolean(L, -1)
            && n < MAX_OPTIONS)
          names[n++] = lua_tostring(L, -2);
        lua_pop(L, 1);
      }
      push_unknown(L, 3, names, n);
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


/* The default priority: the integer 0. */
static Key priority_zero (void) {
  Key k;
  k.n = 0;
  k.i = 0;
  k.flt = 0;
  return k;
}


/*
** A priority: any number but NaN, default 0; compared exactly as Lua
** compares numbers (async_mutex.h: Key).
*/
static Key optpriority (lua_State *L, int idx, int base,
                        const char *fname) {
  lua_Number p;
  Key k;
  if (lua_isnoneornil(L, idx)) return priority_zero();
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
  if (idx > lua_gettop(L)) {
    /* no argument (most often: m:acquire()): the defaults, without
       asking each argument's type (a call each) */
    rq->weight = kind->weighted || rq->mode == 0 ? 1 : rq->mode;
    rq->priority = priority_zero();
  }
  else {
    rq->weight = kind->weighted ? am_optweight(L, idx++, rq->base, rq->fname)
                                : rq->mode ? rq->mode : 1;
    rq->priority = optpriority(L, idx, rq->base, rq->fname);
  }
  if (rq->wait < AM_TRY && !lua_isyieldable(L))       /* tries, steals */
    am_check_yieldable(L, lua_pushfstring(L, "%s %s",
                       rq->kind == W_ACQUIRE ? "acquire" : "wait for",
                       kind->noun));
}


/*
** A request of the lock of type 't' at argument 1 (a decorated one's
** lock: am_checkself), read where the kind builds it: self, then its
** arguments (am_parse_request).  Returns the lock, also in 'rq'.
*/
Lock *am_parse_lock_request (lua_State *L, Request *rq, AmType t) {
  Lock *lk = (Lock *)am_checkself(L, t);
  rq->lock = lk;
  rq->lockidx = 1;
  am_parse_request(L, rq, lk->kind);
  return lk;
}
