/*
** call.c: client:call and core.script: a command appended to the output
** (its arguments converted, a connection made first if needed), the
** caller queued on the client's FIFO and suspended until its reply,
** which event.c (or disconnect's error) resumes it with.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/*
** call's continuation: resumed by deliver with (DELIVER, true, reply) or
** (DELIVER, false, error).  Anything else is a stray amr_resume (by someone
** else's coroutine.resume): the caller goes on waiting, as a coroutine
** waiting in the core's locks does (docs/semantics.md, "Spurious
** resumes"); its reply will still come.
*/
static int call_k (lua_State *L, int status, lua_KContext ctx) {
  int base = (int)ctx;
  (void)status;
  if (lua_gettop(L) != base + 3
      || lua_touserdata(L, base + 1) != (void *)&amr_DELIVER) {
    lua_settop(L, base);
    return lua_yieldk(L, 0, ctx, call_k);
  }
  if (lua_toboolean(L, base + 2)) return 1;
  /* READONLY: the server was demoted to a replica (a failover); the Lua
     layer decides what it means (hooks.readonly: for a client that
     follows a master through Sentinel, find it again) */
  if (lua_type(L, base + 3) == LUA_TTABLE) {
    int readonly;
    lua_pushliteral(L, "code");
    readonly = lua_rawget(L, base + 3) == LUA_TSTRING
               && strcmp(lua_tostring(L, -1), "READONLY") == 0;
    lua_pop(L, 1);
    if (readonly) {
      lua_getiuservalue(L, 1, UV_STATE);
      lua_pushvalue(L, 1);
      lua_pushvalue(L, base + 3);
      amr_callhook(L, "readonly", 3, 1);           /* what to raise */
    }
  }
  return lua_error(L);                          /* the value, unchanged */
}


/*
** Turns argument i into the string that is sent: strings as they are,
** integers in decimal, floats in the shortest form that reads back the
** same ("%.17g" at most; 3.0 as "3").  Leaves the string at index i.
*/
static void argstring (lua_State *L, int i) {
  int t = lua_type(L, i);
  if (t == LUA_TSTRING) return;
  if (t == LUA_TNUMBER && lua_isinteger(L, i)) {
    lua_tostring(L, i);                         /* converts in place */
    return;
  }
  if (t == LUA_TNUMBER) {
    char buf[64];
    lua_Number x = lua_tonumber(L, i);
    luaL_argcheck(L, x == x, i, "number must not be NaN");
    snprintf(buf, sizeof buf, "%.15g", (double)x);
    if (strtod(buf, NULL) != (double)x)
      snprintf(buf, sizeof buf, "%.17g", (double)x);
    lua_pushstring(L, buf);
    lua_replace(L, i);
    return;
  }
  luaL_typeerror(L, i, "string or number");
}


/*
** Appends the command made of the arguments from index 2 on to the
** output buffer (converting them first: a bad one raises, changing
** nothing).  Returns 1; or 0, with the E_UNAVAILABLE to raise on top, if
** no connection could be had; or 2 with a wait record on top (only when
** `canwait`: see amr_ensure_connection).
*/
int amr_append (lua_State *L, Client *cl, int canwait) {
  int n = lua_gettop(L) - 1, k;
  const char *sv[16];
  size_t lv[16];
  const char **argv = sv;
  size_t *argl = lv;
  if (n < 1) luaL_typeerror(L, 2, "string or number");
  for (k = 2; k <= n + 1; k++) argstring(L, k);
  if (n > 16) {
    argv = (const char **)lua_newuserdatauv(L, n * sizeof(char *), 0);
    argl = (size_t *)lua_newuserdatauv(L, n * sizeof(size_t), 0);
  }
  for (k = 0; k < n; k++) argv[k] = lua_tolstring(L, k + 2, &argl[k]);
  if ((k = amr_ensure_connection(L, 1, cl, canwait)) != 1) return k;
  if (!amr_write_command(cl, n, argv, argl))
    luaL_error(L, "not enough memory");
  return 1;
}


/*
** client:call(command, ...): sends the command and suspends the calling
** coroutine until its reply; returns the reply, or raises the Error of
** an error reply, or E_UNAVAILABLE if the connection fails first.  'cl'
** is the client at index 1, checked by the caller (amr_client_call, or
** amr_core_script, which would otherwise check it twice per request).
*/
static int call_again_k (lua_State *L, int status, lua_KContext ctx);

