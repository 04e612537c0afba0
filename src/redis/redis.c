/*
** redis.c: async_mutex.redis_core, a Redis connection on luv's loop.
** hiredis connects, formats commands and parses replies; the socket is
** watched by a luv poll handle made through luv's Lua API (the hooks
** given by src/async_mutex/redis.lua), never by hiredis's bundled
** adapters, and started here with a callback of this file: readiness is
** handled in C, with no Lua closure per event.  Calls from any number of
** coroutines are appended to one output buffer, written together, and
** answered in order: a FIFO of waiting coroutines pairs each reply with
** its caller.
** See docs/redis.md.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

#include "lua.h"
#include "lauxlib.h"

#include <uv.h>
#include <luv/luv.h>
#include <luv/lhandle.h>

#include "redis.h"
#include "../error_text.h"     /* shared with the core: the Makefile */


/* the client's user values */
#define UV_STATE    1   /* the Lua layer's table: address, options, poll */
#define UV_WAITERS  2   /* FIFO of waiting coroutines: [head, tail) */

/* poll events */
#define EV_R  1
#define EV_W  2

/*
** Output that waits for the end of a poll callback is written as soon as
** it reaches this size: the server starts on the first calls while the
** callback resumes the other callers (with 50 calls in flight, replies
** and requests then overlap instead of alternating in whole batches).
*/
#define FLUSH_AT  2048

typedef struct Client {
  redisContext *c;      /* NULL: no connection */
  void **poll;          /* the luv poll handle's userdata (its uv handle
                           pointer, NULL once luv finalized it); NULL: none */
  uint64_t progress;    /* loop time (ms) of the last reply delivered */
  int connecting;       /* connect() in progress on c */
  int events;           /* events the poll handle is started with */
  int in_poll;          /* inside onpoll: writes wait for its end */
  int closed;           /* close() was called: no more calls */
  int subscriber;       /* a pub/sub connection: replies go to hooks.message */
  int listening;        /* a subscriber with subscriptions: always reading */
  unsigned gen;         /* counts connections: tells a new one from c */
  lua_Integer head, tail;
} Client;

/* index of the hooks table: every Lua-callable function's first upvalue */
#define HOOKS  lua_upvalueindex(1)

/* registry keys: the clients by address (weak values), for the poll
   callback; the function it runs (poll_event, with the hooks upvalue) */
static const char CLIENTS_KEY = 0;
static const char EVENT_KEY = 0;


/* the clients' metatable: every Lua-callable function's second upvalue */
#define CLIENT_MT  lua_upvalueindex(2)

/*
** luaL_checkudata, with the metatable compared to the one kept as an
** upvalue: luaL_checkudata looks it up by name in the registry, which
** costs more than a call's formatting (it ran four times per lock cycle).
*/
static Client *checkclient (lua_State *L, int i) {
  void *p = lua_touserdata(L, i);
  if (p != NULL && lua_getmetatable(L, i)) {
    int same = lua_rawequal(L, -1, CLIENT_MT);
    lua_pop(L, 1);
    if (same) return (Client *)p;
  }
  return (Client *)luaL_checkudata(L, i, AM_REDIS_CLIENT);   /* raises */
}


/* Pushes the client's state table field `name` (client at index i). */
static int getstatefield (lua_State *L, int i, const char *name) {
  lua_getiuservalue(L, i, UV_STATE);
  lua_getfield(L, -1, name);
  lua_remove(L, -2);
  return lua_type(L, -1);
}


/* Calls hooks[name] with the n values on top and `nres` results. */
static void callhook (lua_State *L, const char *name, int n, int nres) {
  lua_getfield(L, HOOKS, name);
  lua_insert(L, -(n + 1));
  lua_call(L, n, nres);
}


static void on_poll (uv_poll_t *h, int status, int events);
static void bind_poll (lua_State *L, int i, Client *cl, int h);

