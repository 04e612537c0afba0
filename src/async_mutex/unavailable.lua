--- async_mutex.unavailable: E_UNAVAILABLE, the error of a Redis server that
-- cannot be reached, and the errors that say why (docs/redis.md,
-- Failures).  Defined here once, in Lua, for async_mutex (whose
-- E_UNAVAILABLE must not need hiredis), the Redis client's C part and the
-- Redis locks.
--
-- Every such error is a table with this module's metatable: `message`
-- ("redis server unavailable: connection refused to 127.0.0.1:6380", also
-- what tostring gives) and `reason` (the part after the colon; nil
-- for the constant itself, which the Redis locks raise when their client
-- was closed).  Any two of them are equal (__eq), so `err ==
-- redis.E_UNAVAILABLE` holds for each one, whatever its reason.  The fields
-- are plain (a logger that walks the table sees them); one object is
-- shared by every call a failure ends, and the constant by everyone, so
-- they are not to be changed.

local getmetatable, setmetatable = getmetatable, setmetatable

local MESSAGE = "redis server unavailable"

local MT = { __name = "async_mutex.E_UNAVAILABLE" }

-- Lua calls __eq only when both sides are tables (or both userdata) and
-- not the same one: a string is never equal to these errors.
function MT.__eq(a, b)
  return getmetatable(a) == MT and getmetatable(b) == MT
end

function MT.__tostring(e) return e.message end

local function make(message, reason)
  return setmetatable({ message = message, reason = reason }, MT)
end

local M = {
  E_UNAVAILABLE = make(MESSAGE, nil),
}

--- The E_UNAVAILABLE that says why (a non-empty string).
function M.new(reason)
  return make(MESSAGE .. ": " .. reason, reason)
end

--- Whether v is an E_UNAVAILABLE (with or without a reason).
function M.is(v)
  return getmetatable(v) == MT
end

return M
