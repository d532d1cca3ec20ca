#!/usr/bin/env bash
# Multi-host test bed on one machine: K emulated hosts (network namespaces)
# grouped into D datacenters, each host NIC and each datacenter's wide-area
# uplink shaped with tbf. Needs root. See bench/README.md for the plan.
#
#   testbed.sh up --hosts N [--dcs D] [--host-mbit B] [--wan-mbit W]
#                 [--prefix P] [--net A.B] [--force]
#   testbed.sh down  [--prefix P]
#   testbed.sh exec  [--prefix P] HOST CMD...     HOST: P-h3, h3, 3 or its IP
#   testbed.sh check [--prefix P] [--seconds T]
#   testbed.sh status [--prefix P]
#
# Everything it makes lives inside namespaces named "${prefix}-h<i>" and
# "${prefix}-sw" (the switch namespace that holds every bridge), plus two
# files under /run. Nothing is added to the root namespace, so teardown is
# "delete those namespaces and files" and can never touch anything else.
set -euo pipefail

readonly STATE_DIR="${TESTBED_STATE_DIR:-/run}"
readonly MAX_HOSTS=240          # host i gets .<i+10> in its DC's /24
readonly MAX_DCS=16

prefix="th"
die() { echo "testbed: $*" >&2; exit 1; }
log() { echo "testbed: $*" >&2; }

state_file() { echo "${STATE_DIR}/tensorhub-testbed-${prefix}.env"; }
hosts_file() { echo "${STATE_DIR}/tensorhub-testbed-${prefix}.hosts"; }
switch_ns() { echo "${prefix}-sw"; }

