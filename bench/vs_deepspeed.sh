#!/usr/bin/env bash
# zinf against DeepSpeed, on this machine, in the same run: every comparison interleaved (zinf,
# DeepSpeed, zinf, DeepSpeed, ...), median of the repetitions, each figure beside its rival's
# (bench/vs_deepspeed/*.py say what each measures):
#   parts      DeepSpeedCPUAdam vs zinf.optim.AdamW vs the memory-bandwidth limit (`zinf bench
#              adam`), in cache and in memory, idle and with every core busy; DeepSpeed's aio_handle vs zinf.nvme.SwapHandle vs fio, read and write;
#              DeepSpeed's ZeRO-3 memory estimator vs `zinf plan` vs the measured peak RSS.
#   end to end examples/torch's GPT and Hugging Face's GPT-2 under DeepSpeed ZeRO-3 (its CPU
#              accelerator, DS_ACCELERATOR=cpu) and under zinf.zero, and the native train_gpt,
#              with the same dimensions, data, seed, batch, AdamW and clipping: everything in
#              memory, optimizer on the CPU (ZeRO-Offload), parameters and optimizer on NVMe
#              (ZeRO-Infinity); 1 and 2 processes; 50 steps. Their limit: torch alone's forward
#              and backward, no ZeRO (Note [The compute limit] in bench/vs_deepspeed/report.py).
# Writes bench/vs_deepspeed.md (the report) and bench/vs_deepspeed.png (tokens/s, loss curves),
# puts the report into bench/RESULTS.md and a summary line into README.md (between their
# "vs_deepspeed" markers); --quick writes its report into build/vs-deepspeed/ only and fails
# when a zinf run fails or a loss curve leaves DeepSpeed's by more than 1e-3 relative.
#
# DeepSpeed, its torch and transformers are this benchmark's own dependencies, never zinf's:
# they go into a virtualenv, build/venv-deepspeed (made from /usr/bin/python3 once, then kept;
# ZINF_DS_VENV=DIR uses an existing one instead and installs nothing into it). zinf's Python
# package is built as a wheel (as scripts/venv_test.sh builds it) and unpacked into
# build/vs-deepspeed/site, which is on PYTHONPATH; the CLI and train_gpt come from
# scripts/build.sh. DeepSpeed JIT-builds its CPU Adam and async I/O ops (ninja, a C++
# compiler; libaio-dev for async I/O, installed with apt when missing and root) into
# build/vs-deepspeed/torch_extensions.
#
# Usage: bench/vs_deepspeed.sh [--quick] [--reps N] [--nvme-dir DIR] [--only parts|aio|e2e]
#                               [--sizes "small large"] [--models "torch_gpt hf_gpt2"]
#                               [--placements "memory cpu nvme"] [--worlds "1 2"] [--steps 50]
#   --quick     one repetition of small sizes, 5 steps (a smoke test of every path)
#   --reps N    repetitions of every comparison (default 3); CPU Adam's rows with busy processes
#               run 3N, the swap I/O N rounded up to a multiple of 4 (its sides take turns)
#   --sizes, --models, --placements, --worlds, --steps: a subset of the end-to-end runs
#               (default: all, 50 steps). small runs a step in about a second (1 rank, memory);
#               large is the largest whose placement (zinf, DeepSpeed and train_gpt, 50 steps
#               each) runs within 10 minutes here. The whole of both takes about 6 hours on 2 cores.
#   --only      one section (parts or e2e; aio: the swap I/O rows of parts alone); the report
#               keeps the other results of the last run on this machine
#               (build/vs-deepspeed/results.log), and a subset of the end-to-end runs keeps the
#               last run's other rows; a report without one of the sections stays in
#               build/vs-deepspeed/ instead of replacing the published one
#   --nvme-dir  a directory on a real disk for the swap files (default /work/bench-nvme if it
#               exists, else build/vs-deepspeed/nvme)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quick=0 reps=3 only="" nvme_dir="" sizes_arg="" models_arg="" placements_arg="" worlds_arg=""
steps_arg=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --reps) reps=$2; shift ;;
    --nvme-dir) nvme_dir=$2; shift ;;
    --only) only=$2; shift ;;
    --sizes) sizes_arg=$2; shift ;;
    --models) models_arg=$2; shift ;;
    --placements) placements_arg=$2; shift ;;
    --worlds) worlds_arg=$2; shift ;;
    --steps) steps_arg=$2; shift ;;
    *) echo "vs_deepspeed: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done
