# async_mutex: developer entry point.  On a bare Debian 12, `sh setup.sh` (as
# root) installs what every target needs, make included; then `make demo`,
# `make test`.  Each target also installs what is missing (make deps).

LUA      ?= lua5.4
BUSTED   ?= /usr/bin/busted
CC       ?= gcc
LUA_INC  ?= /usr/include/lua5.4
# Link-time optimization lets the hot path cross the files of src/core/ (one
# file per concept, a folder per layer) as if they were one.  -fno-plt calls
# the Lua API through the GOT, bound at load, not through a PLT stub: one
# jump less per call (docs/bench.md, "What the API shape costs").  -O3
# inlines more of the hot path (the grant, the release) than -O2.
CFLAGS   ?= -O3 -g -flto -fno-plt
# -Werror is for this project's own builds; a user's compiler (the rock's
# build, rock-build below) may warn where ours does not.
WERROR   ?= -Werror
WARN      = -Wall -Wextra $(WERROR) -std=c99 -pedantic
ALLFLAGS  = $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden -I$(LUA_INC)
LDFLAGS  ?= -O3 -flto -fno-plt
# No -llua5.4: the interpreter that loads the module already holds the Lua core.
SOFLAGS  ?= -shared

# BUILD is where objects and the module go; sanitizer builds use their own.
BUILD    ?= build
# The core (async_mutex.core): src/core/, a folder per layer
# (docs/internals.md), and src/error_text.c, which the Redis client links too.
SRCS      = $(wildcard src/core/*/*.c) src/error_text.c
HDRS      = $(wildcard src/core/*.h src/core/*/*.h) src/error_text.h
OBJS      = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS))
MODULE    = $(BUILD)/async_mutex/core.so

# Lets scripts find the module in this checkout without installing it.
RUNENV    = LUA_PATH="src/?.lua;src/?/init.lua;;" LUA_CPATH="build/?.so;;"

.PHONY: FORCE all deps demo test bench clean asan valgrind gcstress lint rock

all: $(MODULE)

# The compiler and every flag, written down at each build: an object is out
# of date when they change (CFLAGS on the command line, an edit here), not
# only when its sources do.  The file is rewritten only when they differ.
FLAGS_STAMP = $(BUILD)/obj/flags
BUILD_FLAGS = $(CC) $(ALLFLAGS) $(HIREDIS_CFLAGS) $(SOFLAGS) $(LDFLAGS) $(HIREDIS_LIBS)
$(FLAGS_STAMP): FORCE | $(BUILD)/obj
	@printf '%s\n' '$(BUILD_FLAGS)' | cmp -s - $@ || printf '%s\n' '$(BUILD_FLAGS)' > $@
FORCE:

$(BUILD)/obj/%.o: src/%.c $(HDRS) $(FLAGS_STAMP) | $(BUILD)/obj
	@mkdir -p $(@D)
	$(CC) $(ALLFLAGS) -c $< -o $@

$(MODULE): $(OBJS) $(FLAGS_STAMP) | $(BUILD)/async_mutex
	$(CC) $(SOFLAGS) $(LDFLAGS) -o $@ $(OBJS)

$(BUILD)/obj $(BUILD)/async_mutex:
	mkdir -p $@

# async_mutex.redis_core (docs/redis.md): a shared object of its own, built
# only where hiredis is (its header and library, found by the compiler, or
# under HIREDIS_INCDIR and HIREDIS_LIBDIR, from the command line or the
# environment), so that async_mutex builds and installs without it:
# `require "async_mutex.redis"` then says what is missing.  hiredis is the
# Redis part's only external dependency: it includes no luv or libuv header
# and links no libuv (luv's public Lua API only).  NO_HIREDIS=1 builds as
# if hiredis were missing.
HIREDIS_CFLAGS = $(if $(HIREDIS_INCDIR),-I$(HIREDIS_INCDIR))
HIREDIS_LIBS   = $(if $(HIREDIS_LIBDIR),-L$(HIREDIS_LIBDIR)) -lhiredis
ifneq ($(NO_HIREDIS),1)
HIREDIS_H     := $(shell printf '\043include <hiredis/hiredis.h>\nint main(void) { redisReaderFree(redisReaderCreate()); return 0; }\n' \
                   | $(CC) -x c $(HIREDIS_CFLAGS) - -o /dev/null $(HIREDIS_LIBS) >/dev/null 2>&1 && echo yes)
