#!/usr/bin/env bash
# `tensorhub top` on a live fan-out, with the product CLI on a small test bed
# (network namespaces, 200 Mbit/s shaped links, one DC): h0 runs
# `tensorhub serve` and `tensorhub publish` of a 16 MiB file; readers on h1
# and h2 fetch it and hold it; a reader on h3 fetches it and pauses after 4
# chunks (the hidden test flag --pause-after-chunks: it pulls nothing more
# until told to go on), so its transfer is in flight at a known point, not
# by timing. Then `tensorhub top` runs in tmux (a private server, -L), and
# capture-pane must show, within a deadline:
#  - the version, COMMITTED, with the trainer and both readers as holders;
#  - the paused reader's fetch in flight: bytes done / total, a rate, and its
#    sources with the bytes read from each;
#  - the slowest holders, measured by the readers that finished;
# then `q` quits with status 0 (and Ctrl-C in a second one). The plain
# output (stdout not a terminal): `top --once | cat` shows the same, and
# `top` into a file prints one snapshot per interval until SIGTERM.
# Needs root and tmux. About 15 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${TENSORHUB_BIN:-$PWD/build/tools/tensorhub}
prefix=thtop
net=10.86
port=7374
fail() { echo "FAIL: top_smoke: $*" >&2; exit 1; }
# shellcheck source=tests/testbed/lib.sh
source tests/testbed/lib.sh
[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces, tc)"
[[ -x "$BIN" ]] || fail "no CLI binary at $BIN (build the tensorhub target)"
command -v tmux >/dev/null || fail "needs tmux (scripts/install-deps.sh)"

