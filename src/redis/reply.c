/*
** reply.c: hiredis replies as Lua values, and the Error value of
** async_mutex.redis (docs/redis.md, Replies and errors)
*/
#define LUA_LIB

#include <string.h>

#include <hiredis/hiredis.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/*
** An error reply as a table {message = "WRONGTYPE Operation ...",
** code = "WRONGTYPE"}: the code is the message's first word when it is
** written in capitals (Redis's convention), else "ERR".  Pushes it.
*/
void amr_pusherror (lua_State *L, const char *msg, size_t len) {
  size_t n = 0;
  lua_createtable(L, 0, 2);
  lua_pushlstring(L, msg, len);
  lua_setfield(L, -2, "message");
  while (n < len && ((msg[n] >= 'A' && msg[n] <= 'Z') || msg[n] == '_'))
    n++;
  if (n > 0 && (n == len || msg[n] == ' '))
    lua_pushlstring(L, msg, n);
  else
    lua_pushliteral(L, "ERR");
  lua_setfield(L, -2, "code");
  luaL_setmetatable(L, AM_REDIS_ERROR);
}


/*
** Pushes reply r: status and bulk strings as strings, integers as
** integers, nil as nil, arrays as tables with their length in field n
** (a nil element is a hole), an error inside an array as an Error value.
*/
void amr_pushreply (lua_State *L, redisReply *r) {
  size_t i;
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      lua_pushlstring(L, r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      lua_pushinteger(L, (lua_Integer)r->integer);
      break;
    case REDIS_REPLY_ARRAY:
      luaL_checkstack(L, 2, "reply nested too deep");
      lua_createtable(L, (int)r->elements, 1);
      for (i = 0; i < r->elements; i++) {
        amr_pushreply(L, r->element[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);      /* nil: a hole */
      }
      lua_pushinteger(L, (lua_Integer)r->elements);
      lua_setfield(L, -2, "n");
      break;
    case REDIS_REPLY_ERROR:
      amr_pusherror(L, r->str, r->len);
      break;
    default:                                      /* REDIS_REPLY_NIL */
      lua_pushnil(L);
      break;
  }
}


/* tostring(err): its message */
static int error__tostring (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "message");
  if (!lua_isstring(L, -1)) lua_pushliteral(L, "redis error");
  return 1;
}


void amr_openerror (lua_State *L) {
  if (luaL_newmetatable(L, AM_REDIS_ERROR)) {
    lua_pushcfunction(L, error__tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
}
