/*
** steal.c: lock:steal(), the Web Locks API's request(name, {steal: true})
** A steal is granted at once, whoever holds the lock: every hold in place
** ends, lost, as a leased hold ends when its lease runs out (lease.c: its
** releaser returns false, its check() raises the lost error, runExclusive
** raises it when its function returns), and the stealer holds the lock.
** Queued requests stay queued, in their order.  docs/semantics.md, Steal.
**
** The lock keeps no list of its holds, so a steal ends them all at once
** through their tokens, and each releaser learns of it when asked:
** - the lock's generation moves on ('gen'): a Mutex's, a ReentrantMutex's
**   and an RWLock's write releaser no longer matches it (as after an
**   unscoped release); a Semaphore's releasers and an RWLock's reads carry
**   the generation they were granted in (only a steal moves it on while
**   they are held), so a changed generation means stolen;
** - an exclusive hold's token could also have been ended by an unscoped
**   release (not lost): the steal writes it in the lock's set of stolen
**   tokens (State.stolen: lock -> {token = releasers to be told}), which
**   its releasers read, and leave, when they learn they are lost (a
**   finalizer run by the entry's allocation may steal too: the counts
**   add up);
** - a grant settled and not yet delivered (READY) is marked stolen (an
**   outcome of its own, O_CANCELED with the flag 'stolen'): its acquire
**   raises the lost error instead of returning.
** So grants record nothing more, a release tests one more condition (did
** it give nothing back?), and a steal walks the scheduler's ready list
** once.
*/

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"


/*
** Pushes the set of stolen tokens of the lock at 'idx', made if 'create'
** (it allocates), else nil if it has none; returns whether it is a table.
*/
static int push_set (lua_State *L, State *st, int idx, int create) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->stolen);
  lua_pushvalue(L, idx);
  if (lua_rawget(L, -2) == LUA_TNIL && create) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);                      /* stolen[lock] = set */
  }
  lua_remove(L, -2);
  return lua_istable(L, -1);
}


/* Is a hold of 'weight' one of several at once (its kind's answer)? */
static int shared (const Lock *lk, lua_Integer weight) {
  return lk->kind->shared != NULL && lk->kind->shared(weight);
}


/*
** Was the hold of releaser 'r' (at 'idx'; not live) ended by a steal?
** With 'forget', the releaser is told so once (it becomes LOST): its
** token leaves the lock's set when the last releaser of that hold (a
** ReentrantMutex has one per level) has been told.
*/
int am_hold_stolen (lua_State *L, const Releaser *r, int idx, int forget) {
  const Lock *lk = r->lock;
  lua_Integer left;
  if (lk->freed || r->token == lk->gen) return 0;
  if (shared(lk, r->weight))
    return 1;                         /* its generation moved on: a steal */
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, 4, NULL);
  lua_getiuservalue(L, idx, 1);                        /* its lock */
  if (!push_set(L, lk->st, lua_gettop(L), 0)) {
    lua_pop(L, 2);
    return 0;
  }
  lua_rawgeti(L, -1, r->token);
  left = lua_tointeger(L, -1);
  lua_pop(L, 1);
  if (left > 0 && forget) {           /* (removing allocates nothing) */
    if (left > 1) lua_pushinteger(L, left - 1);
    else lua_pushnil(L);
    lua_rawseti(L, -2, r->token);
  }
  lua_pop(L, 2);
  return left > 0;
}


/*
** Makes the entry of token 'tok' in the set of the lock at 'idx' (0
** releasers to be told, if new), and the set if needed: it allocates.
*/
static void make_entry (lua_State *L, State *st, int idx, lua_Integer tok) {
  push_set(L, st, idx, 1);
  if (lua_rawgeti(L, -1, tok) == LUA_TNIL) {
    lua_pushinteger(L, 0);
    lua_rawseti(L, -3, tok);
  }
  lua_pop(L, 2);
}


/*
** Adds 'n' releasers to be told to the entry of 'tok' (made already by
** make_entry, or gone: then nothing); an entry left at 0 goes.
** Allocates nothing: the key exists, or is set to nil.
*/
static void add_token (lua_State *L, State *st, int idx, lua_Integer tok,
                       lua_Integer n) {
  int top = lua_gettop(L);
  if (push_set(L, st, idx, 0) && lua_rawgeti(L, -1, tok) != LUA_TNIL) {
    n += lua_tointeger(L, -1);
    if (n > 0) lua_pushinteger(L, n);
    else lua_pushnil(L);
    lua_rawseti(L, -3, tok);
  }
  lua_settop(L, top);
}


/* Is 'lk' held by one exclusive hold whose token is its generation? */
static int exclusive (const Lock *lk) {
  return lk->kind->exclusive != NULL ? lk->kind->exclusive(lk)
                                     : lk->kind->is_locked(lk);
}


