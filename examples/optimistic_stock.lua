-- Four processes sell the same item, kept in Redis as a versioned value,
-- with no lock: each sale is versioned:update, a read and a write that only
-- goes through if nobody wrote in between (else it reads again and
-- retries).  However the sales interleave, exactly the stock is sold.
--
--   make && lua5.4 examples/optimistic_stock.lua
--
-- It starts a throw-away redis-server in a temporary directory (stopped at
-- the end), puts 100 units of stock:42 there, and starts four seller
-- processes (this script with the argument "sell"), each running 25
-- coroutines that sell one unit at a time until none is left.  It exits with
-- status 0 when exactly the stock was sold, 1 otherwise.

-- Find the module in this checkout (src/, build/ beside examples/), from
-- any directory; harmless once installed.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/src/?.lua;" .. root .. "/src/?/init.lua;" .. package.path
package.cpath = root .. "/build/?.so;" .. package.cpath

local uv = require "luv"
local am = require "async_mutex"
local redis = require "async_mutex.redis"

local STOCK, SELLERS, COROUTINES = 100, 4, 25
local SOLD_OUT = setmetatable({}, { __name = "sold out" })

-- {========================================================== a seller
-- lua5.4 examples/optimistic_stock.lua sell SOCKET ID
local function sell(socket, id)
  local sold, attempts = 0, 0
  -- am.run raises the first failure (the exit status is then 1), after the
  -- group has cancelled the other sellers
  local ok, err = pcall(am.run, function()
    local client = redis.connect({ path = socket })
    local stock = redis.versioned(client, "stock:42")
    local sellers = am.group()
    for _ = 1, COROUTINES do
      sellers:spawn(function()
        while true do
          local ok, err = pcall(stock.update, stock, function(value)
            attempts = attempts + 1
            local left = tonumber(value)
            if left < 1 then error(SOLD_OUT) end    -- give up: nothing is written
            return left - 1
          end, { maxAttempts = math.huge })
          if not ok then
            if err == SOLD_OUT then break end
            error(err, 0)
          end
          sold = sold + 1
        end
      end)
    end
    local joined, failure = pcall(sellers.join, sellers)
    client:close()
    if not joined then error(failure, 0) end
  end)
  print(("process %s sold %d (%d attempts)"):format(id, sold, attempts))
  if not ok then error(err, 0) end
end
-- }==========================================================

if arg[1] == "sell" then return sell(arg[2], arg[3]) end

-- {========================================================== the shop
local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

-- The server and its temporary directory are removed however this script
-- ends (at its end, on an error, by Ctrl-C at any moment, even kill -9): a
-- keeper process in a session of its own (Ctrl-C does not reach it) makes
-- the directory, starts the server, and removes both once this process is
-- gone.  It prints the directory first, then lets go of our pipe.
-- (the server writes its log until it exits: remove the directory after,
-- waiting 5 s at most.  The keeper starts the server as its own child and
-- knows its pid at once: a script killed before the server wrote its pid
-- file must not leave it running.)
local STOP = [[
pid=${server:-$(cat "$dir/redis.pid" 2>/dev/null)}
if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
  wait "$pid" 2>/dev/null ||
    for _ in $(seq 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
fi
rm -rf "$dir"
]]
local keeper = ([[
trap '' INT HUP PIPE    # (PIPE: this process may be gone before our echo)
dir=$(mktemp -d "${TMPDIR:-/tmp}/optimistic-stock-XXXXXX")
[ -d "$dir" ] || exit 1   # (the directory, not mktemp's status: a tool run under
                          # a preloaded sanitizer can fail at its exit after its work)
echo "$dir"
exec >/dev/null 2>&1 </dev/null
redis-server --port 0 --unixsocket "$dir/redis.sock" --save '' --appendonly no \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir" &
server=$!
while kill -0 %d; do sleep 0.1; done
]]):format(uv.os_getpid()) .. STOP
local dir = sh(("setsid sh -c %s &"):format(quote(keeper))):gsub("\n$", "")
local socket = dir .. "/redis.sock"

local function stop_server()
  sh(("dir=%s\n%s"):format(quote(dir), STOP))
end

local ok, err = pcall(function()
  for _ = 1, 500 do                       -- wait for the socket (5 s at most)
    if os.execute("test -S " .. socket) then break end
    uv.sleep(10)
  end

  am.run(function()
    local client = redis.connect({ path = socket })
    assert(redis.versioned(client, "stock:42"):set(STOCK, 0))
    client:close()
  end)
  print(("stock:42 holds %d units; %d processes x %d coroutines sell them")
    :format(STOCK, SELLERS, COROUTINES))

  local sellers = {}
  for i = 1, SELLERS do
    -- this interpreter and this script, quoted for the shell
    sellers[i] = assert(io.popen(("%s %s sell %s %d"):format(quote(uv.exepath()),
      quote(arg[0]), quote(socket), i)))
  end
  local sold = 0
  for i = 1, SELLERS do
    local line = sellers[i]:read("a")
    assert(sellers[i]:close(), "seller " .. i .. " failed")
    io.write(line)
    sold = sold + tonumber(line:match("sold (%d+)"))
  end

  am.run(function()
    local client = redis.connect({ path = socket })
    local left, version = redis.versioned(client, "stock:42"):get()
    client:close()
    left = tonumber(left)
    print(("sold %d of %d, stock left %d, version %d: %s"):format(sold, STOCK, left,
      version, sold + left == STOCK and left == 0 and "nothing oversold" or "WRONG"))
    if sold + left ~= STOCK or left ~= 0 then error("oversold", 0) end
  end)
end)
stop_server()
if not ok then error(err, 0) end
-- }==========================================================
