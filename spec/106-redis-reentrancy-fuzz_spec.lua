-- The Redis client's re-entrancy fuzzer (spec/fuzz/redis_reentrancy.lua):
-- random sequences of calls, evals, subscriptions and closes against a
-- fake server that misbehaves at random, during which finalizers and
-- debug hooks call the client back from inside its own calls, checked
-- against what docs/redis.md ("Re-entry") promises.  It runs in a child
-- process, so that a crash fails the test rather than the run.  `make
-- fuzz` runs many more; AM_REDIS_REENTRY_N and AM_REDIS_REENTRY_SEED
-- choose here.
local h = require "helpers"

describe("the Redis client's re-entrancy fuzzer", function()
  local N = tonumber(os.getenv("AM_REDIS_REENTRY_N") or "") or (h.SLOW and 50 or 200)
  local SEED = tonumber(os.getenv("AM_REDIS_REENTRY_SEED") or "") or 1

  it(("finds every promise kept on %d sequences (seeds %d..%d)"):format(N, SEED, SEED + N - 1),
    function()
      local ops, calls = h.reentrancy_fuzzer("spec/fuzz/redis_reentrancy.lua", SEED, N, 600)
      assert.is_true(ops > N * 20)          -- the sequences did something
      assert.is_true(calls > N)             -- and called back
    end)
end)
