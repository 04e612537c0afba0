#!/bin/sh
# The Debian 12 packages this checkout needs, and the one list of them: the
# build (make, gcc, Lua 5.4's headers, hiredis: no luv or libuv header), the suite (busted,
# redis-server, git for `make rock`, valgrind for the specs that count
# instructions or check memory in child processes) and packaging (luarocks).
#
#   sh setup.sh           installs the missing ones (README, "Two commands")
#   sh setup.sh PKG...    the same for these packages (make lint, make bench)
#
# Run as root it installs what is missing with apt-get; run as another user
# it names what is missing and fails.  It needs only sh and Debian's base
# system, because on a bare Debian it runs before make or anything else is
# there.  The Makefile's targets call it (make deps), so they install what is
# missing too.
set -eu

PACKAGES="make gcc libc6-dev git valgrind
  lua5.4 liblua5.4-dev lua-luv lua-busted luarocks
  redis-server redis-sentinel libhiredis-dev"
if [ $# -gt 0 ]; then PACKAGES="$*"; fi

missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
    || missing="$missing $p"
done
[ -n "$missing" ] || exit 0

if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages:$missing" >&2
  echo "run this as root, or: sudo apt-get install$missing" >&2
  exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one argument a package
apt-get install -y -qq --no-install-recommends $missing >/dev/null
