#!/usr/bin/env bash
# CI check of deltas on slow links (docs/design.md, "Deltas on slow links")
# on a small test bed: 5 hosts, dc0 = h0 (trainer), h1, h2; dc1 = h3, h4,
# behind a 100 Mbit/s wide-area link. `tensorhub-lab bench delta-wan` runs
# the same two versions (Adam steps cast to bf16) once with deltas off and
# once on; every reader checks its copy of version 2 against the trainer's
# digest (the driver fails otherwise). Checks, from its result lines:
#  - with deltas, the remote datacenter got version 2 through the delta:
#    bytes rebuilt from it, and exactly one remote reader read it (the delta
#    crossed the WAN once; its peer read whole chunks locally);
#  - the delta's wide-area bytes are a small fraction of S (<= 0.2 S,
#    framing and the hub's calls included, at a small S) and below a fifth
#    of what the full mode sent;
#  - without deltas, one full copy crossed (> 0.9 S) and nothing came from
#    a delta.
# Needs root. About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${TENSORHUB_LAB_BIN:-build/bench/lab/tensorhub-lab}
prefix=thdsm
fail() { echo "FAIL: $*" >&2; exit 1; }
trap 'bench/testbed.sh down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
bench/testbed.sh up --prefix "$prefix" --net 10.87 --hosts 5 --dcs 2 --host-mbit 400 --wan-mbit 100 --force >/dev/null
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$2"; }
o="$("$BIN" bench delta-wan --testbed "$prefix" --elements 4194304 --chunk-bytes 1MiB --lr 1e-6 --port 7571)" ||
  { echo "$o" >&2; fail "bench delta-wan exited non-zero"; }
echo "$o" >&2
full="$(grep -a '^delta_wan_result mode=full ' <<< "$o")" || fail "no result for mode full"
delta="$(grep -a '^delta_wan_result mode=delta ' <<< "$o")" || fail "no result for mode delta"
[[ "$(field ok "$full")" == 1 && "$(field ok "$delta")" == 1 ]] || fail "a mode did not finish"
[[ "$(field from_delta_bytes "$full")" == 0 ]] || fail "deltas off, yet bytes came from a delta"
awk -v v="$(field wan_per_S "$full")" 'BEGIN { exit !(v > 0.9) }' || fail "full mode: WAN carried $(field wan_per_S "$full") S"
awk -v v="$(field from_delta_bytes "$delta")" 'BEGIN { exit !(v > 0) }' || fail "delta mode: no bytes came from a delta"
# Once per remote datacenter: its first reader pulls the delta across the
# WAN and makes it there; its peers (slow links there too) read it from
# that reader. So the WAN carries about one delta, however many read it.
dr=$(field delta_readers "$delta")
(( dr >= 1 )) || fail "delta mode: no remote reader read a delta"
awk -v w="$(field wan_bytes "$delta")" -v d="$(field delta_wire_bytes "$delta")" -v n="$dr" \
  'BEGIN { exit !(w < 1.5 * d / n) }' ||
  fail "delta mode: WAN bytes $(field wan_bytes "$delta") are more than one delta ($(field delta_wire_bytes "$delta") / $dr readers): it crossed more than once"
awk -v v="$(field wan_per_S "$delta")" 'BEGIN { exit !(v <= 0.2) }' || fail "delta mode: WAN carried $(field wan_per_S "$delta") S"
awk -v d="$(field wan_bytes "$delta")" -v f="$(field wan_bytes "$full")" 'BEGIN { exit !(5 * d < f) }' ||
  fail "delta mode: WAN bytes $(field wan_bytes "$delta") not below a fifth of full mode's $(field wan_bytes "$full")"
bench/testbed.sh down --prefix "$prefix" >/dev/null
echo "delta_smoke: OK (remote readers: full $(field remote_s "$full") s, delta $(field remote_s "$delta") s; WAN full $(field wan_per_S "$full") S, delta $(field wan_per_S "$delta") S; $(field changed "$delta") of elements changed)"
