/*
** failure.c: why a connection failed, as the E_UNAVAILABLE its callers
** get (async_mutex.unavailable, docs/redis.md "Failures"): the reasons'
** texts, from an errno or luv's name of one; and the Error values the
** Lua layer makes (core.error, core.error_text).
*/
#define LUA_LIB

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"
#include "../error_text.h"     /* shared with the core: the Makefile */


/*
** Pushes an E_UNAVAILABLE that says why (async_mutex.unavailable, kept
** in hooks.unavailable): "redis server unavailable: " and the reason,
** formatted as lua_pushfstring does.
*/
void amr_push_unavailable (lua_State *L, const char *fmt, ...) {
  va_list ap;
  lua_getfield(L, HOOKS, "unavailable");
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_call(L, 1, 1);
}

/* Pushes the client's address as the reasons name it ("host:port", or
   the unix socket's path). */
const char *amr_push_addr (lua_State *L, int i) {
  amr_getstatefield(L, i, "addr");
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
void amr_push_failure (lua_State *L, int i, const char *name) {
  const char *addr = amr_push_addr(L, i);
  if (strcmp(name, "ECONNREFUSED") == 0)
    amr_push_unavailable(L, "connection refused to %s", addr);
  else if (strcmp(name, "EOF") == 0 || strcmp(name, "EPIPE") == 0)
    amr_push_unavailable(L, "connection closed by %s", addr);
  else if (strcmp(name, "ECONNRESET") == 0)
    amr_push_unavailable(L, "connection reset by %s", addr);
  else if (strcmp(name, "ETIMEDOUT") == 0)
    amr_push_unavailable(L, "connection to %s timed out", addr);
  else if (strcmp(name, "ENOENT") == 0)               /* a unix socket's */
    amr_push_unavailable(L, "no socket at %s", addr);
  else
    amr_push_unavailable(L, "connection to %s failed (%s)", addr, name);
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

void amr_push_errno_failure (lua_State *L, int i, int e) {
  char buf[128];
  amr_push_failure(L, i, errno_name(e, buf, sizeof buf));
}

/* error(message): the Error value an error reply makes */
int amr_core_error (lua_State *L) {
  size_t len;
  const char *msg = luaL_checklstring(L, 1, &len);
  amr_pusherror(L, msg, len);
  return 1;
}

/* error_text(err): an error object's text as lua5.4 prints it, for the
** Lua side's reports (a __tostring that raises cannot raise there) */
int amr_core_error_text (lua_State *L) {
  luaL_checkany(L, 1);
  am_push_error_text(L, 1);
  return 1;
}
