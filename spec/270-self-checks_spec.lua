-- The type checks of the hot path (docs/internals.md, One contended
-- acquire, release and resume): a request's and a releaser's `self` is
-- checked by its metatable's address, and a releaser's call keeps the
-- metatable its check pushed.  Anything else named as `self` still raises
-- the auxlib's message, and changes nothing (docs/semantics.md, Errors).
local h = require "helpers"
local am = require "async_mutex"

local E = h.error_of

describe("the self of a releaser's call and close", function()
  it("rejects every other value with the exact message, and releases nothing", h.async(function()
    local m, r = h.held(am.Mutex.new())
    local call, close = getmetatable(r).__call, getmetatable(r).__close
    local function expected(fname, got)
      return ("bad argument #1 to '%s' (async_mutex.Releaser expected, got %s)")
        :format(fname, got)
    end
    assert.equal(expected("call", "async_mutex.Mutex"), E(function() call(m) end))
    assert.equal(expected("call", "table"), E(function() call({}) end))
    assert.equal(expected("call", "nil"), E(function() call(nil) end))
    assert.equal(expected("call", "FILE*"), E(function() call(io.stdout) end))
    assert.equal(expected("close", "async_mutex.Semaphore"),
      E(function() close(am.Semaphore.new(1)) end))
    assert.is_true(m:isLocked())
    assert.is_true(call(r))
    assert.is_false(call(r))
    assert.is_false(m:isLocked())
  end))

  it("accepts a waiter handed out as the releaser of a contended grant", h.async(function()
    local m, release = h.held(am.Mutex.new())
    local got
    am.spawn(function() got = m:acquire() end)
    release()
    am.sleep(0)
    assert.is_truthy(got)
    local call = getmetatable(got).__call
    assert.is_true(call(got))
    assert.is_false(got())
    assert.is_false(m:isLocked())
  end))
end)

describe("the self of a request", function()
  it("rejects a releaser, a foreign userdata and a string with the exact message", h.left_free(am.Mutex.new, function(m)
    local acquire = m.acquire
    local r = m:acquire()
    local function expected(got)
      return ("bad argument #1 to 'acquire' (async_mutex.Mutex expected, got %s)"):format(got)
    end
    assert.equal(expected("async_mutex.Releaser"), E(function() acquire(r) end))
    assert.equal(expected("FILE*"), E(function() acquire(io.stdout) end))
    assert.equal(expected("string"), E(function() acquire("x") end))
    assert.equal(0, am.pending())
    r()
  end))
end)
