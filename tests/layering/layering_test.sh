#!/usr/bin/env bash
# What of the layer list (docs/ARCHITECTURE.md) the compiler cannot enforce: public headers
# include only public headers, and examples and the Python binding use only public headers
# (they have the repository root on their include path). The libraries' order is the
# compiler's (Note [Layer include roots] in cmake/ZinfHelpers.cmake), and the layer list's
# agreement with it is layer_order_test.sh's. Prints each include that breaks the rule, and
# fails if there is one.
# Usage: layering_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"

# folder -> the include prefixes it may use.
declare -A allowed=(
  [include/zinf]="zinf"
  [examples]="zinf examples"
  # The CUDA allocator also uses the device pool.
  [python]="zinf offload python"
)

bad=0
for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    prefix=$(echo "$hit" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
    if [[ " ${allowed[$folder]} " != *" $prefix "* ]]; then
      echo "layering: $file includes \"$prefix/...\", which $folder may not"
      bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$folder" --include='*.h' --include='*.cc' --include='*.cu' || true)
done
# One mover (docs/ARCHITECTURE.md): the engine's bytes move between tiers through the tiered
# store, which it opens with the public TieredStore::Create; the engine's folders never reach
# the swap store, its options or the store's test side (the C ABI in src/capi wraps the swap
# store as a product of its own).
while IFS= read -r hit; do
  echo "layering: $hit: the engine may not use the swap store"
  bad=1
done < <(grep -rnE 'nvme/swap_store\.h|SwapStore|offload/tiered_store_internal\.h' \
  src/zero src/ckpt src/comm --include='*.h' --include='*.cc' || true)
if [ "$bad" -eq 0 ]; then
  echo "layering: public headers, examples and python include only public headers;" \
    "the engine moves bytes only through the tiered store"
fi
exit "$bad"
