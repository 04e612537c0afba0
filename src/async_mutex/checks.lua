--- async_mutex.checks: the argument checks the Lua modules of async_mutex
-- share (the Redis client, Redis locks, optimistic and versioned values), so
-- that their usage errors read alike: "bad argument #n to 'fname' (msg)",
-- the text of the C core's argument errors (src/core/args/args.c), and all stand at
-- the user's call.  The core finds that call (the first frame outside the
-- Lua layer), for its errors and for these: a module of the layer never
-- counts stack levels by hand.

local getinfo, getmetatable, ipairs, loaded, rawget, require, type =
  debug.getinfo, getmetatable, ipairs, package.loaded, rawget, require, type

local core = require "async_mutex.core"

local M = {}

--- Makes the calling module a chunk of the Lua layer (core.layer): its
-- frames are passed over when an error looks for the user's call.
function M.join_layer()
  core.layer(getinfo(2, "S").source, {})
end
M.join_layer()

--- The type a usage error names: a metatable's __name, else type(v).
function M.typename(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__name")) == "string"
    and mt.__name or type(v)
end

--- The type names of the Redis locks, plain and decorated (redis_lock.lua),
-- which am.withLease and debug mode refuse by name (docs/api.md, Debugging a
-- hang): exactly these, not every name with "Redis" in it (a RedisReleaser
-- is no lock).
M.REDIS_LOCKS = {}
for _, kind in ipairs({ "RedisMutex", "RedisSemaphore", "KeyedRedisMutex",
                        "RedisReentrantMutex", "RedisRWLock", "KeyedRedisRWLock",
                        "RedlockMutex" }) do
  M.REDIS_LOCKS["async_mutex." .. kind] = true
  M.REDIS_LOCKS["async_mutex.decorated " .. kind] = true
end

--- Whether f can be called: a function, or a value whose metatable has __call.
function M.is_callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

--- argerror(n, fname, msg): raises "bad argument #n to 'fname' (msg)" at
-- the user's call; typeerror(n, fname, expected, value): the same saying
-- "<expected> expected, got <value's type>"; usage_error(msg): raises msg
-- there.
M.argerror, M.typeerror, M.usage_error = core.argerror, core.typeerror, core.usage_error

--- The complaint about the first key of 'options' that the set 'known'
-- lacks ("unknown option 'tll'"), or nil: a misspelt option is an error,
-- not a default silently kept.  The C core owns the text (src/core/args/args.c), as
-- its own option tables (KeyedMutex.new, withLease) are checked there.
M.unknown_option = core.unknown_option

--- The complaint about attempting 'act' ("acquire a Redis lock") where
-- the running coroutine cannot yield, or nil when it can: "attempt to
-- <act> outside a coroutine" on the main thread, "attempt to <act> where
-- the coroutine cannot yield (...)" in a metamethod or a function called
-- from C.  The C core owns the words (src/core/args/args.c), as the core locks'.
M.cannot_yield = core.cannot_yield

--- Raises "attempt to use a closed redis client" at the user's call when
-- 'client' is an async_mutex.redis client that was closed: a call would
-- raise it at the line of the module's own call.
local rcore                 -- async_mutex.redis_core, loaded at the first check
M.CLOSED_CLIENT = "attempt to use a closed redis client"
function M.check_open(client)
  if M.is_closed(client) then M.usage_error(M.CLOSED_CLIENT) end
end

--- Whether 'client' is an async_mutex.redis client that was closed (none
-- is before that module is loaded: this one does not load it).
function M.is_closed(client)
  local redis = loaded["async_mutex.redis"]
  if not (redis and redis._internal.is_client(client)) then return false end
  if not rcore then rcore = require "async_mutex.redis_core" end
  return rcore.status(client) == "closed"
end

return M
