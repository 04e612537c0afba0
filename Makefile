# async_mutex: developer entry point.  `make demo` and `make test` do everything
# on a fresh Debian machine (installing missing packages when run as root).

LUA      ?= lua5.4
BUSTED   ?= /usr/bin/busted
CC       ?= gcc
LUA_INC  ?= /usr/include/lua5.4
CFLAGS   ?= -O2 -g
WARN      = -Wall -Wextra -Werror -std=c99 -pedantic
ALLFLAGS  = $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden -I$(LUA_INC)
LDFLAGS  ?=
# No -llua5.4: the interpreter that loads the module already holds the Lua core.
SOFLAGS   = -shared

DEB_PKGS  = lua5.4 liblua5.4-dev lua-luv lua-luv-dev lua-busted luarocks libuv1-dev

SRCS      = $(wildcard src/*.c)
HDRS      = $(wildcard src/*.h)
OBJS      = $(patsubst src/%.c,build/obj/%.o,$(SRCS))
MODULE    = build/async_mutex/core.so

# Lets scripts find the module in this checkout without installing it.
RUNENV    = LUA_PATH="src/?.lua;src/?/init.lua;;" LUA_CPATH="build/?.so;;"

.PHONY: all deps demo test bench clean

all: $(MODULE)

build/obj/%.o: src/%.c $(HDRS) | build/obj
	$(CC) $(ALLFLAGS) -c $< -o $@

$(MODULE): $(OBJS) | build/async_mutex
	$(CC) $(SOFLAGS) $(LDFLAGS) -o $@ $(OBJS)

build/obj build/async_mutex:
	mkdir -p $@

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing"; \
	    echo "run as root, or: sudo apt-get install$$missing"; exit 1; \
	  fi; \
	fi

demo: deps
	@$(MAKE) --no-print-directory all
	$(RUNENV) $(LUA) examples/withdraw.lua

test: deps
	@$(MAKE) --no-print-directory all
	$(RUNENV) $(LUA) $(BUSTED)

clean:
	rm -rf build
