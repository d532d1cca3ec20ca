// The device checksum's one pass over memory, kernel by kernel: every
// variant of cuda/block_sums.cuh, reading only and copying as it reads,
// beside the limits measured in the same run on the same buffers
// (cudaMemcpy device to device; a kernel that only reads and XORs every
// word, the read bound) and their ratios. Each variant's sums (and copy)
// are checked against the first one's; a mismatch fails the run.
//
//   gpu_kernels [--gib N] [--reps R]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/block_sums.cuh"

namespace {

using tensorhub::cuda::sums::kWordsPerBlock;
using tensorhub::cuda::sums::WordPerThread;
namespace xxh3 = tensorhub::xxh3;

// One thread per block: it reads its 1 KiB in 16-byte loads and keeps the
// 8 lane sums in registers (no shuffles, no shared memory, no barriers).
// A warp's loads touch 32 blocks at once; each 128-byte line is read by 8
// loads of one thread in a row, from L1 after the first. Same contract as
// sums::WordPerThread; launch with any block size, grid-stride over blocks.
template <int kUnroll>
__global__ void BlockPerThread(const uint64_t* __restrict__ p, uint64_t nb,
                               uint64_t first, uint64_t* __restrict__ sums,
                               uint64_t* __restrict__ dst) {
  const xxh3::Secret s = xxh3::DefaultSecret();
  for (uint64_t b = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; b < nb;
       b += uint64_t{gridDim.x} * blockDim.x) {
    const ulonglong2* in =
        reinterpret_cast<const ulonglong2*>(p + b * kWordsPerBlock);
    ulonglong2* out =
        dst == nullptr
            ? nullptr
            : reinterpret_cast<ulonglong2*>(dst + b * kWordsPerBlock);
    uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int k0 = 0; k0 < kWordsPerBlock / 2; k0 += kUnroll) {
      ulonglong2 v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) v[k] = in[k0 + k];
      if (out != nullptr) {
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) out[k0 + k] = v[k];
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        // Words 2j and 2j + 1 of the block: lanes a and a + 1 (a even),
        // each the other's neighbour.
        const unsigned w = 2 * (k0 + k), a = w % 8;
        acc[a] += xxh3::WordMul(v[k].x, w, s) + v[k].y;
        acc[a + 1] += xxh3::WordMul(v[k].y, w + 1, s) + v[k].x;
      }
    }
    uint64_t* mine = sums + (first + b) * 8;
#pragma unroll
    for (int l = 0; l < 8; ++l) mine[l] = acc[l];
  }
}

#define CHECK(expr)                                        \
  do {                                                     \
    cudaError_t e_ = (expr);                               \
    if (e_ != cudaSuccess) {                               \
      std::fprintf(stderr, "gpu_kernels: %s: %s\n", #expr, \
                   cudaGetErrorString(e_));                \
      std::exit(1);                                        \
    }                                                      \
  } while (0)

// The read bound: every word loaded (16 bytes at a time, 4 in flight per
// thread), XORed, one word written per thread so nothing is optimised away.
__global__ void ReadAll(const ulonglong2* __restrict__ p, uint64_t n,
                        uint64_t* __restrict__ out) {
  uint64_t x = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    ulonglong2 a = p[i], b = p[i + stride], c = p[i + 2 * stride],
               d = p[i + 3 * stride];
    x ^= a.x ^ a.y ^ b.x ^ b.y ^ c.x ^ c.y ^ d.x ^ d.y;
  }
  for (; i < n; i += stride) x ^= p[i].x ^ p[i].y;
  out[uint64_t{blockIdx.x} * blockDim.x + threadIdx.x] = x;
}

__global__ void CountDiffs(const uint64_t* a, const uint64_t* b, uint64_t n,
                           unsigned long long* diffs) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    if (a[i] != b[i]) atomicAdd(diffs, 1ull);
  }
}

__global__ void Fill(uint64_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    p[i] = z ^ (z >> 31);
  }
}

struct Buffers {
  uint64_t* src;
  uint64_t* dst;
  uint64_t* sums;
  uint64_t* ref;
  uint64_t nb;
  uint64_t bytes;
  cudaStream_t stream;
  int sms;
};

// Best seconds of `reps` runs of launch().
template <typename F>
double Best(const Buffers& b, int reps, F&& launch) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run warms up
    CHECK(cudaEventRecord(e0, b.stream));
    launch();
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e1, b.stream));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0 && ms / 1e3 < best) best = ms / 1e3;
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return best;
}

