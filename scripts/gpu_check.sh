#!/usr/bin/env bash
# gpu_check.sh: proves zinf's CUDA lane on one NVIDIA GPU in one command, on a fresh checkout.
# Run it first whenever a GPU is at hand. It installs what is missing (scripts/install_deps.sh;
# a failed install is reported and the build goes on with what is there), builds the CUDA
# targets only (preset `gpu`: build-gpu/, RelWithDebInfo, sm_90 only, ccache, no benchmarks,
# fuzzers or sanitizers; configured for the python3 whose torch 2.x sees the GPU, if any, and,
# where the toolkit has no NCCL, for the one torch's wheels bring), and runs, each step
# time-boxed and recorded pass/fail:
#   ctest_cuda      every `cuda`-labelled GoogleTest (device conformance on cuda:0, NCCL on one
#                   GPU, the engine on cuda bitwise against the host device, the GPT's CUDA
#                   backend against the CPU one); a test that skips although a GPU is here, or
#                   one of cuda_tests that did not build, fails the step (the skips allowed
#                   are in expected_gpu_skips below);
#   train_memory, train_cpu, train_nvme
#                   train_gpt for 30 steps on examples/gpt/configs/{memory,cpu,nvme}.json
#                   (parameters on the GPU, in host memory, on NVMe under the build dir), once
#                   with --device cpu and once with --device cuda; the two loss curves (--metrics)
#                   must agree: the first 4 steps within 1e-4 relative, the mean of the last 10
#                   within 1e-2 (Note [Loss tolerance]), and the loss must fall;
#   torch_allocator tests/python/test_cuda_allocator.py (zinf.cuda, PyTorch's pluggable
#                   allocator) under torch 2.x, skipped with the reason if no python3 here
#                   imports a torch 2.x that sees the GPU, or zinf's package cannot be built
#                   for it (no headers); with one, its GPU test must run, not skip;
#   torch_models    tests/python/test_torch_models_cuda.py: PyTorch's own modules and Hugging
#                   Face's models on cuda under zinf.zero (the engine on the GPU), against torch
#                   alone, with parameters in GPU memory and on NVMe; skipped as torch_allocator
#                   is, and its tests must run, not skip;
#   bench_pcie      `zinf bench pcie` on cuda:0 (must measure the GPU, not say it has none);
#   bench_profile   `zinf bench profile` (its link must be the GPU's PCIe link).
# Every figure goes to one file (--out; default build-gpu/gpu_check/gpu_check.txt), each step's
# whole output to logs/ beside it, and a summary to stdout. The script goes on past a failed
# step and exits 1 at the end if any failed.
#
# Usage: scripts/gpu_check.sh [--dry-run] [--out FILE] [--build-dir DIR] [--no-build]
#                             [--steps N] [--budget-s S] [--list-targets]
#   --dry-run      needs no GPU: configures the build (nvcc needed) and checks that every step's
#                  command exists (the build targets in `ninja -t targets`, that they are every
#                  `cuda`-labelled test, the configs, the test files, the commands' options),
#                  then prints the plan. Nothing is built or run.
#   --build-dir    build here instead of build-gpu/ (configured with the `gpu` preset's values)
#   --no-build     skip install, configure and build: run from --build-dir as it is (a build
#                  made elsewhere and carried to the GPU machine, say)
#   --steps        train_gpt's steps per run (default 30)
#   --budget-s     the whole run's deadline in seconds (default 480); each step's time box is
#                  cut to what is left, and a step with no time left fails as not run
#   --list-targets prints the build targets the steps need, and exits
# A GPU machine that cannot install the packages or build (no network): build and pack here
# with scripts/gpu_bundle.sh pack, and run this script there with scripts/gpu_bundle.sh run.
# Exit codes: 0 every step passed (or skipped, saying why); 1 a step failed; 2 bad usage;
# 77 no NVIDIA GPU here (nvidia-smi missing or listing none): nothing was done (CTest's skip
# code); --dry-run exits 77 too where no nvcc is found to configure with.
# Environment: ZINF_NVIDIA_SMI names the nvidia-smi to ask (tests point it elsewhere).
#
# Time budget on one H100 machine (16 cores), 8 minutes in all. Measured here, on 2 cores shared
# with two other engineers' builds (load average 4 to 6), nvcc 13.0, the same 7 targets, -j 2:
#   configure 9.5 s; build with a cold ccache 802 s wall, 575 s of CPU (545 user, 30 system);
#   with a warm ccache 7.7 s (every compile a hit; the links and the tests' discovery remain).
# A fresh GPU machine has a cold ccache. 575 CPU-seconds over 16 cores is 36 s; the longest
# single compile (train_gpt.cc, 80 s here under that load, perhaps 30 s alone) and the links
# after it make the critical path, so about 90 s is expected and 240 s is the box.
#   step             box (s)  expected on an H100 (s)
#   gpu                  30   1
#   deps                 90   1 (dpkg-query alone when every package is present; apt-get with no
#                             network fails within the box and the build goes on)
#   configure           120   10
#   build               240   90 cold ccache, 10 warm
#   ctest_cuda          150   40 (32 tests, 8 at a time; each opens CUDA, and the engine and GPT
#                             tests train small models on the GPU and on the CPU)
#   train_* (3)     90 each   3 x 10 (30 steps of a 0.8M-parameter GPT on the CPU, then on cuda:
#                             about 0.03 s a step on the CPU here when the machine is quiet)
#   torch_allocator     120   20 (fresh interpreters import torch and open CUDA)
#   torch_models        240   60 (5 models x 2 placements x 30 steps of zinf and torch, plus
#                             bf16, a side stream and the zero-copy check; 2 minutes here on
#                             the CPU)
#   bench_pcie           90   15 (3 sizes x pinned/pageable x 3 directions x 6 batches of 1 GiB)
#   bench_profile       180   100 (65 s here: the collectives 20, NVMe 2 GiB x 3 passes 9, the
#                             optimizer and oneDNN matmuls at 1 and 2 threads 33; the H100
#                             machine has five thread counts, 1 to 16, and its own disk); with
#                             under 150 s left it runs --quick (seconds) instead
#   in all                    about 320 s with a cold ccache; the boxes add up to more, so the
#                             480 s deadline (--budget-s) cuts the late ones short.
#
# Note [Loss tolerance]
# The three configs train in fp32 (no "bf16" key), so `--matmul auto` gives fp32 matmuls on
# both devices, and the CUDA backend puts cuBLAS in pedantic math (CUBLAS_PEDANTIC_MATH): no TF32
# enters even where NVIDIA_TF32_OVERRIDE asks for it. cuBLAS and oneDNN then differ in summation
# order only, as do the reductions, exp and tanh: about 1e-7 relative per op. Training amplifies
# such differences where the loss spikes (lr 2e-3 makes it spike at steps 5 and 15-17 of these
# configs), so one tolerance for every step would be either loose or flaky. Measured here, the
# CPU run of memory.json with 1 thread against 2 (another oneDNN blocking; the three configs
# train the same curve): steps 1-14 within 5e-8, 1.2e-4 at the spike of step 17, 6e-6 at step
# 30, the last 10 steps' mean within 6e-6. Hence two figures:
# - steps 1-4 (before the first spike) within 1e-4, the bound gpt_cuda_test puts on 8
#   micro-batches of GPU training: a wrong stride, a race or a lost gradient moves the loss by
#   far more from the first step on;
# - the last 10 steps' mean within 1e-2: fp32 noise, even 100 times the CPU's own, stays below
#   1e-3 there, while a change of precision does not: bf16 matmuls on the CPU (--matmul bf16,
#   an 8-bit mantissa) moved that mean by 4.3e-2 and step 15 by a factor 2.3, though steps 1-4
#   only by 9.5e-5. TF32 (10 bits) would land between; the pedantic mode keeps it out.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

