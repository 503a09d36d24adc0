#!/usr/bin/env bash
# Measure the bare-netboot floor: wall time from QEMU's start to the switched
# root's init printing its ready marker, with the minimal Go /init of
# initramfs/floor/init (agent/boot + agent/rootfs, nothing else).
#
# Usage: initramfs/floor/run.sh [RUNS]        (default 5)
# Environment: FLOOR_APPEND  extra kernel arguments (e.g. "quiet")
#              FLOOR_SHELL   1 to put busybox in the initramfs as the real one has
#              FLOOR_TIMEOUT seconds per VM (default 120)
#              FLOOR_NIC_OPTS extra virtio-net-pci options (e.g. ",romfile=" to skip iPXE's ROM)
#              FLOOR_CPU     QEMU CPU model (default max,aes=off, as the qemu provider uses under TCG)
#              FLOOR_REUSE   1 to boot what an earlier run built in .cache/floor instead of
#                            building again (scripts/bench-boot.sh alternates single runs)
#              FLOOR_MODULE  an erofs root module to boot instead of the example root
#                            (e.g. .cache/debian-root.erofs, which the Debian e2e caches)
#              FLOOR_BOOT    direct (default: QEMU's -kernel/-initrd), or bios or uefi: a
#                            firmware netboot (SeaBIOS, or OVMF, with the NIC's iPXE ROM) over
#                            QEMU's user-mode DHCP, whose bootfile is a static three-line iPXE
#                            script fetching the same kernel and initramfs from the file server:
#                            the simplest firmware path, with nothing of Tether's in it
#              FLOOR_READY   the console line that ends a run (default the example root's
#                            TETHER_EXAMPLE_READY; for a systemd root, say
#                            "- System Initialization.", which ends its sysinit.target line); QEMU is then stopped
# Prints one line per run and the median, in milliseconds. Logs and build
# outputs go to .cache/floor/.
set -euo pipefail

runs=${1:-5}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
work=$repo/.cache/floor
mkdir -p "$work"
vm_timeout=${FLOOR_TIMEOUT:-120}
# The qemu provider's CPU model (providers/qemu/args.go), so that both
# sides of the ratio run the same virtual machine.
cpu=${FLOOR_CPU:-max,aes=off}

command -v qemu-system-x86_64 >/dev/null || { echo "floor: qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2; exit 1; }

ready=${FLOOR_READY:-TETHER_EXAMPLE_READY}
if [ "${FLOOR_REUSE:-0}" = 1 ] && [ -s "$work/initramfs.cpio" ] && [ -s "$work/module" ] && [ -z "${FLOOR_MODULE:-}" ]; then
  read -r image digest <"$work/module"
elif [ "${FLOOR_REUSE:-0}" = 1 ] && [ -s "$work/initramfs.cpio" ] && [ -n "${FLOOR_MODULE:-}" ]; then
  read -r image digest <"$work/module.own"
else
  release=$(scripts/fetch-kernel.sh .cache/kernel)
  echo "floor: kernel $release" >&2

  CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o "$work/init" ./initramfs/floor/init
  go build -trimpath -buildvcs=false -o "$work/serve" ./initramfs/floor/serve
  shell_flag=-busybox=none
  [ "${FLOOR_SHELL:-0}" = 1 ] && shell_flag=-busybox=auto
  initramfs/build.sh "$work/init" .cache/kernel "$work/initramfs.cpio" "$shell_flag" >&2

  rm -rf "$work/modules"
  line=$(examples/build.sh "$work/modules" | grep '/tether-example-root.erofs ')
  image=$(basename "${line%% *}")
  digest=${line##*sha256:}
  echo "$image $digest" >"$work/module"
  echo "floor: module $image $(echo "$line" | cut -d' ' -f2) bytes sha256:$digest" >&2
  if [ -n "${FLOOR_MODULE:-}" ]; then
    [ -s "$FLOOR_MODULE" ] || { echo "floor: FLOOR_MODULE $FLOOR_MODULE is missing" >&2; exit 1; }
    image=own.erofs
    cp "$FLOOR_MODULE" "$work/modules/$image"
    digest=$(sha256sum "$work/modules/$image" | cut -d' ' -f1)
    echo "$image $digest" >"$work/module.own"
    echo "floor: module $FLOOR_MODULE $(stat -c %s "$FLOOR_MODULE") bytes sha256:$digest" >&2
  fi
fi
[ "$runs" -gt 0 ] || exit 0

rm -f "$work/port"
"$work/serve" -dir "$work/modules" -port-file "$work/port" 2>"$work/serve.log" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "floor: file server did not start" >&2; exit 1; }
port=$(cat "$work/port")

append="console=ttyS0 ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off panic=-1"
append+=" floor.url=http://10.0.2.2:$port/$image floor.sha256=$digest tether.example.poweroff=1"
append+=" ${FLOOR_APPEND:-}"

# How QEMU gets the kernel: handed to it (direct), or from the network
# through the firmware and iPXE, as Tether's bios and uefi boots do.
boot=${FLOOR_BOOT:-direct}
case $boot in
  direct) bootargs=(-kernel .cache/kernel/vmlinuz -initrd "$work/initramfs.cpio" -append "$append") ;;
  bios | uefi)
    # The file server serves the module folder: the kernel, the initramfs
    # and the script go beside the module (links, so nothing is copied).
    ln -sf "$repo/.cache/kernel/vmlinuz" "$work/modules/vmlinuz"
    ln -sf "$work/initramfs.cpio" "$work/modules/initramfs.cpio"
    printf '#!ipxe\nkernel http://10.0.2.2:%s/vmlinuz initrd=initramfs %s\ninitrd --name initramfs http://10.0.2.2:%s/initramfs.cpio\nboot\n' \
      "$port" "$append" "$port" >"$work/modules/floor.ipxe"
    bootargs=(-boot n)
    netdev_opts=",bootfile=http://10.0.2.2:$port/floor.ipxe"
    if [ "$boot" = uefi ]; then
      code=${FLOOR_OVMF_CODE:-/usr/share/OVMF/OVMF_CODE_4M.fd}
      [ -s "$code" ] || { echo "floor: $code is missing (apt-get install ovmf)" >&2; exit 1; }
      cp "${FLOOR_OVMF_VARS:-/usr/share/OVMF/OVMF_VARS_4M.fd}" "$work/ovmf-vars.fd"
      bootargs+=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$code" -drive "if=pflash,format=raw,unit=1,file=$work/ovmf-vars.fd")
    fi ;;
  *) echo "floor: FLOOR_BOOT is direct, bios or uefi, not $boot" >&2; exit 1 ;;
