/*
** async_mutex.h: private header of the async_mutex core
** Structures shared by the scheduler (sched.c), the queue rules (lock.c),
** the requests (request.c) and the Lua bindings (locks.c, core.c).
*/

#ifndef ASYNC_MUTEX_H
#define ASYNC_MUTEX_H

#include <stddef.h>
#include <stdint.h>

#include "lua.h"
#include "lauxlib.h"

/* Metatable names, as they appear in argument errors. */
#define AM_MUTEX      "async_mutex.Mutex"
#define AM_SEMAPHORE  "async_mutex.Semaphore"
#define AM_RELEASER   "async_mutex.Releaser"
#define AM_WAITER     "async_mutex.Waiter"
#define AM_STATE      "async_mutex.State"       /* its metatable */
#define AM_STATE_KEY  "async_mutex.scheduler"   /* registry key of the state */
#define AM_KEYED_MUTEX      "async_mutex.KeyedMutex"
#define AM_KEYED_SEMAPHORE  "async_mutex.KeyedSemaphore"

/* async-mutex's exact messages; they are also the error values. */
#define AM_E_TIMEOUT  "timeout while waiting for mutex to become available"
#define AM_E_ALREADY_LOCKED  "mutex already locked"
#define AM_E_CANCELED "request for lock canceled"
#define AM_E_MAX_PENDING  "too many pending requests for this key"


/*
** Upvalues shared by every C function of the module, so the hot paths
** check and set metatables without a registry lookup by name.
*/
enum { UV_STATE = 1, UV_MUTEX, UV_SEMAPHORE, UV_RELEASER, UV_WAITER,
       UV_KEYED_MUTEX, UV_KEYED_SEMAPHORE };
#define UV_COUNT  UV_KEYED_SEMAPHORE
#define am_pushupvalue(L,uv)  lua_pushvalue(L, lua_upvalueindex(uv))

typedef struct Waiter Waiter;
typedef struct Lock Lock;
typedef struct State State;
typedef struct Keyed Keyed;

/*
** Waiters are linked in doubly linked lists, FIFO.  A link is a Waiter,
** or a tagged pointer to the Bucket the list runs through (its sentinel),
** so a waiter leaves its list in O(1) without knowing which list it is.
*/
typedef struct Links {
  void *prev, *next;
} Links;

/*
** A queue key: a priority, compared exactly as Lua compares numbers
** (an integer is not rounded to a double: maxinteger - 1 < maxinteger),
** or a timer's duration.  Canonical: 'flt' is 0 for an integer 'i' (a
** float with an integer's value counts as that integer) and 'n' is 'i' as
** a double; 'flt' is 1 for any other float 'n', and 'i' is 0.  Order: by
** 'n', then 'flt' (at an equal 'n' only 2^63 can be both, and the float
** is the greater), then 'i'.
*/
typedef struct Key {
  lua_Number n;
  lua_Integer i;
  int flt;
} Key;

/*
** A FIFO list of waiters sharing one key: a priority in a lock's queue, a
** duration in the timer queue.  'ends.next' is the head, 'ends.prev' the
** tail.  The scheduler's ready list is a bucket of its own.
*/
typedef struct Bucket {
  Links ends;
  Key key;
  uint32_t pos;               /* position in its queue's heap */
} Bucket;

/*
** A queue of waiters: a binary heap of non-empty buckets, and a hash of
** the buckets by key.  Queue order (priority descending, then arrival):
** buckets by key descending.  Timer order (deadline, then arrival):
** buckets by their head's deadline (waiters of one duration arrive in
** deadline order), the longer duration first on a tie (it arrived first).
** (Timer keys are the deadline minus the loop time at the request, as
** rounded, so equal keys and deadlines mean one list.)  Every operation
** is O(1), or O(log n) in the number of distinct keys.
*/
typedef struct Queue {
  Bucket **heap;
  Bucket **slot;              /* open addressing, 'hcap' a power of 2 */
  Bucket *spare;              /* an emptied bucket kept for the next key */
  size_t count;               /* waiters */
  uint32_t n, cap;            /* buckets in the heap */
  uint32_t hcap;
  int timer;
} Queue;

/* What a waiter waits for. */
enum { W_ACQUIRE, W_UNLOCK };

/*
** Life of a waiter: QUEUED in its lock's queue (and maybe in the timer
** queue), then READY in the scheduler's ready list once its outcome is
** decided, RESUMING while the scheduler resumes it, DONE once its
** coroutine has read the outcome (or was closed).  A granted acquire
** hands its waiter out as the releaser: HELD until released, RELEASED.
*/
enum { S_QUEUED, S_READY, S_RESUMING, S_DONE, S_HELD, S_RELEASED };

