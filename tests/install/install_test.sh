#!/usr/bin/env bash
# The C++ library as a user gets it: installs the `dev` component of a build
# tree into a temporary prefix, checks that only the public headers went in,
# builds tests/install/consumer against it with find_package(TensorHub) and
# runs it (an embedded hub, one publish, one fetch). About 20 s.
# Usage: install_test.sh BUILD_DIR [CXX] [EXTRA_FLAGS]   (ctest: install_test)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: install_test.sh BUILD_DIR [CXX] [EXTRA_FLAGS]}" && pwd)
cxx=${2:-c++}
flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --component dev --prefix "$work/prefix" > "$work/install.log" \
  || { cat "$work/install.log"; fail "cmake --install"; }
[[ -f "$work/prefix/include/tensorhub/client.h" ]] || fail "include/tensorhub/client.h not installed"
extra=$(cd "$work/prefix/include" && find . -type f ! -path "./tensorhub/*")
[[ -z "$extra" ]] || fail "headers outside include/tensorhub/ installed: $extra"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configure with find_package(TensorHub)"; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
"$work/build/consumer" || fail "the consumer exited $?"
echo "install_test: OK"