# --- settings -------------------------------------------------------------------------------
# The targets the steps run; the dry run checks that cuda_tests holds every cuda-labelled test.
cuda_tests=(cuda_device_test nccl_communicator_test engine_device_test gpt_cuda_test)
targets=("${cuda_tests[@]}" train_gpt zinf zinf_python_package)
train_configs=(memory cpu nvme)
# Tests that skip because a GPU IS here (they cover the machine without one).
expected_gpu_skips='^(GptCudaTest\.UnavailableWithoutAGpu)$'
# Note [Loss tolerance]: the first steps' losses, then the mean of the last ten.
early_steps=4 early_rel_tolerance=1e-4 tail_rel_tolerance=1e-2

dry_run=0
no_build=0
out=""
build_dir="$root/build-gpu"
steps=30
budget_s=480
usage() { sed -n '/^# Usage:/,/^# Environment:/p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --no-build) no_build=1 ;;
    --out) out="${2:?--out needs a file}"; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a directory}"; shift ;;
    --steps) steps="${2:?--steps needs a number}"; shift ;;
    --budget-s) budget_s="${2:?--budget-s needs seconds}"; shift ;;
    --list-targets) echo "${targets[*]}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$steps$budget_s" in *[!0-9]*) echo "gpu_check: --steps and --budget-s take whole numbers" >&2; exit 2 ;; esac
