#!/usr/bin/env bash
# CI check that `tensorhub fetch` is a full reader, with the product CLI on a
# small test bed (network namespaces, 200 Mbit/s shaped links, one DC):
# h0 runs `tensorhub serve` and `tensorhub publish` of a 16 MiB file; h1..h4
# each start `tensorhub fetch --hold --stats-json` of that version at once.
# From the fetches' own per-holder byte counts (--stats-json) it checks:
#  - every reader's file is the published file, byte for byte;
#  - every byte is accounted for: each reader's sources add up to the file,
#    so the publisher's bytes plus the readers' are exactly N copies;
#  - the publisher sent at most 2 copies in all (the pipeline's one: it
#    uploads to one reader at a time; the slack is for stripes the hub may
#    add once it is idle), not one per reader: the readers sent each other
#    the other N - 2 copies or more.
# The readers hold (--hold) until they are signalled, so every copy stays a
# source whatever the order they finish in: the checks need no timing.
# Then the cross-host mistake, on the same hosts: a publisher on h0 whose
# data plane is on loopback (the default) while the hub is not warns at start,
# and a reader on h1 handed that holder fails with an error that says the
# holder advertises a loopback address, not a list of failed connects.
# Needs root. About 30 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${TENSORHUB_BIN:-$PWD/build/tools/tensorhub}
prefix=thcli
net=10.81
N=4
port=7373
fail() { echo "FAIL: cli_pipeline_smoke: $*" >&2; exit 1; }
# shellcheck source=tests/testbed/lib.sh
source tests/testbed/lib.sh
[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces, tc)"
[[ -x "$BIN" ]] || fail "no CLI binary at $BIN (build the tensorhub target)"

work="$(mktemp -d /tmp/cli-pipeline.XXXXXX)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bench/testbed.sh up --prefix "$prefix" --net "$net" --hosts $((N + 1)) --dcs 1 \
  --host-mbit 200 --force >/dev/null
# shellcheck disable=SC1090
source "/run/tensorhub-testbed-${prefix}.env"
read -r -a ips <<<"$TB_HOST_IPS"
hub="${ips[0]}:$port"
# Host i's namespace. Background jobs run `ip netns exec` directly (it
# execs the command), so $! is the command's pid, the one to signal.
ns() { echo "${prefix}-h$1"; }
# Sends SIGTERM to our child $1 and sets rc to its exit status. (Not
# SIGINT: a non-interactive shell starts background jobs with SIGINT
# ignored.)
stop() {
  kill -TERM "$1"
  rc=0
  wait "$1" || rc=$?
}

# A 16 MiB safetensors file: one U8 tensor of random bytes.
bytes=$((16 << 20))
python3 - "$work/model.safetensors" "$bytes" <<'EOF'
import json, os, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
EOF

export TENSORHUB_LOG=info
ip netns exec "$(ns 0)" "$BIN" serve --listen "$hub" --rebuild-ms 0 2>"$work/hub.err" &
hub_pid=$!
pids+=("$hub_pid")
wait_for "the hub" 20 bash -c "ip netns exec $(ns 0) ss -ltn 'sport = :$port' | grep -q LISTEN"

# ---- N readers of one version, started together ----
# No --data-listen: each worker listens on the address of its interface that
# routes to the hub (the default when the hub is not on loopback); the
# publisher's label comes from its environment variable.
ip netns exec "$(ns 0)" env TENSORHUB_HOST_LABEL=h0 "$BIN" publish "$work/model.safetensors" \
  --model m --version 1 --hub "$hub" --chunk-bytes 1MiB \
  >"$work/pub.out" 2>"$work/pub.err" &
pub_pid=$!
pids+=("$pub_pid")
wait_for "the publisher" 30 grep -qs "serving from" "$work/pub.out"
alive "$pub_pid" || fail "publisher exited: $(cat "$work/pub.err")"
publisher="$(sed -n 's/^serving from \([^;]*\);.*/\1/p' "$work/pub.out")"
[[ "$publisher" == "${ips[0]}:"* ]] || fail "publisher serves from '$publisher'"

readers=()
for ((i = 1; i <= N; i++)); do
  ip netns exec "$(ns "$i")" "$BIN" fetch m@1 -o "$work/r$i.safetensors" --hold \
    --stats-json "$work/r$i.json" --hub "$hub" \
    --host-label "h$i" >"$work/r$i.out" 2>"$work/r$i.err" &
  readers+=($!)
  pids+=($!)
