#!/usr/bin/env bash
# Training tokens/s of train_gpt (one rank, everything in memory) against PyTorch (Debian's
# python3-torch) on the same model, batch, optimizer and thread count, interleaved (zinf,
# torch, zinf, ...) so that drift hits both alike. zinf runs with activation checkpointing
# off, as PyTorch does here, and on (its default, which recomputes each block's forward).
# Usage: bench/gpt_vs_torch.sh [config=examples/gpt/configs/memory.json] [reps=3] [threads=2]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-examples/gpt/configs/memory.json}
reps=${2:-3}
threads=${3:-2}
steps=40
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "bench/gpt_vs_torch.sh needs Debian's PyTorch: apt-get install python3-torch" >&2
  exit 1
fi
scripts/build.sh train_gpt >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sed 's/"model": {/"model": {"activation_checkpointing": false, /' "$config" >"$out/nockpt.json"
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
zinf_rate() {  # median tokens/s of the steps after the first five
  build/bin/train_gpt --config "$1" --steps $steps --threads "$threads" --metrics "$out/m.jsonl" >/dev/null
  tail -n +6 "$out/m.jsonl" | sed -E 's/.*"tokens_per_s": ?([0-9.eE+-]+).*/\1/' | median
}
for ((rep = 0; rep < reps; ++rep)); do
  zinf_rate "$out/nockpt.json" >>"$out/zinf.txt"
  /usr/bin/python3 bench/gpt_torch_speed.py "$config" $steps "$threads" |
    sed -E 's/.*"tokens_per_s": ?([0-9.eE+-]+).*/\1/' >>"$out/torch.txt"
  zinf_rate "$config" >>"$out/zinf_ckpt.txt"
done
z=$(median <"$out/zinf.txt")
t=$(median <"$out/torch.txt")
zc=$(median <"$out/zinf_ckpt.txt")
echo "model: $(grep '"model"' "$config" | sed 's/^ *//')"
echo "zinf (no activation checkpointing): $z tokens/s (runs: $(tr '\n' ' ' <"$out/zinf.txt"))"
echo "zinf (activation checkpointing):    $zc tokens/s (runs: $(tr '\n' ' ' <"$out/zinf_ckpt.txt"))"
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'):                    $t tokens/s (runs: $(tr '\n' ' ' <"$out/torch.txt"))"
awk -v z="$z" -v zc="$zc" -v t="$t" 'BEGIN {printf "zinf / PyTorch: %.3f (no checkpointing), %.3f (checkpointing)\n", z / t, zc / t}'