check_prefix() {
  # Short so "<prefix>-h239" stays a readable name; letters and digits only
  # so the prefix can be used unquoted in patterns.
  [[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
    die "bad --prefix '$prefix' (want [a-z][a-z0-9]{0,7})"
}

need_root() { [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, tc)"; }

# Namespaces that belong to this prefix: exactly "<prefix>-sw" or
# "<prefix>-h<digits>", so prefix "th" never matches "thx-h0" or "th-foo".
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' |
    grep -E "^${prefix}-(sw|h[0-9]+)\$" || true
}

# tbf on one device's egress. burst must hold at least one GSO super-packet
# (64 KiB; veths hand tbf packets up to that size, larger ones get split)
# and what the link sends in 2 ms, so timer slack does not cap the rate;
# latency bounds the queue (limit = rate * latency + burst).
shape() {
  local ns="$1" dev="$2" mbit="$3"
  local rate_bytes_per_s=$((mbit * 1000 * 1000 / 8))
  local burst_bytes=$((rate_bytes_per_s * 2 / 1000))
  ((burst_bytes < 65536)) && burst_bytes=65536
  ip -n "$ns" link set "$dev" txqueuelen 1000
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "${mbit}mbit" \
    burst "$burst_bytes" latency 20ms
}

teardown() {
  local ns pid
  for ns in $(our_namespaces); do
    # Processes left inside (iperf3 servers, MPI ranks) would keep the
    # namespace and its veths alive after "ip netns del": end them by pid.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  local waited=0
  while ((waited < 20)); do
    local left=0
    for ns in $(our_namespaces); do
      [[ -n "$(ip netns pids "$ns" 2>/dev/null)" ]] && left=1
    done
    ((left == 0)) && break
    sleep 0.1; waited=$((waited + 1))
  done
  for ns in $(our_namespaces); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  # Hosts first: deleting a host namespace deletes its veth and so the
  # peer in the switch namespace; the switch namespace takes the bridges.
  for ns in $(our_namespaces | sort -r); do
    ip netns del "$ns" 2>/dev/null || log "warning: could not delete namespace $ns"
  done
  rm -f "$(state_file)" "$(hosts_file)"
}

cmd_up() {
  local hosts="" dcs=1 host_mbit=1000 wan_mbit=200 net="10.77" force=0
  while (($#)); do
    case "$1" in
      --hosts) hosts="$2"; shift 2 ;;
      --dcs) dcs="$2"; shift 2 ;;
      --host-mbit) host_mbit="$2"; shift 2 ;;
      --wan-mbit) wan_mbit="$2"; shift 2 ;;
      --prefix) prefix="$2"; shift 2 ;;
      --net) net="$2"; shift 2 ;;
      --force) force=1; shift ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  check_prefix
  need_root
  [[ "$hosts" =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= MAX_HOSTS)) ||
    die "up: --hosts N with 1 <= N <= $MAX_HOSTS"
  [[ "$dcs" =~ ^[0-9]+$ ]] && ((dcs >= 1 && dcs <= MAX_DCS && dcs <= hosts)) ||
    die "up: --dcs D with 1 <= D <= min(hosts, $MAX_DCS)"
  [[ "$host_mbit" =~ ^[0-9]+$ ]] && ((host_mbit >= 1 && host_mbit <= 100000)) ||
    die "up: --host-mbit in 1..100000"
  [[ "$wan_mbit" =~ ^[0-9]+$ ]] && ((wan_mbit >= 1 && wan_mbit <= 100000)) ||
    die "up: --wan-mbit in 1..100000"
  [[ "$net" =~ ^10\.([0-9]{1,3})$ ]] && ((BASH_REMATCH[1] <= 255)) ||
    die "up: --net must be 10.X (a /16 inside 10/8)"
  command -v tc >/dev/null || die "tc (iproute2) not found"

  if [[ -e "$(state_file)" || -n "$(our_namespaces)" ]]; then
    if ((force)); then
      log "--force: tearing down the existing '$prefix' test bed"
      teardown
    else
      die "up: test bed '$prefix' already exists (run 'down --prefix $prefix' or pass --force)"
    fi
  fi

  # A failure half-way removes what was made; only our prefix is touched.
  trap 'rc=$?; if ((rc != 0)); then log "up failed (rc=$rc), cleaning up"; teardown; fi' EXIT

  local sw
  sw="$(switch_ns)"
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  local d i
  for ((d = 0; d < dcs; d++)); do
    ip -n "$sw" link add "dc$d" type bridge
    ip -n "$sw" link set "dc$d" up
  done
  if ((dcs > 1)); then
    # One WAN bridge; each DC has one uplink veth to it, shaped W each way.
    # Traffic between two DCs crosses two uplinks, so its bottleneck is W.
    ip -n "$sw" link add wan type bridge
    ip -n "$sw" link set wan up
    for ((d = 0; d < dcs; d++)); do
      ip -n "$sw" link add "up$d" type veth peer name "wup$d"
      ip -n "$sw" link set "up$d" master "dc$d"
      ip -n "$sw" link set "wup$d" master wan
      ip -n "$sw" link set "up$d" up
      ip -n "$sw" link set "wup$d" up
      shape "$sw" "up$d" "$wan_mbit"   # DC -> WAN
      shape "$sw" "wup$d" "$wan_mbit"  # WAN -> DC
    done
  fi

  local names=() ips=() host_dcs=()
  for ((i = 0; i < hosts; i++)); do
    # Contiguous blocks: DC d holds hosts [d*N/D, (d+1)*N/D), so h0 (the
    # trainer) is in dc0 and the last host is in the last DC.
    d=$((i * dcs / hosts))
    local ns="${prefix}-h$i" ip="${net}.$d.$((i + 10))"
    # Test hook: fail half-way so the cleanup trap can be checked.
    [[ "${TESTBED_FAIL_AT_HOST:-}" != "$i" ]] || die "up: TESTBED_FAIL_AT_HOST=$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "h$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "h$i" master "dc$d"
    ip -n "$sw" link set "h$i" up
    ip -n "$ns" addr add "$ip/16" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0 "$host_mbit"   # upload
    shape "$sw" "h$i" "$host_mbit"  # download
    names+=("$ns"); ips+=("$ip"); host_dcs+=("$d")
  done

  local tmp
  tmp="$(state_file).tmp"
  {
    echo "# tensorhub test bed '$prefix', written by bench/testbed.sh up"
    echo "TB_PREFIX=$prefix"
    echo "TB_HOSTS=$hosts"
    echo "TB_DCS=$dcs"
    echo "TB_HOST_MBIT=$host_mbit"
    echo "TB_WAN_MBIT=$wan_mbit"
    echo "TB_SUBNET=${net}.0.0/16"
    echo "TB_SWITCH_NS=$sw"
    echo "TB_HOSTS_FILE=$(hosts_file)"
    echo "TB_HOST_NAMES=\"${names[*]}\""
    echo "TB_HOST_IPS=\"${ips[*]}\""
    echo "TB_HOST_DCS=\"${host_dcs[*]}\""
  } >"$tmp"
  mv "$tmp" "$(state_file)"
  {
    echo "# tensorhub test bed '$prefix': /etc/hosts format (IP name)"
    for ((i = 0; i < hosts; i++)); do echo "${ips[i]} ${names[i]}"; done
  } >"$(hosts_file)"
  trap - EXIT
  log "up: $hosts hosts in $dcs DC(s), host links ${host_mbit} Mbit/s, WAN ${wan_mbit} Mbit/s"
  log "state: $(state_file)  hosts: $(hosts_file)"
}

