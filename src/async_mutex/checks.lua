--- async_mutex.checks: the argument checks the Lua modules of async_mutex
-- share (the Redis client, Redis locks, optimistic and versioned values), so
-- that their usage errors read alike: "bad argument #n to 'fname' (msg)".
-- init.lua keeps its own argerror, which finds the user's frame itself.

local error, getmetatable, rawget, tostring, type =
  error, getmetatable, rawget, tostring, type

local M = {}

--- The type a usage error names: a metatable's __name, else type(v).
function M.typename(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__name")) == "string"
    and mt.__name or type(v)
end

--- Whether f can be called: a function, or a value whose metatable has __call.
function M.is_callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

--- The complaint about an options table's key 'k' that no option has (a
-- misspelt `commandTimout` is an error, not a default silently kept).
function M.unknown_option(k)
  return ("unknown option '%s'"):format(tostring(k))
end

--- Raises an argument error at 'level' (1 = the caller of argerror).
function M.argerror(level, n, fname, msg)
  error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), level + 1)
end

return M
