// Unit tests for Status/Result, dtypes, tensor specs, checksums and manifests.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/deadline.h"
#include "common/manifest.h"
#include "tensorhub/host_buffer.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {
namespace {

// ---------------------------------------------------------------- Status

TEST(DeadlineTest, ReadsItsClock) {
  FakeClock clock(1000);
  Deadline d = Deadline::AfterMs(50, clock);
  EXPECT_EQ(d.at_ms(), 1050);
  EXPECT_EQ(d.remaining_ms(), 50);
  EXPECT_FALSE(d.expired());
  Deadline capped = d.Cap(20);
  EXPECT_EQ(capped.at_ms(), 1020);
  EXPECT_EQ(d.Cap(500).at_ms(), 1050);
  clock.AdvanceMs(49);
  EXPECT_EQ(d.remaining_ms(), 1);
  EXPECT_TRUE(capped.expired());
  clock.AdvanceMs(1);
  EXPECT_TRUE(d.expired());
  clock.AdvanceMs(-5);  // time never goes back
  EXPECT_EQ(clock.NowMs(), 1050);
  EXPECT_EQ(d.remaining_ms(), 0);
}

TEST(DeadlineTest, RealClockKeepsTheSteadyScale) {
  Deadline d = Deadline::AfterMs(60000);
  EXPECT_FALSE(d.expired());
  EXPECT_GT(d.remaining_ms(), 0);
  EXPECT_LE(d.remaining_ms(), 60001);  // rounded up: never early, <= 1 ms late
  EXPECT_EQ(Deadline(d.at()).at_ms(), d.at_ms());
  EXPECT_EQ(&d.clock(), &Clock::Real());
}

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, ToStringNamesTheCode) {
  EXPECT_EQ(NotFound("model 'x' has no version 7").ToString(),
            "NOT_FOUND: model 'x' has no version 7");
  EXPECT_EQ(FailedPrecondition("m").ToString(), "FAILED_PRECONDITION: m");
}

