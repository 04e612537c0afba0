/*
** socket.c: the connection's socket, in plain POSIX calls: made
** non-blocking and closed on exec, its TCP options, its connect (a
** refusal seen at once, a completion or failure seen later), its reads
** into hiredis's parser.  Nothing here runs Lua but amr_open_socket's
** reads of the state table (no allocation: its fields are there).
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <hiredis/hiredis.h>

#include "lua.h"

#include "redis.h"


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
int amr_open_socket (lua_State *L, int i, int *inprogress) {
  int fd, r;
  *inprogress = 0;
  if (amr_getstatefield(L, i, "path") == LUA_TSTRING) {
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
    amr_getstatefield(L, i, "host");
    amr_getstatefield(L, i, "port");
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


/*
** The error pending on socket fd (SO_ERROR), or `otherwise` when none
** can be read.
*/
int amr_socket_error (int fd, int otherwise) {
  int soerr = 0;
  socklen_t len = sizeof soerr;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || !soerr)
    soerr = otherwise;
  return soerr;
}

/*
** A connect under way (socket fd) that has already failed, as a refused
** one on loopback is known at once: closes fd and returns -1 with errno
** set, so that the attempt needs no luv handle; else returns fd.
*/
int amr_refused_at_once (int fd) {
  struct pollfd p;
  p.fd = fd;
  p.events = POLLOUT;
  p.revents = 0;
  if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP))) {
    int soerr = amr_socket_error(fd, ECONNREFUSED);
    close(fd);
    errno = soerr;
    return -1;
  }
  return fd;
}

/*
** The connect is complete (the socket is writable), or failed (its error
** is pending).  Returns 0 (connected, or not yet: a spurious wake-up), or
** the errno of the failure.
*/
int amr_finish_connect (Client *cl) {
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

/*
** Reads what the socket has into the parser: on while reads come back
** full (a 10 MB reply in one callback, not in 640 loop turns), up to 1 MB
** so that other handles get their turn.  Returns 0, or an errno (EOF: -1).
*/
int amr_read_socket (Client *cl) {
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
