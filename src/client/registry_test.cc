// Tests of the serving registry: which bytes a read sees, and the fencing
// (Revoke) and draining (Drain) that make Unpublish safe.
#include "client/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "common/clock.h"
#include "common/test_point.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {
namespace {

using std::chrono::milliseconds;

// Timing in these tests (issue 10: the same verdict on an idle fast machine
// and a loaded slow one). A Drain that must succeed gets kGenerousMs: it
// only matters if Drain hangs. Waits for a condition are bounded by it too.
constexpr int64_t kGenerousMs = 30000;

constexpr uint64_t kChunkBytes = 4096;

// One part of random bytes in several tensors, some smaller than a chunk,
// one empty, so reads cross tensor boundaries.
struct Part {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<uint8_t*> bases;
  PartLayout layout;
  std::vector<uint8_t> flat;  // the part's bytes back to back
};

Part MakePart(uint32_t rank, const std::vector<uint64_t>& sizes,
              uint32_t seed) {
  std::mt19937 rng(seed);
  Part p;
  std::vector<TensorRef> refs;
  p.buffers.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    p.buffers[i].resize(sizes[i]);
    for (uint8_t& b : p.buffers[i]) b = static_cast<uint8_t>(rng());
    p.flat.insert(p.flat.end(), p.buffers[i].begin(), p.buffers[i].end());
    TensorRef r;
    r.spec.name = "r" + std::to_string(rank) + ".t" + std::to_string(i);
    r.spec.dtype = DType::kU8;
    r.spec.shape = {sizes[i]};
    r.data = sizes[i] == 0 ? nullptr : p.buffers[i].data();
    r.bytes = sizes[i];
    refs.push_back(r);
    p.bases.push_back(static_cast<uint8_t*>(r.data));
  }
  Result<PartLayout> layout = BuildPartLayout(rank, refs, kChunkBytes);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  p.layout = *layout;
  return p;
}

Holding MakeHolding(const std::string& model, uint64_t version,
                    const Part& part) {
  Holding h;
  h.model = model;
  h.version = Version(version);
  h.group_size = 1;
  h.chunk_bytes = kChunkBytes;
  h.rank = part.layout.rank;
  h.parts[part.layout.rank] = part.layout;
  h.bases[part.layout.rank] = part.bases;
  return h;
}

wire::ReadRequest Req(const std::string& model, uint64_t version,
                      uint64_t epoch, uint32_t part, uint64_t offset,
                      uint64_t length) {
  wire::ReadRequest r;
  r.model = model;
  r.version = version;
  r.epoch = epoch;
  r.part = part;
  r.offset = offset;
  r.length = length;
  return r;
}

std::vector<uint8_t> Gather(const transport::ServeLease& lease) {
  std::vector<uint8_t> out;
  for (const iovec& v : lease.pieces) {
    const auto* b = static_cast<const uint8_t*>(v.iov_base);
    out.insert(out.end(), b, b + v.iov_len);
  }
  return out;
}

const std::vector<uint64_t> kSizes = {5000, 123, 0, 9000, 1, 4096, 777};

TEST(RegistryTest, ServesExactBytesAcrossTensorBoundaries) {
  Part p = MakePart(0, kSizes, 1);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 3, p));
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
  const uint64_t n = p.flat.size();

  // Fixed ranges on and across boundaries, then random ones (seeded).
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, n},       {0, 1},     {4999, 2},  {5000, 123}, {5100, 100}, {5122, 2},
      {5123, 9000}, {14122, 2}, {14123, 1}, {14120, 10}, {n - 1, 1}};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) {
    uint64_t off = rng() % n;
    uint64_t len = 1 + rng() % (n - off);
    ranges.push_back({off, len});
  }
  for (auto [off, len] : ranges) {
    Result<transport::ServeLease> lease =
        reg.BeginRead(Req("m", 3, *epoch, 0, off, len));
    ASSERT_TRUE(lease.ok())
        << off << "+" << len << ": " << lease.status().ToString();
    std::vector<uint8_t> want(p.flat.begin() + off, p.flat.begin() + off + len);
    ASSERT_EQ(Gather(*lease), want) << off << "+" << len;
    // Zero copy: every piece lies inside one of the registered buffers.
    for (const iovec& v : lease->pieces) {
      ASSERT_GT(v.iov_len, 0u);
      const auto* b = static_cast<const uint8_t*>(v.iov_base);
      bool inside = false;
      for (const auto& buf : p.buffers) {
        if (!buf.empty() && b >= buf.data() &&
            b + v.iov_len <= buf.data() + buf.size()) {
          inside = true;
        }
      }
      EXPECT_TRUE(inside) << off << "+" << len;
    }
    EXPECT_EQ(reg.reads_in_flight(), 1u);
  }
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

