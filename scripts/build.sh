#!/usr/bin/env bash
# Configures and builds TensorHub. Usage: scripts/build.sh [DIR] [cmake args...]
# DIR defaults to build/. Two parallel jobs: the machines have 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build}
shift || true
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > "$DIR.cmake.log" 2>&1 \
  || { cat "$DIR.cmake.log"; exit 1; }
cmake --build "$DIR" -j "${JOBS:-2}"