case $only in "" | parts | aio | e2e) ;; *) echo "vs_deepspeed: --only takes parts, aio or e2e, got $only" >&2; exit 2 ;; esac
[ "$quick" = 1 ] && reps=1
[ "$reps" -ge 1 ] || { echo "vs_deepspeed: --reps must be >= 1, got $reps" >&2; exit 2; }
work=$root/build/vs-deepspeed
[ -n "$nvme_dir" ] || { [ -d /work/bench-nvme ] && nvme_dir=/work/bench-nvme || nvme_dir=$work/nvme; }
mkdir -p "$work" "$nvme_dir"
log=$work/results.log adam_limits=$work/adam_limits.jsonl
if [ "$quick" = 1 ]; then  # a smoke test never touches a real run's results
  log=$work/results-quick.log adam_limits=$work/adam_limits-quick.jsonl
fi

step() { echo "== vs_deepspeed: $*"; }

# -- the virtualenv ---------------------------------------------------------------------------
venv=${ZINF_DS_VENV:-$root/build/venv-deepspeed}
need_modules='import torch, deepspeed, transformers, accelerate, ninja, cpuinfo, scikit_build_core, pybind11'
if ! "$venv/bin/python" -c "$need_modules" >/dev/null 2>&1; then
  if [ -n "${ZINF_DS_VENV:-}" ]; then
    echo "vs_deepspeed: ZINF_DS_VENV=$venv lacks one of: $need_modules" >&2
    exit 1
  fi
  step "making $venv (PyPI's torch, deepspeed, transformers, accelerate: several GB, minutes)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch deepspeed transformers accelerate ninja py-cpuinfo numpy \
    scikit-build-core pybind11
fi
if [ ! -e /usr/include/libaio.h ]; then
  # DeepSpeed's async I/O op needs libaio's headers; without them its row records the error.
  if [ "$(id -u)" = 0 ]; then
    step "apt-get install libaio-dev (DeepSpeed's async I/O op)"
    apt-get install -y -q libaio-dev >/dev/null || echo "   apt-get install libaio-dev failed"
  else
    echo "   no libaio-dev and not root: DeepSpeed's async I/O rows will record the error"
  fi
fi

# fio's buffers on 2 MiB pages, as zinf's and DeepSpeed's are in the swap I/O comparison
# (parts.py fio()): without reserved huge pages fio falls back to 4 KiB pages, which a virtio
# disk splits, and its figure is no longer the disk's.
if (($(cat /proc/sys/vm/nr_hugepages) < 32)); then
  if [ "$(id -u)" = 0 ]; then
    echo 32 >/proc/sys/vm/nr_hugepages
  else
    echo "   vm.nr_hugepages < 32 and not root: fio's swap I/O rows run on 4 KiB pages"
  fi
fi

# -- zinf --------------------------------------------------------------------------------------
step "building zinf, train_gpt (scripts/build.sh) and zinf's wheel"
scripts/build.sh zinf train_gpt >/dev/null
zinf=$root/build/bin/zinf
train_gpt=$root/build/bin/train_gpt
rm -rf "$work/dist"
"$venv/bin/pip" wheel --no-build-isolation --no-deps --no-index --wheel-dir "$work/dist" . \
  >"$work/wheel.log" 2>&1 || { tail -40 "$work/wheel.log" >&2; exit 1; }
rm -rf "$work/site"
"$venv/bin/python" -m zipfile -e "$work"/dist/zinf-*.whl "$work/site"
chmod +x "$work/site/zinf/bin/"* 2>/dev/null || true
py=$venv/bin/python
export PYTHONPATH=$work/site DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$work/torch_extensions
export PYTHONWARNINGS=ignore
cores=$(nproc)
run_py() { "$py" "$@" 2>>"$work/stderr.log" | tee -a "$log" | grep '^RESULT' | cut -c1-160 || true; }

