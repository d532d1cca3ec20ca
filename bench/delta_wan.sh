#!/usr/bin/env bash
# Deltas on slow links (docs/benchmarks.md section 17): a new version
# reaching the readers of a remote datacenter across a 100 Mbit/s wide-area
# link, whole against as a delta, in one invocation of `tensorhub-lab bench
# delta-wan` on one test bed. 8 hosts in 2 datacenters: dc0 = h0 (the
# trainer) and 3 local readers, dc1 = 4 remote readers. For each learning
# rate it saves the output under bench/results/delta-wan-lr<LR>.txt with
# the configuration at the top. Needs root. About 2 minutes per rate.
#
#   bench/delta_wan.sh [--lrs "1e-6 3e-6 1e-5"] [--hosts 8] [--host-mbit 1000]
#                      [--wan-mbit 100] [--elements 33554432]
#                      [--chunk-bytes 4MiB] [--seed 1] [--prefix thdw]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
lrs="1e-6" hosts=8 host_mbit=1000 wan_mbit=100 elements=33554432 chunk=4MiB seed=1 prefix=thdw
while [[ $# -gt 0 ]]; do
  case "$1" in
    --lrs) lrs="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --host-mbit) host_mbit="$2"; shift 2 ;;
    --wan-mbit) wan_mbit="$2"; shift 2 ;;
    --elements) elements="$2"; shift 2 ;;
    --chunk-bytes) chunk="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "delta_wan.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "delta_wan.sh: build first (bash scripts/build.sh)" >&2; exit 1; }
mkdir -p bench/results
trap 'bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
bench/testbed.sh up --prefix "$prefix" --hosts "$hosts" --dcs 2 --host-mbit "$host_mbit" --wan-mbit "$wan_mbit" --force >/dev/null
for lr in $lrs; do
  out=bench/results/delta-wan-lr$lr.txt
  {
    echo "# bench/delta_wan.sh --lrs $lr --hosts $hosts --host-mbit $host_mbit --wan-mbit $wan_mbit --elements $elements --chunk-bytes $chunk --seed $seed"
    echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), load average before: $(cut -d' ' -f1-3 /proc/loadavg); the 2 CPU cores were shared with other jobs"
    "$BIN" bench delta-wan --testbed "$prefix" --elements "$elements" --lr "$lr" --chunk-bytes "$chunk" --seed "$seed"
  } | tee "$out"
done
