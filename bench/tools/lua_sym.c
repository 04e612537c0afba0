/*
** lua_sym.c: a minimal stand-alone Lua 5.4 interpreter linked statically
** with liblua5.4.a, so that callgrind and perf name the interpreter's own
** functions (Debian's lua5.4 is stripped).  Built by bench/tools/profile.lua.
** Usage: lua_sym script.lua [args]  (arg[0] = script, as lua5.4 does; the
** collector starts in generational mode, as in lua5.4)
*/

#include <stdio.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"


static int msghandler (lua_State *L) {
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}


int main (int argc, char **argv) {
  lua_State *L = luaL_newstate();
  int i, status;
  if (L == NULL || argc < 2) {
    fprintf(stderr, "usage: lua_sym script.lua [args]\n");
    return 1;
  }
  luaL_openlibs(L);
  lua_gc(L, LUA_GCGEN, 0, 0);
  lua_createtable(L, argc, 1);
  lua_pushstring(L, "lua5.4");
  lua_rawseti(L, -2, -1);
  for (i = 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - 1);
  }
  lua_setglobal(L, "arg");
  lua_pushcfunction(L, msghandler);
  status = luaL_loadfile(L, argv[1]);
  if (status == LUA_OK) {
    for (i = 2; i < argc; i++)
      lua_pushstring(L, argv[i]);
    status = lua_pcall(L, argc - 2, 0, 1);
  }
  if (status != LUA_OK)
    fprintf(stderr, "lua_sym: %s\n", lua_tostring(L, -1));
  lua_close(L);
  return status != LUA_OK;
}
