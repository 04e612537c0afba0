/*
** event.c: conn.on_event, the callback of a connection's luv poll handle:
** completes the connect, writes what waited for the socket, reads and
** parses the replies, pairs each with its caller (the FIFO) and resumes
** them in call order; a subscriber's replies go to hooks.message.
*/
#define _POSIX_C_SOURCE 200809L
#define LUA_LIB

#include <errno.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "lua.h"
#include "lauxlib.h"

#include "redis.h"


/*
** The client of a connection's callback (its table is upvalue CONN),
** pushed at index 3 with the arguments luv gave at 1 and 2; NULL when
** the client was collected or this connection is no longer its own (a
** stale event).
*/
static Client *conn_client (lua_State *L) {
  lua_settop(L, 2);
  lua_rawgeti(L, CONN, 1);                           /* the ref table */
  if (lua_type(L, -1) != LUA_TTABLE || lua_rawgeti(L, -1, 1) != LUA_TUSERDATA)
    return NULL;
  lua_replace(L, 3);
  lua_settop(L, 3);
  if (!amr_is_current(L, 3, CONN)) return NULL;
  return (Client *)lua_touserdata(L, 3);
}

/*
** The connect under way is complete (the socket is writable), or failed,
** or the wake-up was spurious.  Connected: tells hooks.connected, then,
** if the connection is still the client's, writes what waited for it.
*/
static void connect_done (lua_State *L, Client *cl) {
  int e;
  if ((e = amr_finish_connect(cl)) != 0) {
    amr_fail_errno(L, 3, cl, e);
    return;
  }
  if (cl->connecting) return;                       /* a spurious wake-up */
  lua_getiuservalue(L, 3, UV_STATE);
  amr_callhook(L, "connected", 1, 0);
  if (!amr_is_current(L, 3, CONN)) return;
  if (!cl->in_event && (e = amr_flush(cl)) != 0) amr_fail_errno(L, 3, cl, e);
  else amr_update_watch(L, 3, cl);
}

/* Keeps the error on top as the one that ends the connection (at
   *errpos): the first one found is replaced by a later one. */
static void keep_error (lua_State *L, int *errpos) {
  if (*errpos) lua_replace(L, *errpos);
  else *errpos = lua_gettop(L);
}

/* The parser found a protocol error: its E_UNAVAILABLE is kept. */
static void protocol_error (lua_State *L, Client *cl, int *errpos) {
  char msg[sizeof cl->reader->errstr];
  const char *addr;
  memcpy(msg, cl->reader->errstr, sizeof msg);      /* before allocating */
  msg[sizeof msg - 1] = '\0';
  addr = amr_push_addr(L, 3);
  amr_push_unavailable(L, "protocol error from %s (%s)", addr, msg);
  lua_remove(L, -2);                                  /* the address */
  keep_error(L, errpos);
}

/*
** Takes reply rp (freed here) to the list `ready` (at ready: its caller,
** or false for a subscriber's message; whether it is no error reply; the
** reply) and returns 1; or returns 0 when it ends the connection (a
** set-up command's error reply, kept as the error); or 1 having dropped
** it (a set-up command's success, or a reply nobody asked for).  The FIFO
** is at ready + 1.
*/
static int take_reply (lua_State *L, Client *cl, redisReply *rp, int ready,
                       int *nready, int *errpos) {
  int t;
  if (cl->nsetup > 0) {                           /* a set-up command's */
    cl->nsetup--;
    if (rp->type == REDIS_REPLY_ERROR) {          /* AUTH, SELECT failed */
      amr_pushreply(L, rp);
      freeReplyObject(rp);
      keep_error(L, errpos);
      return 0;
    }
    freeReplyObject(rp);
    return 1;
  }
  if (cl->subscriber) {                       /* a message: nobody waits */
    lua_pushboolean(L, 0);
    t = LUA_TBOOLEAN;
  }
  else if (cl->head < cl->tail) {
    t = lua_rawgeti(L, ready + 1, cl->head);            /* its caller */
    lua_pushnil(L);
    lua_rawseti(L, ready + 1, cl->head++);
    if (cl->head == cl->tail) amr_anchor(L, 3, 0);  /* (caller on 'ready') */
  }
  else t = LUA_TNIL;
  if (t == LUA_TNIL) {                  /* nobody asked for it: dropped */
    lua_pop(L, 1);
    freeReplyObject(rp);
    return 1;
  }
  lua_rawseti(L, ready, ++*nready);
  lua_pushboolean(L, rp->type != REDIS_REPLY_ERROR);
  lua_rawseti(L, ready, ++*nready);
  amr_pushreply(L, rp);
  freeReplyObject(rp);
  lua_rawseti(L, ready, ++*nready);
  return 1;
}

