/*
** debug_hash.c: debug mode's pointer hashes (a data structure)
** Open addressing with linear probing, keyed by address: a holder to its
** newest owner record, a releaser to its record, a Semaphore to its
** credit (debug.h: DebugRecords).  They grow with malloc only, so a grant
** and a release in debug mode allocate nothing Lua's collector sees.
*/

#include <stdint.h>
#include <stdlib.h>

#define LUA_LIB

#include "lua.h"
#include "lauxlib.h"

#include "../async_mutex.h"
#include "debug.h"


/* {====================================================== pointer hashes */

static unsigned ptr_hash (const void *p) {
  uintptr_t h = (uintptr_t)p >> 4;
  return (unsigned)((h ^ (h >> 15)) * 2654435761u);
}


PtrEntry *am_ph_find (const PtrHash *t, const void *key) {
  unsigned mask = (unsigned)t->cap - 1, i;
  if (t->cap == 0) return NULL;
  for (i = ptr_hash(key) & mask; t->e[i].key != NULL; i = (i + 1) & mask)
    if (t->e[i].key == key) return &t->e[i];
  return NULL;
}


/* Adds 'key' (not in 't'; room reserved); returns its entry. */
PtrEntry *am_ph_put (PtrHash *t, const void *key, int slot) {
  unsigned mask = (unsigned)t->cap - 1, i;
  for (i = ptr_hash(key) & mask; t->e[i].key != NULL; i = (i + 1) & mask) ;
  t->e[i].key = key;
  t->e[i].slot = slot;
  t->e[i].n = 0;
  t->n++;
  return &t->e[i];
}


/* Room for one more entry (malloc only); returns 0 without memory. */
int am_ph_reserve (PtrHash *t) {
  PtrHash nt;
  int i;
  if ((t->n + 1) * 2 <= t->cap) return 1;
  nt.cap = t->cap ? t->cap * 2 : FIRST_SLOTS;
  nt.n = 0;
  nt.e = (PtrEntry *)calloc((size_t)nt.cap, sizeof(PtrEntry));
  if (nt.e == NULL) return 0;
  for (i = 0; i < t->cap; i++)
    if (t->e[i].key != NULL)
      am_ph_put(&nt, t->e[i].key, t->e[i].slot)->n = t->e[i].n;
  free(t->e);
  *t = nt;
  return 1;
}


/* Removes entry 'e', moving back the entries of its probe run after it. */
void am_ph_remove (PtrHash *t, PtrEntry *e) {
  unsigned mask = (unsigned)t->cap - 1;
  unsigned i = (unsigned)(e - t->e), j = i, k;
  for (;;) {
    j = (j + 1) & mask;
    if (t->e[j].key == NULL) break;
    k = ptr_hash(t->e[j].key) & mask;   /* where entry j would like to be */
    if (((j - k) & mask) >= ((j - i) & mask)) {   /* at i or before it */
      t->e[i] = t->e[j];
      i = j;
    }
  }
  t->e[i].key = NULL;
  t->n--;
}

/* }====================================================== */