# Paths given relative to where the script was started.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
build_dir="$(absolute "$build_dir")"
work="$build_dir/gpu_check"
out="$(absolute "${out:-$work/gpu_check.txt}")"
cd "$root" || exit 2

# nvcc is often installed but not on the PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# no_gpu_reason, as gpu_bench.sh's
source "$root/scripts/gpu_common.sh"

# The `gpu` preset's cache variables, for a --build-dir other than the preset's own.
configure_args() {
  if [ "$build_dir" = "$root/build-gpu" ]; then
    echo "--preset gpu"
  else
    echo "-S $root -B $build_dir -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo" \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2\ -g\ -DNDEBUG -DZINF_WITH_CUDA=ON" \
      "-DCMAKE_CUDA_ARCHITECTURES=90 -DZINF_BUILD_BENCH=OFF"
  fi
}

# --- dry run ----------------------------------------------------------------------------------
if [ $dry_run -eq 1 ]; then
  problems=0
  problem() { echo "gpu_check --dry-run: $*" >&2; problems=$((problems + 1)); }
  for tool in cmake ninja ctest timeout python3; do
    command -v $tool >/dev/null || problem "$tool is not installed (the steps need it)"
  done
  if ! command -v nvcc >/dev/null; then
    echo "gpu_check --dry-run: no nvcc (PATH, /usr/local/cuda/bin): cannot configure the CUDA" \
      "build to check its targets; skipped" >&2
    exit 77
  fi
  [ -x scripts/install_deps.sh ] || problem "scripts/install_deps.sh is missing"
  for c in "${train_configs[@]}"; do
    [ -f "examples/gpt/configs/$c.json" ] || problem "examples/gpt/configs/$c.json is missing"
  done
  [ -f tests/python/test_cuda_allocator.py ] || problem "tests/python/test_cuda_allocator.py is missing"
  [ -f tests/python/test_torch_models_cuda.py ] || problem "tests/python/test_torch_models_cuda.py is missing"
  # The options the steps pass, where the commands declare them.
  for opt in --config --device --steps --metrics --nvme-path --log-every; do
    grep -q "\"$opt\"" examples/gpt/train_gpt.cc || problem "train_gpt has no $opt option"
  done
  grep -q '"pcie"' tools/bench_pcie.cc && grep -q '"--json"' tools/bench_pcie.cc ||
    problem "zinf has no 'bench pcie --json'"
  grep -q '"profile"' tools/bench_profile.cc && grep -q '"--out"' tools/bench_profile.cc &&
    grep -q '"--path"' tools/bench_profile.cc || problem "zinf has no 'bench profile --path --out'"

  mkdir -p "$build_dir"
  # shellcheck disable=SC2046
  if ! eval cmake $(configure_args) >"$build_dir/gpu_check_configure.log" 2>&1; then
    tail -n 20 "$build_dir/gpu_check_configure.log" >&2
    problem "configuring $build_dir failed (log: $build_dir/gpu_check_configure.log)"
  else
    grep -q 'CUDA support ON, NCCL ON' "$build_dir/gpu_check_configure.log" ||
      problem "the configure found no NCCL ($(grep 'zinf: CUDA support' "$build_dir/gpu_check_configure.log"))"
    known="$(ninja -C "$build_dir" -t targets all 2>/dev/null | sed 's/:.*//')"
    for t in "${targets[@]}"; do
      grep -qx "$t" <<<"$known" || problem "no build target '$t' in the CMake project"
    done
    # Every GoogleTest executable labelled cuda must be built here. (zinf_test writes each
    # executable's labels into NAME_properties.cmake: LABELS "unit;cuda".)
    labelled="$(find "$build_dir/tests" -name '*_properties.cmake' -exec grep -l 'LABELS "\([^"]*;\)*cuda[;"]' {} + 2>/dev/null |
      sed 's|.*/||; s|_properties\.cmake$||' | sort -u)"
    [ -n "$labelled" ] || problem "no GoogleTest executable carries the label cuda"
    for t in $labelled; do
      grep -qx "$t" <<<"$(printf '%s\n' "${cuda_tests[@]}")" ||
        problem "'$t' is labelled cuda but gpu_check does not build it: add it to cuda_tests"
    done
    for t in "${cuda_tests[@]}"; do
      grep -qx "$t" <<<"$labelled" || problem "'$t' is in cuda_tests but not labelled cuda"
    done
    listed="$(ctest --test-dir "$build_dir" -N -L cuda 2>&1)"
    for t in python_cuda_allocator_test python_torch_models_cuda_test; do
      grep -q "$t" <<<"$listed" || problem "ctest -L cuda lists no $t"
    done
  fi
  cat <<EOF
