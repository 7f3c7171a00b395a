#!/usr/bin/env bash
# Installs zinf from a build tree into a temporary prefix, checks that no installed file has a
# RUNPATH outside $ORIGIN and that bin/zinf says the package's version, then builds the
# out-of-tree programs in consumer/ against that prefix alone, once through CMake
# (find_package(zinf CONFIG), target zinf::zinf, which must bring C++20) and once through
# pkg-config (zinf.pc), and runs them. Registered with CTest
# by tests/install/CMakeLists.txt; exits non-zero on any failure.
# Usage: install_test.sh BUILD_DIR CONSUMER_DIR CMAKE GENERATOR CC CXX [CFLAGS] [LDFLAGS] [PYTHON]
# (CFLAGS and LDFLAGS: the build's own, so that a sanitizer build links its runtime first.
# PYTHON: the interpreter the zinf Python package was built for; when given and the package was
# installed, it must import from the prefix alone and step an optimizer.)
set -euo pipefail
build=$1 consumer=$2 cmake=$3 generator=$4 cc=$5 cxx=$6
flags=${7:-} ldflags=${8:-} python=${9:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zinf-install-test-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
mkdir -p "$tmp/scratch"

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  exit 1
}

# Installed binaries find their libraries relative to themselves or through the loader's
# search path, never through a directory of the build machine.
bash "$(dirname "$0")/check_runpath.sh" "$prefix"

# The command line is installed, and says the package's version.
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$prefix"/lib*/cmake/zinf/zinfConfigVersion.cmake)
[ -n "$version" ] || { echo "no PACKAGE_VERSION in the installed zinfConfigVersion.cmake" >&2; exit 1; }
[ -x "$prefix/bin/zinf" ] || { echo "cmake --install did not install bin/zinf" >&2; exit 1; }
cli_version=$("$prefix/bin/zinf" --version)
[ "$cli_version" = "zinf $version" ] || {
  echo "bin/zinf --version says '$cli_version', the package is $version" >&2
  exit 1
}
echo "bin/zinf --version: $cli_version"

# `zinf plan --hardware NAME` and `--model NAME` read the shipped descriptions beside bin/.
for f in share/zinf/hardware/dgx2-v100.json share/zinf/models/gpt-10b.json; do
  [ -f "$prefix/$f" ] || { echo "cmake --install did not install $f" >&2; exit 1; }
done
"$prefix/bin/zinf" plan --json --model gpt-10b --hardware dgx2-v100 >"$tmp/plan.json" || {
  echo "the installed zinf plan --hardware dgx2-v100 failed" >&2
  exit 1
}

# zinf::zinf carries its C++20 requirement (consumer_cxx sets no standard of its own and
# static_asserts C++20, so its build below proves the flag arrives; this names the cause).
grep -q 'INTERFACE_COMPILE_FEATURES "cxx_std_20"' "$prefix"/lib*/cmake/zinf/zinfTargets.cmake || {
  echo "the exported zinf::zinf does not carry cxx_std_20" >&2
  exit 1
}

# The installed headers include nothing but <zinf/...> and the standard library.
if grep -rn '#include "' "$prefix/include/zinf" | grep -v '#include "zinf/'; then
  echo "installed headers include files outside zinf/ (above)" >&2
  exit 1
fi

echo "== CMake: find_package(zinf CONFIG)"
"$cmake" -S "$consumer" -B "$tmp/cmake-build" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
  >"$tmp/configure.log" || {
  cat "$tmp/configure.log"
  exit 1
}
"$cmake" --build "$tmp/cmake-build"
"$tmp/cmake-build/consumer_c" "$tmp/scratch"
"$tmp/cmake-build/consumer_cxx"

echo "== pkg-config zinf"
pc=$(find "$prefix" -name zinf.pc -print -quit)
[ -n "$pc" ] || { echo "no zinf.pc under $prefix" >&2; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
echo "zinf $(pkg-config --modversion zinf): $(pkg-config --cflags --libs zinf)"
read -r -a pc_cflags <<<"$(pkg-config --cflags zinf)"
read -r -a pc_libs <<<"$(pkg-config --libs zinf)"
libdir=$(pkg-config --variable=libdir zinf)
read -r -a extra_flags <<<"$flags"
read -r -a extra_ldflags <<<"$ldflags"
"$cc" -std=c11 "${extra_flags[@]}" "${pc_cflags[@]}" "$consumer/consumer.c" -o "$tmp/pc_consumer_c" \
  "${extra_ldflags[@]}" "${pc_libs[@]}" -Wl,-rpath,"$libdir"
"$cxx" -std=c++20 "${extra_flags[@]}" "${pc_cflags[@]}" "$consumer/consumer.cc" \
  -o "$tmp/pc_consumer_cxx" "${extra_ldflags[@]}" "${pc_libs[@]}" -Wl,-rpath,"$libdir"
"$tmp/pc_consumer_c" "$tmp/scratch"
"$tmp/pc_consumer_cxx"

package=$(find "$prefix" -path '*-packages/zinf/__init__.py' -print -quit)
if [ -n "$python" ] && [ -n "$package" ]; then
  echo "== Python: import zinf from $(dirname "$(dirname "$package")")"
  # ZINF_PYTHON_PRELOAD: the sanitizers' runtimes, in a sanitizer build (tests/install).
  (cd "$tmp/scratch" && PYTHONPATH=$(dirname "$(dirname "$package")") \
    LD_PRELOAD=${ZINF_PYTHON_PRELOAD:-} ASAN_OPTIONS=${ZINF_PYTHON_PRELOAD:+detect_leaks=0} \
    "$python" -c '
import zinf, zinf.nvme, zinf.optim, zinf.zero, zinf.cuda
assert zinf.__file__.startswith("'"$prefix"'"), zinf.__file__
assert zinf.__version__ == "'"$version"'", zinf.__version__
import torch
p = torch.nn.Parameter(torch.ones(8)); p.grad = torch.ones(8)
zinf.optim.AdamW([p], lr=0.5, weight_decay=0.0).step()
assert torch.allclose(p.detach(), torch.full((8,), 0.5)), p
print("installed zinf package: ok")' ) || {
    echo "the installed Python package does not work from $prefix" >&2
    exit 1
  }
fi
echo "install test: ok"
