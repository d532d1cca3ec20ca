#!/usr/bin/env bash
# Metrics scraping under load (issue 14's target: "no change in fan-out time
# beyond noise"). On a test bed (bench/testbed.sh), a real Prometheus server
# scrapes the hub and every worker of `tensorhub-lab bench fanout` while they
# fan a version out, far more often than a deployment would (every
# --scrape-ms, default 100 ms, against Prometheus' usual 15 s). Rounds
# alternate: Prometheus stopped (SIGSTOP) and scraping (SIGCONT), so that a
# drift of the machine's speed falls on both. Prints each round, the median
# fan-out time of each kind with its spread, their ratio, and the number of
# scrapes Prometheus made of TensorHub's endpoints (read back from its own
# API, so a run whose scrapes failed says so). Results go to
# bench/results/scrape-load.txt. Needs root. About two minutes.
#
#   bench/scrape_load.sh [--readers 4] [--bytes 64MiB] [--host-mbit 200]
#                        [--pairs 4] [--scrape-ms 100]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
readers=4; bytes=64MiB; host_mbit=200; pairs=4; scrape_ms=100
while [[ $# -gt 0 ]]; do
  case "$1" in
    --readers) readers="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --host-mbit) host_mbit="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --scrape-ms) scrape_ms="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scrape_load.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "scrape_load.sh: needs root (network namespaces)" >&2; exit 1; }
[[ -x "$BIN" ]] || { echo "scrape_load.sh: build first (bash scripts/build.sh)" >&2; exit 1; }
command -v prometheus >/dev/null || { echo "scrape_load.sh: no prometheus (apt-get install prometheus)" >&2; exit 1; }
prefix=thsc
mport=9464
work=$(mktemp -d)
prom_pid=""
cleanup() {
  [[ -n "$prom_pid" ]] && { kill -CONT "$prom_pid" 2>/dev/null; kill "$prom_pid" 2>/dev/null; wait "$prom_pid" 2>/dev/null; } || true
  bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bench/testbed.sh up --prefix "$prefix" --hosts $((readers + 1)) --dcs 1 --host-mbit "$host_mbit" --force >/dev/null
source "/run/tensorhub-testbed-${prefix}.env"
read -r -a ips <<< "$TB_HOST_IPS"

# Prometheus on h0 scrapes every worker's endpoint and the hub's (mport+1).
{
  echo "global: {scrape_interval: ${scrape_ms}ms, scrape_timeout: ${scrape_ms}ms}"
  echo "scrape_configs:"
  echo "  - job_name: tensorhub"
  echo "    static_configs:"
  echo "      - targets:"
  for ip in "${ips[@]:0:$((readers + 1))}"; do echo "          - '$ip:$mport'"; done
  echo "          - '${ips[0]}:$((mport + 1))'"
} > "$work/prometheus.yml"
promtool check config "$work/prometheus.yml" >/dev/null
prom_web="${ips[0]}:9090"
ip netns exec "$prefix-h0" prometheus --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/tsdb" --web.listen-address="$prom_web" --log.level=warn \
  2> "$work/prometheus.log" &
prom_pid=$!
prom() { ip netns exec "$prefix-h0" curl -fsS --max-time 10 "$@"; }
for _ in $(seq 100); do prom "http://$prom_web/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done
prom "http://$prom_web/-/ready" >/dev/null || { cat "$work/prometheus.log" >&2; echo "scrape_load.sh: prometheus did not start" >&2; exit 1; }

seconds() { sed -n 's/.* seconds=\([^ ]*\).*/\1/p' <<< "$1"; }
declare -a off on
out=bench/results/scrape-load.txt
mkdir -p bench/results
: > "$out"
for p in $(seq "$pairs"); do
  for kind in off on; do
    if [[ $kind == off ]]; then kill -STOP "$prom_pid"; else kill -CONT "$prom_pid"; fi
    line="$("$BIN" bench fanout --testbed "$prefix" --readers "$readers" --bytes "$bytes" \
      --mode tensorhub --repeat 1 --metrics-port "$mport" | grep -a '^fanout ')"
    s=$(seconds "$line")
    echo "pair $p scrape=$kind: $line" | tee -a "$out"
    grep -q ' ok=1' <<< "$line" || { echo "scrape_load.sh: a fan-out failed" >&2; exit 1; }
    if [[ $kind == off ]]; then off+=("$s"); else on+=("$s"); fi
  done
done
kill -CONT "$prom_pid"
# Scrapes of TensorHub's endpoints that succeeded (up == 1), over the run.
scrapes=$(prom -G "http://$prom_web/api/v1/query" --data-urlencode 'query=sum(sum_over_time(up{job="tensorhub"}[1h]))' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)')
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.3f-%.3f", lo, hi}'; }
m_off=$(median "${off[@]}"); m_on=$(median "${on[@]}")
summary=$(awk -v a="$m_on" -v b="$m_off" -v ro="$(range "${off[@]}")" -v rn="$(range "${on[@]}")" -v n="$scrapes" -v ms="$scrape_ms" \
  'BEGIN { printf "scrape_load scrape_ms=%d scrapes=%d median_off_s=%.3f range_off_s=%s median_on_s=%.3f range_on_s=%s ratio_on_off=%.3f", ms, n, b, ro, a, rn, a / b }')
echo "$summary" | tee -a "$out"
[[ "$scrapes" -gt 0 ]] || { echo "scrape_load.sh: Prometheus recorded no successful scrape" >&2; exit 1; }
