-- The manual's code for the Redis client and for optimistic concurrency, run
-- as written (taken from README.md and docs/api.md themselves, so that the
-- manual cannot drift from the code), each in a child lua5.4 against a real
-- redis-server: README's "Redis" example; in docs/api.md the versioned
-- value's `update`, the error-handling snippet of "Errors:
-- redis.E_UNAVAILABLE, async_mutex.redis.Error", and the `am.optimistic`
-- loop over a SQL-shaped store.  A snippet that would only
-- run inside a coroutine, or needs a `client` or `db`, is given one by a
-- few lines around it; the snippet's own text is not changed beyond its
-- server address and its `...` placeholders.
local h = require "helpers"
local redis_server = require "redis_server"

local ROOT = h.ROOT

local readme = h.read_file(ROOT .. "/README.md")
local api = h.read_file(ROOT .. "/docs/api.md")

--- The first ```lua block after the heading `heading` (a line of `text`,
-- README.md unless given).
local function block_after(heading, text)
  text = text or readme
  local at = text:find("\n" .. heading .. "\n", 1, true)
  assert(at, "no heading " .. heading)
  local code = text:match("\n```lua\n(.-)```\n", at)
  assert(code, "no lua block after " .. heading)
  return code
end

local function plain(s) return (s:gsub("%p", "%%%0")) end

local server = redis_server.for_file(setup, teardown)

local function run(code)
  local r = h.subprocess(code)
  return h.clean_exit(r)
end

describe("README's Redis snippets", function()
  it("the Redis example prints the value it set and the script's result, and ends", function()
    local code = block_after("## Redis")
    local address = "port = 6379"
    assert.truthy(code:find(address, 1, true), "the example does not connect to " .. address)
    code = code:gsub(plain(address), "port = " .. server.port)
    assert.equal("hello\n1\n", run(code))
  end)

  it("versioned:update sells one unit, and gives up with its own error when sold out",
    function()
      local code = block_after("### `redis.versioned(client, key)`", api)
      local out = run(([[
        local uv = require "luv"
        local am = require "async_mutex"
        local client = require("async_mutex.redis").connect({ path = %q })
        am.spawn(function()
          client:call("DEL", "stock:42")
          assert(require("async_mutex.redis").versioned(client, "stock:42"):set(1, 0))
          for _ = 1, 2 do
            local ok, err = pcall(function()
              %s
              print(left, version)
            end)
            if not ok then print((err:gsub("^[^:]*:%%d+: ", ""))) end
          end
          client:close()
        end)
        uv.run()
      ]]):format(server.path, code))
      assert.equal("0\t2\nsold out\n", out)
    end)

  it("the error-handling snippet tells E_UNAVAILABLE from an error reply", function()
    local section = api:match("\n### Errors: `redis%.E_UNAVAILABLE`.-\n(.-)\n###")
    local code = section and section:match("\n```lua\n(.-)```\n")
    assert.is_string(code)
    local port = redis_server.free_port()
    local out = run(([[
      local uv = require "luv"
      local am = require "async_mutex"
      local redis = require "async_mutex.redis"
      am.spawn(function()
        for _, where in ipairs({ { path = %q }, { port = %d } }) do
          local client = redis.connect(where)
          pcall(client.call, client, "SET", "a-string-key", "x")
          %s
          client:close()
        end
      end)
      uv.run()
    ]]):format(server.path, port, code))
    -- the reason: the SET before it was refused, and the back-off is on
    assert.matches("^WRONGTYPE Operation against a key holding the wrong kind of value\n"
      .. "connection refused to 127%.0%.0%.1:" .. port .. " %(next attempt in %d+ ms%)\n$", out)
  end)
end)

describe("docs/api.md's am.optimistic snippet", function()
  it("over a SQL-shaped store that two writers share: each sells once, the loser retries",
    function()
      local code = block_after("## Optimistic concurrency", api)
      -- a store with the two calls the snippet makes; `exec` yields, so
      -- that the two buyers interleave and one loses its first write
      local out = run(([[
        local uv = require "luv"
        local am = require "async_mutex"
        local row = { stock = 3, version = 7 }
        local db = {}
        function db:select() return row.stock, row.version end
        function db:exec(_, stock, _, version)
          am.sleep(1)
          if row.version ~= version then return 0 end
          row.stock, row.version = stock, row.version + 1
          return 1
        end
        for buyer = 1, 2 do
          am.spawn(function()
            %s
            print(buyer, bought)
          end)
        end
        uv.run()
        print(row.stock, row.version)
      ]]):format(code))
      assert.equal("1\ttrue\n2\ttrue\n1\t9\n", out)
    end)
end)