TEST(StatusTest, HelpersSetTheirCode) {
  EXPECT_EQ(InvalidArgument("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DeadlineExceeded("").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(NotFound("").code(), StatusCode::kNotFound);
  EXPECT_EQ(AlreadyExists("").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(PermissionDenied("").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ResourceExhausted("").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(FailedPrecondition("").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Aborted("").code(), StatusCode::kAborted);
  EXPECT_EQ(Internal("").code(), StatusCode::kInternal);
  EXPECT_EQ(Unavailable("").code(), StatusCode::kUnavailable);
  EXPECT_EQ(DataLoss("").code(), StatusCode::kDataLoss);
}

TEST(StatusTest, CodeNamesAreDistinct) {
  const StatusCode codes[] = {StatusCode::kOk,
                              StatusCode::kInvalidArgument,
                              StatusCode::kDeadlineExceeded,
                              StatusCode::kNotFound,
                              StatusCode::kAlreadyExists,
                              StatusCode::kPermissionDenied,
                              StatusCode::kResourceExhausted,
                              StatusCode::kFailedPrecondition,
                              StatusCode::kAborted,
                              StatusCode::kInternal,
                              StatusCode::kUnavailable,
                              StatusCode::kDataLoss};
  std::vector<std::string> names;
  for (StatusCode c : codes) {
    std::string n(StatusCodeName(c));
    EXPECT_NE(n, "UNKNOWN");
    for (const std::string& other : names) EXPECT_NE(n, other);
    names.push_back(n);
  }
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN");
}

TEST(StatusTest, WithContextPrefixesAndKeepsCode) {
  Status s = DataLoss("chunk 3").WithContext("fetch m@1");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "fetch m@1: chunk 3");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
  EXPECT_EQ(Status::Ok().WithContext("ignored").message(), "");
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Status UseReturnIfError(int x, int* out) {
  TH_ASSIGN_OR_RETURN(int h, Half(x));
  TH_RETURN_IF_ERROR(h > 10 ? ResourceExhausted("big") : Status::Ok());
  *out = h;
  return Status::Ok();
}

TEST(ResultTest, ValueAndError) {
  Result<int> good = Half(8);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 4);
  EXPECT_EQ(good.value(), 4);
  Result<int> bad = Half(3);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd");

  Result<std::string> s(std::string("abc"));
  EXPECT_EQ(s->size(), 3u);
  std::string moved = std::move(s).value();
  EXPECT_EQ(moved, "abc");
}

TEST(ResultTest, Macros) {
  int out = -1;
  EXPECT_TRUE(UseReturnIfError(8, &out).ok());
  EXPECT_EQ(out, 4);
  out = -1;
  EXPECT_EQ(UseReturnIfError(3, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
  EXPECT_EQ(UseReturnIfError(40, &out).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(out, -1);
}

// ---------------------------------------------------------------- DType

TEST(DTypeTest, NameParseRoundTripAndBytes) {
  struct Row {
    DType dtype;
    const char* name;
    size_t bytes;
  };
  const Row rows[] = {
      {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},
      {DType::kI8, "I8", 1},          {DType::kU16, "U16", 2},
      {DType::kI16, "I16", 2},        {DType::kF16, "F16", 2},
      {DType::kBF16, "BF16", 2},      {DType::kU32, "U32", 4},
      {DType::kI32, "I32", 4},        {DType::kF32, "F32", 4},
      {DType::kU64, "U64", 8},        {DType::kI64, "I64", 8},
      {DType::kF64, "F64", 8},        {DType::kF8E4M3, "F8_E4M3", 1},
      {DType::kF8E5M2, "F8_E5M2", 1},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(DTypeName(r.dtype), r.name);
    EXPECT_EQ(DTypeBytes(r.dtype), r.bytes) << r.name;
    Result<DType> parsed = ParseDType(r.name);
    ASSERT_TRUE(parsed.ok()) << r.name;
    EXPECT_EQ(*parsed, r.dtype);
  }
}

TEST(DTypeTest, ParseRejectsUnknownSpellings) {
  for (const char* bad : {"", "f32", "FP32", "BF16 ", "F8E4M3", "I128"}) {
    Result<DType> r = ParseDType(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(DTypeBytes(static_cast<DType>(200)), 0u);
  EXPECT_EQ(DTypeName(static_cast<DType>(200)), "?");
}

TEST(VersionStateTest, Names) {
  EXPECT_EQ(VersionStateName(VersionState::kPending), "PENDING");
  EXPECT_EQ(VersionStateName(VersionState::kCommitted), "COMMITTED");
  EXPECT_EQ(VersionStateName(VersionState::kAborted), "ABORTED");
  EXPECT_EQ(VersionStateName(VersionState::kUnavailable), "UNAVAILABLE");
}

// ---------------------------------------------------------------- TensorSpec

TEST(TensorSpecTest, ByteSize) {
  TensorSpec scalar{"s", DType::kF32, {}};
  EXPECT_EQ(*scalar.ByteSize(), 4u);
  TensorSpec m{"m", DType::kBF16, {3, 5}};
  EXPECT_EQ(*m.ByteSize(), 30u);
  TensorSpec empty{"e", DType::kF64, {7, 0, 9}};
  EXPECT_EQ(*empty.ByteSize(), 0u);
  // The largest representable size is accepted exactly.
  TensorSpec edge{"edge", DType::kU8, {UINT64_MAX}};
  EXPECT_EQ(*edge.ByteSize(), UINT64_MAX);
}

TEST(TensorSpecTest, ByteSizeOverflowIsAnError) {
  TensorSpec a{"a", DType::kU16, {UINT64_MAX / 2 + 1}};
  EXPECT_EQ(a.ByteSize().status().code(), StatusCode::kInvalidArgument);
  TensorSpec b{"b", DType::kF32, {1ull << 31, 1ull << 31}};
  EXPECT_FALSE(b.ByteSize().ok());
  TensorSpec c{"c", DType::kU8, {1ull << 32, 1ull << 32}};
  EXPECT_FALSE(c.ByteSize().ok());
  // Just below the overflow is fine.
  TensorSpec d{"d", DType::kU8, {1ull << 32, (1ull << 32) - 1}};
  ASSERT_TRUE(d.ByteSize().ok());
  EXPECT_EQ(*d.ByteSize(), (1ull << 32) * ((1ull << 32) - 1));
  TensorSpec bad{"bad", static_cast<DType>(200), {1}};
  EXPECT_FALSE(bad.ByteSize().ok());
}

// Regression: a 0 dimension before the overflowing ones used to hide the
// overflow (0 * anything), while the same dimensions in another order were
// refused. A shape is valid or not whatever the order of its dimensions.
TEST(TensorSpecTest, ByteSizeOverflowDoesNotDependOnWhereTheZeroIs) {
  const std::vector<std::vector<uint64_t>> orders = {
      {0, 1ull << 32, 1ull << 32},
      {1ull << 32, 0, 1ull << 32},
      {1ull << 32, 1ull << 32, 0}};
  for (const auto& shape : orders) {
    TensorSpec t{"t", DType::kU8, shape};
    EXPECT_EQ(t.ByteSize().status().code(), StatusCode::kInvalidArgument)
        << shape[0] << "x" << shape[1] << "x" << shape[2];
  }
  // Without an overflow, a 0 anywhere means no bytes.
  for (const auto& shape :
       std::vector<std::vector<uint64_t>>{{0, 1ull << 40}, {1ull << 40, 0}}) {
    TensorSpec t{"t", DType::kF32, shape};
    ASSERT_TRUE(t.ByteSize().ok());
    EXPECT_EQ(*t.ByteSize(), 0u);
  }
}

// ---------------------------------------------------------------- Xxh3

TEST(Xxh3Test, PiecesEqualConcatenation) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 200; ++iter) {
    size_t total = rng() % 10000;
    std::vector<uint8_t> buf(total);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    std::vector<iovec> pieces;
    size_t at = 0;
    while (at < total) {
      size_t n = std::min<size_t>(total - at, rng() % 700);  // may be 0
      pieces.push_back({buf.data() + at, n});
      at += n;
    }
    EXPECT_EQ(Xxh3Pieces(pieces), Xxh3(buf.data(), buf.size())) << iter;
  }
  // No pieces at all hashes like empty input.
  EXPECT_EQ(Xxh3Pieces({}), Xxh3(nullptr, 0));
}

// The tree checksum against its definition, written out the long way:
// XXH3-64 of the 64 KiB leaves' XXH3-64s, fed in runs of every size.
uint64_t TreeByDefinition(const uint8_t* p, size_t n) {
  std::vector<uint64_t> leaves;
  size_t at = 0;
  do {
    const size_t len = std::min<size_t>(kChecksumLeafBytes, n - at);
    leaves.push_back(Xxh3(p + at, len));
    at += len;
  } while (at < n);
  return Xxh3(leaves.data(), leaves.size() * 8);
}

TEST(ChunkChecksumTest, TreeMatchesItsDefinitionForAnySplit) {
  std::mt19937_64 rng(20261125);
  std::vector<uint8_t> buf((3 << 20) + 77);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> sizes = {0,
                               1,
                               240,
                               241,
                               kChecksumLeafBytes - 1,
                               kChecksumLeafBytes,
                               kChecksumLeafBytes + 1,
                               2 * kChecksumLeafBytes,
                               3 << 20,
                               buf.size()};
  for (int i = 0; i < 20; ++i) sizes.push_back(rng() % buf.size());
  for (size_t n : sizes) {
    const uint64_t want = TreeByDefinition(buf.data(), n);
    iovec whole{buf.data(), n};
    EXPECT_EQ(ChunkSum(ChunkChecksum::kXxh3Tree, {&whole, 1}), want) << n;
    // Runs that start and end anywhere against the leaves.
    for (size_t max_run : {size_t{1} << 10, size_t{100003}, size_t{1} << 20}) {
      ChunkHash h(ChunkChecksum::kXxh3Tree, /*timed=*/true);
      for (size_t at = 0; at < n;) {
        size_t run = std::min<size_t>(n - at, rng() % max_run);  // may be 0
        h.Update(buf.data() + at, run);
        at += run;
      }
      EXPECT_EQ(h.Digest(), want) << n << " runs up to " << max_run;
    }
    // Plain XXH3 through ChunkHash is XXH3.
    ChunkHash plain(ChunkChecksum::kXxh3);
    plain.Update(buf.data(), n);
    EXPECT_EQ(plain.Digest(), Xxh3(buf.data(), n)) << n;
  }
}

// A chunk hashed in pieces that begin at leaf boundaries: the pieces'
// leaves, in order, give the chunk's checksum (how a chunk read in pieces
// for cut-through is verified).
TEST(ChunkChecksumTest, LeavesOfWholeLeafPiecesGiveTheChunksSum) {
  std::mt19937_64 rng(20261128);
  std::vector<uint8_t> buf((1 << 20) + 4321);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{100}, size_t{kChecksumLeafBytes},
                   size_t{5 * kChecksumLeafBytes}, buf.size()}) {
    const uint64_t want = TreeByDefinition(buf.data(), n);
    for (size_t piece : {size_t{kChecksumLeafBytes},
                         size_t{4 * kChecksumLeafBytes}, size_t{1} << 30}) {
      std::vector<uint64_t> leaves;
      size_t at = 0;
      do {
        const size_t len = std::min(piece, n - at);
        ChunkHash h(ChunkChecksum::kXxh3Tree);
        h.Update(buf.data() + at, len);
        const std::vector<uint64_t> l = h.Leaves();
        EXPECT_EQ(TreeSumOfLeaves(l), h.Digest());
        leaves.insert(leaves.end(), l.begin(), l.end());
        at += len;
      } while (at < n);
      EXPECT_EQ(TreeSumOfLeaves(leaves), want) << n << " in " << piece;
    }
  }
  EXPECT_TRUE(ChunkHash(ChunkChecksum::kXxh3).Leaves().empty());
}

TEST(ChunkChecksumTest, KindsDifferAndNamesAreStable) {
  std::vector<uint8_t> buf(100000, 3);
  iovec v{buf.data(), buf.size()};
  EXPECT_NE(ChunkSum(ChunkChecksum::kXxh3, {&v, 1}),
            ChunkSum(ChunkChecksum::kXxh3Tree, {&v, 1}));
  EXPECT_EQ(ChunkChecksumName(ChunkChecksum::kXxh3), "xxh3-64");
  EXPECT_EQ(ChunkChecksumName(ChunkChecksum::kXxh3Tree), "xxh3-64-tree-64k");
  EXPECT_EQ(ChunkChecksumName(static_cast<ChunkChecksum>(9)), "unknown (9)");
  EXPECT_TRUE(IsKnownChunkChecksum(0));
  EXPECT_TRUE(IsKnownChunkChecksum(1));
  EXPECT_FALSE(IsKnownChunkChecksum(2));
}

TEST(Xxh3Test, SeesEveryByte) {
  std::vector<uint8_t> buf(5000, 7);
  uint64_t h = Xxh3(buf.data(), buf.size());
  buf[4999] ^= 1;
  EXPECT_NE(Xxh3(buf.data(), buf.size()), h);
}

// ---------------------------------------------------------------- Manifest

// Owns the bytes of a set of tensors.
struct Tensors {
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorRef> refs;

  void Add(std::string name, DType dtype, std::vector<uint64_t> shape,
           uint8_t seed) {
    TensorSpec spec{std::move(name), dtype, std::move(shape)};
    uint64_t bytes = *spec.ByteSize();
    std::vector<uint8_t> d(bytes);
    for (uint64_t i = 0; i < bytes; ++i) {
      d[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
    }
    data.push_back(std::move(d));
    refs.push_back({spec, nullptr, bytes, MemoryLocation::Host()});
    Fix();
  }
  void Fix() {
    for (size_t i = 0; i < refs.size(); ++i) {
      refs[i].data = data[i].empty() ? nullptr : data[i].data();
    }
  }
  std::vector<uint8_t> Concat() const {
    std::vector<uint8_t> out;
    for (const auto& d : data) out.insert(out.end(), d.begin(), d.end());
    return out;
  }
  std::vector<uint8_t*> Bases() {
    std::vector<uint8_t*> b;
    for (auto& d : data) b.push_back(d.data());
    return b;
  }
};

TEST(BuildPartLayoutTest, OffsetsChunksAndChecksums) {
  Tensors t;
  t.Add("a", DType::kF32, {1000}, 1);      // 4000 bytes
  t.Add("b", DType::kU8, {300}, 2);        // 300
  t.Add("z", DType::kF16, {0, 4}, 3);      // 0
  t.Add("c", DType::kBF16, {2, 2500}, 4);  // 10000
  Result<PartLayout> part = BuildPartLayout(5, t.refs, kMinChunkBytes);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(part->rank, 5u);
  EXPECT_EQ(part->part_bytes, 14300u);
  ASSERT_EQ(part->tensors.size(), 4u);
  const uint64_t offsets[] = {0, 4000, 4300, 4300};
  const uint64_t sizes[] = {4000, 300, 0, 10000};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(part->tensors[i].offset, offsets[i]) << i;
    EXPECT_EQ(part->tensors[i].bytes, sizes[i]) << i;
    EXPECT_EQ(part->tensors[i].spec, t.refs[i].spec) << i;
  }
  // 14300 bytes in 4096-byte chunks: 3 full and one of 2012.
  ASSERT_EQ(part->chunk_xxh3.size(), 4u);
  std::vector<uint8_t> all = t.Concat();
  ASSERT_EQ(all.size(), 14300u);
  for (size_t c = 0; c < 4; ++c) {
    size_t off = c * kMinChunkBytes;
    size_t n = std::min<size_t>(kMinChunkBytes, all.size() - off);
    iovec v{all.data() + off, n};
    EXPECT_EQ(part->chunk_xxh3[c], ChunkSum(kDefaultChunkChecksum, {&v, 1}))
        << c;
  }
  EXPECT_EQ(part->chunk_checksum, kDefaultChunkChecksum);
}

TEST(BuildPartLayoutTest, ChunkCounts) {
  for (uint64_t bytes : {1ull, 4095ull, 4096ull, 4097ull, 8192ull, 12289ull}) {
    Tensors t;
    t.Add("x", DType::kU8, {bytes}, 9);
    Result<PartLayout> part = BuildPartLayout(0, t.refs, kMinChunkBytes);
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(part->chunk_xxh3.size(), (bytes + 4095) / 4096) << bytes;
    EXPECT_EQ(ChunksFor(bytes, kMinChunkBytes), (bytes + 4095) / 4096);
  }
  EXPECT_EQ(ChunksFor(0, kMinChunkBytes), 0u);
  // Only zero-size tensors: a part with no chunks.
  Tensors z;
  z.Add("z", DType::kF32, {0}, 0);
  Result<PartLayout> part = BuildPartLayout(0, z.refs, kMinChunkBytes);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->part_bytes, 0u);
  EXPECT_TRUE(part->chunk_xxh3.empty());
}

TEST(BuildPartLayoutTest, LargerChunkSize) {
  Tensors t;
  t.Add("a", DType::kU8, {10000}, 1);
  t.Add("b", DType::kU8, {10000}, 2);
  Result<PartLayout> part = BuildPartLayout(0, t.refs, 3 * kMinChunkBytes);
  ASSERT_TRUE(part.ok());
  ASSERT_EQ(part->chunk_xxh3.size(), 2u);
  std::vector<uint8_t> all = t.Concat();
  iovec first{all.data(), 3 * kMinChunkBytes};
  iovec second{all.data() + 3 * kMinChunkBytes, 20000 - 3 * kMinChunkBytes};
  EXPECT_EQ(part->chunk_xxh3[0], ChunkSum(kDefaultChunkChecksum, {&first, 1}));
  EXPECT_EQ(part->chunk_xxh3[1], ChunkSum(kDefaultChunkChecksum, {&second, 1}));
}

TEST(BuildPartLayoutTest, Rejections) {
  Tensors t;
  t.Add("a", DType::kU8, {10}, 1);
  t.Add("a", DType::kU8, {10}, 2);
  EXPECT_EQ(BuildPartLayout(0, t.refs, kMinChunkBytes).status().code(),
            StatusCode::kInvalidArgument);

  Tensors ok;
  ok.Add("a", DType::kU8, {10}, 1);
  EXPECT_FALSE(BuildPartLayout(0, ok.refs, kMinChunkBytes - 1).ok());
  EXPECT_FALSE(BuildPartLayout(0, ok.refs, 0).ok());
  EXPECT_FALSE(BuildPartLayout(0, ok.refs, kMaxChunkBytes + 1).ok());
  EXPECT_TRUE(BuildPartLayout(0, ok.refs, kMaxChunkBytes).ok());
  EXPECT_FALSE(BuildPartLayout(0, {}, kMinChunkBytes).ok());

  Tensors size;
  size.Add("a", DType::kF32, {10}, 1);
  size.refs[0].bytes = 39;
  EXPECT_EQ(BuildPartLayout(0, size.refs, kMinChunkBytes).status().code(),
            StatusCode::kInvalidArgument);
  size.refs[0].bytes = 41;
  EXPECT_FALSE(BuildPartLayout(0, size.refs, kMinChunkBytes).ok());

  Tensors noname;
  noname.Add("", DType::kU8, {1}, 1);
  EXPECT_FALSE(BuildPartLayout(0, noname.refs, kMinChunkBytes).ok());
  Tensors longname;
  longname.Add(std::string(kMaxNameBytes + 1, 'n'), DType::kU8, {1}, 1);
  EXPECT_FALSE(BuildPartLayout(0, longname.refs, kMinChunkBytes).ok());
  Tensors maxname;
  maxname.Add(std::string(kMaxNameBytes, 'n'), DType::kU8, {1}, 1);
  EXPECT_TRUE(BuildPartLayout(0, maxname.refs, kMinChunkBytes).ok());

  Tensors nodata;
  nodata.Add("a", DType::kU8, {10}, 1);
  nodata.refs[0].data = nullptr;
  EXPECT_FALSE(BuildPartLayout(0, nodata.refs, kMinChunkBytes).ok());
}

// A two-part manifest: part 0 has 3 chunks, part 1 has 2.
Manifest TwoParts(Tensors* t0, Tensors* t1) {
  t0->Add("p0.a", DType::kU8, {5000}, 1);
  t0->Add("p0.b", DType::kU8, {5000}, 2);
  t1->Add("p1.a", DType::kF32, {1500}, 3);
  PartLayout p0 = *BuildPartLayout(0, t0->refs, kMinChunkBytes);
  PartLayout p1 = *BuildPartLayout(1, t1->refs, kMinChunkBytes);
  return Manifest(2, kMinChunkBytes, {p0, p1});
}

TEST(ManifestTest, ChunkMapsAcrossParts) {
  Tensors t0, t1;
  Manifest m = TwoParts(&t0, &t1);
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().ToString();
  EXPECT_EQ(m.group_size(), 2u);
  EXPECT_EQ(m.total_bytes(), 16000u);
  EXPECT_EQ(m.num_chunks(), 5u);
  EXPECT_EQ(m.num_tensors(), 3u);
  EXPECT_EQ(m.chunk_base(0), 0u);
  EXPECT_EQ(m.chunk_base(1), 3u);
  EXPECT_EQ(m.chunk_base(2), 5u);
  struct Want {
    uint32_t part;
    uint64_t offset, bytes;
  };
  const Want want[] = {{0, 0, 4096},
                       {0, 4096, 4096},
                       {0, 8192, 1808},
                       {1, 0, 4096},
                       {1, 4096, 1904}};
  std::vector<uint8_t> b0 = t0.Concat(), b1 = t1.Concat();
  for (uint64_t c = 0; c < 5; ++c) {
    ChunkLoc loc = m.Chunk(c);
    EXPECT_EQ(loc.part, want[c].part) << c;
    EXPECT_EQ(loc.offset, want[c].offset) << c;
    EXPECT_EQ(loc.bytes, want[c].bytes) << c;
    const std::vector<uint8_t>& b = loc.part == 0 ? b0 : b1;
    EXPECT_EQ(loc.checksum, kDefaultChunkChecksum) << c;
    EXPECT_EQ(loc.xxh3,
              ChunkSum(loc.checksum, b.data() + loc.offset, loc.bytes))
        << c;
  }
}

TEST(ManifestTest, ChunkSkipsEmptyParts) {
  Tensors t0, t1, t2;
  t0.Add("a", DType::kU8, {0}, 0);
  t1.Add("b", DType::kU8, {5000}, 1);
  t2.Add("c", DType::kU8, {0}, 0);
  Manifest m(3, kMinChunkBytes,
             {*BuildPartLayout(0, t0.refs, kMinChunkBytes),
              *BuildPartLayout(1, t1.refs, kMinChunkBytes),
              *BuildPartLayout(2, t2.refs, kMinChunkBytes)});
  ASSERT_TRUE(m.Validate().ok());
  EXPECT_EQ(m.num_chunks(), 2u);
  EXPECT_EQ(m.Chunk(0).part, 1u);
  EXPECT_EQ(m.Chunk(1).part, 1u);
  EXPECT_EQ(m.Chunk(1).offset, 4096u);
  EXPECT_EQ(m.Chunk(1).bytes, 904u);
}

TEST(ManifestTest, DefaultIsEmptyAndInvalid) {
  Manifest m;
  EXPECT_EQ(m.num_chunks(), 0u);
  EXPECT_FALSE(m.Validate().ok());
}

TEST(ManifestTest, Equality) {
  Tensors t0, t1, u0, u1;
  Manifest a = TwoParts(&t0, &t1);
  Manifest b = TwoParts(&u0, &u1);
  EXPECT_TRUE(a == b);
  std::vector<PartLayout> parts = a.parts();
  parts[1].chunk_xxh3[0] ^= 1;
  EXPECT_FALSE(a == Manifest(2, kMinChunkBytes, parts));
  EXPECT_FALSE(a == Manifest(2, 2 * kMinChunkBytes, a.parts()));
}

// The digest follows equality: every field operator== compares changes it,
// and moving bytes between two adjacent strings does too (length prefixes).
TEST(ManifestTest, DigestFollowsEquality) {
  Tensors t0, t1, u0, u1;
  Manifest a = TwoParts(&t0, &t1);
  EXPECT_EQ(a.Digest(), TwoParts(&u0, &u1).Digest());
  std::vector<
      std::pair<const char*, std::function<void(std::vector<PartLayout>&)>>>
      edits = {
          {"checksum", [](auto& p) { p[1].chunk_xxh3[0] ^= 1; }},
          {"checksum kind",
           [](auto& p) { p[1].chunk_checksum = ChunkChecksum::kXxh3; }},
          {"name", [](auto& p) { p[0].tensors[0].spec.name += "x"; }},
          {"dtype", [](auto& p) { p[0].tensors[0].spec.dtype = DType::kI8; }},
          {"shape", [](auto& p) { p[0].tensors[0].spec.shape.push_back(1); }},
          {"offset", [](auto& p) { p[0].tensors[0].offset += 1; }},
          {"bytes", [](auto& p) { p[0].tensors[0].bytes += 1; }},
          {"part bytes", [](auto& p) { p[1].part_bytes += 1; }},
          {"rank", [](auto& p) { p[1].rank = 7; }},
          {"metadata",
           [](auto& p) {
             p[0].metadata.push_back({"k", "v"});
           }},
          {"metadata split",
           [](auto& p) {
             p[0].metadata.push_back({"kv", ""});
           }},
      };
  std::set<uint64_t> seen = {a.Digest().value};
  for (auto& [what, edit] : edits) {
    std::vector<PartLayout> parts = a.parts();
    edit(parts);
    Manifest b(2, kMinChunkBytes, parts);
    EXPECT_FALSE(a == b) << what;
    EXPECT_TRUE(seen.insert(b.Digest().value).second) << what;
  }
  EXPECT_NE(a.Digest(), Manifest(2, 2 * kMinChunkBytes, a.parts()).Digest());
}

// A known answer: hubs and workers of different builds name manifests by
// this digest (AddHolder by digest, the HA set's etcd facts), so its
// encoding must not change. The value was computed outside this code base:
// the fields below written as the encoding says (u64 little-endian,
// strings and lists length-prefixed; a non-default checksum kind as
// kind | 1 << 63 after the chunk checksums) and hashed with libxxhash's
// XXH3_64bits from Python (ctypes), 475 bytes.
TEST(ManifestTest, DigestKnownAnswer) {
  TensorLayout a(TensorSpec{"a", DType::kBF16, {2, 4}}, 0, 16);
  a.global_shape = {4, 4};
  a.box_offset = {2, 0};
  a.seg = SegmentShape{1, 4};
  a.seg_xxh3 = {0x1111, 0x2222};
  PartLayout p0;
  p0.rank = 0;
  p0.tensors = {a, TensorLayout(TensorSpec{"b", DType::kF32, {3}}, 16, 12)};
  p0.part_bytes = 28;
  p0.chunk_xxh3 = {0x0123456789abcdef};
  p0.chunk_checksum = ChunkChecksum::kXxh3Tree;
  p0.metadata = {{"format", "pt"}};
  PartLayout p1;
  p1.rank = 1;
  p1.tensors = {TensorLayout(TensorSpec{"c", DType::kU8, {5}}, 0, 5)};
  p1.part_bytes = 5;
  p1.chunk_xxh3 = {42};
  p1.chunk_checksum = ChunkChecksum::kXxh3;
  EXPECT_EQ(Manifest(2, 4096, {p0, p1}).Digest().value,
            uint64_t{0xf84d34aec9ff0ea0});
}

// Rebuilds `m` after `edit` changes its parts (and maybe its header).
struct Edit {
  uint32_t group_size;
  uint64_t chunk_bytes;
  std::vector<PartLayout> parts;
  Manifest Build() const { return Manifest(group_size, chunk_bytes, parts); }
};

void ExpectInvalid(const Edit& e, const char* what) {
  Status s = e.Build().Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument)
      << what << ": " << s.ToString();
}

TEST(ManifestValidateTest, EachRule) {
  Tensors t0, t1;
  Manifest good = TwoParts(&t0, &t1);
  const Edit base{2, kMinChunkBytes, good.parts()};
  ASSERT_TRUE(base.Build().Validate().ok());

  {  // group size 0, too large, or not matching the parts
    Edit e = base;
    e.group_size = 0;
    ExpectInvalid(e, "group 0");
    e.group_size = kMaxGroupSize + 1;
    ExpectInvalid(e, "group too large");
    e.group_size = 3;
    ExpectInvalid(e, "3 for 2 parts");
    e.group_size = 1;
    ExpectInvalid(e, "1 for 2 parts");
  }
  {  // chunk size bounds (the checksums would not match either, but the
     // chunk size rule fires first; test the bound on its own below)
    Edit e = base;
    e.chunk_bytes = kMinChunkBytes - 1;
    ExpectInvalid(e, "chunk too small");
    e.chunk_bytes = kMaxChunkBytes + 1;
    ExpectInvalid(e, "chunk too large");
  }
  {  // part claims another rank
    Edit e = base;
    e.parts[1].rank = 0;
    ExpectInvalid(e, "rank mismatch");
    Edit f = base;
    std::swap(f.parts[0], f.parts[1]);
    ExpectInvalid(f, "parts out of order");
  }
  {  // tensor names: empty, too long, repeated within and across parts
    Edit e = base;
    e.parts[0].tensors[0].spec.name = "";
    ExpectInvalid(e, "empty name");
    e = base;
    e.parts[0].tensors[0].spec.name = std::string(kMaxNameBytes + 1, 'x');
    ExpectInvalid(e, "long name");
    e = base;
    e.parts[0].tensors[1].spec.name = "p0.a";
    ExpectInvalid(e, "dup in part");
    e = base;
    e.parts[1].tensors[0].spec.name = "p0.b";
    ExpectInvalid(e, "dup across parts");
  }
  {  // more than 16 dimensions
    Edit e = base;
    std::vector<uint64_t> shape(17, 1);
    shape[0] = 5000;
    e.parts[0].tensors[0].spec.shape = shape;
    ExpectInvalid(e, "17 dims");
    shape.pop_back();
    e.parts[0].tensors[0].spec.shape = shape;
    // The segment checksums were of the old shape.
    e.parts[0].tensors[0].seg = {};
    e.parts[0].tensors[0].seg_xxh3.clear();
    EXPECT_TRUE(e.Build().Validate().ok()) << "16 dims are allowed";
  }
  {  // spec size overflows or disagrees with bytes
    Edit e = base;
    e.parts[0].tensors[0].spec.shape = {UINT64_MAX, 2};
    ExpectInvalid(e, "overflow");
    e = base;
    e.parts[0].tensors[0].spec.dtype = DType::kU16;
    ExpectInvalid(e, "dtype changes size");
    e = base;
    e.parts[0].tensors[0].spec.dtype = static_cast<DType>(200);
    ExpectInvalid(e, "bad dtype");
  }
  {  // offsets do not tile: gap, overlap
    Edit e = base;
    e.parts[0].tensors[1].offset += 1;
    ExpectInvalid(e, "gap");
    e = base;
    e.parts[0].tensors[1].offset -= 1;
    ExpectInvalid(e, "overlap");
    e = base;
    e.parts[0].tensors[0].offset = 1;
    ExpectInvalid(e, "first not at 0");
  }
  {  // part size disagrees with tensors
    Edit e = base;
    e.parts[0].part_bytes += 1;
    ExpectInvalid(e, "part too big");
    e.parts[0].part_bytes -= 2;
    ExpectInvalid(e, "part too small");
  }
  {  // checksum count disagrees with chunk count
    Edit e = base;
    e.parts[1].chunk_xxh3.push_back(0);
    ExpectInvalid(e, "extra checksum");
    e = base;
    e.parts[1].chunk_xxh3.pop_back();
    ExpectInvalid(e, "missing checksum");
    e = base;
    e.chunk_bytes = 2 * kMinChunkBytes;
    ExpectInvalid(e, "chunk size changes chunk count");
  }
  {  // a chunk checksum this build does not know: refused, saying so
    Edit e = base;
    e.parts[1].chunk_checksum = static_cast<ChunkChecksum>(7);
    Status s = e.Build().Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("unknown (7)"), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("upgrade"), std::string::npos) << s.ToString();
    // Parts may differ in kind (a group upgraded rank by rank).
    e.parts[1].chunk_checksum = ChunkChecksum::kXxh3;
    EXPECT_TRUE(e.Build().Validate().ok());
  }
}

TEST(ManifestValidateTest, TooManyChunks) {
  // A single huge zero-filled claim: sizes add up but chunk count is over
  // the bound. The checksums are never read, so no bytes are needed.
  const uint64_t chunks = kMaxChunksPerVersion + 1;
  PartLayout p;
  p.rank = 0;
  p.part_bytes = chunks * kMinChunkBytes;
  p.tensors.push_back(
      {TensorSpec{"big", DType::kU8, {p.part_bytes}}, 0, p.part_bytes});
  p.chunk_xxh3.assign(chunks, 0);
  EXPECT_EQ(Manifest(1, kMinChunkBytes, {p}).Validate().code(),
            StatusCode::kInvalidArgument);
  // One fewer chunk is at the bound and allowed.
  p.part_bytes -= kMinChunkBytes;
  p.tensors[0].spec.shape[0] = p.part_bytes;
  p.tensors[0].bytes = p.part_bytes;
  p.chunk_xxh3.pop_back();
  EXPECT_TRUE(Manifest(1, kMinChunkBytes, {p}).Validate().ok());
}

TEST(ManifestValidateTest, PartSizeOverflow) {
  // Two tensors each claiming 2^63 bytes: the sum wraps to 0.
  PartLayout p;
  p.rank = 0;
  const uint64_t half = 1ull << 63;
  p.tensors.push_back({TensorSpec{"a", DType::kU8, {half}}, 0, half});
  p.tensors.push_back({TensorSpec{"b", DType::kU8, {half}}, half, half});
  p.part_bytes = 0;
  EXPECT_EQ(Manifest(1, kMinChunkBytes, {p}).Validate().code(),
            StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- AppendPieces

// Copies the bytes the pieces point at.
std::vector<uint8_t> Gather(const std::vector<iovec>& pieces) {
  std::vector<uint8_t> out;
  for (const iovec& p : pieces) {
    const auto* b = static_cast<const uint8_t*>(p.iov_base);
    out.insert(out.end(), b, b + p.iov_len);
  }
  return out;
}

TEST(AppendPiecesTest, AcrossTensorBoundaries) {
  Tensors t;
  t.Add("a", DType::kU8, {10}, 1);
  t.Add("z", DType::kU8, {0}, 0);
  t.Add("b", DType::kU8, {20}, 2);
  t.Add("c", DType::kU8, {5}, 3);
  PartLayout part = *BuildPartLayout(0, t.refs, kMinChunkBytes);
  std::vector<uint8_t*> bases = t.Bases();
  std::vector<iovec> pieces;
  AppendPieces(part, bases, 8, 25, &pieces);  // 2 of a, 20 of b, 3 of c
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].iov_base, t.data[0].data() + 8);
  EXPECT_EQ(pieces[0].iov_len, 2u);
  EXPECT_EQ(pieces[1].iov_base, t.data[2].data());
  EXPECT_EQ(pieces[1].iov_len, 20u);
  EXPECT_EQ(pieces[2].iov_base, t.data[3].data());
  EXPECT_EQ(pieces[2].iov_len, 3u);
  // Appends: existing entries stay.
  AppendPieces(part, bases, 10, 1, &pieces);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[3].iov_base, t.data[2].data());
  EXPECT_EQ(pieces[3].iov_len, 1u);
  // Zero bytes adds nothing.
  AppendPieces(part, bases, 35, 0, &pieces);
  EXPECT_EQ(pieces.size(), 4u);
}