gpu_check plan (on a machine with an NVIDIA GPU; ${budget_s} s deadline):
  gpu              nvidia-smi -L / --query-gpu; nvcc --version
  deps     (90 s)  scripts/install_deps.sh   (a failure is reported; the build goes on)
  configure(120 s) cmake $(configure_args) [-DPython_EXECUTABLE=<python3 with torch 2.x + CUDA>]
  build   (240 s)  cmake --build $build_dir -j N --target ${targets[*]} -- -k 0
  ctest_cuda(150 s) ctest --test-dir $build_dir -L cuda -LE python -j 8 (skips allowed: $expected_gpu_skips)
EOF
  for c in "${train_configs[@]}"; do
    echo "  train_$c (90 s) train_gpt --config examples/gpt/configs/$c.json --steps $steps --device cpu|cuda --metrics ... (loss curves compared)"
  done
  cat <<EOF
  torch_allocator(120 s) ctest -R python_cuda_allocator_test (skipped, saying why, without torch 2.x on CUDA)
  torch_models(240 s) ctest -R python_torch_models_cuda_test (skipped likewise)
  bench_pcie (90 s) zinf bench pcie --json   (gpu must be true)
  bench_profile(180 s) zinf bench profile --path $work/nvme-profile --out $work/profile.json (link kind pcie; --quick with under 150 s left)
  figures -> ${out}
EOF
  if [ $problems -gt 0 ]; then
    echo "gpu_check --dry-run: $problems problem(s) above" >&2
    exit 1
  fi
  echo "gpu_check --dry-run: every step's command exists"
  exit 0
fi

# --- no GPU: stop at once ---------------------------------------------------------------------
if ! reason="$(no_gpu_reason)"; then
  echo "gpu_check: no NVIDIA GPU here: $reason. Nothing was built or run (exit 77: skipped)." >&2
  echo "gpu_check: run it on a machine with a GPU, or with --dry-run to check its plan here." >&2
  exit 77
fi

# --- the steps --------------------------------------------------------------------------------
mkdir -p "$work/logs" "$(dirname "$out")"
logs="$work/logs"
: >"$out"
deadline=$((SECONDS + budget_s))
names=() results=() secs=() notes=()
build_targets="${targets[*]}" cuda_test_names="${cuda_tests[*]}"
export root build_dir work logs steps budget_s early_steps early_rel_tolerance tail_rel_tolerance \
  expected_gpu_skips build_targets cuda_test_names

# step NAME BOX_S FUNCTION [ARG...]: runs FUNCTION in a time-boxed bash, its output in
# logs/NAME.log. FUNCTION's exit: 0 pass, 77 skip, 78 warn (reported, not a failure), else
# fail; its last line that starts with "NOTE: " is the summary's note. What it writes to the
# file $fig goes to the figures file, else the last 40 lines of its log.
step() {
  local name="$1" box="$2" left=$((deadline - SECONDS)) t0=$SECONDS rc result note
  shift 2
  local log="$logs/$name.log"
  export fig="$logs/$name.fig"
  rm -f "$fig"
  printf '%-16s ' "$name"
  if [ $left -lt 5 ]; then
    result=FAIL note="not run: the ${budget_s} s budget is spent"
    : >"$log"
  else
    [ "$box" -gt "$left" ] && box=$left
    timeout --kill-after=10 "$box" bash -c '"$@"' _ "$@" >"$log" 2>&1 </dev/null
    rc=$?
    note="$(grep '^NOTE: ' "$log" | tail -n 1 | sed 's/^NOTE: //')"
    case $rc in
      0) result=PASS ;;
      77) result=SKIP ;;
      78) result=WARN ;;
      124|137) result=FAIL note="timed out after ${box} s${note:+; $note}" ;;
      *) result=FAIL note="${note:-exit $rc}" ;;
    esac
  fi
  printf '%-4s %4d s  %.200s\n' "$result" $((SECONDS - t0)) "$note"
  names+=("$name") results+=("$result") secs+=($((SECONDS - t0))) notes+=("$note")
  {
    echo "== $name: $result in $((SECONDS - t0)) s (box ${box} s)${note:+: $note}"
    if [ -s "$fig" ]; then cat "$fig"; else tail -n 40 "$log"; fi
    echo
  } >>"$out"
}

