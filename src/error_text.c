/*
** error_text.c: the text of an error object, as lua5.4 prints an uncaught
** one (lua.c, msghandler), for the reports of errors escaping a coroutine
** the module resumed: the scheduler's (scheduler.c, am_report) and the
** Redis client's (redis/wait.c, amr_resume).  Linked into both modules.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "error_text.h"


/*
** The text of the error object at 1 by its __tostring: a Redis error
** reply's message, say.  Called protected: a __tostring that raises is
** ignored.
*/
static int error_text (lua_State *L) {
  if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
    return 1;
  return 0;
}


/*
** A string or a number as lua5.4 prints it (lua_tostring), else its
** __tostring, else "(error object is a T value)".  The error object
** itself is left as is.
*/
const char *am_push_error_text (lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TSTRING || lua_type(L, idx) == LUA_TNUMBER) {
    lua_pushvalue(L, idx);
    lua_tostring(L, -1);                /* the copy becomes its text */
  }
  else {
    lua_pushcfunction(L, error_text);
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK || lua_type(L, -1) != LUA_TSTRING) {
      lua_pop(L, 1);
      lua_pushfstring(L, "(error object is a %s value)",
                      luaL_typename(L, idx));
    }
  }
  return lua_tostring(L, -1);
}