/*
** Watches what the connection needs and tells the Lua layer (hooks.watch):
** writable while connecting or while output waits, readable while
** replies are due (or a subscriber listens); nil when nothing, so an idle
** client keeps no active handle.  The Lua layer also runs the connect and
** command timeouts on it.
*/
static void update_poll (lua_State *L, int i, Client *cl) {
  int want = 0;
  if (cl->c != NULL) {
    if (cl->connecting) want = EV_W;
    else {
      if (cl->tail > cl->head || cl->listening) want |= EV_R;
      if (sdslen(cl->c->obuf) > 0) want |= EV_W;
    }
  }
  if (want == cl->events) return;
  if (cl->poll != NULL && *cl->poll != NULL
      && !uv_is_closing((uv_handle_t *)*cl->poll)) {
    uv_poll_t *h = (uv_poll_t *)*cl->poll;
    if (want == 0) uv_poll_stop(h);
    else uv_poll_start(h, (want & EV_R ? UV_READABLE : 0)
                          | (want & EV_W ? UV_WRITABLE : 0), on_poll);
  }
  lua_getiuservalue(L, i, UV_STATE);
  if (want == 0) lua_pushnil(L);
  else lua_pushstring(L, want == EV_R ? "r" : want == EV_W ? "w" : "rw");
  callhook(L, "watch", 2, 0);
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
** callback must not raise), after co is closed, so that its pending
** to-be-closed variables (releasers) run, as the locks' scheduler does
** (am_report); its results, if it ended, are dropped.
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
    /* the traceback first, as the core does (scheduler.c, am_report): the
       error's __tostring is Lua code, and may close the dead coroutine */
    luaL_traceback(L, co, NULL, 0);              /* err tb0 */
    msg = am_push_error_text(L, -2);             /* err tb0 msg */
    lua_pushfstring(L, "%s\n%s", msg, lua_tostring(L, -2));  /* ... tb */
    lua_replace(L, -3);                          /* err tb msg */
    lua_pop(L, 1);                               /* err tb */
    /* an errored thread resets with its own error; another one on top
       means one of its __close handlers failed too */
    if (lua_resetthread(co) != LUA_OK && lua_gettop(co) > 0) {
      lua_xmove(co, L, 1);                       /* err tb err2 */
      if (!lua_rawequal(L, -3, -1))
        fprintf(stderr,
                "async_mutex.redis: error closing a dead coroutine: %s\n",
                lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?");
      lua_pop(L, 1);
    }
    lua_settop(co, 0);
    callhook(L, "report", 2, 0);
  }
}


/*
** Ends the connection: tells the Lua layer (hooks.lost closes the poll
** handle; `final` is FINAL_CLOSE or FINAL_GC when the client itself
** ends), closes the socket, then
** resumes every waiting coroutine with (false, error) in call order; the
** error is the value at index `err`, or E_UNAVAILABLE when `err` is 0.
** The FIFO is detached first, so that a resumed coroutine's new call
** starts a new connection.  `resume_them` is 0 from __gc.
*/
#define FINAL_NOT    0
#define FINAL_CLOSE  1
#define FINAL_GC     2

static void pushfinal (lua_State *L, int final) {
  if (final == FINAL_NOT) lua_pushnil(L);
  else lua_pushstring(L, final == FINAL_CLOSE ? "close" : "gc");
}