s_gpu() {
  local smi="${ZINF_NVIDIA_SMI:-nvidia-smi}"
  {
    "$smi" -L
    "$smi" --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
      --format=csv
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
    echo "cores: $(nproc); $(uname -sr); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
    git -C "$root" log -1 --format='commit %h %s' 2>/dev/null
  } | tee "$fig"
  command -v nvcc >/dev/null || { echo "NOTE: no nvcc: the CUDA targets cannot be built"; return 1; }
  echo "NOTE: $("$smi" --query-gpu=name --format=csv,noheader | head -n 1)"
}

s_deps() {
  if "$root/scripts/install_deps.sh"; then
    echo "NOTE: every package is present (or was installed now)"
    return 0
  fi
  # No network, no apt or no root: build with what is there; the build says what that lacks.
  local missing
  missing="$(sed -n '/^packages=(/,/^)/p' "$root/scripts/install_deps.sh" | sed '1d;$d' |
    xargs -n 1 | while read -r p; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"
    done | xargs)"
  echo "NOTE: install_deps.sh failed, missing: ${missing:-?}; building with what is there"
  return 78
}

# The first python3 that imports torch 2.x seeing a GPU (its path on stdout), else a line per
# interpreter saying why not on stderr.
torch_python() {
  local py why
  for py in python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null || continue
    why="$(timeout 90 "$py" -c 'import sys
try:
    import torch
except ImportError as e:
    sys.exit(f"no torch ({e})")
major = int(torch.__version__.split(".")[0])
if major < 2 or not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU usable: {torch.cuda.is_available()}")' 2>&1)"
    if [ $? -eq 0 ]; then
      command -v "$py"
      return 0
    fi
    echo "$(command -v "$py"): ${why:-timed out}" >&2
  done
  return 1
}

