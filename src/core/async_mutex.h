/*
** async_mutex.h: private header of the async_mutex core
** docs/internals.md walks through one request across these files.
**
** File map, by folder of src/core/, a layer each, bottom to top: each
** folder uses the ones beneath it (docs/internals.md, "The layers";
** bench/tools/layers.lua lists the uses that still go up).  The
** prototypes below are grouped by the file that defines them.
**   queue/      queue.c            FIFO lists and priority queues of
**                                  waiters, a signal's list (no Lua call)
**   args/       args.c             the user's arguments: self, weights,
**                                  priorities, keys; argument errors
**                                  numbered as the user wrote them; the
**                                  metatables' names
**   scheduler/  scheduler.c        the ready list, the timers, the anchors
**                                  of waiting coroutines, and the luv
**                                  handles that resume them; the chores of
**                                  the next loop turn (reports of failed
**                                  tasks, deferred cancels)
**   engine/     grant.c            the grant rule, dispatch, giving a
**                                  grant back, and the Waiter's state
**                                  changes the rules make
**               waiter.c           the life of a request: its Waiter's
**                                  other state changes, the continuation,
**                                  and the Releaser a grant hands out
**               rules.c            the queue rules off the hot path:
**                                  waitForUnlock's buckets, cancel,
**                                  expiry, abort; a lock's init and free
**               lease.c            leased holds: their releasers, their
**                                  expiry
**               steal.c            lock:steal(): every hold of a lock ends
**                                  (lost), the stealer's is granted at once
**               signal.c           abort signals (am.signal): a signal's
**                                  waiters, aborted together
**               run.c              runExclusive's body, between the grant
**                                  and its release
**   kinds/      lock.c             the methods every kind shares, from its
**                                  LockKind (the kind table below)
**               mutex_semaphore.c  the Mutex and Semaphore lock kinds and
**                                  methods
**               rwlock.c           the RWLock kind: shared reads, exclusive
**                                  writes; a write releaser's downgrade
**               reentrant.c        the ReentrantMutex kind: its holder
**                                  re-enters
**               keyed.c            KeyedMutex, KeyedSemaphore and
**                                  KeyedRWLock: a lock per key
**               decorated.c        withTimeout, tryAcquire, withLease,
**                                  withSignal: decorated locks, whose
**                                  requests have a limit; every other
**                                  method is the lock's own
**   tasks/      task.c             tasks (am.spawn) and groups (am.group):
**                                  the body that records how a task ends,
**                                  join, cancel; the waiting coroutines
**                                  listed (am.stranded)
**   debug/      debug.c            debug mode's hooks into the Lua module
**                                  async_mutex.debug; its owner records
**                                  (debug_records.c, debug_hash.c,
**                                  debug.h), the request hook
**                                  (debug_deadlock.c), what the debug
**                                  module may read (debug_read.c)
**   bindings/   core.c             luaopen_async_mutex_core: the
**                                  metatables, by name, from the kind
**                                  table; the StateHooks;
**                                  setErrorHandler, pending, kind
**               query.c            am.query and km:query: a snapshot of
**                                  the holds and requests of a lock
** Beneath them all: this header, and src/error_text.c (an error object's
** text, error_text.h; also in the Redis client's module).
*/

#ifndef ASYNC_MUTEX_H
#define ASYNC_MUTEX_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "lua.h"
#include "lauxlib.h"

/* Metatable names, as they appear in argument errors (a lock kind's are
   built from the kind table below: "async_mutex." and its class). */
#define AM_RELEASER   "async_mutex.Releaser"
#define AM_WAITER     "async_mutex.Waiter"
#define AM_STATE      "async_mutex.State"       /* its metatable */
#define AM_STATE_KEY  "async_mutex.scheduler"   /* registry key of the state */
#define AM_TASK       "async_mutex.Task"
#define AM_SIGNAL     "async_mutex.Signal"
#define AM_GROUP      "async_mutex.Group"

/* async-mutex's exact messages; they are also the error values. */
#define AM_E_TIMEOUT  "timeout while waiting for mutex to become available"
#define AM_E_ALREADY_LOCKED  "mutex already locked"
#define AM_E_CANCELED "request for lock canceled"
#define AM_E_MAX_PENDING  "too many pending requests for this key"
#define AM_E_LOST     "lock lost: lease expired"
/* raised by debug mode at a request that would wait for ever
   (debug_deadlock.c) */
#define AM_E_DEADLOCK "deadlock: the request would wait for ever"


