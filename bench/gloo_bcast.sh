#!/usr/bin/env bash
# Runs bench/gloo_bcast.py across a test bed made by bench/testbed.sh: rank 0
# on h0, one rank per reader host. Needs root and Debian's python3-torch.
#   gloo_bcast.sh [--prefix th] [--bytes S] [--receivers N] [--timeout-s 600]
# Prints: gloo_bcast bytes=.. ranks=.. seconds=.. verified=1 bound_seconds=.. ratio=..
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix=th; bytes=268435456; receivers=""; timeout_s=600
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --receivers) receivers="$2"; shift 2 ;;
    --timeout-s) timeout_s="$2"; shift 2 ;;
    *) echo "gloo_bcast.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
env_file="/run/tensorhub-testbed-${prefix}.env"
[[ -f "$env_file" ]] || { echo "gloo_bcast.sh: no test bed '$prefix'" >&2; exit 1; }
# shellcheck disable=SC1090
source "$env_file"
read -r -a names <<< "$TB_HOST_NAMES"
read -r -a ips <<< "$TB_HOST_IPS"
receivers=${receivers:-$(( ${#names[@]} - 1 ))}
world=$((receivers + 1))
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || {
  echo "gloo_bcast.sh: needs Debian's python3-torch" >&2; exit 1; }
port=$((29500 + RANDOM % 1000))
pids=()
out="$(mktemp)"
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -f "$out"' EXIT
for ((r = 0; r < world; r++)); do
  ip netns exec "${names[r]}" env MASTER_ADDR="${ips[0]}" MASTER_PORT="$port" \
    timeout "$timeout_s" /usr/bin/python3 "$here/gloo_bcast.py" "$r" "$world" "$bytes" \
    >> "$out" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
line="$(grep '^gloo_bcast ' "$out" || true)"
if [[ $rc -ne 0 || -z "$line" ]]; then
  echo "gloo_bcast.sh: failed; output:" >&2; cat "$out" >&2; exit 1
fi
secs="$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<< "$line")"
bound="$(awk -v b="$bytes" -v m="$TB_HOST_MBIT" 'BEGIN { printf "%.4f", b * 8 / (m * 1e6) }')"
echo "$line bound_seconds=$bound ratio=$(awk -v s="$secs" -v b="$bound" 'BEGIN { printf "%.2f", s / b }')"