cpu=$("$zinf" info 2>/dev/null | sed -n 's/^CPU  *//p' | head -1)  # as zinf labels its figures
[ -n "$cpu" ] || cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)
versions=$("$py" -c 'import torch, deepspeed, transformers, zinf
print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, transformers "
      f"{transformers.__version__}, zinf {zinf.__version__}")' 2>/dev/null)
echo "   $versions; $cores CPUs ($cpu); load average $(cut -d' ' -f1-3 /proc/loadavg)"

# -- sizes -------------------------------------------------------------------------------------
declare -A size_args=(
  [quick]="--layers 2 --d-model 64 --heads 4 --seq 32 --micro 4"
  [small]="--layers 4 --d-model 256 --heads 4 --seq 128 --micro 8"   # 3.3M parameters
  [large]="--layers 8 --d-model 512 --heads 8 --seq 128 --micro 8")  # 25.4M parameters
if [ "$quick" = 1 ]; then
  adam_sizes="4M" aio_size=64M steps=5 sizes=quick
else
  adam_sizes="1M 64M 256M" aio_size=1G steps=50 sizes="small large"
fi
sizes=${sizes_arg:-$sizes} models=${models_arg:-torch_gpt hf_gpt2}
placements=${placements_arg:-memory cpu nvme} worlds=${worlds_arg:-1 2} steps=${steps_arg:-$steps}
e2e_sizes=()
for name in $sizes; do
  [ -n "${size_args[$name]:-}" ] || { echo "vs_deepspeed: unknown size $name" >&2; exit 2; }
  e2e_sizes+=("${size_args[$name]}")
done

# What this run redoes leaves the log; the last run's other results stay in the report.
if [ -f "$log" ]; then
  "$py" - "$log" "$only" "$models" "$placements" "$worlds" "${e2e_sizes[@]}" <<'EOF'
import json, shlex, sys
log, only, models, placements, worlds, *sizes = sys.argv[1:]
dims = {(int(a[a.index("--d-model") + 1]), int(a[a.index("--layers") + 1]))
        for a in map(shlex.split, sizes)}
models, placements, worlds = models.split(), placements.split(), [int(w) for w in worlds.split()]

def redone(r):
    if r["kind"] == "aio":
        return only != "e2e"
    if r["kind"] == "adam":
        return only in ("", "parts")
    if only in ("parts", "aio") or (r["d_model"], r["layers"]) not in dims or r["world"] not in worlds:
        return False
    model = "torch_gpt" if r.get("model") == "train_gpt" else r.get("model")
    if r["kind"] == "estimate" or (r["side"] == "torch" and model in models):
        return r.get("beside", placements[0]) in placements  # run again beside them
    return r["placement"] in placements and model in models

with open(log) as f:
    kept = [line for line in f if line.startswith("RESULT ") and
            not redone(json.loads(line[len("RESULT "):]))]
with open(log, "w") as f:
    f.writelines(kept)
EOF
fi

# The corpus (README and architecture notes) that every run of both sides reads, taken when the
# log holds no end-to-end rows: rows that later subset runs add train on the same batches, though
# each run's report rewrites a line of the README.
corpus=$work/corpus.bin
[ "$quick" = 1 ] && corpus=$work/corpus-quick.bin
if [ ! -s "$corpus" ] || ! grep -q '"kind": "e2e"' "$log" 2>/dev/null; then
  "$py" -c 'import sys; sys.path.insert(0, "bench/vs_deepspeed"); import train
open(sys.argv[1], "wb").write(bytes(train._torch_example().load_corpus("").tolist()))' "$corpus"
fi
export ZINF_VS_DS_CORPUS=$corpus

