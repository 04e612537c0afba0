-- Development rockspec: builds the checkout it sits in.  It is also the
-- template of the release rockspecs: list a new module here (one line in
-- build.modules) and `make rock` carries it into the release.
--
--   luarocks --lua-version 5.4 make --deps-mode=none   # luv from Debian's lua-luv
--   luarocks --lua-version 5.4 make                    # luv from luarocks.org
--   luarocks --lua-version 5.4 test                    # the busted suite
--
-- Only `luarocks make`, run in the checkout, can use it: the project has no
-- public repository yet, so `source` below names nothing luarocks can fetch,
-- and `luarocks install async-mutex-scm-1.rockspec` or `luarocks pack` fail
-- (git: "repository '.' does not exist").  To install elsewhere, `make rock`
-- packs a source rock that installs with no checkout and no network:
--   luarocks --lua-version 5.4 install ./async-mutex-0.1.0-1.src.rock
--
-- luv is a real run-time dependency and is declared as one.  Debian's lua-luv
-- package is not a rock, so luarocks does not see it: on Debian, either pass
-- --deps-mode=none, or declare it provided once with
--   luarocks --lua-version 5.4 config --scope user rocks_provided.luv 1.44.2-0
rockspec_format = "3.0"
package = "async-mutex"
version = "scm-1"

source = {
  url = "git+file://.",                 -- no public repository yet: see above
}

description = {
  summary = "async-mutex's locks for Lua 5.4 coroutines on a luv event loop, and on Redis",
  detailed = [[
A port of the JavaScript library async-mutex to Lua 5.4 coroutines running on
luv (libuv).  Mutex and Semaphore with priorities and weights, runExclusive,
waitForUnlock, cancel, and the withTimeout and tryAcquire decorators, with the
same vocabulary and error values as async-mutex; keyed locks, a
readers-writer lock, a reentrant mutex and leases.  acquire() suspends the
calling coroutine until the lock is granted; waiters are resumed from the luv
loop.  The releaser is also a to-be-closed value:
`local release <close> = mutex:acquire()`.  The core is written in C.  Also a
Redis client on the same loop (hiredis), Redis locks with fair hand-off,
leases and fencing tokens, and optimistic versioned writes.
]],
  license = "MIT",
  labels = { "coroutine", "mutex", "semaphore", "luv", "libuv", "async" },
}

external_dependencies = {
  HIREDIS = { header = "hiredis/hiredis.h" },
}

dependencies = {
  "lua >= 5.4",
  "luv >= 1.30",                        -- Debian: lua-luv (see above)
}

build = {
  type = "builtin",
  modules = {
    -- No Lua library is linked in: the interpreter already holds the Lua core.
    ["async_mutex.core"] = {
      sources = {
        "src/args.c",
        "src/core.c",
        "src/debug.c",
        "src/decorated.c",
        "src/error_text.c",
        "src/keyed.c",
        "src/lease.c",
        "src/mutex_semaphore.c",
        "src/queue.c",
        "src/reentrant.c",
        "src/rules.c",
        "src/rwlock.c",
        "src/scheduler.c",
        "src/task.c",
        "src/waiter.c",
      },
      incdirs = { "$(LUA_INCDIR)" },
    },
    async_mutex = "src/async_mutex/init.lua",
    -- The Redis client (docs/redis.md): hiredis from the system (Debian:
    -- libhiredis-dev).
    ["async_mutex.redis_core"] = {
      sources = { "src/redis/redis.c", "src/redis/reply.c", "src/error_text.c" },
      libraries = { "hiredis", "uv" },
      incdirs = { "$(LUA_INCDIR)", "$(HIREDIS_INCDIR)" },
      libdirs = { "$(HIREDIS_LIBDIR)" },
    },
    ["async_mutex.redis"] = "src/async_mutex/redis.lua",
    ["async_mutex.optimistic"] = "src/async_mutex/optimistic.lua",
    ["async_mutex.versioned"] = "src/async_mutex/versioned.lua",
    ["async_mutex.redis_lock"] = "src/async_mutex/redis_lock.lua",
    ["async_mutex.redis_lock_base"] = "src/async_mutex/redis_lock_base.lua",
    ["async_mutex.redis_reentrant"] = "src/async_mutex/redis_reentrant.lua",
    ["async_mutex.redis_rwlock"] = "src/async_mutex/redis_rwlock.lua",
    ["async_mutex.redis_multi"] = "src/async_mutex/redis_multi.lua",
    ["async_mutex.redlock"] = "src/async_mutex/redlock.lua",
    ["async_mutex.redis_scripts"] = "src/async_mutex/redis_scripts.lua",
    ["async_mutex.checks"] = "src/async_mutex/checks.lua",
    ["async_mutex.debug"] = "src/async_mutex/debug.lua",
  },
  -- Installed beside the rock (luarocks show --rock-dir async-mutex): the
  -- LuaLS annotations, for editors, and the examples.
  copy_directories = { "types", "examples" },
}

test = {
  type = "command",
  command = "lua5.4 /usr/bin/busted",   -- the system `lua` may be 5.1
}