// Cut-through: a filling registration serves a range inside one chunk once
// the chunk's bytes up to the range's end have landed, before the chunk is
// verified; a failed chunk (landed 0) serves nothing of it again; a range
// across chunks still needs them verified.
TEST(RegistryTest, AFillingHoldingServesWhatLandedOfAChunk) {
  Part p = MakePart(0, kSizes, 9);
  auto filling = [&] {
    Holding h = MakeHolding("m", 1, p);
    h.rank.reset();
    h.manifest = Manifest(1, kChunkBytes, {p.layout});
    h.filling = true;
    return h;
  };
  Registry reg(/*fill_wait_ms=*/1);  // what has not landed never will here
  Result<uint64_t> e = reg.Add(filling());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto code = [&](uint64_t off, uint64_t len) {
    return reg.BeginRead(Req("m", 1, *e, 0, off, len)).status().code();
  };
  EXPECT_EQ(code(0, 1024), StatusCode::kUnavailable);
  reg.MarkLanded("m", Version(1), *e, 0, 2048);
  EXPECT_EQ(code(0, 1024), StatusCode::kOk);
  {
    Result<transport::ServeLease> lease =
        reg.BeginRead(Req("m", 1, *e, 0, 1024, 1024));
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(Gather(*lease), std::vector<uint8_t>(p.flat.begin() + 1024,
                                                   p.flat.begin() + 2048));
  }
  EXPECT_EQ(code(1024, 1025), StatusCode::kUnavailable);  // past what landed
  EXPECT_EQ(code(4000, 200), StatusCode::kUnavailable);   // two chunks
  reg.MarkLanded("m", Version(1), *e, 1, kChunkBytes);
  EXPECT_EQ(code(kChunkBytes, kChunkBytes), StatusCode::kOk);
  reg.MarkLanded("m", Version(1), *e, 0, 0);  // its read failed
  EXPECT_EQ(code(0, 1024), StatusCode::kUnavailable);
  reg.MarkChunk("m", Version(1), *e, 0);
  EXPECT_EQ(code(0, kChunkBytes), StatusCode::kOk);
  // Across chunks: chunk 1 landed whole but is not verified yet.
  EXPECT_EQ(code(4000, 200), StatusCode::kUnavailable);
  reg.MarkChunk("m", Version(1), *e, 1);
  EXPECT_EQ(code(4000, 200), StatusCode::kOk);

  // A read waiting for its bytes is woken when they land.
  Registry waiting(kGenerousMs);
  Result<uint64_t> e2 = waiting.Add(filling());
  ASSERT_TRUE(e2.ok());
  std::thread reader([&] {
    EXPECT_TRUE(waiting.BeginRead(Req("m", 1, *e2, 0, 0, 512)).ok());
  });
  waiting.MarkLanded("m", Version(1), *e2, 0, 512);
  reader.join();
}

