// XXH3-64 (seed 0, default secret), written so that its long-input loop can
// run in parallel: the bit-exact algorithm of xxHash 0.8's XXH3_64bits,
// split into pieces that compile both for the host (g++) and for a CUDA
// device (nvcc), so the device checksum of a chunk equals the manifest's.
//
// Why it parallelises: inside one 1 KiB block (16 stripes of 64 bytes) each
// of the 8 accumulator lanes only receives additions, so a block's effect is
// a sum that any number of threads can compute independently ("block
// sums"). Between blocks the lanes are scrambled (a non-linear step), so the
// blocks are folded in order: acc = scramble(acc + sum[b]) for b = 0.. (a
// sequential scan of 8 words per KiB). The tail (the last partial block, the
// last stripe, the merge) and inputs of at most 240 bytes are done by one
// thread. xxh3_blocks_test.cc checks every piece against libxxhash on the
// CPU over many lengths; gpu_test.cc checks the kernel against the host.
//
// No CUDA headers here; nothing in it allocates or fails.
#ifndef TENSORHUB_CUDA_XXH3_BLOCKS_H_
#define TENSORHUB_CUDA_XXH3_BLOCKS_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TH_HD __host__ __device__ inline
#else
#define TH_HD inline
#endif

namespace tensorhub::xxh3 {

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;
inline constexpr size_t kStripeBytes = 64;
inline constexpr size_t kSecretBytes = 192;
inline constexpr size_t kStripesPerBlock =
    (kSecretBytes - kStripeBytes) / 8;                                  // 16
inline constexpr size_t kBlockBytes = kStripeBytes * kStripesPerBlock;  // 1024
inline constexpr size_t kLanes = 8;
inline constexpr size_t kMidsizeMax = 240;

// XXH3_kSecret, as 24 little-endian words (every offset the long loop reads
// is a multiple of 8; the few unaligned ones are read byte-wise).
struct Secret {
  uint64_t w[24];
};
TH_HD constexpr Secret DefaultSecret() {
  return Secret{{
      0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL,
      0x1f67b3b7a4a44072ULL, 0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL,
      0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL, 0xcb00c391bb52283cULL,
      0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
      0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL,
      0x647378d9c97e9fc8ULL, 0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL,
      0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL, 0xfca1477d58be162bULL,
      0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
  }};
}

// Little-endian reads at any alignment (byte by byte: the tail is short).
TH_HD uint64_t Read64(const uint8_t* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = v << 8 | p[k];
  return v;
}
TH_HD uint32_t Read32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
// The secret's bytes at any offset.
TH_HD uint8_t SecretByte(const Secret& s, size_t i) {
  return static_cast<uint8_t>(s.w[i / 8] >> (8 * (i % 8)));
}
TH_HD uint64_t SecretRead64(const Secret& s, size_t off) {
  if (off % 8 == 0) return s.w[off / 8];
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = v << 8 | SecretByte(s, off + k);
  return v;
}
TH_HD uint32_t SecretRead32(const Secret& s, size_t off) {
  return static_cast<uint32_t>(SecretRead64(s, off));
}

TH_HD uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
TH_HD uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
TH_HD uint64_t Swap64(uint64_t x) {
  uint64_t r = 0;
  for (int k = 0; k < 8; ++k) r = r << 8 | ((x >> (8 * k)) & 0xff);
  return r;
}
TH_HD uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  h ^= h >> 32;
  return h;
}
TH_HD uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  h ^= h >> 32;
  return h;
}
TH_HD uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
TH_HD uint64_t Mix16(const uint8_t* p, const Secret& s, size_t soff) {
  return Mul128Fold64(Read64(p) ^ SecretRead64(s, soff),
                      Read64(p + 8) ^ SecretRead64(s, soff + 8));
}

