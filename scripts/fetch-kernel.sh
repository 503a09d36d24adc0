#!/usr/bin/env bash
# Fetch Debian's cloud kernel into a cache folder without installing it.
# Installing a kernel package pulls initramfs-tools and writes /boot; netboot
# only needs the bzImage and the modules tree, so we unpack the .deb instead.
#
# Usage: scripts/fetch-kernel.sh [CACHE_DIR]   (default: .cache/kernel)
# Prints nothing on success except the resolved version; leaves
#   CACHE_DIR/vmlinuz            the bzImage
#   CACHE_DIR/root/lib/modules/  the modules tree (with modules.dep)
#   CACHE_DIR/version            the kernel release (e.g. 6.1.0-57-cloud-amd64)
set -euo pipefail

cache=${1:-.cache/kernel}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

if [ -s "$cache/vmlinuz" ] && [ -s "$cache/version" ] && [ -d "$cache/root/lib/modules/$(cat "$cache/version")" ]; then
  cat "$cache/version"
  exit 0
fi

for tool in apt-get apt-cache dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "fetch-kernel: $tool is missing; this needs a Debian-based machine" >&2; exit 1; }
done

# linux-image-cloud-amd64 is a metapackage; its one dependency names the
# versioned kernel package we want.
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$pkg" ]; then
  echo "fetch-kernel: cannot resolve linux-image-cloud-amd64; run 'apt-get update' first" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download drops privileges to _apt; the folder must be writable by it.
chmod 0777 "$tmp"
(cd "$tmp" && apt-get download -q "$pkg" >/dev/null)
deb=$(ls "$tmp"/*.deb)
rm -rf "$cache/root"
dpkg-deb -x "$deb" "$cache/root"

release=${pkg#linux-image-}
cp "$cache/root/boot/vmlinuz-$release" "$cache/vmlinuz"
# depmod output is what gives the module load order; generate it if the
# package did not ship it.
if [ ! -s "$cache/root/lib/modules/$release/modules.dep" ]; then
  depmod -b "$cache/root" "$release"
fi
echo "$release" > "$cache/version"
echo "$release"
