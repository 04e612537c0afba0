-- RedisRWLock's scripts in Redis (docs/redis-locks.md, "RedisRWLock" and
-- "In Redis"), run straight by random requests: readers and writers of
-- many processes acquire (try, wait, again), release, renew, with short
-- leases and waiter deadlines that run out, so that the short paths, the
-- batch dispatch and the expiry of dead holders and heads all meet.
-- After each request, what Redis holds is checked: a writer holds alone;
-- each new grant's fence is above every fence given before; no grant
-- passes a live writer still queued, nor a live waiter that arrived
-- earlier.  Spec 276 has the orders of requests told one by one; these
-- are the ones nobody thought of (fixed seeds: a failure is repeatable).

local uv = require "luv"
local h = require "helpers"
local R = require "lock_redis"
local scripts = require "async_mutex.redis_scripts"

local server = R.file_server(setup, teardown)

local LIMIT = tostring(1 << 40)         -- a write's weight, the limit

-- Runs `ops` random requests on the fresh lock `name` (R.random_script_cases
-- seeded math.random with `seed`); returns nil, or what went wrong (with
-- the seed and the request's number).
local function run(c, seed, name, ops, ev, server_ms)
  local rnd = math.random
  local keys = scripts.keys(name)
  local tokens, weight, arrival, fence_of = {}, {}, {}, {}
  local max_fence = 0
  for op = 1, ops do
    local k = rnd(10)
    local before = {}
    local all = c:call("HGETALL", keys[1])
    for i = 1, #all, 2 do before[all[i]] = true end
    if k <= 5 or #tokens == 0 then
      local tok = ("p%d:%d"):format(rnd(3), #tokens + 1)
      weight[tok] = rnd(3) == 1 and LIMIT or "1"
      tokens[#tokens + 1] = tok
      local r = ev(scripts.acquire, tok, LIMIT, weight[tok], tostring(({ 5, 50, 2000 })[rnd(3)]),
        tostring(({ 5, 2000 })[rnd(2)]), "ch", ({ "try", "wait", "wait" })[rnd(3)])
      if r[1] == 0 and r[3] then arrival[tok] = tonumber(r[3]) end
    elseif k <= 7 then
      ev(scripts.release, tokens[rnd(#tokens)], LIMIT)
    elseif k == 8 then
      local tok = tokens[rnd(#tokens)]
      local r = ev(scripts.acquire, tok, LIMIT, weight[tok], "2000", "2000", "ch", "again")
      if r[1] == 0 and r[3] and not arrival[tok] then arrival[tok] = tonumber(r[3]) end
    elseif k == 9 then
      ev(scripts.renew, tokens[rnd(#tokens)], LIMIT, "2000")
    else
      uv.sleep(rnd(0, 8))
    end
    -- (a lease or a deadline within 2 ms of its end may end before the
    -- next read: counted as ended)
    local now = server_ms() + 2
    all = c:call("HGETALL", keys[1])
    local live, writers, new = 0, 0, {}
    for i = 1, #all, 2 do
      local e, f = all[i + 1]:match("^(%d+) %d+ (%d+)")
      f = tonumber(f)
      if tonumber(e) >= now then
        live = live + 1
        if weight[all[i]] == LIMIT then writers = writers + 1 end
      end
      if fence_of[all[i]] ~= f then new[#new + 1] = { tok = all[i], f = f } end
    end
    if writers > 0 and live > 1 then
      return ("seed %d, request %d: a writer beside %d others"):format(seed, op, live - 1)
    end
    table.sort(new, function(a, b) return a.f < b.f end)
    for _, n in ipairs(new) do
      if n.f <= max_fence then
        return ("seed %d, request %d: fence %d not above %d"):format(seed, op, n.f, max_fence)
      end
      fence_of[n.tok], max_fence = n.f, n.f
    end
    local q = c:call("ZRANGE", keys[2], 0, -1, "WITHSCORES")
    for i = 1, #q, 2 do
      local d = c:call("ZSCORE", keys[3], q[i])
      local n = tonumber(q[i + 1])
      if d and tonumber(d) >= now then           -- a live waiter
        for _, g in ipairs(new) do
          local a = arrival[g.tok]
          if not before[g.tok] and weight[q[i]] == LIMIT and (not a or a > n) then
            return ("seed %d, request %d: %s granted past the queued writer %s"):format(
              seed, op, g.tok, q[i])
          end
          if a and a > n then
            return ("seed %d, request %d: %s (arrival %d) granted before %s (%d), queued ahead"):format(
              seed, op, g.tok, a, q[i], n)
          end
        end
      end
    end
  end
end

describe("RedisRWLock's scripts under random requests", function()
  R.random_script_cases(it, server, run, "spec278", 200,
    "keep a writer alone, fences rising, the queue's order (seed %d)")
end)
