/*
** output.c: the client's requests in the protocol's form (RESP), written
** in place into its output buffer, and sent on the socket with send().
** Pure C: nothing here runs Lua.
*/
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/socket.h>

#include "lua.h"

#include "redis.h"

#ifndef MSG_NOSIGNAL           /* macOS: SO_NOSIGPIPE, set at connect */
#define MSG_NOSIGNAL 0
#endif


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
int amr_flush (Client *cl) {
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
int amr_write_command (Client *cl, int n, const char **argv,
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

