#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite; exits non-zero on any failure.
# Tests labelled `slow` run only with --all, and so does the suite's second run under
# AddressSanitizer and UBSan (the asan preset, build-asan/: about 8 minutes of build and 25 of
# tests on 2 cores, too long for every CI run; the fuzzers below are instrumented with both
# and always run). GPU tests skip (with the reason) without a GPU.
# First the libFuzzer targets (clang, the `fuzz` preset, in build-fuzz/) run, each for
# ZINF_FUZZ_SECONDS: 20 by default, 60 with --all. Last, the Python package as pip installs it:
# scripts/venv_test.sh builds the wheel and tests it in a fresh virtualenv under Debian's torch
# 1.13 and in build/venv-torch2/ under torch 2.x from pip (made on the first run: a few GB).
# Usage: scripts/test.sh [--all] [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh

exclude=(-LE slow)
fuzz_seconds=20
sanitized=""
if [ "${1:-}" = "--all" ]; then
  exclude=()
  fuzz_seconds=60
  sanitized=1
  shift
fi

scripts/build.sh
[ -f build-fuzz/build.ninja ] || cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target fuzzers -j "$(nproc)"

ZINF_FUZZ_SECONDS="${ZINF_FUZZ_SECONDS:-$fuzz_seconds}" \
  ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)" -L fuzz
ctest --test-dir build --output-on-failure -j "$(nproc)" "${exclude[@]}" "$@"
scripts/venv_test.sh --torch2
if [ -n "$sanitized" ]; then
  [ -f build-asan/build.ninja ] || cmake --preset asan >/dev/null
  cmake --build build-asan -j "$(nproc)"
  # The Python tests need the sanitizer's runtime preloaded (they skip, saying so).
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE "slow|python|cuda" "$@"
fi