done
done_all() {
  local i
  for ((i = 1; i <= N; i++)); do
    alive "${readers[i - 1]}" || fail "reader $i exited: $(cat "$work/r$i.err")"
    [[ -s "$work/r$i.json" ]] || return 1
  done
}
wait_for "$N fetches" 120 done_all
for ((i = 1; i <= N; i++)); do
  cmp -s "$work/r$i.safetensors" "$work/model.safetensors" ||
    fail "reader $i's file differs from the published one"
  grep -q "^holding m@1" "$work/r$i.out" || fail "reader $i does not hold: $(cat "$work/r$i.out")"
done
summary="$(python3 - "$publisher" "$bytes" "$N" "$work"/r*.json <<'EOF'
import json, sys
publisher, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from_pub = from_peers = 0
for path in sys.argv[4:]:
    st = json.load(open(path))
    assert st["bytes"] == size, (path, st)
    assert sum(s["bytes"] for s in st["sources"]) == size, (path, st)
    for s in st["sources"]:
        if s["address"] == publisher:
            from_pub += s["bytes"]
        else:
            from_peers += s["bytes"]
print(f"from_publisher={from_pub} from_readers={from_peers} "
      f"publisher_copies={from_pub / size:.2f} readers={n}")
EOF
)" || fail "reading the --stats-json files"
echo "cli_pipeline_smoke: $summary"
from_pub="$(sed -n 's/.*from_publisher=\([0-9]*\).*/\1/p' <<<"$summary")"
from_peers="$(sed -n 's/.*from_readers=\([0-9]*\).*/\1/p' <<<"$summary")"
((from_pub + from_peers == N * bytes)) || fail "the readers' sources add up to $((from_pub + from_peers)) bytes, not $N copies"
((from_pub <= 2 * bytes)) || fail "the publisher sent $from_pub bytes, more than 2 copies of $bytes to $N readers"

for ((i = 1; i <= N; i++)); do
  stop "${readers[i - 1]}"
  [[ "$rc" == 0 ]] || fail "reader $i exited $rc on SIGTERM: $(cat "$work/r$i.err")"
  grep -q "^released m@1; reads drained" "$work/r$i.out" || fail "reader $i did not release m@1"
done
stop "$pub_pid"
[[ "$rc" == 0 ]] || fail "publisher exited $rc: $(cat "$work/pub.err")"

# ---- The cross-host mistake: a publisher told to listen on loopback, a reader elsewhere ----
ip netns exec "$(ns 0)" "$BIN" publish "$work/model.safetensors" --model m --version 2 --hub "$hub" \
  --data-listen 127.0.0.1:0 \
  >"$work/lo.out" 2>"$work/lo.err" &
lo_pid=$!
pids+=("$lo_pid")
wait_for "the loopback publisher" 30 grep -qs "serving from 127.0.0.1:" "$work/lo.out"
grep -q "readers on other hosts cannot reach it" "$work/lo.err" ||
  fail "no warning for a data plane on loopback: $(cat "$work/lo.err")"
grep -q -- "--data-listen 0.0.0.0:PORT --advertise-host HOST" "$work/lo.err" ||
  fail "the warning does not say how to fix it: $(cat "$work/lo.err")"
echo "cli_pipeline_smoke: the publisher said: $(grep -m1 "cannot reach it" "$work/lo.err")"
rc=0
ip netns exec "$(ns 1)" "$BIN" fetch m@2 -o "$work/lo.safetensors" --hub "$hub" --timeout-ms 60000 \
  --data-listen "${ips[1]}:0" >/dev/null 2>"$work/lo-reader.err" || rc=$?
[[ "$rc" == 1 ]] || fail "a fetch from an unreachable loopback holder exited $rc"
grep -q "advertises 127.0.0.1:[0-9]*, which is loopback: it cannot be reached from this host" \
  "$work/lo-reader.err" || fail "the reader's error does not name the loopback holder: $(tail -3 "$work/lo-reader.err")"
grep -q "^tensorhub: UNAVAILABLE: holder " "$work/lo-reader.err" ||
  fail "the error does not lead with the holder: $(tail -1 "$work/lo-reader.err")"
echo "cli_pipeline_smoke: the reader said: $(tail -1 "$work/lo-reader.err")"
stop "$lo_pid"
[[ "$rc" == 0 ]] || fail "loopback publisher exited $rc"
stop "$hub_pid"
[[ "$rc" == 0 ]] || fail "hub exited $rc"

bench/testbed.sh down --prefix "$prefix" >/dev/null
echo "cli_pipeline_smoke: OK ($N CLI readers: the publisher sent $(awk -v p="$from_pub" -v s="$bytes" 'BEGIN { printf "%.2f", p / s }') copies, readers $(awk -v p="$from_peers" -v s="$bytes" 'BEGIN { printf "%.2f", p / s }') copies to each other; the loopback mistake is named on both sides)"
