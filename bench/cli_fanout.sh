#!/usr/bin/env bash
# N readers of one version with the product CLI, started together, on a test
# bed of N+1 hosts (bench/testbed.sh, one DC, shaped host links): h0 runs
# `tensorhub serve` and `tensorhub publish` of an S-byte safetensors file
# with the default settings (4 MiB chunks, cut-through); h1..hN each run
# `tensorhub fetch --hold --stats-json` of it at once. Prints each reader's
# own fetch time (--stats-json "seconds"), the slowest beside the bound S/B
# (B a link's shaped rate, as bench fanout has it; TCP payload gets 0.956 of
# it, docs/benchmarks.md section 3) and their ratio; then OpenMPI's
# MPI_Bcast of the same bytes on
# the same hosts (bench/mpi_bcast.sh, best of its pipelined algorithms).
# Needs root. Run under the shared lock:
#   flock /tmp/th-testbed.lock bash bench/cli_fanout.sh
#
#   bench/cli_fanout.sh [--readers "8 16"] [--bytes 134217728]
#                       [--host-mbit 400] [--skip-mpi]
#                       [--output bench/results/cli-fanout.txt]
#
# Output, per N:
#   cli_fanout readers=N bytes=S max_seconds=.. mean_seconds=.. bound_seconds=..
#     ratio=.. wall_seconds=.. ok=1
#   mpi_bcast_best bytes=S receivers=N algorithm=.. seconds=.. ratio=..
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TENSORHUB_BIN:-$PWD/build/tools/tensorhub}
readers_list="8 16"; bytes=134217728; host_mbit=400; skip_mpi=0
out="bench/results/cli-fanout.txt"
while (($#)); do
  case "$1" in
    --readers) readers_list="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --host-mbit) host_mbit="$2"; shift 2 ;;
    --skip-mpi) skip_mpi=1; shift ;;
    --output) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "cli_fanout.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "cli_fanout.sh: needs root (network namespaces, tc)" >&2; exit 1; }
[[ -x "$BIN" ]] || { echo "cli_fanout.sh: no CLI binary at $BIN (build the tensorhub target)" >&2; exit 1; }
prefix=thclf
net=10.83
port=7474
work="$(mktemp -d /tmp/cli-fanout.XXXXXX)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
  bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true
}
trap 'cleanup; rm -rf "$work"' EXIT
# shellcheck source=tests/testbed/lib.sh
source tests/testbed/lib.sh
ns() { echo "${prefix}-h$1"; }
mkdir -p "$(dirname "$out")"
: >"$out"

python3 - "$work/model.safetensors" "$bytes" <<'EOF'
import json, os, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
EOF

