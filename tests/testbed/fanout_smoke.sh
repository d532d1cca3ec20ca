#!/usr/bin/env bash
# CI check of pipelined fan-out on a small multi-host test bed (network
# namespaces, shaped links, two datacenters): 5 hosts, dc0 = h0 (trainer),
# h1, h2; dc1 = h3, h4. Checks, from `tensorhub-lab bench fanout`'s result line:
#  - every reader got the published bytes (digests match);
#  - partial-prefix serving happened: readers pulled bytes from peers that
#    were still receiving the version;
#  - the trainer sent less than one copy per reader (the pipeline, not N
#    copies);
#  - one copy per remote datacenter: bytes out of dc0 onto the WAN link are
#    at most 1.10 x S (payload plus Ethernet/IP/TCP framing), where the
#    point-to-point baseline sends one copy per remote reader (2 x S).
# Needs root. About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
prefix=thfsm
fail() { echo "FAIL: $*" >&2; exit 1; }
trap 'bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
bench/testbed.sh up --prefix "$prefix" --net 10.79 --hosts 5 --dcs 2 --host-mbit 200 --wan-mbit 100 --force >/dev/null
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$2"; }
# Shows a command's output on stderr and prints its result line. (Not
# `tee /dev/stderr`: reopening stderr's file would truncate a log.)
result() { local o; o="$("$@")"; echo "$o" >&2; grep -a '^fanout ' <<< "$o" | tail -1; }
bytes=$((16 << 20))

th="$(result "$BIN" bench fanout --testbed "$prefix" --readers 4 --bytes "$bytes" --chunk-bytes 1MiB --mode tensorhub --repeat 1 --port 7171)"
[[ "$(field ok "$th")" == 1 ]] || fail "tensorhub fan-out: bytes did not match"
awk -v v="$(field from_filling_per_S "$th")" 'BEGIN { exit !(v > 0) }' || fail "no bytes came from filling peers (partial-prefix serving)"
awk -v v="$(field trainer_copies "$th")" 'BEGIN { exit !(v < 4) }' || fail "trainer sent $(field trainer_copies "$th") copies to 4 readers"
awk -v v="$(field wan_per_S "$th")" 'BEGIN { exit !(v > 0.9 && v <= 1.10) }' || fail "WAN carried $(field wan_per_S "$th") x S, want one copy (<= 1.10 S)"

p2p="$(result "$BIN" bench fanout --testbed "$prefix" --readers 4 --bytes "$bytes" --chunk-bytes 1MiB --mode p2p --repeat 1 --port 7172)"
[[ "$(field ok "$p2p")" == 1 ]] || fail "point-to-point fan-out: bytes did not match"
awk -v v="$(field wan_per_S "$p2p")" 'BEGIN { exit !(v > 1.8) }' || fail "baseline WAN bytes $(field wan_per_S "$p2p") x S: the measurement is off"

bench/testbed.sh down --prefix "$prefix" >/dev/null
echo "fanout_smoke: OK (tensorhub: $(field seconds "$th") s, WAN $(field wan_per_S "$th") S; point-to-point: $(field seconds "$p2p") s, WAN $(field wan_per_S "$p2p") S)"
