#!/usr/bin/env bash
# The three rollout workloads of docs/benchmarks.md ("Workloads"), end to
# end: for each it builds a test bed (bench/testbed.sh), runs `tensorhub-lab
# bench workload` (TensorHub, point-to-point and, where a static group can
# do the job, MPI_Bcast, all on the same test bed in one invocation), saves
# the output under bench/results/workload-<name>.txt with the configuration
# at the top, and tears the test bed down. Needs root. About 15 minutes.
#
#   bench/workload.sh [--only "standalone elastic crossdc"] [--hosts 9]
#                     [--host-mbit 400] [--wan-mbit 100] [--bytes 128MiB]
#                     [--chunk-bytes 2MiB] [--step-ms 8000] [--batch-ms 2000]
#                     [--rounds 4] [--crossdc-rounds 3] [--crossdc-step-ms 16000]
#                     [--spot 3] [--seed 1] [--prefix thwl]
#
# The trainer's step is longer than a rollout's batch plus its update, so
# rollouts keep up and fetch every version (a rollout that falls behind
# skips to the newest; the per-round figures then get harder to read).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
only="standalone elastic crossdc" hosts=9 host_mbit=400 wan_mbit=100 bytes=128MiB chunk=2MiB
step=8000 batch=2000 rounds=4 xrounds=3 xstep=16000 spot=3 seed=1 prefix=thwl
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --host-mbit) host_mbit="$2"; shift 2 ;;
    --wan-mbit) wan_mbit="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --chunk-bytes) chunk="$2"; shift 2 ;;
    --step-ms) step="$2"; shift 2 ;;
    --batch-ms) batch="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --crossdc-rounds) xrounds="$2"; shift 2 ;;
    --crossdc-step-ms) xstep="$2"; shift 2 ;;
    --spot) spot="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    *) echo "workload.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "workload.sh: build first (bash scripts/build.sh)" >&2; exit 1; }
mkdir -p bench/results
trap 'bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
common=(--testbed "$prefix" --bytes "$bytes" --chunk-bytes "$chunk" --batch-ms "$batch" --seed "$seed")
rc=0
for w in $only; do
  dcs=1 extra=(--rounds "$rounds" --step-ms "$step")
  case "$w" in
    crossdc) dcs=2 extra=(--rounds "$xrounds" --step-ms "$xstep") ;;
    elastic) extra+=(--spot "$spot") ;;
    standalone) ;;
    *) echo "workload.sh: unknown workload $w" >&2; exit 2 ;;
  esac
  out=bench/results/workload-$w.txt
  bench/testbed.sh up --prefix "$prefix" --hosts "$hosts" --dcs "$dcs" --host-mbit "$host_mbit" --wan-mbit "$wan_mbit" --force >/dev/null
  {
    echo "# bench/workload.sh --only $w --hosts $hosts --host-mbit $host_mbit --wan-mbit $wan_mbit --bytes $bytes --chunk-bytes $chunk --step-ms $step --batch-ms $batch --rounds $rounds --crossdc-rounds $xrounds --crossdc-step-ms $xstep --spot $spot --seed $seed"
    echo "# test bed: $hosts hosts, $dcs DC(s), host links ${host_mbit} Mbit/s (tbf, both directions)$([[ $dcs -gt 1 ]] && echo ", WAN ${wan_mbit} Mbit/s")"
    echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), load average before: $(cut -d' ' -f1-3 /proc/loadavg); the 2 CPU cores were shared with other jobs"
  } > "$out"
  "$BIN" bench workload "$w" "${common[@]}" "${extra[@]}" 2>&1 | tee -a "$out" || rc=1
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out"
  bench/testbed.sh down --prefix "$prefix" >/dev/null
  echo "results: $out"
done
exit $rc
