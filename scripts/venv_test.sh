#!/usr/bin/env bash
# The Python package as a user installs it. Builds the wheel with pip (`pip wheel .`:
# pyproject.toml, scikit-build-core, incrementally in build/<wheel tag>/ under ccache), installs
# it into a fresh virtualenv made from Debian's /usr/bin/python3 with --system-site-packages
# (so Debian's python3-torch 1.13 and numpy are visible), and from a directory unrelated to the
# source tree checks the installed package: its version against CMakeLists.txt and the wheel's
# metadata, the `zinf` console script (--version, info), the RUNPATHs of the installed files,
# and the Python tests (tests/python/run.py) against it: a smoke test under Debian's torch (the
# build tree's ctest runs them all under it), and the engine's and integrations' under torch 2.x.
#
# With --torch2 (unless ZINF_VENV_TORCH2=0; or ZINF_VENV_TORCH2=1 alone) the same wheel is also
# tested against PyTorch 2.x from pip, in build/venv-torch2/: made once (PyPI's torch and its
# CUDA wheels, about 5.4 GiB and 1.5 to 3 minutes here) and kept; the zinf wheel is
# reinstalled into it on every run. transformers, accelerate, peft, trl and lightning are
# installed there too, so that test_torch_models trains Hugging Face's GPT-2 and Llama under zinf
# and test_hf_trainer and test_lightning run Trainer, Accelerate, PEFT, TRL and Lightning on zinf.
#
# Build requirements (scikit-build-core, pybind11) come from PyPI once and are kept in
# build/wheelhouse/; later runs install them from there without the network.
# Usage: scripts/venv_test.sh [--torch2]; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

torch2=${ZINF_VENV_TORCH2:-0}
[ "${1:-}" = "--torch2" ] && torch2=${ZINF_VENV_TORCH2:-1}

python=/usr/bin/python3
wheelhouse=$root/build/wheelhouse
venv=$root/build/venv-test
dist=$root/build/dist
log=$root/build/venv-test.log
mkdir -p "$root/build" "$wheelhouse" "$dist"
: >"$log"

version=$(sed -n 's/^project(zinf VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "venv_test: no project(zinf VERSION ...) in CMakeLists.txt" >&2; exit 1; }

step_start=0
step() { step_start=$SECONDS; echo "== venv_test: $*"; }
took() { echo "   ($((SECONDS - step_start)) s)"; }
# Runs a command with its output in $log, shown only if it fails.
logged() {
  if ! "$@" >>"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "venv_test: failed: $* (whole log: $log)" >&2
    return 1
  fi
}

step "fresh virtualenv $venv (Debian's python3, system site-packages)"
rm -rf "$venv"
logged "$python" -m venv --system-site-packages "$venv"
build_reqs=(scikit-build-core pybind11)
if ! compgen -G "$wheelhouse/scikit_build_core-*.whl" >/dev/null ||
    ! compgen -G "$wheelhouse/pybind11-*.whl" >/dev/null; then
  echo "   build requirements not in $wheelhouse yet: downloading them from PyPI"
  logged "$venv/bin/pip" download --dest "$wheelhouse" "${build_reqs[@]}"
fi
logged "$venv/bin/pip" install --no-index --find-links "$wheelhouse" "${build_reqs[@]}"
took

# Without build isolation the build sees the venv's fixed paths (its python, pybind11's
# headers), so the persistent build tree stays configured and ccache hits on every file.
step "pip wheel . (build/<wheel tag>/, ccache)"
rm -f "$dist"/zinf-*.whl
logged "$venv/bin/pip" wheel --no-build-isolation --check-build-dependencies --no-deps \
  --no-index --wheel-dir "$dist" -v .
wheels=("$dist"/zinf-"$version"-*.whl)
[ -f "${wheels[0]}" ] || { echo "venv_test: pip wheel made no zinf-$version wheel in $dist" >&2; exit 1; }
wheel=${wheels[0]}
echo "   $(basename "$wheel"): $(du -h "$wheel" | cut -f1)"
took

scratch=$(mktemp -d "$root/build/venv-test-scratch-XXXXXX")  # a real disk: O_DIRECT works
away=$(mktemp -d "${TMPDIR:-/tmp}/zinf-venv-test-XXXXXX")    # unrelated to the source tree
trap 'rm -rf "$scratch" "$away"' EXIT

# check_installed VENV: the installed package, from $away, with no PYTHONPATH.
check_installed() {
  local env=$1
  local site
  site=$(cd "$away" && env -u PYTHONPATH "$env/bin/python" -c \
    'import sysconfig; print(sysconfig.get_path("platlib"))')
  local pkg=$site/zinf
  [ -d "$pkg" ] || { echo "venv_test: no $pkg" >&2; return 1; }
  (cd "$away" && env -u PYTHONPATH "$env/bin/python" -c '
import importlib.metadata, sys
import zinf
want = sys.argv[1]
assert zinf.__file__.startswith(sys.argv[2] + "/"), f"zinf imported from {zinf.__file__}"
assert zinf.__version__ == want, f"zinf.__version__ {zinf.__version__}, CMakeLists.txt {want}"
meta = importlib.metadata.version("zinf")
assert meta == want, f"the wheel says {meta}, CMakeLists.txt {want}"
print("   import zinf:", zinf.__version__, "from", zinf.__file__)' "$version" "$pkg")
  local cli_version
  cli_version=$(cd "$away" && env -u PYTHONPATH "$env/bin/zinf" --version)
  [ "$cli_version" = "zinf $version" ] || {
    echo "venv_test: the zinf console script says '$cli_version', want 'zinf $version'" >&2
    return 1
  }
  echo "   $env/bin/zinf --version: $cli_version"
  (cd "$away" && env -u PYTHONPATH "$env/bin/zinf" info >"$scratch/info.txt" 2>&1) || {
    cat "$scratch/info.txt" >&2
    echo "venv_test: zinf info failed" >&2
    return 1
  }
  echo "   zinf info: ok ($(wc -l <"$scratch/info.txt") lines)"
  bash "$root/tests/install/check_runpath.sh" "$pkg" | sed 's/^/   /'
  # The extension loads the libzinf.so beside it, not one from elsewhere.
  local ext
  ext=$(find "$pkg" -maxdepth 1 -name '_zinf*.so' -print -quit)
  local resolved
  resolved=$(ldd "$ext" | sed -n 's/^[[:space:]]*libzinf\.so[^ ]* => \([^ ]*\).*/\1/p')
  [ "$resolved" = "$pkg/libzinf.so" ] || {
    echo "venv_test: $ext loads libzinf from '$resolved', want $pkg/libzinf.so" >&2
    return 1
  }
  if [ -e "$pkg/libzinf_torch_allocator.so" ]; then
    have_cuda=ON
  else
    have_cuda=OFF
    # A CPU-only wheel imports where no CUDA library is installed.
    if readelf -d "$pkg/libzinf.so" "$pkg/bin/zinf" | grep -E 'NEEDED.*lib(cuda|cudart|nccl)'; then
      echo "venv_test: a wheel built without CUDA needs CUDA libraries (above)" >&2
      return 1
    fi
  fi
}

passed_count=0 failed_count=0 skipped_count=0
# run_python_tests VENV NAME...: tests/python's test_NAME against the installed package. test_zero
# launches its 2-process runs with $ZINF_BUILD_DIR/bin/zinf: here the console script.
run_python_tests() {
  local env=$1
  shift
  ln -sfn "$env/bin" "$scratch/bin"
  local failed=0 name rc
  for name in "$@"; do
    local t0=$SECONDS
    set +e
    (cd "$away" && env -u PYTHONPATH ZINF_BUILD_DIR="$scratch" ZINF_SOURCE_DIR="$root" \
      ZINF_HAVE_CUDA="$have_cuda" PYTHONDONTWRITEBYTECODE=1 \
      "$env/bin/python" "$root/tests/python/run.py" "test_$name" >"$scratch/test_$name.log" 2>&1)
    rc=$?
    set -e
    case $rc in
      0) echo "   test_$name: passed ($((SECONDS - t0)) s)"; passed_count=$((passed_count + 1)) ;;
      77) echo "   test_$name: skipped: $(grep -m1 '^SKIPPED' "$scratch/test_$name.log" || true)"
          skipped_count=$((skipped_count + 1)) ;;
      *) cat "$scratch/test_$name.log"; echo "   test_$name: FAILED (exit $rc)"; failed=1
         failed_count=$((failed_count + 1)) ;;
    esac
  done
  return $failed
}

