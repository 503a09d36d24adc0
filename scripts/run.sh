#!/usr/bin/env bash
# make run: the main job for a newcomer on a fresh machine.
#  1. installs what is missing (qemu, erofs-utils, busybox-static; the kernel is fetched, never installed);
#  2. builds tetherd, tetherctl, the agent, the initramfs and the example root module;
#  3. inits a data dir under .tether/ (once) and starts tetherd on the embedded store;
#  4. pushes the example module, creates a template and a node, provisions one QEMU instance;
#  5. shows the boot phases until the instance is running, prints what to try next,
#     and keeps tetherd running. Ctrl-C terminates the VMs and stops tetherd.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'make run: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "Go is not installed (expected /usr/local/go/bin/go, Go 1.26)"

# 1. System packages.
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v mkfs.erofs >/dev/null || missing+=(erofs-utils)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
command -v depmod >/dev/null || missing+=(kmod)
[ -f /usr/lib/ipxe/undionly.kpxe ] || missing+=(ipxe) # firmware netboot loaders (--ipxe-dir)
command -v jq >/dev/null || missing+=(jq)            # README "Try it by hand" reads the instance id with it
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    die "missing packages: ${missing[*]}; run as root or: sudo apt-get install --no-install-recommends ${missing[*]}"
  fi
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Build everything (the kernel comes from Debian's cloud kernel package).
say "building tetherd, tetherctl, tether-agent, the initramfs and the example module"
make --no-print-directory build initramfs modules >/dev/null

# 3. Data dir and tetherd. TETHER_RUN_DATA and TETHER_RUN_ADDR move them
#    (the e2e test of this script runs it in a temp dir on a free port).
data=${TETHER_RUN_DATA:-.tether}
addr=${TETHER_RUN_ADDR:-127.0.0.1:7443}
if [ ! -f "$data/ca/ca.crt" ]; then
  say "initialising $data (CA, server certificate, admin identity)"
  bin/tetherd init --data-dir "$data" >/dev/null
fi
data=$(cd "$data" && pwd)
export TETHERCONFIG="$data/admin/tetherconfig.yaml"
ctl() { bin/tetherctl --endpoint "$addr" "$@"; }
if ctl node list --limit 1 >/dev/null 2>&1; then
  die "a tetherd already answers on $addr; stop it first"
fi
# QMP sockets live in the VM state dir and unix socket paths are short.
machines="$data/machines"
own_machines=
if [ ${#machines} -gt 60 ]; then
  machines=$(mktemp -d /tmp/tether-machines.XXXX)
  own_machines=$machines
fi

# run_vms prints "PID INSTANCE" for every VM of this run that is alive. The
# qemu provider keeps one folder per instance in $machines with qemu.pid;
# a pid counts only while its command line names that folder's QMP socket
# (pids are reused).
run_vms() {
  local pidfile dir pid
  for pidfile in "$machines"/*/qemu.pid; do
    [ -f "$pidfile" ] || continue
    dir=${pidfile%/qemu.pid}
    pid=$(cat "$pidfile" 2>/dev/null) || continue
    [[ $pid =~ ^[0-9]+$ ]] || continue
    if { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF "$dir/qmp.sock"; then
      echo "$pid ${dir##*/}"
    fi
  done
}

# stop_leftover_vms stops the VMs that outlived tetherd (it died first, or
# a terminate failed). VMs run in their own session so that a restarted
# tetherd finds them again; nothing else would ever stop these.
stop_leftover_vms() {
  local left pid id
  left=$(run_vms)
  [ -n "$left" ] || return 0
  while read -r pid id; do
    echo "the VM of instance $id (pid $pid) is still running; stopping it"
    kill -TERM "$pid" 2>/dev/null || true
  done <<<"$left"
  for _ in $(seq 1 50); do
    [ -n "$(run_vms)" ] || return 0
    sleep 0.1
  done
  while read -r pid id; do kill -KILL "$pid" 2>/dev/null || true; done <<<"$(run_vms)"
  sleep 0.5
  left=$(run_vms)
  [ -n "$left" ] || return 0
  while read -r pid id; do
    printf 'make run: the VM of instance %s is still running (pid %s); stop it with: kill -9 %s\n' "$id" "$pid" "$pid" >&2
  done <<<"$left"
  return 1
}

say "starting tetherd on $addr (log: $data/tetherd.log)"
# setsid: tetherd gets its own session, so the terminal's Ctrl-C (sent to
# the whole foreground process group) reaches this script and not tetherd:
# the cleanup below needs tetherd alive to terminate the VMs through it.
# setsid does not fork here (a background child is no group leader), so
# $! is tetherd.
setsid bin/tetherd serve --data-dir "$data" --listen "$addr" --qemu-state-dir "$machines" \
  --kernel .cache/kernel/vmlinuz --initramfs build/initramfs.cpio >"$data/tetherd.log" 2>&1 &
tetherd=$!

# cleanup terminates the VMs through tetherd, stops tetherd, then stops
# whatever VM of this run is still alive. It exits with $1, or 1 when a VM
# could not be stopped. $2 is what started it: "signal" (Ctrl-C, TERM,
# HUP) or "exit" (the script ended: tetherd died, or a step failed).
cleanup() {
  local status=$1 cause=$2 pool id
  # A second Ctrl-C must not cut the cleanup short and leave VMs behind.
  trap '' INT TERM HUP
  trap - EXIT
  # `make run | tee run.log`: the same Ctrl-C killed tee, so stdout may be
  # a pipe nobody reads. A write there must fail, not kill this shell
  # (SIGPIPE) or end it (set -e): what it says also goes to a file, and
  # stopping the VMs comes first.
  trap '' PIPE
  set +e
  # When stdout is not the terminal (that pipe) and a signal started the
  # stop, the terminal still hears how it goes. Not when the script ended
  # by itself: the pipe's reader is then alive and shows every line, which
  # the terminal would get twice.
  local tty=()
  if [ "$cause" = signal ] && [ ! -t 1 ] && { : >/dev/tty; } 2>/dev/null; then tty=(/dev/tty); fi
  exec > >(tee -p -a "$data/cleanup.log" "${tty[@]}" 2>/dev/null) 2>&1
  local teepid=$!
  echo
  say "stopping: terminating QEMU instances, then tetherd (this takes a few seconds)"
  if kill -0 "$tetherd" 2>/dev/null && ctl node list --limit 1 >/dev/null 2>&1; then
    # No pool may replace what is terminated below. The pools paused here
    # are named in $data/paused-by-run, so that the next run resumes them
    # and leaves alone a pool the operator paused.
    for pool in $(ctl pool list 2>/dev/null | awk 'NR > 1 && $2 == "active" {print $1}'); do
      if ctl pool pause "$pool" >/dev/null 2>&1; then
        echo "$pool" >>"$data/paused-by-run"
      else
        echo "could not pause pool $pool (see $data/tetherd.log)"
      fi
    done
    # Every VM this tetherd started, pool members included (columns: ID NODE STATUS PHASE PROVIDER ...).
    for id in $(ctl instance list 2>/dev/null | awk 'NR > 1 && $5 == "qemu" && $3 != "terminated" {print $1}'); do
      ctl instance terminate "$id" >/dev/null 2>&1 && echo "terminated $id" || echo "could not terminate $id (see $data/tetherd.log)"
    done
  else
    echo "tetherd is not answering (see $data/tetherd.log); stopping this run's VMs by their pid files in $machines"
  fi
  kill -TERM "$tetherd" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "$tetherd" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$tetherd" 2>/dev/null; then
    echo "tetherd did not stop within 20 s; killing it"
    kill -KILL "$tetherd" 2>/dev/null || true
  fi
  # Reap it only while it exists: when the Ctrl-C cut short the script's
  # own `wait "$tetherd"` just as tetherd died, bash has already reaped it
  # but not noted so, and a second wait would block forever (bash 5.2).
  if kill -0 "$tetherd" 2>/dev/null; then wait "$tetherd" 2>/dev/null || true; fi
  if stop_leftover_vms; then
    [ -z "$own_machines" ] || rm -rf "$own_machines"
    say "stopped"
  else
    status=1
  fi
  # tee writes what was said after this shell's last write: give it the
  # end of its input and a moment, so that "stopped" is on the terminal
  # and in cleanup.log before the prompt returns.
  exec >&- 2>&-
  for _ in $(seq 1 40); do
    kill -0 "$teepid" 2>/dev/null || break
    sleep 0.05
  done
  exit "$status"
}
trap 'cleanup 0 signal' INT TERM HUP
trap 'cleanup $? exit' EXIT

for _ in $(seq 1 100); do
  ctl node list --limit 1 >/dev/null 2>&1 && break
  kill -0 "$tetherd" 2>/dev/null || { cat "$data/tetherd.log" >&2; die "tetherd exited; its log is above"; }
  sleep 0.1
done

# The pools the last run's Ctrl-C paused come back as they were.
if [ -f "$data/paused-by-run" ]; then
  for pool in $(sort -u "$data/paused-by-run"); do
    if ctl pool activate "$pool" >/dev/null 2>&1; then
      say "resuming pool $pool (paused when the last run stopped)"
    else
      echo "could not resume pool $pool: tetherctl pool activate $pool" >&2
    fi
  done
  rm -f "$data/paused-by-run"
fi

# 4. Module, template, node, instance.
say "pushing the example root module"
ctl module push example-root:1 build/modules/tether-example-root.erofs >/dev/null
ctl template get example >/dev/null 2>&1 || ctl template create example --root example-root:1 >/dev/null
ctl node get demo >/dev/null 2>&1 || ctl node create demo --template example >/dev/null
node=demo template=example

# 4b. ROOT=debian (make run ROOT=debian): a stock Debian bookworm root, with
#     nothing of Tether's in it, instead of the example. The tree is built
#     once into .cache/debian-root with mmdebstrap and packed with
#     mkfs.erofs -zlz4hc (docs/operator-guide.md, "Your own root").
if [ "${ROOT:-}" = debian ]; then
  command -v mmdebstrap >/dev/null || die "ROOT=debian needs mmdebstrap: sudo apt-get install --no-install-recommends mmdebstrap"
  if [ ! -e .cache/debian-root/sbin/init ]; then
    say "building a Debian bookworm root with mmdebstrap into .cache/debian-root (once; about a minute)"
    rm -rf .cache/debian-root.tmp
    mmdebstrap --variant=minbase --include=systemd-sysv,iproute2,udev bookworm .cache/debian-root.tmp >/dev/null
    mv .cache/debian-root.tmp .cache/debian-root
  fi
  if [ ! -f .cache/debian-root.erofs ]; then
    mkfs.erofs -zlz4hc .cache/debian-root.erofs.tmp .cache/debian-root >/dev/null
    mv .cache/debian-root.erofs.tmp .cache/debian-root.erofs
  fi
  say "pushing the Debian root module (systemd boots slower than the example: give it a few minutes under TCG)"
  ctl module push debian:12 .cache/debian-root.erofs >/dev/null
  ctl template get debian >/dev/null 2>&1 || ctl template create debian --root debian:12 >/dev/null
  ctl node get demo-debian >/dev/null 2>&1 || ctl node create demo-debian --template debian >/dev/null
  node=demo-debian template=debian
fi

say "provisioning one QEMU instance of node $node"
# The instance's id is the first "id" of the response.
id=$(ctl instance provision --node "$node" --provider qemu -o json | grep -o '"id": *"[^"]*"' | head -1 | cut -d'"' -f4)

# 5. Follow the boot: one line per change of status or agent phase.
# The agent prints one line per phase on the serial console; heartbeats
# reach the control plane in batches, so the console is the finer view.
say "booting instance $id (serial console: agent phases; then the control plane's view)"
(ctl instance console "$id" --follow 2>/dev/null | grep --line-buffered -E "tether-agent: (phase|enrolled|pulled|FAILED)" | sed -u 's/^/  console  /') 2>/dev/null &
follower=$!
# Its stderr is dropped and it is reaped here: the subshell says
# "Terminated" when its pipeline is killed, in the middle of the
# instructions below.
stop_follower() { pkill -P "$follower" 2>/dev/null || true; kill "$follower" 2>/dev/null || true; wait "$follower" 2>/dev/null || true; }
ctl instance wait "$id" | sed -u 's/^/  tetherd /' || { stop_follower; die "the boot did not finish; console: bin/tetherctl instance console $id"; }
sleep 0.5
stop_follower

# A pool made in an earlier run is there to claim from; else, make one.
pooltry="bin/tetherctl pool create ci --template $template --provider qemu --target 2"
if ctl pool get ci >/dev/null 2>&1; then
  pooltry="bin/tetherctl pool acquire ci    # pool ci, made in an earlier run"
fi

cat <<EOF2

Instance $id is running. Try, in another terminal:

  export TETHERCONFIG=$TETHERCONFIG
  bin/tetherctl instance list
  bin/tetherctl task create --instance $id --wait exec -- cat /etc/os-release
  bin/tetherctl instance console $id
  $pooltry
  bin/tetherctl events --watch

tetherd keeps running; Ctrl-C here terminates the VMs and stops it.
EOF2
# Until Ctrl-C. Should tetherd end first, say so before the stop.
wait "$tetherd" && st=0 || st=$?
how="with status $st"
[ "$st" -le 128 ] || how="killed by signal $((st - 128))"
echo "make run: tetherd exited on its own ($how); its log: $data/tetherd.log" >&2
# A tetherd that ends under make run is the run failing, even with status
# 0 (someone sent it TERM).
exit $((st == 0 ? 1 : st))
