#!/usr/bin/env bash
# The `large` GPT config (>= 1B parameters; parameters and AdamW state on NVMe) for a few
# steps on one rank, against its limit measured in the same run: the step time over
# max(compute-only time, NVMe bytes moved / disk bandwidth), and the peak RSS.
#   compute-only: the model's forward and backward, the gradient reduction and the optimizer's
#                 CPU update, as train_gpt's metrics time them (no I/O waits)
#   disk:         fio's sequential O_DIRECT bandwidth on the same path at zinf's default aio
#                 settings (1 MiB, QD 8), with 2 MiB pages as zinf's staging has (see
#                 RESULTS.md, issue 3), measured before and after the training run on 4 GiB,
#                 and once more after it on a file as large as the run's swap space (its
#                 footprint); reads and writes are charged separately. A virtual disk with a
#                 cache in front of it serves 4 GiB from the cache and a footprint larger
#                 than the cache from the disk behind it (RESULTS.md, issue 35: 3 GB/s
#                 against 0.5-1 GB/s on one virtio disk), so the footprint figure is the
#                 limit of a run whose swap outgrows that cache; both are printed.
# Usage: bench/gpt_large.sh [steps=4] [nvme_dir=build/bench-gpt-nvme] [config=examples/gpt/configs/large.json] [train_gpt args...]
#   e.g. bench/gpt_large.sh 4 /work/nvme examples/gpt/configs/large.json --set gradient_clipping=0
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
nvme_dir=${2:-$PWD/build/bench-gpt-nvme}
config=${3:-examples/gpt/configs/large.json}
shift $(($# < 3 ? $# : 3))
scripts/build.sh zinf train_gpt >/dev/null
rm -rf "$nvme_dir"
mkdir -p "$nvme_dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$nvme_dir"' EXIT
if (($(cat /proc/sys/vm/nr_hugepages) < 32)); then
  echo 32 | { if [ "$(id -u)" = 0 ]; then tee /proc/sys/vm/nr_hugepages; else sudo tee /proc/sys/vm/nr_hugepages; fi; } >/dev/null
fi

field() { sed -E "s/.*\"$1\": ?([0-9.eE+-]+).*/\1/"; }
disk() { build/bin/zinf bench nvme --path "$nvme_dir" --size 4GiB --reps 1 --fio-huge-pages --json | tail -1; }
# Just after a run the file system may still be freeing its swap (ext4 mounted with discard
# took 15-30 s for 70 GB on one virtio disk): wait up to 5 minutes for the room a measurement
# needs. A measurement that fails anyway costs its figure, not the run's.
wait_for_room() {
  for _ in $(seq 60); do
    (($(df --output=avail -B1 "$nvme_dir" | tail -1) >= $1)) && return 0
    sleep 5
  done
}

wait_for_room $((5 << 30)) || true
d1=$(disk)
/usr/bin/time -v build/bin/train_gpt --config "$config" \
  --nvme-path "$nvme_dir" --steps "$steps" --metrics "$out/metrics.jsonl" "$@" >"$out/train.txt" 2>"$out/time.txt"
wait_for_room $((5 << 30)) || true
d2=$(disk) || { echo "disk after the run: not measured; the limit uses the disk before it" >&2; d2=$d1; }
footprint_gib=$(tail -1 "$out/metrics.jsonl" | field nvme_bytes | awk '{g = int($1 / 2^30); print (g > 4 ? g : 4)}')
footprint=$((footprint_gib << 30))
wait_for_room $(((footprint_gib + 1) << 30)) || true
d3=$(build/bin/zinf bench nvme --path "$nvme_dir" --size "${footprint_gib}GiB" --reps 1 --fio-huge-pages --json 2>&1 | tail -1) || true
grep -E "^train_gpt|^  |^done" "$out/train.txt" || true
echo "losses per step: $(sed -E 's/.*"loss": ?([0-9.eE+-]+|null).*/\1/' "$out/metrics.jsonl" | tr '\n' ' ')"

fio_read=$(echo "$d1 $d2" | tr ' ' '\n' | field fio_read_MBps | awk '{s += $1} END {print s / NR}')
fio_write=$(echo "$d1 $d2" | tr ' ' '\n' | field fio_write_MBps | awk '{s += $1} END {print s / NR}')
big_read=$(echo "$d3" | field fio_read_MBps)
big_write=$(echo "$d3" | field fio_write_MBps)
echo "$d1" | sed 's/^/disk before: /'
echo "$d2" | sed 's/^/disk after:  /'
echo "$d3" | sed 's/^/disk at the footprint: /'
rss_kb=$(sed -nE 's/.*Maximum resident set size \(kbytes\): ([0-9]+)/\1/p' "$out/time.txt")
# Steps after the first (which records the module order and touches every page first).
tail -n +2 "$out/metrics.jsonl" | while read -r line; do
  step=$(echo "$line" | field step_s)
  compute=$(echo "$line" | awk -v c="$(echo "$line" | field compute_s)" \
    -v r="$(echo "$line" | field grad_reduce_s)" -v o="$(echo "$line" | field optimizer_compute_s)" \
    'BEGIN {print c + r + o}')
  io=$(awk -v r="$(echo "$line" | field nvme_read_bytes)" -v w="$(echo "$line" | field nvme_written_bytes)" \
    -v fr="$fio_read" -v fw="$fio_write" 'BEGIN {print r / (fr * 1e6) + w / (fw * 1e6)}')
  echo "$step $compute $io $(echo "$line" | field nvme_read_bytes) $(echo "$line" | field nvme_written_bytes) $(echo "$line" | field optimizer_overlapped_s)"
done >"$out/steps.txt"
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
step=$(cut -d' ' -f1 "$out/steps.txt" | median)
compute=$(cut -d' ' -f2 "$out/steps.txt" | median)
io=$(cut -d' ' -f3 "$out/steps.txt" | median)
awk -v n="$(wc -l <"$out/steps.txt")" -v s="$step" -v c="$compute" -v i="$io" -v rss="$rss_kb" -v fr="$fio_read" -v fw="$fio_write" \
  -v rb="$(cut -d' ' -f4 "$out/steps.txt" | median)" -v wb="$(cut -d' ' -f5 "$out/steps.txt" | median)" \
  -v ov="$(cut -d' ' -f6 "$out/steps.txt" | median)" -v br="$big_read" -v bw="$big_write" \
  -v fp="$footprint" 'BEGIN {
  limit = c > i ? c : i
  big_io = br > 0 && bw > 0 ? rb / (br * 1e6) + wb / (bw * 1e6) : 0
  big_limit = c > big_io ? c : big_io
  printf "fio (2 MiB pages, mean of before and after): read %.0f MB/s, write %.0f MB/s\n", fr, fw
  printf "per step (median of steps 2-%d): %.2f s; compute-only %.2f s; NVMe read %.2f GB + written %.2f GB = %.2f s at fio speed\n", n + 1, s, c, rb / 1e9, wb / 1e9, i
  printf "optimizer pass overlapped with compute (beside backward or the next forward): %.2f s\n", ov
  printf "step / max(compute-only, io) = %.3f\n", s / limit
  if (big_io > 0)
    printf "fio at the footprint (%.1f GB, 2 MiB pages): read %.0f MB/s, write %.0f MB/s: io %.2f s; step / max(compute-only, io) = %.3f\n", fp / 1e9, br, bw, big_io, s / big_limit
  else
    printf "fio at the footprint (%.1f GB): not measured (see \"disk at the footprint\" above)\n", fp / 1e9
  printf "peak RSS %.2f GiB\n", rss / 1048576
}'
