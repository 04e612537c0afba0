/*
** redis.h: private header of async_mutex.redis_core, the Redis client
** on luv's loop, hiredis's reader parsing its replies (see docs/redis.md)
*/
#ifndef AM_REDIS_H
#define AM_REDIS_H

#include "lua.h"

/* metatable names (also what argument errors name) */
#define AM_REDIS_CLIENT  "async_mutex.redis.Client"
#define AM_REDIS_ERROR   "async_mutex.redis.Error"

/* reply.c: converts a hiredis reply to a Lua value (pushed) */
struct redisReply;
void amr_pushreply (lua_State *L, struct redisReply *r);
/* pushes an async_mutex.redis.Error {message=, code=} */
void amr_pusherror (lua_State *L, const char *msg, size_t len);
/* registers the Error metatable */
void amr_openerror (lua_State *L);

/* slot.c: core.keyslot(key), a key's Redis Cluster slot */
int amr_keyslot (lua_State *L);

#endif