static void disconnect (lua_State *L, int i, Client *cl, int err,
                        int resume_them, int final) {
  lua_Integer head = cl->head, tail = cl->tail, k;
  if (err < 0) err = lua_gettop(L) + err + 1;
  if (cl->c != NULL) {
    int was_connected = !cl->connecting;
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushboolean(L, was_connected);
    pushfinal(L, final);
    cl->poll = NULL;                      /* hooks.lost closes it */
    callhook(L, "lost", 3, 0);
    redisFree(cl->c);
    cl->c = NULL;
  }
  else if (final) {
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushboolean(L, 0);
    pushfinal(L, final);
    callhook(L, "lost", 3, 0);
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
      if (err) lua_pushvalue(L, err);
      else lua_pushliteral(L, AM_E_UNAVAILABLE);
      resume(L, co, 2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}


/*
** Opens a connection to the address in the state table (host = a
** numeric address, resolved by the Lua layer, and port; or path), and
** its poll handle (hooks.open); then queues the set-up commands of
** state.setup (AUTH, SELECT), each with a `true` in the FIFO in place of
** a coroutine.  Returns 0 if the attempt failed at once (hooks.lost has
** been told).
*/
static int connect_now (lua_State *L, int i, Client *cl) {
  redisContext *c;
  lua_Integer k;
  if (getstatefield(L, i, "path") == LUA_TSTRING)
    c = redisConnectUnixNonBlock(lua_tostring(L, -1));
  else {
    getstatefield(L, i, "host");
    getstatefield(L, i, "port");
    c = redisConnectNonBlock(lua_tostring(L, -2), (int)lua_tointeger(L, -1));
    lua_pop(L, 2);
    /* TCP keepalive (docs/redis.md, Connection): a peer gone without a
       word (host down, silent network) ends an idle connection too, which
       no call's timeout would see; a failure sets c->err, seen below */
    if (c != NULL && !c->err) redisEnableKeepAlive(c);
  }
  lua_pop(L, 1);
  if (c == NULL || c->err) {
    if (c != NULL) redisFree(c);
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushboolean(L, 0);
    lua_pushnil(L);
    callhook(L, "lost", 3, 0);
    return 0;
  }
  /* on loopback a refused connect is known at once: seen here, it needs
     no poll handle (and luv 1.44 would print the poll error on stderr) */
  {
    struct pollfd p;
    p.fd = c->fd;
    p.events = POLLOUT;
    p.revents = 0;
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP))) {
      redisFree(c);
      lua_getiuservalue(L, i, UV_STATE);
      lua_pushboolean(L, 0);
      lua_pushnil(L);
      callhook(L, "lost", 3, 0);
      return 0;
    }
  }
  cl->c = c;
  cl->gen++;
  cl->connecting = 1;
  cl->events = 0;
  cl->progress = 0;
  lua_pushinteger(L, c->fd);
  lua_pushvalue(L, i);
  lua_getiuservalue(L, i, UV_STATE);
  callhook(L, "open", 3, 1);                   /* the poll handle */
  bind_poll(L, i, cl, lua_gettop(L));
  lua_pop(L, 1);
  if (getstatefield(L, i, "setup") == LUA_TTABLE) {
    int setup = lua_gettop(L);
    lua_getiuservalue(L, i, UV_WAITERS);              /* setup FIFO */
    for (k = 1; lua_rawgeti(L, setup, k) == LUA_TTABLE; k++) {
      int cmd = lua_gettop(L), n;
      const char *argv[4];
      size_t argl[4];
      for (n = 0; n < 4 && lua_rawgeti(L, cmd, n + 1) == LUA_TSTRING; n++)
        argv[n] = lua_tolstring(L, -1, &argl[n]);
      lua_settop(L, cmd - 1);      /* the strings stay anchored in setup */
      redisAppendCommandArgv(c, n, argv, argl);
      lua_pushboolean(L, 1);
      lua_rawseti(L, setup + 1, cl->tail++);
    }
    lua_settop(L, setup - 1);
  }
  else lua_pop(L, 1);
  return 1;
}


/*
** Makes sure there is a connection (or an attempt under way): asks
** hooks.attempt whether the back-off allows one now.  Returns 0 when not
** (the caller raises E_UNAVAILABLE).
*/
static int ensure_connection (lua_State *L, int i, Client *cl) {
  int ok;
  if (cl->c != NULL && !cl->connecting && cl->head == cl->tail
      && !cl->in_poll && !cl->subscriber) {
    /* idle, so unwatched: a connection the server ended meanwhile (a
       restart, an idle timeout) is readable now; replace it rather than
       fail this call */
    struct pollfd p;
    p.fd = cl->c->fd;
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 1) disconnect(L, i, cl, 0, 0, FINAL_NOT);
  }
  if (cl->c != NULL) return 1;
  lua_getiuservalue(L, i, UV_STATE);
  callhook(L, "attempt", 1, 1);
  ok = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return ok && connect_now(L, i, cl);
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


