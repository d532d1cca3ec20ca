#include "delta/version_delta.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "delta/delta_codec.h"

namespace tensorhub::delta {
namespace {

constexpr uint64_t kChunk = 16384;

// One rank's version: a bf16 tensor and a small u8 one, in `memory`.
struct Version_ {
  std::vector<uint8_t> w, b;
  Manifest manifest;
};

Manifest Layout(std::vector<uint8_t>& w, std::vector<uint8_t>& b) {
  std::vector<TensorRef> refs = {{TensorSpec{"w", DType::kBF16, {w.size() / 2}},
                                  w.data(), w.size(), MemoryLocation::Host()},
                                 {TensorSpec{"b", DType::kU8, {b.size()}},
                                  b.data(), b.size(), MemoryLocation::Host()}};
  Result<PartLayout> p = BuildPartLayout(0, refs, kChunk);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return Manifest(1, kChunk, {*p});
}

// A base and the next step: about 2% of the bf16 elements move by one.
void MakeSteps(Version_& base, Version_& next, uint64_t seed) {
  std::mt19937_64 rng(seed);
  base.w.resize(5 * kChunk + 2 * 1000);
  base.b.resize(777);
  for (auto& x : base.w) x = static_cast<uint8_t>(rng());
  for (auto& x : base.b) x = static_cast<uint8_t>(rng());
  next.w = base.w;
  next.b = base.b;
  for (size_t e = 0; e < next.w.size(); e += 2) {
    if (rng() % 50 == 0) ++next.w[e];
  }
  next.b[5] ^= 1;
  base.manifest = Layout(base.w, base.b);
  next.manifest = Layout(next.w, next.b);
}

ChunkPieces PiecesOf(Version_& base, Version_& next) {
  return [&](uint64_t chunk, std::vector<iovec>* b, std::vector<iovec>* v) {
    auto add = [&](Version_& ver, std::vector<iovec>* out) {
      const ChunkLoc loc = ver.manifest.Chunk(chunk);
      uint8_t* bases[] = {ver.w.data(), ver.b.data()};
      AppendPieces(ver.manifest.parts()[0], bases, loc.offset, loc.bytes, out);
    };
    add(base, b);
    add(next, v);
  };
}

// What a reader does: each chunk from its delta and its own base, checked
// against the version's chunk checksum.
std::vector<uint8_t> Rebuild(const VersionDelta& d, Version_& base,
                             Version_& next, std::vector<bool>* had_delta) {
  auto index = DecodeDeltaIndex(
      {reinterpret_cast<const uint8_t*>(d.index.data()), d.index.size()},
      Version(1), Version(2), next.manifest);
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  std::vector<uint8_t> out(next.manifest.total_bytes());
  std::vector<uint8_t> flat_base(base.w);
  flat_base.insert(flat_base.end(), base.b.begin(), base.b.end());
  std::vector<uint8_t> flat_next(next.w);
  flat_next.insert(flat_next.end(), next.b.begin(), next.b.end());
  Codec codec;
  for (uint64_t i = 0; i < next.manifest.num_chunks(); ++i) {
    const ChunkLoc loc = next.manifest.Chunk(i);
    const DeltaIndexEntry e = index->chunks[i];
    had_delta->push_back(e.length > 0);
    if (e.length == 0) {  // read whole
      std::memcpy(out.data() + loc.offset, flat_next.data() + loc.offset,
                  loc.bytes);
      continue;
    }
    const iovec bp{flat_base.data() + loc.offset, loc.bytes};
    const iovec op{out.data() + loc.offset, loc.bytes};
    EXPECT_TRUE(
        codec
            .Apply({reinterpret_cast<const uint8_t*>(d.body.data()) + e.offset,
                    e.length},
                   {&bp, 1}, {&op, 1})
            .ok());
    EXPECT_EQ(ChunkSum(loc.checksum, out.data() + loc.offset, loc.bytes),
              loc.xxh3)
        << "chunk " << i;
  }
  EXPECT_EQ(out, flat_next);
  return out;
}

TEST(VersionDelta, EveryChunkRebuildsBitExact) {
  for (int threads : {1, 3}) {
    Version_ base, next;
    MakeSteps(base, next, 7);
    ComputeOptions o;
    o.threads = threads;
    auto d = ComputeVersionDelta(base.manifest, Version(1), next.manifest,
                                 Version(2), PiecesOf(base, next), o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->chunks_with_delta, next.manifest.num_chunks());
    EXPECT_LT(d->total_bytes(), next.manifest.total_bytes() / 10);
    std::vector<bool> had;
    Rebuild(*d, base, next, &had);
  }
}

TEST(VersionDelta, ChunkWhoseBaseChangedAfterPublishGetsNoDelta) {
  // The base's memory was written after its manifest was made (a trainer
  // that broke the unpublish contract): that chunk travels whole.
  Version_ base, next;
  MakeSteps(base, next, 8);
  base.w[kChunk + 3] ^= 0x40;  // chunk 1
  auto d = ComputeVersionDelta(base.manifest, Version(1), next.manifest,
                               Version(2), PiecesOf(base, next));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->chunks_with_delta, next.manifest.num_chunks() - 1);
  base.w[kChunk + 3] ^= 0x40;  // the reader's base is the published one
  std::vector<bool> had;
  Rebuild(*d, base, next, &had);
  EXPECT_FALSE(had[1]);
  EXPECT_TRUE(had[0]);
  // Not checked: the chunk gets a delta against the changed base, which a
  // reader holding the published base cannot use (its checksum catches it).
  base.w[kChunk + 3] ^= 0x40;
  ComputeOptions o;
  o.verify_inputs = false;
  d = ComputeVersionDelta(base.manifest, Version(1), next.manifest, Version(2),
                          PiecesOf(base, next), o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->chunks_with_delta, next.manifest.num_chunks());
}

TEST(VersionDelta, DifferentChunksAreRefused) {
  Version_ base, next;
  MakeSteps(base, next, 9);
  next.b.push_back(1);
  next.manifest = Layout(next.w, next.b);
  auto d = ComputeVersionDelta(base.manifest, Version(1), next.manifest,
                               Version(2), PiecesOf(base, next));
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
}

TEST(VersionDelta, IndexDecoderRefusesWhatDoesNotFit) {
  Version_ base, next;
  MakeSteps(base, next, 10);
  auto d = ComputeVersionDelta(base.manifest, Version(1), next.manifest,
                               Version(2), PiecesOf(base, next));
  ASSERT_TRUE(d.ok());
  auto decode = [&](const std::string& s, uint64_t b = 1, uint64_t v = 2) {
    return DecodeDeltaIndex(
               {reinterpret_cast<const uint8_t*>(s.data()), s.size()},
               Version(b), Version(v), next.manifest)
        .status()
        .code();
  };
  EXPECT_EQ(decode(d->index), StatusCode::kOk);
  EXPECT_EQ(decode(d->index, 1, 3), StatusCode::kDataLoss);  // other pair
  EXPECT_EQ(decode(d->index.substr(1)), StatusCode::kDataLoss);
  for (size_t at = 0; at < d->index.size(); at += 3) {
    std::string bad = d->index;
    bad[at] = static_cast<char>(bad[at] ^ 0x80);
    const StatusCode c = decode(bad);
    // A flipped byte is refused, or names another place that still fits.
    EXPECT_TRUE(c == StatusCode::kDataLoss || c == StatusCode::kOk) << at;
    if (at < kDeltaIndexHeaderBytes - 8) {  // all but body_bytes
      EXPECT_EQ(c, StatusCode::kDataLoss) << at;
    }
  }
  // An entry past the body.
  DeltaIndex index = *DecodeDeltaIndex(
      {reinterpret_cast<const uint8_t*>(d->index.data()), d->index.size()},
      Version(1), Version(2), next.manifest);
  index.chunks[2].offset = index.body_bytes;
  EXPECT_EQ(decode(EncodeDeltaIndex(index)), StatusCode::kDataLoss);
}

TEST(VersionDelta, ElementWidthIsTheFirstTensorsOfTheChunk) {
  Version_ base, next;
  MakeSteps(base, next, 11);
  EXPECT_EQ(ChunkElementBytes(next.manifest, 0), 2u);  // bf16
  // The last chunk starts in w (5 chunks and 2000 bytes of it) and ends in
  // the u8 tensor: coded as bf16.
  EXPECT_EQ(ChunkElementBytes(next.manifest, 5), 2u);
}

}  // namespace
}  // namespace tensorhub::delta
