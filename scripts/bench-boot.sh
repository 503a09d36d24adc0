#!/usr/bin/env bash
# Boot to running against the bare-netboot floor, alternated in one run:
# floor, Tether, floor, Tether, ... so that both see the same machine load.
#
# Usage: scripts/bench-boot.sh [PAIRS] [ROOT] [BOOT]  (default 5, example, direct; `make bench-boot`)
#   BOOT=bios or uefi boots both sides through the firmware and the NIC's iPXE:
#   Tether's BenchmarkBootToRunning/bios (or uefi), and the floor with
#   FLOOR_BOOT=bios (or uefi), whose QEMU DHCP hands iPXE a static script.
#   ROOT=debian boots the stock Debian root the Debian e2e caches
#   (.cache/debian-root.erofs: systemd, nothing of Tether's) on both sides;
#   the floor's run ends at systemd's "Reached target sysinit.target - System Initialization.", the
#   point where the agent's unit has been started.
# Needs what `make e2e` needs (qemu, the kernel, build/initramfs.cpio and the
# example module: `make initramfs modules`).
#
# The floor is initramfs/floor/run.sh (QEMU start → the switched root's ready
# marker). Tether is e2e's BenchmarkBootToRunning/direct, one boot per pair
# (the provision call → the instance shows running), with its phases. Prints
# one line per pair, then the medians and their ratio, and the machine's load
# before and after (`uptime`): numbers from a loaded machine are inflated, a
# ratio of alternated runs much less so. Each Tether boot's serial log (with
# the agent's millisecond stamps) is kept in .cache/bench-boot/consoles/.
set -euo pipefail

pairs=${1:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
work=$repo/.cache/bench-boot
mkdir -p "$work"
root=${2:-example}
boot=${3:-direct}
case $boot in
  direct | bios | uefi) export FLOOR_BOOT=$boot ;;
  *) echo "bench-boot: BOOT is direct, bios or uefi, not $boot" >&2; exit 1 ;;
esac
bench="BootToRunning/$boot\$"
case $root in
  example) ;;
  debian)
    [ -s .cache/debian-root.erofs ] ||
      { echo "bench-boot: .cache/debian-root.erofs is missing; run the Debian e2e once (TETHER_E2E=1 go test -run TestVMDebianRoot ./e2e/)" >&2; exit 1; }
    [ "$boot" = direct ] || { echo "bench-boot: the Debian root boots direct only" >&2; exit 1; }
    export FLOOR_MODULE=.cache/debian-root.erofs FLOOR_READY='- System Initialization.'
    bench='BootToRunning/debian$' ;;
  *) echo "bench-boot: ROOT is example or debian, not $root" >&2; exit 1 ;;
esac

for f in .cache/kernel/vmlinuz build/initramfs.cpio build/modules/tether-example-root.erofs; do
  [ -s "$f" ] || { echo "bench-boot: $f is missing; run \`make initramfs modules\` first" >&2; exit 1; }
done
command -v qemu-system-x86_64 >/dev/null || { echo "bench-boot: qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2; exit 1; }

echo "bench-boot: $boot boot, $root root" >&2
echo "bench-boot: $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo '+dirty')" >&2
echo "bench-boot: before: $(uptime)" >&2
# Build both sides once, outside the timed boots.
initramfs/floor/run.sh 0
go test -c -o "$work/e2e.test" ./e2e/

floor=()
tether=()
for i in $(seq "$pairs"); do
  f=$(FLOOR_REUSE=1 initramfs/floor/run.sh 1 | tee -a "$work/floor.log" | awk '/^median of/ {print $4}')
  out=$(cd e2e && TETHER_E2E=1 TETHER_BENCH_CONSOLE_DIR="$work/consoles" "$work/e2e.test" -test.run '^$' -test.bench "$bench" -test.benchtime 1x 2>>"$work/tether.err")
  printf '%s\n' "$out" >>"$work/tether.log"
  line=$(printf '%s\n' "$out" | grep '^BenchmarkBootToRunning/') || {
    echo "bench-boot: pair $i: the Tether boot failed; see $work/tether.log and $work/tether.err" >&2
    exit 1
  }
  # "... 5.88 s-running ..." → milliseconds; the phases as they are.
  t=$(printf '%s\n' "$line" | awk '{for (i = 2; i < NF; i++) if ($(i+1) == "s-running") printf "%d", $i * 1000}')
  phases=$(printf '%s\n' "$line" | awk '{for (i = 2; i < NF; i++) if ($(i+1) ~ /^s-/ && $(i+1) != "s-running") {printf "%s%s %s", sep, substr($(i+1), 3), $i; sep = ", "}}')
  floor+=("$f")
  tether+=("$t")
  echo "pair $i: floor ${f} ms, tether ${t} ms ($(awk -v a="$t" -v b="$f" 'BEGIN {printf "%.2f", a / b}')x; tether phases s: $phases)"
done

med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }
mf=$(med "${floor[@]}")
mt=$(med "${tether[@]}")
target=1.2x
[ "$boot" = direct ] || target=1.1x
echo "median of $pairs ($boot): floor ${mf} ms, tether ${mt} ms, ratio $(awk -v a="$mt" -v b="$mf" 'BEGIN {printf "%.2f", a / b}')x (target $target)"
echo "bench-boot: after: $(uptime)" >&2
