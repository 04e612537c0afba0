/*
** queue.c: queues of waiters, FIFO per key
** Waiters of one key (a priority, or a timeout's duration) wait in one
** FIFO list: arrival order is their order, so adding a waiter, and
** removing any one (granted, timed out, closed), is O(1) and touches only
** its neighbours.  The buckets of distinct keys are ordered by a binary
** heap and found by a hash, both O(log k) or O(1) in the number of keys,
** which is 1 in the common case.
*/

#define LUA_LIB

#include <stdlib.h>
#include <string.h>

#include "../async_mutex.h"


/* {====================================================== lists */

#define TAG(b)      ((void *)((uintptr_t)(b) | 1))
#define ISTAG(p)    ((uintptr_t)(p) & 1)
#define UNTAG(p)    ((Bucket *)((uintptr_t)(p) & ~(uintptr_t)1))

#define LINKS(w,timer)  ((timer) ? &(w)->t : &(w)->q)

/* The links of a list node: a waiter's, or its bucket's ends. */
static Links *links_of (void *node, int timer) {
  return ISTAG(node) ? &UNTAG(node)->ends : LINKS((Waiter *)node, timer);
}


void am_list_init (Bucket *list) {
  list->ends.prev = list->ends.next = TAG(list);
}


void am_list_append (Bucket *list, Waiter *w, int timer) {
  Links *l = LINKS(w, timer);
  l->prev = list->ends.prev;
  l->next = TAG(list);
  links_of(l->prev, timer)->next = w;
  list->ends.prev = w;
}


void am_list_unlink (Waiter *w, int timer) {
  Links *l = LINKS(w, timer);
  links_of(l->prev, timer)->next = l->next;
  links_of(l->next, timer)->prev = l->prev;
  l->prev = l->next = NULL;
}

/* }====================================================== */


/* {====================================================== a signal's list
** The waiters of an abort signal's requests that are queued, linked
** through their signalled tail (signal.c reads the list; the engine links
** and unlinks), beneath every layer that changes a waiter. */

/* Links QUEUED waiter 'w' at the end of the list of 's' (no allocation). */
void am_signal_link (Signal *s, Waiter *w) {
  w->sig = s;
  w->snext = NULL;
  w->sprev = s->last;
  if (s->last != NULL) s->last->snext = w;
  else s->first = w;
  s->last = w;
}


/* Takes a signalled waiter out of its signal's list, if it is in one. */
void am_signal_unlink (Waiter *w) {
  Signal *s = w->sig;
  if (s == NULL) return;
  if (w->sprev != NULL) w->sprev->snext = w->snext;
  else s->first = w->snext;
  if (w->snext != NULL) w->snext->sprev = w->sprev;
  else s->last = w->sprev;
  w->sig = NULL;
  w->sprev = w->snext = NULL;
}

/* }====================================================== */


/* {====================================================== bucket heap */

#define HEAD(b)  ((Waiter *)(b)->ends.next)

/* Is key 'a' above 'b' (async_mutex.h: Key)? */
int am_key_above (const Key *a, const Key *b) {
  if (a->n != b->n) return a->n > b->n;
  if (a->flt != b->flt) return a->flt;
  return a->i > b->i;
}


static int key_equal (const Key *a, const Key *b) {
  return a->n == b->n && a->flt == b->flt && a->i == b->i;
}


/* The key of a float 'n' (not NaN): an integer if it has an integer's value. */
Key am_key_number (lua_Number n) {
  Key k;
  lua_Integer i;
  if (n == 0) n = 0;                          /* -0 is 0 */
  if (lua_numbertointeger(n, &i) && (lua_Number)i == n) {
    k.n = n;
    k.i = i;
    k.flt = 0;
  }
  else {
    k.n = n;
    k.i = 0;
    k.flt = 1;
  }
  return k;
}


