#!/usr/bin/env bash
# Run every fuzz target in the repository for a short while each.
# Usage: scripts/fuzz.sh [DURATION]   (default 20s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-20s}
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r file; do
  pkg=./$(dirname "${file#./}")
  for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //'); do
    echo "== $pkg $target ($dur)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$dur" "$pkg"
  done
done
