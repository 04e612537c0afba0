--- async_mutex.versioned: versioned values on Redis, for optimistic
-- concurrency (docs/optimistic.md, Versioned values on Redis).
--
--   local v = redis.versioned(client, "stock:42")
--   local value, version = v:get()          -- nil, 0 when absent
--   v:set("7", version)                     -- the new version, or false
--   v:delete(version)                       -- likewise
--   v:update(function(value, version) return tonumber(value or 0) - 1 end)
--
-- A versioned value is one Redis hash holding two fields, `value` (a
-- string) and `version` (an integer that only grows).  Each operation is
-- one Lua script run by the server, so the comparison of versions and the
-- write are one atomic step: nothing partial is ever written.  A deletion
-- removes the value and keeps the hash, with its version incremented (a
-- tombstone), so that a version number is never reused and a writer
-- holding a version read before the deletion is refused (no ABA).

local am = require "async_mutex"
local optimistic = require "async_mutex.optimistic"

local getmetatable, setmetatable, tonumber, tostring, type =
  getmetatable, setmetatable, tonumber, tostring, type
local isyieldable, running = coroutine.isyieldable, coroutine.running
local huge, mtype, tointeger = math.huge, math.type, math.tointeger

local checks = require "async_mutex.checks"
checks.join_layer()                     -- its errors stand at the user's call
local usage_error = checks.usage_error
local typeerror = checks.typeerror
local typename, is_callable, argerror, is_closed =
  checks.typename, checks.is_callable, checks.argerror, checks.is_closed

local M = {}