TEST(RegistryTest, WrongEpochIsAborted) {
  Part p = MakePart(0, kSizes, 2);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  for (uint64_t bad : {*epoch + 1, *epoch - 1, uint64_t{999}}) {
    Result<transport::ServeLease> lease =
        reg.BeginRead(Req("m", 1, bad, 0, 0, 10));
    ASSERT_FALSE(lease.ok()) << bad;
    EXPECT_EQ(lease.status().code(), StatusCode::kAborted) << bad;
  }
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

TEST(RegistryTest, UnknownModelVersionOrPartIsNotFound) {
  Part p = MakePart(1, kSizes, 3);  // holds part 1 only
  Registry reg;
  Holding h = MakeHolding("m", 5, p);
  h.group_size = 2;
  Result<uint64_t> epoch = reg.Add(std::move(h));
  ASSERT_TRUE(epoch.ok());
  ASSERT_TRUE(reg.BeginRead(Req("m", 5, *epoch, 1, 0, 10)).ok());
  for (const wire::ReadRequest& r :
       {Req("other", 5, *epoch, 1, 0, 10), Req("m", 4, *epoch, 1, 0, 10),
        Req("m", 6, *epoch, 1, 0, 10), Req("m", 5, *epoch, 0, 0, 10),
        Req("m", 5, *epoch, 2, 0, 10)}) {
    Result<transport::ServeLease> lease = reg.BeginRead(r);
    ASSERT_FALSE(lease.ok())
        << r.model << "@" << r.version << " part " << r.part;
    EXPECT_EQ(lease.status().code(), StatusCode::kNotFound)
        << lease.status().ToString();
  }
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

TEST(RegistryTest, ReadPastEndIsInvalidArgument) {
  Part p = MakePart(0, kSizes, 4);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  const uint64_t n = p.flat.size();
  EXPECT_TRUE(reg.BeginRead(Req("m", 1, *epoch, 0, n - 10, 10)).ok());
  for (auto [off, len] :
       std::vector<std::pair<uint64_t, uint64_t>>{{n - 10, 11},
                                                  {n, 1},
                                                  {n + 1, 1},
                                                  {0, n + 1},
                                                  {1, UINT64_MAX},
                                                  {UINT64_MAX, 1}}) {
    Result<transport::ServeLease> lease =
        reg.BeginRead(Req("m", 1, *epoch, 0, off, len));
    ASSERT_FALSE(lease.ok()) << off << "+" << len;
    EXPECT_EQ(lease.status().code(), StatusCode::kInvalidArgument)
        << off << "+" << len;
  }
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

TEST(RegistryTest, RevokeFencesNewReadsAtOnce) {
  Part p = MakePart(0, kSizes, 5);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  Result<transport::ServeLease> held =
      reg.BeginRead(Req("m", 1, *epoch, 0, 0, 100));
  ASSERT_TRUE(held.ok());

  Result<uint64_t> revoked = reg.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  EXPECT_EQ(*revoked, *epoch);
  // A read admitted before the revoke still sees its bytes...
  EXPECT_EQ(Gather(*held),
            std::vector<uint8_t>(p.flat.begin(), p.flat.begin() + 100));
  // ...but no new read is admitted, even with the right epoch.
  Result<transport::ServeLease> late =
      reg.BeginRead(Req("m", 1, *epoch, 0, 0, 100));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg.reads_in_flight(), 1u);

  Result<uint64_t> again = reg.Revoke("m", Version(1));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  Result<uint64_t> unknown = reg.Revoke("zz", Version(1));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
}

TEST(RegistryTest, DrainWaitsForAHeldLease) {
  Part p = MakePart(0, kSizes, 6);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  auto lease = std::make_unique<Result<transport::ServeLease>>(
      reg.BeginRead(Req("m", 1, *epoch, 0, 10, 1000)));
  ASSERT_TRUE(lease->ok());
  ASSERT_TRUE(reg.Revoke("m", Version(1)).ok());

  // The read takes a while: the lease ends 150 ms from now at the earliest
  // (later on a loaded machine, which changes nothing below). Drain's
  // deadline is far beyond: a Drain that missed the release would fail.
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(150));
    released.store(true);
    lease.reset();
  });
  Status s = reg.Drain("m", Version(1), *epoch, Deadline::AfterMs(kGenerousMs));
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Drain may return only after the lease ended.
  EXPECT_TRUE(released.load());
  releaser.join();
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

