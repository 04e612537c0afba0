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
    local res = h.subprocess(([[
      arg = { [0] = "spec/fuzz/reentrancy.lua", "run", "%d", "%d" }
      dofile(arg[0])
    ]]):format(SEED, N), 300)
    assert.equal("", res.stderr)
    local seqs, ops, calls = res.stdout:match("^OK (%d+) sequences (%d+) ops (%d+) re%-entrant calls\n$")
    assert.is_not_nil(seqs, res.stdout)
    assert.equal(0, res.rc)
    assert.equal(N, tonumber(seqs))
    assert.is_true(tonumber(ops) > N * 20)          -- the sequences did something
    assert.is_true(tonumber(calls) > N)             -- and called back
  end)
end)