/*
** The kind table: one line per lock kind, from which the module's types,
** their metatables' names, their classes (module.<Class>) and the
** decorated types are all built (core.c, args.c, decorated.c).  A kind is
** one file of kinds/ plus its line here (docs/internals.md, "How to add a
** lock kind").  Columns: TYPE (AM_T_<TYPE>), Class, its LockKind, its
** metamethods, its methods and its class functions (merged over the
** shared ones of lock.c, which any column may name), and the methods of
** its decorated type.  AM_KEYED_KINDS: the keyed sets of the kinds that
** have them (keyed.c), the same columns; their LockKind is the one of
** their locks.  AM_EXTRA_KINDS: more lines from the compiler's command
** line (-D), for a kind built outside this tree (spec 287's toy kind).
*/
#define AM_LOCK_KINDS(X) \
  X(MUTEX, Mutex, am_mutex_kind, am_lock_metamethods, \
    am_mutex_methods, am_mutex_class, am_decorated_methods) \
  X(SEMAPHORE, Semaphore, am_semaphore_kind, am_lock_metamethods, \
    am_semaphore_methods, am_semaphore_class, am_decorated_methods) \
  X(RWLOCK, RWLock, am_rwlock_kind, am_rwlock_metamethods, \
    am_rwlock_methods, am_rwlock_class, am_decorated_rwlock_methods) \
  X(REENTRANT_MUTEX, ReentrantMutex, am_reentrant_kind, \
    am_reentrant_metamethods, am_reentrant_methods, am_reentrant_class, \
    am_decorated_reentrant_methods) \
  AM_EXTRA_KINDS(X)
#define AM_KEYED_KINDS(X) \
  X(KEYED_MUTEX, KeyedMutex, am_mutex_kind, am_keyed_metamethods, \
    am_keyed_mutex_methods, am_keyed_mutex_class, am_decorated_methods) \
  X(KEYED_SEMAPHORE, KeyedSemaphore, am_semaphore_kind, \
    am_keyed_metamethods, am_keyed_semaphore_methods, \
    am_keyed_semaphore_class, am_decorated_methods) \
  X(KEYED_RWLOCK, KeyedRWLock, am_rwlock_kind, am_keyed_metamethods, \
    am_keyed_rwlock_methods, am_keyed_rwlock_class, \
    am_decorated_keyed_rwlock_methods)
#ifndef AM_EXTRA_KINDS
#define AM_EXTRA_KINDS(X)
#endif

/* What a line declares: its kind and its tables, defined in its file. */
#define AM_DECLARE_KIND(T, C, kind, mm, m, cl, dm) \
  extern const LockKind kind; \
  extern const luaL_Reg mm[], m[], cl[], dm[];

/*
** The module's metatables.  Every C function of the module has the same
** upvalues: the scheduler state, then one metatable per type in this
** order, so the hot paths check and set metatables without a registry
** lookup by name.  core.c registers them from one table indexed by these.
** The lock types (the kinds, then the keyed sets) come first, then their
** decorated types in the same order: type t's decorated type is
** t + AM_NLOCKTYPES.
*/
#define AM_TYPE_OF(T, ...)       AM_T_##T,
#define AM_DECORATED_OF(T, ...)  AM_T_DECORATED_##T,
typedef enum AmType {
  AM_LOCK_KINDS(AM_TYPE_OF)
  AM_NKINDS,                  /* not a type: how many kinds there are */
  AM_KEYED_BEFORE = AM_NKINDS - 1,
  AM_KEYED_KINDS(AM_TYPE_OF)
  AM_NLOCKTYPES,              /* not a type: how many lock types */
  AM_DECORATED_BEFORE = AM_NLOCKTYPES - 1,
  AM_LOCK_KINDS(AM_DECORATED_OF)
  AM_KEYED_KINDS(AM_DECORATED_OF)
  AM_T_RELEASER, AM_T_WAITER, AM_T_TASK, AM_T_GROUP, AM_T_SIGNAL,
  AM_NTYPES                   /* not a type: how many there are */
} AmType;
#define AM_FIRST_KEYED  ((AmType)AM_NKINDS)
#define am_decorated_type(t)  ((AmType)((t) + AM_NLOCKTYPES))

#define AM_STATE_UPVALUE    lua_upvalueindex(1)
#define am_mtindex(t)       lua_upvalueindex(2 + (t))
#define AM_NUPVALUES        (1 + AM_NTYPES)
#define am_pushmt(L,t)      lua_pushvalue(L, am_mtindex(t))
#define am_getstate(L)      ((State *)lua_touserdata(L, AM_STATE_UPVALUE))
/* A lock type's methods (core.c) have one upvalue more: its LockKind
   (a keyed set's: of its locks), a light userdata. */
#define AM_KIND_UPVALUE     lua_upvalueindex(AM_NUPVALUES + 1)

typedef struct Waiter Waiter;
typedef struct Lock Lock;
typedef struct LockKind LockKind;
typedef struct State State;
typedef struct Keyed Keyed;
typedef struct DebugRecords DebugRecords;
typedef struct Signal Signal;

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

/* What a waiter waits for; W_LEASE: a leased hold's releaser, in the
   timer queue until its lease ends (lease.c). */
enum { W_ACQUIRE, W_UNLOCK, W_LEASE };

/*
** Life of a waiter (waiter.c and grant.c make every change, and assert
** the state they leave): NEW until linked in its lock's queue (and maybe the timer
** queue): QUEUED; READY in the scheduler's ready list once its outcome is
** decided; RESUMING while the scheduler resumes it; DONE once its
** coroutine has read the outcome (or was closed).  A granted acquire
** hands a releaser out (its own waiter, or a new one): HELD until
** released, then RELEASED.
*/
enum { S_NEW, S_QUEUED, S_READY, S_RESUMING, S_DONE, S_HELD, S_RELEASED,
       S_LOST };                /* a leased hold that ran out (lease.c) */

