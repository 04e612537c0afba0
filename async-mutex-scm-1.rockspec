-- Development rockspec: builds the checkout it sits in.  It is also the
-- template of the release rockspecs (`make rock`).  The Makefile builds and
-- installs the modules (rock-build, rock-install): a new C file of
-- src/core/'s layer folders or a new src/async_mutex/*.lua needs no line
-- here.
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

dependencies = {
  "lua >= 5.4",
  "luv >= 1.30",                        -- Debian: lua-luv (see above)
}

-- The C modules are built by the Makefile (rock-build, rock-install), so
-- that the Redis client's C part is built only where hiredis, its one
-- external dependency (Debian: libhiredis-dev), is found: elsewhere the
-- rest installs, and `require "async_mutex.redis"` says what is missing
-- (luarocks' builtin build would refuse the whole rock).  Only Lua's
-- headers are needed: no luv or libuv header, no libuv link.  hiredis in
-- another prefix: HIREDIS_INCDIR=... HIREDIS_LIBDIR=... in the environment.
build = {
  type = "make",
  build_target = "rock-build",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "$(LUA_INCDIR)",
  },
  install_target = "rock-install",
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_LUADIR = "$(LUADIR)",
  },
  -- Installed beside the rock (luarocks show --rock-dir async-mutex): the
  -- examples.  The LuaLS annotations go with the modules (rock-install),
  -- where an upgrade does not move them.
  copy_directories = { "examples" },
}

test = {
  type = "command",
  command = "lua5.4 /usr/bin/busted",   -- the system `lua` may be 5.1
}
