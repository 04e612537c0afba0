-- KeyedRedisRWLock (docs/redis-locks.md, "RedisRWLock", "Several keys at
-- once"): a RedisRWLock per key (prefix .. key) with the API of
-- am.KeyedRWLock: per-key reads and writes, downgrade, release(key), and
-- multi-key reads and writes in the canonical order, all or nothing.

local R = require "lock_redis"

local am, h, server, fresh, with = R.spec_file(setup, teardown, "spec193")

describe("KeyedRedisRWLock", function()
  it("applies the RWLock's rules per key; other keys never block", with.two_keyed_locks(am.KeyedRedisRWLock, function(ka, kb, a, _, prefix)
    local r1 = ka:acquireRead("x")
    local r2 = kb:acquireRead("x")
    assert.equal(2, ka:readers("x"))
    assert.is_false(ka:isWriteLocked("x"))
    local other = kb:acquireWrite("y")               -- another key: at once
    assert.is_true(ka:isWriteLocked("y"))
    assert.equal(0, ka:readers("y"))
    local w = h.requester("acquire", nil, "w", kb, "x")   -- acquire writes
    h.wait_until(function() return R.queued(a, prefix .. "x") == 1 end)
    local late = h.requester("acquireRead", nil, "late", ka, "x")  -- behind the writer
    h.wait_until(function() return R.queued(a, prefix .. "x") == 2 end)
    r1(); r2()
    h.wait_until(function() return w.done end)
    assert.is_false(late.done)
    local read = w.release:downgrade()               -- the reader behind joins
    h.wait_until(function() return late.done end)
    assert.equal(2, ka:readers("x"))
    assert.is_false(w.release())
    read(); late.release()
    assert.is_true(kb:release("y"))                  -- ends the key's write hold
    assert.is_false(other())
    assert.is_false(ka:isLocked("y"))
  end))

  it("reads several keys together with other readers, and writes them alone", with.two_keyed_locks(am.KeyedRedisRWLock, function(ka, kb)
    local reads = ka:acquireAllRead({ "p", "q" })
    local more = kb:acquireAllRead({ "q", "p", "r" })
    assert.equal(2, kb:readers("p"))
    local w = h.requester("acquireAllWrite", nil, "w", kb, { "r", "p" })
    h.sleep(50)
    assert.is_false(w.done)
    assert.is_true(reads())
    assert.is_true(more())
    h.wait_until(function() return w.done end)
    assert.is_true(ka:isWriteLocked("p"))
    assert.is_true(ka:isWriteLocked("r"))
    assert.is_false(ka:isLocked("q"))
    assert.is_true(w.release())
    assert.equal(7, ka:runSharedAll({ "p", "q" }, function()
      assert.equal(1, kb:readers("q"))
      return 7
    end))
    assert.equal(8, ka:runExclusiveAll({ "p", "q" }, function()
      assert.is_true(kb:isWriteLocked("q"))
      return 8
    end))
    local all = ka:acquireAll({ "p" })               -- acquireAll writes
    assert.is_true(kb:isWriteLocked("p"))
    all()
  end))

  it("waitForUnlock(key) waits until a write of the key could be granted", with.two_keyed_locks(am.KeyedRedisRWLock, function(ka, kb)
    local r = ka:acquireRead("k")
    local watcher = h.requester("waitForUnlock", nil, "watch", kb, "k")
    h.sleep(40)
    assert.is_false(watcher.done)
    r()
    h.wait_until(function() return watcher.done end)
  end))
end)

describe("KeyedRedisRWLock from 4 processes", function()
  -- Sections read or write 1 to 3 of 5 keys (a fifth of them write),
  -- with markers per key: a write overlaps nothing on its key.
  local WORKER = R.WORKER_PROLOGUE .. [[
local krw = am.KeyedRedisRWLock.new(client, NAME, { ttl = 3000 })
local KEYS = { "a", "b", "c", "d", "e" }
main(function()
  for i = 1, tonumber(N) do
    local pick = some_of(KEYS)
    local write = math.random() < 0.2
    local mode = write and "W" or "R"
    local id = ID .. "." .. i
    local run = write and krw.runExclusiveAll or krw.runSharedAll
    run(krw, pick, function()
      for _, k in ipairs(pick) do f:write(("B %s %s %s\n"):format(mode, k, id)) end
      am.sleep(math.random(0, 2))
      for _, k in ipairs(pick) do f:write(("E %s %s %s\n"):format(mode, k, id)) end
    end)
  end
  f:close()
end)
]]

  it("never lets a write overlap anything on its keys (markers in one O_APPEND file)",
    h.async(function()
      local prefix = fresh() .. ":"
      local log = R.run_workers(WORKER, 4, server.path, prefix, 80)
      local inside, bad, sections = {}, 0, 0
      for line in io.lines(log) do
        local kind, mode, key, id = line:match("^(%u) (%u) (%S+) (%S+)")
        inside[key] = inside[key] or {}
        if kind == "B" then
          sections = sections + 1
          for _, m in pairs(inside[key]) do
            if m == "W" or mode == "W" then bad = bad + 1 end
          end
          inside[key][id] = mode
        else
          inside[key][id] = nil
        end
      end
      os.remove(log)
      assert.is_true(sections >= 4 * 80)
      assert.equal(0, bad)
    end, { deadline = 60000 }))
end)

describe("KeyedRedisRWLock's usage errors", function()
  it("are the keyed Redis locks' and the KeyedRWLock's, at the caller's line", with.client(function(c)
    h.raises_at_caller({ function() am.KeyedRedisRWLock.new(c, 5) end,
      "bad argument #2 to 'new' (key prefix must be a string, got number)" })
    local krw = am.KeyedRedisRWLock.new(c, "")
    h.raises_at_caller({ function() krw:acquireRead("") end,
      "bad argument #1 to 'acquireRead' (key must not be empty when the prefix is empty"
      .. " (a lock name must be a non-empty string))" })
    h.raises_at_caller({ function() krw:acquireWrite({}) end,
      "bad argument #1 to 'acquireWrite' (key must be a string or a finite number, got table)" })
    h.raises_at_caller({ function() krw:acquire("k", "high") end,
      "bad argument #2 to 'acquire' (priority must be a number, got string)" })
    h.raises_at_caller({ function() krw:runShared("k", 1) end,
      "bad argument #2 to 'runShared' (function expected, got number)" })
    h.raises_at_caller({ function() krw:acquireAllRead({}) end,
      "bad argument #1 to 'acquireAllRead' (key set must not be empty)" })
    h.raises_at_caller({ function() krw:readers({}) end,
      "bad argument #1 to 'readers' (key must be a string or a finite number, got table)" })
  end))
end)