enum { O_GRANTED, O_TIMEOUT, O_CANCELED,
       O_ABORTED };             /* its signal was aborted (signal.c) */

/* How long a request may wait; AM_STEAL: never, and it ends every hold
   in place (steal.c). */
enum { AM_WAIT, AM_TIMEOUT, AM_TRY, AM_STEAL };

/* The token of an unscoped release (m:release()): it ends any grant. */
#define AM_UNSCOPED  0

/* Bits of a stack index a waiter keeps (Releaser): the indices of a
   waiting request's lock and errors are small (at most 8 or so). */
#define AM_IDX_BITS  6
#define AM_IDX_MAX   ((1 << AM_IDX_BITS) - 1)

/*
** What a grant hands out, to be given back once: 'weight' of 'lock', and
** the grant's token (what LockKind.take returned: a mutex's generation,
** a semaphore's value at the grant).  User value 1 keeps the lock alive.
**
** LAYOUT: a Releaser is also the first member of every Waiter, and the
** size of a Waiter is most of what a waiting coroutine costs (docs/bench.md,
** memory): so the Waiter's own small fields live here, in one word
** of bits beside 'ref', where the Releaser would otherwise have padding
** (32 bytes in all; a plain Releaser leaves them 0).  Only waiter.c,
** grant.c, lease.c, rules.c, scheduler.c and debug.c read them.
*/
typedef struct Releaser {
  Lock *lock;
  lua_Integer weight;
  lua_Integer token;          /* set when granted */
  unsigned int state : 3;     /* S_* */
  unsigned int lease : 1;     /* a leased hold's: a Waiter of kind W_LEASE,
                                 user value 2 its lost error (lease.c) */
  /* a Waiter's: */
  unsigned int kind : 2;      /* W_ACQUIRE, W_UNLOCK or W_LEASE */
  unsigned int outcome : 2;   /* O_*; O_CANCELED with 'stolen' set: a
                                 grant a steal ended before it was
                                 delivered (steal.c) */
  unsigned int timed : 1;     /* allocated with 't' (withTimeout) */
  unsigned int leased : 1;    /* its grant is leased: allocated with
                                 'lease' */
  unsigned int lease_from_request : 1;
  unsigned int signalled : 1; /* made with a signal (withSignal): allocated
                                 whole, in its signal's list while QUEUED */
  unsigned int stolen : 1;    /* see 'outcome' */
  unsigned int lockidx : AM_IDX_BITS;  /* stack index of the lock in the
                                          waiting frame */
  unsigned int erridx : AM_IDX_BITS;   /* of the timeout error, or 0 */
  unsigned int lostidx : AM_IDX_BITS;  /* of the lost error, or 0; the
                                          waiter itself is just above */
  int ref;                    /* a Waiter's anchor of its coroutine
                                 (scheduler.c); a lease's registry ref */
} Releaser;

/*
** One suspended request.  It is a userdata living on the waiting
** coroutine's own stack, marked to-be-closed, so 'coroutine.close' of a
** waiting coroutine removes it from every queue at once; the coroutine is
** anchored (scheduler.c, 'r.ref') while the module may resume it.
**
** Its size is most of what a waiter costs, so it is allocated only as far
** as it is used: an untimed waiter stops before 'lease' (48 bytes), a
** leased one before 't', a timed one (withTimeout, sleep, a lease's
** releaser) has it all.  An untimed acquire's waiter carries its lock
** (user value 1) and becomes the releaser of its grant (its prefix 'r'):
** one object per hand-off.
*/
struct Waiter {
  Releaser r;                 /* first: a handed-out waiter is a Releaser */
  Links q;                    /* QUEUED: in its lock's queue;
                                 READY: in the scheduler's ready list */
  lua_Number lease;           /* leased or timed only: the lease (ms), or
                                 its end (loop time) when counted from the
                                 request */
  Links t;                    /* timed only: in the timer queue, or
                                 t.next NULL */
  lua_Number deadline;        /* timed only: loop time (ms) */
  /* signalled only (signal.c): its place in its signal's list while
     QUEUED ('sig' NULL once out of it), and the stack index of the signal
     in the waiting frame (its reason is the error an abort raises) */
  Waiter *sprev, *snext;
  Signal *sig;
  int sigidx;
};

#define AM_UNTIMED_SIZE    offsetof(Waiter, lease)
#define AM_LEASED_SIZE     offsetof(Waiter, t)
#define AM_TIMED_SIZE      offsetof(Waiter, sprev)