# -- parts -------------------------------------------------------------------------------------
if [ -z "$only" ] || [ "$only" = parts ]; then
  step "CPU Adam: zinf.optim.AdamW vs DeepSpeedCPUAdam vs the bandwidth limit"
  : >"$adam_limits"
  # In cache (an NVMe pipeline chunk) and in memory, on 1 and 2 threads; and on 2 threads with a
  # busy process on every core (a shared node). Those rows get 3x the repetitions: where the
  # busy processes land moved DeepSpeed's in-cache rate from 6 to 33 GB/s between runs
  # (bench/RESULTS.md, 2026-11-29), and 3 did not settle the median.
  for size in $adam_sizes; do
    for threads_load in "1 0" "2 0" "2 $cores"; do
      read -r threads load <<<"$threads_load"
      for ((rep = 0; rep < (load > 0 ? 3 * reps : reps); ++rep)); do
        OMP_NUM_THREADS=$threads run_py bench/vs_deepspeed/parts.py adam --params "$size" \
          --threads "$threads" --load "$load" --reps 3
        "$zinf" bench adam --params "$size" --threads "$threads" --load "$load" --reps 3 --json \
          >>"$adam_limits"
      done
    done
  done
  # The in-cache size again as 64 parameters, as a torch model hands its optimizer hundreds of
  # tensors, most of them small: each costs both sides Python, and each alone is too small to
  # split among threads.
  many=${adam_sizes%% *}
  for ((rep = 0; rep < reps; ++rep)); do
    OMP_NUM_THREADS=2 run_py bench/vs_deepspeed/parts.py adam --params "$many" --tensors 64 \
      --threads 2 --reps 3
  done
  # And each step right after a parallel torch op, as a step follows backward: torch's OpenMP
  # threads are still spinning on the cores, and only DeepSpeed's step runs on them.
  for ((rep = 0; rep < reps; ++rep)); do
    OMP_NUM_THREADS=2 run_py bench/vs_deepspeed/parts.py adam --params "$many" --threads 2 \
      --reps 3 --after-torch-op
  done
fi
if [ "$only" != e2e ]; then
  step "swap I/O: zinf.nvme.SwapHandle vs DeepSpeed's aio_handle vs fio, in $nvme_dir"
  # A multiple of 4 repetitions: the four sides take turns at going first (parts.py aio).
  run_py bench/vs_deepspeed/parts.py aio --dir "$nvme_dir" --size "$aio_size" \
    --reps $(((reps + 3) / 4 * 4)) --zinf "$zinf" ||
    echo "   (the aio comparison failed: $work/stderr.log)"
fi

# -- end to end --------------------------------------------------------------------------------
e2e_nvme=$nvme_dir/vs-deepspeed-e2e
if [ "$only" != parts ] && [ "$only" != aio ]; then
  for size in "${e2e_sizes[@]}"; do
    for world in $worlds; do
      # shellcheck disable=SC2086
      run_py bench/vs_deepspeed/parts.py estimate $size --world "$world" --zinf "$zinf" \
        --work-dir "$work"
      for placement in $placements; do
        for model in $models; do
          for ((rep = 0; rep < reps; ++rep)); do
            step "$model $placement, $world rank(s), $size: zinf, DeepSpeed$([ "$model" = torch_gpt ] && echo ", train_gpt") (repetition $((rep + 1))/$reps)"
            # The compute limit (torch alone, Note [The compute limit] in report.py), interleaved
            # with every placement's runs: the machine's speed drifts within a run.
            OMP_NUM_THREADS=$((cores / world)) run_py bench/vs_deepspeed/train.py --side torch \
              --placement memory --beside "$placement" --ranks "$world" --model "$model" \
              --steps "$steps" $size || true
            args=(--placement "$placement" --model "$model" --steps "$steps" $size)
            [ "$placement" = nvme ] && { rm -rf "$e2e_nvme"; mkdir -p "$e2e_nvme"; args+=(--nvme-path "$e2e_nvme"); }
            if [ "$world" = 1 ]; then
              run_py bench/vs_deepspeed/train.py --side zinf "${args[@]}" || true
            else
              "$zinf" run -n "$world" -- "$py" bench/vs_deepspeed/train.py --side zinf \
                "${args[@]}" 2>>"$work/stderr.log" | sed 's/^\[rank [0-9]*\] //' |
                tee -a "$log" | grep '^RESULT' | cut -c1-160 || true
            fi
            [ "$placement" = nvme ] && { rm -rf "$e2e_nvme"; mkdir -p "$e2e_nvme"; }
            OMP_NUM_THREADS=$((cores / world)) run_py -m torch.distributed.run \
              --nproc-per-node "$world" --master-port 29533 bench/vs_deepspeed/train.py \
              --side deepspeed "${args[@]}" || true
            if [ "$model" = torch_gpt ]; then
              [ "$placement" = nvme ] && { rm -rf "$e2e_nvme"; mkdir -p "$e2e_nvme"; }
              run_py bench/vs_deepspeed/native.py --train-gpt "$train_gpt" --zinf "$zinf" \
                --world "$world" --work-dir "$work/native" "${args[@]}" || true
            fi
          done
        done
      done
    done
  done
  rm -rf "$e2e_nvme"
