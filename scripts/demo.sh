#!/usr/bin/env bash
# Installs what is missing, builds, and runs zinf's main job on this machine: what the machine
# offers, then a ZeRO-Infinity optimizer step whose fp32 params and AdamW state live on NVMe,
# pipelined (read chunk i+1 | update chunk i | write chunk i-1) inside a small host budget,
# against its I/O-only and compute-only halves.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh zinf

data_dir="$PWD/build/demo-nvme"
mkdir -p "$data_dir"
echo
echo "== zinf info: what this machine offers for offload"
build/bin/zinf info --path "$data_dir"
echo
echo "== AdamW step over 128M parameters with state on NVMe (2 GiB), host budget 512 MiB"
build/bin/zinf bench optimizer-step --params 128M --state-tier nvme --path "$data_dir" \
  --host-budget 512MiB --reps 3
