/*
** debug.h: debug mode's private header (the debug*.c files only)
** The owner records' structures and the hook table's layout, shared by
** debug.c (the hooks the core calls), debug_records.c (the records),
** debug_hash.c (their pointer hashes), debug_deadlock.c (the deadlock
** search's C side) and debug_read.c (what async_mutex.debug reads:
** core.dbg_*).  docs/debug.md; docs/internals.md.
*/

#ifndef AM_DEBUG_H
#define AM_DEBUG_H

#include "lua.h"

#include "../async_mutex.h"

/*
** The hook table (async_mutex.debug: hook_table): the Lua hooks, then
** flags.
*/
enum { H_REQUEST = 1, H_GRANTED, H_RELEASED, H_CREATED,
       F_TRACEBACK,           /* true: a traceback per grant */
       F_LUA };               /* true: call the granted and released hooks */

/* The flags of the hook table, kept in State.dbg_flags: a grant and a
   release read them without a table access. */
#define DF_TRACEBACK  1
#define DF_LUA        2


/*
** Owner records (docs/debug.md, Owner records) are C structs, the slots
** of one array.  The Lua values a record keeps are anchored in one Lua
** table, 'anchors' (registry reference 'aref'), at A_N * slot + A_*: its
** releaser (which keeps its lock, user value 1), its holder, the function
** that made the request (for its site) and, with the option, a traceback.
** Each record is in two doubly linked chains: its lock's (from Lock.dbg,
** newest first) and its holder's (from the hash 'cos': coroutine ->
** newest record); the hash 'rels' finds it from its releaser (a release
** in any order costs the same: walking the lock's chain made releasing n
** holds of one lock oldest first cost n^2/2 steps).
**
** So a grant and a release change C fields and overwrite slots of the
** array of 'anchors' that exist already: they allocate nothing Lua's
** collector sees (no garbage, no collector step, no memory error to
** protect against), only 'slots', 'cos' and 'rels' may grow (malloc).  Growing
** 'anchors' (doubling, when every slot is used) is the one allocation, and
** is protected.  Lua sees a record as a table made when it reads
** (core.dbg_records), with the fields V_* (async_mutex.debug reads them
** by number).
*/
enum { A_RELEASER = 1, A_HOLDER, A_FN, A_WHERE, A_N = 4 };

enum { V_LOCK = 1, V_REL, V_HOLDER, V_SINCE, V_FN, V_LINE, V_WEIGHT,
       V_WHERE, V_LEASED, V_LOCKID, V_CANON = 13, V_WARNED, V_NFIELDS = 14 };

#define FIRST_SLOTS  16

typedef struct Record {
  Releaser *r;                /* anchored; NULL: a free slot */
  const lua_State *holder;    /* anchored */
  lua_Number since;           /* clock_ms() at the grant */
  lua_Integer serial;         /* DebugRecords.epoch when it was made */
  int line;                   /* of the request in the user's function */
  int next_lock, prev_lock;   /* its lock's chain, -1 at an end; a free
                                 slot: 'next_lock' is the next free one */
  int next_co, prev_co;       /* its holder's chain */
  unsigned int canon : 1;     /* a key taken by acquireAll (on_granted) */
  unsigned int warned : 1;    /* reported as a long hold */
  unsigned int has_fn : 1;    /* anchors A_FN and A_WHERE set (else nil) */
  unsigned int has_where : 1;
} Record;

/* An entry of a pointer hash: a coroutine and its newest record, or a
   releaser and its record. */
typedef struct PtrEntry {
  const void *key;            /* NULL: an empty entry */
  int slot;
  int n;                      /* 'cos': how many records the holder has */
} PtrEntry;

typedef struct PtrHash {      /* open addressing, linear probing */
  PtrEntry *e;
  int cap, n;                 /* 'cap' a power of 2, at least 2 * 'n' */
} PtrHash;

struct DebugRecords {
  Record *slots;
  int cap, n, free;           /* slots, records, first free slot or -1 */
  lua_Integer epoch;          /* records made or ended so far */
  /* recorded_weight's last answer, and what it depended on */
  const Lock *rw_lock;
  lua_Integer rw_epoch, rw_held, rw_value, rw_weight;
  int aref;                   /* registry reference of 'anchors' */
  int rref;                   /* of 'returned' (weak keys): releasers whose
                                 records a Semaphore's unscoped release
                                 ended (am_dbg_returned) */
  PtrHash cos;                /* holder -> its newest record */
  PtrHash rels;               /* releaser -> its record */
  PtrHash credit;             /* Semaphore -> weight its unscoped releases
                                 gave back beyond the records they ended
                                 (am_dbg_returned), in 'slot' */
};


/* debug_hash.c */
PtrEntry *am_ph_find (const PtrHash *t, const void *key);
PtrEntry *am_ph_put (PtrHash *t, const void *key, int slot);
int am_ph_reserve (PtrHash *t);
void am_ph_remove (PtrHash *t, PtrEntry *e);

/* debug_records.c */
int am_dbg_find_record (const DebugRecords *d, const Releaser *r);
void am_dbg_end_record (lua_State *L, DebugRecords *d, int slot, int a,
                        PtrEntry *e);
void am_dbg_prune_lock (lua_State *L, DebugRecords *d, Lock *lk, int a);
int am_dbg_grow_records (lua_State *L);
DebugRecords *am_dbg_new_records (lua_State *L);
void am_dbg_link_record (DebugRecords *d, int slot);
void am_dbg_close (lua_State *L, State *st);

/* debug.c */
lua_Number am_dbg_clock_ms (void);
int am_dbg_push_hook (lua_State *L, State *st, int h);
int am_dbg_holds_any (lua_State *L, State *st);
void am_dbg_push_key (lua_State *L, const Key *k);
void am_dbg_ended (lua_State *L, State *st);
/* what the core reports (DebugObserver, installed by debug_read.c) */
void am_dbg_granted (lua_State *L, State *st);
void am_dbg_released (lua_State *L, State *st, int idx);
void am_dbg_unscoped (lua_State *L, State *st, Lock *lk);
void am_dbg_returned (lua_State *L, State *st, Lock *lk,
                      lua_Integer weight);
void am_dbg_stolen (lua_State *L, State *st, Lock *lk);
void am_dbg_created (lua_State *L, State *st);

/* debug_deadlock.c */
int am_dbg_fits_outside (DebugRecords *d, const Lock *lk, lua_Integer weight,
                         lua_Integer n, lua_Integer w, lua_Integer writes);
void am_dbg_request (lua_State *L, const Request *rq);

#endif