TEST(AppendPiecesTest, MatchesNaiveReferenceOnRandomLayouts) {
  std::mt19937_64 rng(20240601);
  for (int iter = 0; iter < 300; ++iter) {
    Tensors t;
    int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      uint64_t size = rng() % 4 == 0 ? 0 : rng() % 3000;
      t.Add("t" + std::to_string(i), DType::kU8, {size},
            static_cast<uint8_t>(rng()));
    }
    PartLayout part = *BuildPartLayout(0, t.refs, kMinChunkBytes);
    std::vector<uint8_t> all = t.Concat();
    ASSERT_EQ(all.size(), part.part_bytes);
    std::vector<uint8_t*> bases = t.Bases();
    for (int q = 0; q < 20; ++q) {
      uint64_t off = all.empty() ? 0 : rng() % (all.size() + 1);
      uint64_t len = rng() % (all.size() - off + 1);
      std::vector<iovec> pieces;
      AppendPieces(part, bases, off, len, &pieces);
      for (const iovec& p : pieces) EXPECT_GT(p.iov_len, 0u);
      std::vector<uint8_t> want(all.begin() + off, all.begin() + off + len);
      ASSERT_EQ(Gather(pieces), want)
          << "iter " << iter << " off " << off << " len " << len;
      EXPECT_EQ(Xxh3Pieces(pieces), Xxh3(want.data(), want.size()));
    }
  }
}

}  // namespace
}  // namespace tensorhub

