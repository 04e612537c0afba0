-- Every public name of the module is annotated for editors (LuaLS `---@meta`
-- files in types/) and documented in docs/api.md, and the annotations name
-- nothing the module does not have.
--
-- The names are found by walking what is loaded, not by a list kept here:
-- the fields of each module of MODULES, every metatable the C code registers
-- under "async_mutex.*" (all types made in C, present or to come), and the
-- metatables made in Lua that objects reached through the API carry
-- (decorated locks, multi-key releasers, the Redis locks and their
-- releasers, the Redis client's subscriptions, versioned values and error
-- replies, with their public fields).  A new module is one line in
-- MODULES; a module that cannot be required here (not built, or its C
-- library missing) is left out.  A
-- module whose fields another one serves on first use (`into`) is checked
-- as part of that one.  A new public type made in C is picked up
-- by itself; a private one goes in INTERNAL.

local am = require "async_mutex"
local h = require "helpers"

-- The modules, and how docs/api.md names each (`am.withTimeout(...)`).
local MODULES = {
  { name = "async_mutex", readme = "am" },
  { name = "async_mutex.redis", readme = "redis" },
  { name = "async_mutex.redis_lock", readme = "am", into = "async_mutex" },
  { name = "async_mutex.redis_reentrant", readme = "am", into = "async_mutex" },
  { name = "async_mutex.redis_rwlock", readme = "am", into = "async_mutex" },
  { name = "async_mutex.redlock", readme = "am", into = "async_mutex" },
}

-- Metatables the C code registers that no user ever holds.
local INTERNAL = {
  ["async_mutex.State"] = "the per-Lua-state scheduler record",
  ["async_mutex.Waiter"] = "a queued request (its releaser is a Releaser)",
  ["async_mutex.scheduler"] = "the scheduler's handle",
}

-- How docs/api.md names an instance of a class in `name:method(...)`; by
-- default, the last part of the class name in lower case.
local RECEIVERS = {
  ["async_mutex.KeyedMutex"] = { "km", "keyed" },
  ["async_mutex.KeyedSemaphore"] = { "ks", "keyed" },
  ["async_mutex.ReentrantMutex"] = { "rm" },
  ["async_mutex.KeyedRWLock"] = { "krw" },
  ["async_mutex.RedisMutex"] = { "rm" },
  ["async_mutex.RedisSemaphore"] = { "rs" },
  ["async_mutex.KeyedRedisMutex"] = { "krm" },
  ["async_mutex.RedisReentrantMutex"] = { "rrm" },
  ["async_mutex.RedisRWLock"] = { "rrw" },
  ["async_mutex.KeyedRedisRWLock"] = { "krrw" },
  ["async_mutex.RedisMultiReleaser"] = { "all" },
  ["async_mutex.RedlockMutex"] = { "q" },
  ["async_mutex.Signal"] = { "s" },
  ["async_mutex.RedisReleaser"] = { "releaser" },
  ["async_mutex.redis.Versioned"] = { "versioned", "v" },
  ["async_mutex.redis.Error"] = { "err" },
  ["async_mutex.E_UNAVAILABLE"] = { "err" },
}

-- Option tables: their annotation class, and the docs/api.md heading under which
-- a table lists their fields.
local OPTIONS = {
  ["async_mutex.KeyedOptions"] = "### `am.KeyedMutex.new([options])`",
  ["async_mutex.OptimisticOptions"] = "### `am.optimistic(fn [, options])`",
  ["async_mutex.RedisLockOptions"] = "### `am.RedisMutex.new(client, name [, options])`",
}

-- The public fields of objects made in Lua whose other fields are private
-- state (docs/api.md writes them `receiver.field`).
local FIELDS = {
  ["async_mutex.RedisReleaser"] = { "fence" },
  ["async_mutex.RedisMultiReleaser"] = { "fences" },
  ["async_mutex.redis.Error"] = { "code", "message" },
  ["async_mutex.E_UNAVAILABLE"] = { "message", "reason" },
  ["async_mutex.redis.Versioned"] = { "client", "key" },
  ["async_mutex.Signal"] = { "aborted", "reason" },   -- computed: its __index
}

