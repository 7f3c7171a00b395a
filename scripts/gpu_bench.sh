#!/usr/bin/env bash
# gpu_bench.sh: plain PyTorch against zinf on one NVIDIA GPU, same GPU, same run (issue 61,
# item 5). Run it right after scripts/gpu_check.sh whenever a GPU is at hand: it builds
# nothing, and takes zinf's Python package and `zinf` binary from the build gpu_check made
# (--build-dir, default build-gpu/; scripts/gpu_bundle.sh bench FILE runs it from a pack).
# The parts, each a process of its own in its own time box (bench/gpu_bench.py holds the code,
# its defaults and its notes), so that one failing or running over loses no other's figures:
#   a  examples/torch's 85.65M GPT, parameters in GPU memory, fp32 then bf16: torch alone
#      (AdamW fused on the GPU) and zinf.zero (optimizer on the CPU), a step of each in turn;
#   b  the same GPT at 1.31B, bf16: torch alone on the GPU against zinf with its parameters in
#      host memory (offload_param cpu) and its optimizer on the CPU, interleaved likewise;
#   c  the deepest Llama-2-7B-shaped LlamaForCausalLM whose state fits this machine's host
#      memory (`zinf plan`'s bytes; Note [Which Llama]), built under zinf.zero.Init, parameters
#      and optimizer state in host memory, activation checkpointing, the GPU capped below the
#      model's bf16 size (zinf.device_budget and torch's memory fraction; Note [Capped below the
#      model]), against torch alone on the same width with the layers that fit the GPU.
# Tokens/s are medians of the measured steps, zinf/torch their ratio; TFLOPS = 6 x parameters x
# tokens a step / step time; MFU against the GPU's dense bf16 peak (H100 SXM and H200 989, H100
# PCIe 756; the text says which it used; --peak-tflops overrides). Each zinf run ends with a
# torch.profiler table (top ops by self CUDA time) and its step summaries' counters (host
# waits, copies and bytes each way, memsets, the device tier's peak).
# Every figure goes to one JSON file (--out; default build-gpu/gpu_bench/gpu_bench.json) and
# the same as text beside it (gpu_bench.txt), each part's whole output to logs/ beside them,
# and a summary to stdout.
#
# Usage: scripts/gpu_bench.sh [--dry-run] [--out FILE.json] [--build-dir DIR] [--python PY]
#                             [--budget-s S] [--parts a,b,c] [--peak-tflops T]
#                             [-- DRIVER OPTIONS]
#   --dry-run      needs no GPU: checks the files, tools and Python modules the parts need,
#                  then runs every part's code on the CPU with tiny models (a step or two, the
#                  engine on the host device), writes the same files and prints the plan
#   --build-dir    where zinf was built (its python/ and bin/zinf; default build-gpu/)
#   --python       the interpreter (default: $ZINF_BENCH_PYTHON, else the first of python3,
#                  /usr/bin/python3, /opt/torch/.venv/bin/python3, build/venv-torch2/bin/python
#                  that imports torch 2.x, seeing a GPU unless --dry-run, and zinf from there)
#   --budget-s     the whole run's deadline in seconds (default 480); each part's box is cut
#                  to what is left, part c takes what a and b leave
#   --parts        which parts, in order (default a,b,c)
#   --peak-tflops  the GPU's dense bf16 TFLOPS for MFU, where its name is not in the table
#   -- ...         the rest goes to every part (`bench/gpu_bench.py part --help`: micro-batches,
#                  steps, --llama-max-layers, --llama-torch-cap, ...)
# Exit codes: 0 every part ran (or skipped, saying why); 1 a part failed; 2 bad usage; 77 no
# NVIDIA GPU here (nvidia-smi missing or listing none): nothing was run (CTest's skip code);
# --dry-run exits 77 too where no interpreter here has torch 2.x and zinf's package.
# Environment: ZINF_NVIDIA_SMI names the nvidia-smi to ask (tests point it elsewhere);
# ZINF_BENCH_PYTHON the interpreter.
#
# Time budget on one H100/H200 machine (16 cores, 128 GiB), 8 minutes in all; not yet measured
# there (bench/RESULTS.md): the boxes are estimates. Measured here: the dry run, three parts
# on 2 shared cores, about 30 s (each part's interpreter imports torch, and part c transformers).
#   part    box (s)  expected (s)
#   a           100  40: two processes' worth of setup is one; 13 steps of each side per
#                    precision, 0.1-0.5 s each, and 2 profiled zinf steps
#   b           130  70: the 1.31B model built on the GPU and copied to host memory (5 GB),
#                    zinf's host state pinned (24 GB), 7 steps of each side, 1-3 s a zinf step
#   c          rest  250: the choice (one `zinf plan` per depth tried), torch alone (45 s kept),
#                    the Init build and initialize (30M parameters/s assumed, 19M/s measured
#                    on 2 loaded cores here: 180 s at 5.3B; the part's size choice counts it),
#                    a probe step, 3 steps, 1 profiled
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
parts_all="a b c"
# Each part's box in seconds; c gets the rest.
declare -A box=([a]=100 [b]=130 [c]=0)