#include <xxhash.h>

namespace tensorhub {
namespace {

// Our Xxh3 may run an AVX2 build of XXH3; it must agree with the system
// library bit for bit (manifests from other machines depend on it).
TEST(ChecksumTest, MatchesTheSystemLibraryForEverySize) {
  std::mt19937_64 rng(99);
  std::vector<uint8_t> buf(3 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {0u, 1u, 3u, 16u, 17u, 128u, 129u, 240u, 241u, 1024u, 4095u,
                   65536u, 1000003u, 3u << 20}) {
    EXPECT_EQ(Xxh3(buf.data(), n), XXH3_64bits(buf.data(), n)) << n;
    Xxh3Stream s;
    size_t off = 0;
    while (off < n) {
      size_t take = std::min<size_t>(n - off, 1 + rng() % 300000);
      s.Update(buf.data() + off, take);
      off += take;
    }
    EXPECT_EQ(s.Digest(), XXH3_64bits(buf.data(), n)) << n;
  }
}

}  // namespace
}  // namespace tensorhub

namespace tensorhub {
namespace {

// TH_CHECK is on in every build type and names the file, the line, the
// expression and the values of a failed comparison.
TEST(CheckDeathTest, FailedComparisonNamesTheValues) {
  uint64_t chunk = 7, chunks = 5;
  EXPECT_DEATH(
      TH_CHECK_LT(chunk, chunks),
      "common_test.cc:[0-9]+: check failed: chunk < chunks \\(7 vs 5\\)");
  EXPECT_DEATH(TH_CHECK(chunk == 0), "check failed: chunk == 0");
  TH_CHECK_LT(chunks, chunk);  // holds: no effect
}

TEST(CheckDeathTest, ValueOfAnErrorResultNamesTheError) {
  Result<int> r = NotFound("no version 3 of m");
  EXPECT_DEATH((void)r.value(),
               "Result::value\\(\\) on an error: no version 3 of m");
}

}  // namespace
}  // namespace tensorhub