step "install the wheel into $venv; check it from $away"
logged "$venv/bin/pip" install --no-index --no-deps "$wheel"
check_installed "$venv"
torch_version=$(cd "$away" && "$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
took
# The build tree's ctest runs every Python test under this same torch; here the installed
# wheel's engine and optimizer are checked, and the rest runs against it under torch 2.x below.
step "tests/python against the installed package (torch $torch_version): a smoke test"
run_python_tests "$venv" optim monitoring
took

if [ "$torch2" = 1 ]; then
  t2=$root/build/venv-torch2
  step "PyTorch 2.x from pip in $t2"
  if ! "$t2/bin/python" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' \
      >/dev/null 2>&1; then
    echo "   making it (PyPI's torch and its CUDA wheels: several GB, a few minutes)"
    rm -rf "$t2"
    logged "$python" -m venv "$t2"
    logged "$t2/bin/pip" install torch numpy
  fi
  # Hugging Face's models built from a config (no weights downloaded) for test_torch_models,
  # Trainer (it needs accelerate) with PEFT and TRL for test_hf_trainer, and Lightning (and its
  # older package, pytorch_lightning) for test_lightning.
  if ! "$t2/bin/python" -c 'import transformers, accelerate, peft, trl, lightning, pytorch_lightning' \
      >/dev/null 2>&1; then
    logged "$t2/bin/pip" install transformers accelerate peft trl lightning pytorch-lightning
  fi
  logged "$t2/bin/pip" install --no-index --no-deps --force-reinstall "$wheel"
  check_installed "$t2"
  torch_version=$(cd "$away" && "$t2/bin/python" -c 'import torch; print(torch.__version__)')
  took
  step "tests/python against the installed package (torch $torch_version)"
  # And torch's own modules and Hugging Face's GPT-2 and Llama, under zinf.zero and under
  # zinf.initialize with Hugging Face's DeepSpeed config, and their round trips through
  # `zinf ckpt export --hf` and import (skipped in the build tree's run, whose Debian torch 1.13
  # has no transformers).
  run_python_tests "$t2" optim nvme zero cuda_allocator initialize monitoring torch_models \
    hf_initialize hf_checkpoints zero_init_large hf_trainer lightning
  took
fi
echo "venv_test: $passed_count passed, $failed_count failed, $skipped_count skipped"
