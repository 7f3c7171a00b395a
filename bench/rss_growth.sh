#!/usr/bin/env bash
# RSS growth per step of train_gpt (the demo-size GPT), from the rss_bytes of its --metrics
# lines: (RSS at the last step - RSS at step FROM) / (steps - FROM), for one rank with
# parameters, optimizer state and gradients on NVMe (the overlap on), and for two ranks in
# memory. Usage: bench/rss_growth.sh [BUILD_DIR] [STEPS] [FROM]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
steps="${2:-1000}"
from="${3:-100}"
work="$(mktemp -d "$build/rss-growth.XXXXXX")"
trap 'rm -rf "$work"' EXIT
growth() {
  python3 - "$1" "$from" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
first = next(r for r in rows if r["step"] == int(sys.argv[2]))
last = rows[-1]
per_step = (last["rss_bytes"] - first["rss_bytes"]) / (last["step"] - first["step"])
print(f"rss at step {first['step']} {first['rss_bytes'] / 1e6:.2f} MB, at step {last['step']} "
      f"{last['rss_bytes'] / 1e6:.2f} MB: {per_step:.1f} bytes/step")
PY
}
echo "== $build/bin/train_gpt, $steps steps, growth from step $from"
echo -n "1 rank, parameters, optimizer and gradients on NVMe, overlap: "
mkdir -p "$work/nvme"
"$build/bin/train_gpt" --config examples/gpt/configs/nvme.json --nvme-path "$work/nvme" \
  --set zinf.gradients_on_nvme=true --steps "$steps" --threads 1 --log-every 0 \
  --metrics "$work/nvme.jsonl" >/dev/null
growth "$work/nvme.jsonl"
echo -n "2 ranks in memory: "
"$build/bin/zinf" run -n 2 -- "$build/bin/train_gpt" --config examples/gpt/configs/memory.json \
  --steps "$steps" --threads 1 --log-every 0 --metrics "$work/memory.jsonl" >/dev/null
growth "$work/memory.jsonl"
