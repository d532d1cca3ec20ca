// The block-parallel XXH3-64 (xxh3_blocks.h, which the CUDA kernel runs)
// against libxxhash on the CPU: every length up to a few blocks, then
// seeded random lengths up to several MiB, at every alignment mod 8.
#include "cuda/xxh3_blocks.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "common/checksum.h"

namespace tensorhub::xxh3 {
namespace {

static_assert(kLeafBytes == kChecksumLeafBytes,
              "the device tree's leaves are common/checksum.h's");

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

// The tree as the leaf kernel computes it (every block sum of the input,
// then each leaf folded from them) against common/checksum.h's, which the
// host's publishers and readers use: the two must agree on every length,
// around every leaf and block boundary, at every alignment.
TEST(Xxh3Blocks, TreeFromBlockSumsMatchesTheHostChecksum) {
  std::mt19937_64 rng(20261125);
  std::vector<uint8_t> data = RandomBytes((6 << 20) + 16, 4);
  std::vector<size_t> lens;
  for (size_t len = 0; len <= 2 * kBlockBytes; len += 37) lens.push_back(len);
  for (size_t leaves : {1, 2, 3, 64, 80}) {
    for (long d : {-1025, -1024, -241, -240, -1, 0, 1, 240, 241, 1024, 1025}) {
      lens.push_back(leaves * kLeafBytes + d);
    }
  }
  for (int i = 0; i < 40; ++i) lens.push_back(rng() % (5 << 20));
  for (size_t len : lens) {
    const size_t align = rng() % 8;
    uint8_t* p = data.data() + align;
    std::vector<uint64_t> sums(SummedBlocks(len) * kLanes);
    std::vector<uint64_t> leaves(LeafCount(len));
    iovec v{p, len};
    ASSERT_EQ(TreeByBlocks(p, len, sums.data(), leaves.data()),
              ChunkSum(ChunkChecksum::kXxh3Tree, {&v, 1}))
        << "len " << len << " align " << align;
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
