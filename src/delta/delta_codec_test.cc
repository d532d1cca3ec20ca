#include "delta/delta_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace tensorhub::delta {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<iovec> Whole(Bytes& b) { return {iovec{b.data(), b.size()}}; }

// `b` cut into pieces at the given offsets (odd ones included, so elements
// straddle pieces), with an empty piece in the middle.
std::vector<iovec> Cut(Bytes& b, std::vector<size_t> cuts) {
  std::vector<iovec> out;
  size_t at = 0;
  cuts.push_back(b.size());
  for (size_t c : cuts) {
    out.push_back(iovec{b.data() + at, c - at});
    if (out.size() == 2) out.push_back(iovec{b.data() + c, 0});
    at = c;
  }
  return out;
}

// A base and a version where about `fraction` of the w-byte elements moved
// by a few units (as bf16 weights after a small step), seeded.
struct Pair {
  Bytes base, version;
};
Pair MakePair(size_t bytes, uint32_t w, double fraction, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Pair p;
  p.base.resize(bytes);
  for (auto& x : p.base) x = static_cast<uint8_t>(rng());
  p.version = p.base;
  std::bernoulli_distribution pick(fraction);
  std::uniform_int_distribution<int> step(-3, 3);
  for (size_t e = 0; e + w <= bytes; e += w) {
    if (!pick(rng)) continue;
    uint64_t v = 0;
    std::memcpy(&v, p.version.data() + e, w);
    v += static_cast<uint64_t>(static_cast<int64_t>(step(rng) | 1));
    std::memcpy(p.version.data() + e, &v, w);
  }
  return p;
}

TEST(DeltaCodec, RoundTripsEachWidthWholeAndInPieces) {
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE("width " + std::to_string(w));
    Pair p = MakePair(1 << 16, w, 0.02, w);
    Codec codec;
    std::string delta;
    ASSERT_TRUE(*codec.Encode(Whole(p.base), Whole(p.version), w, &delta));
    EXPECT_LT(delta.size(), p.version.size() / 8);
    auto h = DecodeChunkDeltaHeader(
        {reinterpret_cast<const uint8_t*>(delta.data()), delta.size()});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->elem_bytes, w);
    EXPECT_EQ(h->chunk_bytes, p.version.size());

    // Contiguous.
    Bytes out(p.version.size(), 0xAB);
    const std::span<const uint8_t> d(
        reinterpret_cast<const uint8_t*>(delta.data()), delta.size());
    ASSERT_TRUE(codec.Apply(d, Whole(p.base), Whole(out)).ok());
    EXPECT_EQ(out, p.version);

    // Base and destination in pieces cut at other (odd) places than each
    // other, and an encoder fed pieces too.
    Bytes base = p.base, version = p.version;
    std::string delta2;
    ASSERT_TRUE(*codec.Encode(Cut(base, {3, 1000, 4097}),
                              Cut(version, {7, 999, 30001}), w, &delta2));
    EXPECT_EQ(delta2, delta);
    Bytes out2(p.version.size(), 0);
    ASSERT_TRUE(
        codec.Apply(d, Cut(base, {5, 777, 60001}), Cut(out2, {1, 2, 33333}))
            .ok());
    EXPECT_EQ(out2, p.version);

    // In place: the base becomes the version.
    Bytes in_place = p.base;
    ASSERT_TRUE(codec.Apply(d, Whole(in_place), Whole(in_place)).ok());
    EXPECT_EQ(in_place, p.version);
  }
}

TEST(DeltaCodec, SignFlipsAndWrapAroundAreExact) {
  // Differences that overflow the element: 0x0000 -> 0xFFFF, 0x8000 ->
  // 0x7FFF, a float's sign flipping; the delta is exact modulo 2^(8w).
  const Bytes from = {0x00, 0x00, 0x00, 0x80, 0xFF, 0x7F, 0x12, 0x34};
  const Bytes to = {0xFF, 0xFF, 0xFF, 0x7F, 0x00, 0x80, 0x12, 0xB4};
  Bytes base(4096, 0x42), version(4096, 0x42);
  for (size_t at : {size_t{0}, size_t{1024}, size_t{4088}}) {
    std::memcpy(base.data() + at, from.data(), 8);
    std::memcpy(version.data() + at, to.data(), 8);
  }
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    Codec codec;
    std::string delta;
    ASSERT_TRUE(*codec.Encode(Whole(base), Whole(version), w, &delta));
    Bytes out(version.size());
    ASSERT_TRUE(codec
                    .Apply({reinterpret_cast<const uint8_t*>(delta.data()),
                            delta.size()},
                           Whole(base), Whole(out))
                    .ok());
    EXPECT_EQ(out, version) << "width " << w;
  }
}

