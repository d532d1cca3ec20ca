#!/usr/bin/env bash
# The binary wheel installs and works where nothing of the build is: a fresh
# venv in a minimal root (chroot, in a private mount namespace) that holds
# the Python interpreter with its standard library and the shared libraries
# Python itself loads, the C and C++ runtimes (libc, libm, libstdc++,
# libgcc_s: what manylinux wheels may assume), /proc, /sys and a /tmp;
# nothing else. No compiler, no headers, none of the libraries TensorHub is built
# against (gRPC, protobuf, abseil, UCX, prometheus-cpp, xxHash, ...). Run
# with `env -i`. There, it:
#   1. creates a venv and pip-installs the wheel (and numpy's wheel) from a
#      local directory, no index;
#   2. imports tensorhub and tensorhub.vllm (the plugin entry point) and
#      checks that neither loaded the native library;
#   3. runs a hub, publishes 4 MiB and fetches it into another worker, bytes
#      compared; then checks that every library the process mapped is the
#      root's (interpreter and C/C++ runtime) or the wheel's own;
#   4. runs the CLI the wheel installs: `tensorhub --version`, and
#      `tensorhub ls --json` against a `tensorhub serve` it starts.
#
# Usage: tests/install/wheel_test.sh [WHEEL] [NUMPY_WHEEL_DIR]
#   WHEEL: default the newest build-python/wheelhouse/tensorhub-*manylinux*.whl
#   (python/setup_env.sh builds and repairs it); NUMPY_WHEEL_DIR: a directory
#   holding a numpy wheel for the interpreter (default build-python/wheel-deps,
#   which setup_env.sh fills). Needs root (mount namespace, chroot); skips,
#   saying so, without it. Python: /usr/bin/python3 (the interpreter the
#   wheel was built for).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
say() { echo "wheel_test: $*"; }
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  say "SKIP: needs root for a private mount namespace and chroot"
  exit 0
fi
WHEEL=${1:-$(ls -t "$REPO"/build-python/wheelhouse/tensorhub-*manylinux*.whl 2>/dev/null | head -1 || true)}
DEPS=${2:-$REPO/build-python/wheel-deps}
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] || fail "no wheel (run python/setup_env.sh, which builds build-python/wheelhouse/)"
ls "$DEPS"/numpy-*.whl >/dev/null 2>&1 || fail "no numpy wheel in $DEPS (python/setup_env.sh downloads one)"
PY=/usr/bin/python3
CHROOT=$(command -v chroot) || fail "no chroot (coreutils)"
PYVER=$($PY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYBIN=$(readlink -f $PY)
STDLIB=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
start=$SECONDS

root=$(mktemp -d /tmp/th-wheel-root.XXXXXX)
cleanup() { rm -rf "$root"; }
trap cleanup EXIT

# What goes into the root: the interpreter and its stdlib, the libraries it
# and its own extension modules load (ldd), and the C/C++ runtimes.
# glibc's libraries and libstdc++/libgcc_s: the manylinux policy's
# "system" libraries, which no wheel carries.
runtime=""
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 \
         libstdc++.so.6 libgcc_s.so.1; do
  [ -e "/usr/lib/x86_64-linux-gnu/$l" ] && runtime+=" /usr/lib/x86_64-linux-gnu/$l"
done
libs=$( { ldd "$PYBIN"; for so in "$STDLIB"/lib-dynload/*.so $runtime; do ldd "$so"; done
          tr ' ' '\n' <<< "$runtime"
        } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
for banned in libgrpc libprotobuf libabsl libucp libucs libuct libprometheus libxxhash libcares libre2 libupb; do
  if grep -q "/$banned" <<< "$libs"; then fail "the root would hold $banned (a build dependency): $(grep "/$banned" <<< "$libs")"; fi
done

# Everything is a bind mount in a private mount namespace (gone when it
# ends), read-only; the root itself is an empty directory.
cat > "$root.setup" <<EOF
set -euo pipefail
bind() { # SRC DEST: a read-only bind of a file or directory (once)
  [ -e "$root\$2" ] && [ ! -d "\$1" ] && return 0
  if [ -d "\$1" ]; then mkdir -p "$root\$2"; else mkdir -p "\$(dirname "$root\$2")"; touch "$root\$2"; fi
  mount --bind "\$1" "$root\$2"
  mount -o remount,bind,ro "$root\$2"
}
bind "$PYBIN" /usr/bin/python$PYVER
ln -s python$PYVER "$root/usr/bin/python3"
bind "$STDLIB" "$STDLIB"
[ -d /usr/share/python-wheels ] && bind /usr/share/python-wheels /usr/share/python-wheels
while read -r lib; do
  [ -n "\$lib" ] || continue
  real=\$(readlink -f "\$lib")
  bind "\$real" "/usr/lib/x86_64-linux-gnu/\$(basename "\$lib")"
done <<'LIBS'
$libs
LIBS
mkdir -p "$root/lib64" "$root/proc" "$root/sys" "$root/tmp" "$root/dev" "$root/wheels"
ln -s /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
ln -s usr/lib "$root/lib"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"   # UCX finds its devices there, as on any machine
mount -t tmpfs -o size=2g tmpfs "$root/tmp"
for d in null zero urandom random; do touch "$root/dev/\$d"; mount --bind /dev/\$d "$root/dev/\$d"; done
mkdir -p "$root/dev/shm" && mount -t tmpfs -o size=256m tmpfs "$root/dev/shm"
bind "$WHEEL" "/wheels/$(basename "$WHEEL")"
for w in "$DEPS"/numpy-*.whl; do bind "\$w" "/wheels/\$(basename "\$w")"; done
bind "$REPO/tests/install/wheel_check.py" /wheel_check.py
run() { env -i PATH=/tmp/venv/bin:/usr/bin HOME=/tmp LANG=C.UTF-8 TENSORHUB_LOG=warn $CHROOT "$root" "\$@"; }
for tool in cc gcc g++ c++ clang cmake; do
  if run /usr/bin/python3 -c "import shutil, sys; sys.exit(0 if shutil.which('\$tool') else 1)"; then
    echo "wheel_test: FAIL: \$tool is in the root" >&2; exit 1
  fi
done
run /usr/bin/python3 -m venv /tmp/venv
run /tmp/venv/bin/pip install -q --disable-pip-version-check --no-index --find-links /wheels tensorhub
run /tmp/venv/bin/python /wheel_check.py
EOF
unshare --mount --propagation private bash "$root.setup" || { rm -f "$root.setup"; fail "see above"; }
rm -f "$root.setup"
say "OK: $(basename "$WHEEL") installed with pip into a fresh venv in a minimal root (no compiler, no headers, no build libraries), imported, published and fetched, CLI ran ($((SECONDS - start)) s)"