/*
** A request being made (designated initializers at the call sites):
** what, how long, where the user's arguments are.  args.c fills in the
** weight and priority, the caller the lock.
*/
typedef struct Request {
  int kind;                   /* W_ACQUIRE or W_UNLOCK */
  int wait;                   /* AM_WAIT, AM_TIMEOUT or AM_TRY */
  lua_Number ms;              /* AM_TIMEOUT: how long */
  int erridx;                 /* raised on timeout or refusal; 0: none */
  int first;                  /* stack index of the user's first argument */
  int base;                   /* ... which errors number 1: 'first - base' */
  const char *fname;          /* the function errors name */
  lua_Number lease;           /* withLease: the lease (ms), or 0 */
  int lease_from_request;
  int lostidx;                /* the lost error of a lease */
  lua_Integer mode;           /* unweighted kinds: the weight the method
                                 asks for (rwlock.c), or 0: 1 */
  Lock *lock;                 /* the lock, at stack index 'lockidx' */
  int lockidx;
  lua_Integer weight;
  Key priority;
  int sigidx;                 /* stack index of its signal (withSignal), or
                                 0: none */
  int fnidx;                  /* runExclusive's: the stack index of its
                                 body, just above the indices above (run.c);
                                 0: none */
} Request;

/*
** An abort signal (am.signal(), signal.c): the waiters of the requests made
** with it and still QUEUED, in the order they were queued.  User value 1:
** its reason, once aborted.
*/
struct Signal {
  Waiter *first, *last;
  int aborted;
};

/* waitForUnlock waiters that asked for one weight. */
typedef struct WeightWaiters {
  lua_Integer weight;
  Queue queue;
} WeightWaiters;

/*
** What makes a lock kind: the engine's rules (grant.c) ask it what a
** grant takes and what a release gives back; everything else (queues, priorities,
** waitForUnlock, timeouts, the scheduler, keyed sets) is shared.
** docs/internals.md, "How to add a lock kind".
*/
struct LockKind {
  const char *name;           /* "Mutex": kind(), tostring */
  const char *noun;           /* "a mutex": misuse errors */
  AmType type;                /* its metatable */
  AmType keyed_type;          /* the metatable of its keyed sets */
  int weighted;               /* requests take a weight argument */
  int returns_value;          /* acquire returns the token before the
                                 releaser */
  /* can a request of 'weight' be granted, queue aside?  NULL: a counted
     kind's rule, the value covers the weight (am_fits, below) */
  int (*fits) (const Lock *lk, lua_Integer weight);
  /* takes a grant of 'weight'; returns its token.  NULL: a counted
     kind's, the weight taken from the value; the token is the value
     before (returns_value) or a new generation (grant.c: am_take) */
  lua_Integer (*take) (Lock *lk, lua_Integer weight);
  /* gives back the grant 'token' (or AM_UNSCOPED) of 'weight': 1 when
     given, 0 when there was nothing to give back, -1 when it would
     overflow (never with 'saturate') */
  int (*give_back) (Lock *lk, lua_Integer weight, lua_Integer token,
                    int saturate);
  /* is the lock held, as isLocked() answers */
  int (*is_locked) (const Lock *lk);
  /* a steal (steal.c): sets the value as if every hold in place were
     given back ('held' is still their weight) */
  void (*end_holds) (Lock *lk);
  /* reentrant kinds (reentrant.c): the coroutine holding the lock
     ('Lock.owner') is granted again at once, past the queue */
  int reentrant;
  /* The engine's questions to a kind whose grant depends on who asks or
     whose holds differ by weight; NULL: the answer of a kind that does
     not (a Mutex's).  The engine never names a kind. */
  /* is the running coroutine's request of 'kind' (W_ACQUIRE, W_UNLOCK)
     its holder's own, granted at once (waiter.c)?  It raises what its
     holder may not ask; NULL: never */
  int (*reenters) (lua_State *L, Lock *lk, int kind);
  /* a grant of 'lk' (at 'lockidx') reached the running coroutine, now its
     holder (waiter.c, steal.c); NULL: nothing to record */
  void (*owned) (lua_State *L, Lock *lk, int lockidx);
  /* is a hold of 'weight', whose token is the lock's generation, still in
     place (rules.c: am_releaser_live)?  NULL: is_locked */
  int (*live) (const Lock *lk, lua_Integer weight);
  /* is a hold of 'weight' one of several at once, which a steal ends by
     moving the generation on (steal.c)?  NULL: never */
  int (*shared) (lua_Integer weight);
  /* is the lock held by one hold whose token is its generation (steal.c)?
     NULL: is_locked */
  int (*exclusive) (const Lock *lk);
  /* methods the kind adds to every releaser (core.c), or NULL */
  const luaL_Reg *releaser_methods;
};

