#!/usr/bin/env bash
# Several nodes, as torchrun users run them: two hosts made as network namespaces joined by a
# veth pair, one rank each under `zinf run --nnodes 2 --master HOST0:PORT`, with no loopback
# between them. Checks that
#  1. the GPT trained across them is bitwise the one a single process trains accumulating
#     the same micro-batches (the exported weights and every step's loss), and
#  2. a link taken down mid-training ends both ranks on both hosts within the collective
#     timeout, each naming the peer it lost, and leaves the checkpoint directory with only
#     committed checkpoints (no temporary files, no tag without its manifest).
# Needs root (it makes namespaces and links); skips (exit 77) saying why where it cannot.
# Usage: two_hosts_test.sh ZINF TRAIN_GPT
set -uo pipefail
zinf=$1 train_gpt=$2
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
command -v ip >/dev/null || skip "no 'ip' command (Debian: iproute2)"

id=$$
h0=zinf-h0-$id h1=zinf-h1-$id v0=zv0-$id v1=zv1-$id
a0=10.231.0.1 a1=10.231.0.2
work=$(mktemp -d /tmp/zinf-two-hosts-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$h0" 2>/dev/null
  ip netns del "$h1" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$h0" 2>/dev/null || skip "cannot make a network namespace here (not permitted)"
ip netns add "$h1" || fail "a second namespace"
ip link add "$v0" type veth peer name "$v1" || skip "cannot make a veth pair here"
ip link set "$v0" netns "$h0" && ip link set "$v1" netns "$h1" || fail "moving the links"
ip -n "$h0" addr add $a0/24 dev "$v0" && ip -n "$h1" addr add $a1/24 dev "$v1" || fail "addresses"
for h in "$h0" "$h1"; do ip -n "$h" link set lo up; done
ip -n "$h0" link set "$v0" up && ip -n "$h1" link set "$v1" up || fail "links up"

cat > "$work/config.json" <<'JSON'
{"model": {"seq_len": 32, "d_model": 64, "n_layer": 2, "n_head": 4},
 "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "eps": 0.001, "weight_decay": 0.01}}}
JSON
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
port=$((20000 + id % 20000))
common=(--config "$work/config.json" --threads 1)

# Starts host H's launcher in the background: its output in $work/hostH.log. $ifname, when
# set, names each host's interface in GLOO_SOCKET_IFNAME (zv0-* on host 0, zv1-* on host 1).
ifname=""
start_host() {
  local host=$1 ns=$2; shift 2
  local gloo_ifname=""
  [ -n "$ifname" ] && gloo_ifname=zv$host-$id
  ip netns exec "$ns" env ZINF_STORE_SECRET="$secret" GLOO_SOCKET_IFNAME="$gloo_ifname" \
    "$zinf" run --nnodes 2 --node-rank "$host" \
    -n 1 --master $a0:$port --grace 1 -- "$train_gpt" "${common[@]}" "$@" \
    > "$work/host$host.log" 2>&1 &
  pids+=($!)
}

# ---- 1. Two hosts train what one process accumulating trains, bitwise.
"$zinf" run -n 1 -- "$train_gpt" "${common[@]}" --set gradient_accumulation_steps=2 --steps 8 \
  --save "$work/one" --metrics "$work/one.jsonl" > "$work/one.log" 2>&1 ||
  fail "the one-process run: $(tail -n 5 "$work/one.log")"
for ifname in "" named; do
  rm -rf "$work/two" "$work/two.jsonl" "$work/two.safetensors"
  start_host 0 "$h0" --steps 8 --save "$work/two" --metrics "$work/two.jsonl"
  start_host 1 "$h1" --steps 8 --save "$work/two"
  for p in "${pids[@]}"; do
    wait "$p" || fail "a host's launcher failed (GLOO_SOCKET_IFNAME ${ifname:-unset}): $(tail -n 5 "$work"/host*.log)"
  done
  pids=()
  for run in one two; do
    "$zinf" ckpt export "$work/$run" --out "$work/$run.safetensors" > /dev/null ||
      fail "exporting $run"
  done
  cmp -s "$work/one.safetensors" "$work/two.safetensors" ||
    fail "two hosts' weights differ from one process accumulating the same micro-batches"
  losses() { grep -o '"loss":[^,}]*' "$1"; }
  [ "$(losses "$work/one.jsonl")" = "$(losses "$work/two.jsonl")" ] && [ -n "$(losses "$work/one.jsonl")" ] ||
    fail "the losses differ: $(losses "$work/one.jsonl" | head -3) vs $(losses "$work/two.jsonl" | head -3)"
done
ifname=""
echo "two hosts over $v0/$v1 trained bitwise what one process accumulating trains" \
  "($(losses "$work/one.jsonl" | wc -l) steps; interface found from the master's address, and named)"

# ---- 2. A link down mid-training ends every rank on every host within the timeout.
timeout_s=3
start_host 0 "$h0" --steps 1000000 --log-every 1 --comm-timeout-s $timeout_s --save "$work/ckpt" \
  --save-every 2
start_host 1 "$h1" --steps 1000000 --log-every 1 --comm-timeout-s $timeout_s --save "$work/ckpt" \
  --save-every 2
for _ in $(seq 600); do
  [ -f "$work/ckpt/latest" ] && grep -q " 5/1000000" "$work/host0.log" && break
  sleep 0.1
done
[ -f "$work/ckpt/latest" ] || fail "no checkpoint committed within 60 s: $(tail -n 5 "$work/host0.log")"
ip -n "$h1" link set "$v1" down
down=$(date +%s.%N)
for p in "${pids[@]}"; do
  for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "a host's ranks still run 60 s after the link went down"
  wait "$p" && fail "a host's launcher exited 0 after losing its peer"
done
pids=()
took=$(awk -v a="$down" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "both hosts ended ${took} s after the link went down (collective timeout ${timeout_s} s)"
awk -v t="$took" -v limit=$((timeout_s * 3 + 5)) 'BEGIN { exit !(t < limit) }' ||
  fail "ending took ${took} s"
for host in 0 1; do
  grep -q "waiting on rank $((1 - host))" "$work/host$host.log" ||
    fail "host $host does not name the peer it lost: $(tail -n 5 "$work/host$host.log")"
done
leftovers=$(find "$work/ckpt" -name '*.tmp')
[ -z "$leftovers" ] || fail "temporary files left in the checkpoint directory: $leftovers"
for tag in "$work"/ckpt/*/; do
  [ -f "$tag/manifest.json" ] || fail "tag $tag has no manifest: half-written"
done
"$zinf" ckpt export "$work/ckpt" --out "$work/ckpt.safetensors" > /dev/null ||
  fail "the last committed checkpoint does not load"
echo "several hosts: every check passed"