TEST(RegistryTest, DrainMissesItsDeadlineWhileALeaseIsHeld) {
  Part p = MakePart(0, kSizes, 7);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  std::optional<Result<transport::ServeLease>> lease(
      reg.BeginRead(Req("m", 1, *epoch, 0, 0, 10)));
  ASSERT_TRUE(lease->ok());
  ASSERT_TRUE(reg.Revoke("m", Version(1)).ok());

  // The deadline passes on its own clock, simulated: Drain ends with the
  // lease still held, whatever the machine's load.
  FakeClock clock;
  const Deadline deadline = Deadline::AfterMs(80, clock);
  clock.AdvanceMs(80);
  Status s = reg.Drain("m", Version(1), *epoch, deadline);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_EQ(reg.reads_in_flight(), 1u);

  // Nothing in flight: Drain succeeds without waiting, so even with no time
  // left at all.
  lease.reset();
  s = reg.Drain("m", Version(1), *epoch, Deadline::AfterMs(0));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(RegistryTest, DrainWithoutReadsReturnsAtOnce) {
  Part p = MakePart(0, kSizes, 8);
  Registry reg;
  Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(epoch.ok());
  { ASSERT_TRUE(reg.BeginRead(Req("m", 1, *epoch, 0, 0, 10)).ok()); }
  ASSERT_TRUE(reg.Revoke("m", Version(1)).ok());
  // Without waiting: it succeeds even with no time left at all.
  Status s = reg.Drain("m", Version(1), *epoch, Deadline::AfterMs(0));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(RegistryTest, AddTwiceFailsUntilRevokedThenGetsANewEpoch) {
  Part p = MakePart(0, kSizes, 9);
  Registry reg;
  Result<uint64_t> e1 = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(e1.ok());
  Result<uint64_t> dup = reg.Add(MakeHolding("m", 1, p));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);
  // Another version or model is fine.
  Result<uint64_t> other = reg.Add(MakeHolding("m", 2, p));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *e1);

  // Keep a read of the old epoch in flight across the re-add.
  std::optional<Result<transport::ServeLease>> old_read(
      reg.BeginRead(Req("m", 1, *e1, 0, 0, 10)));
  ASSERT_TRUE(old_read->ok());
  ASSERT_TRUE(reg.Revoke("m", Version(1)).ok());
  Result<uint64_t> e2 = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  EXPECT_NE(*e2, *e1);
  EXPECT_NE(*e2, *other);

  Result<transport::ServeLease> stale =
      reg.BeginRead(Req("m", 1, *e1, 0, 0, 10));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kAborted);
  std::optional<Result<transport::ServeLease>> fresh(
      reg.BeginRead(Req("m", 1, *e2, 0, 0, 10)));
  ASSERT_TRUE(fresh->ok());

  // The old epoch still drains on its own reads, not the new epoch's.
  EXPECT_EQ(reg.Drain("m", Version(1), *e1, Deadline::AfterMs(50)).code(),
            StatusCode::kDeadlineExceeded);
  old_read.reset();
  EXPECT_TRUE(reg.Drain("m", Version(1), *e1, Deadline::AfterMs(0)).ok());
  EXPECT_EQ(reg.reads_in_flight(), 1u);
  fresh.reset();
  EXPECT_EQ(reg.reads_in_flight(), 0u);
}

TEST(RegistryTest, AddRejectsBasesThatDoNotMatchTheLayout) {
  Part p = MakePart(0, kSizes, 10);
  Registry reg;
  Holding h = MakeHolding("m", 1, p);
  h.bases[0].pop_back();
  Result<uint64_t> e = reg.Add(std::move(h));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInternal);
  // Nothing was registered.
  EXPECT_TRUE(reg.Snapshot().empty());
  EXPECT_TRUE(reg.Add(MakeHolding("m", 1, p)).ok());
}

TEST(RegistryTest, OverlappingFindsOnlyRegistrationsThatShareMemory) {
  Part a = MakePart(0, {8192, 100}, 11);
  Part b = MakePart(0, {5000}, 12);
  Registry reg;
  ASSERT_TRUE(reg.Add(MakeHolding("a", 1, a)).ok());
  ASSERT_TRUE(reg.Add(MakeHolding("b", 7, b)).ok());

  using Ranges = std::vector<std::pair<const uint8_t*, uint64_t>>;
  using Keys = std::vector<std::pair<std::string, Version>>;
  const uint8_t* a0 = a.buffers[0].data();
  const uint8_t* a1 = a.buffers[1].data();
  const uint8_t* b0 = b.buffers[0].data();
  std::vector<uint8_t> elsewhere(1000);

  EXPECT_EQ(reg.Overlapping(Ranges{{a0 + 100, 10}}), (Keys{{"a", Version(1)}}));
  EXPECT_EQ(reg.Overlapping(Ranges{{a1 + 99, 1}}), (Keys{{"a", Version(1)}}));
  EXPECT_EQ(reg.Overlapping(Ranges{{b0 + 4999, 50}}),
            (Keys{{"b", Version(7)}}));
  // One byte before the start (ending exactly at it) and right after the end
  // do not overlap; neither do empty ranges or unrelated memory.
  EXPECT_TRUE(reg.Overlapping(Ranges{{b0 - 10, 10}}).empty());
  EXPECT_TRUE(reg.Overlapping(Ranges{{b0 + 5000, 10}}).empty());
  EXPECT_TRUE(reg.Overlapping(Ranges{{b0 + 10, 0}}).empty());
  EXPECT_TRUE(
      reg.Overlapping(Ranges{{elsewhere.data(), elsewhere.size()}}).empty());
  EXPECT_EQ(reg.Overlapping(Ranges{{elsewhere.data(), 10}, {b0, 1}, {a0, 1}}),
            (Keys{{"a", Version(1)}, {"b", Version(7)}}));

  // A revoked registration no longer counts.
  ASSERT_TRUE(reg.Revoke("a", Version(1)).ok());
  EXPECT_TRUE(reg.Overlapping(Ranges{{a0, 8192}}).empty());
}

