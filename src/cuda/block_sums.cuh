// The kernels that compute XXH3's block sums (cuda/xxh3_blocks.h) on the
// device, optionally copying what they read: the one pass over memory that
// every device checksum makes. device.cu picks the blocks per step that
// bench/gpu_kernels.cu measured fastest; that benchmark also tries a layout
// that lost (a block per thread, its own) and checks every variant's sums
// (and copies) against the others'.
#ifndef TENSORHUB_CUDA_BLOCK_SUMS_CUH_
#define TENSORHUB_CUDA_BLOCK_SUMS_CUH_

#include <cstdint>

#include "cuda/xxh3_blocks.h"

namespace tensorhub::cuda::sums {

constexpr int kWordsPerBlock = xxh3::kBlockBytes / 8;  // 128

// 128 threads (one word each) share each block, kPerStep blocks per step:
// each thread loads its word of all of them before it reduces any, so that
// kPerStep loads per thread are in flight at once. The lanes are reduced by
// shuffles inside a warp, then across the 4 warps in shared memory.
// sums[(first + b) * 8 + lane] = the sum of block b at `p`, b < nb; with
// `dst`, every word read is written there too. `p` and `dst` 8-byte
// aligned. Launch with kWordsPerBlock threads; grid-stride over steps.
template <int kPerStep>
__global__ void WordPerThread(const uint64_t* __restrict__ p, uint64_t nb,
                              uint64_t first, uint64_t* __restrict__ sums,
                              uint64_t* __restrict__ dst) {
  __shared__ uint64_t part[kPerStep][kWordsPerBlock / 32][8];
  const xxh3::Secret s = xxh3::DefaultSecret();
  const unsigned t = threadIdx.x, lane = t % 8, warp = t / 32;
  for (uint64_t b0 = uint64_t{blockIdx.x} * kPerStep; b0 < nb;
       b0 += uint64_t{gridDim.x} * kPerStep) {
    uint64_t v[kPerStep];
#pragma unroll
    for (int u = 0; u < kPerStep; ++u) {
      v[u] = b0 + u < nb ? p[(b0 + u) * kWordsPerBlock + t] : 0;
    }
    if (dst != nullptr) {
#pragma unroll
      for (int u = 0; u < kPerStep; ++u) {
        if (b0 + u < nb) dst[(b0 + u) * kWordsPerBlock + t] = v[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kPerStep; ++u) {
      // My lane gets my word's product and the neighbour lane's word.
      uint64_t x =
          xxh3::WordMul(v[u], t, s) + __shfl_xor_sync(0xffffffffu, v[u], 1);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (t % 32 < 8) part[u][warp][lane] = x;
    }
    __syncthreads();
    if (t < 8 * kPerStep) {
      const unsigned u = t / 8, l = t % 8;
      if (b0 + u < nb) {
        uint64_t sum = 0;
        for (int w = 0; w < kWordsPerBlock / 32; ++w) sum += part[u][w][l];
        sums[(first + b0 + u) * 8 + l] = sum;
      }
    }
    __syncthreads();
  }
}

}  // namespace tensorhub::cuda::sums

#endif  // TENSORHUB_CUDA_BLOCK_SUMS_CUH_