enum { O_GRANTED, O_TIMEOUT, O_CANCELED };

/* How long a request may wait. */
enum { AM_WAIT, AM_TIMEOUT, AM_TRY };

/*
** One suspended request.  It is a userdata living on the waiting
** coroutine's own stack, marked to-be-closed, so 'coroutine.close' of a
** waiting coroutine removes it from every queue at once; the coroutine is
** anchored (sched.c, 'ref') while the module may resume it.
**
** Its size is most of what a waiter costs, so it is allocated in three
** lengths: a releaser is the fields before 'q'; an untimed waiter stops
** before 't'.  An untimed acquire's waiter carries its lock (user value
** 1) and becomes the releaser of its grant: one object per hand-off.
*/
struct Waiter {
  Lock *lock;
  lua_Integer weight;
  union {
    lua_Number deadline;      /* while in the timer queue: loop time (ms) */
    lua_Integer value;        /* once granted: semaphore value at the grant,
                                 or the mutex grant's generation */
  } u;
  int ref;                    /* anchor of the coroutine (sched.c) */
  unsigned char state;
  unsigned int kind : 1;      /* W_ACQUIRE or W_UNLOCK */
  unsigned int outcome : 2;
  unsigned int timed : 1;     /* allocated with 't' (withTimeout) */
  unsigned char lockidx;      /* stack index of the lock in the waiting frame */
  unsigned char erridx;       /* stack index of the timeout error, or 0; the
                                 waiter itself is just above both */
  Links q;                    /* QUEUED: in its lock's queue;
                                 READY: in the scheduler's ready list */
  Links t;                    /* timed only: in the timer queue, or
                                 t.next NULL */
};

#define AM_RELEASER_SIZE   offsetof(Waiter, q)
#define AM_UNTIMED_SIZE    offsetof(Waiter, t)

/* A request being made: what, on which lock (a stack index), how long. */
typedef struct Request {
  int kind;                   /* W_ACQUIRE or W_UNLOCK */
  Lock *lock;                 /* the lock at stack index 'lockidx' */
  int lockidx;
  int mode;                   /* AM_WAIT, AM_TIMEOUT or AM_TRY */
  lua_Number ms;              /* AM_TIMEOUT: how long */
  int erridx;                 /* raised on timeout or refusal */
  lua_Integer weight;
  Key priority;
} Request;

/* waitForUnlock waiters that asked for one weight. */
typedef struct WeightWaiters {
  lua_Integer weight;
  Queue queue;
} WeightWaiters;

/*
** A semaphore (a mutex is a semaphore of value 1 whose release is a no-op
** while unlocked).  User value 1 holds the cancel error.
*/
struct Lock {
  State *st;
  lua_Integer value;
  lua_Integer held;           /* weight granted and not given back yet */
  lua_Integer gen;            /* mutex: number of grants so far */
  Queue queue;                /* acquirers, head = next to be granted */
  WeightWaiters *unlock;      /* sorted by weight, ascending */
  size_t nweights, capweights;
  size_t nunlock;             /* waitForUnlock waiters in all queues */
  int is_mutex;
  int freed;                  /* its __gc ran (only lua_close does that
                                 to a lock in use): no more waiting */
  Keyed *keyed;               /* the keyed set serving this lock, or NULL */
  int selfref;                /* keyed: 0 while in its set (and in the
                                 state's 'keyedlocks'), else LUA_NOREF */
};

/*
** A set of locks by key (keyed.c), each created on demand and dropped as
** soon as it is idle.  User values: 1 the map key -> lock, 2 the cancel
** error, 3 the error for a request beyond 'max_pending'.
*/
struct Keyed {
  State *st;
  lua_Integer value;          /* a new key's value (1 for mutexes) */
  lua_Integer max_pending;    /* queued acquirers allowed per key; 0: any */
  lua_Integer nkeys;          /* keys with a lock in the map */
  int is_mutex;
};

