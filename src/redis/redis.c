/*
** redis.c: async_mutex.redis_core, a Redis connection on luv's loop.
** hiredis connects, formats commands and parses replies; the socket is
** watched by a luv poll handle made through luv's Lua API (the hooks
** given by src/async_mutex/redis.lua), never by hiredis's bundled
** adapters.  Calls from any number of coroutines are appended to one
** output buffer, written together, and answered in order: a FIFO of
** waiting coroutines pairs each reply with its caller.
** See docs/redis.md.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/* the client's user values */
#define UV_STATE    1   /* the Lua layer's table: address, options, poll */
#define UV_WAITERS  2   /* FIFO of waiting coroutines: [head, tail) */

/* poll events */
#define EV_R  1
#define EV_W  2

typedef struct Client {
  redisContext *c;      /* NULL: no connection */
  int connecting;       /* connect() in progress on c */
  int events;           /* events the poll handle is started with */
  int in_poll;          /* inside onpoll: writes wait for its end */
  int closed;           /* close() was called: no more calls */
  lua_Integer head, tail;
} Client;

/* index of the hooks table: every Lua-callable function's upvalue */
#define HOOKS  lua_upvalueindex(1)


static Client *checkclient (lua_State *L, int i) {
  return (Client *)luaL_checkudata(L, i, AM_REDIS_CLIENT);
}


/* Calls hooks[name] with the n values on top; leaves nothing. */
static void callhook (lua_State *L, const char *name, int n) {
  lua_getfield(L, HOOKS, name);
  lua_insert(L, -(n + 1));
  lua_call(L, n, 0);
}


/* Pushes the client's state table field `name` (client at index i). */
static int getstatefield (lua_State *L, int i, const char *name) {
  lua_getiuservalue(L, i, UV_STATE);
  lua_getfield(L, -1, name);
  lua_remove(L, -2);
  return lua_type(L, -1);
}


/*
** Starts, changes or stops the poll handle to watch what the connection
** needs: writable while connecting or while output waits, readable while
** replies are due.  Nothing is watched when nothing is in flight, so an
** idle client keeps no active handle.
*/
static void update_poll (lua_State *L, int i, Client *cl) {
  int want = 0;
  if (cl->c != NULL) {
    if (cl->connecting) want = EV_W;
    else {
      if (cl->tail > cl->head) want |= EV_R;
      if (sdslen(cl->c->obuf) > 0) want |= EV_W;
    }
  }
  if (want == cl->events) return;
  getstatefield(L, i, "poll");
  if (want == 0)
    callhook(L, "stop", 1);
  else {
    lua_pushstring(L, want == EV_R ? "r" : want == EV_W ? "w" : "rw");
    callhook(L, "start", 2);
  }
  cl->events = want;
}


