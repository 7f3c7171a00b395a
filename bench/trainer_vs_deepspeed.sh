#!/usr/bin/env bash
# transformers' Trainer on the same causal-LM script (tests/python/hf_trainer_clm.py) three
# ways, interleaved round by round: plain Trainer (PyTorch alone, the limit of any engine that
# runs its forward and backward), Trainer on zinf (zinf.hf) and Trainer on DeepSpeed, both with
# Hugging Face's ZeRO-3 offload config as shipped (parameters and optimizer on the CPU). The
# figure is Trainer's own train_runtime (start-up and imports left out); medians and the
# ratios to zinf's are printed, each round's too.
# Needs the virtualenv of bench/vs_deepspeed.sh (deepspeed, transformers, accelerate) and the
# build's Python package (scripts/build.sh _zinf).
# Usage: bench/trainer_vs_deepspeed.sh [ROUNDS] [extra hf_trainer_clm.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=${1:-5}
shift || true
venv=${ZINF_DS_VENV:-$root/build/venv-deepspeed}
py=$venv/bin/python
"$py" -c 'import deepspeed, transformers, accelerate' 2>/dev/null ||
  { echo "trainer_vs_deepspeed: $venv lacks deepspeed, transformers or accelerate" >&2; exit 1; }
work=$(mktemp -d "$root/build/trainer-vs-ds-XXXXXX")
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$root/build/python DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$root/build/vs-deepspeed/torch_extensions}
args=(--model_type gpt2 --hidden 256 --layers 4 --block_size 64 --max_steps 20
      --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 1e-3
      --logging_steps 5 --save_strategy no --report_to none --use_cpu "$@")
config=tests/data/deepspeed_configs/hf_zero3_auto.json
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(date -u +%F)"
echo "round torch zinf deepspeed (train_runtime, s)"
for r in $(seq 1 "$rounds"); do
  line="$r"
  for side in torch zinf deepspeed; do
    out=$work/$side-$r
    case $side in
      torch) env ZINF_TRAINER=transformers "$py" tests/python/hf_trainer_clm.py "${args[@]}" \
               --output_dir "$out" >"$out.log" 2>&1 ;;
      zinf) env ZINF_TRAINER=zinf "$py" tests/python/hf_trainer_clm.py "${args[@]}" \
              --output_dir "$out" --deepspeed "$config" >"$out.log" 2>&1 ;;
      deepspeed) env ZINF_TRAINER=transformers RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
                   MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29600 + r)) \
                   "$py" tests/python/hf_trainer_clm.py "${args[@]}" --output_dir "$out" \
                   --deepspeed "$config" >"$out.log" 2>&1 ;;
    esac || { tail -20 "$out.log" >&2; echo "trainer_vs_deepspeed: $side failed" >&2; exit 1; }
    line="$line $("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_runtime"])' \
                  "$out/losses.json")"
  done
  echo "$line" | tee -a "$work/rows"
done
"$py" - "$work/rows" <<'PY'
import statistics, sys
rows = [list(map(float, line.split()[1:])) for line in open(sys.argv[1])]
torch_, zinf, ds = (statistics.median(c) for c in zip(*rows))
print(f"median train_runtime: torch {torch_:.2f} s, zinf {zinf:.2f} s, deepspeed {ds:.2f} s")
print(f"deepspeed / zinf: {statistics.median(r[2] / r[1] for r in rows):.2f} "
      f"(rounds: {', '.join(f'{r[2] / r[1]:.2f}' for r in rows)})")
print(f"zinf / torch alone: {statistics.median(r[1] / r[0] for r in rows):.2f}")
PY