TEST(RegistryTest, SnapshotAndMarkReported) {
  Part a = MakePart(0, {5000}, 13);
  Registry reg;
  Result<uint64_t> e1 = reg.Add(MakeHolding("a", 1, a));
  Result<uint64_t> e2 = reg.Add(MakeHolding("a", 2, a));
  ASSERT_TRUE(e1.ok() && e2.ok());

  auto find = [&](uint64_t v) -> std::optional<Holding> {
    for (Holding& h : reg.Snapshot()) {
      if (h.model == "a" && h.version == Version(v)) return h;
    }
    return std::nullopt;
  };
  ASSERT_EQ(reg.Snapshot().size(), 2u);
  ASSERT_TRUE(find(1).has_value());
  EXPECT_EQ(find(1)->epoch, *e1);
  EXPECT_EQ(find(2)->epoch, *e2);
  EXPECT_FALSE(find(1)->reported);
  EXPECT_EQ(find(1)->parts.at(0), a.layout);

  reg.MarkReported("a", Version(1), *e1, true);
  EXPECT_TRUE(find(1)->reported);
  EXPECT_FALSE(find(2)->reported);
  // A stale epoch does not touch the live registration.
  reg.MarkReported("a", Version(2), *e1, true);
  EXPECT_FALSE(find(2)->reported);
  reg.MarkReported("a", Version(1), *e1, false);
  EXPECT_FALSE(find(1)->reported);

  ASSERT_TRUE(reg.Revoke("a", Version(1)).ok());
  ASSERT_EQ(reg.Snapshot().size(), 1u);
  EXPECT_FALSE(find(1).has_value());
  // Re-added: a new epoch, not reported, and the old epoch cannot mark it.
  Result<uint64_t> e3 = reg.Add(MakeHolding("a", 1, a));
  ASSERT_TRUE(e3.ok());
  reg.MarkReported("a", Version(1), *e1, true);
  EXPECT_FALSE(find(1)->reported);
  EXPECT_EQ(find(1)->epoch, *e3);
}