dry_run=0
out=""
build_dir="$root/build-gpu"
python="${ZINF_BENCH_PYTHON:-}"
budget_s=480
parts="$parts_all"
peak_tflops=0
extra=()
usage() { sed -n '/^# Usage:/,/^# ZINF_BENCH_PYTHON/p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --out) out="${2:?--out needs a file}"; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a directory}"; shift ;;
    --python) python="${2:?--python needs an interpreter}"; shift ;;
    --budget-s) budget_s="${2:?--budget-s needs seconds}"; shift ;;
    --parts) parts="$(tr ',' ' ' <<<"${2:?--parts needs a list}")"; shift ;;
    --peak-tflops) peak_tflops="${2:?--peak-tflops needs a number}"; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "gpu_bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$budget_s" in ''|*[!0-9]*) echo "gpu_bench: --budget-s takes whole seconds" >&2; exit 2 ;; esac
case "$peak_tflops" in ''|*[!0-9.]*) echo "gpu_bench: --peak-tflops takes a number" >&2; exit 2 ;; esac
for p in $parts; do
  case " $parts_all " in *" $p "*) ;; *) echo "gpu_bench: no part '$p' (a, b, c)" >&2; exit 2 ;; esac
done
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
build_dir="$(absolute "$build_dir")"
out="$(absolute "${out:-$build_dir/gpu_bench/gpu_bench.json}")"
work="$(dirname "$out")"
txt="${out%.json}.txt"
cd "$root" || exit 2

# no_gpu_reason, as gpu_check.sh's
source "$root/scripts/gpu_common.sh"

if [ $dry_run -eq 0 ] && ! reason="$(no_gpu_reason)"; then
  echo "gpu_bench: no NVIDIA GPU here: $reason. Nothing was run (exit 77: skipped)." >&2
  echo "gpu_bench: run it on a machine with a GPU, or with --dry-run to check it here." >&2
  exit 77
fi

# The package and the libraries it links: the build's, a pack's (gpu_bundle.sh), NCCL from
# PyTorch's wheel where the loader's path has none, CUDA's.
export PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
export ZINF_BUILD_DIR="$build_dir" ZINF_SOURCE_DIR="$root" PYTHONUNBUFFERED=1
for d in "$build_dir/lib" "$build_dir/bundled-lib" /usr/local/cuda/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

# The interpreter: the first that imports torch 2.x (seeing a GPU, unless a dry run) and zinf
# from the build; its path on stdout, else a line per candidate saying why not on stderr.
find_python() {
  local py why candidates=()
  if [ -n "$python" ]; then candidates=("$python"); else
    candidates=(python3 /usr/bin/python3 /opt/torch/.venv/bin/python3 "$root/build/venv-torch2/bin/python")
  fi
  for py in "${candidates[@]}"; do
    command -v "$py" >/dev/null 2>&1 || { echo "$py: not found" >&2; continue; }
    why="$(timeout 120 "$py" -c 'import sys
try:
    import torch
except ImportError as e:
    sys.exit(f"no torch ({e})")
if int(torch.__version__.split(".")[0]) < 2:
    sys.exit(f"torch {torch.__version__}, not 2.x")
if sys.argv[1] == "0" and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
try:
    import zinf.zero
except Exception as e:
    sys.exit(f"cannot import zinf from the build: {type(e).__name__}: {e}")' "$dry_run" 2>&1)"
    if [ $? -eq 0 ]; then
      command -v "$py"
      return 0
    fi
    echo "$(command -v "$py"): $(tail -n 1 <<<"${why:-timed out}")" >&2
  done
  return 1
}

if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  for py in ${python:-python3} /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    if nccl="$("$py" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)"
    then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl/lib"
      break
    fi
  done
fi

why="$(mktemp)"  # find_python's reasons
trap 'rm -f "$why"' EXIT

# --- dry run: what the parts need ------------------------------------------------------------
if [ $dry_run -eq 1 ]; then
  problems=0
  problem() { echo "gpu_bench --dry-run: $*" >&2; problems=$((problems + 1)); }
  for tool in timeout sed; do
    command -v $tool >/dev/null || problem "$tool is not installed"
  done
  for f in bench/gpu_bench.py examples/torch/train_gpt.py; do
    [ -f "$f" ] || problem "$f is missing"
  done
  [ -f "$build_dir/python/zinf/__init__.py" ] || {
    echo "gpu_bench --dry-run: no zinf package in $build_dir/python (build zinf_python_package," \
      "or give --build-dir): nothing to run the parts with; skipped" >&2
    exit 77
  }
  [ -x "$build_dir/bin/zinf" ] || problem "no $build_dir/bin/zinf (part c asks its plan)"
  if ! py="$(find_python 2>"$why")"; then
    echo "gpu_bench --dry-run: no interpreter here imports torch 2.x and zinf from" \
      "$build_dir/python; skipped:" >&2
    sed 's/^/  /' "$why" >&2
    exit 77
  fi
  "$py" bench/gpu_bench.py check || problem "$py lacks a module the parts import (above)"
  [ $problems -eq 0 ] || { echo "gpu_bench --dry-run: $problems problem(s) above" >&2; exit 1; }