work="$(mktemp -d /tmp/top-smoke.XXXXXX)"
sock="thtop$$"  # this test's own tmux server
pids=()
cleanup() {
  local p
  tmux -L "$sock" kill-server 2>/dev/null || true
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bench/testbed.sh up --prefix "$prefix" --net "$net" --hosts 4 --dcs 1 \
  --host-mbit 200 --force >/dev/null
# shellcheck disable=SC1090
source "/run/tensorhub-testbed-${prefix}.env"
read -r -a ips <<<"$TB_HOST_IPS"
hub="${ips[0]}:$port"
ns() { echo "${prefix}-h$1"; }

bytes=$((16 << 20))
python3 - "$work/model.safetensors" "$bytes" <<'EOF'
import json, os, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
EOF

export TENSORHUB_LOG=warn
ip netns exec "$(ns 0)" "$BIN" serve --listen "$hub" --rebuild-ms 0 2>"$work/hub.err" &
pids+=($!)
wait_for "the hub" 20 bash -c "ip netns exec $(ns 0) ss -ltn 'sport = :$port' | grep -q LISTEN"
ip netns exec "$(ns 0)" "$BIN" publish "$work/model.safetensors" --model m --version 1 \
  --hub "$hub" --chunk-bytes 1MiB --data-listen "${ips[0]}:0" --name trainer \
  >"$work/pub.out" 2>"$work/pub.err" &
pub_pid=$!
pids+=("$pub_pid")
wait_for "the publisher" 30 grep -qs "serving from" "$work/pub.out"

# Two readers that finish and hold (the slowest-holders table gets their
# measurements), one after the other.
for i in 1 2; do
  ip netns exec "$(ns "$i")" "$BIN" fetch m@1 -o "$work/r$i.safetensors" --hold \
    --hub "$hub" --data-listen "${ips[i]}:0" --name "r$i" \
    >"$work/r$i.out" 2>"$work/r$i.err" &
  pid=$!
  pids+=("$pid")
  wait_for "reader r$i" 60 grep -qs '^holding m@1' "$work/r$i.out"
  alive "$pid" || fail "reader r$i exited: $(cat "$work/r$i.err")"
done

# The reader under watch: paused after 4 chunks until it reads a line.
mkfifo "$work/r3.in"
ip netns exec "$(ns 3)" "$BIN" fetch m@1 -o "$work/r3.safetensors" --hold \
  --hub "$hub" --data-listen "${ips[3]}:0" --name r3 --pause-after-chunks 4 \
  <"$work/r3.in" >"$work/r3.out" 2>"$work/r3.err" &
r3_pid=$!
pids+=("$r3_pid")
exec 7>"$work/r3.in"
wait_for "reader r3 to pause" 60 grep -qs "^paused after" "$work/r3.err"

# ---- the live view in tmux ----
run_top() {  # session name; top's exit status goes to $work/$1.rc
  tmux -L "$sock" new-session -d -s "$1" -x 220 -y 50 \
    "ip netns exec $(ns 0) '$BIN' top --hub '$hub' --interval 0.5; echo \$? > '$work/$1.rc'"
}
run_top live
screen() { tmux -L "$sock" capture-pane -p -t live > "$work/screen.txt" 2>/dev/null; }
# What a full view shows (file $1): every check at once, so that one
# refresh has it all.
shows_all() {
  local f=$1
  grep -qE '^m@1 +COMMITTED +16\.0 MiB' "$f" &&
    grep -qE '^m@1 .*3 complete, 1 filling: .*trainer\(' "$f" &&
    grep -qE '^m@1 .*r1\(.*r2\(.*r3\(w[0-9-]+\)\*' "$f" &&
    grep -qE '^FETCHES IN FLIGHT \(1\)' "$f" &&
    # reader, version, done / total with its share, a rate, its sources
    # with the bytes and rate read from each
    grep -qE '^r3\(w[0-9-]+\) +m@1 +[0-9.]+ MiB / 16\.0 MiB +[0-9]+% +[0-9.]+ [KMG]?i?B/s  .*(trainer|r1|r2)\(w[0-9-]+\) [0-9.]+ [KMG]?i?B [0-9.]+ [KMG]?i?B/s' "$f" &&
    grep -qE '^SLOWEST HOLDERS' "$f" &&
    grep -qE '^(trainer|r1|r2)\(w[0-9-]+\) +[0-9.]+ [KMG]?i?B/s +[0-9]+$' "$f"
}
live_shows_all() { screen && shows_all "$work/screen.txt"; }
if ! (wait_for "top's view" 30 live_shows_all); then
  echo "--- the last screen:" >&2; cat "$work/screen.txt" >&2
  fail "top did not show the fan-out within 30 s"
fi
echo "top_smoke: the live view showed:"
awk '{ l[NR] = $0 } NF { last = NR } END { for (i = 1; i <= last; i++) print "  | " l[i] }' "$work/screen.txt"
tmux -L "$sock" send-keys -t live q
wait_for "top to quit on q" 10 test -s "$work/live.rc"
[[ "$(cat "$work/live.rc")" == 0 ]] || fail "top exited $(cat "$work/live.rc") on q"

run_top ctrlc
wait_for "the second top's view" 30 bash -c \
  "tmux -L '$sock' capture-pane -p -t ctrlc | grep -q '^FETCHES IN FLIGHT'"
tmux -L "$sock" send-keys -t ctrlc C-c
wait_for "top to quit on Ctrl-C" 10 test -s "$work/ctrlc.rc"
[[ "$(cat "$work/ctrlc.rc")" == 0 ]] || fail "top exited $(cat "$work/ctrlc.rc") on Ctrl-C"

# ---- plain lines when stdout is not a terminal ----
ip netns exec "$(ns 0)" "$BIN" top --once --hub "$hub" | cat > "$work/once.txt"
shows_all "$work/once.txt" || { cat "$work/once.txt" >&2; fail "top --once | cat lacks the view"; }
grep -q $'\x1b' "$work/once.txt" && fail "top --once wrote terminal control sequences"
ip netns exec "$(ns 0)" "$BIN" top --hub "$hub" --interval 0.1 > "$work/plain.txt" &
plain_pid=$!
pids+=("$plain_pid")
wait_for "two plain snapshots" 20 bash -c "[[ \$(grep -c '^tensorhub top ' '$work/plain.txt') -ge 2 ]]"
kill -TERM "$plain_pid"
rc=0
wait "$plain_pid" || rc=$?
[[ "$rc" == 0 ]] || fail "plain top exited $rc on SIGTERM"

# ---- the paused reader goes on and finishes; its fetch leaves the view ----
echo go >&7
exec 7>&-
wait_for "reader r3 to finish" 60 grep -qs '^holding m@1' "$work/r3.out"
for i in 1 2 3; do
  cmp -s "$work/r$i.safetensors" "$work/model.safetensors" || fail "reader r$i's file differs"
done
no_fetch() {
  ip netns exec "$(ns 0)" "$BIN" top --once --hub "$hub" > "$work/after.txt" &&
    grep -q '^FETCHES IN FLIGHT (0)' "$work/after.txt"
}
wait_for "the finished fetch to leave the view" 10 no_fetch
grep -qE '^m@1 .*4 complete, 0 filling' "$work/after.txt" ||
  { cat "$work/after.txt" >&2; fail "after the fetches: not 4 complete holders"; }

bench/testbed.sh down --prefix "$prefix" >/dev/null
echo "top_smoke: OK (live view in tmux showed the version, 4 holders, r3's fetch in flight with its rate and sources, the slowest holders; q and Ctrl-C quit with 0; plain output without a terminal)"