for n in $readers_list; do
  echo "=== $n CLI readers of $bytes bytes, ${host_mbit} Mbit/s links" >&2
  bench/testbed.sh up --prefix "$prefix" --net "$net" --hosts $((n + 1)) --dcs 1 \
    --host-mbit "$host_mbit" --force >/dev/null
  # shellcheck disable=SC1090
  source "/run/tensorhub-testbed-${prefix}.env"
  read -r -a ips <<<"$TB_HOST_IPS"
  hub="${ips[0]}:$port"
  ip netns exec "$(ns 0)" "$BIN" serve --listen "$hub" --rebuild-ms 0 2>"$work/hub.err" &
  pids+=($!)
  wait_for "the hub" 20 bash -c "ip netns exec $(ns 0) ss -ltn 'sport = :$port' | grep -q LISTEN"
  ip netns exec "$(ns 0)" "$BIN" publish "$work/model.safetensors" --model m --version 1 \
    --hub "$hub" --data-listen "${ips[0]}:0" --host-label h0 \
    >"$work/pub.out" 2>"$work/pub.err" &
  pids+=($!)
  wait_for "the publisher" 60 grep -qs "serving from" "$work/pub.out"
  rm -f "$work"/r*.json "$work"/r*.safetensors
  # The machine's busy CPU over the fetches (/proc/stat: all but idle and
  # iowait), to tell a link-bound run from a CPU-bound one.
  busy0=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
  t0=$(date +%s.%N)
  readers=()
  for ((i = 1; i <= n; i++)); do
    ip netns exec "$(ns "$i")" "$BIN" fetch m@1 -o "$work/r$i.safetensors" --hold \
      --stats-json "$work/r$i.json" --hub "$hub" --data-listen "${ips[i]}:0" \
      --host-label "h$i" >"$work/r$i.out" 2>"$work/r$i.err" &
    readers+=($!)
    pids+=($!)
  done
  all_done() {
    local i
    for ((i = 1; i <= n; i++)); do [[ -s "$work/r$i.json" ]] || return 1; done
  }
  wait_for "$n fetches" 300 all_done
  t1=$(date +%s.%N)
  busy1=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
  # The readers' own CPU (user + system, all threads; they --hold, so still
  # running), in seconds.
  reader_cpu=0
  for p in "${readers[@]}"; do
    c=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    reader_cpu=$((reader_cpu + c))
  done
  tck=$(getconf CLK_TCK)
  echo "cli_fanout_cpu readers=$n machine_busy=$(echo "$busy0 $busy1" | awk '{b = $3 - $1; i = $4 - $2; printf "%.2f", b / (b + i)}') readers_cpu_seconds=$(awk -v c="$reader_cpu" -v t="$tck" 'BEGIN{printf "%.2f", c / t}') cpus=$(nproc)" | tee -a "$out"
  ok=1
  for ((i = 1; i <= n; i++)); do
    cmp -s "$work/r$i.safetensors" "$work/model.safetensors" || ok=0
  done
  line="$(python3 - "$bytes" "$host_mbit" "$n" "$t0" "$t1" "$ok" "$work"/r*.json <<'EOF'
import json, sys
size, mbit, n, t0, t1, ok = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
stats = [json.load(open(p)) for p in sys.argv[7:]]
secs = [s["seconds"] for s in stats]
bound = size / (mbit * 1e6 / 8)
print(f"cli_fanout readers={n} bytes={size} max_seconds={max(secs):.3f} "
      f"mean_seconds={sum(secs) / len(secs):.3f} bound_seconds={bound:.3f} "
      f"ratio={max(secs) / bound:.3f} wall_seconds={t1 - t0:.3f} ok={ok} "
      f"host_mbit={mbit:.0f}")
# Where the slowest reader's time went (FetchStats' stages), and the
# largest of each stage over the readers.
slow = max(stats, key=lambda s: s["seconds"])
stages = ["resolve_seconds", "schedule_seconds", "first_byte_seconds",
          "transfer_seconds", "verify_seconds", "register_seconds"]
print("cli_fanout_stages readers=%d slowest: %s; max over readers: %s; "
      "manifest from: %s" % (
          n, " ".join(f"{k[:-8]}={slow.get(k, 0):.3f}" for k in stages),
          " ".join(f"{k[:-8]}={max(s.get(k, 0) for s in stats):.3f}"
                   for k in stages),
          ",".join(sorted({s.get("manifest_source", "") or "hub"
                           for s in stats}))))
EOF
)"
  echo "$line" | tee -a "$out"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
  cleanup
  if ((!skip_mpi)); then
    bench/testbed.sh up --prefix "$prefix" --net "$net" --hosts $((n + 1)) --dcs 1 \
      --host-mbit "$host_mbit" --force >/dev/null
    bench/mpi_bcast.sh --prefix "$prefix" --bytes "$bytes" --receivers "$n" \
      --algorithms "3 9" 2>&1 | grep -a '^mpi_bcast' | tee -a "$out"
    bench/testbed.sh down --prefix "$prefix" >/dev/null
  fi
done
echo "results: $out" >&2
