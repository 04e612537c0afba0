-- The re-entrancy fuzzer (spec/fuzz/reentrancy.lua): random sequences during
-- which finalizers and debug hooks (call and count hooks) call the module
-- back from inside its own calls, checked against the invariants of
-- docs/semantics.md (Re-entry).  It runs in a child process, so that a
-- crash fails the test rather than the run.
-- `make fuzz` runs many more; AM_REENTRY_N and AM_REENTRY_SEED choose here.
local h = require "helpers"

describe("the re-entrancy fuzzer", function()
  local N = tonumber(os.getenv("AM_REENTRY_N") or "") or (h.SLOW and 100 or 300)
  local SEED = tonumber(os.getenv("AM_REENTRY_SEED") or "") or 1

  it(("finds every invariant held on %d sequences (seeds %d..%d)"):format(N, SEED, SEED + N - 1), function()
    local ops, calls = h.reentrancy_fuzzer("spec/fuzz/reentrancy.lua", SEED, N, 300)
    assert.is_true(ops > N * 20)          -- the sequences did something
    assert.is_true(calls > N)             -- and called back
  end)
end)
