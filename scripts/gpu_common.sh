# What scripts/gpu_check.sh and scripts/gpu_bench.sh share; sourced by both.

# Prints why there is no usable NVIDIA GPU and returns 1, or returns 0 (quickly either way).
# ZINF_NVIDIA_SMI names another nvidia-smi (the tests' stand-ins).
no_gpu_reason() {
  local smi="${ZINF_NVIDIA_SMI:-nvidia-smi}" list rc
  if ! command -v "$smi" >/dev/null 2>&1; then
    echo "$smi not found (no NVIDIA driver)"
    return 1
  fi
  list="$(timeout 30 "$smi" -L 2>&1)"; rc=$?
  if [ $rc -ne 0 ] || ! grep -q '^GPU [0-9]' <<<"$list"; then
    echo "'$smi -L' lists no GPU (exit $rc: $(head -n 1 <<<"$list"))"
    return 1
  fi
  return 0
}