/* Writes "<kind><v>\r\n" (a RESP header) at p; returns the end. */
static char *put_header (char *p, char kind, size_t v) {
  char digits[24];
  int n = 0;
  *p++ = kind;
  do {
    digits[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) *p++ = digits[--n];
  *p++ = '\r';
  *p++ = '\n';
  return p;
}

static size_t header_size (size_t v) {
  size_t n = 4;                                 /* kind, one digit, \r\n */
  while (v >= 10) {
    v /= 10;
    n++;
  }
  return n;
}

/*
** Appends one command to the output buffer in the protocol's form, as
** redisAppendCommandArgv would, but written in place: hiredis formats
** into a new string with a printf-like function and then copies it, which
** cost a fifth of the client's instructions per lock cycle (callgrind,
** docs/redis-locks.md, "Where the time goes").  Returns 0 when out of
** memory.
*/
static int write_command (redisContext *c, int n, const char **argv,
                          const size_t *argl) {
  size_t total = header_size((size_t)n);
  int k;
  char *p;
  sds buf;
  for (k = 0; k < n; k++)
    total += header_size(argl[k]) + argl[k] + 2;
  if (total > INT_MAX)                          /* sdsIncrLen takes an int */
    return redisAppendCommandArgv(c, n, argv, argl) == REDIS_OK;
  buf = sdsMakeRoomFor(c->obuf, total);
  if (buf == NULL) return 0;
  c->obuf = buf;
  p = put_header(buf + sdslen(buf), '*', (size_t)n);
  for (k = 0; k < n; k++) {
    p = put_header(p, '$', argl[k]);
    memcpy(p, argv[k], argl[k]);
    p += argl[k];
    *p++ = '\r';
    *p++ = '\n';
  }
  sdsIncrLen(buf, (int)total);
  return 1;
}


/*
** Appends the command made of the arguments from index 2 on to the
** output buffer (converting them first: a bad one raises, changing
** nothing).  Returns 0 if no connection could be had (E_UNAVAILABLE).
*/
static int append (lua_State *L, Client *cl) {
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
  if (!ensure_connection(L, 1, cl)) return 0;
  if (!write_command(cl->c, n, argv, argl))
    luaL_error(L, "not enough memory");
  return 1;
}


/*
** client:call(command, ...): sends the command and suspends the calling
** coroutine until its reply; returns the reply, or raises the Error of
** an error reply, or E_UNAVAILABLE if the connection fails first.  'cl'
** is the client at index 1, checked by the caller (client_call, or
** core_script, which would otherwise check it twice per request).
*/
static int call (lua_State *L, Client *cl) {
  int ismain;
  if (cl->closed)
    return luaL_error(L, "attempt to use a closed redis client");
  ismain = lua_pushthread(L);
  lua_pop(L, 1);
  if (ismain || !lua_isyieldable(L))
    return luaL_error(L, "attempt to call redis outside a coroutine");
  if (!append(L, cl)) {
    lua_pushliteral(L, AM_E_UNAVAILABLE);
    return lua_error(L);
  }
  lua_getiuservalue(L, 1, UV_WAITERS);
  lua_pushthread(L);
  lua_rawseti(L, -2, cl->tail++);
  lua_pop(L, 1);
  /* alone in flight: write now (the poll's next turn would cost a loop
     iteration); otherwise the batch goes at the end of onpoll, or when
     the socket is writable */
  if (!cl->in_poll) {       /* else onpoll writes and updates at its end */
    if (!cl->connecting && cl->tail - cl->head == 1)
      flush(cl);            /* a failure shows as a readable end of file */
    update_poll(L, 1, cl);
  }
  else if (!cl->connecting && sdslen(cl->c->obuf) >= FLUSH_AT)
    flush(cl);              /* a failure: onpoll's own flush sees it */
  return lua_yieldk(L, 0, 0, call_k);
}

static int client_call (lua_State *L) {
  return call(L, checkclient(L, 1));
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
** locks pass theirs so, which spares a table per request.
*/
static int core_script (lua_State *L) {
  lua_Integer nk, na, k;
  int top = lua_gettop(L);
  int list = top == 5 && lua_type(L, 5) == LUA_TTABLE;
  Client *cl = checkclient(L, 1);
  luaL_checktype(L, 4, LUA_TTABLE);
  nk = luaL_len(L, 4);
  na = list ? luaL_len(L, 5) : top - 4;
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

/* }====================================================== */


/*
** onpoll(client, status, events): what the poll handle's callback runs
** (status < 0: a poll error, reported by libuv; events: UV_READABLE and
** UV_WRITABLE).  Completes the connect, reads and parses what arrived,
** resumes each waiter with its reply in call order (a subscriber hands
** each reply to hooks.message instead), then writes the calls those
** coroutines made meanwhile (2 KB at a time while it goes on).  A poll error, end of file or protocol error ends
** the connection (E_UNAVAILABLE for every call still waiting); so does
** an error reply to a set-up command (AUTH, SELECT), with that error.
** Returns the number of replies delivered.
*/
static int client_onpoll (lua_State *L) {
  Client *cl = checkclient(L, 1);
  int status = (int)lua_tointeger(L, 2), events = (int)lua_tointeger(L, 3);
  int broken = 0, nready = 0, r, err = 0;
  redisContext *c = cl->c;
  unsigned gen = cl->gen;
  void *reply;
  lua_settop(L, 3);
  if (c == NULL) {                              /* a stale event */
    lua_pushinteger(L, 0);
    return 1;
  }
  if (status < 0) broken = 1;
  else if (cl->connecting) {
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr)
      broken = 1;
    else {
      cl->connecting = 0;
      lua_getiuservalue(L, 1, UV_STATE);
      callhook(L, "connected", 1, 0);
    }
  }
  else if (events & UV_READABLE) {
    /* hiredis reads 16 KB at a time: read on while reads come back full
       (a 10 MB reply in one callback, not in 640 loop turns), up to 1 MB
       so that other handles get their turn */
    int k = 0;
    size_t before;
    do {
      before = c->reader->len;
      if (redisBufferRead(c) != REDIS_OK) {
        broken = 1;
        break;
      }
    } while (++k < 64 && c->reader->len - before >= 16 * 1024);
  }
  /* the replies that arrived, with their callers: {co|false, ok, reply}... */
  lua_newtable(L);                               /* 4: ready */
  lua_getiuservalue(L, 1, UV_WAITERS);           /* 5 */
  while (!cl->connecting && (r = redisGetReply(c, &reply)) == REDIS_OK
         && reply != NULL) {
    redisReply *rp = (redisReply *)reply;
    int t = LUA_TNIL;                      /* what the FIFO's head holds */
    if (cl->head < cl->tail) {
      t = lua_rawgeti(L, 5, cl->head);              /* co or true */
      if (t == LUA_TBOOLEAN || !cl->subscriber) {
        lua_pushnil(L);
        lua_rawseti(L, 5, cl->head++);
      }
      else {                       /* a subscriber's message: FIFO stays */
        lua_pop(L, 1);
        t = LUA_TNIL;
      }
    }
    if (t == LUA_TBOOLEAN) {                /* a set-up command's reply */
      lua_pop(L, 1);
      if (rp->type == REDIS_REPLY_ERROR) {          /* AUTH, SELECT failed */
        amr_pushreply(L, rp);
        freeReplyObject(reply);
        err = lua_gettop(L);
        broken = 1;
        break;
      }
      freeReplyObject(reply);
      continue;
    }
    if (t == LUA_TNIL) {
      if (!cl->subscriber) {          /* nobody asked for it: dropped */
        freeReplyObject(reply);
        continue;
      }
      lua_pushboolean(L, 0);                        /* no coroutine */
    }
    lua_rawseti(L, 4, ++nready);
    lua_pushboolean(L, rp->type != REDIS_REPLY_ERROR);
    lua_rawseti(L, 4, ++nready);
    amr_pushreply(L, rp);
    lua_rawseti(L, 4, ++nready);
    freeReplyObject(reply);
  }
  if (c->err) broken = 1;                       /* a protocol error */
  cl->in_poll = 1;
  for (r = 1; r <= nready; r += 3) {
    if (lua_rawgeti(L, 4, r) == LUA_TTHREAD) {
      lua_rawgeti(L, 4, r + 1);
      lua_rawgeti(L, 4, r + 2);
      resume(L, lua_tothread(L, -3), 2);
      lua_pop(L, 1);
    }
    else {                                      /* a subscriber's message */
      lua_pop(L, 1);
      lua_getiuservalue(L, 1, UV_STATE);
      lua_rawgeti(L, 4, r + 2);
      callhook(L, "message", 2, 0);
    }
  }
  cl->in_poll = 0;
  if (cl->c != c || cl->gen != gen) {   /* closed by a resumed coroutine */
    if (cl->c != NULL) update_poll(L, 1, cl);   /* and opened again */
    lua_pushinteger(L, nready / 3);
    return 1;
  }
  if (!broken && !cl->connecting && !flush(cl)) broken = 1;
  if (broken) disconnect(L, 1, cl, err, 1, FINAL_NOT);
  else update_poll(L, 1, cl);
  lua_pushinteger(L, nready / 3);
  return 1;
}


/*
** poll_event(cl, status, events, now): the poll callback's work, run
** protected by luv's own callback runner (an error is handled as in any
** luv callback).  Finds the client by its address (a client collected
** meanwhile has closed its handle: nothing comes), runs onpoll, and notes
** when replies came (the command timeout counts from then).  A subscriber
** tells the Lua layer (hooks.progress), whose timer may stop once nothing
** is awaited.
*/
static int poll_event (lua_State *L) {
  Client *cl = (Client *)lua_touserdata(L, 1);
  lua_Integer now = lua_tointeger(L, 4);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CLIENTS_KEY);
  if (lua_rawgetp(L, -1, cl) != LUA_TUSERDATA) return 0;
  lua_replace(L, 1);                        /* client status events ... */
  lua_settop(L, 3);
  client_onpoll(L);
  if (lua_tointeger(L, -1) > 0) {
    cl->progress = (uint64_t)now;
    if (cl->subscriber) {
      lua_getiuservalue(L, 1, UV_STATE);
      callhook(L, "progress", 1, 0);
    }
  }
  return 0;
}

/* The poll handle's callback: straight to poll_event, on luv's main
   thread and through luv's callback runner (ctx->cb_pcall). */
static void on_poll (uv_poll_t *h, int status, int events) {
  luv_handle_t *data = (luv_handle_t *)h->data;
  lua_State *L;
  if (data == NULL || data->extra == NULL) return;
  L = data->ctx->L;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &EVENT_KEY);
  lua_pushlightuserdata(L, data->extra);
  lua_pushinteger(L, status);
  lua_pushinteger(L, events);
  lua_pushinteger(L, (lua_Integer)uv_now(h->loop));
  data->ctx->cb_pcall(L, 4, 0, 0);
}

