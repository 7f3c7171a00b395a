#!/usr/bin/env bash
# The layer table of docs/ARCHITECTURE.md (its "## Layout" section) held to the build's link
# graph (written by layer_links.cmake): every row is a folder of the tree, every folder that
# defines a target has a row, and each target links only targets of its own row or of rows the
# table lists before it. Then, to prove that the check bites, the same check with the rows LOWER
# and UPPER swapped (UPPER's targets link LOWER's) must fail. Prints each disagreement, and fails
# if there is one.
# Usage: layer_order_test.sh SOURCE_DIR LINKS_FILE LOWER UPPER
set -euo pipefail
source_dir=$1 links_file=$2 lower=$3 upper=$4
doc=docs/ARCHITECTURE.md
cd "$source_dir"

# The table's folders, in order, without their trailing slash. (The backquotes are Markdown's.)
# shellcheck disable=SC2016
mapfile -t rows < <(awk '/^## Layout/ { on = 1; next } /^## / { on = 0 } on' "$doc" |
  sed -nE 's/^\| `([^`]+)` \|.*/\1/p' | sed 's:/$::')
if [ "${#rows[@]}" -eq 0 ]; then
  echo "layering: found no table of folders under \"## Layout\" in $doc"
  exit 1
fi

# target -> its folder; target -> the targets it links.
declare -A folder_of links_of
while IFS=$'\t' read -r target folder deps; do
  folder_of[$target]=$folder
  links_of[$target]=$deps
done <"$links_file"
if [ "${#folder_of[@]}" -eq 0 ]; then
  echo "layering: $links_file lists no targets"
  exit 1
fi
mapfile -t targets < <(printf '%s\n' "${!folder_of[@]}" | sort)

# Sets `row` to the index of the row that holds folder $1 (the longest row that is the folder
# or a folder above it), or to "" when none does.
row_of() {
  local i r best_len=-1
  row=""
  for i in "${!rows[@]}"; do
    r=${rows[$i]}
    if [[ "$1" == "$r" || "$1" == "$r/"* ]] && ((${#r} > best_len)); then
      row=$i
      best_len=${#r}
    fi
  done
}

# Checks `rows` against the links; prints each disagreement once; returns 1 if there is one.
check() {
  local target dep target_row out=""
  for target in "${targets[@]}"; do
    row_of "${folder_of[$target]}"
    if [ -z "$row" ]; then
      out+="layering: $target is defined in ${folder_of[$target]:-.}/, which no row of"
      out+=" $doc's Layout table holds"$'\n'
      continue
    fi
    target_row=$row
    for dep in ${links_of[$target]}; do
      [ -n "${folder_of[$dep]+x}" ] || continue
      row_of "${folder_of[$dep]}"
      if [ -n "$row" ] && ((row > target_row)); then
        out+="layering: $doc lists \`${rows[$target_row]}/\` before \`${rows[$row]}/\`, but"
        out+=" $target (${folder_of[$target]}/) links $dep (${folder_of[$dep]}/)"$'\n'
      fi
    done
  done
  [ -z "$out" ] && return 0
  printf '%s' "$out" | sort -u
  return 1
}

bad=0
for r in "${rows[@]}"; do
  if [ ! -d "$r" ]; then
    echo "layering: $doc's Layout table has a row for $r/, which is not a folder of the tree"
    bad=1
  fi
done
check || bad=1

# The check must notice a wrong order: swap LOWER and UPPER and expect it to complain.
lower_at="" upper_at=""
for i in "${!rows[@]}"; do
  [ "${rows[$i]}" == "$lower" ] && lower_at=$i
  [ "${rows[$i]}" == "$upper" ] && upper_at=$i
done
if [ -z "$lower_at" ] || [ -z "$upper_at" ] || ((lower_at > upper_at)); then
  echo "layering: the self-check wants rows $lower/ before $upper/ in $doc's Layout table"
  exit 1
fi
rows[lower_at]=$upper
rows[upper_at]=$lower
if check >/dev/null; then
  echo "layering: with $upper/ listed before $lower/ the check found nothing wrong; it checks nothing"
  exit 1
fi

if [ "$bad" -eq 0 ]; then
  echo "layering: the Layout table of $doc lists the ${#rows[@]} folders in their link order" \
    "(${#targets[@]} targets), and notices $upper/ put before $lower/"
fi
exit "$bad"
