#!/usr/bin/env bash
# CI self-check of bench/testbed.sh and bench/mpi_bcast.sh (about 30 s).
# Brings up 3 hosts in 2 DCs (200 Mbit/s host links, 100 Mbit/s WAN) under
# its own prefix and subnet, so it never collides with a real test bed;
# checks reachability, that shaping holds each path within [0.6, 1.1] x its
# rate (including a fan-in that only passes if downloads are shaped too),
# that an 8 MB MPI_Bcast completes and verifies, that a half-made "up" and
# a second "up" are handled, and that "down" leaves nothing behind.
# Needs root. Exits non-zero with a "FAIL:" line on the first failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tb="$root/bench/testbed.sh"
prefix="${SMOKE_PREFIX:-thsmk}"
net="10.78"
host_mbit=200 wan_mbit=100

fail() { echo "FAIL: testbed_smoke: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces, tc)"
missing=()
command -v iperf3 >/dev/null || missing+=(iperf3)
command -v ping >/dev/null || missing+=(iputils-ping)
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
if ((${#missing[@]})); then
  echo "testbed_smoke: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    fail "could not install ${missing[*]}"
fi

leftovers() {
  { ip netns list | awk '{print $1}' | grep -E "^${prefix}-" || true; } | tr '\n' ' '
}
cleanup() { "$tb" down --prefix "$prefix" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup

# 1. A failure half-way through "up" removes what was made.
if TESTBED_FAIL_AT_HOST=1 "$tb" up --hosts 3 --dcs 2 --prefix "$prefix" --net "$net" 2>/dev/null; then
  fail "up with TESTBED_FAIL_AT_HOST=1 succeeded"
fi
[[ -z "$(leftovers)" ]] || fail "half-made up left namespaces: $(leftovers)"
pass "a failed up cleans up after itself"

# 2. up, and a second up refuses.
"$tb" up --hosts 3 --dcs 2 --host-mbit "$host_mbit" --wan-mbit "$wan_mbit" \
  --prefix "$prefix" --net "$net" || fail "up"
if "$tb" up --hosts 3 --prefix "$prefix" --net "$net" 2>/dev/null; then
  fail "a second up without --force succeeded"
fi
pass "up (and a second up refuses)"

# 3. Reachability inside and across DCs (h0, h1 in dc0; h2 in dc1).
for pair in "h0 $net.0.11" "h0 $net.1.12" "h2 $net.0.11"; do
  read -r from to <<<"$pair"
  "$tb" exec --prefix "$prefix" "$from" ping -c 2 -i 0.2 -W 2 -q "$to" >/dev/null ||
    fail "ping $from -> $to"
done
pass "pings within and across DCs"

# 4. Shaping: each path within [0.6, 1.1] x its configured rate.
out="$("$tb" check --prefix "$prefix" --seconds 2)" || fail "check failed: $out"
echo "$out"
n=$(grep -c '^check ' <<<"$out" || true)
((n == 3)) || fail "expected 3 measured paths, got $n"
while read -r line; do
  ratio="${line##*ratio=}"
  awk -v r="$ratio" 'BEGIN { exit !(r >= 0.6 && r <= 1.1) }' ||
    fail "shaped rate out of [0.6, 1.1]: $line"
done < <(grep '^check ' <<<"$out")
pass "shaped throughput within [0.6, 1.1] x rate"

# 5. MPI_Bcast of 8 MB from h0 to both other hosts completes and verifies.
mpi_out="$("$root/bench/mpi_bcast.sh" --prefix "$prefix" --bytes 8388608 \
  --algorithms "default 9" --timeout-s 30)" || fail "mpi_bcast: $mpi_out"
echo "$mpi_out"
grep -q '^mpi_bcast .*ranks=3 .*verified=1' <<<"$mpi_out" || fail "no verified 3-rank broadcast"
pass "MPI_Bcast of 8 MB across 3 hosts"

# 6. down leaves nothing with the prefix.
"$tb" down --prefix "$prefix" || fail "down"
[[ -z "$(leftovers)" ]] || fail "namespaces left after down: $(leftovers)"
if ip -o link | grep -q -- "$prefix"; then fail "links named $prefix left in the root namespace"; fi
if compgen -G "/run/tensorhub-testbed-${prefix}.*" >/dev/null; then fail "state files left"; fi
"$tb" down --prefix "$prefix" || fail "a second down is not idempotent"
pass "down removes everything and is idempotent"
echo "testbed_smoke: PASS"
