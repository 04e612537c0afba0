/*
** signal.c: abort signals (am.signal), Web Locks' AbortSignal
** A signal is passed to requests through a decorated lock
** (am.withSignal, decorated.c).  It keeps the waiters of those requests
** that are queued, in a list through the waiters themselves (their
** signalled tail, async_mutex.h: Waiter; linked and unlinked by queue.c,
** beneath the engine), so aborting wakes each of them at once without
** allocating.  A request made with a signal that is
** aborted already fails at once and never queues (waiter.c); an abort
** wakes every queued one with the signal's reason (rules.c: am_abort).
** docs/semantics.md, Abort signals.
*/

#define LUA_LIB

#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/* The signal at 'idx', or NULL. */
Signal *am_tosignal (lua_State *L, int idx) {
  return (Signal *)am_testself(L, idx, AM_T_SIGNAL);
}


static Signal *checksignal (lua_State *L) {
  return (Signal *)am_checkself(L, AM_T_SIGNAL);
}


/*
** Raises the reason of the signal of 'rq' if it is aborted: a request made
** with an aborted signal fails at once (waiter.c calls this before it
** decides, and again after anything that may have run Lua code).
*/
AM_COLD int am_check_signal (lua_State *L, int sigidx) {
  Signal *s;
  if (sigidx == 0) return 0;
  s = (Signal *)lua_touserdata(L, sigidx);
  if (!s->aborted) return 0;
  lua_getiuservalue(L, sigidx, 1);
  return lua_error(L);
}


/* am.signal(): a new signal, not aborted. */
int am_signal (lua_State *L) {
  Signal *s = (Signal *)lua_newuserdatauv(L, sizeof(Signal), 1);
  s->first = s->last = NULL;
  s->aborted = 0;
  am_pushmt(L, AM_T_SIGNAL);
  lua_setmetatable(L, -2);
  return 1;
}


/*
** s:abort([reason]): aborts the signal, once (later calls do nothing):
** its reason is 'reason', or E_CANCELED when nil; every request waiting
** with it fails with that reason, and later requests at once.
*/
static int signal_abort (lua_State *L) {
  Signal *s = checksignal(L);
  lua_settop(L, 2);
  if (s->aborted) return 0;
  if (lua_isnil(L, 2)) lua_pushliteral(L, AM_E_CANCELED);
  else lua_pushvalue(L, 2);
  /* RE-ENTRY: the string above may have run a finalizer, which may have
     aborted this signal meanwhile: the first abort's reason stands */
  if (s->aborted) return 0;
  lua_setiuservalue(L, 1, 1);
  s->aborted = 1;
  am_abort(L, s);
  am_sync(L, am_getstate(L));
  return 0;
}


/* s:throwIfAborted(): raises the reason when aborted. */
static int signal_throwIfAborted (lua_State *L) {
  Signal *s = checksignal(L);
  if (!s->aborted) return 0;
  lua_getiuservalue(L, 1, 1);
  return lua_error(L);
}


/*
** s.aborted, s.reason (nil until aborted) and the methods, which the
** metatable keeps under their names.
*/
static int signal__index (lua_State *L) {
  Signal *s = checksignal(L);
  const char *k = lua_tostring(L, 2);
  if (k == NULL) lua_pushnil(L);
  else if (strcmp(k, "aborted") == 0) lua_pushboolean(L, s->aborted);
  else if (strcmp(k, "reason") == 0) {
    if (s->aborted) lua_getiuservalue(L, 1, 1);
    else lua_pushnil(L);
  }
  else if (strcmp(k, "abort") == 0 || strcmp(k, "throwIfAborted") == 0) {
    lua_getmetatable(L, 1);
    lua_getfield(L, -1, k);
  }
  else lua_pushnil(L);
  return 1;
}


static int signal__tostring (lua_State *L) {
  Signal *s = checksignal(L);
  int n = 0;
  const Waiter *w;
  for (w = s->first; w != NULL; w = w->snext) n++;
  lua_pushfstring(L, "%s (%s, %d waiting): %p", AM_SIGNAL,
                  s->aborted ? "aborted" : "not aborted", n, (void *)s);
  return 1;
}


/*
** NOTE: a waiting request keeps its signal alive (the signal is in its
** waiting frame), so a signal is collected with waiters listed only by
** lua_close, whose order of finalizers is any: the waiters are let go of
** (their 'sig' cleared), and leave their queues as lua_close frees their
** locks, as any waiter does.
*/
static int signal__gc (lua_State *L) {
  Signal *s = (Signal *)lua_touserdata(L, 1);
  while (s->first != NULL) am_signal_unlink(s->first);
  return 0;
}


const luaL_Reg am_signal_metamethods[] = {
  {"__index", signal__index},
  {"__tostring", signal__tostring},
  {"__gc", signal__gc},
  {"abort", signal_abort},
  {"throwIfAborted", signal_throwIfAborted},
  {NULL, NULL}
};
