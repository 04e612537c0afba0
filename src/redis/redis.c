/*
** redis.c: async_mutex.redis_core, a Redis connection on luv's loop.
** The connection is a luv stream (TCP or unix socket) made, connected
** and read through luv's Lua API by the Lua layer's hooks
** (src/async_mutex/redis.lua); its callbacks are C functions of this
** file, which luv calls with what it read: hiredis's reader parses the
** replies.  Requests are written here, in the protocol's form, into an
** output buffer of the client, and sent on the socket with send().
** Calls from any number of coroutines are appended to that buffer,
** written together, and answered in order: a FIFO of waiting coroutines
** pairs each reply with its caller.  Nothing here includes a header of
** luv or libuv, nor links libuv.  See docs/redis.md.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

/* Linux: the poll handle watches an epoll set holding the socket (see
   update_watch); AM_NO_EPOLL builds the portable path, which watches the
   socket itself, for testing it there */
#if defined(__linux__) && !defined(AM_NO_EPOLL)
#define AM_EPOLL
#include <sys/epoll.h>
#endif

#include <hiredis/hiredis.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"
#include "../error_text.h"     /* shared with the core: the Makefile */

#ifndef MSG_NOSIGNAL           /* macOS: SO_NOSIGPIPE, set at connect */
#define MSG_NOSIGNAL 0
#endif


/* the client's user values */
#define UV_STATE    1   /* the Lua layer's table: address, options, ref */
#define UV_WAITERS  2   /* FIFO of waiting coroutines: [head, tail) */
#define UV_CONN     3   /* the connection's table (nil: no connection) */
#define UV_ERROR    4   /* the error that ended the last connection */
#define NUSERVALUES 4

/*
** Output that waits for the end of a read callback is written as soon as
** it reaches this size: the server starts on the first calls while the
** callback resumes the other callers (with 50 calls in flight, replies
** and requests then overlap instead of alternating in whole batches).
*/
#define FLUSH_AT  2048

/* events watched: readable, writable */
#define EV_R  1
#define EV_W  2

typedef struct Client {
  redisReader *reader;  /* the connection's parser; NULL: no connection */
  char *out;            /* requests not written yet (malloc'd) */
  size_t outlen, outcap;
  int fd;               /* the connection's socket (-1: none) */
  int epfd;             /* Linux: its epoll set, which the handle watches */
  lua_Integer progress; /* now_ms() of the last batch of replies, or of a
                           call sent with nothing in flight: a wait's
                           commandTimeout counts from the later */
  int connecting;       /* the connect is under way */
  int blocked;          /* output waits for the socket to be writable */
  int watching;         /* what hooks.watch was last told: connecting */
  int events;           /* ... the events of the poll handle (EV_*) */
  int active;           /* ... and whether anything is awaited */
  int inner;            /* the socket's events in the epoll set (EV_*) */
  int nsetup;           /* replies due to the set-up commands (AUTH,
                           SELECT), which come before any call's */
  int in_event;         /* inside a read callback: writes wait for its end */
  int closed;           /* close() was called: no more calls */
  int subscriber;       /* a pub/sub connection: replies go to hooks.message */
  int listening;        /* a subscriber with subscriptions: always reading */
  unsigned epoch;       /* counts ended connections (a caller's FIFO ended) */
  lua_Integer head, tail;
} Client;

/*
** Upvalues of every Lua-callable function of this file: the hooks table
** (filled by the Lua layer) and the clients' metatable; a connection's
** callbacks have the connection's table as a third.
*/
#define HOOKS      lua_upvalueindex(1)
#define CLIENT_MT  lua_upvalueindex(2)
#define CONN       lua_upvalueindex(3)

/* the first value a caller waiting in call is resumed with: a value no
   Lua code can make, so that a stray resume is told from ours */
static const char DELIVER = 0;

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
static const char ANCHORED = 0;

/*
** Anchors the client at index 'i' ('on'), or lets it go.  Anchoring may
** run a finalizer (the set may grow); letting go allocates nothing.
*/
static void anchor (lua_State *L, int i, int on) {
  i = lua_absindex(L, i);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &ANCHORED);
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