/*
** The client (at index i) takes the luv poll handle at index h, made by
** hooks.open: its luv record points back to the client (the 'extra' luv
** keeps for its users), so that on_poll finds it; luv keeps creating,
** walking and closing the handle as any other.
*/
static void bind_poll (lua_State *L, int i, Client *cl, int h) {
  void **ud = (void **)luaL_testudata(L, h, "uv_poll");
  cl->poll = NULL;
  if (ud == NULL || *ud == NULL) luaL_error(L, "BUG: hooks.open made no poll handle");
  ((luv_handle_t *)((uv_handle_t *)*ud)->data)->extra = cl;
  cl->poll = ud;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CLIENTS_KEY);
  lua_pushvalue(L, i);
  lua_rawsetp(L, -2, cl);
  lua_pop(L, 1);
}


/*
** client:close(): ends the connection; every waiting call raises
** E_UNAVAILABLE; later calls raise "attempt to use a closed redis client".
*/
static int client_close (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (cl->closed) return 0;
  cl->closed = 1;
  disconnect(L, 1, cl, 0, 1, FINAL_CLOSE);
  return 0;
}


/*
** NOTE: a client is collected only when its waiting coroutines are
** unreachable too (they are anchored in its FIFO and hold it on their
** stacks): __gc closes the connection and resumes nobody.
*/
static int client__gc (lua_State *L) {
  Client *cl = (Client *)lua_touserdata(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    disconnect(L, 1, cl, 0, 0, FINAL_GC);
  }
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


/* {====================================================== for the Lua layer */

/* new(state [, subscriber]): a client with no connection. */
static int core_new (lua_State *L) {
  Client *cl;
  int subscriber = lua_toboolean(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  cl = (Client *)lua_newuserdatauv(L, sizeof(Client), 2);
  memset(cl, 0, sizeof *cl);
  cl->subscriber = subscriber;
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, UV_STATE);
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_WAITERS);
  luaL_setmetatable(L, AM_REDIS_CLIENT);
  return 1;
}


