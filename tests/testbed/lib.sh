# Shared by the test-bed scripts that run `tensorhub` processes in network
# namespaces (source it after defining fail()).

# The hosts listen on the test bed's addresses, which the hub and workers
# refuse without a secret or TLS: every process of a script shares a random
# one (the caller's own $TENSORHUB_SECRET, if set).
export TENSORHUB_SECRET="${TENSORHUB_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"

# Waits (at most $2 seconds) until command $3... succeeds; fails the script
# with "timed out ... waiting for $1" otherwise.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local i
  for ((i = 0; i < secs * 20; i++)); do
    if "$@"; then return 0; fi
    sleep 0.05
  done
  fail "timed out after ${secs} s waiting for $what"
}
alive() { kill -0 "$1" 2>/dev/null; }

# Brings up test bed $prefix (4 hosts in one DC, 400 Mbit/s links, subnet
# $1.0.0/16) and a hub on h3 at port 7300 (`$BIN serve`, lease 2 s): sets
# ips[] and hub, and adds the hub's pid to pids[]. The caller's EXIT trap
# takes the test bed down and kills pids[].
testbed_with_hub() {
  bench/testbed.sh up --prefix "$prefix" --net "$1" --hosts 4 --host-mbit 400 --force >/dev/null
  source "/run/tensorhub-testbed-${prefix}.env"
  read -r -a ips <<< "$TB_HOST_IPS"
  hub="${ips[3]}:7300"
  ip netns exec "$prefix-h3" env TENSORHUB_LOG=warn "$BIN" serve --listen "$hub" --lease-ms 2000 &
  pids+=($!)
  disown
}