/*
** Takes every complete reply out of the parser to the list at `ready`
** (the FIFO above it) while the connection lasts (epoch): a finalizer run
** by an allocation may end it, which frees the parser.  Returns the
** number of values on the list (three per reply).
*/
static int take_replies (lua_State *L, Client *cl, unsigned epoch,
                         int ready, int *errpos) {
  int nready = 0;
  for (;;) {
    void *reply;
    if (cl->epoch != epoch) break;     /* ended by a finalizer: no parser */
    if (redisReaderGetReply(cl->reader, &reply) != REDIS_OK) {
      protocol_error(L, cl, errpos);
      break;
    }
    if (reply == NULL) break;
    if (!take_reply(L, cl, (redisReply *)reply, ready, &nready, errpos))
      break;
  }
  return nready;
}

/* Resumes the callers on the list at `ready`, in call order, each with its
   reply; hands a subscriber's messages to hooks.message. */
static void hand_out (lua_State *L, int ready, int nready) {
  int r;
  for (r = 1; r <= nready; r += 3) {
    if (lua_rawgeti(L, ready, r) == LUA_TTHREAD) {
      lua_State *co = lua_tothread(L, -1);
      lua_pushlightuserdata(L, (void *)&amr_DELIVER);
      lua_rawgeti(L, ready, r + 1);                   /* ok */
      lua_rawgeti(L, ready, r + 2);                   /* the reply */
      amr_deliver(L, co);
    }
    else {                                      /* a subscriber's message */
      lua_getiuservalue(L, 3, UV_STATE);
      lua_rawgeti(L, ready, r + 2);
      amr_callhook(L, "message", 2, 0);
    }
    lua_pop(L, 1);
  }
}

/*
** The callback's end: a connection that failed (its error at errpos) ends
** if it is still the client's; else, at the outer callback (not `was`
** inside another), the output the resumed callers made is written, on
** this connection or one that a resumed coroutine opened meanwhile (whose
** output waited for this end).  Returns 0 (no results).
*/
static int finish_event (lua_State *L, Client *cl, int errpos, int was) {
  int e;
  if (errpos) {
    if (amr_is_current(L, 3, CONN)) {
      lua_settop(L, errpos);                      /* the error on top */
      amr_disconnect(L, 3, cl, 1, FINAL_NOT);
    }
    return 0;
  }
  if (was || cl->closed) return 0;
  if (cl->reader != NULL) {
    if ((e = amr_flush(cl)) != 0) amr_fail_errno(L, 3, cl, e);
    else amr_update_watch(L, 3, cl);
  }
  return 0;
}

/*
** conn.on_event(err, events): the poll handle's callback (err: a poll
** error, which only a handle on the socket itself can report).  Completes
** the connect; writes output that waited for the socket; reads and parses
** every complete reply and pairs it with its caller first, then resumes
** the callers in call order, each with its reply (a subscriber hands each
** reply to hooks.message instead); then writes the calls those coroutines
** made meanwhile (2 KB at a time while it goes on).  An end of file, a
** read error or a protocol error ends the connection (E_UNAVAILABLE for
** every call still waiting); so does an error reply to a set-up command
** (AUTH, SELECT), with that error.
**
** RE-ENTRY: converting a reply allocates, and so may run a finalizer that
** closes the client or ends this connection (which frees its parser);
** the parser is looked at again only if the connection is still the
** client's.  Replies already taken out of it are delivered whatever
** happens: their callers left the FIFO, and nobody else would resume
** them.
*/
int amr_conn_event (lua_State *L) {
  Client *cl = conn_client(L);
  int nready, ready, was, errpos = 0, e;
  unsigned epoch;
  if (cl == NULL) {              /* nobody reads it: hooks.stale stops it */
    lua_getfield(L, HOOKS, "stale");
    lua_pushvalue(L, CONN);
    lua_call(L, 1, 0);
    return 0;
  }
  epoch = cl->epoch;                 /* changes when the connection ends */
  if (!lua_isnil(L, 1)) {                /* a poll error: the socket's own */
    amr_fail_errno(L, 3, cl, amr_socket_error(cl->fd, ECONNRESET));
    return 0;
  }
  if (cl->connecting) {
    connect_done(L, cl);
    return 0;
  }
  if (cl->blocked && !cl->in_event && (e = amr_flush(cl)) != 0) {
    amr_fail_errno(L, 3, cl, e);
    return 0;
  }
  if ((e = amr_read_socket(cl)) != 0) {
    if (e < 0) amr_push_failure(L, 3, "EOF");
    else amr_push_errno_failure(L, 3, e);
    errpos = lua_gettop(L);
  }
  /* ready {co|false, ok, reply}...: room for one reply made at once (most
     batches are one reply: three resizes of an empty table otherwise) */
  lua_createtable(L, 3, 0);
  ready = lua_gettop(L);
  lua_getiuservalue(L, 3, UV_WAITERS);                  /* ready fifo */
  nready = take_replies(L, cl, epoch, ready, &errpos);
  if (nready > 0) cl->progress = amr_now_ms();   /* the command timeout
                                                    counts from now */
  was = cl->in_event;
  cl->in_event = 1;
  hand_out(L, ready, nready);
  cl->in_event = was;
  if (nready > 0 && cl->subscriber && !cl->closed) {
    lua_getiuservalue(L, 3, UV_STATE);
    amr_callhook(L, "progress", 1, 0);
  }
  return finish_event(L, cl, errpos, was);
}
