#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite; exits non-zero on any failure.
# Tests labelled `slow` run only with --all. GPU tests skip (with the reason) without a GPU.
# First the libFuzzer targets (clang, the `fuzz` preset, in build-fuzz/) run, each for
# ZINF_FUZZ_SECONDS: 20 by default, 60 with --all.
# Usage: scripts/test.sh [--all] [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh

exclude=(-LE slow)
fuzz_seconds=20
if [ "${1:-}" = "--all" ]; then
  exclude=()
  fuzz_seconds=60
  shift
fi

scripts/build.sh
[ -f build-fuzz/build.ninja ] || cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target fuzzers -j "$(nproc)"

ZINF_FUZZ_SECONDS="${ZINF_FUZZ_SECONDS:-$fuzz_seconds}" \
  ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)" -L fuzz
ctest --test-dir build --output-on-failure -j "$(nproc)" "${exclude[@]}" "$@"
