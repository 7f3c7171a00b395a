#!/usr/bin/env bash
# Times examples/mlp/train_mlp under each offload placement (all in memory; CPU; optimizer
# state on NVMe; parameters and optimizer state on NVMe, "infinity") for 2 and 4 ranks,
# interleaving the placements (memory, cpu, nvme, infinity, memory, ...) so that drift hits
# them alike, and prints each median step time, its ratio to the all-in-memory step, and the
# bytes moved per link per step (rank 0's view).
# Usage: bench/zero_placements.sh [reps=3] [width=1536] [layers=4] [placements="cpu nvme infinity"]
#   placements: configs of examples/mlp/configs (e.g. add infinity-bf16); memory always runs,
#   as the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
width=${2:-1536}
layers=${3:-4}
placements="memory $(echo "${4:-cpu nvme infinity}" | tr ' ' '\n' | grep -vx memory | tr '\n' ' ')"
scripts/build.sh zinf train_mlp >/dev/null
nvme_dir="$PWD/build/bench-zero-nvme"
mkdir -p "$nvme_dir"
echo "train_mlp: $layers layers of ${width}x${width}, micro-batch 16, 6 steps (median of steps 2-6),"
echo "ZeRO-3, AdamW; $reps interleaved repetitions; nvme path $nvme_dir"
for ranks in 2 4; do
  declare -A times=()
  declare -A lines=()
  for ((rep = 0; rep < reps; ++rep)); do
    for placement in $placements; do
      out=$(build/bin/zinf run -n "$ranks" -- build/bin/train_mlp \
        --config "examples/mlp/configs/$placement.json" --nvme-path "$nvme_dir" \
        --layers "$layers" --width "$width" --steps 6 | grep '"median_step_s"' | sed 's/^\[rank 0\] //')
      times[$placement]+="$(echo "$out" | sed -E 's/.*"median_step_s": ([0-9.]+).*/\1/') "
      lines[$placement]=$out
    done
  done
  base=$(echo ${times[memory]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  for placement in $placements; do
    med=$(echo ${times[$placement]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    ratio=$(awk -v m="$med" -v b="$base" 'BEGIN { printf "%.3f", m / b }')
    echo "ranks $ranks  $placement: median step ${med} s (runs: ${times[$placement]}), x$ratio of memory"
    echo "    per step: ${lines[$placement]}"
  done
  unset times lines
done
rm -rf "$nvme_dir"
