#!/usr/bin/env bash
# Checks scripts/gpu_bench.sh where CI runs: no GPU.
# Usage: gpu_bench_test.sh no-gpu SOURCE_DIR
#          without nvidia-smi, and with one that lists no device (as the driver's does when no
#          GPU is there: "No devices were found", exit 6), the script stops at once with a
#          message that says so and exit code 77, having written nothing;
#        gpu_bench_test.sh dry-run SOURCE_DIR BUILD_DIR WORK_DIR
#          --dry-run with zinf's package from BUILD_DIR runs every part on the CPU with tiny
#          models (exit 0; 77, a skip, where no interpreter here has torch 2.x and that
#          package) and writes one JSON file and its text, every part in them passed.
set -uo pipefail
mode="$1" src="$2"
script="$src/scripts/gpu_bench.sh"
fail() { echo "FAILED: $*"; exit 1; }

case "$mode" in
  no-gpu)
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' >"$tmp/nvidia-smi"
    chmod +x "$tmp/nvidia-smi"
    for smi in "$tmp/absent/nvidia-smi" "$tmp/nvidia-smi"; do
      start=$(date +%s%N)
      msg="$(ZINF_NVIDIA_SMI="$smi" "$script" --out "$tmp/bench/gpu_bench.json" 2>&1)"
      rc=$?
      ms=$(( ($(date +%s%N) - start) / 1000000 ))
      echo "nvidia-smi=$smi: exit $rc in $ms ms: $msg"
      [ $rc -eq 77 ] || fail "exit $rc, want 77"
      grep -q '^gpu_bench: no NVIDIA GPU here: ' <<<"$msg" || fail "no 'no NVIDIA GPU here' message"
      grep -q 'Nothing was run' <<<"$msg" || fail "the message does not say nothing was done"
      [ ! -e "$tmp/bench" ] || fail "it wrote $tmp/bench before stopping"
      [ $ms -lt 5000 ] || fail "it took $ms ms to stop"
    done
    grep -q "No devices were found" <<<"$msg" || fail "the message does not quote nvidia-smi"
    ;;
  dry-run)
    build="$3" work="$4"
    rm -rf "$work"
    start=$(date +%s)
    out="$("$script" --dry-run --build-dir "$build" --out "$work/gpu_bench.json" 2>&1)"
    rc=$?
    echo "$out"
    echo "--dry-run: exit $rc in $(( $(date +%s) - start )) s"
    [ $rc -eq 77 ] && { echo "SKIPPED: $(grep -m1 'skipped' <<<"$out")"; exit 77; }
    for p in a b c; do
      [ -f "$work/logs/$p.log" ] && { echo "--- part $p's log (tail)"; tail -n 15 "$work/logs/$p.log"; }
    done
    [ $rc -eq 0 ] || fail "--dry-run exit $rc, want 0"
    grep -q 'every part ran on the CPU' <<<"$out" || fail "no verdict line"
    for p in a b c; do
      grep -q "^  $p " <<<"$out" || fail "the plan has no part $p"
      grep -q "^== $p: PASS" "$work/gpu_bench.txt" || fail "gpu_bench.txt has no passed part $p"
    done
    python3 - "$work/gpu_bench.json" <<'PY' || fail "gpu_bench.json lacks what the parts measure"
import json, sys
r = json.load(open(sys.argv[1]))
parts = r["parts"]
for key in ("fp32", "bf16"):
    e = parts["a"][key]
    assert e["torch"]["tokens_per_s"] > 0 and e["zinf"]["tokens_per_s"] > 0, key
    assert e["zinf_over_torch"] > 0 and "host_waits" in e["counters"]["median"], key
    assert "table" in parts["a"][key + "_profile"], key
assert parts["b"]["bf16"]["zinf_offload_param"] == "cpu"
assert parts["b"]["bf16"]["counters"]["median"]["bytes_up"] > 0  # parameters came from the host
c = parts["c"]
assert c["status"] == "pass" and c["tokens_per_s"] > 0 and c["torch_reference"]["tokens_per_s"] > 0
assert c["counters"]["last"]["device_peak_bytes"] <= c["device_budget_bytes"]
assert "table" in c["profile"] and c["llama_choice"]["chosen"]["layers"] == c["layers"]
# The budget the dry run starts with is refused, and the engine's figure taken (the fallback).
assert any("zinf.device_budget 1048576 refused" in n for n in c["notes"]), c["notes"]
print("gpu_bench.json: every part's figures present")
PY
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo PASSED