endif
REDIS_SRCS   = $(wildcard src/redis/*.c)
# error_text.c is the core's and the client's: each module has its copy.
REDIS_OBJS   = $(patsubst src/redis/%.c,$(BUILD)/obj/redis/%.o,$(REDIS_SRCS)) \
               $(BUILD)/obj/error_text.o
REDIS_MODULE = $(BUILD)/async_mutex/redis_core.so
ifneq ($(HIREDIS_H),)
all: $(REDIS_MODULE)
endif

$(BUILD)/obj/redis/%.o: src/redis/%.c $(wildcard src/redis/*.h) src/error_text.h $(FLAGS_STAMP) | $(BUILD)/obj/redis
	$(CC) $(ALLFLAGS) $(HIREDIS_CFLAGS) -c $< -o $@

$(REDIS_MODULE): $(REDIS_OBJS) $(FLAGS_STAMP) | $(BUILD)/async_mutex
	$(CC) $(SOFLAGS) $(LDFLAGS) -o $@ $(REDIS_OBJS) $(HIREDIS_LIBS)

$(BUILD)/obj/redis:
	mkdir -p $@

# The Debian packages: setup.sh holds their one list, installs the missing
# ones when run as root, and otherwise names them and fails.
deps:
	@sh setup.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(RUNENV) $(LUA) examples/withdraw.lua

test: deps
	@$(MAKE) --no-print-directory all
	$(RUNENV) $(LUA) $(BUSTED)

# The suite against a module built with AddressSanitizer and UBSan (the
# interpreter is not instrumented, so the ASan runtime is preloaded).
SAN       = -fsanitize=address,undefined -fno-sanitize-recover=all
asan: deps
	@$(MAKE) --no-print-directory BUILD=build/asan \
	  CFLAGS="-O1 -g -fno-omit-frame-pointer $(SAN) -DANCHOR_BITS=3" \
	  LDFLAGS="$(SAN)" all
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so)" \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
	AM_STRESS_SCALE=0.1 \
	LUA_PATH="src/?.lua;src/?/init.lua;;" LUA_CPATH="build/asan/?.so;;" \
	  $(LUA) $(BUSTED) --cpath="build/asan/?.so"

# The suite under valgrind's memcheck (errors and definite leaks fail it).
valgrind: deps
	@$(MAKE) --no-print-directory all
	AM_STRESS_SCALE=0.1 $(RUNENV) valgrind --quiet --error-exitcode=99 \
	  --leak-check=full --errors-for-leak-kinds=definite \
	  --suppressions=$(CURDIR)/.ci/valgrind.supp \
	  $(LUA) $(BUSTED)

# The suite with the collector at its most aggressive (see spec/helpers.lua),
# one busted process per spec file.
gcstress: deps
	@$(MAKE) --no-print-directory all
	AM_GC_STRESS=1 $(RUNENV) $(LUA) spec/each.lua

# Lua sources through luacheck (Debian: lua-check), C through the compiler's
# warnings (every build).
lint:
	@sh setup.sh lua-check
	luacheck src spec examples bench types tools

clean:
	rm -rf build async_mutex src/*.o rockspecs async-mutex-*.src.rock

# What luarocks runs (async-mutex-scm-1.rockspec, build type "make"): make
# rock-build, with luarocks' CC, CFLAGS, LIBFLAG and LUA_INCDIR, builds the
# C modules in build/luarocks (the Redis part where hiredis is, see above;
# only Lua's headers are needed, never luv's); make rock-install, with
# INST_LIBDIR and INST_LUADIR, installs them, every Lua module of
# src/async_mutex/ under its name, and the LuaLS annotations of types/ as
# async_mutex/types/ in the tree's Lua directory, a path that stays the
# same across versions (README, "Editor support").
# The build goes to ROCK_BUILD (build/luarocks unless given): the specs give
# their own, so that two suites run side by side from one checkout (make
# gcstress and make valgrind in .ci/run) never install each other's build.
LIBFLAG    ?= -shared
LUA_INCDIR ?= $(LUA_INC)
ROCK_BUILD ?= build/luarocks
.PHONY: rock-build rock-install
rock-build:
	@$(MAKE) --no-print-directory BUILD=$(ROCK_BUILD) CFLAGS="$(CFLAGS)" LDFLAGS= \
	  SOFLAGS="$(LIBFLAG)" LUA_INC="$(LUA_INCDIR)" WERROR= all
ifeq ($(HIREDIS_H),)
	@rm -f $(ROCK_BUILD)/async_mutex/redis_core.so
	@echo "hiredis not found: async_mutex.redis is not built (Debian: libhiredis-dev;" \
	  "elsewhere set HIREDIS_INCDIR and HIREDIS_LIBDIR)"
endif

rock-install:
	@test -n "$(INST_LIBDIR)" && test -n "$(INST_LUADIR)" \
	  || { echo "rock-install needs INST_LIBDIR and INST_LUADIR (luarocks passes them)"; exit 1; }
	mkdir -p $(INST_LIBDIR)/async_mutex $(INST_LUADIR)/async_mutex/types
	cp $(ROCK_BUILD)/async_mutex/*.so $(INST_LIBDIR)/async_mutex/
	cp src/async_mutex/*.lua $(INST_LUADIR)/async_mutex/
	cp types/*.lua $(INST_LUADIR)/async_mutex/types/

# The suite against luv as luarocks builds it for users outside Debian (its
# own libuv inside; no C headers), in a tree of its own with only Lua's
# headers visible, this checkout's rock installed into it; once with
# libuv's defaults, once with UV_USE_IO_URING=1 (tools/portable_check.lua,
# log in build/portable/check.log).  LUV_SRC: luv's source rock (`luarocks
# download --source luv`), a tarball of an unpacked one, or its directory;
# without it, the source rock is downloaded.
.PHONY: portable-check
portable-check: deps
	@$(MAKE) --no-print-directory all
	$(LUA) tools/portable_check.lua "$(or $(LUV_SRC),download)" build/portable

# The release check (never part of make test): the README's two commands,
# as root, in a minimal Debian 12 made with debootstrap from the Debian
# mirror, into which this repository is cloned (tools/fresh_check.sh).  The
# log, build/fresh/check.log, ends with the suite's "N passed, N failed".
# Needs root and debootstrap; takes 15-30 minutes.
DEBIAN_MIRROR ?= http://deb.debian.org/debian
.PHONY: fresh-check
fresh-check:
	@sh setup.sh debootstrap
	sh tools/fresh_check.sh $(CURDIR)/build/fresh $(DEBIAN_MIRROR)

# A source rock of this release, installable with no checkout and no network:
#   luarocks --lua-version 5.4 install ./async-mutex-$(VERSION)-1.src.rock
# Its rockspec is the development one (async-mutex-scm-1.rockspec, which
# runs rock-build and rock-install above) with this version and, as its source, a
# tarball of the files git tracks, as they are in the work tree.  ROCK_DIR
# is where rockspecs/ and the rock go (spec/24-rock_spec.lua uses a
# temporary one).
VERSION  := $(shell sed -n 's/.*_VERSION *= *"\([^"]*\)".*/\1/p' src/async_mutex/init.lua)
ROCK_REV ?= 1
ROCK_DIR ?= .
ROCK      = async-mutex-$(VERSION)-$(ROCK_REV)
TARBALL   = build/rock/async-mutex-$(VERSION).tar.gz
rock: deps
	@test -n "$(VERSION)" || { echo "no _VERSION in src/async_mutex/init.lua"; exit 1; }
	@git rev-parse --is-inside-work-tree >/dev/null 2>&1 \
	  || { echo "make rock packs the files git tracks: run it in a git checkout"; exit 1; }
	rm -rf build/rock && mkdir -p build/rock $(ROCK_DIR)/rockspecs
	git ls-files -z | tar --null -T - --transform 's,^,async-mutex-$(VERSION)/,' \
	  --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - \
	  | gzip -n > $(TARBALL)
	$(LUA) tools/rockspec.lua async-mutex-scm-1.rockspec $(VERSION)-$(ROCK_REV) \
	  "file://$(CURDIR)/$(TARBALL)" > $(ROCK_DIR)/rockspecs/$(ROCK).rockspec
	cd $(ROCK_DIR) && luarocks --lua-version 5.4 pack rockspecs/$(ROCK).rockspec

# Benchmarks, never part of `make test`: one table comparing us with
# async-mutex on Node, a pure-Lua mutex and the floor (see bench/run.lua and
# bench/README.md).  Each driver adds its sections to the results file
# BENCH_JSON; bench/chart.lua then draws BENCH_SVG from that file alone.  A
# smoke run (BENCH_QUICK=1) writes beside them, never over the published ones.
ifeq ($(BENCH_QUICK),1)
BENCH_JSON ?= bench/results/quick.json
BENCH_SVG  ?= bench/results/quick.svg
else
BENCH_JSON ?= bench/results/latest.json
BENCH_SVG  ?= docs/bench.svg
endif
# (libuv1-dev: bench/redis/hiredis_uv.c, the C peer, links the system's libuv)
BENCH_PKGS = gnuplot-nox libuv1-dev
REDIS_NODE_PEERS = bench/redis/node bench/redis_locks/node

bench: deps
	@sh setup.sh $(BENCH_PKGS)
	@$(MAKE) --no-print-directory all
	$(RUNENV) BENCH_JSON=$(BENCH_JSON) $(LUA) bench/run.lua
	$(LUA) bench/chart.lua $(BENCH_JSON) $(BENCH_SVG)
	$(RUNENV) $(LUA) bench/lockkinds.lua
	$(RUNENV) $(LUA) bench/debug.lua
	$(RUNENV) $(LUA) bench/tasks.lua
ifneq ($(HIREDIS_H),)
	@# the Node peers of the Redis benchmarks (ioredis, node-redlock), as
	@# bench/run.lua installs async-mutex: without them, their columns stay empty
	@for d in $(REDIS_NODE_PEERS); do \
	  if command -v npm >/dev/null && [ ! -d $$d/node_modules ]; then \
	    (cd $$d && npm ci --no-audit --no-fund --loglevel=error) \
	      || echo "npm ci failed in $$d: its Node columns stay empty"; \
	  fi; \
	done
	$(RUNENV) $(LUA) bench/redis/run.lua
	$(RUNENV) $(LUA) bench/optimistic.lua
	$(RUNENV) $(LUA) bench/redis_locks.lua
	$(RUNENV) $(LUA) bench/redis_kinds.lua
	@# past one server (docs/redis-locks.md, "Scaling out", "On a cluster")
	$(RUNENV) $(LUA) bench/cluster.lua
	$(RUNENV) $(LUA) bench/scaleout.lua
endif

# Model-based random testing: N generated sequences, each run against the
# module and the model of docs/semantics.md (spec/fuzz/), in J child processes
# so that a crash or a hang is caught and shrunk too.  SEED picks the first
# seed (default: from the clock, printed).  `make test` runs 2,000 of them.
# Then the re-entrancy fuzzers (no model: invariants), in chunks of 1,000
# seeds per child; spec/fuzz/reentrancy.lua costs about 10-15 ms of CPU a
# sequence (collector pressure: a whole cycle at each of the module's
# allocations).  Every fuzzer prints a progress line at least once a minute.
N    ?= 100000
J    ?= 2
SEED ?=
.PHONY: fuzz
fuzz: all
	$(RUNENV) $(LUA) spec/fuzz/runner.lua fuzz $(N) $(J) $(SEED)
	$(RUNENV) $(LUA) spec/fuzz/reentrancy.lua fuzz $(N) $(J) $(SEED)
ifneq ($(HIREDIS_H),)
	@# the Redis client's (docs/redis.md, "Re-entry"), against a fake server
	$(RUNENV) $(LUA) spec/fuzz/redis_reentrancy.lua fuzz $(N) $(J) $(SEED)
endif
