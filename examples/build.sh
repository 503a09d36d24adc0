#!/usr/bin/env bash
# Build the example root modules as reproducible erofs images.
#
# Usage: examples/build.sh OUT_DIR
# Writes OUT_DIR/tether-example-root.erofs  busybox-static base, busybox init, /etc
#        OUT_DIR/tether-example-hello.erofs a small layer to stack on top of it
# and prints "PATH SIZE sha256:HEX" for each. The same inputs give the same
# bytes (fixed timestamps, UUID and owners).
#
# busybox comes from $BUSYBOX, else /bin/busybox if it is static, else
# Debian's busybox-static package unpacked into .cache/busybox (apt-get
# download: no install). Needs mkfs.erofs (erofs-utils).
set -euo pipefail

if [ $# -ne 1 ]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export LC_ALL=C
umask 022

command -v mkfs.erofs >/dev/null || { echo "examples/build.sh: mkfs.erofs is missing (apt-get install erofs-utils)" >&2; exit 1; }

# is_static FILE: an ELF with no program interpreter.
is_static() {
  [ -x "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ] &&
    ! grep -q -a -m1 '/lib64/ld-linux\|/lib/ld-linux\|/lib/ld-musl' "$1"
}

busybox=${BUSYBOX:-}
if [ -z "$busybox" ] && is_static /bin/busybox; then
  busybox=/bin/busybox
fi
if [ -z "$busybox" ]; then
  cache=$repo/.cache/busybox
  if [ ! -x "$cache/root/bin/busybox" ]; then
    for tool in apt-get dpkg-deb; do
      command -v "$tool" >/dev/null || { echo "examples/build.sh: no static busybox and no $tool to fetch busybox-static; set BUSYBOX=" >&2; exit 1; }
    done
    tmp=$(mktemp -d)
    # apt-get download drops privileges to _apt; the folder must be writable by it.
    chmod 0777 "$tmp"
    (cd "$tmp" && apt-get download -q busybox-static >/dev/null)
    rm -rf "$cache/root"
    mkdir -p "$cache"
    dpkg-deb -x "$tmp"/busybox-static_*.deb "$cache/root"
    rm -rf "$tmp"
  fi
  busybox=$cache/root/bin/busybox
fi
is_static "$busybox" || { echo "examples/build.sh: $busybox is not a static binary" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# copy_tree SRC DST: files from the source tree with fixed modes (git keeps
# only the executable bit, and checkouts differ in umask).
copy_tree() {
  (cd "$1" && find . -type d) | while read -r d; do install -d -m 0755 "$2/$d"; done
  (cd "$1" && find . -type f) | while read -r f; do
    if [ -x "$1/$f" ]; then mode=0755; else mode=0644; fi
    install -m "$mode" "$1/$f" "$2/$f"
  done
}

# --- the root layer -------------------------------------------------------
root=$stage/root
install -d -m 0755 "$root"
for d in bin sbin usr/bin usr/sbin usr/libexec/tether etc/init.d dev proc sys run home var var/log mnt; do
  install -d -m 0755 "$root/$d"
done
install -d -m 0700 "$root/root"
install -d -m 1777 "$root/tmp"
install -m 0755 "$busybox" "$root/bin/busybox"
# One symlink per applet, where busybox says it belongs.
"$busybox" --list-full | while read -r applet; do
  case $applet in
    */*) ;;
    *) continue ;; # linuxrc and the like: not wanted at /
  esac
  [ -e "$root/$applet" ] || [ -L "$root/$applet" ] || { install -d -m 0755 "$root/$(dirname "$applet")"; ln -s /bin/busybox "$root/$applet"; }
done
copy_tree "$here/root" "$root"
chmod 0600 "$root/etc/shadow"
ln -s /proc/mounts "$root/etc/mtab"
ln -s /run "$root/var/run"

# --- the hello layer --------------------------------------------------------
hello=$stage/hello
install -d -m 0755 "$hello"
copy_tree "$here/hello" "$hello"

build() { # NAME DIR
  local img=$out/$1.erofs
  rm -f "$img"
  mkfs.erofs -zlz4hc -T0 -U 00000000-0000-0000-0000-000000000001 --all-root --quiet "$img" "$2" >/dev/null
  echo "$img $(stat -c %s "$img") sha256:$(sha256sum "$img" | cut -d' ' -f1)"
}
build tether-example-root "$root"
build tether-example-hello "$hello"
