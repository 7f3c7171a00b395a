#!/usr/bin/env bash
# Every JSON parse outside the tests goes through one of the two functions that check the
# nesting depth first (Note [Bounded input] in src/core/input_file.cc): zinf::ParseJson and
# the examples' gpt::ParseJson. Fails naming any other call of nlohmann's parse, and any
# file read "until end of file" with an ifstream, which has no cap.
# Usage: json_parse_test.sh SOURCE_DIR
set -u
cd "$1" || exit 2
allowed='^(src/core/config_reader\.cc|examples/gpt/json_input\.cc):'
dirs=(src tools examples python offload nvme cpu_optim)
parses=$(grep -rnE --include='*.cc' --include='*.h' --include='*.cu' \
  '(json|ordered_json|basic_json<[^>]*>)::parse\(|::sax_parse\(' "${dirs[@]}" |
  grep -vE "$allowed")
# rdbuf() into a stream reads a whole file with no cap; /proc files are the kernel's.
slurps=$(grep -rnE --include='*.cc' --include='*.h' 'rdbuf\(\)' "${dirs[@]}")
status=0
if [ -n "$parses" ]; then
  echo "JSON parsed without the depth check (use ParseJson / ReadJsonFile):"
  echo "$parses"
  status=1
fi
if [ -n "$slurps" ]; then
  echo "a file read whole without a cap (use ReadInputFile):"
  echo "$slurps"
  status=1
fi
[ $status -eq 0 ] && echo "every JSON parse checks its depth; every whole-file read is capped"
exit $status