-- The tags of LuaLS annotations (LuaCATS).
local TAGS = {}
for tag in ([[meta class field param return type alias enum generic overload
  operator async nodiscard deprecated see version private protected package
  cast diagnostic module source]]):gmatch("%a+") do TAGS[tag] = true end

local ROOT = h.ROOT

local function escape(s)
  return (s:gsub("%p", "%%%0"))
end

--- The string keys of t, sorted.
-- (a key of a leading underscore and a lower-case letter is private, as
-- async_mutex.redis's _internal, read by its sibling modules only)
local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do
    if type(k) == "string" and not k:match("^_%l") then keys[#keys + 1] = k end
  end
  table.sort(keys)
  return keys
end


-- {========================================================== annotations

--- Reads every types/*.lua file (and below).  Returns `classes` (name ->
-- { members = set, file = ... }), `aliases` (set), `files` (name -> text),
-- and a list of convention problems.
local function read_annotations()
  local classes, aliases, files, problems = {}, {}, {}, {}
  -- (LD_PRELOAD emptied: under `make asan` the preloaded sanitizer runtime
  -- makes find and sort abort at exit)
  local ls = assert(io.popen(("LD_PRELOAD= ; cd '%s' && find types -name '*.lua' | sort"):format(ROOT)))
  for file in ls:lines() do files[file] = h.read_file(ROOT .. "/" .. file) end
  ls:close()

  for file, text in pairs(files) do
    local function problem(n, msg)
      problems[#problems + 1] = ("%s:%d: %s"):format(file, n, msg)
    end
    if not text:match("^%-%-%-@meta[ \n]") then
      problem(1, "a definition file starts with ---@meta")
    end
    local ok, err = load(text, "@" .. file, "t")
    if not ok then problem(0, "not valid Lua: " .. err) end

    local class_of = {}                   -- local variable -> class
    local open_class, pending_class = nil, nil
    local params = {}
    local n = 0
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      local tag, rest = line:match("^%-%-%-@(%a+)%s*(.*)$")
      if tag then
        if not TAGS[tag] then problem(n, "unknown annotation ---@" .. tag) end
        if tag == "class" then
          local name = rest:match("^([%w_.]+)")
          if classes[name] then problem(n, "class " .. name .. " declared twice") end
          classes[name] = { members = {}, file = file }
          open_class, pending_class = name, name
        elseif tag == "field" and open_class then
          classes[open_class].members[rest:match("^([%w_]+)")] = "field"
        elseif tag == "alias" then
          aliases[rest:match("^([%w_.]+)")] = true
        elseif tag == "param" then
          params[#params + 1] = rest:match("^([%w_.]+)")
        end
      elseif line:match("^%-%-") or line:match("^%s*$") then
        if not line:match("^%-%-%-") then open_class = nil end
      else
        open_class = nil
        local var = line:match("^local ([%w_]+) = {}$")
        if var and pending_class then class_of[var] = pending_class end
        pending_class = nil
        local owner, sep, name, args = line:match("^function ([%w_]+)([.:])([%w_]+)%((.-)%)")
        if owner then
          if not class_of[owner] then
            problem(n, owner .. " is not a table declared with ---@class")
          else
            classes[class_of[owner]].members[name] = "function"
          end
          local expected = {}
          for arg in args:gmatch("[%w_.]+") do expected[#expected + 1] = arg end
          if sep == ":" or #params > 0 or #expected > 0 then
            if table.concat(params, ",") ~= table.concat(expected, ",") then
              problem(n, ("%s%s%s: ---@param names (%s) differ from the "
                .. "parameters (%s)"):format(owner, sep, name,
                table.concat(params, ", "), table.concat(expected, ", ")))
            end
          end
        else
          local target, field = line:match("^([%w_]+)%.([%w_]+) =")
          if target and class_of[target] then
            classes[class_of[target]].members[field] = "field"
          end
        end
        params = {}
      end
    end
  end

  -- Every type named in an annotation (outside `code spans`) is declared.
  for file, text in pairs(files) do
    local n = 0
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      if line:match("^%-%-%-[@|]") then
        for name in line:gsub("`[^`]*`", ""):gmatch("async_mutex[%w_.]*") do
          if not classes[name] and not aliases[name] then
            problems[#problems + 1] = ("%s:%d: unknown type %s"):format(file, n, name)
          end
        end
      end
    end
  end
  return classes, aliases, files, problems
end

-- }==========================================================


-- {========================================================== the API

--- The types made in Lua by the Redis locks, as {class, __index, what}
-- records, found once: the locks and their decorated forms are made without
-- a server; a releaser comes from a grant by a redis-server started here.
-- Empty when the Redis client cannot be loaded.
local redis_found
local function redis_types()
  if redis_found then return redis_found end
  redis_found = {}
  local ok, R = pcall(require, "lock_redis")
  if not ok or not pcall(require, "async_mutex.redis_lock") then return redis_found end
  local function add(lock, what)
    local mt = getmetatable(lock)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), what }
    for _, decorated in ipairs({ am.withTimeout(lock, 10), am.tryAcquire(lock) }) do
      redis_found[#redis_found + 1] = { mt.__name, getmetatable(decorated).__index,
        "decorated " .. mt.__name }
    end
  end
  local server = R.server()
  local body_ok, err = pcall(h.run, function()
    local client = server:client()
    local m = am.RedisMutex.new(client, "spec25")
    add(m, "a RedisMutex")
    add(am.RedisSemaphore.new(client, "spec25s", 2), "a RedisSemaphore")
    add(am.KeyedRedisMutex.new(client, "spec25:"), "a KeyedRedisMutex")
    local rrm = am.RedisReentrantMutex.new(client, "spec25r")
    add(rrm, "a RedisReentrantMutex")
    add(am.RedisRWLock.new(client, "spec25rw"), "a RedisRWLock")
    add(am.KeyedRedisRWLock.new(client, "spec25krw:"), "a KeyedRedisRWLock")
    add(am.RedlockMutex.new({ client }, "spec25q"), "a RedlockMutex")
    local release = m:acquire()
    local mt = getmetatable(release)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"),
      "a Redis lock's releaser", release }
    release()
    local all = am.KeyedRedisMutex.new(client, "spec25:"):acquireAll({ "a", "b" })
    mt = getmetatable(all)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), "acquireAll's releaser",
      all }
    all()
    release = rrm:acquire()
    mt = getmetatable(release)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"),
      "a RedisReentrantMutex's level", release }
    release()
    -- the Redis client's types made in Lua, and its error value's fields
    local redis = require "async_mutex.redis"
    local sub = client:subscribe("spec25", function() end)
    mt = getmetatable(sub)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), "a subscription" }
    sub:unsubscribe()
    local versioned = redis.versioned(client, "spec25v")
    mt = getmetatable(versioned)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), "a versioned value",
      versioned }
    local _, err = pcall(client.call, client, "NO-SUCH-COMMAND")
    mt = getmetatable(err)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), "an error reply", err }
    client:close()
    -- an E_UNAVAILABLE that says why (no socket at that path)
    local refused = redis.connect({ path = server.path .. ".none" })
    _, err = pcall(refused.call, refused, "PING")
    mt = getmetatable(err)
    redis_found[#redis_found + 1] = { mt.__name, rawget(mt, "__index"), "an E_UNAVAILABLE", err }
    refused:close()
  end)
  server:stop()
  assert(body_ok, err)
  return redis_found
end

--- Everything public, as { class = ..., name = ... (nil: the class
-- itself), docs = {...}, what = ... } records; the classes seen (name ->
-- set of members); the modules loaded.
local function public_names()
  local names, seen = {}, {}
  -- `docs`: how docs/api.md may write it (plain text, not patterns)
  local function add(class, name, docs, what)
    seen[class] = seen[class] or {}
    if name and seen[class][name] or not name and seen[class][0] then return end
    seen[class][name or 0] = true
    names[#names + 1] = { class = class, name = name, docs = docs, what = what }
  end
  local function receivers(class)
    return RECEIVERS[class] or { class:match("([%w_]+)$"):lower() }
  end
  local function methods(class, index, what)
    add(class, nil, { "`" .. class .. "`" }, what)
    if type(index) ~= "table" then return end
    for _, method in ipairs(sorted_keys(index)) do
      -- (metamethods: a metatable may be its own __index)
      if not method:match("^__") then
        local docs = {}
        for i, r in ipairs(receivers(class)) do docs[i] = r .. ":" .. method .. "(" end
        add(class, method, docs, what)
      end
    end
  end

  -- the modules' fields
  local loaded = {}
  for _, m in ipairs(MODULES) do
    local ok, mod = pcall(require, m.name)
    if ok then
      loaded[#loaded + 1] = m.name
      local owner = m.into or m.name
      for _, key in ipairs(sorted_keys(mod)) do
        local value, ref = mod[key], m.readme .. "." .. key
        if m.into then
          assert(require(m.into)[key] == value,
            m.into .. "." .. key .. " is not " .. m.name .. "." .. key)
        end
        if type(value) == "function" then
          add(owner, key, { ref .. "(" }, "module " .. m.name)
        else
          add(owner, key, { ref .. " ", ref .. "`", ref .. "." }, "module " .. m.name)
        end
        if type(value) == "table" then   -- a class: its constructors
          for _, static in ipairs(sorted_keys(value)) do
            -- (an error value's data fields are checked with its type)
            if type(value[static]) ~= "function" then goto next_static end
            add(owner .. "." .. key, static, { ref .. "." .. static .. "(" },
              "module " .. m.name)
            ::next_static::
          end
        end
      end
    end
  end

  -- types made in C
  for _, name in ipairs(sorted_keys(debug.getregistry())) do
    local mt = debug.getregistry()[name]
    if name:match("^async_mutex[.]")
        and not INTERNAL[name] and type(mt) == "table" then
      local index = rawget(mt, "__index")
      -- a computed __index (a Signal's fields) finds the methods in the
      -- metatable; its fields are listed in FIELDS and read from an object
      if type(index) == "function" then index = mt end
      methods(name, index, "registered metatable")
    end
  end
  local signal = am.signal()
  signal:abort()
  for _, field in ipairs(FIELDS["async_mutex.Signal"]) do
    assert(signal[field] ~= nil, "async_mutex.Signal has no field " .. field)
    add("async_mutex.Signal", field, { "s." .. field }, "registered metatable")
  end

  -- types made in Lua, reached through the API: decorated locks have the
  -- methods of the lock they decorate; acquireAll's releaser
  local locks = {
    Mutex = am.Mutex.new(), Semaphore = am.Semaphore.new(1),
    KeyedMutex = am.KeyedMutex.new(), KeyedSemaphore = am.KeyedSemaphore.new(1),
  }
  for kind, lock in pairs(locks) do
    for _, decorated in ipairs({ am.withTimeout(lock, 10), am.tryAcquire(lock) }) do
      methods("async_mutex." .. kind, getmetatable(decorated).__index,
        "decorated " .. kind)
    end
  end
  local co = coroutine.create(function() return locks.KeyedMutex:acquireAll({ 1, 2 }) end)
  local ok, release = coroutine.resume(co)
  assert(ok and coroutine.status(co) == "dead", "acquireAll of free keys waited")
  local mt = getmetatable(release)
  methods(mt.__name, rawget(mt, "__index"), "acquireAll's releaser")
  release()

  -- the Redis locks, their decorated forms and their releasers (taken from
  -- a redis-server of this file's own)
  for _, entry in ipairs(redis_types()) do
    local class, index, what, object = entry[1], entry[2], entry[3], entry[4]
    methods(class, index, what)
    for _, field in ipairs(object and FIELDS[class] or {}) do
      assert(rawget(object, field) ~= nil, class .. " has no field " .. field)
      local docs = {}
      for i, r in ipairs(RECEIVERS[class]) do docs[i] = r .. "." .. field end
      add(class, field, docs, what)
    end
  end
  return names, seen, loaded
end

-- }==========================================================


describe("types/ (LuaLS annotations)", function()
  local classes, aliases, files, problems = read_annotations()

  it("are ---@meta files that load as Lua and follow the annotation conventions",
    function()
      assert.is_truthy(next(files), "no types/*.lua file")
      assert.same({}, problems)
    end)

  it("annotate every public name of the module", function()
    local names, _, loaded = public_names()
    assert.is_truthy(#loaded >= 1)
    local missing = {}
    for _, entry in ipairs(names) do
      local class = classes[entry.class]
      if not class and not aliases[entry.class] then
        missing[#missing + 1] = ("%s%s (%s): no ---@class %s"):format(entry.class,
          entry.name and ("." .. entry.name) or "", entry.what, entry.class)
      elseif entry.name and not (class and class.members[entry.name]) then
        missing[#missing + 1] = ("%s.%s (%s): not annotated"):format(
          entry.class, entry.name, entry.what)
      end
    end
    assert.same({}, missing)
  end)

  it("annotate nothing the module does not have", function()
    local _, seen = public_names()
    local stale = {}
    for _, name in ipairs(sorted_keys(classes)) do
      if seen[name] then
        for _, member in ipairs(sorted_keys(classes[name].members)) do
          if not seen[name][member] then
            stale[#stale + 1] = name .. "." .. member
          end
        end
      end
    end
    assert.same({}, stale)
  end)

  it("annotate redis.connect's options as docs/api.md lists them, each known to connect",
    function()
      local loaded, redis = pcall(require, "async_mutex.redis")
      if not loaded then return end            -- built without hiredis
      local readme = h.read_file(ROOT .. "/docs/api.md")
      local heading = "### `redis.connect(options)`"
      local at = assert(readme:find(heading, 1, true), "docs/api.md has no " .. heading)
      local section = readme:sub(at + #heading):match("^(.-)\n###")
      local listed = {}
      for name in section:gmatch("`options%.([%w_]+)`") do listed[name] = "field" end
      for row in section:gmatch("\n(| `[^\n]*)") do
        for name in row:match("^| ([^|]*)|"):gmatch("`([%w_]+)`") do listed[name] = "field" end
      end
      listed.option = nil                      -- the table's heading row
      assert.same(classes["async_mutex.redis.Options"].members, listed)
      for name in pairs(listed) do
        -- a value of the wrong type: refused by the check of that option
        local ok, err = pcall(redis.connect, { [name] = {} })
        assert.is_false(ok)
        assert.matches(name, err, 1, true)
        assert.not_matches("unknown option", err, 1, true)
      end
    end)

  it("are wired in .luarc.json and installed by the rock", function()
    local luarc = h.read_file(ROOT .. "/.luarc.json")
    assert.matches('"workspace%.library"%s*:%s*%[[^%]]*"types"', luarc)
    assert.matches('"runtime%.version"%s*:%s*"Lua 5%.4"', luarc)
    -- (the rock's install: the Makefile's rock-install, spec 21)
    local makefile = h.read_file(ROOT .. "/Makefile")
    assert.matches("\n\tcp types/%*%.lua %$%(INST_LUADIR%)/async_mutex/types/\n", makefile)
  end)
end)

describe("docs/api.md (the reference README.md links to)", function()
  local readme = h.read_file(ROOT .. "/docs/api.md")

  it("documents every public name of the module", function()
    local names = public_names()
    local missing = {}
    for _, entry in ipairs(names) do
      local found = false
      for _, text in ipairs(entry.docs) do
        found = found or readme:find(text, 1, true) ~= nil
      end
      if not found then
        missing[#missing + 1] = ("%s%s (%s): docs/api.md has no %s"):format(entry.class,
          entry.name and ("." .. entry.name) or "", entry.what,
          table.concat(entry.docs, " or "))
      end
    end
    assert.same({}, missing)
  end)

  it("lists the fields of each option table as they are annotated", function()
    local classes = read_annotations()
    for class, heading in pairs(OPTIONS) do
      local at = readme:find(heading, 1, true)
      assert(at, "docs/api.md has no heading " .. heading)
      local section = readme:sub(at + #heading):match("^(.-)\n###") or readme:sub(at)
      local documented = {}
      for field in section:gmatch("\n| `([%w_]+)` |") do documented[field] = "field" end
      assert.same(classes[class].members, documented)
    end
  end)
end)

describe("am._VERSION", function()
  it("is the release in CHANGELOG.md, which keeps an Unreleased section on top",
    function()
      assert.matches("^%d+%.%d+%.%d+$", am._VERSION)
      local changelog = h.read_file(ROOT .. "/CHANGELOG.md")
      local first, second = changelog:match("\n## %[([^%]]+)%].-\n## %[([^%]]+)%]")
      assert.equal("Unreleased", first)
      assert.equal(am._VERSION, second)
      local types = h.read_file(ROOT .. "/types/async_mutex.lua")
      assert.matches('\nasync_mutex%._VERSION = "' .. escape(am._VERSION) .. '"\n', types)
    end)
end)
