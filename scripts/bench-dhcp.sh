#!/usr/bin/env bash
# The agent's DHCP time, two initramfs builds alternated: each boots
# directly in QEMU with ip=dhcp (QEMU's user-mode DHCP), and the agent's
# "network up ... DHCP took X" console line is read; QEMU is stopped there
# (no control plane is needed). docs/benchmarks.md, "The agent's DHCP".
#
# Usage: scripts/bench-dhcp.sh A.cpio B.cpio [PAIRS]   (default 5)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A.cpio B.cpio [PAIRS]" >&2; exit 2; }
a=$1 b=$2 pairs=${3:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
kernel=$repo/.cache/kernel/vmlinuz
for f in "$a" "$b" "$kernel"; do [ -s "$f" ] || { echo "bench-dhcp: $f is missing" >&2; exit 1; }; done
command -v qemu-system-x86_64 >/dev/null || { echo "bench-dhcp: qemu-system-x86_64 is missing" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log" "$log.pid"' EXIT
boot() {
  : >"$log"
  timeout 60 qemu-system-x86_64 -pidfile "$log.pid" -M q35 -accel tcg -cpu max,aes=off -m 512 -smp 1 -nodefaults -nographic \
    -serial stdio -no-reboot -netdev user,id=n0 -device virtio-net-pci,netdev=n0,mac=52:54:00:be:0e:01 \
    -kernel "$kernel" -initrd "$1" -append "console=ttyS0 ip=dhcp BOOTIF=01-52-54-00-be-0e-01 panic=-1 \
tether.url=https://10.0.2.2:1 tether.token=tbt_unused tether.ca=sha256:$(printf '0%.0s' $(seq 64))" </dev/null 2>&1 |
    while IFS= read -r l; do
      printf '%s\n' "$l" >>"$log"
      case $l in *"network up"* | *"boot: network"*) kill "$(cat "$log.pid")" 2>/dev/null || true ;; esac
    done || true
  grep -a 'network up' "$log" | sed -n 's/.*DHCP took \([^)]*\)).*/\1/p'
}
echo "bench-dhcp: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$pairs"); do
  echo "pair $i: A $(boot "$a"), B $(boot "$b")"
done
echo "bench-dhcp: load after $(cut -d' ' -f1-3 /proc/loadavg)"
