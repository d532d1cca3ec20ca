#!/usr/bin/env bash
# Installs what TensorHub needs to build and test on Debian 12, and nothing
# that is already there. Run as root (or with sudo). Idempotent.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libxxhash-dev libssl-dev libgtest-dev googletest
  openssl                            # the TLS tests make their certificates with it
  clang libclang-rt-14-dev           # libFuzzer targets, the TSan + -Wthread-safety build
  clang-format-14                    # scripts/check-format.sh
  iproute2 procps iputils-ping iperf3 # network namespaces test bed (bench/testbed.sh)
  openmpi-bin libopenmpi-dev         # the MPI_Bcast baseline
  python3 python3-venv python3-dev python3-numpy python3-torch python3-pytest
  pybind11-dev
  prometheus-cpp-dev libcpp-httplib-dev # metrics: registry and text format, the /metrics endpoint
  libucx-dev ucx-utils               # the UCX data plane (TH_UCX); ucx_info, ucx_perftest
  prometheus                         # promtool, which checks the /metrics output (tests/python/test_metrics.py)
  etcd-server etcd-client            # the HA hub set's election and durable state (tests/ha_test.cc)
  libcli11-dev                       # the command lines (tools/, bench/lab/)
  nlohmann-json3-dev                 # JSON: `ls`/`show --json`, the node agent's protocol
  tmux                               # drives `tensorhub top` in tests/testbed/top_smoke.sh
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