// XXH3_64bits for len <= 240 (one thread).
TH_HD uint64_t HashShort(const uint8_t* p, uint64_t len) {
  const Secret s = DefaultSecret();
  if (len == 0)
    return Xxh64Avalanche(SecretRead64(s, 56) ^ SecretRead64(s, 64));
  if (len <= 3) {
    uint32_t combined = static_cast<uint32_t>(p[0]) << 16 |
                        static_cast<uint32_t>(p[len >> 1]) << 24 |
                        static_cast<uint32_t>(p[len - 1]) |
                        static_cast<uint32_t>(len) << 8;
    uint64_t bitflip =
        static_cast<uint64_t>(SecretRead32(s, 0) ^ SecretRead32(s, 4));
    return Xxh64Avalanche(static_cast<uint64_t>(combined) ^ bitflip);
  }
  if (len <= 8) {
    uint64_t in1 = Read32(p), in2 = Read32(p + len - 4);
    uint64_t bitflip = SecretRead64(s, 8) ^ SecretRead64(s, 16);
    return Rrmxmx((in2 + (in1 << 32)) ^ bitflip, len);
  }
  if (len <= 16) {
    uint64_t lo = Read64(p) ^ (SecretRead64(s, 24) ^ SecretRead64(s, 32));
    uint64_t hi =
        Read64(p + len - 8) ^ (SecretRead64(s, 40) ^ SecretRead64(s, 48));
    return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16(p + 48, s, 96);
          acc += Mix16(p + len - 64, s, 112);
        }
        acc += Mix16(p + 32, s, 64);
        acc += Mix16(p + len - 48, s, 80);
      }
      acc += Mix16(p + 16, s, 32);
      acc += Mix16(p + len - 32, s, 48);
    }
    acc += Mix16(p, s, 0);
    acc += Mix16(p + len - 16, s, 16);
    return Avalanche(acc);
  }
  const int rounds = static_cast<int>(len / 16);
  for (int i = 0; i < 8; ++i) acc += Mix16(p + 16 * i, s, 16 * i);
  acc = Avalanche(acc);
  for (int i = 8; i < rounds; ++i)
    acc += Mix16(p + 16 * i, s, 16 * (i - 8) + 3);
  acc += Mix16(p + len - 16, s, 136 - 17);
  return Avalanche(acc);
}

// Long inputs (len > 240): the number of whole blocks the loop folds in
// order (the last block, even if full, is part of the tail).
TH_HD uint64_t FoldedBlocks(uint64_t len) { return (len - 1) / kBlockBytes; }

// The contribution of the 8-byte word `v` at word `word` (0..127) of a
// block to its lanes: lane (word % 8) gets `mul`, lane (word % 8) ^ 1 gets
// `v` itself. A block's sum per lane is the sum of these over its words.
TH_HD uint64_t WordMul(uint64_t v, unsigned word, const Secret& s) {
  const unsigned stripe = word / 8, lane = word % 8;
  const uint64_t k = v ^ s.w[stripe + lane];
  return (k & 0xFFFFFFFFULL) * (k >> 32);
}

// Block sums of one whole block, one thread (the host reference; the kernel
// computes the same with 128 threads).
TH_HD void BlockSum(const uint8_t* block, uint64_t sum[kLanes]) {
  const Secret s = DefaultSecret();
  for (size_t i = 0; i < kLanes; ++i) sum[i] = 0;
  for (unsigned w = 0; w < kBlockBytes / 8; ++w) {
    uint64_t v = Read64(block + 8 * w);
    sum[(w % 8) ^ 1] += v;
    sum[w % 8] += WordMul(v, w, s);
  }
}

TH_HD void InitAcc(uint64_t acc[kLanes]) {
  acc[0] = kPrime32_3;
  acc[1] = kPrime64_1;
  acc[2] = kPrime64_2;
  acc[3] = kPrime64_3;
  acc[4] = kPrime64_4;
  acc[5] = kPrime32_2;
  acc[6] = kPrime64_5;
  acc[7] = kPrime32_1;
}

// The secret word lane `lane` is scrambled with.
TH_HD uint64_t LaneKey(const Secret& s, unsigned lane) {
  return s.w[(kSecretBytes - kStripeBytes) / 8 + lane];
}
// One lane of one fold: scramble(a + sum) with the lane's key.
TH_HD uint64_t FoldLane(uint64_t a, uint64_t sum, uint64_t key) {
  a += sum;
  a ^= a >> 47;
  a ^= key;
  return a * kPrime32_1;
}

// acc = scramble(acc + sum): folds one block, in order.
TH_HD void FoldBlock(uint64_t acc[kLanes], const uint64_t sum[kLanes]) {
  const Secret s = DefaultSecret();
  for (unsigned i = 0; i < kLanes; ++i) {
    acc[i] = FoldLane(acc[i], sum[i], LaneKey(s, i));
  }
}

TH_HD void Accumulate512(uint64_t acc[kLanes], const uint8_t* p,
                         const Secret& s, size_t soff) {
  for (size_t i = 0; i < kLanes; ++i) {
    uint64_t v = Read64(p + 8 * i);
    uint64_t k = v ^ SecretRead64(s, soff + 8 * i);
    acc[i ^ 1] += v;
    acc[i] += (k & 0xFFFFFFFFULL) * (k >> 32);
  }
}

