#!/usr/bin/env bash
# Runs README.md's "Try it by hand" block as written, in a scratch data dir
# (the one substitution: /var/lib/tether), then terminates what it made.
# Skips loudly (exit 0, "SKIP") when a real VM cannot boot here.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
skip() { echo "SKIP (README e2e): $*"; exit 0; }
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
command -v jq >/dev/null || skip "jq is not installed (apt-get install jq); the README's block uses it"
[ -f .cache/kernel/vmlinuz ] || skip ".cache/kernel/vmlinuz is missing; run make kernel"
if (exec 3<>/dev/tcp/127.0.0.1/7443) 2>/dev/null; then
  skip "something already listens on 127.0.0.1:7443, where the README's tetherd listens"
fi

scratch=$(mktemp -d /tmp/tether-readme.XXXX)
block=$(awk '/^## Try it by hand/{on=1; next} on && /^```sh/{inb=1; next} inb && /^```/{exit} inb' README.md)
[ -n "$block" ] || { echo "readme.sh: no sh block under '## Try it by hand' in README.md" >&2; exit 1; }
script="$scratch/block.sh"
{
  echo 'set -euo pipefail'
  printf '%s\n' "${block//\/var\/lib\/tether/$scratch/data}"
} >"$script"

cleanup() {
  local rc=$?
  trap '' INT TERM PIPE
  set +e
  export TETHERCONFIG="$scratch/data/admin/tetherconfig.yaml"
  for id in $(bin/tetherctl instance list 2>/dev/null | awk 'NR > 1 && $5 == "qemu" && $3 != "terminated" {print $1}'); do
    bin/tetherctl instance terminate "$id" >/dev/null 2>&1 || echo "readme.sh: could not terminate $id"
  done
  for pidfile in "$scratch"/data/machines/*/qemu.pid; do
    [ -f "$pidfile" ] && kill -KILL "$(cat "$pidfile")" 2>/dev/null
  done
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$scratch"
  exit "$rc"
}
trap cleanup EXIT INT TERM
echo "readme.sh: running README.md's 'Try it by hand' block (data dir $scratch/data)"
# Sourced, so the block's background tetherd is a job of this shell and
# the cleanup finds it.
# shellcheck disable=SC1090
source "$script"
echo "readme.sh: the README block ran as written"