/*
** Whether the connection's table at index `conn` is still the client's
** (at index i).  RE-ENTRY: every call that can run Lua (a hook, a resumed
** coroutine, a finalizer at an allocation) may close the client or end
** its connection; code that goes on after one looks here first.
*/
static int is_current (lua_State *L, int i, int conn) {
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
static lua_Integer now_ms (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (lua_Integer)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/* {====================================================== errors */

/*
** Pushes an E_UNAVAILABLE that says why (async_mutex.unavailable, kept
** in hooks.unavailable): "redis server unavailable: " and the reason,
** formatted as lua_pushfstring does.
*/
static void push_unavailable (lua_State *L, const char *fmt, ...) {
  va_list ap;
  lua_getfield(L, HOOKS, "unavailable");
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_call(L, 1, 1);
}

/* Pushes the client's address as the reasons name it ("host:port", or
   the unix socket's path). */
static const char *push_addr (lua_State *L, int i) {
  getstatefield(L, i, "addr");
  if (!lua_isstring(L, -1)) {
    lua_pop(L, 1);
    lua_pushliteral(L, "?");
  }
  return lua_tostring(L, -1);
}

/*
** Pushes the E_UNAVAILABLE of a connection that failed with the error
** `name` (the errno's name, as luv names it too, such as "ECONNREFUSED";
** "EOF": the server closed it).
*/
static void push_failure (lua_State *L, int i, const char *name) {
  const char *addr = push_addr(L, i);
  if (strcmp(name, "ECONNREFUSED") == 0)
    push_unavailable(L, "connection refused to %s", addr);
  else if (strcmp(name, "EOF") == 0 || strcmp(name, "EPIPE") == 0)
    push_unavailable(L, "connection closed by %s", addr);
  else if (strcmp(name, "ECONNRESET") == 0)
    push_unavailable(L, "connection reset by %s", addr);
  else if (strcmp(name, "ETIMEDOUT") == 0)
    push_unavailable(L, "connection to %s timed out", addr);
  else if (strcmp(name, "ENOENT") == 0)               /* a unix socket's */
    push_unavailable(L, "no socket at %s", addr);
  else
    push_unavailable(L, "connection to %s failed (%s)", addr, name);
  lua_remove(L, -2);                                    /* the address */
}

/* The name of errno value e, for the errors a socket reports (else its
   text). */
static const char *errno_name (int e, char *buf, size_t size) {
  switch (e) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ECONNRESET: return "ECONNRESET";
    case EPIPE: return "EPIPE";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case ENOENT: return "ENOENT";
    default:
      snprintf(buf, size, "%s", strerror(e));
      return buf;
  }
}

static void push_errno_failure (lua_State *L, int i, int e) {
  char buf[128];
  push_failure(L, i, errno_name(e, buf, sizeof buf));
}

/* }====================================================== */


/* {====================================================== output */

/* Makes room for `extra` more bytes of output; 0 when out of memory. */
static int out_reserve (Client *cl, size_t extra) {
  size_t need = cl->outlen + extra, cap = cl->outcap;
  char *p;
  if (need <= cap) return 1;
  if (need < extra) return 0;                           /* overflow */
  if (cap < 256) cap = 256;
  while (cap < need) cap = cap * 2 > cap ? cap * 2 : need;
  p = (char *)realloc(cl->out, cap);
  if (p == NULL) return 0;
  cl->out = p;
  cl->outcap = cap;
  return 1;
}

/*
** Writes what the output buffer holds, as far as the socket takes it,
** unless the connect is under way.  send() with MSG_NOSIGNAL: a lost
** connection must be an error here, not a SIGPIPE that kills the process.
** What the socket does not take waits for it to be writable (cl->blocked:
** the poll handle then watches that too).  Returns 0, or the errno of a
** broken connection.  Pure C: runs no Lua.
*/
static int flush (Client *cl) {
  size_t off = 0;
  if (cl->fd < 0 || cl->connecting) return 0;
  cl->blocked = 0;
  while (off < cl->outlen) {
    ssize_t n = send(cl->fd, cl->out + off, cl->outlen - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        cl->blocked = 1;
        break;
      }
      return errno;
    }
    off += (size_t)n;
  }
  if (off == cl->outlen) cl->outlen = 0;
  else if (off > 0) {
    memmove(cl->out, cl->out + off, cl->outlen - off);
    cl->outlen -= off;
  }
  return 0;
}


/*
** Watches what the connection needs: writable while connecting or while
** output waits for the socket; readable whenever it is connected, so
** that an end of file is seen when it comes, also while idle.  What
** changes between a call and its reply is only whether the handle is
** active, that is, whether it keeps the loop running (replies are due, a
** subscriber listens, output waits, or the connect is under way): the
** Lua layer refs the handle then and unrefs it when the client is idle,
** so that an idle client keeps uv.run() from returning no more than a
** stopped handle would, and a call costs no system call of its own to
** start and stop watching (docs/redis.md, Connection).  On Linux the
** socket is in the connection's own epoll set (cl->epfd), whose interest
** changes here with epoll_ctl (only while output waits), and the luv poll
** handle watches that set, readable whenever the socket has any of those
** events: libuv never sees the socket (so no poll error of it reaches
** luv, whose poll callback printed each on stderr up to luv 1.44.2-0).
** Elsewhere the handle watches the socket itself.  The Lua layer is told
** (hooks.watch(state, conn, connecting, events, active)) only when one of
** these changes: events, what the handle watches ("r", "w", "rw"; nil:
** stopped), whether the connect is under way, and whether anything is
** awaited; its timer runs the connect and command timeouts while
** something is.
*/
static void update_watch (lua_State *L, int i, Client *cl) {
  int connecting = 0, ev = 0, active = 0, handle;
  if (cl->fd >= 0) {
    if (cl->connecting) {
      connecting = active = 1;
      ev = EV_W;
    }
    else {
      ev = EV_R;
      if (cl->blocked) ev |= EV_W;
      active = cl->blocked || cl->tail > cl->head || cl->nsetup > 0
               || cl->listening;
    }
  }
#ifdef AM_EPOLL
  if (ev != cl->inner && cl->epfd >= 0) {
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    e.events = (ev & EV_R ? EPOLLIN : 0) | (ev & EV_W ? EPOLLOUT : 0);
    epoll_ctl(cl->epfd, EPOLL_CTL_MOD, cl->fd, &e);
    cl->inner = ev;
  }
  handle = ev ? EV_R : 0;              /* the set: readable when ready */
#else
  handle = ev;
#endif
  if (connecting == cl->watching && handle == cl->events
      && active == cl->active) return;
  cl->watching = connecting;
  cl->events = handle;
  cl->active = active;
  lua_getfield(L, HOOKS, "watch");
  lua_getiuservalue(L, i, UV_STATE);
  lua_getiuservalue(L, i, UV_CONN);
  lua_pushboolean(L, connecting);
  if (handle == 0) lua_pushnil(L);
  else lua_pushstring(L, handle == EV_R ? "r" : handle == EV_W ? "w" : "rw");
  lua_pushboolean(L, active);
  lua_call(L, 5, 0);
}

/* }====================================================== */


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

/* Resumes co, waiting in call, with (DELIVER, ok, value): the three
   values on top. */
#define deliver(L, co)  resume(L, co, 3)


/*
** Ends the connection, if any, with the error on top of the stack (an
** E_UNAVAILABLE that says why, or a set-up command's error reply), which
** it pops.  Everything the connection had is detached first (its table,
** socket, parser, output, the FIFO of callers), so that Lua code run from
** then on (hooks, resumed coroutines, finalizers at any allocation) sees
** no connection, and a caller's new call starts a new one.  Then tells
** the Lua layer (hooks.lost closes the poll handle, and the fds once that
** close is complete; `final` is FINAL_CLOSE or FINAL_GC when the client
** itself ends), then resumes every caller that waited, in call order,
** with (false, error).  `resume_them` is 0 from __gc.  The running
** coroutine, whose own call may have ended the connection, is not
** resumed: it sees the epoch change (call) and raises the error, kept as
** the client's UV_ERROR.
*/
#define FINAL_NOT    0
#define FINAL_CLOSE  1
#define FINAL_GC     2