-- {========================================================== scripts
-- Redis runs its scripts in Lua 5.1, whose numbers are doubles, exact up
-- to 2^53 only, while a version is any integer up to 2^63 - 1 (a Lua 5.4
-- integer, what `set` takes): so a script never makes a version a number.
-- It compares it as a decimal string with the one given (which the client
-- writes as "%d"), adds 1 to it digit by digit, and returns it as a
-- string (a bulk reply; the client reads it back with tonumber, exactly).
-- As doubles, from 2^53 on a write left the version as it was, and a
-- second writer with the same stale version was accepted (a lost update).
-- HGET of a missing field gives false; a script returning false gives a
-- nil reply (our "conflict").  Every script first reads the version the
-- same way: a key that does not exist is at version 0; a version field
-- that is absent from a hash that exists (another program's hash), or is
-- not a non-negative integer up to 2^63 - 1, means the key was not written
-- by these scripts, and is refused with a WRONGTYPE error rather than
-- written into (so is one with a NUL, which the server's tonumber reads
-- up to the NUL).  The last version, 2^63 - 1, can be read but has no
-- successor: a write there is refused with an error.

local PRELUDE = [[
local MAX = '9223372036854775807'
local function current()
  local v = redis.call('HGET', KEYS[1], 'version')
  if not v then
    if redis.call('EXISTS', KEYS[1]) == 1 then return nil end
    return '0'
  end
  if string.find(v, '^%d+$') then
    v = string.gsub(v, '^0+(%d)', '%1')
    if #v < #MAX then return v end
    if #v > #MAX then return nil end
    -- digits compared as two numbers below 2^53 (string comparison
    -- follows the server's locale)
    local hi, max_hi = tonumber(string.sub(v, 1, 10)), tonumber(string.sub(MAX, 1, 10))
    if hi < max_hi or (hi == max_hi
        and tonumber(string.sub(v, 11)) <= tonumber(string.sub(MAX, 11))) then
      return v
    end
    return nil
  end
  -- another form of a number ('5.0', '1e3'): as before, below 2^53 only.
  -- Lua 5.1's tonumber stops at a NUL ('5\0abc' read as 5): not a number
  if string.find(v, '%z') then return nil end
  local n = tonumber(v)
  if not n or n < 0 or n % 1 ~= 0 or n >= 2^53 then
    return nil
  end
  return string.format('%.0f', n + 0)       -- (-0 + 0 is 0)
end
local function succ(v)
  if v == MAX then
    return redis.error_reply('ERR versioned value at its last version (2^63 - 1): no write can follow it')
  end
  local i = #v
  while string.byte(v, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #v) end
  return string.sub(v, 1, i - 1) .. string.char(string.byte(v, i) + 1)
    .. string.rep('0', #v - i)
end
local NOT_VERSIONED = 'WRONGTYPE key holds a hash that is not a versioned value'
]]

-- get: {version, value} (value absent: a one-element array).
local GET = PRELUDE .. [[
local version = current()
if not version then return redis.error_reply(NOT_VERSIONED) end
local value = redis.call('HGET', KEYS[1], 'value')
return { version, value }
]]

-- set(value, expected): the new version, or nil on a conflict.
local SET = PRELUDE .. [[
local version = current()
if not version then return redis.error_reply(NOT_VERSIONED) end
if version ~= ARGV[2] then return false end
local new = succ(version)
if type(new) == 'table' then return new end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'version', new)
return new
]]

-- delete(expected): the version after it, or nil on a conflict.  Deleting
-- what holds no value changes nothing and returns the version as it is.
local DELETE = PRELUDE .. [[
local version = current()
if not version then return redis.error_reply(NOT_VERSIONED) end
if version ~= ARGV[1] then return false end
if redis.call('HEXISTS', KEYS[1], 'value') == 0 then return version end
local new = succ(version)
if type(new) == 'table' then return new end
redis.call('HDEL', KEYS[1], 'value')
redis.call('HSET', KEYS[1], 'version', new)
return new
]]

M.scripts = { get = GET, set = SET, delete = DELETE }

-- }==========================================================


-- {========================================================== checks

local Versioned = {}
local meta = {
  __name = "async_mutex.redis.Versioned",
  __index = Versioned,
  __tostring = function(self)
    return ("async_mutex.redis.Versioned: %s"):format(self.key)
  end,
}

local function check_self(self, fname)
  if getmetatable(self) ~= meta then
    typeerror(1, fname, "async_mutex.redis.Versioned", self)
  end
end

-- The misuse errors of every method, at its caller's line (a client call
-- would raise them at this file's): a closed client, or not in a
-- coroutine ("attempt to <verb> a versioned value outside a coroutine").
local function check_usable(self, verb)
  checks.check_open(self.client)
  local _, main = running()
  if main or not isyieldable() then
    usage_error(("attempt to %s a versioned value outside a coroutine"):format(verb))
  end
end

-- The string stored for `value`, or nil.  Numbers are converted as Lua
-- writes them ("42", "2.0", "0.1", "1e+300"), with more digits when that
-- form would not read back as the same number (1/3); NaN and infinities
-- have no such form and are refused.
local function to_value(value)
  local t = type(value)
  if t == "string" then return value end
  if t ~= "number" then return nil end
  if mtype(value) == "integer" then return tostring(value) end
  if value ~= value or value == huge or value == -huge then return nil end
  local s = tostring(value)
  if tonumber(s) == value then return s end
  for digits = 15, 17 do
    s = ("%." .. digits .. "g"):format(value)
    if tonumber(s) == value then return s end
  end
end

local function check_value(value, n, fname)
  local s = to_value(value)
  if not s then
    typeerror(n, fname, "string or finite number", value)
  end
  return s
end

local function check_version(version, n, fname)
  local v = type(version) == "number" and tointeger(version)
  if not v or v < 0 then
    argerror(n, fname, "version must be a non-negative integer")
  end
  return v
end

-- }==========================================================


-- {========================================================== operations

-- The raw operations: no checks of their own (the methods and update
-- check first).  get reads with HMGET, one command and so one atomic read,
-- cheaper for the server than a script; only when the version field is
-- not a non-negative integer, or absent beside a value, does it run the
-- GET script, for the server's WRONGTYPE error reply that the other
-- operations raise too.  (Both fields absent: a key never written, or
-- another program's hash, which set refuses; a read of it is nil, 0.)
local function get(self)
  local reply = self.client:call("HMGET", self.key, "value", "version")
  local value, version = reply[1], reply[2]
  if version == nil and value == nil then return nil, 0 end
  local n = version and tointeger(tonumber(version))
  if n and n >= 0 and ("%d"):format(n) == version then return value, n end
  reply = self.client:eval(GET, { self.key })  -- raises for a bad version field
  return reply[2], tonumber(reply[1])
end

-- The scripts return versions as decimal strings (above): exact integers
-- here.  The version is sent the same way ("%d").
local function set(self, value, version)
  local v = self.client:eval(SET, { self.key }, { value, ("%d"):format(version) })
  return v and tonumber(v) or false
end

local function delete(self, version)
  local v = self.client:eval(DELETE, { self.key }, { ("%d"):format(version) })
  return v and tonumber(v) or false
end

--- v:get(): the value (a string, nil when absent) and its version (0 when
-- the key was never written).
function Versioned.get(self)
  check_self(self, "get")
  check_usable(self, "get")
  local value, version = get(self)
  return value, version
end

--- v:set(value, expected_version): writes value if the stored version is
-- still expected_version; returns the new version, or false.
function Versioned.set(self, value, expected_version)
  check_self(self, "set")
  local s = check_value(value, 1, "set")
  local version = check_version(expected_version, 2, "set")
  check_usable(self, "set")
  local v = set(self, s, version)
  return v
end

--- v:delete(expected_version): removes the value if the stored version is
-- still expected_version; returns the version after it, or false.
function Versioned.delete(self, expected_version)
  check_self(self, "delete")
  local version = check_version(expected_version, 1, "delete")
  check_usable(self, "delete")
  local v = delete(self, version)
  return v
end

-- What fn returned that is not a value, and a client closed meanwhile
-- (by fn, or while the loop slept): reported by update at its caller's
-- line, after the loop (a call on it would raise at this file's).
local BAD_RESULT, CLOSED = {}, {}

--- v:update(fn [, options]): am.optimistic around get and set.
-- fn(value, version, attempt) returns the new value (or raises to give
-- up); returns the value written and its version.
function Versioned.update(self, ...)
  check_self(self, "update")
  local fn, options = ...
  if not is_callable(fn) then
    typeerror(1, "update", "function", ...)
  end
  local complaint = optimistic.check_options(options)
  if complaint then argerror(2, "update", complaint) end
  check_usable(self, "update")
  local value, version = am.optimistic(function(attempt)
    if is_closed(self.client) then return true, CLOSED end
    local old, old_version = get(self)
    local new = fn(old, old_version, attempt)
    local s = to_value(new)
    if not s then return true, BAD_RESULT, new end
    if is_closed(self.client) then return true, CLOSED end
    local v = set(self, s, old_version)
    if not v then return false end
    return true, s, v
  end, options)
  if value == BAD_RESULT then
    usage_error(("update: fn must return a string or finite number, got %s")
      :format(typename(version)))
  end
  if value == CLOSED then checks.check_open(self.client) end
  return value, version
end

-- }==========================================================


--- versioned(client, key): the versioned value stored at `key`.
function M.versioned(client, key)
  if typename(client) ~= "async_mutex.redis.Client" then
    typeerror(1, "versioned", "async_mutex.redis.Client", client)
  end
  if type(key) ~= "string" then
    typeerror(2, "versioned", "string", key)
  end
  local v = setmetatable({ client = client, key = key }, meta)
  return v
end

M.Versioned = Versioned

return M