/*
** Per lua_State scheduler, a userdata anchored in the registry and shared
** by every copy of the module loaded into that state.
*/
struct State {
  Bucket ready;                      /* outcomes decided, not yet resumed */
  Queue timers;                      /* timed waiters, earliest first */
  size_t pending;                    /* waiters queued or ready */
  lua_Number timer_due;              /* when the luv timer fires, if on */
  int idle_on, timer_on, draining;
  int closed;                        /* lua_close has collected the state */
  int check_idle, check_timer;       /* is the handle still open? (am_sync) */
  /* registry references to luv objects and our callbacks */
  int idle, timer, idle_start, idle_stop, timer_start, timer_stop, now;
  int new_idle, new_timer, is_closing;
  int on_idle, on_timer, handler;
  int anchors;                       /* keeps the anchor threads alive */
  int keyedlocks;                    /* weak: address -> keyed lock in a set */
  lua_State **athreads;              /* anchor threads (sched.c) */
  int nathreads;
  int nanchors, free_anchor;         /* their slots; first free one, or 0 */
};

/* queue.c */
void am_list_init (Bucket *list);
void am_list_append (Bucket *list, Waiter *w, int timer);
void am_list_unlink (Waiter *w, int timer);
#define am_list_first(list)  \
  (((uintptr_t)(list)->ends.next & 1) ? NULL : (Waiter *)(list)->ends.next)
void am_queue_init (Queue *q, int timer);
void am_queue_free (Queue *q);
int am_key_above (const Key *a, const Key *b);
Key am_key_number (lua_Number n);
int am_queue_push (Queue *q, Waiter *w, const Key *key);
void am_queue_remove (Queue *q, Waiter *w);
#define am_queue_first(q)  ((q)->n ? (Waiter *)(q)->heap[0]->ends.next : NULL)
#define am_queue_firstkey(q)  (&(q)->heap[0]->key)

/* sched.c */
State *am_state_open (lua_State *L);
void am_ready (lua_State *L, State *st, Waiter *w, int outcome);
lua_Number am_timer_now (lua_State *L, State *st);
void am_timer_add (lua_State *L, State *st, Waiter *w, lua_Number now,
                   lua_Number ms);
void am_sync (lua_State *L, State *st);
void am_timer_remove (lua_State *L, State *st, Waiter *w);
void am_anchor (lua_State *L, Waiter *w);
void am_unanchor (lua_State *L, Waiter *w);

/* lock.c */
int am_can_lock_now (Lock *lk, lua_Integer weight, const Key *priority);
void am_enqueue (lua_State *L, Lock *lk, Waiter *w, const Key *priority);
void am_dequeue (lua_State *L, Lock *lk, Waiter *w);
void am_dispatch (lua_State *L, Lock *lk);
void am_release (lua_State *L, Lock *lk, lua_Integer weight);
lua_Integer am_take (Lock *lk, lua_Integer weight);
void am_cancel (lua_State *L, Lock *lk);
void am_expire (lua_State *L, Waiter *w);
void am_abandon (lua_State *L, Waiter *w);
void am_settle (lua_State *L, Lock *lk);
void am_lock_free (Lock *lk);

/* request.c */
int am_argerror (lua_State *L, int idx, int base, const char *fname,
                 const char *msg);
lua_Integer am_optweight (lua_State *L, int idx, int base,
                          const char *fname);
void am_parse_request (lua_State *L, Request *rq, int is_mutex, int first,
                       int base, const char *fname);
void am_check_yieldable (lua_State *L, const Request *rq, int is_mutex);
int am_request (lua_State *L, const Request *rq);
int am_lock_request (lua_State *L, Lock *lk, int kind, int first, int base,
                     const char *fname, int mode, lua_Number ms, int erridx);
extern const luaL_Reg am_releaser_metamethods[];
extern const luaL_Reg am_waiter_metamethods[];

/* keyed.c */
extern const luaL_Reg am_keyed_mutex_methods[];
extern const luaL_Reg am_keyed_semaphore_methods[];
extern const luaL_Reg am_keyed_metamethods[];
extern const luaL_Reg am_keyed_mutex_class[];
extern const luaL_Reg am_keyed_semaphore_class[];
Keyed *am_tokeyed (lua_State *L, int idx);
Lock *am_keyed_current (lua_State *L, Lock *lk, int lockidx);
int am_keyed_request (lua_State *L, int kind, int first, int base,
                      const char *fname, int mode, lua_Number ms,
                      int erridx);

/* locks.c */
void am_init_lock (Lock *lk, State *st, lua_Integer value, int is_mutex);
extern const luaL_Reg am_mutex_methods[];
extern const luaL_Reg am_semaphore_methods[];
extern const luaL_Reg am_lock_metamethods[];
extern const luaL_Reg am_mutex_class[];
extern const luaL_Reg am_semaphore_class[];
void *am_checkself (lua_State *L, int uv, const char *tname);
lua_Integer am_checkcount (lua_State *L, int idx);
Lock *am_tolock (lua_State *L, int idx);

#endif