/*
** A lock of any kind.  User value 1 holds the cancel error.
*/
struct Lock {
  const LockKind *kind;
  State *st;
  lua_Integer value;
  lua_Integer held;           /* weight granted and not given back yet */
  lua_Integer gen;            /* the token of the hold in place: a
                                 Mutex's, a ReentrantMutex's and an
                                 RWLock's write grants count it up, and
                                 so does a steal (of any kind), whose
                                 token it is for a Semaphore's holds and
                                 an RWLock's reads (steal.c); from 1, so
                                 that no token is AM_UNSCOPED */
  Queue queue;                /* acquirers, head = next to be granted */
  WeightWaiters *unlock;      /* sorted by weight, ascending */
  size_t nweights, capweights;
  size_t nunlock;             /* waitForUnlock waiters in all queues */
  int freed;                  /* its __gc ran (only lua_close does that
                                 to a lock in use): no more waiting */
  int dbg;                    /* debug mode: its newest owner record (a
                                 slot of debug_records.c's), or -1; in the
                                 padding after 'freed' */
  Keyed *keyed;               /* the keyed set serving this lock, or NULL */
  int selfref;                /* keyed: 0 while in its set (and in the
                                 state's 'keyedlocks'), else LUA_NOREF */
  int internal;               /* the library's own lock (core.dbg_internal:
                                 a Redis lock's gate or bell): debug mode
                                 neither records nor searches it; in the
                                 padding after 'selfref' */
  const lua_State *owner;     /* reentrant kinds: the holding coroutine
                                 (anchored: user value 2), or NULL */
};

/*
** A set of locks by key (keyed.c), each created on demand and dropped as
** soon as it is idle.  User values: 1 the map key -> lock, 2 the cancel
** error, 3 the error for a request beyond 'max_pending'.
*/
struct Keyed {
  const LockKind *kind;       /* of its locks */
  State *st;
  /* what the engine asks the set of a key's lock (keyed.c), through
     am_settle and am_keyed_current below, without naming keyed.c:
     let the lock leave the set if it is idle; the lock serving its key
     now (at 'lockidx' on return) */
  void (*settle) (lua_State *L, Lock *lk);
  Lock *(*recheck) (lua_State *L, Lock *lk, int lockidx);
  Lock fresh;                 /* what a key without a lock behaves as: a
                                 new lock, never queued on nor granted */
  lua_Integer max_pending;    /* queued acquirers allowed per key; 0: any */
  lua_Integer nkeys;          /* keys with a lock in the map */
};

/*
** The calls a layer makes into a layer above it, which it does not name
** (docs/internals.md, "The layers"): the scheduler resumes, abandons and
** expires waiters through the engine's functions and does its chores
** through the tasks', and the engine tells the tasks a coroutine is about
** to wait.  One table, given once when the state opens (core.c).
*/
typedef struct StateHooks {
  /* a QUEUED or READY waiter whose coroutine cannot be resumed; returns
     whether the queues changed (waiter.c) */
  int (*abandon) (lua_State *L, Waiter *w);
  /* a timer entry whose deadline passed, out of the timer queue
     (lease.c: am_timer_expired) */
  void (*expire) (lua_State *L, Waiter *w);
  /* one chore, the object at 'idx' (task.c) */
  void (*chore) (lua_State *L, State *st, int idx);
  /* the running coroutine is about to wait while some task cancelled as
     it ran is still to be closed (task.c) */
  void (*task_waits) (lua_State *L, State *st);
} StateHooks;

/*
** Per lua_State scheduler, a userdata anchored in the registry and shared
** by every copy of the module loaded into that state.
*/
struct State {
  Bucket ready;                      /* outcomes decided, not yet resumed */
  Queue timers;                      /* timed waiters, earliest first */
  size_t pending;                    /* waiters queued or ready */
  const StateHooks *hooks;           /* the layers above (am_state_open) */
  lua_Number timer_due;              /* when the luv timer fires, if on */
  int idle_on, timer_on, draining;
  int syncing;                       /* am_sync is running (scheduler.c) */
  int closed;                        /* lua_close has collected the state */
  int check_idle, check_timer;       /* is the handle still open? (am_sync) */
  /* registry references to luv objects and our callbacks */
  int idle, timer, idle_start, idle_stop, timer_start, timer_stop, now;
  int new_idle, new_timer, is_closing;
  int on_idle, on_timer, handler;
  int layer_sources, layer_wrappers;  /* the Lua layer (args.c: am_layer) */
  int anchors;                       /* keeps the anchor threads alive */
  int keyedlocks;                    /* weak: address -> keyed lock in a set */
  int stolen;                        /* weak keys: lock -> its exclusive
                                        holds' tokens a steal ended and no
                                        releaser has asked about yet
                                        (steal.c), or LUA_NOREF */
  int dbg;                           /* debug mode's hooks (debug.c), or
                                        LUA_NOREF: off */
  int dbg_flags;                     /* its flags, read once (debug.c) */
  DebugRecords *dbg_recs;            /* its owner records
                                        (debug_records.c), or NULL */
  lua_State **athreads;              /* anchor threads (scheduler.c) */
  int nathreads;
  int nanchors, free_anchor;         /* their slots; first free one, or 0 */
  int *anchor_next;                  /* by slot: the next free one, or 0 */
  int hrtime, stop, loop_mode;       /* more of luv's functions */
  int hrtime_luv;                    /* uv.hrtime, when core.clock moved
                                        'hrtime' elsewhere */
  /* tasks (task.c) */
  int task_body, gate_wait;          /* closures: a task's body, a join */
  int gates;                         /* weak: task or group -> its gate */
  int chores;                        /* what the end of a loop turn does
                                        (am_chore), at chore_head ..
                                        chore_tail - 1 */
  int chore_head, chore_tail;
  int ncanceling;                    /* tasks cancelled as they ran, to
                                        be handed to the chores at their
                                        next wait (task.c) */
  int collect;                       /* am.run's list of reported
                                        failures (core.collect), or
                                        LUA_NOREF */
  int collect_keep;                  /* append to it (else only mark that
                                        am.run runs) */
  int reporting;                     /* reports being made (task.c) */
  int closing;                       /* state__gc: reports to stderr */
};

