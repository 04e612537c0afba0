#!/bin/sh
# make fresh-check: the README's two commands ("Two commands") run as root on
# a bare Debian 12, before each release.  It makes a minimal Debian 12 with
# debootstrap from the Debian mirror, clones this repository into it (the
# files git tracks, at HEAD, as a user's clone has them), mounts /proc, and
# runs each command of the README's block in it, in order, in a clean
# environment.  Everything goes to the log, whose last line is the suite's
# "N passed, N failed"; the exit status is the last command's.
#
#   sh tools/fresh_check.sh DIR [MIRROR]
#
# DIR (build/fresh) receives the system (DIR/root), the log (DIR/check.log)
# and debootstrap's log.  FRESH_BASE=PATH copies a system debootstrap made
# before instead of making one (for working on this script; a release check
# makes its own).  Needs root, debootstrap and git.
set -eu

dir=${1:?usage: fresh_check.sh DIR [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
repo=$(git rev-parse --show-toplevel)
root=$dir/root
log=$dir/check.log

[ "$(id -u)" = 0 ] || { echo "fresh-check needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null \
  || { echo "fresh-check needs debootstrap (Debian package debootstrap)" >&2; exit 1; }

# Processes left running inside the system (a daemon a package started, a
# server a spec left behind), by their pid: those whose root is $root.
stop_inside() {
  real=$(cd "$root" 2>/dev/null && pwd -P) || return 0
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/root" 2>/dev/null)" = "$real" ]; then
      kill -9 "${p#/proc/}" 2>/dev/null || true
    fi
  done
}
unmount() {
  if [ -d "$root/proc" ] && mountpoint -q "$root/proc"; then
    stop_inside
    umount "$root/proc" || umount -l "$root/proc"
  fi
}
trap unmount EXIT
trap 'exit 130' INT TERM

unmount
rm -rf "$root"
mkdir -p "$dir"
: > "$log"
say() { echo "$*" | tee -a "$log"; }
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }

if [ -n "${FRESH_BASE:-}" ]; then
  say "== copying $FRESH_BASE (FRESH_BASE: not a release check)"
  cp -a "$FRESH_BASE" "$root"
else
  say "== debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$dir/debootstrap.log" 2>&1 \
    || { tail -20 "$dir/debootstrap.log" | tee -a "$log"; exit 1; }
fi
say "   ($(elapsed)); $(du -sh "$root" | cut -f1), $(chroot "$root" dpkg-query -W | wc -l) packages;" \
  "no make: $(chroot "$root" sh -c 'command -v make || echo yes')"

# What a real machine has and a bare chroot lacks: name resolution (a DNS
# server, and the /etc/hosts that Debian's installer and images write, with
# localhost in it: debootstrap writes none, and the specs connect to
# "localhost").  Package scripts start no service (there is no init in a
# chroot; policy-rc.d is how Debian's own images say so).
cp /etc/resolv.conf "$root/etc/resolv.conf"
[ -e "$root/etc/hosts" ] || printf '%s\n' '127.0.0.1	localhost' \
  '::1		localhost ip6-localhost ip6-loopback' > "$root/etc/hosts"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"

say "== cloning $repo at $(git -C "$repo" rev-parse --short HEAD) into /root/async-mutex"
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  say "   (the work tree has uncommitted changes: they are not in the clone)"
fi
git clone --quiet --no-hardlinks "$repo" "$root/root/async-mutex"
mount -t proc proc "$root/proc"

# The README's block of commands, comments dropped.
commands=$(awk '/^## Two commands/ { s = 1 } s && /^```sh/ { b = 1; next }
  b && /^```/ { exit } b { sub(/[ \t]*#.*/, ""); if ($0 != "") print }' "$repo/README.md")
[ -n "$commands" ] || { say "no command block under \"## Two commands\" in README.md"; exit 1; }

status=0
echo "$commands" | while IFS= read -r command; do
  say "== $command   (as root, in /root/async-mutex)"
  set +e
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/sh -c "cd /root/async-mutex && $command" < /dev/null >> "$log" 2>&1
  status=$?
  set -e
  say "   exit status $status ($(elapsed))"
  [ "$status" = 0 ] || exit "$status"
done || status=$?

# The suite's closing line, last in the log too.
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1) || true
say "== fresh-check took $(elapsed)"
say "${line:-(no \"N passed, N failed\" line: see the log)}"
exit "$status"
