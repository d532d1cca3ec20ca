#!/usr/bin/env bash
# The fan-out and cross-datacenter benchmarks of docs/benchmarks.md, end to
# end: for each N it builds a test bed of N+1 hosts (bench/testbed.sh), runs
# TensorHub, the point-to-point baseline (readers do not serve), OpenMPI's
# MPI_Bcast (best of its algorithms) and torch.distributed broadcast over
# gloo, all on the same shaped links, then tears the test bed down. Results
# go to bench/results/fanout.txt (one machine-readable line per run) and a
# plot to docs/fanout.png. Needs root. About 15 minutes with the defaults.
#
#   bench/fanout.sh [--readers "4 8 16"] [--bytes 268435456] [--host-mbit 400]
#                   [--wan-mbit 100] [--crossdc-readers 7] [--chunk-bytes 2MiB]
#                   [--skip "p2p mpi gloo ucx"] [--output bench/results/fanout.txt]
#
# TensorHub runs over TCP, then over UCX on the same test bed (skip with
# --skip ucx, as a build without UCX must).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
readers_list="4 8 16"; bytes=268435456; host_mbit=400; wan_mbit=100; xdc=7; skip=""; chunk=2MiB
while [[ $# -gt 0 ]]; do
  case "$1" in
    --readers) readers_list="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --host-mbit) host_mbit="$2"; shift 2 ;;
    --wan-mbit) wan_mbit="$2"; shift 2 ;;
    --crossdc-readers) xdc="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    --chunk-bytes) chunk="$2"; shift 2 ;;
    --output) out_override="$2"; shift 2 ;;
    *) echo "fanout.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "fanout.sh: build first (bash scripts/build.sh)" >&2; exit 1; }
mkdir -p bench/results
out=${out_override:-bench/results/fanout.txt}
: > "$out"
prefix=thfo
trap 'bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
skipped() { [[ " $skip " == *" $1 "* ]]; }
record() { echo "$*" | tee -a "$out"; }
# Runs a command, shows its output on stderr, prints its last matching line.
# (Not `tee /dev/stderr`: that reopens stderr's file and truncates a log.)
run_last() { local pat="$1"; shift; local o; o="$("$@")"; echo "$o" >&2; grep -a "$pat" <<< "$o" | tail -1; }

for n in $readers_list; do
  echo "=== fan-out to $n readers, ${host_mbit} Mbit/s links, $bytes bytes"
  bench/testbed.sh up --prefix "$prefix" --hosts $((n + 1)) --dcs 1 --host-mbit "$host_mbit" --force >/dev/null
  record "$(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$n" --bytes "$bytes" --chunk-bytes "$chunk" --mode tensorhub --repeat 2)"
  skipped ucx || record "$(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$n" --bytes "$bytes" --chunk-bytes "$chunk" --mode tensorhub --transport ucx --repeat 2)"
  skipped p2p || record "$(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$n" --bytes "$bytes" --chunk-bytes "$chunk" --mode p2p --repeat 1)"
  skipped mpi || record "$(run_last '^mpi_bcast_best' bench/mpi_bcast.sh --prefix "$prefix" --bytes "$bytes" --receivers "$n" --algorithms "3 9")"
  skipped gloo || record "$(run_last '^gloo_bcast' bench/gloo_bcast.sh --prefix "$prefix" --bytes "$bytes" --receivers "$n")"
  bench/testbed.sh down --prefix "$prefix" >/dev/null
done

if [[ "$xdc" -gt 0 ]]; then
  hosts=$(( (xdc + 1) ))
  echo "=== cross-datacenter: $hosts hosts in 2 DCs, WAN ${wan_mbit} Mbit/s"
  bench/testbed.sh up --prefix "$prefix" --hosts "$hosts" --dcs 2 --host-mbit "$host_mbit" --wan-mbit "$wan_mbit" --force >/dev/null
  record "crossdc $(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$xdc" --bytes "$bytes" --chunk-bytes "$chunk" --mode tensorhub --repeat 1)"
  skipped ucx || record "crossdc $(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$xdc" --bytes "$bytes" --chunk-bytes "$chunk" --mode tensorhub --transport ucx --repeat 1)"
  skipped p2p || record "crossdc $(run_last '^fanout ' "$BIN" bench fanout --testbed "$prefix" --readers "$xdc" --bytes "$bytes" --chunk-bytes "$chunk" --mode p2p --repeat 1)"
  bench/testbed.sh down --prefix "$prefix" >/dev/null
fi

if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null
fi
[[ -n "${out_override:-}" ]] || /usr/bin/python3 bench/plot_fanout.py "$out" docs/fanout.png
echo "results: $out"
