#!/usr/bin/env bash
# The layer list of docs/ARCHITECTURE.md, enforced: every #include "folder/..." in a library
# folder names its own folder or one below it, and examples use public headers only. Prints
# each include that breaks the order, and fails if there is one.
# Usage: layering_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"

# folder -> the include prefixes it may use (its own and those below it).
declare -A allowed=(
  [include/zinf]="zinf"
  [src/core]="zinf core"
  [nvme]="zinf core nvme"
  [cpu_optim]="zinf core cpu_optim"
  [offload]="zinf core nvme cpu_optim offload"
  [src/comm]="zinf core nvme cpu_optim offload comm"
  [src/ckpt]="zinf core nvme cpu_optim offload comm ckpt"
  [src/zero]="zinf core nvme cpu_optim offload comm ckpt zero"
  [src/capi]="zinf core nvme cpu_optim offload comm ckpt zero capi"
  [tools]="zinf core nvme cpu_optim offload comm ckpt zero capi tools"
  [examples]="zinf examples"
  # The Python binding uses public headers; the CUDA allocator also the device pool.
  [python]="zinf offload python"
)

bad=0
for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    prefix=$(echo "$hit" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
    if [[ " ${allowed[$folder]} " != *" $prefix "* ]]; then
      echo "layering: $file includes \"$prefix/...\", above $folder in the layer list"
      bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$folder" --include='*.h' --include='*.cc' --include='*.cu' || true)
done
if [ "$bad" -eq 0 ]; then echo "layering: every include follows the layer list"; fi
exit "$bad"