static void disconnect (lua_State *L, int i, Client *cl, int resume_them,
                        int final) {
  int err = lua_gettop(L), had, was_connected;
  lua_Integer head = cl->head, tail = cl->tail, k;
  lua_getiuservalue(L, i, UV_CONN);                 /* err conn */
  had = !lua_isnil(L, -1);
  was_connected = had && !cl->connecting;
  lua_pushnil(L);
  lua_setiuservalue(L, i, UV_CONN);
#ifdef AM_EPOLL
  /* the socket leaves the set now (libuv never watched it), and is
     closed: the server sees the end at once; the set itself, which the
     poll handle watches, is closed once the handle's close is complete */
  if (cl->fd >= 0 && had) {
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    epoll_ctl(cl->epfd, EPOLL_CTL_DEL, cl->fd, &e);
    close(cl->fd);
  }
#endif
  if (cl->reader != NULL) redisReaderFree(cl->reader);
  cl->reader = NULL;
  cl->outlen = 0;
  cl->fd = cl->epfd = -1;
  cl->connecting = cl->blocked = cl->nsetup = 0;
  cl->watching = cl->active = 0;
  cl->events = cl->inner = 0;
  cl->head = cl->tail = 0;
  cl->epoch++;
  anchor(L, i, 0);
  lua_pushvalue(L, err);
  lua_setiuservalue(L, i, UV_ERROR);
  lua_getiuservalue(L, i, UV_WAITERS);              /* err conn fifo */
  if (head < tail) {
    lua_newtable(L);               /* may run a finalizer: all detached */
    lua_setiuservalue(L, i, UV_WAITERS);
  }
  if (had || final) {
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushvalue(L, err + 1);                      /* conn */
    lua_pushboolean(L, was_connected);
    if (final == FINAL_NOT) lua_pushnil(L);
    else lua_pushstring(L, final == FINAL_CLOSE ? "close" : "gc");
    lua_pushvalue(L, err);
    callhook(L, "lost", 5, 0);
  }
  if (resume_them) {
    for (k = head; k < tail; k++) {
      if (lua_rawgeti(L, err + 2, k) == LUA_TTHREAD
          && lua_tothread(L, -1) != L) {
        lua_State *co = lua_tothread(L, -1);
        lua_pushlightuserdata(L, (void *)&DELIVER);
        lua_pushboolean(L, 0);
        lua_pushvalue(L, err);
        deliver(L, co);
      }
      lua_pop(L, 1);
    }
  }
  lua_settop(L, err - 1);
}

/* Ends the connection with the E_UNAVAILABLE of errno value e. */
static void fail_errno (lua_State *L, int i, Client *cl, int e) {
  push_errno_failure(L, i, e);
  disconnect(L, i, cl, 1, FINAL_NOT);
}


/* {====================================================== connecting */

static int conn_event (lua_State *L);

/*
** conn.on_closed(): closes the fd the connection's poll handle watched
** (upvalue 1: the epoll set on Linux, else the socket), once libuv has
** completed the handle's close: libuv >= 1.45 may apply the removal of a
** handle's fd from its epoll set only at the end of the loop iteration (it
** batches epoll changes on io_uring), and an fd closed before, still open
** in another process (a child that inherited it), left its registration
** behind for the next socket of that number (docs/redis.md, Connection).
** Runs once.
*/
static int conn_closed (lua_State *L) {
  int fd = (int)lua_tointeger(L, lua_upvalueindex(1));
  if (fd >= 0) close(fd);
  lua_pushinteger(L, -1);
  lua_replace(L, lua_upvalueindex(1));
  return 0;
}

/*
** Queues the set-up commands of state.setup (AUTH, SELECT) first in the
** output; their replies come before any call's (cl->nsetup).  Returns 0
** when out of memory.
*/
static int write_command (Client *cl, int n, const char **argv,
                          const size_t *argl);

static int queue_setup (lua_State *L, int i, Client *cl) {
  lua_Integer k;
  int ok = 1;
  if (getstatefield(L, i, "setup") == LUA_TTABLE) {
    int setup = lua_gettop(L);
    for (k = 1; ok && lua_rawgeti(L, setup, k) == LUA_TTABLE; k++) {
      int cmd = lua_gettop(L), n;
      const char *argv[4];
      size_t argl[4];
      for (n = 0; n < 4 && lua_rawgeti(L, cmd, n + 1) == LUA_TSTRING; n++)
        argv[n] = lua_tolstring(L, -1, &argl[n]);
      ok = write_command(cl, n, argv, argl);
      lua_settop(L, cmd - 1);      /* the strings stay anchored in setup */
      cl->nsetup++;
    }
    lua_settop(L, setup - 1);
  }
  else lua_pop(L, 1);
  return ok;
}


/*
** Sets TCP keepalive on a socket as hiredis's redisEnableKeepAlive does
** (first probe after 15 s idle, then every 5 s, 3 probes: docs/redis.md,
** Connection), where the system has the options; and TCP_NODELAY, as
** hiredis does: requests go out at once, not held for the next reply.
*/
static void tcp_options (int fd) {
  int on = 1, idle = 15, intvl = 5, cnt = 3;
  (void)idle; (void)intvl; (void)cnt;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
#if defined(TCP_KEEPIDLE)
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
#elif defined(TCP_KEEPALIVE)
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle);
#endif
#if defined(TCP_KEEPINTVL)
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
#endif
#if defined(TCP_KEEPCNT)
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
}

/* A socket of `family`, non-blocking and closed on exec (a child process
   must not keep the connection open); -1 and errno on failure. */
static int new_socket (int family) {
  int fd = socket(family, SOCK_STREAM, 0), flags;
  if (fd < 0) return -1;
  flags = fcntl(fd, F_GETFD);
  if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0
      || (flags = fcntl(fd, F_GETFL)) < 0
      || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
#ifdef SO_NOSIGPIPE            /* macOS: no MSG_NOSIGNAL */
  {
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, sizeof on);
  }
#endif
  return fd;
}

