#!/usr/bin/env bash
# Builds bench/mpi_bcast.c and runs it across a test bed made by
# bench/testbed.sh: rank 0 (the trainer) on h0, receivers on the other
# hosts, once per OpenMPI broadcast algorithm; reports each beside the link
# lower bound S/B and names the best. Needs root (ip netns exec).
#
#   mpi_bcast.sh [--prefix th] [--bytes S] [--receivers N] [--iters K]
#                [--algorithms "default 2 3 9"] [--segment-bytes 1048576]
#                [--timeout-s 300] [--step-ms T --batch-ms T]
#
# With --step-ms and --batch-ms it runs the rollout loop of `tensorhub-lab bench
# workload` (--iters rounds of step, broadcast, batch; see mpi_bcast.c) and
# prints mpi_workload lines, then mpi_workload_best (least total stall):
#   mpi_workload_best algorithm=.. blocked_s=.. wait_s=.. update_s=.. stall_gpu_s=..
#
# Output, one line per algorithm, then one summary line:
#   mpi_bcast bytes=.. ranks=.. algorithm=.. seconds=.. ... bound_seconds=.. ratio=..
#   mpi_bcast_best algorithm=.. seconds=.. bound_seconds=.. ratio=..
# ratio = seconds / bound_seconds (1.0 would be a link-rate broadcast).
# Exit status: non-zero if any run failed or was not verified.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix="th" bytes=268435456 receivers="" iters=1 algorithms="default 2 3 9"
segment_bytes=1048576 timeout_s=300 seed=42 step_ms="" batch_ms=""
die() { echo "mpi_bcast.sh: $*" >&2; exit 1; }

while (($#)); do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --receivers) receivers="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --algorithms) algorithms="$2"; shift 2 ;;
    --segment-bytes) segment_bytes="$2"; shift 2 ;;
    --timeout-s) timeout_s="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --step-ms) step_ms="$2"; shift 2 ;;
    --batch-ms) batch_ms="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ $(id -u) -eq 0 ]] || die "needs root (ip netns exec)"

state="${TESTBED_STATE_DIR:-/run}/tensorhub-testbed-${prefix}.env"
[[ -r "$state" ]] || die "no test bed '$prefix' ($state missing): run bench/testbed.sh up first"
# shellcheck disable=SC1090
source "$state"
read -r -a names <<<"$TB_HOST_NAMES"
read -r -a ips <<<"$TB_HOST_IPS"
read -r -a dcs <<<"$TB_HOST_DCS"
((TB_HOSTS >= 2)) || die "need at least 2 hosts in the test bed"
receivers="${receivers:-$((TB_HOSTS - 1))}"
[[ "$receivers" =~ ^[0-9]+$ ]] && ((receivers >= 1)) || die "--receivers must be >= 1"
workload=()
if [[ -n "$step_ms$batch_ms" ]]; then
  [[ "$step_ms" =~ ^[0-9]+$ && "$batch_ms" =~ ^[0-9]+$ ]] || die "--step-ms and --batch-ms go together, in ms"
  workload=("$step_ms" "$batch_ms")
fi

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "mpi_bcast.sh: installing openmpi-bin libopenmpi-dev" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

build_dir="${BENCH_BUILD_DIR:-/tmp/tensorhub-bench}"
mkdir -p "$build_dir"
bin="$build_dir/mpi_bcast"
if [[ ! -x "$bin" || "$here/mpi_bcast.c" -nt "$bin" ]]; then
  mpicc -O2 -std=c11 -Wall -Wextra -o "$bin.tmp" "$here/mpi_bcast.c"
  mv "$bin.tmp" "$bin"
fi

work="$(mktemp -d "/tmp/tensorhub-mpi-${prefix}.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The launcher's rsh agent: OpenMPI calls it as "AGENT [opts] HOST CMD..."
# and it must start CMD inside HOST's namespace. HOST is an IP from the
# hostfile (so nothing has to be added to /etc/hosts).
agent="$work/netns_rsh"
{
  echo '#!/usr/bin/env bash'
  echo 'while [[ "${1:-}" == -* ]]; do shift; done'
  echo 'host="$1"; shift'
  echo "ns=\"\$(awk -v h=\"\$host\" '\$1 == h || \$2 == h { print \$2 }' '$TB_HOSTS_FILE')\""
  echo '[[ -n "$ns" ]] || { echo "netns_rsh: unknown host $host" >&2; exit 1; }'
  echo 'exec ip netns exec "$ns" bash -c "$*"'
} >"$agent"
chmod +x "$agent"