/*
** Does bucket 'a' come before 'b'?  Queue: higher priority first.  Timers:
** earlier head deadline first; on a tie the longer duration, whose head
** arrived first (an equal deadline with an equal duration is one bucket).
*/
static int before (const Queue *q, const Bucket *a, const Bucket *b) {
  if (q->timer) {
    lua_Number da = HEAD(a)->deadline, db = HEAD(b)->deadline;
    if (da != db) return da < db;
  }
  return am_key_above(&a->key, &b->key);
}


static void place (Queue *q, uint32_t i, Bucket *b) {
  q->heap[i] = b;
  b->pos = i;
}


static void sift_up (Queue *q, uint32_t i) {
  Bucket *b = q->heap[i];
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!before(q, b, q->heap[parent])) break;
    place(q, i, q->heap[parent]);
    i = parent;
  }
  place(q, i, b);
}


static void sift_down (Queue *q, uint32_t i) {
  Bucket *b = q->heap[i];
  for (;;) {
    uint64_t child = 2 * (uint64_t)i + 1;
    if (child >= q->n) break;
    if (child + 1 < q->n && before(q, q->heap[child + 1], q->heap[child]))
      child++;
    if (!before(q, q->heap[child], b)) break;
    place(q, i, q->heap[child]);
    i = (uint32_t)child;
  }
  place(q, i, b);
}


static void heap_remove (Queue *q, Bucket *b) {
  uint32_t i = b->pos;
  Bucket *last = q->heap[--q->n];
  if (i < q->n) {                         /* fill the hole with 'last' */
    place(q, i, last);
    if (i > 0 && before(q, last, q->heap[(i - 1) / 2]))
      sift_up(q, i);
    else
      sift_down(q, i);
  }
}

/* }====================================================== */


/* {====================================================== bucket hash */

/* Keys are canonical (async_mutex.h: Key): equal keys, equal fields. */
static uint32_t hash_key (const Key *key) {
  uint64_t x;
  memcpy(&x, &key->n, sizeof(x));
  x ^= (uint64_t)key->i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdu;
  x ^= x >> 33;
  return (uint32_t)x;
}


static Bucket *find (const Queue *q, const Key *key) {
  uint32_t mask = q->hcap - 1, i;
  Bucket *b;
  if (q->n == 0) return NULL;
  if (key_equal(&q->heap[0]->key, key)) return q->heap[0];  /* usual case */
  for (i = hash_key(key) & mask; (b = q->slot[i]) != NULL; i = (i + 1) & mask)
    if (key_equal(&b->key, key)) return b;
  return NULL;
}


static void hash_insert (Queue *q, Bucket *b) {
  uint32_t mask = q->hcap - 1, i = hash_key(&b->key) & mask;
  while (q->slot[i] != NULL) i = (i + 1) & mask;
  q->slot[i] = b;
}


/* Linear probing deletion: shift back the entries the hole would hide. */
static void hash_remove (Queue *q, Bucket *b) {
  uint32_t mask = q->hcap - 1, i = hash_key(&b->key) & mask, j;
  while (q->slot[i] != b) i = (i + 1) & mask;
  for (j = (i + 1) & mask; q->slot[j] != NULL; j = (j + 1) & mask) {
    uint32_t home = hash_key(&q->slot[j]->key) & mask;
    /* may slot[j] move to i? only if its home is not in (i, j] */
    if ((j > i) ? (home <= i || home > j) : (home <= i && home > j)) {
      q->slot[i] = q->slot[j];
      i = j;
    }
  }
  q->slot[i] = NULL;
}


/* Rebuilds the hash with 'hcap' slots; 0 when out of memory. */
static int rehash (Queue *q, uint32_t hcap) {
  Bucket **slot = (Bucket **)calloc(hcap, sizeof(Bucket *));
  uint32_t i;
  if (slot == NULL) return 0;
  free(q->slot);
  q->slot = slot;
  q->hcap = hcap;
  for (i = 0; i < q->n; i++) hash_insert(q, q->heap[i]);
  return 1;
}