/*
** Opens a socket to the address in the state table (host, a numeric
** address resolved by the Lua layer, and port; or path) and starts
** connecting.  Returns the socket (*inprogress: the connect is under
** way); or -1, with errno.
*/
static int open_socket (lua_State *L, int i, int *inprogress) {
  int fd, r;
  *inprogress = 0;
  if (getstatefield(L, i, "path") == LUA_TSTRING) {
    struct sockaddr_un sa;
    size_t len;
    const char *path = lua_tolstring(L, -1, &len);
    lua_pop(L, 1);
    memset(&sa, 0, sizeof sa);
    if (len >= sizeof sa.sun_path) {
      errno = ENAMETOOLONG;
      return -1;
    }
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, len);
    if ((fd = new_socket(AF_UNIX)) < 0) return -1;
    do r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    while (r < 0 && errno == EINTR);
  }
  else {
    struct addrinfo hints, *ai;
    char port[16];
    lua_pop(L, 1);
    getstatefield(L, i, "host");
    getstatefield(L, i, "port");
    snprintf(port, sizeof port, "%d", (int)lua_tointeger(L, -1));
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;   /* never blocks */
    r = getaddrinfo(lua_tostring(L, -2), port, &hints, &ai);
    lua_pop(L, 2);
    if (r != 0) {
      errno = EINVAL;
      return -1;
    }
    if ((fd = new_socket(ai->ai_family)) < 0) {
      freeaddrinfo(ai);
      return -1;
    }
    tcp_options(fd);
    do r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    while (r < 0 && errno == EINTR);
    freeaddrinfo(ai);
  }
  if (r < 0) {
    if (errno != EINPROGRESS) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    *inprogress = 1;
  }
  return fd;
}

/* Pushes a C closure of the connection at index conn: f with upvalues
   hooks, the clients' metatable and conn. */
static void push_callback (lua_State *L, int conn, lua_CFunction f) {
  lua_pushvalue(L, HOOKS);
  lua_pushvalue(L, CLIENT_MT);
  lua_pushvalue(L, conn);
  lua_pushcclosure(L, f, 3);
}

/*
** Opens a connection: its socket (a refusal known at once, as on
** loopback, fails the attempt here, with nothing queued and no luv handle
** made), its epoll set on Linux, its table (conn: poll, dead, and the
** callbacks on_event and on_closed), its parser and the set-up commands;
** then its luv poll handle, made by hooks.open.  Returns 1; or 0 with the
** error to raise on top (the attempt failed at once: hooks.lost has been
** told, if a connection had been set up).
*/
static int connect_now (lua_State *L, int i, Client *cl) {
  int conn, fd, epfd = -1, inprogress, status;
  /* RE-ENTRY: the connection's table and callbacks first (allocations:
     a finalizer may close the client), the client looked at after; the
     socket only then, so that nothing is left open if it was */
  lua_createtable(L, 1, 6);
  conn = lua_gettop(L);
  getstatefield(L, i, "ref");                 /* the client, weakly held */
  lua_rawseti(L, conn, 1);
  /* every field the Lua layer sets is there from the start: setting it
     then allocates nothing (and so runs no finalizer) */
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "poll");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "dead");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "opening");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "busy");
  push_callback(L, conn, conn_event);
  lua_setfield(L, conn, "on_event");
  lua_pushinteger(L, -1);
  lua_pushcclosure(L, conn_closed, 1);               /* conn ... closed */
  lua_pushvalue(L, -1);
  lua_setfield(L, conn, "on_closed");
  if (cl->closed) {
    lua_settop(L, conn - 1);
    push_unavailable(L, "client closed");
    return 0;
  }
  if (cl->reader != NULL) {                 /* one was opened meanwhile */
    lua_settop(L, conn - 1);
    return 1;
  }
  fd = open_socket(L, i, &inprogress);
  if (fd >= 0 && inprogress) {
    /* on loopback a refused connect is known at once: seen here, it
       needs no luv handle */
    struct pollfd p;
    p.fd = fd;
    p.events = POLLOUT;
    p.revents = 0;
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP))) {
      int soerr = 0;
      socklen_t len = sizeof soerr;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || !soerr)
        soerr = ECONNREFUSED;
      close(fd);
      errno = soerr;
      fd = -1;
    }
  }
#ifdef AM_EPOLL
  if (fd >= 0) {
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    e.events = EPOLLOUT;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
      int err = errno;
      if (epfd >= 0) close(epfd);
      close(fd);
      errno = err;
      fd = -1;
    }
  }
#endif
  if (fd < 0) {
    lua_settop(L, conn - 1);
    push_errno_failure(L, i, errno);
    lua_getiuservalue(L, i, UV_STATE);
    lua_pushnil(L);
    lua_pushboolean(L, 0);
    lua_pushnil(L);
    lua_pushvalue(L, -5);                      /* the error */
    callhook(L, "lost", 5, 0);                 /* (the back-off) */
    return 0;
  }
  /* from here on the fds are the connection's: disconnect closes them */
  cl->reader = redisReaderCreate();
  lua_pushinteger(L, epfd >= 0 ? epfd : fd);  /* what the handle watches */
  lua_setupvalue(L, conn + 1, 1);             /* conn_closed closes it */
  lua_pop(L, 1);                              /* (on_closed) */
  lua_pushvalue(L, conn);
  lua_setiuservalue(L, i, UV_CONN);
  cl->fd = fd;
  cl->epfd = epfd;
  cl->connecting = 1;       /* done at the first writable event, whether
                               or not connect() completed at once */
  cl->inner = EV_W;
  cl->events = cl->active = 0;
  cl->outlen = 0;
  cl->blocked = 0;
  cl->watching = 0;
  cl->nsetup = 0;
  cl->progress = 0;
  if (cl->reader == NULL || !queue_setup(L, i, cl)) {
    lua_pushliteral(L, "not enough memory");
    disconnect(L, i, cl, 1, FINAL_NOT);
    return luaL_error(L, "not enough memory");
  }
  /* the poll handle: made by luv (hooks.open returns true, or nil and
     luv's error); a Lua error in it fails the attempt rather than leaving
     a connection with no handle */
  lua_getfield(L, HOOKS, "open");
  lua_getiuservalue(L, i, UV_STATE);
  lua_pushvalue(L, conn);
  lua_pushinteger(L, epfd >= 0 ? epfd : fd);
  status = lua_pcall(L, 3, 2, 0);
  if (!is_current(L, i, conn)) {        /* ended meanwhile (a finalizer) */
    lua_settop(L, conn - 1);
    lua_getiuservalue(L, i, UV_ERROR);
    return 0;
  }
  if (status == LUA_OK && lua_toboolean(L, -2)) {
    lua_settop(L, conn - 1);
    return 1;
  }
  {
    const char *addr = push_addr(L, i);
    const char *msg = status != LUA_OK ? am_push_error_text(L, -2)
                      : lua_isstring(L, -2) ? lua_tostring(L, -2) : "?";
    push_unavailable(L, "cannot watch the connection to %s (%s)", addr, msg);
  }
  lua_pushvalue(L, -1);                  /* the error: raised, and ends */
  disconnect(L, i, cl, 1, FINAL_NOT);
  lua_replace(L, conn);
  lua_settop(L, conn);
  return 0;
}