/*
** Writes what the output buffer holds, as far as the socket takes it.
** send() with MSG_NOSIGNAL, not hiredis's write(): a lost connection
** must be an error here, not a SIGPIPE that kills the process.  Returns
** 0 on a broken connection.
*/
static int flush (Client *cl) {
  redisContext *c = cl->c;
  while (sdslen(c->obuf) > 0) {
    ssize_t n = send(c->fd, c->obuf, sdslen(c->obuf), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    sdsrange(c->obuf, n, -1);
  }
  return 1;
}


/*
** Resumes coroutine co with `nargs` values moved from L's top.  An error
** escaping co is handed to hooks.report with its traceback (a luv
** callback must not raise); its results, if it ended, are dropped.
*/
static void resume (lua_State *L, lua_State *co, int nargs) {
  int nres, status;
  if (lua_status(co) != LUA_YIELD) {        /* closed meanwhile */
    lua_pop(L, nargs);
    return;
  }
  lua_xmove(L, co, nargs);
  status = lua_resume(co, L, nargs, &nres);
  if (status == LUA_OK || status == LUA_YIELD)
    lua_pop(co, nres);
  else {
    const char *msg;
    lua_xmove(co, L, 1);                          /* error */
    msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (msg == NULL)
      msg = lua_pushfstring(L, "(error object is a %s value)",
                            luaL_typename(L, -1));
    else lua_pushvalue(L, -1);
    luaL_traceback(L, co, msg, 0);               /* err msg tb */
    lua_remove(L, -2);                           /* err tb */
    lua_pushthread(co);
    lua_xmove(co, L, 1);                         /* err tb co */
    callhook(L, "report", 3);
  }
}


/*
** Ends the connection: closes the poll handle and the socket, then
** resumes every waiting coroutine with (false, E_UNAVAILABLE), in call
** order.  The FIFO is detached first, so that a resumed coroutine's new
** call starts a new connection.  `resume_them` is 0 from __gc.
*/
static void disconnect (lua_State *L, int i, Client *cl, int resume_them) {
  lua_Integer head = cl->head, tail = cl->tail, k;
  if (cl->c != NULL) {
    getstatefield(L, i, "poll");
    callhook(L, "close", 1);
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushnil(L);
    lua_setfield(L, -2, "poll");
    lua_pop(L, 1);
    redisFree(cl->c);
    cl->c = NULL;
  }
  cl->connecting = 0;
  cl->events = 0;
  if (head == tail) return;
  lua_getiuservalue(L, i, UV_WAITERS);          /* the old FIFO */
  lua_newtable(L);
  lua_setiuservalue(L, i, UV_WAITERS);
  cl->head = cl->tail = 0;
  if (!resume_them) {
    lua_pop(L, 1);
    return;
  }
  for (k = head; k < tail; k++) {
    lua_rawgeti(L, -1, k);
    if (lua_type(L, -1) == LUA_TTHREAD && lua_tothread(L, -1) != L) {
      lua_State *co = lua_tothread(L, -1);
      lua_pushboolean(L, 0);
      lua_pushliteral(L, AM_E_UNAVAILABLE);
      resume(L, co, 2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}


/*
** Opens a connection to the address in the state table (host = a
** numeric address, resolved by the Lua layer, and port; or path), and
** its poll handle.  Returns 0 if the attempt failed at once.
*/
static int connect_now (lua_State *L, int i, Client *cl) {
  redisContext *c;
  if (getstatefield(L, i, "path") == LUA_TSTRING)
    c = redisConnectUnixNonBlock(lua_tostring(L, -1));
  else {
    getstatefield(L, i, "host");
    getstatefield(L, i, "port");
    c = redisConnectNonBlock(luaL_checkstring(L, -2),
                             (int)luaL_checkinteger(L, -1));
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  if (c == NULL) return 0;
  if (c->err) {
    redisFree(c);
    return 0;
  }
  cl->c = c;
  cl->connecting = 1;
  cl->events = 0;
  lua_pushinteger(L, c->fd);
  lua_pushvalue(L, i);
  lua_getiuservalue(L, i, UV_STATE);
  callhook(L, "open", 3);                      /* sets state.poll */
  return 1;
}


/* {====================================================== call */

/* call's continuation: resumed with (true, reply) or (false, error). */
static int call_k (lua_State *L, int status, lua_KContext ctx) {
  (void)status; (void)ctx;
  if (lua_toboolean(L, -2)) return 1;
  return lua_error(L);                          /* the value, unchanged */
}


/*
** Turns argument i into the string hiredis sends: strings as they are,
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
** client:call(command, ...): sends the command and suspends the calling
** coroutine until its reply; returns the reply, or raises the Error of
** an error reply, or E_UNAVAILABLE if the connection fails first.
*/
static int client_call (lua_State *L) {
  Client *cl = checkclient(L, 1);
  int n = lua_gettop(L) - 1, k, ismain;
  const char *sv[16];
  size_t lv[16];
  const char **argv = sv;
  size_t *argl = lv;
  if (cl->closed)
    return luaL_error(L, "attempt to use a closed redis client");
  ismain = lua_pushthread(L);
  lua_pop(L, 1);
  if (ismain || !lua_isyieldable(L))
    return luaL_error(L, "attempt to call redis outside a coroutine");
  if (n < 1) luaL_typeerror(L, 2, "string or number");
  for (k = 2; k <= n + 1; k++) argstring(L, k);
  if (n > 16) {
    argv = (const char **)lua_newuserdatauv(L, n * sizeof(char *), 0);
    argl = (size_t *)lua_newuserdatauv(L, n * sizeof(size_t), 0);
  }
  for (k = 0; k < n; k++) argv[k] = lua_tolstring(L, k + 2, &argl[k]);
  if (cl->c == NULL && !connect_now(L, 1, cl)) {
    lua_pushliteral(L, AM_E_UNAVAILABLE);
    return lua_error(L);
  }
  if (redisAppendCommandArgv(cl->c, n, argv, argl) != REDIS_OK)
    return luaL_error(L, "not enough memory");
  lua_getiuservalue(L, 1, UV_WAITERS);
  lua_pushthread(L);
  lua_rawseti(L, -2, cl->tail++);
  lua_pop(L, 1);
  /* alone in flight: write now (the poll's next turn would cost a loop
     iteration); otherwise the batch goes at the end of onpoll, or when
     the socket is writable */
  if (!cl->in_poll && !cl->connecting && cl->tail - cl->head == 1)
    flush(cl);              /* a failure shows as a readable end of file */
  update_poll(L, 1, cl);
  return lua_yieldk(L, 0, 0, call_k);
}

/* }====================================================== */


/*
** onpoll(client, err, events): the poll handle's callback.  Completes
** the connect, reads and parses what arrived, resumes each waiter with
** its reply in call order, then writes the calls those coroutines made
** meanwhile in one go.  A poll error, end of file or protocol error ends
** the connection (E_UNAVAILABLE for every call still waiting).
*/
static int client_onpoll (lua_State *L) {
  Client *cl = checkclient(L, 1);
  const char *ev = luaL_optstring(L, 3, "");
  int broken = 0, nready = 0, r;
  redisContext *c = cl->c;
  void *reply;
  lua_settop(L, 3);
  if (c == NULL) return 0;                      /* a stale event */
  if (!lua_isnil(L, 2)) broken = 1;
  else if (cl->connecting) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err)
      broken = 1;
    else cl->connecting = 0;
  }
  else if (strchr(ev, 'r') != NULL && redisBufferRead(c) != REDIS_OK)
    broken = 1;
  /* the replies that arrived, paired with their callers: {co, reply}... */
  lua_newtable(L);                               /* 4: ready */
  lua_getiuservalue(L, 1, UV_WAITERS);           /* 5 */
  while (cl->head < cl->tail
         && (r = redisGetReply(c, &reply)) == REDIS_OK && reply != NULL) {
    redisReply *rp = (redisReply *)reply;
    lua_rawgeti(L, 5, cl->head);
    lua_pushnil(L);
    lua_rawseti(L, 5, cl->head++);
    lua_rawseti(L, 4, ++nready);
    lua_pushboolean(L, rp->type != REDIS_REPLY_ERROR);
    lua_rawseti(L, 4, ++nready);
    amr_pushreply(L, rp);
    lua_rawseti(L, 4, ++nready);
    freeReplyObject(reply);
  }
  if (c->err) broken = 1;                       /* a protocol error */
  lua_pop(L, 1);
  cl->in_poll = 1;
  for (r = 1; r <= nready; r += 3) {
    lua_rawgeti(L, 4, r);
    lua_rawgeti(L, 4, r + 1);
    lua_rawgeti(L, 4, r + 2);
    resume(L, lua_tothread(L, -3), 2);
    lua_pop(L, 1);
  }
  cl->in_poll = 0;
  if (cl->c != c) return 0;          /* closed by a resumed coroutine */
  if (!broken && !cl->connecting && !flush(cl)) broken = 1;
  if (broken) disconnect(L, 1, cl, 1);
  else update_poll(L, 1, cl);
  return 0;
}


/*
** client:close(): ends the connection; every waiting call raises
** E_UNAVAILABLE; later calls raise "attempt to use a closed redis client".
*/
static int client_close (lua_State *L) {
  Client *cl = checkclient(L, 1);
  cl->closed = 1;
  disconnect(L, 1, cl, 1);
  return 0;
}


/*
** NOTE: a client is collected only when its waiting coroutines are
** unreachable too (they are anchored in its FIFO and hold it on their
** stacks): __gc closes the connection and resumes nobody.
*/
static int client__gc (lua_State *L) {
  Client *cl = (Client *)lua_touserdata(L, 1);
  if (cl->c != NULL) disconnect(L, 1, cl, 0);
  cl->closed = 1;
  return 0;
}


static int client__tostring (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushfstring(L, "%s (%s): %p", AM_REDIS_CLIENT,
                  cl->closed ? "closed" : cl->c ? "connected" : "idle",
                  (void *)cl);
  return 1;
}


/* client:pending(): calls sent or queued whose reply has not come. */
static int client_pending (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushinteger(L, cl->tail - cl->head);
  return 1;
}


/* new(state): a client with no connection; state is the Lua layer's. */
static int core_new (lua_State *L) {
  Client *cl;
  luaL_checktype(L, 1, LUA_TTABLE);
  cl = (Client *)lua_newuserdatauv(L, sizeof(Client), 2);
  memset(cl, 0, sizeof *cl);
  cl->closed = 0;
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, UV_STATE);
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_WAITERS);
  luaL_setmetatable(L, AM_REDIS_CLIENT);
  return 1;
}


/* error(message): an async_mutex.redis.Error as an error reply makes it */
static int core_error (lua_State *L) {
  size_t len;
  const char *msg = luaL_checklstring(L, 1, &len);
  amr_pusherror(L, msg, len);
  return 1;
}


static const luaL_Reg client_methods[] = {
  {"call", client_call},
  {"close", client_close},
  {"pending", client_pending},
  {NULL, NULL}
};

static const luaL_Reg client_metamethods[] = {
  {"__gc", client__gc},
  {"__close", client_close},
  {"__tostring", client__tostring},
  {NULL, NULL}
};

static const luaL_Reg core_funcs[] = {
  {"new", core_new},
  {"error", core_error},
  {"onpoll", client_onpoll},
  {NULL, NULL}
};


/*
** The module table: new, error, onpoll, E_UNAVAILABLE, hooks (filled by
** the Lua layer: open, start, stop, close, report) and Client (the
** methods table, which the Lua layer extends).
*/
__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_redis_core (lua_State *L) {
  amr_openerror(L);
  lua_newtable(L);                              /* module */
  lua_newtable(L);                              /* hooks */
  luaL_newmetatable(L, AM_REDIS_CLIENT);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, client_metamethods, 1);
  lua_newtable(L);                              /* methods */
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, client_methods, 1);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_setfield(L, -4, "Client");               /* module.Client */
  lua_pop(L, 1);                                /* metatable */
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "hooks");
  luaL_setfuncs(L, core_funcs, 1);              /* hooks as upvalue */
  lua_pushliteral(L, AM_E_UNAVAILABLE);
  lua_setfield(L, -2, "E_UNAVAILABLE");
  return 1;
}