/* Room for one more bucket in the heap and the hash; 0 if out of memory. */
static int reserve (Queue *q) {
  if (q->n == q->cap) {
    uint32_t cap = q->cap ? 2 * q->cap : 4;
    Bucket **heap;
    if (q->cap >= UINT32_MAX / 4) return 0;
    heap = (Bucket **)realloc(q->heap, cap * sizeof(Bucket *));
    if (heap == NULL) return 0;
    q->heap = heap;
    q->cap = cap;
  }
  if (2 * (q->n + 1) > q->hcap && !rehash(q, q->hcap ? 2 * q->hcap : 8))
    return 0;
  if (q->spare == NULL && (q->spare = (Bucket *)malloc(sizeof(Bucket))) == NULL)
    return 0;
  return 1;
}


/* Gives memory back when the keys in use fall to a quarter. */
static void shrink (Queue *q) {
  if (q->cap > 64 && q->n < q->cap / 4) {
    Bucket **heap = (Bucket **)realloc(q->heap,
                                       (q->cap / 2) * sizeof(Bucket *));
    if (heap != NULL) {
      q->heap = heap;
      q->cap /= 2;
    }
  }
  if (q->hcap > 128 && 8 * q->n < q->hcap)
    rehash(q, q->hcap / 2);     /* out of memory: keep the bigger one */
}

/* }====================================================== */


/* {====================================================== queues */

void am_queue_init (Queue *q, int timer) {
  q->heap = NULL;
  q->n = q->cap = 0;
  q->slot = NULL;
  q->hcap = 0;
  q->spare = NULL;
  q->count = 0;
  q->timer = timer;
}


/* Frees the queue's memory; its waiters, if any, are not touched. */
void am_queue_free (Queue *q) {
  uint32_t i;
  for (i = 0; i < q->n; i++) free(q->heap[i]);
  free(q->heap);
  free(q->slot);
  free(q->spare);
  am_queue_init(q, q->timer);
}


/*
** Appends 'w' to the list of 'key' (normalized: -0 is 0).  Returns 0,
** with nothing changed, when out of memory.
*/
int am_queue_push (Queue *q, Waiter *w, const Key *key) {
  Bucket *b = find(q, key);
  if (b != NULL)
    am_list_append(b, w, q->timer);
  else {
    if (!reserve(q)) return 0;
    b = q->spare;
    q->spare = NULL;
    b->key = *key;
    am_list_init(b);
    am_list_append(b, w, q->timer);     /* first: the heap orders by it */
    hash_insert(q, b);
    place(q, q->n++, b);
    sift_up(q, q->n - 1);
  }
  q->count++;
  return 1;
}


/* Takes 'w', which is in 'q', out of it. */
void am_queue_remove (Queue *q, Waiter *w) {
  Links *l = LINKS(w, q->timer);
  void *prev = l->prev, *next = l->next;
  am_list_unlink(w, q->timer);
  q->count--;
  if (ISTAG(prev)) {                      /* it was its bucket's head */
    Bucket *b = UNTAG(prev);
    if (ISTAG(next)) {                    /* and the last one */
      heap_remove(q, b);
      hash_remove(q, b);
      if (q->spare == NULL) q->spare = b;
      else free(b);
      shrink(q);
    }
    else if (q->timer)
      sift_down(q, b->pos);               /* a later head deadline */
  }
}

/* }====================================================== */


/*
** The buckets of 'q' in queue order, into 'out' (room for q->n): for
** debug mode's reads (debug_read.c, core.dbg_queue).  An insertion sort: it
** runs only when a deadlock is searched, over few distinct keys.
*/
void am_queue_ordered (const Queue *q, Bucket **out) {
  uint32_t i, j;
  for (i = 0; i < q->n; i++) {
    Bucket *b = q->heap[i];
    for (j = i; j > 0 && before(q, b, out[j - 1]); j--) out[j] = out[j - 1];
    out[j] = b;
  }
}


/* The waiter after 'w' in bucket 'b' (its head when 'w' is NULL), or
   NULL at its end. */
Waiter *am_bucket_next (const Bucket *b, const Waiter *w) {
  void *p = (w == NULL) ? b->ends.next : w->q.next;
  return ISTAG(p) ? NULL : (Waiter *)p;
}
