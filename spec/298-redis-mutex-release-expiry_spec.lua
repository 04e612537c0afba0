-- A mutex's release script is one HDEL when nobody waits (docs/redis-locks.md,
-- "In Redis"): it reads neither its record's end nor the clock, because a
-- mutex's N:h holds one record at most and expires with it, so a record
-- still there is a lease still running.  Run straight by random requests
-- of a mutex (limit 1: try, wait, again, release, renew, steal), with short
-- leases and waiter deadlines that run out (each token with its own ttl,
-- as each process renews with its lock's), this checks that rule after
-- every request: N:h holds at most one record and expires exactly at its
-- end; and that every release answers 1 exactly when its token's lease
-- ran (fixed seeds: a failure is repeatable).

local uv = require "luv"
local h = require "helpers"
local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local server = R.file_server(setup, teardown)

-- Runs `ops` random requests on the fresh lock `name` (R.random_script_cases
-- seeded math.random with `seed`); returns nil, or what went wrong (with
-- the seed and the request's number).
local function run(c, seed, name, ops, ev, server_ms)
  local rnd = math.random
  local keys = scripts.keys(name)
  local tokens, ttl_of = {}, {}
  local function new_token()
    local tok = ("p%d:%d"):format(rnd(3), #tokens + 1)
    tokens[#tokens + 1] = tok
    ttl_of[tok] = tostring(({ 3, 20, 2000 })[rnd(3)])
    return tok
  end
  for op = 1, ops do
    local k = rnd(12)
    if k <= 5 or #tokens == 0 then
      local tok = new_token()
      ev(scripts.acquire, tok, "1", "1", ttl_of[tok], tostring(({ 3, 2000 })[rnd(2)]), "ch",
         ({ "try", "wait", "wait" })[rnd(3)])
    elseif k <= 8 then
      local tok = tokens[rnd(#tokens)]
      -- what the release must answer: its lease's end against the clock,
      -- read before and after it (a lease ending in between is skipped)
      local before, rec = server_ms(), c:call("HGET", keys[1], tok)
      local was = ev(scripts.release, tok, "1")
      local after = server_ms()
      local e = rec and tonumber(rec:match("^(%d+)"))
      if e and e >= after and was ~= 1 then
        return ("seed %d, request %d: release of a running lease answered %d"):format(seed, op, was)
      end
      if (not e or e < before) and was ~= 0 then
        return ("seed %d, request %d: release of no running lease answered %d"):format(seed, op, was)
      end
    elseif k == 9 then
      local tok = tokens[rnd(#tokens)]
      ev(scripts.acquire, tok, "1", "1", ttl_of[tok], "2000", "ch", "again")
    elseif k == 10 then
      local tok = tokens[rnd(#tokens)]
      ev(scripts.renew, tok, "1", ttl_of[tok])
    elseif k == 11 then
      local tok = new_token()
      ev(scripts.steal, tok, "1", "1", ttl_of[tok], "lost:")
    else
      uv.sleep(rnd(0, 6))
    end
    local all = c:call("HGETALL", keys[1])
    if #all > 2 then
      return ("seed %d, request %d: %d records in a mutex's N:h"):format(seed, op, #all // 2)
    end
    if #all == 2 then
      local e = tonumber(all[2]:match("^(%d+)"))
      local at = c:call("PEXPIRETIME", keys[1])
      -- (-2: the key is gone, its lease having ended since HGETALL)
      if at ~= e and not (at == -2 and e <= server_ms()) then
        return ("seed %d, request %d: N:h expires at %d, its one lease ends at %d"):format(
          seed, op, at, e)
      end
    end
  end
end

describe("a RedisMutex's scripts under random requests", function()
  R.random_script_cases(it, server, run, "spec298", 300,
    "keep one record in N:h, expiring with its lease; releases answer by it (seed %d)")
end)
