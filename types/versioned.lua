---@meta

-- LuaLS annotations of the versioned values of `require "async_mutex.redis"`
-- (`redis.versioned(client, key)`).  docs/api.md, "Optimistic concurrency", is
-- the reference; spec/49-versioned_spec.lua checks that every method is
-- annotated here and documented there.

---A value stored in Redis with a version that only grows (one hash:
---`value` and `version`), written only by a client that read the current
---version.  Values are strings (numbers are converted); versions are exact
---integers up to 2^63 - 1, which has no successor (a write there raises).
---@class async_mutex.redis.Versioned
---@field key string the Redis key
---@field client async_mutex.redis.Client the client it talks through
local Versioned = {}

---The value (`nil` when absent or deleted) and its version (0 when the key
---was never written).
---@async
---@return string? value
---@return integer version
function Versioned:get() end

---Writes `value` if the stored version is still `expected_version`, in one
---atomic step.  Returns the new version, or `false` on a conflict (nothing
---written).
---@async
---@param value string|number
---@param expected_version integer
---@return integer|false
function Versioned:set(value, expected_version) end

---Removes the value if the stored version is still `expected_version`; the
---version stays, incremented, so that it is never reused.  Returns the
---version after it, or `false` on a conflict (nothing removed).
---@async
---@param expected_version integer
---@return integer|false
function Versioned:delete(expected_version) end

---`async_mutex.optimistic` around `get` and `set`: calls
---`fn(value, version, attempt)`, writes what it returns if nobody wrote in
---between, else calls it again.  Raise in `fn` to give up (nothing is
---written).  Returns the value written and its version.
---@async
---@param fn fun(value: string?, version: integer, attempt: integer): string|number
---@param options? async_mutex.OptimisticOptions
---@return string value
---@return integer version
function Versioned:update(fn, options) end

return Versioned
