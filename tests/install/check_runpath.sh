#!/usr/bin/env bash
# Fails naming every ELF file under the given files or directories whose RUNPATH or RPATH holds
# an entry other than $ORIGIN-relative ones (a build machine's directory, an empty entry,
# which the loader reads as the working directory). Installed zinf files find what ships with
# them relative to themselves and everything else through the loader's search path.
# Usage: check_runpath.sh PATH...    (used by install_test.sh and scripts/venv_test.sh)
set -euo pipefail
bad=0
checked=0
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  checked=$((checked + 1))
  # "Library runpath: [a:b]" / "Library rpath: [a:b]"
  while IFS= read -r paths; do
    IFS=: read -r -a entries <<<"$paths"
    [ "${paths: -1}" = ":" ] && entries+=("")
    for e in "${entries[@]}"; do
      # shellcheck disable=SC2016  # the literal text $ORIGIN, which the loader expands
      case "$e" in
        '$ORIGIN' | '$ORIGIN/'*) ;;
        *) echo "$f: RUNPATH entry '$e' is not relative to \$ORIGIN (all: $paths)" >&2; bad=1 ;;
      esac
    done
  done < <(readelf -d "$f" | sed -n 's/.*Library r\(un\)\?path: \[\(.*\)\]$/\2/p')
done < <(find "$@" -type f -print0)
if [ "$checked" -eq 0 ]; then
  echo "check_runpath: no ELF file under $*" >&2
  exit 1
fi
[ "$bad" -eq 0 ] || exit 1
echo "check_runpath: $checked ELF file(s), every RUNPATH \$ORIGIN-relative"