static int call (lua_State *L, Client *cl) {
  int ismain, base = lua_gettop(L), r;
  unsigned epoch;
  if (cl->closed)
    return luaL_error(L, "attempt to use a closed redis client");
  ismain = lua_pushthread(L);
  lua_pop(L, 1);
  if (ismain || !lua_isyieldable(L))
    return luaL_error(L, "attempt to call redis outside a coroutine");
  if ((r = amr_append(L, cl, 1)) == 0) return lua_error(L);
  if (r == 2) {               /* the server is being found: wait, retry */
    lua_copy(L, -1, base + 1);
    lua_settop(L, base + 1);                /* the arguments, the record */
    return call_again_k(L, LUA_YIELD, (lua_KContext)base);
  }
  /* a wait begins: the time since the last reply is not part of it (the
     command timer may run on from an earlier wait, when this call is made
     from the callback that delivered its reply, after blocking work) */
  if (cl->tail == cl->head) cl->progress = amr_now_ms();
  epoch = cl->epoch;
  lua_getiuservalue(L, 1, UV_WAITERS);
  lua_pushthread(L);
  lua_rawseti(L, -2, cl->tail++);           /* may run a finalizer */
  lua_pop(L, 1);
  if (cl->epoch == epoch && cl->tail - cl->head == 1)
    amr_anchor(L, 1, 1);                        /* may run a finalizer */
  /* alone in flight: write now (the loop's next turn would cost an
     iteration); otherwise the batch goes at the end of the read callback
     that runs this coroutine */
  if (cl->epoch == epoch) {
    if (!cl->in_event) {
      int e = cl->tail - cl->head == 1 ? amr_flush(cl) : 0;
      if (e != 0) amr_fail_errno(L, 1, cl, e);
      else amr_update_watch(L, 1, cl);
    }
    else if (cl->outlen >= FLUSH_AT) {
      int e = amr_flush(cl);
      if (e != 0) amr_fail_errno(L, 1, cl, e);
    }
  }
  /* RE-ENTRY: the connection ended while this call joined it (a hook, or
     a finalizer, closed the client): every other caller was resumed with
     the error, this one raises it */
  if (cl->epoch != epoch) {
    /* (ended during the anchoring: anchored after disconnect let go) */
    if (cl->head == cl->tail) amr_anchor(L, 1, 0);
    lua_getiuservalue(L, 1, UV_ERROR);
    return lua_error(L);
  }
  return lua_yieldk(L, 0, (lua_KContext)lua_gettop(L), call_k);
}

/*
** A call waiting for the Lua layer to find its server (a wait record at
** base + 1 above its arguments): once record.done, it is made again from
** the start, or raises record.err when the search failed (a stray resume
** finds the record unsettled and goes on waiting); a client closed
** meanwhile cut it off, as close cuts off the calls in flight.
*/
static int call_again_k (lua_State *L, int status, lua_KContext ctx) {
  int base = (int)ctx;
  Client *cl = (Client *)lua_touserdata(L, 1);
  (void)status;
  lua_settop(L, base + 1);            /* what a stray resume passed: gone */
  lua_getfield(L, base + 1, "done");
  if (!lua_toboolean(L, -1)) {
    lua_pop(L, 1);
    return lua_yieldk(L, 0, ctx, call_again_k);
  }
  lua_pop(L, 1);
  if (cl->closed) {
    amr_push_unavailable(L, "client closed");
    return lua_error(L);
  }
  /* the search failed: its E_UNAVAILABLE (the next calls get the
     back-off's, which says when the next search may come) */
  if (lua_getfield(L, base + 1, "err") != LUA_TNIL) return lua_error(L);
  lua_settop(L, base);
  return call(L, cl);
}

int amr_client_call (lua_State *L) {
  return call(L, amr_checkclient(L, 1));
}

/* Pushes n in decimal: lua_tostring would format an integer with
   snprintf, at every call. */
static void pushcount (lua_State *L, size_t n) {
  char digits[24], *end = digits + sizeof digits, *p = end;
  do {
    *--p = (char)('0' + n % 10);
    n /= 10;
  } while (n > 0);
  lua_pushlstring(L, p, (size_t)(end - p));
}


/*
** script(client, command, script, keys, args): client:call(command,
** script, #keys, keys..., args...) with the keys and args taken from their
** lists here, so that a script's caller (client:eval, the Redis locks)
** builds no argument list in Lua.  The args may also be given as values
** (script(client, command, script, keys, arg1, arg2, ...)): the Redis
** locks pass theirs so, which spares a table per request.  Each list's
** length is read once (a __len may answer differently each time) and
** checked before the stack is reserved for it.
*/
#define MAX_SCRIPT_ARGS  (INT_MAX / 4)

int amr_core_script (lua_State *L) {
  lua_Integer nk, na, k;
  int top = lua_gettop(L);
  int list = top == 5 && lua_type(L, 5) == LUA_TTABLE;
  Client *cl = amr_checkclient(L, 1);
  if (cl->closed) {
    /* its callers (client:eval, the Redis locks) refuse a closed client at
       their own entry: closed since, by a hook or a finalizer, it cut the
       operation off, as a close cuts off the calls in flight */
    amr_push_unavailable(L, "client closed");
    return lua_error(L);
  }
  luaL_checktype(L, 4, LUA_TTABLE);
  nk = luaL_len(L, 4);
  luaL_argcheck(L, nk >= 0 && nk <= MAX_SCRIPT_ARGS, 4, "too many keys");
  na = list ? luaL_len(L, 5) : top - 4;
  luaL_argcheck(L, na >= 0 && na <= MAX_SCRIPT_ARGS, 5, "too many args");
  luaL_checkstack(L, (int)(nk + na + 4), "too many arguments");
  if (list) {
    lua_settop(L, 5);
    pushcount(L, (size_t)nk);
    for (k = 1; k <= nk; k++) lua_rawgeti(L, 4, k);
    for (k = 1; k <= na; k++) lua_rawgeti(L, 5, k);
    lua_rotate(L, 4, -2);                       /* the two lists on top */
    lua_pop(L, 2);
  }
  else {                    /* client command script keys args... */
    pushcount(L, (size_t)nk);
    for (k = 1; k <= nk; k++) lua_rawgeti(L, 4, k);
    lua_rotate(L, 5, (int)nk + 1);      /* n and the keys before args */
    lua_remove(L, 4);                           /* the keys' list */
  }
  return call(L, cl);              /* client command script n keys args */
}
