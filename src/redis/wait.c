/*
** wait.c: resuming a coroutine from C, its errors reported, never raised
** (a luv callback must not raise); and the Lua layer's waits (core.wait,
** core.wake), whose look and yield, or look and resume, are one step no
** hook can come between.
*/
#define LUA_LIB

#include <stdio.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"
#include "../error_text.h"     /* shared with the core: the Makefile */


/* the first value a caller waiting in call is resumed with */
const char amr_DELIVER = 0;


/*
** Resumes coroutine co with `nargs` values moved from L's top.  An error
** escaping co is handed to hooks.report with its traceback (a luv
** callback must not raise), after co is closed, so that its pending
** to-be-closed variables (releasers) run, as the locks' scheduler does
** (am_report); its results, if it ended, are dropped.
*/
void amr_resume (lua_State *L, lua_State *co, int nargs) {
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
    amr_callhook(L, "report", 2, 0);
  }
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

int amr_core_wait (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isyieldable(L))
    return luaL_error(L, "BUG: wait outside a coroutine");
  return wait_k(L, LUA_OK, 0);
}


/*
** wake(co): resumes coroutine co if it is suspended (its errors reported
** as resume does).  The Lua layer's waits are ended so: from Lua, a look at
** coroutine.status then a resume could have a hook between the two.
*/
int amr_core_wake (lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co != NULL, 1, "thread");
  lua_settop(L, 1);
  amr_resume(L, co, 0);                 /* nothing unless co is suspended */
  return 0;
}