fi

# -- report ------------------------------------------------------------------------------------
step "report: vs_deepspeed.md and vs_deepspeed.png"
header=$work/header.md
cat >"$header" <<EOF
### zinf vs DeepSpeed, same machine, same run (\`bench/vs_deepspeed.sh$([ "$quick" = 1 ] && echo " --quick")\`)

$(date -u +%F), $cpu, $cores CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end of
the run; $versions. Median of $reps interleaved repetition(s) (zinf, DeepSpeed, zinf, ...).

Settings, as each side's documentation recommends for this machine, the same for both where
both have the setting: DeepSpeed on its CPU accelerator (\`DS_ACCELERATOR=cpu\`, torch.distributed
over gloo: oneCCL is not installed), launched by \`torchrun\`; zinf by \`zinf run\`; fp32
throughout (no bf16/fp16 section: the loss curves must agree); ZeRO stage 3; AdamW lr 1e-3, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1; gradient clipping 1.0; $cores / ranks threads per rank
(torch.set_num_threads, OMP_NUM_THREADS, zinf's optimizer_threads); NVMe: DeepSpeed's documented
\`aio\` defaults for both (block_size 1 MiB, queue_depth 8, intra_op_parallelism 1,
single_submit false, overlap_events true), swap files in $nvme_dir. Each side partitions the
model, built whole with seed 0, by its \`zero.Init(module=model, config_dict_or_path=config)\`
before \`initialize\`, as DeepSpeed's ZeRO-3 docs do. zinf checks a CRC32C of every
swapped piece (its default); DeepSpeed does not. Peak RSS is summed over ranks; disk bytes are
what /proc/self/io counts (the block layer's reads and writes), the same meter for both sides.
EOF
# A --quick run's report stays in the build tree: it is a smoke test, not figures to publish.
# So does one whose log lacks the end-to-end or the parts results (an --only run on a machine
# that never ran the other section): published, it would replace the report with half of it.
publish=1
[ "$quick" = 1 ] && publish=0
if [ "$publish" = 1 ] && ! { grep -q '"kind": "e2e"' "$log" && grep -q '"kind": "adam"' "$log"; }; then
  publish=0
  echo "vs_deepspeed: $log lacks the $(grep -q '"kind": "e2e"' "$log" && echo parts || echo end-to-end)" \
    "results (no run of that section on this machine), so the report stays in $work;" \
    "bench/RESULTS.md and README.md keep the published one" >&2
fi
out=bench
[ "$publish" = 0 ] && out=$work
status=0
"$py" bench/vs_deepspeed/report.py "$log" --header "$header" \
  --adam-limits "$adam_limits" --markdown "$out/vs_deepspeed.md" \
  --png "$out/vs_deepspeed.png" --summary "$work/summary.txt" \
  $([ "$quick" = 1 ] && echo --strict) || status=$?
cat "$out/vs_deepspeed.md"

# The report replaces the one between the markers in bench/RESULTS.md, the summary the line
# between those in README.md (appended with its markers the first time).
replace_between() {  # FILE CONTENT_FILE
  local file=$1 content=$2 begin='<!-- vs_deepspeed begin -->' end='<!-- vs_deepspeed end -->'
  if grep -qF "$begin" "$file"; then
    awk -v b="$begin" -v e="$end" -v f="$content" '
      $0 == b { print; while ((getline line < f) > 0) print line; skip = 1; next }
      $0 == e { skip = 0 } !skip' "$file" >"$file.tmp" && mv "$file.tmp" "$file"
  else
    { echo; echo "$begin"; cat "$content"; echo "$end"; } >>"$file"
  fi
}
if [ "$publish" = 1 ]; then
  replace_between bench/RESULTS.md bench/vs_deepspeed.md
  replace_between README.md "$work/summary.txt"
fi
echo "vs_deepspeed: done ($(grep -c '^RESULT' "$log") results; log $log, stderr $work/stderr.log)"
exit $status