/* Each kind's LockKind and tables (the kind table above). */
AM_LOCK_KINDS(AM_DECLARE_KIND)
AM_KEYED_KINDS(AM_DECLARE_KIND)

/* args.c */
extern const char *const am_tnames[AM_NTYPES];
Lock *am_tolock (lua_State *L, int idx);
Keyed *am_tokeyed (lua_State *L, int idx);
void am_check_yieldable (lua_State *L, const char *act);
int am_cannot_yield (lua_State *L);
void *am_testself (lua_State *L, int idx, AmType t);
/*
** Whether the table on top is type 't''s metatable, compared by address
** (lua_topointer: two cheap reads where lua_rawequal costs a third of a
** check of every request and release); a table's address is its identity
** while it lives, and the upvalue keeps this one alive.
*/
#define am_is_mt(L,t)  \
  (lua_topointer(L, -1) == lua_topointer(L, am_mtindex(t)))

/* am_testself, inline for the checks of every request and release. */
static inline void *am_isself (lua_State *L, int idx, AmType t) {
  void *p = lua_touserdata(L, idx);
  if (p != NULL && lua_getmetatable(L, idx)) {
    int same = am_is_mt(L, t);
    lua_pop(L, 1);
    if (same) return p;
  }
  return NULL;
}
int am_undecorate (lua_State *L, AmType t);
void *am_checkself (lua_State *L, AmType t);
int am_argerror (lua_State *L, int idx, int base, const char *fname,
                 const char *msg);
int am_usage_error (lua_State *L, const char *fmt, ...);
int am_layer (lua_State *L);
int am_in_layer (lua_State *L, State *st, const char *source);
int am_typeerror (lua_State *L, int idx, int base, const char *fname,
                  const char *expected);
int am_core_argerror (lua_State *L);
int am_core_typeerror (lua_State *L);
int am_core_usage_error (lua_State *L);
lua_Integer am_optweight (lua_State *L, int idx, int base,
                          const char *fname);
lua_Integer am_checkcount (lua_State *L, int idx);
void am_checkkey (lua_State *L, int idx, int base, const char *fname);
void am_checkoptions (lua_State *L, int idx, int base, const char *fname,
                      const char *const known[]);
int am_unknown_option (lua_State *L);
void am_parse_request (lua_State *L, Request *rq, const LockKind *kind);
Lock *am_parse_lock_request (lua_State *L, Request *rq, AmType t);

/* waiter.c */
int am_request (lua_State *L, Request *rq);
int am_lock_request (lua_State *L, Lock *lk, Request *rq);
int am_waiter_abandon (lua_State *L, Waiter *w);
extern const luaL_Reg am_releaser_metamethods[];
extern const luaL_Reg am_waiter_metamethods[];
extern const luaL_Reg am_releaser_methods[];

/* grant.c */
void am_waiter_ready (lua_State *L, Waiter *w, int outcome,
                      lua_Integer token);
void am_waiter_detach (Waiter *w);
void am_hold_ended (Releaser *r, int lost);
void am_push_releaser (lua_State *L, int lockidx, Lock *lk,
                       lua_Integer weight, lua_Integer token);
/* am_fits, am_can_lock_now: inline, at the end of this header */
lua_Integer am_take (Lock *lk, lua_Integer weight);
void am_dispatch (lua_State *L, Lock *lk);
int am_give_back (lua_State *L, Lock *lk, lua_Integer weight,
                  lua_Integer token, int saturate);

/* rules.c */
void am_drain_unlock (lua_State *L, Lock *lk);
int am_unlock_push (Lock *lk, Waiter *w, const Key *priority);
void am_dequeue (Lock *lk, Waiter *w);
int am_releaser_live (const Releaser *r);
void am_cancel (lua_State *L, Lock *lk);
void am_expire (lua_State *L, Waiter *w);
void am_abort (lua_State *L, Signal *s);
void am_lock_init (Lock *lk, const LockKind *kind, State *st,
                   lua_Integer value);
void am_lock_free (Lock *lk);

/* rwlock.c */
/* An RWLock request's weight: what 'held' counts, and the mode. */
#define AM_RW_READ   1
#define AM_RW_WRITE  2
#define AM_RW_WRITTEN  (-1)     /* an RWLock's value while a writer holds it */

/* reentrant.c */

