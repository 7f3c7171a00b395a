#!/usr/bin/env bash
# Checks scripts/gpu_check.sh where CI runs: no GPU.
# Usage: gpu_check_test.sh no-gpu SOURCE_DIR
#          without nvidia-smi, and with one that lists no device (as the driver's does when no
#          GPU is there: "No devices were found", exit 6), the script stops at once with a
#          message that says so and exit code 77, having built nothing;
#        gpu_check_test.sh dry-run SOURCE_DIR BUILD_DIR
#          --dry-run configures BUILD_DIR and finds every step's command (exit 0; 77, a skip,
#          where there is no nvcc to configure with).
set -uo pipefail
mode="$1" src="$2"
script="$src/scripts/gpu_check.sh"
fail() { echo "FAILED: $*"; exit 1; }

case "$mode" in
  no-gpu)
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' >"$tmp/nvidia-smi"
    chmod +x "$tmp/nvidia-smi"
    for smi in "$tmp/absent/nvidia-smi" "$tmp/nvidia-smi"; do
      start=$(date +%s%N)
      msg="$(ZINF_NVIDIA_SMI="$smi" "$script" --build-dir "$tmp/build" 2>&1)"
      rc=$?
      ms=$(( ($(date +%s%N) - start) / 1000000 ))
      echo "nvidia-smi=$smi: exit $rc in $ms ms: $msg"
      [ $rc -eq 77 ] || fail "exit $rc, want 77"
      grep -q '^gpu_check: no NVIDIA GPU here: ' <<<"$msg" || fail "no 'no NVIDIA GPU here' message"
      grep -q 'Nothing was built or run' <<<"$msg" || fail "the message does not say nothing was done"
      [ ! -e "$tmp/build/gpu_check" ] || fail "it wrote $tmp/build/gpu_check before stopping"
      [ $ms -lt 5000 ] || fail "it took $ms ms to stop"
    done
    grep -q "No devices were found" <<<"$msg" || fail "the message does not quote nvidia-smi"
    ;;
  dry-run)
    build="$3"
    out="$("$script" --dry-run --build-dir "$build" 2>&1)"
    rc=$?
    echo "$out"
    [ $rc -eq 77 ] && { echo "SKIPPED: no nvcc"; exit 77; }
    [ $rc -eq 0 ] || fail "--dry-run exit $rc, want 0"
    grep -q 'every step.s command exists' <<<"$out" || fail "no verdict line"
    for s in ctest_cuda train_memory train_cpu train_nvme torch_allocator torch_models bench_pcie bench_profile; do
      grep -q "^  $s" <<<"$out" || fail "the plan has no step $s"
    done
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo PASSED