# Rank 0 alone on h0; receivers fill h1..h{H-1} one per host, and only if
# there are more receivers than hosts do several share a host.
others=$((TB_HOSTS - 1))
per_host=$(((receivers + others - 1) / others))
hostfile="$work/hostfile"
{
  echo "${ips[0]} slots=1"
  left=$receivers
  for ((i = 1; i < TB_HOSTS && left > 0; i++)); do
    n=$((left < per_host ? left : per_host))
    echo "${ips[i]} slots=$n"
    left=$((left - n))
  done
} >"$hostfile"

# The bound is set by the slowest link a receiver sits behind.
link_mbit=$TB_HOST_MBIT
for ((i = 1; i <= receivers && i < TB_HOSTS; i++)); do
  if ((dcs[i] != dcs[0] && TB_WAN_MBIT < link_mbit)); then link_mbit=$TB_WAN_MBIT; fi
done
bound_s="$(awk -v b="$bytes" -v m="$link_mbit" 'BEGIN { printf "%.4f", b * 8 / (m * 1e6) }')"

best_alg="" best_s="" failed=0
for alg in $algorithms; do
  mca=()
  if [[ "$alg" != "default" ]]; then
    mca=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_bcast_algorithm "$alg"
         --mca coll_tuned_bcast_algorithm_segmentsize "$segment_bytes")
  fi
  log="$work/run-$alg.log"
  # mpirun runs inside h0's namespace: its daemons call home over the
  # test bed subnet, which the root namespace has no address in.
  # pml ob1 keeps UCX from bypassing the tcp btl. rtc_hwloc_vmhole none:
  # an orted otherwise maps hwloc's topology at an address in a "hole" of
  # its address space, which sometimes lies on its stack: about one launch
  # in ten on this machine segfaulted there (hwloc_shmem_topology_write),
  # and mpirun waited for the missing daemon until --timeout-s.
  rc=0
  out="$(ip netns exec "${names[0]}" timeout "$timeout_s" mpirun \
      --allow-run-as-root --oversubscribe -np $((receivers + 1)) \
      --hostfile "$hostfile" --map-by slot --bind-to none \
      --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
      --mca pml ob1 --mca btl tcp,self --mca rtc_hwloc_vmhole none \
      --mca btl_tcp_if_include "$TB_SUBNET" --mca oob_tcp_if_include "$TB_SUBNET" \
      "${mca[@]}" "$bin" "$bytes" "$iters" "$alg" "$seed" "${workload[@]}" 2>"$log")" || rc=$?
  if ((rc != 0)); then
    echo "mpi_bcast.sh: algorithm $alg failed (exit $rc$( ((rc == 124)) && echo ": mpirun ran past --timeout-s $timeout_s")); output: $out; log:" >&2
    tail -n 30 "$log" >&2
    failed=1
    continue
  fi
  if ((${#workload[@]})); then
    line="$(grep '^mpi_workload ' <<<"$out" | tail -n 1)"
    if [[ -z "$line" || "$line" != *"verified=1"* ]]; then
      echo "mpi_bcast.sh: algorithm $alg: no verified result; output: $out" >&2
      tail -n 30 "$log" >&2
      failed=1
      continue
    fi
    echo "$line link_mbit=$link_mbit bound_seconds=$bound_s"
    s="$(sed -E 's/.* stall_gpu_s=([0-9.]+).*/\1/' <<<"$line")"
    if [[ -z "$best_s" ]] || awk -v a="$s" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then
      best_s="$s" best_alg="$alg" best_line="$line"
    fi
    continue
  fi
  line="$(grep '^mpi_bcast ' <<<"$out" | tail -n 1)"
  if [[ -z "$line" || "$line" != *"verified=1"* ]]; then
    echo "mpi_bcast.sh: algorithm $alg: no verified result; output: $out" >&2
    tail -n 30 "$log" >&2
    failed=1
    continue
  fi
  s="$(sed -E 's/.* seconds=([0-9.]+).*/\1/' <<<"$line")"
  echo "$line link_mbit=$link_mbit bound_seconds=$bound_s ratio=$(awk -v s="$s" -v b="$bound_s" 'BEGIN { printf "%.2f", s / b }')"
  if [[ -z "$best_s" ]] || awk -v a="$s" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then
    best_s="$s" best_alg="$alg"
  fi
done

if [[ -n "$best_s" ]] && ((${#workload[@]})); then
  echo "mpi_workload_best ${best_line#mpi_workload } link_mbit=$link_mbit bound_seconds=$bound_s"
elif [[ -n "$best_s" ]]; then
  echo "mpi_bcast_best bytes=$bytes receivers=$receivers algorithm=$best_alg seconds=$best_s bound_seconds=$bound_s ratio=$(awk -v s="$best_s" -v b="$bound_s" 'BEGIN { printf "%.2f", s / b }')"
fi
exit $failed