/*
** send(client, ...): a subscriber's command (SUBSCRIBE, ...), sent with
** no caller waiting; connects first if needed.  Returns false when no
** connection can be had now, and on a closed client: a subscriber is
** closed by its client's finalizer (core_drop), which may run between
** the caller's look at status() and this call (spec/86).
*/
static int core_send (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (cl->closed) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!append(L, cl)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!cl->in_poll) {
    if (!cl->connecting) flush(cl);
    update_poll(L, 1, cl);
  }
  lua_pushboolean(L, 1);
  return 1;
}


/* listen(client, on): whether a subscriber keeps reading when idle. */
static int core_listen (lua_State *L) {
  Client *cl = checkclient(L, 1);
  cl->listening = lua_toboolean(L, 2);
  update_poll(L, 1, cl);
  return 0;
}


/* fail(client): a timeout ended the connection (E_UNAVAILABLE). */
static int core_fail (lua_State *L) {
  Client *cl = checkclient(L, 1);
  disconnect(L, 1, cl, 0, 1, FINAL_NOT);
  return 0;
}


/* drop(client): a subscriber whose client was collected: closes it
   without resuming anyone (see client__gc) */
static int core_drop (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    disconnect(L, 1, cl, 0, 0, FINAL_GC);
  }
  return 0;
}


