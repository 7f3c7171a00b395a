#!/usr/bin/env bash
# Installs what is missing, builds, and runs zinf's main job on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh zinf

data_dir="$PWD/build/demo-nvme"
mkdir -p "$data_dir"
echo "== zinf info: what this machine offers for offload"
build/bin/zinf info --path "$data_dir"
