#!/usr/bin/env bash
# Note [Layer include roots], checked: compiles one-line probes with a library's own include
# path. An include of a layer it links (`below`) must compile; one of a layer above it
# (`above`) must fail with "No such file".
# Usage: compile_probe.sh COMPILER BELOW_HEADER ABOVE_HEADER -I... [-I...]
set -uo pipefail
compiler=$1 below=$2 above=$3
shift 3
probe() {
  local header=$1
  shift
  printf '#include "%s"\n' "$header" | "$compiler" -std=c++20 -fsyntax-only -x c++ "$@" - 2>&1
}
if ! out=$(probe "$below" "$@"); then
  echo "layering: \"$below\" should compile and does not:"; echo "$out"; exit 1
fi
if out=$(probe "$above" "$@"); then
  echo "layering: \"$above\", a layer above, compiles: a library's include path reaches it"; exit 1
fi
if [[ "$out" != *"$above: No such file"* ]]; then
  echo "layering: \"$above\" failed for another reason:"; echo "$out"; exit 1
fi
echo "layering: \"$below\" compiles, \"$above\" is out of reach"
