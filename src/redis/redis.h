/*
** redis.h: private header of async_mutex.redis_core, the Redis client
** on luv's loop, hiredis's reader parsing its replies (see docs/redis.md).
** The client's files, one job each (docs/redis.md, "Files"):
**   redis.c    the module's registration (luaopen_async_mutex_redis_core)
**   client.c   the Client: its user values, upvalues, anchor, accessors,
**              close and __gc
**   failure.c  the E_UNAVAILABLE of a failure, with the reason's text
**   output.c   requests in the protocol's form, the output buffer, send()
**   socket.c   sockets: opening, connecting, reading (pure C)
**   watch.c    the loop: what the luv poll handle (and, on Linux, the
**              connection's epoll set) watches; the fd closed after it
**   connect.c  a connection's start (connect_now) and end (disconnect)
**   event.c    the poll handle's callback: replies paired with callers
**   call.c     client:call and core.script: a caller's wait for its reply
**   wait.c     resuming a coroutine; the Lua layer's waits (wait, wake)
**   pubsub.c   a subscriber's commands and the Lua layer's subscriptions
**   reply.c    hiredis replies as Lua values; the Error value
**   slot.c     a key's Redis Cluster slot
*/
#ifndef AM_REDIS_H
#define AM_REDIS_H

#include <stddef.h>

#include "lua.h"

/* metatable names (also what argument errors name) */
#define AM_REDIS_CLIENT  "async_mutex.redis.Client"
#define AM_REDIS_ERROR   "async_mutex.redis.Error"

/* Linux: the poll handle watches an epoll set holding the socket (see
   amr_update_watch); AM_NO_EPOLL builds the portable path, which watches
   the socket itself, for testing it there */
#if defined(__linux__) && !defined(AM_NO_EPOLL)
#define AM_EPOLL
#endif


/* {====================================================== the Client */

/* the client's user values */
#define UV_STATE    1   /* the Lua layer's table: address, options, ref */
#define UV_WAITERS  2   /* FIFO of waiting coroutines: [head, tail) */
#define UV_CONN     3   /* the connection's table (nil: no connection) */
#define UV_ERROR    4   /* the error that ended the last connection */
#define NUSERVALUES 4

/*
** Output that waits for the end of a read callback is written as soon as
** it reaches this size: the server starts on the first calls while the
** callback resumes the other callers (with 50 calls in flight, replies
** and requests then overlap instead of alternating in whole batches).
*/
#define FLUSH_AT  2048

/* events watched: readable, writable */
#define EV_R  1
#define EV_W  2

struct redisReader;

typedef struct Client {
  struct redisReader *reader;  /* the connection's parser; NULL: none */
  char *out;            /* requests not written yet (malloc'd) */
  size_t outlen, outcap;
  int fd;               /* the connection's socket (-1: none) */
  int epfd;             /* Linux: its epoll set, which the handle watches */
  lua_Integer progress; /* amr_now_ms() of the last batch of replies, or of a
                           call sent with nothing in flight: a wait's
                           commandTimeout counts from the later */
  int connecting;       /* the connect is under way */
  int blocked;          /* output waits for the socket to be writable */
  int watching;         /* what hooks.watch was last told: connecting */
  int events;           /* ... the events of the poll handle (EV_*) */
  int active;           /* ... and whether anything is awaited */
  int inner;            /* the socket's events in the epoll set (EV_*) */
  int nsetup;           /* replies due to the set-up commands (AUTH,
                           SELECT), which come before any call's */
  int in_event;         /* inside a read callback: writes wait for its end */
  int closed;           /* close() was called: no more calls */
  int subscriber;       /* a pub/sub connection: replies go to hooks.message */
  int listening;        /* a subscriber with subscriptions: always reading */
  unsigned epoch;       /* counts ended connections (a caller's FIFO ended) */
  lua_Integer head, tail;
} Client;

