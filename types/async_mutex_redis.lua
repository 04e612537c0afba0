---@meta async_mutex.redis

-- LuaLS annotations of `require "async_mutex.redis"`, the Redis client on
-- luv's loop (src/async_mutex/redis.lua and src/redis/).  docs/api.md's
-- "Redis" section is the reference.
-- luacheck: ignore 241 (definition tables: mutated, never read)

---Where the server is: `host` (a name or a numeric address, default
---"127.0.0.1") and `port` (default 6379), or `path`, a unix socket (not
---both).  Any other field is an error.
---@class async_mutex.redis.Options
---@field host? string
---@field port? integer
---@field path? string
---@field password? string sent with AUTH on every connection
---@field username? string with `password`: AUTH username password
---@field db? integer sent with SELECT on every connection
---@field connectTimeout? number ms, positive (default 2000; `math.huge`: none)
---@field commandTimeout? number ms without a reply while calls wait, positive (default 5000; `math.huge`: none)
---@field reconnectDelay? number ms, the first back-off after a failed attempt, finite (default 50)
---@field reconnectDelayMax? number ms, the longest back-off, finite (default 2000)
---@field pingInterval? number ms a subscriber hears nothing before it sends PING (default 15000; `math.huge`: never)
---@field sentinels? async_mutex.redis.Sentinel[] follow `master` through these sentinels (no host, port, path)
---@field master? string the master's name in the sentinels (with `sentinels`)
---@field sentinelPassword? string AUTH on the connections to the sentinels
---@field sentinelUsername? string with `sentinelPassword`: AUTH username password
---@field cluster? {host?: string, port: integer}[] seed nodes of a Redis Cluster: `connect`
---returns an `async_mutex.redis.ClusterClient` (excludes host, port, path, db)

---A sentinel of `redis.connect`'s `sentinels` list.
---@class async_mutex.redis.Sentinel
---@field host string
---@field port integer

---A subscription made by `client:subscribe`.
---@class async_mutex.redis.Subscription
local Subscription = {}

---Ends the subscription (the channel is unsubscribed with its last one).
function Subscription:unsubscribe() end

---An error reply of the server, raised by `call` and `eval`: a table with
---`message` (the server's text, as `tostring` gives it) and `code` (its
---first word when in capitals, such as "WRONGTYPE" or "NOSCRIPT", else "ERR").
---@class async_mutex.redis.Error
---@field message string the server's text
---@field code string its first word when in capitals ("WRONGTYPE"), else "ERR"

---One connection to a Redis server, shared by every coroutine that calls.
---@class async_mutex.redis.Client
local Client = {}

---Sends a command and suspends the calling coroutine until its reply.
---Raises an `async_mutex.redis.Error` for an error reply and
---`async_mutex.E_UNAVAILABLE` when the server cannot be reached.
---@async
---@param ... string|number the command and its arguments
---@return any reply string, integer, nil, or a table with field n
function Client:call(...) end

---Runs a Lua script on the server (EVALSHA, EVAL when the server does not
---know it).
---@async
---@param script string
---@param keys? (string|number)[]
---@param args? (string|number)[]
---@return any reply
function Client:eval(script, keys, args) end

---Calls `fn(message, channel)`, each time in a new coroutine, for every
---message published on `channel`; waits until the server confirms.
---@async
---@param channel string
---@param fn fun(message: string, channel: string)
---@return async_mutex.redis.Subscription
function Client:subscribe(channel, fn) end

---The same as `subscribe` for a shard channel (SSUBSCRIBE, Redis 7).
---@async
---@param channel string
---@param fn fun(message: string, channel: string)
---@return async_mutex.redis.Subscription
function Client:ssubscribe(channel, fn) end

---Closes the connection: calls in flight raise `E_UNAVAILABLE`; later calls
---are errors.  The client's Redis locks end their holds here (releasers
---return `false`) and their waiters raise `E_UNAVAILABLE` at once.
function Client:close() end

---Calls sent or queued whose reply has not come yet.
---@return integer
function Client:pending() end


---A client of a Redis Cluster (`redis.connect{cluster = ...}`): one
---client per node, each command routed by its keys' slot (docs/redis.md,
---"Cluster").  Also takes the Redis locks.
---@class async_mutex.redis.ClusterClient
local ClusterClient = {}

---Sends a command to the master of its keys' slot (any master if it has
---none), following MOVED and ASK; keys in several slots are an error.
---@async
---@param ... string|number the command and its arguments
---@return any reply
function ClusterClient:call(...) end

---Runs a script on the master of its keys' slot (they must share one).
---@async
---@param script string
---@param keys? (string|number)[]
---@param args? (string|number)[]
---@return any reply
function ClusterClient:eval(script, keys, args) end

---Subscribes `fn` to a (classic) channel, on one node of the cluster.
---@async
---@param channel string
---@param fn fun(message: string, channel: string)
---@return async_mutex.redis.Subscription
function ClusterClient:subscribe(channel, fn) end

---Subscribes `fn` to a shard channel on the master of its slot, and again
---on the slot's next owner when it moves.
---@async
---@param channel string
---@param fn fun(message: string, channel: string)
---@return async_mutex.redis.ShardSubscription
function ClusterClient:ssubscribe(channel, fn) end

---A cluster's subscription to a shard channel.
---@class async_mutex.redis.ShardSubscription
local ShardSubscription = {}

---Ends it (never waits).
function ShardSubscription:unsubscribe() end

---Closes every node's client; the cluster's Redis locks end their holds.
function ClusterClient:close() end

---Calls in flight on every node.
---@return integer
function ClusterClient:pending() end

---The slot of a key (CRC16 of its hash tag, or of the whole key).
---@param key string|number
---@return integer
function ClusterClient:keyslot(key) end

---The ordinary clients of the masters, in the order of their first slots.
---@async
---@return async_mutex.redis.Client[]
function ClusterClient:masters() end

---The redirections followed so far.
---@return integer moved
---@return integer asked
function ClusterClient:redirections() end

---@class async_mutex.redis
local redis = {}

---Raised by calls the server cannot answer, with the reason (also
---`async_mutex.E_UNAVAILABLE`); every such error is `==` to it.
---@type async_mutex.E_UNAVAILABLE
redis.E_UNAVAILABLE = {}

---A client for the server at `options` (none: 127.0.0.1:6379); it connects at its first call.
---With `options.cluster`, a client of that Redis Cluster.
---@param options? async_mutex.redis.Options
---@return async_mutex.redis.Client|async_mutex.redis.ClusterClient
function redis.connect(options) end

---The versioned value stored at `key` (a hash: value and version), for
---optimistic concurrency: see `async_mutex.redis.Versioned`.
---@param client async_mutex.redis.Client
---@param key string
---@return async_mutex.redis.Versioned
function redis.versioned(client, key) end

return redis