namespace tensorhub {
namespace {

TEST(HostBufferTest, IsAlignedZeroedAndWritable) {
  const uint64_t bytes = (uint64_t{5} << 20) + 3;
  auto buf = HostBuffer::Allocate(bytes);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  ASSERT_EQ(buf->size(), bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % HostBuffer::kAlignment,
            0u);
  for (uint64_t i = 0; i < bytes; i += 4093) ASSERT_EQ(buf->data()[i], 0);
  std::memset(buf->data(), 0xab, bytes);
  EXPECT_EQ(buf->data()[bytes - 1], 0xab);
  const std::string mode = TransparentHugePageMode();
  EXPECT_EQ(buf->huge_pages(), mode == "always" || mode == "madvise")
      << "THP mode '" << mode << "'";
}

TEST(HostBufferTest, MovesOwnershipAndRefusesNothing) {
  auto a = HostBuffer::Allocate(4096);
  ASSERT_TRUE(a.ok());
  uint8_t* p = a->data();
  HostBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(a->size(), 0u);
  b = HostBuffer();
  EXPECT_EQ(b.data(), nullptr);
  auto none = HostBuffer::Allocate(0);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  auto huge = HostBuffer::Allocate(UINT64_MAX - 5);
  EXPECT_FALSE(huge.ok());
}

}  // namespace
}  // namespace tensorhub
