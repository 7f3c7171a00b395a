#!/usr/bin/env bash
# Installs what is missing, builds, and runs zinf's main job on this machine: what the machine
# offers; a ZeRO-Infinity optimizer step whose fp32 params and AdamW state live on NVMe,
# pipelined (read chunk i+1 | update chunk i | write chunk i-1) inside a small host budget,
# against its I/O-only and compute-only halves; then an MLP trained with ZeRO-3 on 2 ranks
# with its optimizer state on NVMe.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh zinf train_mlp

data_dir="$PWD/build/demo-nvme"
mkdir -p "$data_dir"
echo
echo "== zinf info: what this machine offers for offload"
build/bin/zinf info --path "$data_dir"
echo
echo "== AdamW step over 128M parameters with state on NVMe (2 GiB), host budget 512 MiB"
build/bin/zinf bench optimizer-step --params 128M --state-tier nvme --path "$data_dir" \
  --host-budget 512MiB --reps 3
echo
echo "== ZeRO-3 on 2 ranks (zinf run), 4.2M-parameter MLP, AdamW state on NVMe: loss should fall"
build/bin/zinf run -n 2 -- build/bin/train_mlp --config examples/mlp/configs/nvme.json \
  --nvme-path "$data_dir" --layers 4 --width 1024 --steps 12
