#!/usr/bin/env bash
# Packs the GPU tests and the GPU benchmark for a machine that has a GPU but
# not this one's Debian packages (the lent GPU machine of the `device` tool):
#
#   bash scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]   # here; defaults build/, gpu-bundle/
#   bash gpu-bundle/run.sh                             # there; results under $OUT (or ./gpu-results)
#
# OUT_DIR gets gpu_test, gpu_bench and gpu_kernels from BUILD_DIR (a TH_CUDA=ON build, whose
# CUDA runtime is linked statically), stripped; lib/, the shared libraries
# they load that are not glibc's (gRPC, protobuf, UCX, OpenSSL, ...: the other
# machine need not have them); and run.sh. It is about 35 MiB, under the
# device tool's 64 MiB carry. That machine needs glibc 2.36 or newer (Debian
# 12's) and an NVIDIA driver for CUDA 13; run.sh checks both first and says
# which is missing. The Python CUDA tests (tests/python/test_cuda.py) need the
# binding built for that machine's Python and are not in the bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-gpu-bundle}
cache="$BUILD/CMakeCache.txt"
[[ -f $cache ]] || { echo "gpu-bundle: no $cache: build first (bash scripts/build.sh)" >&2; exit 1; }
grep -q '^TH_CUDA:BOOL=ON' "$cache" || {
  echo "gpu-bundle: $BUILD was configured without TH_CUDA (no CUDA toolkit found?): nothing to bundle" >&2
  exit 1
}
if grep -q '^TH_BUILD_TESTS:BOOL=OFF' "$cache"; then
  echo "gpu-bundle: $BUILD was configured with -DTH_BUILD_TESTS=OFF: gpu_test and gpu_bench are tests;" \
    "reconfigure with bash scripts/build.sh $BUILD -DTH_BUILD_TESTS=ON" >&2
  exit 1
fi
TARGETS="gpu_test gpu_bench gpu_kernels" bash scripts/build.sh "$BUILD" >/dev/null
rm -rf "$OUT"
mkdir -p "$OUT/lib"
for bin in gpu_test gpu_bench gpu_kernels; do
  strip -o "$OUT/$bin" "$BUILD/tests/$bin"
done
# Every library the binaries load, except glibc's own (the loader, libc,
# libm, ...), which must match the other machine's kernel and loader.
ldd "$BUILD/tests/gpu_test" "$BUILD/tests/gpu_bench" "$BUILD/tests/gpu_kernels" | awk '/=> \//{print $3}' | sort -u |
  while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libresolv.so.*) continue ;;
    esac
    cp -L "$lib" "$OUT/lib/"
  done
cat > "$OUT/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs TensorHub's GPU tests and GPU benchmark (made by scripts/gpu-bundle.sh)
# and writes what each printed under $OUT (or ./gpu-results). Exit code: that
# of gpu_test. About 2 minutes on an H200 (2026-11-28).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
need=2.36
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [[ -z $have ]] || [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) != "$need" ]]; then
  echo "gpu run: this machine's glibc is ${have:-unknown}; the bundle needs $need or newer (built on Debian 12)" | tee "$out/error.txt" >&2
  exit 2
fi
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$out/nvidia-smi.txt" 2>&1 || {
  echo "gpu run: nvidia-smi failed: no NVIDIA driver or GPU here ($(head -1 "$out/nvidia-smi.txt"))" | tee "$out/error.txt" >&2
  exit 2
}
cat "$out/nvidia-smi.txt"
step() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee "$out/$name.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$out/$name.txt" 2>&1
  local rc=$?
  echo "rc $rc after $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
  tail -12 "$out/$name.txt"
  return $rc
}
step gpu-test 240 "$here/gpu_test"
rc=$?
step gpu-kernels 120 "$here/gpu_kernels"
step gpu-bench-64mib 120 "$here/gpu_bench" --bytes 1GiB --chunk 64MiB --streams 4
step gpu-bench-4mib 120 "$here/gpu_bench" --bytes 1GiB --chunk 4MiB --streams 8 --reps 2 --no-mix
# Model-sized reads: 8 GiB in 256 MiB reads (4 streams x 256 MiB in flight
# need 1 GiB of the holder's device staging buffers).
step gpu-bench-8gib 150 env TENSORHUB_CUDA_IPC_STAGING_MIB=2048 "$here/gpu_bench" --bytes 8GiB \
  --chunk 256MiB --streams 4 --reps 2 --no-mix
# The holder and the reader are two processes, each with its own CUDA
# context, which the GPU time-slices unless CUDA MPS runs; a staged read puts
# work on both. The same bench under MPS, where the driver ships it.
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$out/.mps CUDA_MPS_LOG_DIRECTORY=$out/.mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    step gpu-bench-mps 120 "$here/gpu_bench" --bytes 1GiB --chunk 64MiB --streams 4 --no-mix
    echo quit | nvidia-cuda-mps-control
  fi
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
fi
exit $rc
EOF
chmod +x "$OUT/run.sh"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)): run 'bash $OUT/run.sh' on the GPU machine"
