#!/usr/bin/env bash
# GPT training tokens/s with bf16 matmuls (oneDNN on the CPU's bf16 dot products: bf16 inputs,
# fp32 accumulation) against the fp32 path, and against PyTorch in fp32 and in bf16 autocast,
# on the same model, batch, optimizer and thread count, in one run. The arms alternate within
# each repetition (A B C ..., A B C ...), so that this shared machine's drift hits all alike;
# each figure is the median over repetitions of a run's median step rate.
#   as shipped  train_gpt --config CONFIG (fp32 parameter tier, fp32 matmuls)
#   fp32 path   the config with "bf16": {"enabled": true}, train_gpt --matmul fp32
#   bf16        the same config, train_gpt --matmul bf16 (what --matmul auto picks there)
#   PyTorch     bench/gpt_torch_speed.py fp32 | bf16 (Debian's python3-torch; all in memory,
#               no activation checkpointing), unless torch=0 or the config offloads to NVMe
# The two zinf bf16-config arms differ only in the matmuls' input type; "as shipped" shows
# what the 16-bit parameter tier itself changes. Per arm the script also prints the median
# compute seconds per step (forward, backward, recomputation: where the matmuls are).
# Usage: bench/gpt_bf16.sh [config=examples/gpt/configs/memory.json] [reps=3] [steps=40]
#                          [ranks=1] [torch=1] [shipped=1]
# shipped=0 leaves the "as shipped" arm out (for the 1B config, whose runs take minutes).
# Multi-rank configs (ranks > 1) run under `zinf run -n ranks`, each rank on an equal share of
# the CPUs. @NVME_PATH@ in a config becomes a scratch directory under build/.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-examples/gpt/configs/memory.json}
reps=${2:-3}
steps=${3:-40}
ranks=${4:-1}
torch=${5:-1}
shipped=${6:-1}
threads=2
skip=$((steps >= 20 ? 5 : 1))  # warm-up steps left out of each run's median
if grep -q '@NVME_PATH@' "$config"; then torch=0; fi
if [ "$torch" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "no PyTorch under /usr/bin/python3 (apt-get install python3-torch): torch arms skipped" >&2
  torch=0
fi
scripts/build.sh zinf train_gpt >/dev/null
out=$(mktemp -d)
nvme=$PWD/build/bench-gpt-bf16-nvme
trap 'rm -rf "$out" "$nvme"' EXIT
sed 's/"gradient_clipping"/"bf16": {"enabled": true}, "gradient_clipping"/' "$config" >"$out/bf16.json"
grep -q '"bf16": {"enabled": true}' "$out/bf16.json" || {
  echo "cannot add bf16 to $config (it needs a gradient_clipping key)" >&2
  exit 1
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
field() { sed -E "s/.*\"$1\": ?([0-9.eE+-]+).*/\1/"; }
zinf_run() {  # arm config [train_gpt flags...]: appends the run's median tokens/s and compute s
  local arm=$1 cfg=$2
  shift 2
  rm -rf "$nvme" && mkdir -p "$nvme"
  local launch=(build/bin/train_gpt)
  if ((ranks > 1)); then
    launch=(build/bin/zinf run -n "$ranks" -- build/bin/train_gpt)
  else
    launch+=(--threads "$threads")
  fi
  "${launch[@]}" --config "$cfg" --nvme-path "$nvme" --steps "$steps" \
    --metrics "$out/m.jsonl" "$@" >"$out/log.txt" 2>&1 || {
    cat "$out/log.txt" >&2
    exit 1
  }
  tail -n +$((skip + 1)) "$out/m.jsonl" | field tokens_per_s | median >>"$out/$arm.rate"
  tail -n +$((skip + 1)) "$out/m.jsonl" | field compute_s | median >>"$out/$arm.compute"
  grep -m1 "matmuls in" "$out/log.txt" | sed -E 's/.*matmuls in ([a-z0-9]+).*/\1/' >"$out/$arm.type"
}
torch_run() {  # arm precision
  /usr/bin/python3 bench/gpt_torch_speed.py "$config" "$steps" "$threads" "$2" |
    field tokens_per_s >>"$out/$1.rate"
}

arms=(fp32 bf16)
((shipped)) && arms=(shipped "${arms[@]}")
((torch)) && arms+=(torch_fp32 torch_bf16)
echo "config: $config ($(grep '"model"' "$config" | sed 's/^ *//'))"
echo "$reps repetitions of $steps steps (median of steps $((skip + 1))-$steps), $ranks rank(s), $threads threads in all; $(date -u +%FT%TZ), $(git rev-parse --short HEAD)"
for ((rep = 0; rep < reps; ++rep)); do
  if ((shipped)); then zinf_run shipped "$config"; fi
  zinf_run fp32 "$out/bf16.json" --matmul fp32
  zinf_run bf16 "$out/bf16.json" --matmul bf16
  if ((torch)); then
    torch_run torch_fp32 fp32
    torch_run torch_bf16 bf16
  fi
done

[ "$(cat "$out/bf16.type")" = bf16 ] || {
  echo "the bf16 arm did not multiply in bf16" >&2
  exit 1
}
printf "%-44s %12s %14s  %s\n" arm "tokens/s" "compute s/step" runs
label() {
  case $1 in
    shipped) echo "zinf, config as shipped (fp32)" ;;
    fp32) echo "zinf, bf16 parameters, fp32 matmuls" ;;
    bf16) echo "zinf, bf16 parameters, bf16 matmuls" ;;
    torch_fp32) echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') fp32" ;;
    torch_bf16) echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') bf16 autocast" ;;
  esac
}
for arm in "${arms[@]}"; do
  compute=-
  [ -f "$out/$arm.compute" ] && compute=$(median <"$out/$arm.compute")
  printf "%-44s %12.0f %14s  %s\n" "$(label "$arm")" "$(median <"$out/$arm.rate")" "$compute" \
    "$(tr '\n' ' ' <"$out/$arm.rate" | awk '{for (i = 1; i <= NF; ++i) printf "%.0f ", $i}')"
done
m() { median <"$out/$1.rate"; }
awk -v b="$(m bf16)" -v f="$(m fp32)" -v s="$( ((shipped)) && m shipped || echo 0)" \
  -v cb="$(median <"$out/bf16.compute")" -v cf="$(median <"$out/fp32.compute")" 'BEGIN {
  printf "bf16 / fp32 matmuls: %.3f in tokens/s, %.3f in compute time (fp32 / bf16)", b / f, cf / cb
  if (s > 0) printf "; bf16 / as shipped: %.3f", b / s
  printf "\n"
}'
if ((torch)); then
  awk -v b="$(m bf16)" -v f="$(m fp32)" -v tb="$(m torch_bf16)" -v tf="$(m torch_fp32)" 'BEGIN {
    printf "zinf / PyTorch: %.2f in fp32, %.2f in bf16; PyTorch bf16 / fp32: %.2f\n", f / tf, b / tb, tb / tf
  }'
fi
