#!/usr/bin/env bash
# Runs the test suites many times, on an idle machine and under CPU load on
# every core, and counts failures: a test whose verdict depends on how fast
# or how busy the machine is shows up here. Too long for CI (about an hour
# at R=10); run it after changing a test or anything threaded.
#
#   scripts/stress-tests.sh [R]        R runs of each (default 10)
#   SUITES="ctest pytest"              which suites (default both)
#   BUILD=build                        the build tree whose ctest suite runs
#   LOAD="stress-ng --cpu 0"           the load: one busy worker per core
#
# Needs a build with tests (scripts/build.sh build -DTH_BUILD_TESTS=ON) and,
# for pytest, the venv of python/setup_env.sh. Prints one line per run and a
# summary "stress: SUITE idle N/R passed, loaded N/R passed"; exits 1 if any
# run failed. Logs of failed runs stay in $LOGDIR (default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-10}
SUITES=${SUITES:-ctest pytest}
BUILD=${BUILD:-build}
LOAD=${LOAD:-stress-ng --cpu 0 --cpu-method matrixprod}
LOGDIR=${LOGDIR:-$(mktemp -d /tmp/th-stress.XXXXXX)}
mkdir -p "$LOGDIR"
command -v stress-ng >/dev/null || { echo "stress: installing stress-ng"; apt-get install -y -qq stress-ng >/dev/null; }
[ -x "$BUILD/tests/multiprocess_test" ] || { echo "stress: no test build in $BUILD (scripts/build.sh $BUILD -DTH_BUILD_TESTS=ON)" >&2; exit 2; }

load_pid=""
stop_load() { if [ -n "$load_pid" ]; then kill "$load_pid" 2>/dev/null || true; wait "$load_pid" 2>/dev/null || true; load_pid=""; fi; }
trap stop_load EXIT

run_suite() {  # suite, log
  case $1 in
    ctest) (cd "$BUILD" && ctest --output-on-failure --timeout 900) > "$2" 2>&1 ;;
    pytest) TENSORHUB_BIN="$PWD/$BUILD/tools/tensorhub" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python > "$2" 2>&1 ;;
    *) echo "stress: unknown suite $1" >&2; return 2 ;;
  esac
}

declare -A passed
failures=0
for mode in idle loaded; do
  if [ "$mode" = loaded ]; then
    $LOAD > /dev/null 2>&1 &
    load_pid=$!
  fi
  for suite in $SUITES; do
    passed[$suite.$mode]=0
    for i in $(seq 1 "$R"); do
      log="$LOGDIR/$suite-$mode-$i.log"
      t0=$(date +%s)
      if run_suite "$suite" "$log"; then
        passed[$suite.$mode]=$(( ${passed[$suite.$mode]} + 1 ))
        echo "stress: $suite $mode run $i/$R passed ($(( $(date +%s) - t0 )) s)"
        rm -f "$log"
      else
        failures=$((failures + 1))
        echo "stress: $suite $mode run $i/$R FAILED ($(( $(date +%s) - t0 )) s), log $log"
        grep -E "FAILED|Failure|Error|error:|failed" "$log" | head -20 | sed 's/^/    /'
      fi
    done
  done
  stop_load
done
for suite in $SUITES; do
  echo "stress: $suite idle ${passed[$suite.idle]}/$R passed, loaded ${passed[$suite.loaded]}/$R passed"
done
[ "$failures" -eq 0 ]
