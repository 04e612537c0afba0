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
-- redis.E_UNAVAILABLE` holds for each one, whatever its reason.  They are
-- read-only: the constant is shared by every caller.

local error, getmetatable, rawset, setmetatable, tostring =
  error, getmetatable, rawset, setmetatable, tostring

local MESSAGE = "redis server unavailable"

local MT = { __name = "async_mutex.E_UNAVAILABLE" }

-- Lua calls __eq only when both sides are tables (or both userdata) and
-- not the same one: a string is never equal to these errors.
function MT.__eq(a, b)
  return getmetatable(a) == MT and getmetatable(b) == MT
end

function MT.__tostring(e) return e.message end

function MT.__newindex(_, k)
  error(("attempt to change field '%s' of E_UNAVAILABLE"):format(tostring(k)), 2)
end

local function make(message, reason)
  local e = {}
  rawset(e, "message", message)
  rawset(e, "reason", reason)
  return setmetatable(e, MT)
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