// Readers race Revoke+Drain: once Drain returned OK, no reader may still hold
// a lease of that registration or get a new one.
TEST(RegistryTest, NoReadSurvivesASuccessfulDrain) {
  Part p = MakePart(0, kSizes, 14);
  const uint64_t n = p.flat.size();
  for (int round = 0; round < 20; ++round) {
    Registry reg;
    Result<uint64_t> epoch = reg.Add(MakeHolding("m", 1, p));
    ASSERT_TRUE(epoch.ok());
    constexpr int kReaders = 4;
    std::atomic<bool> drained{false};
    std::atomic<bool> stop{false};
    std::atomic<int> violations{0};
    std::atomic<int> served{0};
    // Readers that tried a read begun after the drain returned.
    std::atomic<int> tried_after{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < kReaders; ++t) {
      readers.emplace_back([&, t] {
        std::mt19937_64 rng(round * 100 + t);
        bool counted = false;
        while (!stop.load()) {
          const bool after = drained.load();
          uint64_t off = rng() % n;
          Result<transport::ServeLease> lease =
              reg.BeginRead(Req("m", 1, *epoch, 0, off, 1 + rng() % (n - off)));
          if (after && !counted) {
            counted = true;
            tried_after.fetch_add(1);
          }
          if (!lease.ok()) continue;
          served.fetch_add(1);
          if (drained.load()) violations.fetch_add(1);
          std::this_thread::yield();
          if (drained.load()) violations.fetch_add(1);
        }
      });
    }
    // Let the readers get going before the revoke.
    Deadline start = Deadline::AfterMs(kGenerousMs);
    while (served.load() < 50 && !start.expired()) std::this_thread::yield();
    EXPECT_GE(served.load(), 50);
    EXPECT_TRUE(reg.Revoke("m", Version(1)).ok());
    Status s =
        reg.Drain("m", Version(1), *epoch, Deadline::AfterMs(kGenerousMs));
    drained.store(true);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(reg.reads_in_flight(), 0u);
    // Every reader tries again after the drain (and must be refused), however
    // the threads are scheduled.
    Deadline after = Deadline::AfterMs(kGenerousMs);
    while (tried_after.load() < kReaders && !after.expired())
      std::this_thread::yield();
    EXPECT_EQ(tried_after.load(), kReaders);
    stop.store(true);
    for (std::thread& t : readers) t.join();
    EXPECT_EQ(violations.load(), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace tensorhub::client

namespace tensorhub::client {
namespace {

TEST(RegistryUnreportedTest, ListsOnlyWhatTheHubHasNotAcknowledged) {
  Registry reg;
  std::vector<uint8_t> a(4096), b(4096);
  auto holding = [](const std::string& model, std::vector<uint8_t>& buf) {
    Holding h;
    h.model = model;
    h.version = Version(1);
    h.chunk_bytes = 4096;
    h.rank = 0;
    TensorRef t{{"w", DType::kU8, {buf.size()}},
                buf.data(),
                buf.size(),
                MemoryLocation::Host()};
    h.parts[0] = *BuildPartLayout(0, {&t, 1}, 4096);
    h.bases[0] = {buf.data()};
    return h;
  };
  Result<uint64_t> ea = reg.Add(holding("a", a));
  Result<uint64_t> eb = reg.Add(holding("b", b));
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(reg.Unreported().size(), 2u);
  reg.MarkReported("a", Version(1), *ea, true);
  ASSERT_EQ(reg.Unreported().size(), 1u);
  EXPECT_EQ(reg.Unreported()[0].model, "b");
  reg.MarkReported("b", Version(1), *eb, true);
  EXPECT_TRUE(reg.Unreported().empty());
  reg.MarkAllUnreported();
  EXPECT_EQ(reg.Unreported().size(), 2u);
}

}  // namespace
}  // namespace tensorhub::client

namespace tensorhub::client {
namespace {

// A fetch tells the hub of its destination (BeginFetch) before it can
// register it here: a read of the reserved epoch that arrives first waits
// for the registration, and is served once it is there.
TEST(RegistryTest, AReadOfAReservedEpochWaitsForItsRegistration) {
  Part p = MakePart(0, kSizes, 21);
  Registry reg(kGenerousMs);
  const uint64_t epoch = reg.ReserveEpoch();
  std::promise<void> waiting;
  testpoint::Arm("registry.reserved_read_waits", [&](uint64_t e) {
    if (e == epoch) waiting.set_value();
  });
  std::thread reader([&] {
    Result<transport::ServeLease> lease =
        reg.BeginRead(Req("m", 1, epoch, 0, 0, 100));
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    std::vector<uint8_t> got = Gather(*lease);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), p.flat.begin()));
  });
  waiting.get_future().wait();
  testpoint::Disarm("registry.reserved_read_waits");
  Holding h = MakeHolding("m", 1, p);
  h.epoch = epoch;
  Result<uint64_t> added = reg.Add(std::move(h));
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(*added, epoch);
  reader.join();
  // An epoch no one reserved is not taken.
  Holding other = MakeHolding("m", 2, p);
  other.epoch = epoch + 100;
  EXPECT_EQ(reg.Add(std::move(other)).status().code(), StatusCode::kInternal);
}

TEST(RegistryTest, AReadOfACancelledReservationIsRefused) {
  Part p = MakePart(0, kSizes, 22);
  Registry reg(kGenerousMs);
  const uint64_t epoch = reg.ReserveEpoch();
  std::promise<void> waiting;
  testpoint::Arm("registry.reserved_read_waits", [&](uint64_t e) {
    if (e == epoch) waiting.set_value();
  });
  std::thread reader([&] {
    EXPECT_EQ(reg.BeginRead(Req("m", 1, epoch, 0, 0, 100)).status().code(),
              StatusCode::kNotFound);
  });
  waiting.get_future().wait();
  testpoint::Disarm("registry.reserved_read_waits");
  reg.CancelReservation(epoch);
  reader.join();
}

// wire::kManifestPart: a trainer that published the whole version alone, and a
// reader that fetched one, serve the manifest as the hub encodes it; a
// trainer rank of a group (its part only) refuses; a read past its end is
// refused. The bytes outlive an unpublish of the memory (they are the
// registry's own, pinned by the lease).
TEST(RegistryTest, ServesTheWholeManifestAsTheHubEncodesIt) {
  Registry reg;
  Part p = MakePart(0, kSizes, 11);
  const Manifest whole(1, kChunkBytes, {p.layout});
  const std::string expect = wire::EncodeManifest(whole);
  Result<uint64_t> trainer = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(trainer.ok());
  Result<transport::ServeLease> lease = reg.BeginRead(
      Req("m", 1, *trainer, wire::kManifestPart, 0, expect.size()));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::vector<uint8_t> got = Gather(*lease);
  EXPECT_EQ(std::string(got.begin(), got.end()), expect);
  EXPECT_EQ(reg.BeginRead(
                   Req("m", 1, *trainer, wire::kManifestPart, 1, expect.size()))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  // Served bytes are not the published memory: an unpublish drains at once.
  ASSERT_TRUE(reg.Revoke("m", Version(1)).ok());
  EXPECT_TRUE(reg.Drain("m", Version(1), *trainer, Deadline::AfterMs(0)).ok());
  EXPECT_EQ(Gather(*lease), got);

  // A reader's holding: the full manifest it fetched.
  Holding reader = MakeHolding("m", 2, p);
  reader.rank.reset();
  reader.manifest = whole;
  Result<uint64_t> e2 = reg.Add(std::move(reader));
  ASSERT_TRUE(e2.ok());
  lease =
      reg.BeginRead(Req("m", 2, *e2, wire::kManifestPart, 0, expect.size()));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::vector<uint8_t> got2 = Gather(*lease);
  EXPECT_EQ(std::string(got2.begin(), got2.end()), expect);

  // Rank 0 of a group of two knows its part only.
  Holding rank0 = MakeHolding("m", 3, p);
  rank0.group_size = 2;
  Result<uint64_t> e3 = reg.Add(std::move(rank0));
  ASSERT_TRUE(e3.ok());
  EXPECT_EQ(reg.BeginRead(Req("m", 3, *e3, wire::kManifestPart, 0, 1))
                .status()
                .code(),
            StatusCode::kNotFound);
}

// The manifest is encoded outside the registry's lock: while a manifest
// read is held there, a chunk read of another registration is admitted and
// the registration is revoked; the manifest read then refuses (ABORTED),
// as any read of a revoked registration does.
TEST(RegistryTest, EncodesTheManifestOutsideTheLock) {
  Registry reg;
  Part p = MakePart(0, kSizes, 11);
  Result<uint64_t> trainer = reg.Add(MakeHolding("m", 1, p));
  ASSERT_TRUE(trainer.ok());
  Result<uint64_t> other = reg.Add(MakeHolding("m", 2, p));
  ASSERT_TRUE(other.ok());
  std::promise<void> encoding, go_on;
  std::shared_future<void> released = go_on.get_future().share();
  testpoint::Arm("registry.manifest_encoding", [&](uint64_t e) {
    if (e != *trainer) return;
    encoding.set_value();
    released.wait_for(std::chrono::seconds(60));
  });
  auto manifest_read = std::async(std::launch::async, [&] {
    return reg.BeginRead(Req("m", 1, *trainer, wire::kManifestPart, 0, 1))
        .status()
        .code();
  });
  ASSERT_EQ(encoding.get_future().wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  // With the lock held by the encoding these would wait for it.
  auto chunk_read = std::async(std::launch::async, [&] {
    return reg.BeginRead(Req("m", 2, *other, 0, 0, 100)).ok() &&
           reg.Revoke("m", Version(1)).ok();
  });
  ASSERT_EQ(chunk_read.wait_for(std::chrono::seconds(60)),
            std::future_status::ready)
      << "a read waited for the manifest's encoding";
  EXPECT_TRUE(chunk_read.get());
  go_on.set_value();
  ASSERT_EQ(manifest_read.wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  EXPECT_EQ(manifest_read.get(), StatusCode::kAborted);
  testpoint::Disarm("registry.manifest_encoding");
}

}  // namespace
}  // namespace tensorhub::client
