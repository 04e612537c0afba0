/*
** watch.c: the client on luv's loop.  A connection is watched by a luv
** poll handle, made and closed by the Lua layer's hooks (open, lost) and
** told what to watch by hooks.watch (and unref'd while the client is
** idle); on Linux it watches an epoll set of the connection's own that
** holds the socket, so that libuv never sees the socket.  The fd the handle watched is closed only once luv has
** completed the handle's close (conn.on_closed).  The Lua layer's timer
** runs the connect and command timeouts while the handle watches.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"

#ifdef AM_EPOLL
#include <sys/epoll.h>
#endif


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
void amr_update_watch (lua_State *L, int i, Client *cl) {
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

/*
** Linux: a new epoll set holding socket fd (watched for writable: the
** connect is under way), which the poll handle will watch.  Returns it;
** or -1 with errno, fd closed.  Elsewhere: -1, nothing done (the handle
** watches the socket itself).
*/
int amr_watch_set (int fd) {
#ifdef AM_EPOLL
  struct epoll_event e;
  int epfd;
  memset(&e, 0, sizeof e);
  e.events = EPOLLOUT;
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
    int err = errno;
    if (epfd >= 0) close(epfd);
    close(fd);
    errno = err;
    return -1;
  }
  return epfd;
#else
  (void)fd;
  return -1;
#endif
}

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
int amr_conn_closed (lua_State *L) {
  int fd = (int)lua_tointeger(L, lua_upvalueindex(1));
  if (fd >= 0) close(fd);
  lua_pushinteger(L, -1);
  lua_replace(L, lua_upvalueindex(1));
  return 0;
}