/*
** Makes sure there is a connection (or an attempt under way): asks
** hooks.attempt(state, canwait) whether the back-off allows one now.
** Returns 1; or 0 with the E_UNAVAILABLE to raise on top; or, only when
** `canwait` (the caller is a coroutine that may yield), 2 with a wait
** record on top: the Lua layer is finding the server first (Sentinel,
** docs/redis.md, "Sentinel"), and the caller waits for record.done, then
** tries again.
*/
static int ensure_connection (lua_State *L, int i, Client *cl,
                              int canwait) {
  if (cl->fd >= 0 && !cl->connecting && cl->head == cl->tail
      && cl->nsetup == 0 && cl->outlen == 0 && !cl->in_event
      && !cl->subscriber) {
    /* idle, so unwatched: a connection the server ended meanwhile (a
       restart, an idle timeout) is readable now; replace it rather than
       fail this call */
    struct pollfd p;
    p.fd = cl->fd;
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 1) {
      push_failure(L, i, "EOF");
      disconnect(L, i, cl, 1, FINAL_NOT);
    }
  }
  if (cl->closed) {
    push_unavailable(L, "client closed");
    return 0;
  }
  if (cl->reader != NULL) return 1;
  lua_getiuservalue(L, i, UV_STATE);
  lua_pushboolean(L, canwait);
  callhook(L, "attempt", 2, 1);    /* nil, why not now, or a wait record */
  if (cl->closed) {                       /* a finalizer closed it */
    lua_pop(L, 1);
    push_unavailable(L, "client closed");
    return 0;
  }
  if (cl->reader != NULL) {
    lua_pop(L, 1);
    return 1;
  }
  if (canwait && lua_type(L, -1) == LUA_TTABLE) return 2;
  if (!lua_isnil(L, -1)) {
    lua_getfield(L, HOOKS, "unavailable");
    lua_insert(L, -2);
    lua_call(L, 1, 1);
    return 0;
  }
  lua_pop(L, 1);
  return connect_now(L, i, cl);
}


/*
** The client of a connection's callback (its table is upvalue CONN),
** pushed at index 3 with the arguments luv gave at 1 and 2; NULL when
** the client was collected or this connection is no longer its own (a
** stale event).
*/
static Client *conn_client (lua_State *L) {
  lua_settop(L, 2);
  lua_rawgeti(L, CONN, 1);                           /* the ref table */
  if (lua_type(L, -1) != LUA_TTABLE || lua_rawgeti(L, -1, 1) != LUA_TUSERDATA)
    return NULL;
  lua_replace(L, 3);
  lua_settop(L, 3);
  if (!is_current(L, 3, CONN)) return NULL;
  return (Client *)lua_touserdata(L, 3);
}