s_configure() {
  local extra=() py d
  set -o pipefail  # cmake's status through tee (this bash runs this step alone)
  mkdir -p "$build_dir"
  # The interpreter that has a CUDA torch, so that the allocator test runs under it.
  if py="$(torch_python)"; then
    extra+=("-DPython_EXECUTABLE=$py")
    if d="$("$py" -m pybind11 --cmakedir 2>/dev/null)"; then extra+=("-Dpybind11_DIR=$d"); fi
  fi
  # NCCL's header: where the toolkit has none, the one PyTorch's wheels bring (nvidia-nccl-cu*;
  # its library is loaded at run time, from LD_LIBRARY_PATH below).
  if [ ! -f "$(dirname "$(command -v nvcc)")/../include/nccl.h" ] &&
     d="$("${py:-python3}" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)" &&
     [ -f "$d/include/nccl.h" ]; then
    extra+=("-DNCCL_INCLUDE_DIR=$d/include")
  fi
  # shellcheck disable=SC2046
  if ! eval cmake $(configure_args) '"${extra[@]}"' 2>&1 | tee "$build_dir/gpu_check_cmake.txt"; then
    [ ${#extra[@]} -gt 0 ] || { echo "NOTE: cmake failed"; return 1; }
    # That interpreter may lack what the package needs: the allocator step will say so; the
    # rest needs no Python.
    echo "== the configure with $py failed: again, fresh, with the python3 CMake finds"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
    # shellcheck disable=SC2046
    eval cmake $(configure_args) 2>&1 | tee "$build_dir/gpu_check_cmake.txt" ||
      { echo "NOTE: cmake failed"; return 1; }
    echo "NOTE: $(grep -ho 'CUDA support .*' "$build_dir/gpu_check_cmake.txt" 2>/dev/null);" \
      "python as CMake finds it (the configure with $py failed)"
    return 0
  fi
  echo "NOTE: $(grep -ho 'CUDA support .*' "$build_dir/gpu_check_cmake.txt" 2>/dev/null);" \
    "python ${py:-as CMake finds it (no torch 2.x with CUDA)}"
}

s_build() {
  local t args=() rc
  for t in $build_targets; do args+=(--target "$t"); done
  command -v ccache >/dev/null && ccache -z >/dev/null
  cmake --build "$build_dir" -j "$(nproc)" "${args[@]}" -- -k 0
  rc=$?
  command -v ccache >/dev/null && ccache -s | grep -E 'Hits|Misses' | head -n 3 | tee "$fig"
  [ $rc -eq 0 ] || { echo "NOTE: a target failed to build (ninja -k 0 built the others)"; return 1; }
  echo "NOTE: $build_targets"
}

s_ctest_cuda() {
  local j=$(( $(nproc) < 8 ? $(nproc) : 8 )) rc skipped total
  # j tests at once share the cores: their CPU halves (oneDNN, the host device) get 2 threads.
  OMP_NUM_THREADS=2 ctest --test-dir "$build_dir" -L cuda -LE python --output-on-failure -j "$j" --timeout 120 \
    2>&1 | tee "$work/ctest_cuda.out"
  rc=${PIPESTATUS[0]}
  # Every test with its result and time, then ctest's summary.
  { grep -E '^ *[0-9]+/[0-9]+ Test +#' "$work/ctest_cuda.out"
    sed -n '/tests passed/,$p' "$work/ctest_cuda.out"; } >"$fig"
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$work/ctest_cuda.out")
  skipped="$(grep -E '^ *[0-9]+/[0-9]+ Test +#.*(Skipped|Not Run)' "$work/ctest_cuda.out" |
    sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/' | grep -Ev "$expected_gpu_skips" | xargs)"
  if [ "$total" -eq 0 ]; then
    echo "NOTE: ctest -L cuda ran no test (not built?)"
    return 1
  fi
  # A test executable that did not build has no tests in ctest -L cuda: name it.
  local t unbuilt=""
  for t in $cuda_test_names; do
    [ -n "$(find "$build_dir/tests" -name "${t}\[1\]_tests.cmake" 2>/dev/null)" ] || unbuilt+=" $t"
  done
  [ -z "$unbuilt" ] || { echo "NOTE: not built, so not run:$unbuilt"; return 1; }
  [ $rc -eq 0 ] || { echo "NOTE: $(grep 'tests passed' "$work/ctest_cuda.out")"; return 1; }
  [ -z "$skipped" ] || { echo "NOTE: skipped although a GPU is here: $skipped"; return 1; }
  echo "NOTE: $(grep 'tests passed' "$work/ctest_cuda.out")"
}

# s_train CONFIG: train_gpt on the CPU and on cuda, the loss curves compared.
s_train() {
  local cfg="$1" bin="$build_dir/bin/train_gpt" d="$work/train_$1" dev
  [ -x "$bin" ] || { echo "NOTE: $bin was not built"; return 1; }
  rm -rf "$d"
  for dev in cpu cuda; do
    mkdir -p "$d/nvme-$dev"
    echo "== train_gpt --device $dev"
    "$bin" --config "$root/examples/gpt/configs/$cfg.json" --nvme-path "$d/nvme-$dev" \
      --steps "$steps" --device "$dev" --log-every 10 --metrics "$d/$dev.jsonl" ||
      { echo "NOTE: train_gpt --device $dev failed (exit $?)"; return 1; }
  done
  python3 - "$d/cpu.jsonl" "$d/cuda.jsonl" "$steps" "$early_steps" "$early_rel_tolerance" \
    "$tail_rel_tolerance" "$fig" <<'EOF'
import json, math, statistics, sys
cpu_path, gpu_path, fig = sys.argv[1], sys.argv[2], sys.argv[7]
steps, early_steps = int(sys.argv[3]), int(sys.argv[4])
early_tol, tail_tol = float(sys.argv[5]), float(sys.argv[6])
cpu = [json.loads(l) for l in open(cpu_path) if l.strip()]
gpu = [json.loads(l) for l in open(gpu_path) if l.strip()]
problems = []
if len(cpu) != steps or len(gpu) != steps:
    problems.append(f"{len(cpu)} CPU and {len(gpu)} cuda steps recorded, {steps} expected")
lines = [f"{'step':>4}  {'loss cpu':>10}  {'loss cuda':>10}  {'rel diff':>9}  {'tok/s cpu':>9}  {'tok/s cuda':>10}"]
rel = []
for c, g in zip(cpu, gpu):
    if not (math.isfinite(c["loss"]) and math.isfinite(g["loss"])):
        problems.append(f"step {c['step']}: loss not finite")
        rel.append(math.inf)
        continue
    rel.append(abs(g["loss"] - c["loss"]) / abs(c["loss"]))
    lines.append(f"{c['step']:>4}  {c['loss']:>10.6f}  {g['loss']:>10.6f}  {rel[-1]:>9.2e}  "
                 f"{c['tokens_per_s']:>9.0f}  {g['tokens_per_s']:>10.0f}")
early = max(rel[:early_steps], default=math.inf)
if early > early_tol:
    problems.append(f"steps 1-{early_steps} differ by {early:.2e} relative, over {early_tol:g}")
n = min(10, len(cpu), len(gpu))
tail = math.inf
if n > 0:
    tail_cpu = statistics.mean(r["loss"] for r in cpu[-n:])
    tail = abs(statistics.mean(r["loss"] for r in gpu[-n:]) - tail_cpu) / tail_cpu
if tail > tail_tol:
    problems.append(f"the mean loss of the last {n} steps differs by {tail:.2e} relative, over {tail_tol:g}")
for name, run in (("cpu", cpu), ("cuda", gpu)):
    if len(run) >= 10 and not statistics.mean(r["loss"] for r in run[-5:]) < run[0]["loss"]:
        problems.append(f"the {name} run's loss did not fall")
rate = lambda run: statistics.median(r["tokens_per_s"] for r in run[1:]) if len(run) > 1 else 0
worst = max(range(len(rel)), key=lambda i: rel[i], default=0)
summary = (f"steps 1-{early_steps} within {early:.1e} (tolerance {early_tol:g}), last {n} steps' "
           f"mean within {tail:.1e} ({tail_tol:g}); largest step difference {max(rel, default=0):.1e} "
           f"at step {worst + 1}; median tokens/s cpu {rate(cpu):.0f}, cuda {rate(gpu):.0f}")
lines.append(summary)
lines += [f"PROBLEM: {p}" for p in problems]
open(fig, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print("NOTE: " + ("; ".join(problems) if problems else summary))
sys.exit(1 if problems else 0)
EOF
}

# torch_package_or_skip: returns 77 saying why when the package's torch tests cannot run here.
torch_package_or_skip() {
  local py
  if ! py="$(torch_python 2>"$work/torch_why")"; then
    echo "NOTE: no python3 here imports torch 2.x with a usable GPU: $(xargs <"$work/torch_why" | tr '\n' ' ')"
    return 77
  fi
  configured="$(sed -n 's/^_Python_EXECUTABLE:INTERNAL=//p' "$build_dir/CMakeCache.txt")"
  why="$(grep -ho 'Python package not built: .*\|no Python interpreter.*' \
    "$build_dir/gpu_check_cmake.txt" 2>/dev/null | tail -n 1)"
  if [ -n "$why" ]; then
    echo "NOTE: torch 2.x is in $py, but zinf's $why"
    return 77
  fi
  if [ -n "$configured" ] && [ "$configured" != "$py" ]; then
    echo "NOTE: torch 2.x is in $py, but zinf's package was built for $configured (see the configure step)"
    return 77
  fi
  if [ ! -f "$build_dir/python/zinf/libzinf_torch_allocator.so" ]; then
    echo "NOTE: zinf's Python package (zinf_python_package) was not built for ${configured:-any python}"
    return 1
  fi
}

s_torch_allocator() {
  local out rc
  torch_package_or_skip || return $?
  out="$work/torch_allocator.out"
  ctest --test-dir "$build_dir" -R '^python_cuda_allocator_test$' -V --timeout 110 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  grep -E ' \.\.\. |^(Ran|OK|FAILED)|SKIPPED|Python package for' "$out" | sed -E 's/^[0-9]+: //' >"$fig"
  if grep -q 'SKIPPED: the zinf Python package was not built' "$out"; then
    echo "NOTE: torch is in $py but zinf's package was not built for $configured: $(grep -o 'was not built: .*' "$out" | head -n 1)"
    return 77
  fi
  [ $rc -eq 0 ] || { echo "NOTE: the allocator test failed under $configured"; return 1; }
  if ! grep -q 'test_torch_tensors_live_in_the_pool .*\.\.\. ok' "$out"; then
    echo "NOTE: test_torch_tensors_live_in_the_pool did not run: $(grep -o 'test_torch_tensors_live_in_the_pool.*' "$out" | head -n 1)"
    return 1
  fi
  echo "NOTE: torch tensors lived in zinf's pool under $configured"
}

s_torch_models() {
  local out rc ran verdict
  torch_package_or_skip || return $?
  out="$work/torch_models.out"
  ctest --test-dir "$build_dir" -R '^python_torch_models_cuda_test$' -V --timeout 230 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  grep -E ' \.\.\. |^[0-9]+: (Ran|OK|FAILED)|SKIPPED|MISMATCH|step [0-9]+:' "$out" | sed -E 's/^[0-9]+: //' >"$fig"
  ran="$(grep -oE 'Ran [0-9]+ tests?' "$out" | tail -n 1)"
  verdict="$(grep -oE '^[0-9]+: (OK|FAILED).*' "$out" | tail -n 1 | sed -E 's/^[0-9]+: //')"
  [ $rc -eq 0 ] || { echo "NOTE: the models on cuda failed: $(grep -m1 -E '^[0-9]+: (FAIL|ERROR):' "$out" | sed -E 's/^[0-9]+: //')"; return 1; }
  if grep -q '\*\*\*Skipped' "$out"; then  # run.py's 77: every test skipped
    echo "NOTE: every test skipped: $(grep -m1 -o 'skipped .*' "$out")"; return 1
  fi
  echo "NOTE: $ran on cuda: $verdict (subtests of two ranks skip on one GPU; the figures say why)"
}

s_bench_pcie() {
  local zinf="$build_dir/bin/zinf"
  [ -x "$zinf" ] || { echo "NOTE: $zinf was not built"; return 1; }
  "$zinf" bench pcie --json | tee "$work/pcie.json"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "NOTE: zinf bench pcie failed"; return 1; }
  python3 - "$work/pcie.json" "$fig" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
if not r.get("gpu"):
    print(f"NOTE: zinf bench pcie measured no GPU: {r.get('reason')}")
    sys.exit(1)
lines = [f"device {r['device']}; median of {r['reps']} batches; GB/s = 1e9 bytes/s",
         f"{'size':>10}  {'memory':>8}  {'H2D':>7}  {'D2H':>7}  {'both':>7}"]
for row in r["rows"]:
    lines.append(f"{row['size_bytes'] / 2**20:>8.0f}Mi  {row['memory']:>8}  {row['h2d_GBps']:>7.2f}  "
                 f"{row['d2h_GBps']:>7.2f}  {row['bidirectional_GBps']:>7.2f}")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
big = max((x for x in r["rows"] if x["memory"] == "pinned"), key=lambda x: x["size_bytes"])
print(f"NOTE: pinned {big['size_bytes'] >> 20} MiB: H2D {big['h2d_GBps']:.1f}, D2H {big['d2h_GBps']:.1f}, "
      f"both {big['bidirectional_GBps']:.1f} GB/s")
EOF
}

# s_bench_profile [--quick]
s_bench_profile() {
  local zinf="$build_dir/bin/zinf"
  [ -x "$zinf" ] || { echo "NOTE: $zinf was not built"; return 1; }
  rm -rf "$work/nvme-profile" && mkdir -p "$work/nvme-profile"
  "$zinf" bench profile --path "$work/nvme-profile" --out "$work/profile.json" "$@" ||
    { echo "NOTE: zinf bench profile failed"; return 1; }
  cp "$work/profile.json" "$fig"
  python3 - "$work/profile.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
link, nvme = p["link"], p.get("nvme", {})
best = max((o["params_per_s"] for o in p.get("cpu_optimizer", [])), default=0)
print(f"NOTE: {'quick: ' if p.get('quick') else ''}link {link['kind']} H2D {link.get('h2d_GBps') or 0:.1f} / D2H {link.get('d2h_GBps') or 0:.1f} GB/s; "
      f"NVMe write {nvme.get('write_MBps', 0):.0f} / read {nvme.get('read_MBps', 0):.0f} MB/s; "
      f"CPU AdamW {best / 1e9:.2f} G params/s")
sys.exit(0 if link["kind"] == "pcie" else 1)
EOF
}

export -f configure_args torch_python s_gpu s_deps s_configure s_build s_ctest_cuda s_train \
  torch_package_or_skip s_torch_allocator s_torch_models s_bench_pcie s_bench_profile

# zinf loads NCCL when it first needs it (Note [NCCL loaded on first use]): where the loader's
# path has none, PyTorch's (nvidia-nccl-cu*).
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  for py in python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    if nccl="$("$py" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)"
    then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl/lib"
      break
    fi
  done
fi
echo "gpu_check: figures -> $out, logs -> $logs/ (deadline ${budget_s} s)"
step gpu 30 s_gpu
if [ $no_build -eq 0 ]; then
  step deps 90 s_deps
  step configure 120 s_configure
  step build 240 s_build
fi
step ctest_cuda 150 s_ctest_cuda
for c in "${train_configs[@]}"; do step "train_$c" 90 s_train "$c"; done
step torch_allocator 120 s_torch_allocator
step torch_models 240 s_torch_models
step bench_pcie 90 s_bench_pcie
# The full profile takes a minute or two; --quick, seconds, when the deadline is closer.
if [ $((deadline - SECONDS)) -ge 150 ]; then
  step bench_profile 180 s_bench_profile
else
  step bench_profile 60 s_bench_profile --quick
fi

failed=0
for r in "${results[@]}"; do [ "$r" = FAIL ] && failed=$((failed + 1)); done
{
  echo "== summary: $failed of ${#names[@]} steps failed, $SECONDS s in all"
  for i in "${!names[@]}"; do
    printf '%-16s %-4s %4d s  %.300s\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}" "${notes[$i]}"
  done
} | tee -a "$out"
echo "gpu_check: figures in $out, each step's output in $logs/"
[ "$failed" -eq 0 ]