/* lease.c */
int am_push_lease (lua_State *L, int lockidx, int lostidx, Lock *lk,
                   lua_Integer weight, lua_Integer token, lua_Number now,
                   lua_Number end);
void am_lease_end (lua_State *L, Releaser *r);
void am_timer_expired (lua_State *L, Waiter *w);
int am_releaser_check (lua_State *L);
int am_hold_check (lua_State *L, int idx);
int am_release_hold (lua_State *L, int idx);

/* steal.c */
int am_steal (lua_State *L, Request *rq);
int am_lock_steal (lua_State *L, Lock *lk, Request *rq);
int am_hold_stolen (lua_State *L, const Releaser *r, int idx, int forget);

/* lock.c: the methods every kind shares (core.c merges them in) */
extern const luaL_Reg am_lock_methods[];
extern const luaL_Reg am_lock_metamethods[];
extern const luaL_Reg am_lock_class[];

/* keyed.c */
/* The lock serving the key of 'lk' (at 'lockidx') now (Keyed.recheck). */
#define am_keyed_current(L,lk,lockidx)  \
  ((lk)->keyed != NULL ? (lk)->keyed->recheck(L, lk, lockidx) : (lk))
int am_keyed_request (lua_State *L, Request *rq);
/* After anything that may leave a keyed set's lock idle (Keyed.settle). */
#define am_settle(L,lk)  \
  ((lk)->keyed != NULL ? (lk)->keyed->settle(L, lk) : (void)0)

/* decorated.c */
int am_run_request (lua_State *L, AmType t);
int am_core_acquire (lua_State *L);
int am_core_acquire_read (lua_State *L);
int am_core_acquire_write (lua_State *L);
int am_core_limit (lua_State *L);
int am_withTimeout (lua_State *L);
int am_tryAcquire (lua_State *L);
int am_withLease (lua_State *L);
int am_withSignal (lua_State *L);
int am_decorated_request (lua_State *L, int kind, const char *fname,
                          lua_Integer mode);
void am_steal_decorated (lua_State *L, AmType t);

/* run.c */
int am_run_body (lua_State *L, int fnidx, int n);

/* scheduler.c */
State *am_state_open (lua_State *L, const StateHooks *hooks);
void am_schedule (State *st, Waiter *w);
void am_sync_slow (lua_State *L, State *st);
/* am_sync: inline, at the end of this header */
lua_Number am_timer_now (lua_State *L, State *st, lua_Number ms);
int am_core_clock (lua_State *L);
void am_timer_add (lua_State *L, State *st, Waiter *w, lua_Number now,
                   lua_Number ms);
void am_timer_remove (lua_State *L, State *st, Waiter *w);
void am_anchor (lua_State *L, Waiter *w);
void am_unanchor (lua_State *L, Waiter *w);
void am_push_anchored (lua_State *L, const Waiter *w);
void am_push_anchored_threads (lua_State *L, State *st);
void am_report (lua_State *L, State *st, lua_State *co);
void am_report_error (lua_State *L, State *st, const char *what, int who);
void am_chore (lua_State *L, State *st, int idx);
void am_stop_loop (lua_State *L, State *st);

/* task.c */
extern const luaL_Reg am_task_methods[];
extern const luaL_Reg am_task_metamethods[];
extern const luaL_Reg am_group_methods[];
extern const luaL_Reg am_group_metamethods[];
int am_task_body (lua_State *L);
int am_gate_wait (lua_State *L);
int am_spawn (lua_State *L);
int am_run_main (lua_State *L);
int am_group (lua_State *L);
int am_outcome (lua_State *L);
int am_failure (lua_State *L);
int am_waiting (lua_State *L);
Waiter *am_waiter_of (lua_State *L, lua_State *co);
int am_collect (lua_State *L);
void am_do_chore (lua_State *L, State *st, int idx);
void am_task_waits (lua_State *L, State *st);

/*
** Debug mode (docs/debug.md) is an observer: the engine and the kinds
** report what happens to it through this table of the debug/ layer's
** functions, which core.debug installs (debug_read.c) at its first call,
** before debug mode is first on; so no lower layer names a debug/ function.
** Each report site tests the global 'am_debug_on' (states with debug mode
** on) and nothing else when off.  scheduler.c defines both (the lowest
** layer that reads them; its state's __gc ends debug mode).
*/
typedef struct DebugObserver {
  void (*request) (lua_State *L, const Request *rq);  /* may raise */
  void (*granted) (lua_State *L, State *st);
  void (*released) (lua_State *L, State *st, int idx);
  void (*unscoped) (lua_State *L, State *st, Lock *lk);
  void (*returned) (lua_State *L, State *st, Lock *lk, lua_Integer weight);
  void (*stolen) (lua_State *L, State *st, Lock *lk);
  void (*created) (lua_State *L, State *st);
  void (*close) (lua_State *L, State *st);            /* its records go */
} DebugObserver;
extern const DebugObserver *am_debug_observer;  /* NULL until core.debug */
extern int am_debug_on;
#if defined(__GNUC__)
#define am_debugging()  __builtin_expect(am_debug_on != 0, 0)
#else
#define am_debugging()  (am_debug_on != 0)
#endif
extern const luaL_Reg am_debug_funcs[];
/* Rare paths kept out of the hot functions they are called from (their
   code and registers out of the way of the common case). */
