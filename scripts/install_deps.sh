#!/usr/bin/env bash
# Installs the Debian packages zinf needs to build, test, fuzz and benchmark; silent when they are
# all present. Safe to run any number of times. The CUDA toolkit and NCCL are optional and
# never installed here: zinf builds offload/cuda when nvcc is found. iproute2 makes the network
# namespaces of the several-hosts test. Python: the zinf package
# builds against python3-dev and pybind11-dev and is tested with Debian's python3-torch (CPU);
# scripts/venv_test.sh makes virtualenvs (python3-venv) and takes its build requirements
# (scikit-build-core, pybind11) and torch 2.x from PyPI.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  liburing-dev libtbb-dev libdnnl-dev libboost-dev libboost-system-dev libgloo-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  fio time gnuplot-nox iproute2
  python3-dev python3-venv pybind11-dev python3-torch python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "zinf: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "zinf: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