TEST(DeltaCodec,
     IdenticalChunkIsAHeaderAndAWidthThatDoesNotDivideFallsToBytes) {
  Bytes base(4099, 7);
  Codec codec;
  std::string delta;
  ASSERT_TRUE(*codec.Encode(Whole(base), Whole(base), 2, &delta));
  EXPECT_EQ(delta.size(), kChunkDeltaHeaderBytes);
  auto h = DecodeChunkDeltaHeader(
      {reinterpret_cast<const uint8_t*>(delta.data()), delta.size()});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->elem_bytes, 1);  // 4099 is odd
  EXPECT_EQ(h->changed, 0u);
  Bytes out(base.size(), 0);
  ASSERT_TRUE(
      codec
          .Apply({reinterpret_cast<const uint8_t*>(delta.data()), delta.size()},
                 Whole(base), Whole(out))
          .ok());
  EXPECT_EQ(out, base);
}

TEST(DeltaCodec, DenseChangeIsNoDeltaAndAppendsNothing) {
  Pair p = MakePair(1 << 14, 2, 0.9, 3);
  Codec codec;
  std::string delta = "kept";
  auto r = codec.Encode(Whole(p.base), Whole(p.version), 2, &delta);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(delta, "kept");
}

TEST(DeltaCodec, SizesThatDisagreeAreRefused) {
  Bytes a(100), b(101);
  Codec codec;
  std::string delta;
  EXPECT_EQ(codec.Encode(Whole(a), Whole(b), 2, &delta).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Encode(Whole(a), Whole(a), 3, &delta).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(*codec.Encode(Whole(a), Whole(a), 2, &delta));
  const std::span<const uint8_t> d(
      reinterpret_cast<const uint8_t*>(delta.data()), delta.size());
  EXPECT_EQ(codec.Apply(d, Whole(a), Whole(b)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Apply(d, Whole(b), Whole(a)).code(),
            StatusCode::kInvalidArgument);
}

// Every truncation and every single-byte change of a delta is refused with
// DATA_LOSS leaving the destination as it was, or decodes to some chunk;
// either way nothing outside the destination is written (guard bytes on
// both sides stay put).
TEST(DeltaCodec, CorruptDeltaIsRefusedCleanlyAndNeverWritesOutside) {
  Pair p = MakePair(4096, 2, 0.03, 11);
  Codec codec;
  std::string good;
  ASSERT_TRUE(*codec.Encode(Whole(p.base), Whole(p.version), 2, &good));
  constexpr size_t kGuard = 64;
  Bytes arena(p.version.size() + 2 * kGuard, 0x5A);
  const iovec dest{arena.data() + kGuard, p.version.size()};
  auto guards_intact = [&] {
    for (size_t i = 0; i < kGuard; ++i) {
      if (arena[i] != 0x5A || arena[arena.size() - 1 - i] != 0x5A) return false;
    }
    return true;
  };
  auto try_delta = [&](const std::string& bad) {
    std::memset(arena.data() + kGuard, 0xC3, p.version.size());
    const Status s =
        codec.Apply({reinterpret_cast<const uint8_t*>(bad.data()), bad.size()},
                    Whole(p.base), {&dest, 1});
    EXPECT_TRUE(guards_intact());
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      for (size_t i = 0; i < p.version.size(); ++i) {
        if (arena[kGuard + i] != 0xC3) {
          ADD_FAILURE() << "a refused delta wrote byte " << i;
          break;
        }
      }
    }
    return s.ok();
  };
  int refused = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    refused += !try_delta(good.substr(0, len));
  }
  EXPECT_EQ(refused, static_cast<int>(good.size()));  // every truncation
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      try_delta(bad);
    }
  }
  std::string longer = good + "x";
  EXPECT_FALSE(try_delta(longer));
}

TEST(DeltaCodec, ForgedHeaderCannotAskForHugeScratch) {
  // A header that claims a 1 GiB chunk with 512 MiB of streams is refused by
  // the destination's size before anything is allocated: a corrupt delta.
  std::string forged(kChunkDeltaHeaderBytes, '\0');
  const uint32_t magic = kChunkDeltaMagic;
  std::memcpy(forged.data(), &magic, 4);
  forged[4] = kChunkDeltaFormatSparse;
  forged[5] = 1;
  const uint64_t chunk = kMaxChunkDeltaBytes, changed = 1;
  const uint32_t half = static_cast<uint32_t>(chunk / 4);
  std::memcpy(forged.data() + 8, &chunk, 8);
  std::memcpy(forged.data() + 16, &changed, 8);
  std::memcpy(forged.data() + 24, &half, 4);
  std::memcpy(forged.data() + 28, &half, 4);
  forged += "junk";
  Bytes base(4096), out(4096);
  Codec codec;
  EXPECT_EQ(codec
                .Apply({reinterpret_cast<const uint8_t*>(forged.data()),
                        forged.size()},
                       Whole(base), Whole(out))
                .code(),
            StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tensorhub::delta