#if defined(__GNUC__)
#define AM_COLD  __attribute__((cold, noinline))
#else
#define AM_COLD
#endif
/* Hot functions inlined into their one or two callers on the hot path,
   where the compiler would call them: each call made cost its callee's
   registers saved and restored (docs/bench.md, "What the API shape
   costs"). */
#if defined(__GNUC__)
#define AM_HOT_INLINE  inline __attribute__((always_inline))
#else
#define AM_HOT_INLINE  inline
#endif
/* A hot entry point with everything it calls inlined into it, so that the
   compiler specializes the shared request (waiter.c) for its constant
   arguments (kinds/mutex_semaphore.c: a Mutex's acquire) */
#if defined(__GNUC__)
#define AM_FLATTEN  __attribute__((flatten))
#else
#define AM_FLATTEN
#endif
int am_core_debug (lua_State *L);
/* A live owner record as query.c reads it (its holder aside). */
typedef struct HoldView {
  lua_Integer weight;
  lua_Number since;
} HoldView;
int am_dbg_lock_holds (lua_State *L, State *st, const Lock *lk,
                       HoldView *out, int max, int t, int first);

/* signal.c */
extern const luaL_Reg am_signal_metamethods[];
int am_signal (lua_State *L);
Signal *am_tosignal (lua_State *L, int idx);
int am_check_signal (lua_State *L, int sigidx);

/* query.c */
int am_query (lua_State *L);
int am_keyed_query (lua_State *L);

/* queue.c */
void am_list_init (Bucket *list);
void am_list_append (Bucket *list, Waiter *w, int timer);
void am_list_unlink (Waiter *w, int timer);
void am_signal_link (Signal *s, Waiter *w);
void am_signal_unlink (Waiter *w);
#define am_list_first(list)  \
  (((uintptr_t)(list)->ends.next & 1) ? NULL : (Waiter *)(list)->ends.next)
void am_queue_init (Queue *q, int timer);
void am_queue_free (Queue *q);
int am_key_above (const Key *a, const Key *b);
Key am_key_number (lua_Number n);
int am_queue_push (Queue *q, Waiter *w, const Key *key);
void am_queue_remove (Queue *q, Waiter *w);
void am_queue_ordered (const Queue *q, Bucket **out);
Waiter *am_bucket_next (const Bucket *b, const Waiter *w);
#define am_queue_first(q)  ((q)->n ? (Waiter *)(q)->heap[0]->ends.next : NULL)
#define am_queue_firstkey(q)  (&(q)->heap[0]->key)

/*
** READY -> RESUMING: out of the ready list; the scheduler resumes it.  A
** transition of waiter.c's (its diagram), written here so that the
** scheduler's loop, beneath the engine, makes it inline: through a
** StateHooks pointer it cost each hand-off 4 instructions more.
*/
static inline void am_waiter_resuming (Waiter *w) {
  assert(w->r.state == S_READY);
  am_list_unlink(w, 0);
  w->r.state = S_RESUMING;
}


/*
** The grant rule (grant.c's), inline: a request (waiter.c) applies it
** twice, where a call into grant.c cost each hand-off a hop
** (bench/tools/hops.lua).
** Can the lock's kind grant 'weight' now, queue aside?  A kind with its
** own rule says (LockKind.fits); for a counted kind (a Mutex, a
** Semaphore: no 'fits') the engine's rule: the value covers the weight.
*/
static inline int am_fits (const Lock *lk, lua_Integer weight) {
  return lk->kind->fits != NULL ? lk->kind->fits(lk, weight)
                                : weight <= lk->value;
}


/*
** Immediate-grant rule: no queued acquirer has a priority >= ours, and
** the lock's kind can grant the weight.  Also "could lock now" for
** waitForUnlock.
*/
static inline int am_can_lock_now (Lock *lk, lua_Integer weight,
                                   const Key *priority) {
  /* the kind's test first: a request that finds the lock held (every
     hand-off's) compares no priorities */
  return am_fits(lk, weight)
         && (lk->queue.n == 0
             || am_key_above(priority, am_queue_firstkey(&lk->queue)));
}

/*
** am_sync (scheduler.c: am_sync_slow, which says why every entry point
** calls it), inline for its common cases, where sync_next would decide
** SYNC_NONE: no timer is wanted nor running, and either the idle
** callback runs (it decides about the idle handle itself: 'draining') or
** nothing is ready and the idle handle is off.  Out of line, the test
** cost each release 36 instructions, a hand-off 72 (docs/bench.md).
*/
static inline void am_sync (lua_State *L, State *st) {
  if (st->timers.count == 0 && !st->timer_on
      && (st->draining
          || (!st->idle_on && am_list_first(&st->ready) == NULL
              && st->chore_head == st->chore_tail)))
    return;
  am_sync_slow(L, st);
}

#endif