fi

if [ $dry_run -eq 0 ]; then
  if ! py="$(find_python 2>"$why")"; then
    echo "gpu_bench: no interpreter here imports torch 2.x with a GPU and zinf from" \
      "$build_dir/python (run scripts/gpu_check.sh first, or give --python):" >&2
    sed 's/^/  /' "$why" >&2
    exit 1
  fi
fi

# --- the parts --------------------------------------------------------------------------------
mkdir -p "$work/logs" "$work/tmp"
rm -f "$work"/part_*.json "$work/status.tsv"
# Init's spill (part c) goes to TMPDIR: on the build's disk, not a tmpfs in host memory.
export TMPDIR="$work/tmp"
deadline=$budget_s  # from the script's start (SECONDS), the interpreter's search included
failed=0
commit="$(git -C "$root" log -1 --format=%h 2>/dev/null || echo unknown)"
echo "gpu_bench: $py; figures -> $out and $txt, logs -> $work/logs/ (deadline ${budget_s} s$(
  [ $dry_run -eq 1 ] && echo '; dry run: tiny models on the CPU'))"
for p in $parts; do
  left=$((deadline - SECONDS - 10))  # 10 s for the report
  b=${box[$p]}
  if [ "$b" -eq 0 ] || [ "$b" -gt "$left" ]; then b=$left; fi
  [ $dry_run -eq 1 ] && b=90
  t0=$SECONDS
  printf 'part %-2s ' "$p"
  if [ "$b" -lt 20 ]; then
    result=FAIL note="not run: the ${budget_s} s budget is spent"
  else
    args=(part "$p" --out "$work/part_$p.json" --budget-s "$b")
    [ $dry_run -eq 1 ] && args+=(--dry-run)
    [ "$peak_tflops" != 0 ] && args+=(--peak-tflops "$peak_tflops")
    args+=("${extra[@]}")
    timeout --kill-after=10 "$b" "$py" bench/gpu_bench.py "${args[@]}" >"$work/logs/$p.log" 2>&1 </dev/null
    rc=$?
    note="$(grep '^NOTE: ' "$work/logs/$p.log" | tail -n 1 | sed 's/^NOTE: //')"
    case $rc in
      0) result=PASS ;;
      77) result=SKIP ;;
      124|137) result=FAIL note="timed out after ${b} s${note:+; $note}" ;;
      *) result=FAIL note="${note:-exit $rc; the log: $work/logs/$p.log}" ;;
    esac
  fi
  [ "$result" = FAIL ] && failed=$((failed + 1))
  printf '%-4s %4d s  %.200s\n' "$result" $((SECONDS - t0)) "$note"
  note="${note//$'\t'/ }"
  printf '%s\t%s\t%d\t%d\t%s\n' "$p" "$result" $((SECONDS - t0)) "$b" "${note//$'\n'/ }" \
    >>"$work/status.tsv"
done
rm -rf "$work/tmp"

"$py" bench/gpu_bench.py report --dir "$work" --status "$work/status.tsv" --json "$out" \
  --txt "$txt" --commit "$commit" >"$work/logs/report.log" 2>&1 ||
  { echo "gpu_bench: the report failed: $(tail -n 1 "$work/logs/report.log")"; failed=$((failed + 1)); }
echo "gpu_bench: $failed of $(wc -w <<<"$parts") part(s) failed, $SECONDS s in all; figures in $out and $txt"
if [ $dry_run -eq 1 ]; then
  cat <<EOF
gpu_bench plan (on a machine with an NVIDIA GPU; ${budget_s} s deadline, parts: $parts):
  a   (${box[a]} s) bench/gpu_bench.py part a: the 85.65M GPT in GPU memory, fp32 and bf16, torch | zinf interleaved; profile
  b   (${box[b]} s) bench/gpu_bench.py part b: the 1.31B GPT, bf16, torch on the GPU | zinf offload_param cpu, optimizer cpu; profile
  c   (rest)  bench/gpu_bench.py part c: Llama-2-7B's width, the depth host memory holds, under zinf.zero.Init, GPU capped; torch alone for reference; profile
  figures -> $out, $txt
EOF
  [ $failed -eq 0 ] && echo "gpu_bench --dry-run: every part ran on the CPU"
fi
[ $failed -eq 0 ]
