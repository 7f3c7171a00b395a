#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite; exits non-zero on any failure.
# Tests labelled `slow` run only with --all. The suite runs twice: as built for users (release,
# build/), then under AddressSanitizer and UBSan (the asan preset, build-asan/, -O1; slow and
# GPU tests left out, and of the Python tests the bindings' own, under LeakSanitizer: the rest
# need an uninstrumented interpreter and skip, saying so). On 2 cores its tests take about 15
# minutes and its build 8 with a warm ccache (bench/RESULTS.md). GPU tests skip (with the
# reason) without a GPU.
# First the libFuzzer targets (clang, the `fuzz` preset, in build-fuzz/) run, each for
# ZINF_FUZZ_SECONDS: 20 by default, 60 with --all. Then the Python package as pip installs it:
# scripts/venv_test.sh builds the wheel and tests it in a fresh virtualenv under Debian's torch
# 1.13 and in build/venv-torch2/ under torch 2.x from pip (made on the first run: a few GB).
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
scripts/venv_test.sh --torch2
[ -f build-asan/build.ninja ] || cmake --preset asan >/dev/null
cmake --build build-asan -j "$(nproc)"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE "slow|cuda" "$@"
