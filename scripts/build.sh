#!/usr/bin/env bash
# Configures (release preset, into build/) and builds the given targets, or everything.
# Usage: scripts/build.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake --preset release >/dev/null
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
