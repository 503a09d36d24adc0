#!/usr/bin/env bash
# make run: the main job for a newcomer. Initialises a data dir under .tether/
# if there is none, then serves it in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
data=.tether
make build >/dev/null
if [ ! -f "$data/ca/ca.crt" ]; then
  bin/tetherd init --data-dir "$data"
fi
exec bin/tetherd serve --data-dir "$data"
