#!/usr/bin/env bash
# GPT training tokens/s with bf16 matmuls (oneDNN on the CPU's bf16 dot products: bf16 inputs,
# fp32 accumulation) against the fp32 path, and PyTorch in fp32 and in bf16 autocast, on the
# same model, batch, optimizer and thread count, in one run.
#   zinf     build/bin/gpt_bf16_bench: the arms "shipped" (the config as given), "fp32" (the
#            config with bf16 enabled, fp32 matmuls: the fp32 path) and "bf16" (the same, bf16
#            matmuls) as three engines in one process, a step of each in turn
#   PyTorch  bench/gpt_torch_speed.py both: Debian's python3-torch, fp32 and bf16 autocast
#            side by side in one process, a step of each in turn (all in memory, no
#            activation checkpointing); left out for configs that offload to NVMe
# Each repetition runs zinf, then PyTorch. Figures: the median over repetitions of each run's
# median step rate; ratios within a process are medians of per-step ratios, so that this
# shared machine's load, which moves a single run's rate several-fold, cancels in them.
# zinf / PyTorch compares separate processes and carries that noise.
# Usage: bench/gpt_bf16.sh [config=examples/gpt/configs/memory.json] [reps=3] [steps=40]
#                          [arms=shipped,fp32,bf16] [torch=1]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-examples/gpt/configs/memory.json}
reps=${2:-3}
steps=${3:-40}
arms=${4:-shipped,fp32,bf16}
torch=${5:-1}
threads=2
warmup=$((steps >= 20 ? 5 : 1))
if grep -q '@NVME_PATH@' "$config"; then torch=0; fi
if [ "$torch" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "no PyTorch under /usr/bin/python3 (apt-get install python3-torch): PyTorch left out" >&2
  torch=0
fi
scripts/build.sh gpt_bf16_bench >/dev/null
out=$(mktemp -d)
nvme=$PWD/build/bench-gpt-bf16-nvme
trap 'rm -rf "$out" "$nvme"' EXIT

field() { sed -E "s/.*\"$1\": ?([0-9.eE+-]+).*/\1/"; }
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
echo "config: $config ($(grep '"model"' "$config" | sed 's/^ *//'))"
echo "$reps repetitions of $steps steps per arm (median of steps $((warmup + 1))-$steps), $threads threads; $(date -u +%FT%TZ), $(git rev-parse --short HEAD)"
for ((rep = 0; rep < reps; ++rep)); do
  build/bin/gpt_bf16_bench --config "$config" --steps "$steps" --warmup "$warmup" \
    --threads "$threads" --arms "$arms" --nvme-path "$nvme" --json >"$out/zinf.txt"
  ((rep == 0)) && grep -E "^gpt_bf16_bench|^  " "$out/zinf.txt"
  json=$(tail -1 "$out/zinf.txt")
  for arm in ${arms//,/ }; do
    echo "$json" | python3 -c "import json,sys; a=json.load(sys.stdin)['arms']['$arm']; print(a['tokens_per_s'], a['compute_s'])" >>"$out/$arm"
  done
  if [[ $json == *bf16_over_fp32* ]]; then echo "$json" | field bf16_over_fp32 >>"$out/zinf_ratio"; fi
  if ((torch)); then
    /usr/bin/python3 bench/gpt_torch_speed.py "$config" "$steps" "$threads" both >"$out/torch.txt"
    field fp32 <"$out/torch.txt" >>"$out/torch_fp32"
    field bf16 <"$out/torch.txt" >>"$out/torch_bf16"
    field bf16_over_fp32 <"$out/torch.txt" >>"$out/torch_ratio"
  fi
done

printf "%-40s %10s %15s  %s\n" "" "tokens/s" "compute s/step" "runs (tokens/s)"
for arm in ${arms//,/ }; do
  printf "%-40s %10.1f %15.4f  %s\n" "zinf $arm" "$(cut -d' ' -f1 "$out/$arm" | median)" \
    "$(cut -d' ' -f2 "$out/$arm" | median)" "$(cut -d' ' -f1 "$out/$arm" | xargs printf '%.0f ')"
done
if ((torch)); then
  version=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')
  for arm in fp32 bf16; do
    printf "%-40s %10.1f %15s  %s\n" "PyTorch $version $arm" "$(median <"$out/torch_$arm")" - \
      "$(xargs printf '%.0f ' <"$out/torch_$arm")"
  done
fi
[ -s "$out/zinf_ratio" ] &&
  echo "zinf bf16 / fp32 matmuls (paired steps): $(median <"$out/zinf_ratio" | xargs printf %.3f) (runs: $(xargs printf '%.3f ' <"$out/zinf_ratio"))"
if ((torch)); then
  echo "PyTorch bf16 / fp32 (paired steps): $(median <"$out/torch_ratio" | xargs printf %.3f) (runs: $(xargs printf '%.3f ' <"$out/torch_ratio"))"
  awk -v zf="$(cut -d' ' -f1 "$out/fp32" | median)" -v zb="$(cut -d' ' -f1 "$out/bf16" | median)" \
    -v tf="$(median <"$out/torch_fp32")" -v tb="$(median <"$out/torch_bf16")" \
    'BEGIN {printf "zinf / PyTorch (separate processes): %.2f in fp32, %.2f in bf16\n", zf / tf, zb / tb}'
fi
