#!/usr/bin/env bash
# Installs what is missing, builds, and runs zinf's main job on this machine: a GPT-2-style
# byte-level model trained with ZeRO-3 on 2 ranks (`zinf run`), its parameters on NVMe (a
# directory under the build tree) and its AdamW state on the CPU, a few hundred steps with
# the loss falling; then a checkpoint of it, consolidated into one safetensors file.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh zinf train_gpt

work="$PWD/build/demo"
rm -rf "$work"
mkdir -p "$work/nvme"
echo
echo "== zinf info: what this machine offers for offload"
build/bin/zinf info --path "$work/nvme"
echo
echo "== GPT (0.8M parameters) on 2 ranks: ZeRO-3, parameters on NVMe, optimizer on CPU"
build/bin/zinf run -n 2 -- build/bin/train_gpt --config examples/gpt/configs/demo.json \
  --nvme-path "$work/nvme" --steps 300 --log-every 25 --save "$work/checkpoint" \
  --metrics "$work/metrics.jsonl"
echo
echo "== the 2 ranks' checkpoint as one safetensors file"
build/bin/zinf ckpt export "$work/checkpoint" --out "$work/gpt.safetensors" --dtype bf16
ls -l "$work/gpt.safetensors"