// The tail of a long input, after every folded block: the stripes of the
// last (partial or whole) block, the last stripe, the merge.
TH_HD uint64_t FinishLong(uint64_t acc[kLanes], const uint8_t* p,
                          uint64_t len) {
  const Secret s = DefaultSecret();
  const uint64_t nb = FoldedBlocks(len);
  const uint64_t stripes = ((len - 1) - kBlockBytes * nb) / kStripeBytes;
  const uint8_t* last = p + nb * kBlockBytes;
  for (uint64_t n = 0; n < stripes; ++n)
    Accumulate512(acc, last + n * kStripeBytes, s, n * 8);
  Accumulate512(acc, p + len - kStripeBytes, s,
                kSecretBytes - kStripeBytes - 7);
  uint64_t r = len * kPrime64_1;
  for (size_t i = 0; i < 4; ++i) {
    r += Mul128Fold64(acc[2 * i] ^ SecretRead64(s, 11 + 16 * i),
                      acc[2 * i + 1] ^ SecretRead64(s, 11 + 16 * i + 8));
  }
  return Avalanche(r);
}

// The whole hash in one thread, through the block sums (the reference the
// CPU test checks against libxxhash).
TH_HD uint64_t HashByBlocks(const uint8_t* p, uint64_t len) {
  if (len <= kMidsizeMax) return HashShort(p, len);
  uint64_t acc[kLanes];
  InitAcc(acc);
  const uint64_t nb = FoldedBlocks(len);
  for (uint64_t b = 0; b < nb; ++b) {
    uint64_t sum[kLanes];
    BlockSum(p + b * kBlockBytes, sum);
    FoldBlock(acc, sum);
  }
  return FinishLong(acc, p, len);
}

// ---- the tree (common/checksum.h, ChunkChecksum::kXxh3Tree) ----------------
// XXH3-64 over the XXH3-64s of the input's leaves of kLeafBytes, 8
// little-endian bytes each. Leaves start at multiples of kLeafBytes, hence
// at block boundaries: a leaf's folded blocks are blocks of the whole input,
// so the kernel computes every block sum of the input at once and then
// folds each leaf's 63 (at most) in parallel with the others.
inline constexpr uint64_t kLeafBytes = 64 << 10;
static_assert(kLeafBytes % kBlockBytes == 0);

// At least one leaf: an empty input is one empty leaf.
TH_HD uint64_t LeafCount(uint64_t len) {
  return len == 0 ? 1 : (len + kLeafBytes - 1) / kLeafBytes;
}
TH_HD uint64_t LeafLength(uint64_t len, uint64_t leaf) {
  const uint64_t off = leaf * kLeafBytes;
  return len - off < kLeafBytes ? len - off : kLeafBytes;
}
// The blocks whose sums a hash of `len` bytes folds: none for a short
// input. For the tree, the same blocks of the whole input cover every
// leaf's (a leaf's last block, even if whole, is its tail and not folded).
TH_HD uint64_t SummedBlocks(uint64_t len) {
  return len > kMidsizeMax ? FoldedBlocks(len) : 0;
}

// One leaf's hash from the block sums of the whole input (`sums[b * 8 +
// lane]`, block b counted from the input's start): what one warp of the
// leaf kernel computes, here in one thread.
TH_HD uint64_t LeafHashFromSums(const uint8_t* input, uint64_t len,
                                uint64_t leaf, const uint64_t* sums) {
  const uint64_t n = LeafLength(len, leaf);
  const uint8_t* q = input + leaf * kLeafBytes;
  if (n <= kMidsizeMax) return HashShort(q, n);
  uint64_t acc[kLanes];
  InitAcc(acc);
  const uint64_t first = leaf * (kLeafBytes / kBlockBytes);
  for (uint64_t b = 0; b < FoldedBlocks(n); ++b) {
    FoldBlock(acc, sums + (first + b) * kLanes);
  }
  return FinishLong(acc, q, n);
}

// The whole tree in one thread through the block sums (the reference the
// CPU test checks against common/checksum.h's ChunkSum). `leaf_hashes`
// must hold LeafCount(len) words; `sums` SummedBlocks(len) * 8.
TH_HD uint64_t TreeByBlocks(const uint8_t* p, uint64_t len, uint64_t* sums,
                            uint64_t* leaf_hashes) {
  for (uint64_t b = 0; b < SummedBlocks(len); ++b) {
    BlockSum(p + b * kBlockBytes, sums + b * kLanes);
  }
  const uint64_t leaves = LeafCount(len);
  for (uint64_t l = 0; l < leaves; ++l) {
    leaf_hashes[l] = LeafHashFromSums(p, len, l, sums);
  }
  return HashByBlocks(reinterpret_cast<const uint8_t*>(leaf_hashes),
                      leaves * 8);
}

}  // namespace tensorhub::xxh3

#endif  // TENSORHUB_CUDA_XXH3_BLOCKS_H_
