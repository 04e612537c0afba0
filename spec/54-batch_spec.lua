-- The scheduler's batch and the lock kinds (docs/semantics.md, Coroutines
-- and the loop): a loop iteration resumes every outcome settled before it
-- starts, so the readers an RWLock grants together all run in one
-- iteration, however many; outcomes settled while the batch runs (a
-- hand-off chain) join it up to a budget, then wait for the next iteration.
local h = require "helpers"
local am = require "async_mutex"

describe("one loop iteration", function()
  it("resumes every reader an RWLock grants together, beyond the 1,024 of a batch", h.async(function()
    local rw, w = h.held(am.RWLock.new(), "acquireWrite")
    local n, entered = h.load(3000), 0
    for _ = 1, n do
      h.spawn(function()
        local r = rw:acquireRead()
        entered = entered + 1
        r()
      end)
    end
    w()
    assert.equal(n, rw:readers())              -- granted in one dispatch
    assert.equal(0, entered)                   -- resumed from the loop
    h.tick()
    assert.equal(n, entered)
    assert.is_false(rw:isLocked())
  end))

  it("resumes every key's readers released together on a KeyedRWLock", h.left_free(am.KeyedRWLock.new, function(kr)
    local n, entered = h.load(2000), 0
    local ws = { kr:acquireWrite("a"), kr:acquireWrite("b") }
    for i = 1, n do
      h.spawn(function()
        local r = kr:acquireRead(i % 2 == 0 and "a" or "b")
        entered = entered + 1
        r()
      end)
    end
    ws[1](); ws[2]()
    h.tick()
    assert.equal(n, entered)
  end))

  it("lets a hand-off chain run on in the same iteration up to a budget, the rest in the next", h.async(function()
    local m, hold = h.held(am.Mutex.new())
    local n, entered = h.load(3000), 0
    for _ = 1, n do
      h.spawn(function()
        local r = m:acquire()
        entered = entered + 1
        r()                                    -- grants the next: a chain
      end)
    end
    hold()
    h.tick()
    assert.is_true(entered > 1, "the chain did not join the batch")
    if n > 2048 then
      assert.is_true(entered < n, "a chain of " .. n .. " ran in one iteration: no budget")
    end
    h.wait_until(function() return entered == n end)
    assert.is_false(m:isLocked())
  end))
end)
