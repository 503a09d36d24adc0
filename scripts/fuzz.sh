#!/usr/bin/env bash
# Run every fuzz target in the repository for a short while each.
# Usage: scripts/fuzz.sh [DURATION]   (default 20s per target)
#   FUZZ_ONLY=REGEX     run only targets whose name matches REGEX
#   FUZZ_PARALLEL=N     fuzz workers per target (default: go's, one per core)
#   FUZZ_KEEP_CORPUS=1  copy the inputs the run found interesting from the Go
#                       cache into the package's testdata/fuzz/<Target>/, so
#                       the corpus is kept in the repository and replayed by
#                       every plain `go test`
#   FUZZ_TMPDIR=DIR     where targets make their temp dirs (default: /dev/shm
#                       when it is there): targets that write files and fsync
#                       them, as FuzzErofsHeader's blob store does twice per
#                       input, run faster in memory (FuzzErofsHeader, one
#                       worker, 20 s: 17,060 executions on disk, 43,628 here)
# The long campaign recorded in docs/reliability.md ran as
#   FUZZ_PARALLEL=1 FUZZ_KEEP_CORPUS=1 FUZZ_ONLY='...' scripts/fuzz.sh 10m
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-20s}
only=${FUZZ_ONLY:-.}
par=()
if [ -n "${FUZZ_PARALLEL:-}" ]; then par=(-parallel "$FUZZ_PARALLEL"); fi
tmp=${FUZZ_TMPDIR:-}
if [ -z "$tmp" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then tmp=/dev/shm; fi
module=$(go list -m)
cache=$(go env GOCACHE)/fuzz
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r file; do
  dir=$(dirname "${file#./}")
  pkg=./$dir
  for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //'); do
    [[ $target =~ $only ]] || continue
    echo "== $pkg $target ($dur) $(date -u +%H:%M:%S)"
    TMPDIR=${tmp:-${TMPDIR:-/tmp}} go test -run '^$' -fuzz "^${target}\$" -fuzztime "$dur" "${par[@]}" "$pkg"
    if [ "${FUZZ_KEEP_CORPUS:-}" = 1 ] && [ -d "$cache/$module/$dir/$target" ]; then
      mkdir -p "$dir/testdata/fuzz/$target"
      cp -n "$cache/$module/$dir/$target"/* "$dir/testdata/fuzz/$target/" 2>/dev/null || true
      echo "   corpus: $(ls "$dir/testdata/fuzz/$target" | wc -l) inputs in $dir/testdata/fuzz/$target"
    fi
  done
done