/*
** Marks the grants of 'lk' settled and not yet delivered (in the
** scheduler's ready list) as stolen; returns whether the exclusive hold
** of token 'tok' (0: none) is one of them.  Another may be an exclusive
** grant that an unscoped release ended before it was delivered, and the
** hold in place a later one, delivered, whose releaser will ask.
*/
static int mark_undelivered (Lock *lk, lua_Integer tok) {
  const Bucket *ready = &lk->st->ready;
  Waiter *w;
  int hold = 0;
  for (w = am_bucket_next(ready, NULL); w != NULL;
       w = am_bucket_next(ready, w))
    if (w->r.lock == lk && w->r.kind == W_ACQUIRE
        && w->r.outcome == O_GRANTED) {
      w->r.outcome = O_CANCELED;          /* not given back if closed */
      w->r.stolen = 1;                    /* raises the lost error */
      if (tok != 0 && w->r.token == tok
          && !shared(lk, w->r.weight))
        hold = 1;
    }
  return hold;
}


/*
** The usage errors a steal of 'rq' on 'lk' can meet: the coroutine that
** holds a ReentrantMutex would hold it twice; a Semaphore's weight must
** fit in its value with every hold ended.  A key's lock made for the
** steal leaves its set first.
*/
static void check_steal (lua_State *L, const Request *rq, Lock *lk) {
  if (lk->kind->reentrant && lk->owner == L && lk->value <= 0)
    am_usage_error(L, "attempt to steal a reentrant mutex that this "
                      "coroutine holds (it would hold it twice)");
  if (lk->kind->weighted) {
    lua_Integer free = lk->value > 0 && lk->held > LUA_MAXINTEGER - lk->value
                       ? LUA_MAXINTEGER : lk->value + lk->held;
    if (rq->weight > free) {
      am_settle(L, lk);
      am_argerror(L, rq->first, rq->base, rq->fname, lua_pushfstring(L,
                  "weight %I is more than the semaphore's value with every "
                  "hold ended (%I)", (LUAI_UACINT)rq->weight,
                  (LUAI_UACINT)free));
    }
  }
}


/*
** The steal 'rq' (arguments parsed) of 'rq->lock', at 'rq->lockidx':
** pushes what acquire returns.  RE-ENTRY (docs/internals.md, Decide,
** then commit): the token of an exclusive hold goes into the lock's set
** first (that allocates, and so may run a finalizer that releases,
** steals or, on a keyed set, replaces the key's lock); the lock is looked
** at again after, and from the decision to the grant nothing runs Lua.
*/
AM_COLD int am_steal (lua_State *L, Request *rq) {
  Lock *lk;
  State *st;
  lua_Integer tok, token, hold;
  int n;
  luaL_checkstack(L, 6, NULL);
  for (;;) {
    lk = rq->lock = am_keyed_current(L, rq->lock, rq->lockidx);
    check_steal(L, rq, lk);
    if (!exclusive(lk)) {
      tok = 0;
      break;
    }
    tok = lk->gen;
    make_entry(L, lk->st, rq->lockidx, tok);        /* first: it allocates */
    if (am_keyed_current(L, rq->lock, rq->lockidx) == lk && exclusive(lk)
        && lk->gen == tok && !(lk->kind->reentrant && lk->owner == L))
      break;
    add_token(L, lk->st, rq->lockidx, tok, 0);      /* changed: again */
  }
  /* decided: from here to the grant, C structures only */
  st = lk->st;
  if (!mark_undelivered(lk, tok) && tok != 0)
    /* its releasers will ask (a ReentrantMutex: one per level); a hold
       not delivered yet has none */
    add_token(L, st, rq->lockidx, tok, lk->kind->reentrant ? lk->held : 1);
  else if (tok != 0)
    add_token(L, st, rq->lockidx, tok, 0);          /* its entry goes */
  lk->kind->end_holds(lk);
  lk->held = 0;
  lk->gen++;                            /* every hold's token is stale */
  token = am_take(lk, rq->weight);
  if (lk->kind->owned != NULL) lk->kind->owned(L, lk, rq->lockidx);
  /* a Semaphore returns the value; its hold's token is the generation */
  hold = lk->kind->returns_value ? lk->gen : token;
  am_dispatch(L, lk);                   /* what the ended holds gave back */
  n = 1;
  if (lk->kind->returns_value) {
    lua_pushinteger(L, token);
    n = 2;
  }
  am_push_releaser(L, rq->lockidx, lk, rq->weight, hold);
  am_sync(L, st);
  if (am_debugging()) {       /* the ended holds' records go; its own */
    am_debug_observer->stolen(L, st, lk);
    am_debug_observer->granted(L, st);
  }
  return n;
}


/* The steal of a plain lock 'lk' at index 1 (its methods). */
AM_COLD int am_lock_steal (lua_State *L, Lock *lk, Request *rq) {
  rq->lock = lk;
  rq->lockidx = 1;
  am_parse_request(L, rq, lk->kind);
  return am_steal(L, rq);
}