/*
** The connect is complete (the socket is writable), or failed (its error
** is pending).  Returns 0 (connected, or not yet: a spurious wake-up), or
** the errno of the failure.
*/
static int finish_connect (Client *cl) {
  struct pollfd p;
  int soerr = 0;
  socklen_t len = sizeof soerr;
  p.fd = cl->fd;
  p.events = POLLOUT;
  p.revents = 0;
  if (poll(&p, 1, 0) != 1) return 0;              /* not yet */
  if (getsockopt(cl->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
    return errno;
  if (soerr) return soerr;
  if (p.revents & (POLLERR | POLLHUP)) return ECONNREFUSED;
  cl->connecting = 0;
  return 0;
}

/* }====================================================== */


/* {====================================================== replies */

/*
** Reads what the socket has into the parser: on while reads come back
** full (a 10 MB reply in one callback, not in 640 loop turns), up to 1 MB
** so that other handles get their turn.  Returns 0, or an errno (EOF: -1).
*/
static int read_socket (Client *cl) {
  char buf[16 * 1024];
  int k;
  for (k = 0; k < 64; k++) {
    ssize_t n = recv(cl->fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return errno;
    }
    if (n == 0) return -1;                          /* the server closed */
    if (redisReaderFeed(cl->reader, buf, (size_t)n) != REDIS_OK) return ENOMEM;
    if ((size_t)n < sizeof buf) return 0;
  }
  return 0;
}

/*
** conn.on_event(err, events): the poll handle's callback (err: a poll
** error, which only a handle on the socket itself can report).  Completes
** the connect; writes output that waited for the socket; reads and parses
** every complete reply and pairs it with its caller first, then resumes
** the callers in call order, each with its reply (a subscriber hands each
** reply to hooks.message instead); then writes the calls those coroutines
** made meanwhile (2 KB at a time while it goes on).  An end of file, a
** read error or a protocol error ends the connection (E_UNAVAILABLE for
** every call still waiting); so does an error reply to a set-up command
** (AUTH, SELECT), with that error.
**
** RE-ENTRY: converting a reply allocates, and so may run a finalizer that
** closes the client or ends this connection (which frees its parser);
** the parser is looked at again only if the connection is still the
** client's.  Replies already taken out of it are delivered whatever
** happens: their callers left the FIFO, and nobody else would resume
** them.
*/
static int conn_event (lua_State *L) {
  Client *cl = conn_client(L);
  int nready = 0, r, was, errpos = 0, e = 0;
  unsigned epoch;
  void *reply;
  if (cl == NULL) return 0;
  epoch = cl->epoch;                 /* changes when the connection ends */
  if (!lua_isnil(L, 1)) {                /* a poll error: the socket's own */
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(cl->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || !soerr)
      soerr = ECONNRESET;
    fail_errno(L, 3, cl, soerr);
    return 0;
  }
  if (cl->connecting) {
    if ((e = finish_connect(cl)) != 0) {
      fail_errno(L, 3, cl, e);
      return 0;
    }
    if (cl->connecting) return 0;                   /* a spurious wake-up */
    lua_getiuservalue(L, 3, UV_STATE);
    callhook(L, "connected", 1, 0);
    if (!is_current(L, 3, CONN)) return 0;
    if (!cl->in_event && (e = flush(cl)) != 0) fail_errno(L, 3, cl, e);
    else update_watch(L, 3, cl);
    return 0;
  }
  if (cl->blocked && !cl->in_event && (e = flush(cl)) != 0) {
    fail_errno(L, 3, cl, e);
    return 0;
  }
  if ((e = read_socket(cl)) != 0) {
    if (e < 0) push_failure(L, 3, "EOF");
    else push_errno_failure(L, 3, e);
    errpos = lua_gettop(L);
  }
  lua_newtable(L);                     /* ready {co|false, ok, reply}... */
  lua_getiuservalue(L, 3, UV_WAITERS);
  {
    int ready = lua_gettop(L) - 1, fifo = ready + 1;
    for (;;) {
      redisReply *rp;
      int t;
      if (cl->epoch != epoch) break;   /* ended by a finalizer: no parser */
      r = redisReaderGetReply(cl->reader, &reply);
      if (r != REDIS_OK) {                       /* a protocol error */
        char msg[sizeof cl->reader->errstr];
        const char *addr;
        memcpy(msg, cl->reader->errstr, sizeof msg);  /* before allocating */
        msg[sizeof msg - 1] = '\0';
        addr = push_addr(L, 3);
        push_unavailable(L, "protocol error from %s (%s)", addr, msg);
        lua_remove(L, -2);                              /* the address */
        if (errpos) lua_replace(L, errpos);
        else errpos = lua_gettop(L);
        break;
      }
      if (reply == NULL) break;
      rp = (redisReply *)reply;
      if (cl->nsetup > 0) {                     /* a set-up command's */
        cl->nsetup--;
        if (rp->type == REDIS_REPLY_ERROR) {        /* AUTH, SELECT failed */
          amr_pushreply(L, rp);
          freeReplyObject(reply);
          if (errpos) lua_replace(L, errpos);
          else errpos = lua_gettop(L);
          break;
        }
        freeReplyObject(reply);
        continue;
      }
      if (cl->subscriber) {                 /* a message: nobody waits */
        lua_pushboolean(L, 0);
        t = LUA_TBOOLEAN;
      }
      else if (cl->head < cl->tail) {
        t = lua_rawgeti(L, fifo, cl->head);         /* its caller */
        lua_pushnil(L);
        lua_rawseti(L, fifo, cl->head++);
        if (cl->head == cl->tail) anchor(L, 3, 0);   /* (its caller is on 'ready') */
      }
      else t = LUA_TNIL;
      if (t == LUA_TNIL) {              /* nobody asked for it: dropped */
        lua_pop(L, 1);
        freeReplyObject(reply);
        continue;
      }
      lua_rawseti(L, ready, ++nready);
      lua_pushboolean(L, rp->type != REDIS_REPLY_ERROR);
      lua_rawseti(L, ready, ++nready);
      amr_pushreply(L, rp);
      freeReplyObject(reply);
      lua_rawseti(L, ready, ++nready);
    }
    if (nready > 0) cl->progress = now_ms();   /* the command timeout
                                                  counts from now */
    was = cl->in_event;
    cl->in_event = 1;
    for (r = 1; r <= nready; r += 3) {
      if (lua_rawgeti(L, ready, r) == LUA_TTHREAD) {
        lua_State *co = lua_tothread(L, -1);
        lua_pushlightuserdata(L, (void *)&DELIVER);
        lua_rawgeti(L, ready, r + 1);                 /* ok */
        lua_rawgeti(L, ready, r + 2);                 /* the reply */
        deliver(L, co);
      }
      else {                                    /* a subscriber's message */
        lua_getiuservalue(L, 3, UV_STATE);
        lua_rawgeti(L, ready, r + 2);
        callhook(L, "message", 2, 0);
      }
      lua_pop(L, 1);
    }
    cl->in_event = was;
  }
  if (nready > 0 && cl->subscriber && !cl->closed) {
    lua_getiuservalue(L, 3, UV_STATE);
    callhook(L, "progress", 1, 0);
  }
  if (errpos) {
    if (is_current(L, 3, CONN)) {
      lua_settop(L, errpos);                      /* the error on top */
      disconnect(L, 3, cl, 1, FINAL_NOT);
    }
    return 0;
  }
  if (was || cl->closed) return 0;
  /* this connection, or one that a resumed coroutine opened meanwhile
     (whose output waited for this end) */
  if (cl->reader != NULL) {
    if ((e = flush(cl)) != 0) fail_errno(L, 3, cl, e);
    else update_watch(L, 3, cl);
  }
  return 0;
}

/* }====================================================== */


/* {====================================================== call */

/*
** call's continuation: resumed by deliver with (DELIVER, true, reply) or
** (DELIVER, false, error).  Anything else is a stray resume (by someone
** else's coroutine.resume): the caller goes on waiting, as a coroutine
** waiting in the core's locks does (docs/semantics.md, "Spurious
** resumes"); its reply will still come.
*/
static int call_k (lua_State *L, int status, lua_KContext ctx) {
  int base = (int)ctx;
  (void)status;
  if (lua_gettop(L) != base + 3
      || lua_touserdata(L, base + 1) != (void *)&DELIVER) {
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
      callhook(L, "readonly", 3, 1);           /* what to raise */
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
** hiredis's redisAppendCommandArgv would, but written in place (that
** formats into a new string with a printf-like function and then copies
** it, which cost a fifth of the client's instructions per lock cycle:
** docs/redis-locks.md, "Where the time goes").  Returns 0 when out of
** memory.
*/
static int write_command (Client *cl, int n, const char **argv,
                          const size_t *argl) {
  size_t total = header_size((size_t)n);
  int k;
  char *p;
  for (k = 0; k < n; k++) {
    size_t one = header_size(argl[k]) + argl[k] + 2;
    if (total + one < total) return 0;                  /* overflow */
    total += one;
  }
  if (!out_reserve(cl, total)) return 0;
  p = put_header(cl->out + cl->outlen, '*', (size_t)n);
  for (k = 0; k < n; k++) {
    p = put_header(p, '$', argl[k]);
    memcpy(p, argv[k], argl[k]);
    p += argl[k];
    *p++ = '\r';
    *p++ = '\n';
  }
  cl->outlen += total;
  return 1;
}


/*
** Appends the command made of the arguments from index 2 on to the
** output buffer (converting them first: a bad one raises, changing
** nothing).  Returns 1; or 0, with the E_UNAVAILABLE to raise on top, if
** no connection could be had; or 2 with a wait record on top (only when
** `canwait`: see ensure_connection).
*/
static int append (lua_State *L, Client *cl, int canwait) {
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
  if ((k = ensure_connection(L, 1, cl, canwait)) != 1) return k;
  if (!write_command(cl, n, argv, argl))
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
  if ((r = append(L, cl, 1)) == 0) return lua_error(L);
  if (r == 2) {               /* the server is being found: wait, retry */
    lua_copy(L, -1, base + 1);
    lua_settop(L, base + 1);                /* the arguments, the record */
    return call_again_k(L, LUA_YIELD, (lua_KContext)base);
  }
  /* a wait begins: the time since the last reply is not part of it (the
     command timer may run on from an earlier wait, when this call is made
     from the callback that delivered its reply, after blocking work) */
  if (cl->tail == cl->head) cl->progress = now_ms();
  epoch = cl->epoch;
  lua_getiuservalue(L, 1, UV_WAITERS);
  lua_pushthread(L);
  lua_rawseti(L, -2, cl->tail++);           /* may run a finalizer */
  lua_pop(L, 1);
  if (cl->epoch == epoch && cl->tail - cl->head == 1)
    anchor(L, 1, 1);                        /* may run a finalizer */
  /* alone in flight: write now (the loop's next turn would cost an
     iteration); otherwise the batch goes at the end of the read callback
     that runs this coroutine */
  if (cl->epoch == epoch) {
    if (!cl->in_event) {
      int e = cl->tail - cl->head == 1 ? flush(cl) : 0;
      if (e != 0) fail_errno(L, 1, cl, e);
      else update_watch(L, 1, cl);
    }
    else if (cl->outlen >= FLUSH_AT) {
      int e = flush(cl);
      if (e != 0) fail_errno(L, 1, cl, e);
    }
  }
  /* RE-ENTRY: the connection ended while this call joined it (a hook, or
     a finalizer, closed the client): every other caller was resumed with
     the error, this one raises it */
  if (cl->epoch != epoch) {
    /* (ended during the anchoring: anchored after disconnect let go) */
    if (cl->head == cl->tail) anchor(L, 1, 0);
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
    push_unavailable(L, "client closed");
    return lua_error(L);
  }
  /* the search failed: its E_UNAVAILABLE (the next calls get the
     back-off's, which says when the next search may come) */
  if (lua_getfield(L, base + 1, "err") != LUA_TNIL) return lua_error(L);
  lua_settop(L, base);
  return call(L, cl);
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
** locks pass theirs so, which spares a table per request.  Each list's
** length is read once (a __len may answer differently each time) and
** checked before the stack is reserved for it.
*/
#define MAX_SCRIPT_ARGS  (INT_MAX / 4)

static int core_script (lua_State *L) {
  lua_Integer nk, na, k;
  int top = lua_gettop(L);
  int list = top == 5 && lua_type(L, 5) == LUA_TTABLE;
  Client *cl = checkclient(L, 1);
  if (cl->closed) {
    /* its callers (client:eval, the Redis locks) refuse a closed client at
       their own entry: closed since, by a hook or a finalizer, it cut the
       operation off, as a close cuts off the calls in flight */
    push_unavailable(L, "client closed");
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

/* }====================================================== */


/*
** client:close(): ends the connection; every waiting call raises
** E_UNAVAILABLE ("client closed"); later calls raise "attempt to use a
** closed redis client".
*/
static int client_close (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (cl->closed) return 0;
  cl->closed = 1;
  lua_settop(L, 1);
  push_unavailable(L, "client closed");
  disconnect(L, 1, cl, 1, FINAL_CLOSE);
  return 0;
}


/*
** NOTE: a client with calls waiting is anchored (ANCHORED), so it is
** collected only with none waiting, or at lua_close, where every object
** is finalized: __gc closes the connection and resumes nobody.  It raises
** nothing: the error it passes on is the E_UNAVAILABLE constant, which
** needs no allocation.
*/
static int client__gc (lua_State *L) {
  Client *cl = (Client *)lua_touserdata(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    lua_settop(L, 1);
    lua_getfield(L, HOOKS, "E_UNAVAILABLE");
    disconnect(L, 1, cl, 0, FINAL_GC);
  }
  free(cl->out);
  cl->out = NULL;
  cl->outlen = cl->outcap = 0;
  return 0;
}


static int client__tostring (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushfstring(L, "%s (%s): %p", AM_REDIS_CLIENT,
                  cl->closed ? "closed" : cl->reader ? "connected" : "idle",
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

/* new(state [, subscriber]): a client with no connection; state.ref is
   set to a table that holds it weakly (for its connections' callbacks). */
static int core_new (lua_State *L) {
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


/*
** send(client, ...): a subscriber's command (SUBSCRIBE, ...), sent with
** no caller waiting; connects first if needed.  Returns true; or false
** and the E_UNAVAILABLE when no connection can be had now, or the client
** is closed: a subscriber is closed by its client's finalizer (core_drop),
** which may run between the caller's look at status() and this call
** (spec/86).
*/
static int core_send (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (cl->closed) {
    lua_pushboolean(L, 0);
    push_unavailable(L, "client closed");
    return 2;
  }
  if (!append(L, cl, 0)) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  if (!cl->in_event) {
    int e = flush(cl);
    if (e != 0) fail_errno(L, 1, cl, e);
    else update_watch(L, 1, cl);
  }
  lua_pushboolean(L, 1);
  return 1;
}


/* listen(client, on): whether a subscriber keeps reading when idle. */
static int core_listen (lua_State *L) {
  Client *cl = checkclient(L, 1);
  cl->listening = lua_toboolean(L, 2);
  if (!cl->in_event) update_watch(L, 1, cl);
  return 0;
}


/* fail(client, reason): a timeout ended the connection (E_UNAVAILABLE). */
static int core_fail (lua_State *L) {
  Client *cl = checkclient(L, 1);
  const char *reason = luaL_checkstring(L, 2);
  lua_settop(L, 2);
  push_unavailable(L, "%s", reason);
  disconnect(L, 1, cl, 1, FINAL_NOT);
  return 0;
}


/* drop(client): a subscriber whose client was collected: closes it
   without resuming anyone (see client__gc) */
static int core_drop (lua_State *L) {
  Client *cl = checkclient(L, 1);
  if (!cl->closed) {
    cl->closed = 1;
    lua_settop(L, 1);
    lua_getfield(L, HOOKS, "E_UNAVAILABLE");
    disconnect(L, 1, cl, 0, FINAL_GC);
  }
  return 0;
}


/* status(client): "connecting", "connected", "idle" or "closed" */
static int core_status (lua_State *L) {
  Client *cl = checkclient(L, 1);
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
static int core_alive (lua_State *L) {
  void **p = (void **)lua_touserdata(L, 1);
  lua_pushboolean(L, p != NULL && *p != NULL);
  return 1;
}


/* progress(client): now() when replies last came, or a call was sent with
   none in flight; 0: neither yet */
static int core_progress (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushinteger(L, cl->progress);
  return 1;
}

/* epoch(client): how many of its connections have ended (a reply read
   at one epoch and a call answered at the same came on one connection) */
static int core_epoch (lua_State *L) {
  Client *cl = checkclient(L, 1);
  lua_pushinteger(L, (lua_Integer)cl->epoch);
  return 1;
}

/* now(): the client's clock (ms, monotonic) */
static int core_now (lua_State *L) {
  lua_pushinteger(L, now_ms());
  return 1;
}


/*
** wait(record): suspends the running coroutine until record.done is true;
** returns at once if it is.  The Lua layer's waits (subscribe's
** confirmation, a host name's resolution) use it: their record is settled
** by whoever ends the wait, who then resumes the coroutine if it is
** suspended.  Written in C so that the look at record.done and the yield
** are one step no Lua code can come between: from Lua, a debug hook (or a
** finalizer) between the two could settle the record while the coroutine
** is not suspended, and the coroutine would then yield for ever.  A resume
** that finds the record unsettled is a stray one: the coroutine goes on
** waiting (docs/semantics.md, "Spurious resumes").
*/
static int wait_k (lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lua_settop(L, 1);                    /* what a stray resume passed: gone */
  lua_getfield(L, 1, "done");   /* (after any allocation the key needs) */
  if (lua_toboolean(L, -1)) return 0;
  lua_pop(L, 1);
  return lua_yieldk(L, 0, ctx, wait_k);
}

static int core_wait (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isyieldable(L)) return luaL_error(L, "BUG: wait outside a coroutine");
  return wait_k(L, LUA_OK, 0);
}


/*
** wake(co): resumes coroutine co if it is suspended (its errors reported
** as resume does).  The Lua layer's waits are ended so: from Lua, a look at
** coroutine.status then a resume could have a hook between the two.
*/
static int core_wake (lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co != NULL, 1, "thread");
  lua_settop(L, 1);
  resume(L, co, 0);                 /* nothing unless co is suspended */
  return 0;
}


/*
** claim(t, key, v): t[key] if it is set (not false or nil), else v, stored
** there; raw accesses, in one step no hook can come between (the Lua
** layer's subscriber, made once per client: a second one made meanwhile
** by a hook would be left open).
*/
static int core_claim (lua_State *L) {
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
static int core_enlist (lua_State *L) {
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
  {"epoch", core_epoch},
  {"now", core_now},
  {"script", core_script},
  {"wait", core_wait},
  {"wake", core_wake},
  {"claim", core_claim},
  {"enlist", core_enlist},
  {"keyslot", amr_keyslot},
  {NULL, NULL}
};


/*
** The module table: the functions above, E_UNAVAILABLE, hooks (filled
** by the Lua layer: open, watch, connected, lost, attempt, message,
** progress, report, now; here: unavailable, E_UNAVAILABLE, WEAK_V) and
** Client (the methods table, which the Lua layer extends).
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
  /* E_UNAVAILABLE and its reasons: async_mutex.unavailable (pure Lua,
     shared with async_mutex) */
  lua_getfield(L, -1, "hooks");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "async_mutex.unavailable");
  lua_call(L, 1, 1);                            /* module hooks unav */
  lua_getfield(L, -1, "new");
  lua_setfield(L, -3, "unavailable");
  lua_getfield(L, -1, "E_UNAVAILABLE");
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "E_UNAVAILABLE");         /* hooks.E_UNAVAILABLE */
  lua_setfield(L, -4, "E_UNAVAILABLE");         /* module.E_UNAVAILABLE */
  lua_pop(L, 1);
  lua_newtable(L);                              /* weak values */
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setfield(L, -2, "WEAK_V");
  lua_pop(L, 1);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ANCHORED) != LUA_TTABLE) {
    lua_newtable(L);            /* (kept if the module is loaded again) */
    lua_rawsetp(L, LUA_REGISTRYINDEX, &ANCHORED);
  }
  lua_pop(L, 1);
  return 1;
}
