#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ with clang and runs each for a
# bounded time. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
# A crash leaves its input in build-fuzz/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
OUT=build-fuzz
mkdir -p "$OUT"
CXX=${FUZZ_CXX:-clang++-14}
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude -Isrc)
COMMON=(src/common/status.cc src/common/types.cc)
declare -A SRCS=(
  [frame_fuzz]="fuzz/frame_fuzz.cc src/wire/frame.cc"
  [safetensors_fuzz]="fuzz/safetensors_fuzz.cc src/safetensors/safetensors.cc"
)
for t in "${!SRCS[@]}"; do
  # shellcheck disable=SC2086
  "$CXX" "${FLAGS[@]}" ${SRCS[$t]} "${COMMON[@]}" -o "$OUT/$t"
  mkdir -p "$OUT/corpus-$t"
  echo "fuzz: $t for ${SECS}s"
  set +e
  (cd "$OUT" && "./$t" -max_total_time="$SECS" -print_final_stats=1 "corpus-$t" > "$t.log" 2>&1)
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
