/*
** run.c: runExclusive's body, between the grant and its release
** A Mutex's or Semaphore's runExclusive (decorated.c: am_run_request) is
** one C function: it requests, then calls the body here, in the same
** frame, whether the grant came at once or after a wait (waiter.c:
** finish_run).  The releaser is to-be-closed in that frame: it releases
** when runExclusive returns, and when the coroutine is closed while the
** body is suspended.  The body's error is caught so as to release before
** it propagates (an error that kills a coroutine closes nothing until the
** coroutine is closed), then raised again unchanged.  A hold lost while
** the body ran (a lease ran out, a steal ended it) raises the lost error
** once the body returns, and its results are dropped (docs/semantics.md,
** Leases and lost holds).  The Lua layer's runExclusive of the other
** kinds does the same in Lua (async_mutex/init.lua).
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/*
** Continuation of the body's call: 'ctx' is the releaser's index, the
** body's results (or its error) are above it.
*/
static int finish_body (lua_State *L, int status, lua_KContext ctx) {
  int ridx = (int)ctx;
  if (status != LUA_OK && status != LUA_YIELD) {   /* the body raised */
    am_release_hold(L, ridx);       /* its error stays on top */
    return lua_error(L);
  }
  am_hold_check(L, ridx);           /* the body ran Lua: look again */
  return lua_gettop(L) - ridx;
}


/*
** Runs the body at 'fnidx' with the grant of 'n' values on top (a
** Semaphore's value, then the releaser): the value is the body's
** argument.  Returns the body's results.  (A C function has LUA_MINSTACK
** free slots: the request and the grant use fewer than half.)
*/
int am_run_body (lua_State *L, int fnidx, int n) {
  int ridx = lua_gettop(L);
  lua_toclose(L, ridx);
  lua_pushvalue(L, fnidx);
  if (n == 2) lua_pushvalue(L, ridx - 1);
  return finish_body(L, lua_pcallk(L, n - 1, LUA_MULTRET, 0, ridx,
                                   finish_body), ridx);
}
