/*
** connect.c: a connection's start and end.  connect_now opens one (its
** socket, its epoll set on Linux, its table of callbacks, its parser,
** its set-up commands, then its luv poll handle through hooks.open),
** amr_ensure_connection asks the Lua layer's back-off first,
** amr_disconnect ends one and resumes every caller that waited on it.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"
#include "../error_text.h"     /* shared with the core: the Makefile */

#ifdef AM_EPOLL
#include <sys/epoll.h>
#endif


/* {====================================================== ending */

/*
** Detaches everything the connection had from the client (its table,
** socket, parser, output, the FIFO's bounds) and closes its socket on
** Linux: the socket leaves the set now (libuv never watched it), and the
** server sees the end at once; the set itself, which the poll handle
** watches, is closed once the handle's close is complete.  Sets nothing
** that can run Lua (the user value set to nil allocates nothing).
*/
static void detach (lua_State *L, int i, Client *cl, int had) {
  lua_pushnil(L);
  lua_setiuservalue(L, i, UV_CONN);
#ifdef AM_EPOLL
  if (cl->fd >= 0 && had) {
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    epoll_ctl(cl->epfd, EPOLL_CTL_DEL, cl->fd, &e);
    close(cl->fd);
  }
#else
  (void)had;
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
}

/* Resumes the callers of fifo entries [head, tail) (the FIFO at err + 2)
   with (false, error at err), but the running coroutine. */
static void resume_waiters (lua_State *L, int err, lua_Integer head,
                            lua_Integer tail) {
  lua_Integer k;
  for (k = head; k < tail; k++) {
    if (lua_rawgeti(L, err + 2, k) == LUA_TTHREAD
        && lua_tothread(L, -1) != L) {
      lua_State *co = lua_tothread(L, -1);
      lua_pushlightuserdata(L, (void *)&amr_DELIVER);
      lua_pushboolean(L, 0);
      lua_pushvalue(L, err);
      amr_deliver(L, co);
    }
    lua_pop(L, 1);
  }
}

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
void amr_disconnect (lua_State *L, int i, Client *cl, int resume_them,
                     int final) {
  int err = lua_gettop(L), had, was_connected;
  lua_Integer head = cl->head, tail = cl->tail;
  lua_getiuservalue(L, i, UV_CONN);                 /* err conn */
  had = !lua_isnil(L, -1);
  was_connected = had && !cl->connecting;
  detach(L, i, cl, had);
  amr_anchor(L, i, 0);
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
    amr_callhook(L, "lost", 5, 0);
  }
  if (resume_them) resume_waiters(L, err, head, tail);
  lua_settop(L, err - 1);
}

/* Ends the connection with the E_UNAVAILABLE of errno value e. */
void amr_fail_errno (lua_State *L, int i, Client *cl, int e) {
  amr_push_errno_failure(L, i, e);
  amr_disconnect(L, i, cl, 1, FINAL_NOT);
}

/* }====================================================== */


/* {====================================================== starting */

/*
** Queues the set-up commands of state.setup (AUTH, SELECT) first in the
** output; their replies come before any call's (cl->nsetup).  Returns 0
** when out of memory.
*/
static int queue_setup (lua_State *L, int i, Client *cl) {
  lua_Integer k;
  int ok = 1;
  if (amr_getstatefield(L, i, "setup") == LUA_TTABLE) {
    int setup = lua_gettop(L);
    for (k = 1; ok && lua_rawgeti(L, setup, k) == LUA_TTABLE; k++) {
      int cmd = lua_gettop(L), n;
      const char *argv[4];
      size_t argl[4];
      for (n = 0; n < 4 && lua_rawgeti(L, cmd, n + 1) == LUA_TSTRING; n++)
        argv[n] = lua_tolstring(L, -1, &argl[n]);
      ok = amr_write_command(cl, n, argv, argl);
      lua_settop(L, cmd - 1);      /* the strings stay anchored in setup */
      cl->nsetup++;
    }
    lua_settop(L, setup - 1);
  }
  else lua_pop(L, 1);
  return ok;
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
** Pushes a new connection's table (conn: the client weakly held, poll,
** dead, opening, busy, and the callbacks on_event and on_closed), then
** its on_closed again, whose upvalue the fd is set in once there is one.
** Returns the table's index.  Every field the Lua layer sets is there
** from the start: setting it then allocates nothing (and so runs no
** finalizer).
*/
static int new_conn_table (lua_State *L, int i) {
  int conn;
  lua_createtable(L, 1, 6);
  conn = lua_gettop(L);
  amr_getstatefield(L, i, "ref");             /* the client, weakly held */
  lua_rawseti(L, conn, 1);
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "poll");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "dead");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "opening");
  lua_pushboolean(L, 0);
  lua_setfield(L, conn, "busy");
  push_callback(L, conn, amr_conn_event);
  lua_setfield(L, conn, "on_event");
  lua_pushinteger(L, -1);
  lua_pushcclosure(L, amr_conn_closed, 1);           /* conn ... closed */
  lua_pushvalue(L, -1);
  lua_setfield(L, conn, "on_closed");
  return conn;
}

