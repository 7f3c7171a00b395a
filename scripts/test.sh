#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite; exits non-zero on any failure.
# Tests labelled `slow` run only with --all. GPU tests skip (with the reason) without a GPU.
# Usage: scripts/test.sh [--all] [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh

exclude=(-LE slow)
if [ "${1:-}" = "--all" ]; then
  exclude=()
  shift
fi

scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "${exclude[@]}" "$@"
