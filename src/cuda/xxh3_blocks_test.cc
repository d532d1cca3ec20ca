// The block-parallel XXH3-64 (xxh3_blocks.h, which the CUDA kernel runs)
// against libxxhash on the CPU: every length up to a few blocks, then
// seeded random lengths up to several MiB, at every alignment mod 8.
#include "cuda/xxh3_blocks.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace tensorhub::xxh3 {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Xxh3Blocks, EveryLengthUpToFourBlocksMatchesLibxxhash) {
  std::vector<uint8_t> data = RandomBytes(4 * kBlockBytes + 80, 1);
  for (size_t len = 0; len <= data.size() - 8; ++len) {
    for (size_t align : {0, 3}) {
      const uint8_t* p = data.data() + align;
      ASSERT_EQ(HashByBlocks(p, len), XXH3_64bits(p, len))
          << "len " << len << " align " << align;
    }
  }
}

TEST(Xxh3Blocks, RandomLongLengthsMatchLibxxhash) {
  std::mt19937_64 rng(20261123);
  std::vector<uint8_t> data = RandomBytes((8 << 20) + 16, 2);
  for (int i = 0; i < 60; ++i) {
    size_t len = rng() % (8 << 20);
    size_t align = rng() % 8;
    const uint8_t* p = data.data() + align;
    ASSERT_EQ(HashByBlocks(p, len), XXH3_64bits(p, len))
        << "len " << len << " align " << align;
  }
  // Block boundaries exactly, where the folded/tail split changes.
  for (size_t blocks : {1, 2, 1023, 1024, 4096}) {
    for (long d : {-65, -64, -1, 0, 1, 64}) {
      size_t len = blocks * kBlockBytes + d;
      ASSERT_EQ(HashByBlocks(data.data(), len), XXH3_64bits(data.data(), len))
          << "len " << len;
    }
  }
}

TEST(Xxh3Blocks, BlockSumsAreAdditive) {
  // The property the kernel relies on: a block's sum is the sum of its
  // words' contributions, in any order.
  std::vector<uint8_t> block = RandomBytes(kBlockBytes, 3);
  uint64_t want[kLanes];
  BlockSum(block.data(), want);
  uint64_t got[kLanes] = {};
  const Secret s = DefaultSecret();
  for (int w = kBlockBytes / 8 - 1; w >= 0; --w) {
    uint64_t v = Read64(block.data() + 8 * w);
    got[(w % 8) ^ 1] += v;
    got[w % 8] += WordMul(v, w, s);
  }
  for (size_t i = 0; i < kLanes; ++i)
    EXPECT_EQ(got[i], want[i]) << "lane " << i;
}

}  // namespace
}  // namespace tensorhub::xxh3
