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
