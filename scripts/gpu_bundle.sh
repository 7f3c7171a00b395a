#!/usr/bin/env bash
# gpu_bundle.sh: scripts/gpu_check.sh on a GPU machine that cannot build zinf itself (no
# network to install the Debian packages, as on an air-gapped cluster node): build the CUDA
# lane where nvcc and the packages are, pack it with the shared libraries it links that such
# a machine may lack, and run gpu_check there from the pack.
#
# Usage:
#   scripts/gpu_bundle.sh pack [--python PY] [-o FILE]   here: nvcc and the packages, no GPU
#   scripts/gpu_bundle.sh run FILE [gpu_check options]   there: the NVIDIA driver, no compiler
#   scripts/gpu_bundle.sh bench FILE [gpu_bench options] there, right after run
#
# pack  configures build-gpu/ (the `gpu` preset) for the interpreter PY, builds gpu_check's
#       targets and writes FILE (default build-gpu/gpu_bundle.tar.xz, about 15 MB): the
#       executables, libzinf and the Python package without debug info, the test lists ctest
#       reads, and every shared library they link but the C and C++ runtimes', CUDA's, NCCL's
#       and the driver's. PY must be the GPU machine's Python version (the extension is built
#       for it; it does not link libtorch, so any torch 2.x there will do); default: the
#       python3 CMake finds.
# run   unpacks FILE into build-gpu/ of this checkout (replacing what is there), points the
#       test lists at this checkout and at the python3 here that imports torch, and runs
#       `gpu_check.sh --no-build` with
#       the bundled libraries on LD_LIBRARY_PATH, and NCCL from PyTorch's nvidia-nccl wheel
#       where the machine has no libnccl.so.2 of its own. Its exit code is gpu_check's.
# bench runs scripts/gpu_bench.sh (plain PyTorch against zinf) on the same pack, with the same
#       libraries: it unpacks FILE only when build-gpu/ holds another pack (so gpu_check's
#       figures from `run` stay). Its exit code is gpu_bench's.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-gpu"
usage() { sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
# Libraries every machine that runs a CUDA build has, or must take from its own driver and
# toolkit: never packed.
system_libs='^(linux-vdso|ld-linux.*|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libnvidia-.*|libcudart|libcublas|libcublasLt|libnccl)\.so'

pack() {
  local python="" out="$build/gpu_bundle.tar.xz" stage lib f
  while [ $# -gt 0 ]; do
    case "$1" in
      --python) python="${2:?--python needs an interpreter}"; shift ;;
      -o) out="${2:?-o needs a file}"; shift ;;
      *) echo "gpu_bundle pack: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
  done
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "gpu_bundle pack: no nvcc: the CUDA targets cannot be built here" >&2; exit 1; }
  export PATH="$PATH:/usr/local/cuda/bin"
  # A cached interpreter from an earlier configure would win over PY: forget it.
  mkdir -p "$build"
  cmake --preset gpu -U 'Python*' -U '_Python*' -U 'PYTHON_*' \
    ${python:+"-DPython_EXECUTABLE=$python"} >"$build/gpu_bundle_configure.log" 2>&1 ||
    { tail -n 20 "$build/gpu_bundle_configure.log" >&2; exit 1; }
  grep -q 'zinf: Python package for' "$build/gpu_bundle_configure.log" ||
    echo "gpu_bundle pack: $(grep -o 'Python package not built: .*' "$build/gpu_bundle_configure.log")" >&2
  read -ra targets <<<"$("$root/scripts/gpu_check.sh" --list-targets)"
  cmake --build "$build" --target "${targets[@]}"

  stage="$(mktemp -d)"
  trap "rm -rf '$stage'" EXIT
  mkdir -p "$stage/build-gpu" "$stage/lib"
  (cd "$build" && find . \( -name CTestTestfile.cmake -o -name '*_tests.cmake' -o -name '*_include.cmake' \
      -o -name '*_properties.cmake' -o -name CMakeCache.txt \) -print0 | tar --null -T - -cf -) | tar -C "$stage/build-gpu" -xf -
  (cd "$build" && tar -cf - python bin lib/libzinf.so*) | tar -C "$stage/build-gpu" -xf -
  rm -f "$stage/build-gpu/lib/"*.a
  for f in $(cd "$build" && find tests -maxdepth 1 -type f -executable); do
    mkdir -p "$stage/build-gpu/$(dirname "$f")"
    cp "$build/$f" "$stage/build-gpu/$f"
  done
  find "$stage/build-gpu" -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
  # What the executables and libraries link, less the system's: found by ldd here.
  find "$stage/build-gpu" -type f \( -perm -u+x -o -name '*.so*' \) -exec ldd {} + 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u | while read -r lib f; do
      grep -Eq "$system_libs" <<<"$lib" || [[ "$f" == "$build"/* ]] || cp -L "$f" "$stage/lib/$lib"
    done
  # What ctest reads must come along whole: list the cuda tests from the stage, as `run` will.
  local listed
  listed="$(cd "$stage/build-gpu" && find . \( -name CTestTestfile.cmake -o -name '*.cmake' \) -print0 |
      xargs -0 sed -i "s|$build|$stage/build-gpu|g" && ctest -N -L cuda 2>&1)"
  if grep -q 'CMake Error' <<<"$listed" || ! grep -q 'Total Tests: [1-9]' <<<"$listed"; then
    echo "gpu_bundle pack: the packed test lists do not load:" >&2; head -n 20 <<<"$listed" >&2; exit 1
  fi
  (cd "$stage/build-gpu" && find . -name '*.cmake' -print0 | xargs -0 sed -i "s|$stage/build-gpu|$build|g")
  echo "$root" >"$stage/build-gpu/gpu_bundle.root"
  sed -n 's/^_Python_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt" >"$stage/build-gpu/gpu_bundle.python"
  tar -C "$stage" -cJf "$out" build-gpu lib
  echo "gpu_bundle: $out ($(du -h "$out" | cut -f1); libraries: $(ls "$stage/lib" | xargs))"
}

# The first python3 here that imports torch, else python3.
torch_python() {
  local py
  for py in python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null && "$py" -c 'import torch' 2>/dev/null && { command -v "$py"; return; }
  done
  command -v python3 || echo python3
}

# unpack FILE: build-gpu/ from the pack, its test lists pointed at this checkout and python3.
unpack() {
  local bundle="$1" packed_root packed_python python
  rm -rf "$build"
  mkdir -p "$build/bundled-lib"
  tar -C "$build" --strip-components=1 -xJf "$bundle" build-gpu
  tar -C "$build/bundled-lib" --strip-components=1 -xJf "$bundle" lib
  packed_root="$(cat "$build/gpu_bundle.root")"
  packed_python="$(cat "$build/gpu_bundle.python")"
  python="$(torch_python)"
  # The test lists name the packing checkout and interpreter: point them at these.
  find "$build" \( -name CTestTestfile.cmake -o -name '*_tests.cmake' -o -name '*_include.cmake' \
      -o -name '*_properties.cmake' -o -name CMakeCache.txt \) -print0 |
    xargs -r0 sed -i -e "s|$packed_root|$root|g" ${packed_python:+-e "s|$packed_python|$python|g"}
  sha256sum <"$bundle" | cut -d' ' -f1 >"$build/gpu_bundle.sha256"
}

# The bundled libraries, NCCL and CUDA's on LD_LIBRARY_PATH; says which are still missing.
bundle_env() {
  local python nccl missing
  python="$(torch_python)"
  export LD_LIBRARY_PATH="$build/lib:$build/bundled-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' && [ ! -f /usr/local/cuda/lib64/libnccl.so.2 ] &&
     nccl="$("$python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)"; then
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl/lib"
  fi
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
  missing="$(ldd "$build"/tests/* "$build"/bin/* 2>/dev/null | grep 'not found' | sort -u | xargs || true)"
  [ -z "$missing" ] || echo "gpu_bundle: libraries not found here: $missing" >&2
}

# absolute FILE, or exit 2 naming the command when FILE is missing.
bundle_path() {
  [ -f "$2" ] || { echo "gpu_bundle $1: no such bundle: $2" >&2; exit 2; }
  echo "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
}

run() {
  local bundle
  bundle="$(bundle_path run "${1:?gpu_bundle run: which bundle?}")"
  shift
  unpack "$bundle"
  bundle_env
  exec "$root/scripts/gpu_check.sh" --no-build "$@"
}

bench() {
  local bundle
  bundle="$(bundle_path bench "${1:?gpu_bundle bench: which bundle?}")"
  shift
  if [ "$(cat "$build/gpu_bundle.sha256" 2>/dev/null)" != "$(sha256sum <"$bundle" | cut -d' ' -f1)" ]; then
    unpack "$bundle"
  fi
  bundle_env
  exec "$root/scripts/gpu_bench.sh" --build-dir "$build" "$@"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  bench) shift; bench "$@" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