/*
** Upvalues of every Lua-callable function of the module: the hooks table
** (filled by the Lua layer) and the clients' metatable; a connection's
** callbacks have the connection's table as a third.
*/
#define HOOKS      lua_upvalueindex(1)
#define CLIENT_MT  lua_upvalueindex(2)
#define CONN       lua_upvalueindex(3)

/* the first value a caller waiting in call is resumed with: a value no
   Lua code can make, so that a stray resume is told from ours (wait.c) */
extern const char amr_DELIVER;
/* the registry's key of the set of clients with calls waiting (client.c) */
extern const char amr_ANCHORED;

/* client.c: the client's helpers */
void amr_anchor (lua_State *L, int i, int on);
Client *amr_checkclient (lua_State *L, int i);
int amr_getstatefield (lua_State *L, int i, const char *name);
void amr_callhook (lua_State *L, const char *name, int n, int nres);
int amr_is_current (lua_State *L, int i, int conn);
lua_Integer amr_now_ms (void);

/* }====================================================== */


/* failure.c: E_UNAVAILABLE values (pushed) */
void amr_push_unavailable (lua_State *L, const char *fmt, ...);
const char *amr_push_addr (lua_State *L, int i);
void amr_push_failure (lua_State *L, int i, const char *name);
void amr_push_errno_failure (lua_State *L, int i, int e);

/* output.c: the output buffer (pure C: runs no Lua) */
int amr_write_command (Client *cl, int n, const char **argv,
                       const size_t *argl);
int amr_flush (Client *cl);

/* socket.c: sockets (pure C but amr_open_socket, which reads the state) */
int amr_open_socket (lua_State *L, int i, int *inprogress);
int amr_refused_at_once (int fd);
int amr_finish_connect (Client *cl);
int amr_read_socket (Client *cl);
int amr_socket_error (int fd, int otherwise);

/* watch.c: the loop's handle */
int amr_watch_set (int fd);
void amr_update_watch (lua_State *L, int i, Client *cl);
int amr_conn_closed (lua_State *L);

/* connect.c: a connection's start and end; 'final' of amr_disconnect */
#define FINAL_NOT    0
#define FINAL_CLOSE  1
#define FINAL_GC     2
int amr_ensure_connection (lua_State *L, int i, Client *cl, int canwait);
void amr_disconnect (lua_State *L, int i, Client *cl, int resume_them,
                     int final);
void amr_fail_errno (lua_State *L, int i, Client *cl, int e);

/* event.c: conn.on_event, the poll handle's callback */
int amr_conn_event (lua_State *L);

/* call.c */
int amr_append (lua_State *L, Client *cl, int canwait);

/* wait.c: resumes co with the nargs values on top of L (errors reported) */
void amr_resume (lua_State *L, lua_State *co, int nargs);
/* Resumes co, waiting in call, with (DELIVER, ok, value): the three
   values on top. */
#define amr_deliver(L, co)  amr_resume(L, co, 3)

/* Lua-callable functions, registered by redis.c */
int amr_client_call (lua_State *L);
int amr_client_close (lua_State *L);
int amr_client_pending (lua_State *L);
int amr_client__gc (lua_State *L);
int amr_client__tostring (lua_State *L);
int amr_core_new (lua_State *L);
int amr_core_fail (lua_State *L);
int amr_core_status (lua_State *L);
int amr_core_state (lua_State *L);
int amr_core_alive (lua_State *L);
int amr_core_progress (lua_State *L);
int amr_core_epoch (lua_State *L);
int amr_core_now (lua_State *L);
int amr_core_error (lua_State *L);
int amr_core_error_text (lua_State *L);
int amr_core_script (lua_State *L);
int amr_core_wait (lua_State *L);
int amr_core_wake (lua_State *L);
int amr_core_send (lua_State *L);
int amr_core_listen (lua_State *L);
int amr_core_drop (lua_State *L);
int amr_core_claim (lua_State *L);
int amr_core_enlist (lua_State *L);


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
