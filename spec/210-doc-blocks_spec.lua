-- Every ```lua block of README.md and docs/*.md, taken from the files
-- themselves so that the manual cannot drift from the code.  A block is a
-- complete program unless the line right before its fence marks it
-- (README.md, "Code in this manual"):
--
--   (no marker)                       run in a child lua5.4 with the
--                                     checkout's paths: exit 0, nothing on
--                                     stderr, and each `print(...) --> text`
--                                     prints `text` as a line, in order
--   <!-- doctest: redis -->           the same against a redis-server this
--                                     spec starts (its `port = 6379` is
--                                     rewritten to the server's)
--   <!-- doctest: busted -->          a spec file: run with
--                                     `lua5.4 /usr/bin/busted`, which passes
--   <!-- doctest: signature x=Kind ... -->
--                                     a listing of signatures, not Lua: every
--                                     `x:name` and `x.name` in it exists on a
--                                     real object of Kind
--   <!-- doctest: fragment -->        part of a program (names defined
--                                     elsewhere, `...` for code left out):
--                                     compiled, not run
local h = require "helpers"
local redis_server = require "redis_server"

local ROOT = h.ROOT
  if ROOT:sub(1, 1) ~= "/" then ROOT = require("luv").cwd() .. "/" .. ROOT end

--- The Markdown files whose blocks are checked: README.md and docs/*.md.
local function documents()
  local files = { "README.md" }
  local p = assert(io.popen("cd '" .. ROOT .. "' && ls docs/*.md"))
  for name in p:lines() do files[#files + 1] = name end
  p:close()
  return files
end

--- Every ```lua block of `file`: { file, line, code, kind, args }, where
-- `line` is the fence's line number and `kind`/`args` come from the marker
-- on the line before it ("run" without one).  A marker not followed by a
-- ```lua fence, or of an unknown kind, is an error.
local KINDS = { run = true, redis = true, busted = true, signature = true, fragment = true }
local function blocks_of(file)
  local blocks, lines = {}, {}
  for line in (h.read_file(ROOT .. "/" .. file) .. "\n"):gmatch("([^\n]*)\n") do
    lines[#lines + 1] = line
  end
  local i = 1
  while i <= #lines do
    local marker = lines[i]:match("^<!%-%- doctest: (.-) %-%->$")
    if marker then
      local kind, args = marker:match("^(%S+)%s*(.*)$")
      assert(KINDS[kind], ("%s:%d: unknown doctest kind %q"):format(file, i, tostring(kind)))
      assert(lines[i + 1] == "```lua",
        ("%s:%d: a doctest marker must be right before a ```lua fence"):format(file, i))
    end
    if lines[i] == "```lua" then
      local code, j = {}, i + 1
      while lines[j] and lines[j] ~= "```" do code[#code + 1] = lines[j]; j = j + 1 end
      assert(lines[j], ("%s:%d: the block has no closing fence"):format(file, i))
      local before = lines[i - 1] and lines[i - 1]:match("^<!%-%- doctest: (.-) %-%->$")
      local kind, args = "run", ""
      if before then kind, args = before:match("^(%S+)%s*(.*)$") end
      blocks[#blocks + 1] = { file = file, line = i, code = table.concat(code, "\n") .. "\n",
        kind = kind, args = args }
      i = j
    end
    i = i + 1
  end
  return blocks
end

local BLOCKS = {}
for _, file in ipairs(documents()) do
  for _, b in ipairs(blocks_of(file)) do BLOCKS[#BLOCKS + 1] = b end
end

local function where(b) return ("%s:%d"):format(b.file, b.line) end

--- The lines a block says it prints: the text after `-->` on its lines
-- that call print.
local function expected_lines(code)
  local out = {}
  for line in code:gmatch("[^\n]+") do
    local text = line:match("print%(.*%-%->%s*(.-)%s*$")
    if text then out[#out + 1] = text end
  end
  return out
end

--- Asserts that `out` holds each of `lines` as a whole line, in this order.
local function assert_lines(b, out, lines)
  local i = 1
  for line in out:gmatch("([^\n]*)\n") do
    if line == lines[i] then i = i + 1 end
  end
  assert(i > #lines, ("%s: expected the line %q (in this order) in what it printed:\n%s")
    :format(where(b), tostring(lines[i]), out))
end

local function check_run(b, code)
  local r = h.subprocess(code, 60)
  assert(r.rc == 0 and r.stderr == "", ("%s: exit status %s\nstdout:\n%s\nstderr:\n%s")
    :format(where(b), tostring(r.rc), r.stdout, r.stderr))
  assert_lines(b, r.stdout, expected_lines(code))
end

--- `...` where code is left out, as a statement (alone on its line, or after
-- `then`/`else`/`do`), becomes a comment, so that the rest can be compiled.
local function without_placeholders(code)
  return (code:gsub("([^\n]*)", function(line)
    line = line:gsub("^(%s*)%.%.%.(%s*)$", "%1--[[...]]%2")
    line = line:gsub("(%f[%w]then%s+)%.%.%.", "%1--[[...]]")
    line = line:gsub("(%f[%w]else%s+)%.%.%.", "%1--[[...]]")
    line = line:gsub("(%f[%w]do%s+)%.%.%.", "%1--[[...]]")
    return line
  end))
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- How the spec makes a real object of each kind a signature block names,
-- inside a task, with `client` connected to this spec's server.
local MAKERS = {
  Mutex = "am.Mutex.new()",
  Semaphore = "am.Semaphore.new(1)",
  KeyedMutex = "am.KeyedMutex.new()",
  KeyedSemaphore = "am.KeyedSemaphore.new(1)",
  RWLock = "am.RWLock.new()",
  KeyedRWLock = "am.KeyedRWLock.new()",
  ReentrantMutex = "am.ReentrantMutex.new()",
  RedisMutex = "am.RedisMutex.new(client, 'doctest:m')",
  RedisSemaphore = "am.RedisSemaphore.new(client, 'doctest:s', 2)",
  KeyedRedisMutex = "am.KeyedRedisMutex.new(client, 'doctest:k:')",
  RedisReentrantMutex = "am.RedisReentrantMutex.new(client, 'doctest:rr')",
  RedisRWLock = "am.RedisRWLock.new(client, 'doctest:rw')",
  KeyedRedisRWLock = "am.KeyedRedisRWLock.new(client, 'doctest:krw:')",
  RedlockMutex = "am.RedlockMutex.new({ client }, 'doctest:q')",
  Releaser = "am.Mutex.new():acquire()",
  RedisReleaser = "am.RedisMutex.new(client, 'doctest:r'):acquire()",
}

--- The names a signature block uses on each of its objects: { x = { name,
-- ... } }, comments left out.
local function names_used(code)
  local used = {}
  for line in code:gmatch("[^\n]+") do
    line = line:gsub("%-%-.*$", "")
    for object, name in line:gmatch("%f[%w_]([%a_][%w_]*)[:.]([%a_][%w_]*)") do
      used[object] = used[object] or {}
      table.insert(used[object], name)
    end
  end
  return used
end

local function check_signature(b, server)
  local kinds = {}
  for object, kind in b.args:gmatch("([%a_][%w_]*)=([%a_][%w_]*)") do
    assert(MAKERS[kind], ("%s: no kind %s (known: see MAKERS in this spec)"):format(where(b), kind))
    kinds[object] = kind
  end
  local checks = {}
  for object, names in pairs(names_used(b.code)) do
    assert(kinds[object], ("%s: the marker does not say what `%s` is (%s=Kind)")
      :format(where(b), object, object))
    for _, name in ipairs(names) do
      checks[#checks + 1] = ("check(%q, %s, %q)"):format(object, object, name)
    end
  end
  local makers = {}
  for object, kind in pairs(kinds) do
    makers[#makers + 1] = ("local %s = %s"):format(object, MAKERS[kind])
  end
  local r = h.subprocess(([[
    local am = require "async_mutex"
    local client = require("async_mutex.redis").connect { path = %q }
    local function check(object, value, name)
      if value[name] == nil then print(object .. "." .. name .. " does not exist") end
    end
    am.run(function()
      %s
      %s
      client:close()
    end)
  ]]):format(server.path, table.concat(makers, "\n"), table.concat(checks, "\n")))
  assert(r.rc == 0 and r.stderr == "", ("%s: exit status %s\n%s"):format(where(b),
    tostring(r.rc), r.stderr))
  assert(r.stdout == "", ("%s names what its objects do not have:\n%s"):format(where(b), r.stdout))
end

local function check_busted(b)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir " .. quote(dir)))
  local spec = dir .. "/doc_spec.lua"
  local f = assert(io.open(spec, "w"))
  f:write(b.code)
  f:close()
  -- as README's "Testing your own code" says: lua5.4 /usr/bin/busted, from
  -- a directory of the user's own (no .busted of this checkout's)
  local p = assert(io.popen(("cd %s && env LUA_PATH=%s LUA_CPATH=%s timeout -s KILL 60 "
    .. "lua5.4 /usr/bin/busted -o utfTerminal doc_spec.lua 2>&1"):format(quote(dir),
    quote(ROOT .. "/src/?.lua;" .. ROOT .. "/src/?/init.lua;;"),
    -- (relative entries made absolute: `make portable-check` gives an
    -- absolute one, itself under build/)
    quote((";" .. package.cpath):gsub(";build/", ";" .. ROOT .. "/build/"):sub(2)))))
  local out = p:read("a")
  local _, _, rc = p:close()
  os.execute("rm -rf " .. quote(dir))
  assert(rc == 0, ("%s: busted exited %s:\n%s"):format(where(b), tostring(rc), out))
  assert(out:find("1 success / 0 failures / 0 errors", 1, true)
    or out:find("%d+ successes / 0 failures / 0 errors"), where(b) .. ":\n" .. out)
end

describe("the code blocks of README.md and docs/*.md", function()
  local server = redis_server.for_file(setup, teardown)

  it("are found, each with a known marker or none", function()
    -- README.md alone had 24 blocks when this spec was written
    assert(#BLOCKS >= 20, "found only " .. #BLOCKS .. " ```lua blocks")
    for _, b in ipairs(BLOCKS) do
      assert(KINDS[b.kind], where(b) .. ": unknown doctest kind " .. tostring(b.kind))
    end
  end)

  for _, b in ipairs(BLOCKS) do
    local title = ("%s (%s) %s"):format(where(b), b.kind, b.code:match("^%s*([^\n]*)"))
    it(title, function()
      if b.kind == "run" then
        check_run(b, b.code)
      elseif b.kind == "redis" then
        local address = "port = 6379"
        assert(b.code:find(address, 1, true), where(b) .. ": a redis block connects to " .. address)
        check_run(b, (b.code:gsub("port = 6379", "port = " .. server.port)))
      elseif b.kind == "busted" then
        check_busted(b)
      elseif b.kind == "signature" then
        check_signature(b, server)
      else
        local ok, err = load(without_placeholders(b.code), "=" .. where(b), "t")
        assert(ok, err)
      end
    end)
  end
end)

describe("the KeyedRWLock cache of README.md and docs/api.md", function()
  -- The cache's point: readers that miss an entry at the same moment load
  -- it once (a miss takes the key for writing and looks again).  Each block
  -- prints its load count; the same block loading under the read lock, as
  -- a cache without the second look would, must fail that check.
  local MISS = "local release <close> = cache:acquireWrite(name)"
  local caches = {}
  for _, b in ipairs(BLOCKS) do
    if b.code:find("am.KeyedRWLock.new()", 1, true) and b.code:find("load_entry", 1, true) then
      caches[#caches + 1] = b
    end
  end

  it("are found, two of them, each run by the cases above", function()
    assert.equal(2, #caches)
  end)

  for _, b in ipairs(caches) do
    it(where(b) .. " would print another count if the miss loaded under the read lock",
      function()
        assert(b.code:find(MISS, 1, true), where(b) .. ": no line " .. MISS)
        local naive = b.code:gsub(MISS:gsub("%p", "%%%0"),
          "local release <close> = cache:acquireRead(name)")
        assert.has_error(function() check_run(b, naive) end)
      end)
  end
end)

describe("README's .busted file", function()
  it("makes plain `busted` run a spec under Lua 5.4, which plain busted does not", function()
    local dotbusted
    for _, b in ipairs(BLOCKS) do
      if b.file == "README.md" and b.code:find('lua = "lua5.4"', 1, true) then dotbusted = b.code end
    end
    assert(dotbusted, "README.md has no .busted block")
    local function run(with_file)
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir " .. quote(dir)))
      if with_file then
        local f = assert(io.open(dir .. "/.busted", "w"))
        f:write(dotbusted)
        f:close()
      end
      local f = assert(io.open(dir .. "/v_spec.lua", "w"))
      f:write('it("runs", function() local x <close> = nil; assert.equal("Lua 5.4", _VERSION) end)\n')
      f:close()
      local p = assert(io.popen(("cd %s && timeout -s KILL 60 busted -o utfTerminal v_spec.lua 2>&1")
        :format(quote(dir))))
      local out = p:read("a")
      local _, _, rc = p:close()
      os.execute("rm -rf " .. quote(dir))
      return rc, out
    end
    local rc, out = run(true)
    assert(rc == 0 and out:find("1 success / 0 failures / 0 errors", 1, true), out)
    -- without it, busted runs under `lua` (Debian's busted: #!/usr/bin/env
    -- lua), which is Lua 5.1 where luarocks is installed: the spec fails
    local p = assert(io.popen("lua -v 2>&1"))
    local plain = p:read("a")
    p:close()
    if plain:find("^Lua 5%.1") then
      rc = run(false)
      assert.are_not.equal(0, rc)
    end
  end)
end)

describe("the doc-test markers", function()
  it("catch a block that does not compile, fails, prints otherwise or names a missing method",
    function()
      local bad = { file = "x.md", line = 1, code = "print(1) --> 2\n", kind = "run", args = "" }
      assert.has_error(function() check_run(bad, bad.code) end)
      bad.code = "error('no')\n"
      assert.has_error(function() check_run(bad, bad.code) end)
      assert.is_nil(load(without_placeholders("if x then ... end\nlocal y = \n"), "=x", "t"))
      assert.is_function(load(without_placeholders("if x then ... end\n...\n"), "=x", "t"))
      local server = redis_server.start()
      local ok = pcall(check_signature, { file = "x.md", line = 1, kind = "signature",
        args = "m=Mutex", code = "m:acquire()  m:acquireRaed()\n" }, server)
      server:stop()
      assert.is_false(ok)
    end)
end)