cmd_down() {
  while (($#)); do
    case "$1" in
      --prefix) prefix="$2"; shift 2 ;;
      *) die "down: unknown argument '$1'" ;;
    esac
  done
  check_prefix
  need_root
  teardown
  log "down: '$prefix' removed"
}

load_state() {
  [[ -r "$(state_file)" ]] || die "no test bed '$prefix' ($(state_file) missing; run 'up')"
  # shellcheck disable=SC1090
  source "$(state_file)"
  read -r -a TB_NAMES_A <<<"$TB_HOST_NAMES"
  read -r -a TB_IPS_A <<<"$TB_HOST_IPS"
  read -r -a TB_DCS_A <<<"$TB_HOST_DCS"
}

# Maps "P-h3", "h3", "3" or "10.77.0.13" to the namespace name.
resolve_host() {
  local h="$1" i
  for ((i = 0; i < TB_HOSTS; i++)); do
    if [[ "$h" == "${TB_NAMES_A[i]}" || "$h" == "h$i" || "$h" == "$i" ||
      "$h" == "${TB_IPS_A[i]}" ]]; then
      echo "${TB_NAMES_A[i]}"; return 0
    fi
  done
  return 1
}

cmd_exec() {
  if [[ "${1:-}" == "--prefix" ]]; then prefix="$2"; shift 2; fi
  check_prefix
  (($# >= 2)) || die "exec: HOST CMD..."
  load_state
  local ns
  ns="$(resolve_host "$1")" || die "exec: unknown host '$1'"
  shift
  exec ip netns exec "$ns" "$@"
}

cmd_status() {
  while (($#)); do
    case "$1" in
      --prefix) prefix="$2"; shift 2 ;;
      *) die "status: unknown argument '$1'" ;;
    esac
  done
  check_prefix
  load_state
  echo "prefix=$TB_PREFIX hosts=$TB_HOSTS dcs=$TB_DCS host_mbit=$TB_HOST_MBIT wan_mbit=$TB_WAN_MBIT subnet=$TB_SUBNET"
  local i
  for ((i = 0; i < TB_HOSTS; i++)); do
    echo "${TB_NAMES_A[i]} ${TB_IPS_A[i]} dc${TB_DCS_A[i]}"
  done
}

# Concurrent iperf3 flows, each "SRV:CLI" (host indexes; CLI sends to
# SRV); prints the Mbit/s each receiver saw, one per line, in order.
iperf_flows() {
  local seconds="$1"; shift
  local dir k=0 flow srv cli port pids=() spids=()
  dir="$(mktemp -d "/tmp/tensorhub-testbed-${prefix}.XXXXXX")"
  for flow in "$@"; do
    srv="${flow%%:*}" port=$((5201 + k))
    ip netns exec "${TB_NAMES_A[srv]}" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    spids+=($!)
    local tries=0
    # Wait (bounded) for the server socket instead of sleeping blindly.
    until ip netns exec "${TB_NAMES_A[srv]}" ss -ltn "sport = :$port" | grep -q LISTEN; do
      if ((tries++ >= 50)); then
        kill "${spids[@]}" 2>/dev/null; rm -rf "$dir"
        echo "iperf3 server on ${TB_NAMES_A[srv]}:$port did not start" >&2; return 1
      fi
      sleep 0.1
    done
    k=$((k + 1))
  done
  k=0
  for flow in "$@"; do
    srv="${flow%%:*}" cli="${flow##*:}" port=$((5201 + k))
    ip netns exec "${TB_NAMES_A[cli]}" timeout $((seconds + 15)) \
      iperf3 -c "${TB_IPS_A[srv]}" -p "$port" -t "$seconds" -O 1 -f m >"$dir/$k" 2>&1 &
    pids+=($!)
    k=$((k + 1))
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for pid in "${spids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for ((k = 0; k < $#; k++)); do
    awk '/receiver/ { for (i = 1; i <= NF; i++) if ($(i) == "Mbits/sec") v = $(i-1) }
         END { if (v == "") exit 1; print v }' "$dir/$k" || {
      echo "iperf3 flow $k failed:" >&2; cat "$dir/$k" >&2; rc=1
    }
  done
  rm -rf "$dir"
  return $rc
}

# Prints one line per path:
#   check path=NAME config_mbit=C measured_mbit=M ratio=R
# "fan-in" sends from two hosts to h0 at once: it is only near the host
# rate if h0's download side (the bridge-side veth) is shaped too.
cmd_check() {
  local seconds=4
  while (($#)); do
    case "$1" in
      --prefix) prefix="$2"; shift 2 ;;
      --seconds) seconds="$2"; shift 2 ;;
      *) die "check: unknown argument '$1'" ;;
    esac
  done
  check_prefix
  need_root
  load_state
  if ! command -v iperf3 >/dev/null; then
    log "installing iperf3"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
  fi
  local i a=-1 c=-1
  # A pair inside h0's DC, and a pair across DCs, both ending at h0.
  for ((i = 1; i < TB_HOSTS; i++)); do
    if ((a < 0 && TB_DCS_A[i] == TB_DCS_A[0])); then a=$i; fi
    if ((c < 0 && TB_DCS_A[i] != TB_DCS_A[0])); then c=$i; fi
  done
  local fail=0 got
  report() {
    printf "check path=%s config_mbit=%s measured_mbit=%s ratio=%s\n" "$1" "$2" "$3" \
      "$(awk -v g="$3" -v c="$2" 'BEGIN { printf "%.3f", g / c }')"
  }
  local cross=$((TB_HOST_MBIT < TB_WAN_MBIT ? TB_HOST_MBIT : TB_WAN_MBIT))
  if ((a > 0)); then
    if got="$(iperf_flows "$seconds" "0:$a")"; then
      report "h$a->h0(same-dc)" "$TB_HOST_MBIT" "$got"
    else fail=1; fi
  else
    log "check: no other host in h0's DC, skipping the same-DC path"
  fi
  if ((c > 0)); then
    if got="$(iperf_flows "$seconds" "$c:0")"; then
      report "h0->h$c(cross-dc)" "$cross" "$got"
    else fail=1; fi
  else
    log "check: one DC only, skipping the cross-DC path"
  fi
  if ((TB_HOSTS >= 3)); then
    local s1=1 s2=2 sum
    if got="$(iperf_flows "$seconds" "0:$s1" "0:$s2")"; then
      sum="$(awk '{ s += $1 } END { printf "%.0f", s }' <<<"$got")"
      report "h$s1+h$s2->h0(fan-in)" "$TB_HOST_MBIT" "$sum"
    else fail=1; fi
  fi
  return $fail
}

main() {
  local sub="${1:-}"
  (($#)) && shift
  case "$sub" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    exec) cmd_exec "$@" ;;
    check) cmd_check "$@" ;;
    status) cmd_status "$@" ;;
    *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
}

main "$@"
