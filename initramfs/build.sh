#!/usr/bin/env bash
# Build the netboot initramfs (a reproducible cpio) with the agent as /init.
#
# Usage: initramfs/build.sh AGENT_BINARY KERNEL_CACHE_DIR OUTPUT [mkinitramfs flags...]
#   AGENT_BINARY      static agent, e.g. built with
#                     CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o build/tether-agent ./cmd/tether-agent
#   KERNEL_CACHE_DIR  from scripts/fetch-kernel.sh (default .cache/kernel)
#   OUTPUT            e.g. build/initramfs.cpio
# Extra flags go to initramfs/cmd/mkinitramfs (-busybox=none, -modules=..., -v).
# Prints "OUTPUT SIZE sha256:HEX". Needs go, modprobe/depmod (kmod) and a
# static busybox (busybox-static) unless -busybox=none.
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
agent=$(realpath "$1")
kernel=$(realpath "$2")
mkdir -p "$(dirname "$3")"
out=$(realpath "$3")
shift 3

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
for tool in modprobe depmod; do
  PATH=$PATH:/sbin:/usr/sbin command -v "$tool" >/dev/null ||
    { echo "initramfs/build.sh: $tool is missing (apt-get install kmod)" >&2; exit 1; }
done
# Debian keeps modprobe in /sbin, which a non-login PATH may lack.
export PATH=$PATH:/sbin:/usr/sbin
exec go run -trimpath ./initramfs/cmd/mkinitramfs -agent "$agent" -kernel "$kernel" -o "$out" "$@"
