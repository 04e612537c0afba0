-- A review of how errors escaping tasks and coroutines the module resumed
-- are reported (docs/api.md, Errors in tasks and resumed coroutines; spec 26):
-- the text is the one lua5.4 prints for an uncaught error, and the
-- traceback is the error's, whatever the error object's __tostring does.
-- (Uses spec number 56 of the 50-59 range; it is about error reports.)
local h = require "helpers"

describe("an error escaping a resumed coroutine", function()
  it("is named by its text when it is a number, as lua5.4 prints it", function()
    local r = h.am_subprocess([[
      am.spawn(function() error(404, 0) end)
      am.spawn(function() am.sleep(1); error(2.5) end)
      uv.run()
      print("went on")
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("went on\n", r.stdout)
    assert.matches("async_mutex: error in a task: 404\nstack traceback:\n",
      r.stderr, 1, true)
    assert.matches("async_mutex: error in a task: 2.5\nstack traceback:\n",
      r.stderr, 1, true)
  end)

  it("keeps its traceback when the error's __tostring closes the dead coroutine", function()
    local r = h.subprocess([[
      local uv = require "luv"
      local am = require "async_mutex"
      local m = am.Mutex.new()
      local co
      local function failing_here()
        local release <close> = m:acquire()
        error(setmetatable({}, { __tostring = function()
          coroutine.close(co)                   -- runs the <close> releaser
          return "closed by its text"
        end }), 0)
      end
      -- a coroutine of ours (a task's catches its error: none dies)
      co = coroutine.create(function() am.sleep(1); failing_here() end)
      assert(coroutine.resume(co))
      am.spawn(function() am.sleep(2); local r = m:acquire(); print("next holder", r()) end)
      uv.run()
      print("went on", m:isLocked(), am.pending())
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("next holder\ttrue\nwent on\tfalse\t0\n", r.stdout)
    assert.matches("async_mutex: error in a resumed coroutine: closed by its text\n"
      .. "stack traceback:\n\t[C]: in function 'error'\n", r.stderr, 1, true)
    assert.matches(":7: in upvalue 'failing_here'\n", r.stderr, 1, true)
  end)

  it("is reported, the lock passed on, whatever its __tostring does", function()
    -- yields (across the C call: ignored), raises an object, returns a
    -- number, recurses without end, spawns a task failing with the same
    -- object (a failure met while reporting is reported at once: nested
    -- reports down to the C stack's limit, not one a turn for ever); a
    -- userdata error object with __tostring; a nil error
    local r = h.am_subprocess([[
      local function object(ts) return setmetatable({}, { __tostring = ts }) end
      local again
      again = object(function() am.spawn(function() error(again, 0) end); return "again" end)
      local loop = setmetatable({}, {})
      getmetatable(loop).__tostring = function(self) return tostring(self) end
      local errors = {
        object(function() coroutine.yield(); return "yielded" end),
        object(function() error(object(function() return "inner" end)) end),
        object(function() return 42 end),
        loop, again, io.stdout, nil,
      }
      local m = am.Mutex.new()
      local got = 0
      for i = 1, 7 do
        am.spawn(function()
          local release <close> = m:acquire()
          am.sleep(1)
          error(errors[i], 0)
        end)
      end
      am.spawn(function() local release <close> = m:acquire(); got = got + 1 end)
      uv.run()
      print("went on", got, m:isLocked(), am.pending())
    ]])
    assert.equal(0, r.rc, r.stderr)
    assert.equal("went on\t1\tfalse\t0\n", r.stdout)
    local _, tables = r.stderr:gsub("error in a task: %(error object is a table value%)\n", "")
    -- yields, raises, 42, recursion (and maybe the innermost 'again', whose
    -- spawn met the C stack's limit)
    assert.is_true(tables >= 4, r.stderr)
    assert.matches("error in a task: again\n", r.stderr, 1, true)
    assert.matches("error in a task: file %(0x", r.stderr)
    assert.matches("error in a task: (error object is a nil value)\n", r.stderr, 1, true)
  end)
end)

describe("debug mode given what is no lock", function()
  -- The refusal names a Redis lock as one (docs/api.md, Debugging a hang; spec
  -- 76); anything else is "async_mutex lock expected", however its type is
  -- spelt: a Redis lock's releaser (async_mutex.RedisReleaser; the check is
  -- by the type's name, so an object of that name stands for one here)
  -- is no Redis lock.
  local am = require "async_mutex"
  local releaser = setmetatable({}, { __name = "async_mutex.RedisReleaser" })

  it("does not call a Redis lock's releaser a Redis lock", function()
    for _, fname in ipairs({ "name", "holds", "report" }) do
      local args = fname == "name" and { releaser, "x" } or { releaser }
      h.raises_at_caller({ function() am.debug[fname](table.unpack(args)) end,
        ("bad argument #1 to '%s' (async_mutex lock expected, got async_mutex.RedisReleaser)")
          :format(fname) })
    end
  end)
end)
