/*
** toy_kind.c: a lock kind that exists only for spec 280, which builds the
** core with this file and its one line of the kind table (AM_EXTRA_KINDS
** on the compiler's command line) to show that a kind needs nothing else
** (docs/internals.md, "How to add a lock kind").  Its rules: a Toy is held
** by one request at a time, and each grant is a new generation, so that a
** releaser of an older grant gives nothing back.  Every method comes from
** the shared ones of src/core/kinds/lock.c.
*/

#include "lua.h"

#include "async_mutex.h"


static int toy_fits (const Lock *lk, lua_Integer weight) {
  return weight <= lk->value;
}


static lua_Integer toy_take (Lock *lk, lua_Integer weight) {
  lk->value -= weight;
  return ++lk->gen;
}


static int toy_give_back (Lock *lk, lua_Integer weight, lua_Integer token,
                          int saturate) {
  (void)weight; (void)saturate;
  if (lk->value > 0 || (token != AM_UNSCOPED && token != lk->gen))
    return 0;
  lk->value = 1;
  return 1;
}


static int toy_is_locked (const Lock *lk) {
  return lk->value <= 0;
}


static void toy_end_holds (Lock *lk) {
  lk->value = 1;
}


const LockKind am_toy_kind = {
  .name = "Toy",
  .noun = "a toy",
  .type = AM_T_TOY,
  .keyed_type = AM_T_TOY,     /* no keyed form */
  .fits = toy_fits,
  .take = toy_take,
  .give_back = toy_give_back,
  .is_locked = toy_is_locked,
  .end_holds = toy_end_holds,
};
