#!/usr/bin/env bash
# Safetensors header parsing, this build against the parser of bc42780 (ordered_json), which
# took seconds for tens of thousands of tensors (issue 36). Needs build/ (scripts/build.sh).
# Usage: bench/safetensors_header.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh zinf_ckpt zinf_cpu_optim zinf_core > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The old parser, in a namespace of its own, up to its ParseSafetensorsHeader.
git show bc42780:src/ckpt/safetensors.cc |
  sed 's/^namespace zinf::ckpt {/namespace zinf::ckpt_old {\nusing namespace zinf::ckpt;/' |
  awk '/^StatusOr<SafetensorsReader> SafetensorsReader::Open/ { print "}"; exit } { print }' |
  sed 's/^std::string_view SafetensorsDtypeName(/std::string_view SafetensorsDtypeNameOld(/' \
  > "$work/old_safetensors.cc"
g++ -std=c++20 -O2 -DNDEBUG -I. -Iinclude -Isrc bench/safetensors_header_bench.cc \
  "$work/old_safetensors.cc" build/lib/libzinf_ckpt.a build/lib/libzinf_cpu_optim.a \
  build/lib/libzinf_core.a -lfmt -ltbb -lspdlog -o "$work/bench"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(grep -o -E 'amx_tile|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$work/bench"