uint64_t Diffs(const Buffers& b, const uint64_t* x, const uint64_t* y,
               uint64_t n) {
  unsigned long long* d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(*d)));
  CHECK(cudaMemsetAsync(d, 0, sizeof(*d), b.stream));
  CountDiffs<<<b.sms * 8, 256, 0, b.stream>>>(x, y, n, d);
  unsigned long long h = 0;
  CHECK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, b.stream));
  CHECK(cudaStreamSynchronize(b.stream));
  CHECK(cudaFree(d));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 4;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "gpu_kernels: the device checksum's block-sum kernels beside "
          "cudaMemcpy D2D and a read-only kernel\n"
          "  --gib N   input size in GiB (default 4)\n"
          "  --reps R  timed runs of each, the best reported (default 5)\n");
      return 0;
    }
    if ((a == "--gib" || a == "--reps") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || v <= 0 || v > 64) {
        std::fprintf(stderr, "gpu_kernels: %s takes a number in (0, 64]\n",
                     a.c_str());
        return 2;
      }
      if (a == "--gib") {
        gib = v;
      } else {
        reps = static_cast<int>(v);
      }
      continue;
    }
    std::fprintf(stderr, "gpu_kernels: unknown argument %s (see --help)\n",
                 a.c_str());
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_kernels: skipped, no CUDA device\n");
    return 0;
  }
  Buffers b{};
  b.nb = static_cast<uint64_t>(gib * (1 << 20));  // 1 KiB blocks
  b.bytes = b.nb * 1024;
  CHECK(cudaDeviceGetAttribute(&b.sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaStreamCreate(&b.stream));
  CHECK(cudaMalloc(&b.src, b.bytes));
  CHECK(cudaMalloc(&b.dst, b.bytes));
  CHECK(cudaMalloc(&b.sums, b.nb * 64));
  CHECK(cudaMalloc(&b.ref, b.nb * 64));
  uint64_t* scratch = nullptr;
  const unsigned read_grid = b.sms * 8, read_threads = 256;
  CHECK(cudaMalloc(&scratch, sizeof(uint64_t) * read_grid * read_threads));
  Fill<<<b.sms * 8, 256, 0, b.stream>>>(b.src, b.bytes / 8, 2026);
  CHECK(cudaStreamSynchronize(b.stream));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf(
      "gpu_kernels: %s, %d SMs, driver %d, runtime %d; %.2f GiB, "
      "best of %d\n",
      prop.name, b.sms, driver, runtime, b.bytes / double(1 << 30), reps);

  const double gb = b.bytes / 1e9;
  const double d2d =
      gb / Best(b, reps, [&] {
        CHECK(cudaMemcpyAsync(b.dst, b.src, b.bytes, cudaMemcpyDeviceToDevice,
                              b.stream));
      });
  const double read =
      gb / Best(b, reps, [&] {
        ReadAll<<<read_grid, read_threads, 0, b.stream>>>(
            reinterpret_cast<const ulonglong2*>(b.src), b.bytes / 16, scratch);
      });
  std::printf("limit  cudaMemcpy D2D                      %8.1f GB/s\n", d2d);
  std::printf("limit  read-only kernel (XOR every word)   %8.1f GB/s\n", read);

  // The reference sums: the first variant, reading only.
  WordPerThread<1><<<b.sms * 16, kWordsPerBlock, 0, b.stream>>>(b.src, b.nb, 0,
                                                                b.ref, nullptr);
  CHECK(cudaStreamSynchronize(b.stream));

  int failures = 0;
  auto row = [&](const char* name, bool copy, auto launch) {
    CHECK(cudaMemsetAsync(b.sums, 0, b.nb * 64, b.stream));
    CHECK(cudaMemsetAsync(b.dst, 0, b.bytes, b.stream));
    const double rate =
        gb / Best(b, reps, [&] { launch(copy ? b.dst : nullptr); });
    const uint64_t bad_sums = Diffs(b, b.sums, b.ref, b.nb * 8);
    const uint64_t bad_copy = copy ? Diffs(b, b.dst, b.src, b.bytes / 8) : 0;
    const bool ok = bad_sums == 0 && bad_copy == 0;
    failures += ok ? 0 : 1;
    std::printf("%-44s %8.1f GB/s = %.3fx %s%s\n", name, rate,
                rate / (copy ? d2d : read),
                copy ? "cudaMemcpy D2D" : "read bound",
                ok ? "" : "  WRONG: sums or copy differ from the reference");
  };
  for (bool copy : {false, true}) {
    const std::string how = copy ? "copy+sums" : "sums     ";
    auto word = [&](auto per_step, unsigned grid_per_sm) {
      constexpr int k = decltype(per_step)::value;
      return [&, grid_per_sm](uint64_t* dst) {
        const uint64_t steps = (b.nb + k - 1) / k;
        const unsigned grid = static_cast<unsigned>(
            std::min<uint64_t>(steps, uint64_t(b.sms) * grid_per_sm));
        WordPerThread<k><<<grid, kWordsPerBlock, 0, b.stream>>>(b.src, b.nb, 0,
                                                                b.sums, dst);
      };
    };
    auto block = [&](auto unroll, unsigned threads) {
      constexpr int k = decltype(unroll)::value;
      return [&, threads](uint64_t* dst) {
        const uint64_t blocks = (b.nb + threads - 1) / threads;
        const unsigned grid = static_cast<unsigned>(
            std::min<uint64_t>(blocks, uint64_t(b.sms) * 64));
        BlockPerThread<k>
            <<<grid, threads, 0, b.stream>>>(b.src, b.nb, 0, b.sums, dst);
      };
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    row((how + " word/thread, 1 block/step, 16 CTA/SM").c_str(), copy,
        word(I1{}, 16));
    row((how + " word/thread, 4 blocks/step, 16 CTA/SM").c_str(), copy,
        word(I4{}, 16));
    row((how + " word/thread, 8 blocks/step, 16 CTA/SM").c_str(), copy,
        word(I8{}, 16));
    row((how + " word/thread, 4 blocks/step, 64 CTA/SM").c_str(), copy,
        word(I4{}, 64));
    row((how + " block/thread, unroll 2, 128 thr").c_str(), copy,
        block(I2{}, 128));
    row((how + " block/thread, unroll 4, 128 thr").c_str(), copy,
        block(I4{}, 128));
    row((how + " block/thread, unroll 8, 128 thr").c_str(), copy,
        block(I8{}, 128));
    row((how + " block/thread, unroll 4, 256 thr").c_str(), copy,
        block(I4{}, 256));
  }
  std::printf("gpu_kernels: %s\n",
              failures == 0 ? "every variant's sums and copies agree"
                            : "SOME VARIANTS DISAGREE (see WRONG above)");
  return failures == 0 ? 0 : 1;
}
