#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ with clang and runs each for a
# bounded time: data-plane frames (and the handshake), safetensors headers,
# the hub's protobuf requests through the service into the state machine,
# the UCX hello and reply, HF checkpoint metadata, the etcd records of an HA
# hub, and a real hub over real gRPC with hostile clients,
# and chunk deltas (src/delta/).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
# The targets are CMake targets (TH_FUZZ=ON, fuzz/CMakeLists.txt) linking the
# real libraries; the build-fuzz/ tree builds only them and what they need.
# FUZZ_CC / FUZZ_CXX pick the compiler (default clang-14 / clang++-14).
# A crash leaves its input in build-fuzz/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
OUT=build-fuzz
TARGETS=(frame_fuzz safetensors_fuzz hub_proto_fuzz ucx_frames_fuzz hf_checkpoint_fuzz
         etcd_records_fuzz hub_grpc_fuzz delta_fuzz)
mkdir -p "$OUT"
# -O1 -g with assertions on (no NDEBUG), as the fuzz builds always were.
if ! CC=${FUZZ_CC:-clang-14} CXX=${FUZZ_CXX:-clang++-14} TARGETS="${TARGETS[*]}" \
    bash scripts/build.sh "$OUT" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
    -DTH_FUZZ=ON -DTH_BUILD_TESTS=OFF -DTH_CUDA=OFF -DTH_BUILD_PYTHON=OFF \
    > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"
  echo "fuzz: the build of the fuzz targets failed (log: $OUT/build.log)" >&2
  exit 1
fi
for t in "${TARGETS[@]}"; do
  mkdir -p "$OUT/corpus-$t"
  echo "fuzz: $t for ${SECS}s"
  set +e
  (cd "$OUT" && "./fuzz/$t" -max_total_time="$SECS" -print_final_stats=1 "corpus-$t" > "$t.log" 2>&1)
  rc=$?
  set -e
  grep -E "^(stat::number_of_executed_units|Done)" "$OUT/$t.log" || true
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FOUND A PROBLEM (exit $rc):"
    tail -40 "$OUT/$t.log"
    exit 1
  fi
done
echo "fuzz: all targets ran ${SECS}s without a finding"