/*
** Opens the connection's socket and starts connecting (a refusal known at
** once, as on loopback, fails here: no luv handle is needed), and on
** Linux its epoll set (*epfd; else -1).  Returns the socket, or -1 with
** errno, nothing left open.
*/
static int open_fds (lua_State *L, int i, int *epfd) {
  int inprogress, fd = amr_open_socket(L, i, &inprogress);
  *epfd = -1;
  if (fd >= 0 && inprogress) fd = amr_refused_at_once(fd);
#ifdef AM_EPOLL
  if (fd >= 0 && (*epfd = amr_watch_set(fd)) < 0) fd = -1;
#endif
  return fd;
}

/*
** The attempt failed before a connection was set up (errno value e):
** pushes its E_UNAVAILABLE, in place of the connection's table, and tells
** hooks.lost (the back-off).  Returns 0.
*/
static int failed_at_once (lua_State *L, int i, int conn, int e) {
  lua_settop(L, conn - 1);
  amr_push_errno_failure(L, i, e);
  lua_getiuservalue(L, i, UV_STATE);
  lua_pushnil(L);
  lua_pushboolean(L, 0);
  lua_pushnil(L);
  lua_pushvalue(L, -5);                      /* the error */
  amr_callhook(L, "lost", 5, 0);             /* (the back-off) */
  return 0;
}

/*
** From here on the fds are the connection's (disconnect closes them): the
** client takes the connection's table (at conn; its on_closed above it,
** popped) and a new parser, and starts in the connecting state.
*/
static void adopt (lua_State *L, int i, Client *cl, int conn, int fd,
                   int epfd) {
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
}

/*
** The poll handle: made by luv (hooks.open returns true, or nil and luv's
** error); a Lua error in it fails the attempt rather than leaving a
** connection with no handle.  Returns 1, the stack back at conn - 1; or
** 0 with the error to raise at conn, the top (the connection ended).
*/
static int open_handle (lua_State *L, int i, Client *cl, int conn,
                        int watched) {
  int status;
  lua_getfield(L, HOOKS, "open");
  lua_getiuservalue(L, i, UV_STATE);
  lua_pushvalue(L, conn);
  lua_pushinteger(L, watched);
  status = lua_pcall(L, 3, 2, 0);
  if (!amr_is_current(L, i, conn)) {    /* ended meanwhile (a finalizer) */
    lua_settop(L, conn - 1);
    lua_getiuservalue(L, i, UV_ERROR);
    return 0;
  }
  if (status == LUA_OK && lua_toboolean(L, -2)) {
    lua_settop(L, conn - 1);
    return 1;
  }
  {
    const char *addr = amr_push_addr(L, i);
    const char *msg = status != LUA_OK ? am_push_error_text(L, -2)
                      : lua_isstring(L, -2) ? lua_tostring(L, -2) : "?";
    amr_push_unavailable(L, "cannot watch the connection to %s (%s)",
                         addr, msg);
  }
  lua_pushvalue(L, -1);                  /* the error: raised, and ends */
  amr_disconnect(L, i, cl, 1, FINAL_NOT);
  lua_replace(L, conn);
  lua_settop(L, conn);
  return 0;
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
  int conn, fd, epfd;
  /* RE-ENTRY: the connection's table and callbacks first (allocations:
     a finalizer may close the client), the client looked at after; the
     socket only then, so that nothing is left open if it was */
  conn = new_conn_table(L, i);                       /* conn on_closed */
  if (cl->closed) {
    lua_settop(L, conn - 1);
    amr_push_unavailable(L, "client closed");
    return 0;
  }
  if (cl->reader != NULL) {                 /* one was opened meanwhile */
    lua_settop(L, conn - 1);
    return 1;
  }
  fd = open_fds(L, i, &epfd);
  if (fd < 0) return failed_at_once(L, i, conn, errno);
  adopt(L, i, cl, conn, fd, epfd);
  if (cl->reader == NULL || !queue_setup(L, i, cl)) {
    lua_pushliteral(L, "not enough memory");
    amr_disconnect(L, i, cl, 1, FINAL_NOT);
    return luaL_error(L, "not enough memory");
  }
  return open_handle(L, i, cl, conn, epfd >= 0 ? epfd : fd);
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
int amr_ensure_connection (lua_State *L, int i, Client *cl,
                              int canwait) {
  if (cl->fd >= 0 && !cl->connecting && cl->head == cl->tail
      && cl->nsetup == 0 && cl->outlen == 0 && !cl->in_event
      && !cl->subscriber) {
    /* idle: a connection the server ended meanwhile (a restart, an
       idle timeout) is readable now, and its handle, which watches it
       unref'd, has not seen it yet if the loop has not run since;
       replace it rather than fail this call */
    struct pollfd p;
    p.fd = cl->fd;
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 1) {
      amr_push_failure(L, i, "EOF");
      amr_disconnect(L, i, cl, 1, FINAL_NOT);
    }
  }
  if (cl->closed) {
    amr_push_unavailable(L, "client closed");
    return 0;
  }
  if (cl->reader != NULL) return 1;
  lua_getiuservalue(L, i, UV_STATE);
  lua_pushboolean(L, canwait);
  amr_callhook(L, "attempt", 2, 1);    /* nil, why not now, or a wait record */
  if (cl->closed) {                       /* a finalizer closed it */
    lua_pop(L, 1);
    amr_push_unavailable(L, "client closed");
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

/* }====================================================== */