/* status(client): "connecting", "connected", "idle" or "closed" */
static int core_status (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushstring(L, cl->closed ? "closed" : cl->c == NULL ? "idle"
                 : cl->connecting ? "connecting" : "connected");
  return 1;
}


/*
** alive(handle): false once luv has finalized the handle.  NOTE: at
** lua_close every object is finalized, newest first, so a client's __gc
** runs after its own poll handle's and timer's; luv then has cleared the
** pointer its handle userdata holds, and calling a method of the handle
** would crash (luv 1.44 dereferences it).  The Lua layer asks this first.
*/
static int core_alive (lua_State *L) {
  void **p = (void **)lua_touserdata(L, 1);
  lua_pushboolean(L, p != NULL && *p != NULL);
  return 1;
}


/* progress(client): loop time (ms) when replies last came; 0: none yet */
static int core_progress (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushinteger(L, (lua_Integer)cl->progress);
  return 1;
}


/* state(client): the Lua layer's table */
static int core_state (lua_State *L) {
  checkclient(L, 1);
  lua_getiuservalue(L, 1, UV_STATE);
  return 1;
}


/*
** hex(bytes): the bytes in lower-case hexadecimal.  The Redis locks make
** their tokens from it (a gsub over a table, before, cost a tenth of a
** lock cycle's instructions).
*/
static int core_hex (lua_State *L) {
  static const char digit[] = "0123456789abcdef";
  size_t len, k;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, 2 * len);
  for (k = 0; k < len; k++) {
    out[2 * k] = digit[s[k] >> 4];
    out[2 * k + 1] = digit[s[k] & 15];
  }
  luaL_pushresultsize(&b, 2 * len);
  return 1;
}


/* error(message): the Error value an error reply makes */
static int core_error (lua_State *L) {
  size_t len;
  const char *msg = luaL_checklstring(L, 1, &len);
  amr_pusherror(L, msg, len);
  return 1;
}

/* error_text(err): an error object's text as lua5.4 prints it, for the
** Lua side's reports (a __tostring that raises cannot raise there) */
static int core_error_text (lua_State *L) {
  luaL_checkany(L, 1);
  am_push_error_text(L, 1);
  return 1;
}

/* }====================================================== */


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
  {"send", core_send},
  {"listen", core_listen},
  {"fail", core_fail},
  {"drop", core_drop},
  {"status", core_status},
  {"state", core_state},
  {"alive", core_alive},
  {"error", core_error},
  {"error_text", core_error_text},
  {"hex", core_hex},
  {"progress", core_progress},
  {"script", core_script},
  {NULL, NULL}
};


/*
** The module table: the functions above, E_UNAVAILABLE, hooks (filled
** by the Lua layer: open, watch, connected, lost, attempt, message,
** report) and Client (the methods table, which the Lua layer extends).
*/
__attribute__((visibility("default")))
LUAMOD_API int luaopen_async_mutex_redis_core (lua_State *L) {
  amr_openerror(L);
  lua_newtable(L);                              /* module */
  lua_newtable(L);                              /* hooks */
  luaL_newmetatable(L, AM_REDIS_CLIENT);        /* module hooks mt */
  lua_pushvalue(L, -2);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, client_metamethods, 2);      /* upvalues: hooks, mt */
  lua_newtable(L);                              /* methods */
  lua_pushvalue(L, -3);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, client_methods, 2);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_setfield(L, -4, "Client");               /* module.Client */
  lua_pushvalue(L, -2);
  lua_setfield(L, -4, "hooks");                 /* module hooks mt */
  luaL_setfuncs(L, core_funcs, 2);              /* module */
  lua_getfield(L, -1, "hooks");
  luaL_getmetatable(L, AM_REDIS_CLIENT);
  lua_pushcclosure(L, poll_event, 2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &EVENT_KEY);
  /* clients by address; kept if the module is loaded again (clients of
     the first load still have handles that call back) */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &CLIENTS_KEY) != LUA_TTABLE) {
    lua_newtable(L);
    lua_newtable(L);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &CLIENTS_KEY);
  }
  lua_pop(L, 1);
  lua_pushliteral(L, AM_E_UNAVAILABLE);
  lua_setfield(L, -2, "E_UNAVAILABLE");
  return 1;
}