esac

times=()
for i in $(seq "$runs"); do
  log=$work/run$i.log
  : >"$log"
  rm -f "$work/t$i" "$work/h$i" "$work/qemu.pid"
  start=$(date +%s%N)
  # The marker is printed by the example root's rcS; it then powers off, so
  # QEMU exits on its own; the timeout bounds a VM that hangs.
  timeout "$vm_timeout" qemu-system-x86_64 -pidfile "$work/qemu.pid" -M q35 -accel tcg -cpu "$cpu" -m 512 -smp 1 -nodefaults -nographic \
    -serial stdio -no-reboot -netdev "user,id=n0${netdev_opts:-}" -device "virtio-net-pci,netdev=n0${FLOOR_NIC_OPTS:-}" \
    "${bootargs[@]}" </dev/null 2>&1 |
    while IFS= read -r l; do
      case $l in
        *"$ready"*)
          [ -e "$work/t$i" ] || echo $((($(date +%s%N) - start) / 1000000)) >"$work/t$i"
          # A root that does not power off by itself (systemd) is stopped.
          [ "$ready" = TETHER_EXAMPLE_READY ] || kill "$(cat "$work/qemu.pid")" 2>/dev/null || true ;;
        # Host stamps of the firmware's first line, the kernel's start
        # and /init's, to compare with Tether's phases (e2e bootMarks).
        *"SeaBIOS (version "*) echo "qemu $((($(date +%s%N) - start) / 1000000))" >>"$work/h$i" ;;
        *"Filename: "*) echo "firmware+DHCP $((($(date +%s%N) - start) / 1000000))" >>"$work/h$i" ;;
        *"Linux version "*) echo "kernel-start $((($(date +%s%N) - start) / 1000000))" >>"$work/h$i" ;;
        *"floor: /init started"*) echo "init $((($(date +%s%N) - start) / 1000000))" >>"$work/h$i" ;;
      esac
      printf '%s\n' "$l" >>"$log"
    done || true # QEMU stopped after a systemd root's marker exits non-zero; the marker decides
  if [ ! -s "$work/t$i" ]; then
    echo "floor: run $i: no ready marker within ${vm_timeout}s; log $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  t=$(cat "$work/t$i")
  times+=("$t")
  # Guest-side phase times (seconds since the kernel started, which is
  # a few hundred ms after QEMU did).
  phases=$(tr -d '\r' <"$log" | sed -n 's/.*\[ *\([0-9]*\.[0-9]*\)\] floor: /\1 /p' | awk '
    { t = $1; $1 = "" }
    / \/init started/       { k = "init" }
    / boot: network up/      { k = "net" }
    / fetched/               { k = "fetched" }
    / root composed/         { k = "composed" }
    / rootfs: switched root/ { k = "exec" }
    k != "" { printf "%s%s %.2f", sep, k, t; sep = ", "; k = "" }')
  host=$(awk '{printf "%s%s %s", sep, $1, $2; sep = ", "}' "$work/h$i" 2>/dev/null || true)
  echo "run $i: ${t} ms  (host ms: $host; guest uptime s: $phases)"
done

median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}')
echo "median of $runs: ${median} ms"
