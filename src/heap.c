/*
** heap.c: binary heaps of waiters
** Every insertion and removal is O(log n) and no operation scans the
** heap: a waiter records its own position, so a timed-out or closed
** waiter leaves its queue without a search.
*/

#define LUA_LIB

#include <stdlib.h>

#include "async_mutex.h"


#define POS(h,w)  (*((h)->timer ? &(w)->tpos : &(w)->qpos))


/*
** Does 'a' come before 'b'?  Queue order: higher priority first, then
** arrival (which is "insert after the last entry of priority >= p").
** Timer order: earlier deadline first, then arrival.
*/
static int before (const Heap *h, const Waiter *a, const Waiter *b) {
  if (h->timer) {
    if (a->u.deadline != b->u.deadline)
      return a->u.deadline < b->u.deadline;
  }
  else if (a->priority != b->priority)
    return a->priority > b->priority;
  return a->seq < b->seq;
}


static void place (Heap *h, uint32_t i, Waiter *w) {
  h->item[i] = w;
  POS(h, w) = i;
}


static void sift_up (Heap *h, uint32_t i) {
  Waiter *w = h->item[i];
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!before(h, w, h->item[parent])) break;
    place(h, i, h->item[parent]);
    i = parent;
  }
  place(h, i, w);
}


static void sift_down (Heap *h, uint32_t i) {
  Waiter *w = h->item[i];
  for (;;) {
    uint64_t child = 2 * (uint64_t)i + 1;
    if (child >= h->n) break;
    if (child + 1 < h->n && before(h, h->item[child + 1], h->item[child]))
      child++;
    if (!before(h, h->item[child], w)) break;
    place(h, i, h->item[child]);
    i = (uint32_t)child;
  }
  place(h, i, w);
}


void am_heap_init (Heap *h, int timer) {
  h->item = NULL;
  h->n = h->cap = 0;
  h->timer = timer;
}


void am_heap_free (Heap *h) {
  free(h->item);
  h->item = NULL;
  h->n = h->cap = 0;
}


/*
** Makes room for one more item.  Returns 0 when out of memory; callers
** reserve before they change anything, so a push never fails.
*/
int am_heap_reserve (Heap *h) {
  if (h->n == h->cap) {
    uint32_t cap = h->cap ? 2 * h->cap : 8;
    Waiter **item;
    if (h->cap >= UINT32_MAX / 2) return 0;
    item = (Waiter **)realloc(h->item, cap * sizeof(Waiter *));
    if (item == NULL) return 0;
    h->item = item;
    h->cap = cap;
  }
  return 1;
}


void am_heap_push (Heap *h, Waiter *w) {
  place(h, h->n++, w);
  sift_up(h, h->n - 1);
}


void am_heap_remove (Heap *h, Waiter *w) {
  uint32_t i = POS(h, w);
  Waiter *last = h->item[--h->n];
  POS(h, w) = AM_NOPOS;
  if (i < h->n) {                         /* fill the hole with 'last' */
    place(h, i, last);
    if (i > 0 && before(h, last, h->item[(i - 1) / 2]))
      sift_up(h, i);
    else
      sift_down(h, i);
  }
  if (h->cap > 64 && h->n < h->cap / 4) {  /* give memory back */
    Waiter **item = (Waiter **)realloc(h->item,
                                       (h->cap / 2) * sizeof(Waiter *));
    if (item != NULL) {
      h->item = item;
      h->cap /= 2;
    }
  }
}
