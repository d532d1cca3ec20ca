#!/usr/bin/env bash
# Configures and builds TensorHub. Usage: scripts/build.sh [DIR] [cmake args...]
# DIR defaults to build/. Two parallel jobs: the machines have 2 cores.
# TARGETS="a b" builds only those targets (and what they need).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build}
shift || true
# ccache (from install-deps.sh) makes a rebuild of unchanged files, and the
# same files in a second build tree, cost a cache look-up.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@" > "$DIR.cmake.log" 2>&1 \
  || { cat "$DIR.cmake.log"; exit 1; }
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$DIR" -j "${JOBS:-2}" "${targets[@]}"
