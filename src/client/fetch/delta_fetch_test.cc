// Deltas on slow links, end to end in one process (docs/design.md, "Deltas
// on slow links"): real Clients on one FakeTransport and one in-memory hub
// (the hub's own state machine), on a simulated clock. A trainer in
// datacenter "a" publishes version 1, then version 2 (a small step of bf16
// weights) while it still holds 1, so it computes their delta, once; a
// reader in datacenter "b" that holds version 1 fetches version 2 through
// it. Each fault of issue 29 (the reader lost its base, the delta's holder
// breaks mid-read, a corrupt delta or index, a base changed after publish,
// on either side) ends in exactly version 2's bytes: what the delta could
// not give is read whole. Faults land at known points (the fake
// transport's fault table, a test point), never after a delay.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client_deps.h"
#include "client/delta_maker.h"
#include "client/fetch/fetcher.h"
#include "client/in_memory_hub.h"
#include "common/clock.h"
#include "common/test_point.h"
#include "tensorhub/client.h"
#include "transport/fake/fake_transport.h"
#include "wire/frame.h"

namespace tensorhub::client {
namespace {

using transport::FakeTransport;
using transport::Fault;
using transport::FaultWhat;
using transport::FaultWhere;
using Bytes = std::vector<uint8_t>;

constexpr char kModel[] = "m";
constexpr uint64_t kChunkBytes = 4 * kMinChunkBytes;  // 16 KiB
constexpr uint64_t kWeights = 256 * 1024;             // bf16: 32 chunks

// A version's bytes: a bf16 matrix and a small bf16 vector.
struct Weights {
  Bytes w, n;
  std::vector<TensorRef> Refs() {
    return {{{"w", DType::kBF16, {kWeights}}, w.data(), w.size(), {}},
            {{"n", DType::kBF16, {96}}, n.data(), n.size(), {}}};
  }
  uint64_t bytes() const { return w.size() + n.size(); }
  bool operator==(const Weights&) const = default;
};

class DeltaFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(29);
    v1_.w.resize(2 * kWeights);
    v1_.n.resize(2 * 96);
    for (uint8_t& b : v1_.w) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : v1_.n) b = static_cast<uint8_t>(rng());
    // One RL step: about 2% of the elements move by a unit in the last
    // place.
    v2_ = v1_;
    for (size_t e = 0; e < kWeights; ++e) {
      if (rng() % 50 != 0) continue;
      uint16_t x;
      std::memcpy(&x, v2_.w.data() + 2 * e, 2);
      x = static_cast<uint16_t>(x + ((rng() & 1) ? 1 : -1));
      std::memcpy(v2_.w.data() + 2 * e, &x, 2);
    }
    v2_.n[4] ^= 1;
  }
  void TearDown() override { testpoint::Disarm("delta_reads.delta_read"); }

  std::unique_ptr<Client> Join(const std::string& name, const std::string& dc,
                               const DeltaOptions& deltas = {}) {
    ClientOptions o;
    o.name = name;
    o.labels.datacenter = dc;
    o.deltas = deltas;
    o.heartbeat_interval_ms = 3600 * 1000;  // no heartbeat during a test
    o.leave_timeout_ms = 0;
    ClientDeps deps;
    deps.transport =
        std::make_unique<transport::SharedFakeTransport>(transport_);
    deps.control = hub_.Connect(std::make_shared<HubCallCounts>());
    deps.clock = &clock_;
    Result<std::unique_ptr<Client>> c =
        ClientFactory::Connect(o, std::move(deps));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // A worker of datacenter `dc` that has fetched version 1 (and serves
  // it); null (the test failed) if it could not.
  std::unique_ptr<Client> JoinHoldingVersion1(const std::string& name,
                                              const std::string& dc,
                                              const DeltaOptions& deltas = {}) {
    std::unique_ptr<Client> c = Join(name, dc, deltas);
    Weights* base = nullptr;
    if (c == nullptr || !Fetch(*c, 1, &base).ok()) return nullptr;
    return c;
  }

  void Publish(Client& c, uint64_t version, Weights& w) {
    PublishOptions po;
    po.chunk_bytes = chunk_bytes_;
    ASSERT_TRUE(c.Publish(kModel, Version(version), w.Refs(), po).ok());
  }

  // Fetches `version` into a fresh copy the reader keeps (and serves);
  // returns the copy in *out.
  Result<FetchStats> Fetch(Client& c, uint64_t version, Weights** out) {
    Weights& dest = copies_.emplace_back();
    dest.w.assign(v1_.w.size(), 0);
    dest.n.assign(v1_.n.size(), 0);
    *out = &dest;
    FetchOptions fo;
    fo.connections = 1;     // one stream: the faults below land in order
    fo.timeout_ms = 60000;  // simulated
    return c.Fetch(kModel, Version(version), dest.Refs(), fo);
  }

  // Waits (real time) until the worker's delta maker is idle.
  static void WaitForDeltas(Client& c) {
    ASSERT_TRUE(ClientFactory::Deltas(c).WaitIdle(
        Deadline::AfterMs(60000, Clock::Real())));
  }

  // The trainer publishes 1 and then 2, holding both: it makes the delta.
  // The reader (datacenter "b") fetches 1 first.
  void TrainerAndReader() {
    trainer_ = Join("trainer", "a");
    ASSERT_NE(trainer_, nullptr);
    Publish(*trainer_, 1, v1_);
    reader_ = Join("reader", "b");
    ASSERT_NE(reader_, nullptr);
    Weights* got = nullptr;
    ASSERT_TRUE(Fetch(*reader_, 1, &got).ok());
    reader_base_ = got;
    ASSERT_EQ(*got, v1_);
    Publish(*trainer_, 2, v2_);
    WaitForDeltas(*trainer_);
    ASSERT_EQ(ClientFactory::Deltas(*trainer_).made(), 1u);
  }

  uint64_t Chunks() const {
    return (v2_.bytes() + chunk_bytes_ - 1) / chunk_bytes_;
  }
  void ExpectCorruptNeverTaken(FaultWhere where, uint32_t part);

  uint64_t chunk_bytes_ = kChunkBytes;
  FakeClock clock_{0, FakeClock::Mode::kAdvanceOnWait};
  FakeTransport transport_;
  InMemoryHub hub_{clock_};
  Weights v1_, v2_;
  std::deque<Weights> copies_;  // what readers fetched (and serve)
  std::unique_ptr<Client> trainer_, reader_;
  Weights* reader_base_ = nullptr;
};

TEST_F(DeltaFetchTest, RemoteReaderHoldingTheBaseReadsTheDeltaBitExact) {
  TrainerAndReader();
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->delta_base, Version(1));
  EXPECT_EQ(st->bytes_from_delta, v2_.bytes());
  EXPECT_EQ(st->delta_chunks_read_whole, 0u);
  // About 2% of the elements changed: the delta is a few percent of S.
  EXPECT_GT(st->delta_wire_bytes, 0u);
  EXPECT_LT(st->delta_wire_bytes, v2_.bytes() / 8);
  ASSERT_EQ(st->sources.size(), 1u);
  EXPECT_EQ(st->sources[0].address, trainer_->data_address());
  EXPECT_EQ(st->sources[0].delta_bytes, v2_.bytes());
  EXPECT_EQ(st->sources[0].delta_wire_bytes, st->delta_wire_bytes);
  // Computed once per (base, version) and datacenter: the reader, the
  // first of datacenter "b" and now holding both, makes it for its peers
  // (the hub claimed it for it when it pointed it at the trainer's); a
  // worker of datacenter "a" holding both is told the trainer has it.
  WaitForDeltas(*reader_);
  EXPECT_EQ(ClientFactory::Deltas(*reader_).made(), 1u);
  EXPECT_EQ(ClientFactory::Deltas(*reader_).as_received(), 1u);
  std::unique_ptr<Client> near = JoinHoldingVersion1("near", "a");
  ASSERT_NE(near, nullptr);
  ASSERT_TRUE(Fetch(*near, 2, &got).ok());
  WaitForDeltas(*near);
  EXPECT_EQ(ClientFactory::Deltas(*near).made(), 0u);
  EXPECT_EQ(ClientFactory::Deltas(*near).refused(), 1u);
}

// Chunks larger than a cut-through piece (fetcher.h): a reader that serves
// onward reads whole chunks piece by piece, but a chunk it reads through a
// delta comes as the delta (the pieces' path must not take it first).
TEST_F(DeltaFetchTest, ChunksLargerThanACutThroughPieceComeAsTheDelta) {
  chunk_bytes_ = 2 * kDefaultCutThroughBytes;
  ASSERT_GT(v2_.bytes(), chunk_bytes_);
  TrainerAndReader();
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->delta_base, Version(1));
  EXPECT_EQ(st->bytes_from_delta, v2_.bytes());
  EXPECT_EQ(st->delta_chunks_read_whole, 0u);
}

TEST_F(DeltaFetchTest, ReaderInTheSameDatacenterReadsWholeChunks) {
  TrainerAndReader();
  std::unique_ptr<Client> near = JoinHoldingVersion1("near", "a");
  ASSERT_NE(near, nullptr);
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*near, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  // Offered, but on a datacenter's link full chunks win.
  EXPECT_EQ(st->bytes_from_delta, 0u);
  EXPECT_EQ(st->delta_wire_bytes, 0u);
}

TEST_F(DeltaFetchTest, SecondReaderOfTheRemoteDatacenterReadsTheFirstOne) {
  // The delta crosses the link once per datacenter: the next reader there
  // is sent to the first, whole chunks on the local link.
  TrainerAndReader();
  std::unique_ptr<Client> peer = JoinHoldingVersion1("peer", "b");
  ASSERT_NE(peer, nullptr);
  Weights* got = nullptr;
  ASSERT_TRUE(Fetch(*reader_, 2, &got).ok());
  Result<FetchStats> st = Fetch(*peer, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->bytes_from_delta, 0u);
  for (const FetchSourceStats& s : st->sources) {
    EXPECT_NE(s.address, trainer_->data_address()) << "crossed the link again";
  }
}

TEST_F(DeltaFetchTest, PeersBehindASlowLocalLinkReadTheDeltaTheFirstMade) {
  // Datacenter "b"'s links are slow enough for a delta to win there too:
  // its first reader, which read the delta across the wide-area link,
  // makes it for its datacenter, and its peer reads that delta from it
  // alone, never from across the link.
  TrainerAndReader();
  DeltaOptions slow;
  slow.datacenter_link_bytes_per_s = 1.25e8;  // 1 Gbit/s
  std::unique_ptr<Client> peer = JoinHoldingVersion1("peer", "b", slow);
  ASSERT_NE(peer, nullptr);
  Weights* got = nullptr;
  ASSERT_TRUE(Fetch(*reader_, 2, &got).ok());
  WaitForDeltas(*reader_);
  ASSERT_EQ(ClientFactory::Deltas(*reader_).made(), 1u);
  // Served as it came (every chunk of it checked there), not computed.
  EXPECT_EQ(ClientFactory::Deltas(*reader_).as_received(), 1u);
  Result<FetchStats> st = Fetch(*peer, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->delta_base, Version(1));
  EXPECT_EQ(st->bytes_from_delta, v2_.bytes());
  EXPECT_LT(st->delta_wire_bytes, v2_.bytes() / 8);
  ASSERT_EQ(st->sources.size(), 1u);
  EXPECT_EQ(st->sources[0].address, reader_->data_address());
}

TEST_F(DeltaFetchTest, ReaderThatLostItsBaseReadsTheRestWhole) {
  TrainerAndReader();
  // The reader unpublishes its base as the first delta arrives: that chunk
  // and every later one come whole.
  testpoint::Arm("delta_reads.delta_read", [&](uint64_t) {
    testpoint::Disarm("delta_reads.delta_read");
    ASSERT_TRUE(reader_->Unpublish(kModel, Version(1), 10000).ok());
  });
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->bytes_from_delta, 0u);
  EXPECT_EQ(st->delta_chunks_read_whole, Chunks());
}

TEST_F(DeltaFetchTest, DeltaHolderThatBreaksMidReadIsReplacedByAFullCopy) {
  TrainerAndReader();
  // Another full copy in the trainer's datacenter, with no delta.
  std::unique_ptr<Client> full = Join("full", "a");
  Weights* copy = nullptr;
  ASSERT_TRUE(Fetch(*full, 2, &copy).ok());
  // The trainer's connection breaks in the middle of the third chunk delta
  // it sends, and of every one after.
  transport_.Inject(Fault{trainer_->data_address(), FaultWhere::kMidChunk,
                          FaultWhat::kClose, 2, -1, wire::kDeltaPart});
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->bytes_from_delta, 2 * kChunkBytes);
  EXPECT_GE(st->chunk_retries, 1u);
  uint64_t from_full = 0;
  for (const FetchSourceStats& s : st->sources) {
    if (s.address == full->data_address()) from_full += s.bytes;
  }
  EXPECT_EQ(from_full + st->bytes_from_delta, v2_.bytes());
}

// Every read of the delta part (or of the index) from the trainer comes
// with a byte flipped: no chunk is taken from it, every one comes whole.
void DeltaFetchTest::ExpectCorruptNeverTaken(FaultWhere where, uint32_t part) {
  TrainerAndReader();
  transport_.Inject(
      Fault{trainer_->data_address(), where, FaultWhat::kCorrupt, 0, -1, part});
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->bytes_from_delta, 0u);
  EXPECT_EQ(st->delta_chunks_read_whole, Chunks());
  // Nothing of a corrupt delta is served onward: the reader, the first of
  // its datacenter, computes the delta it serves from its own copies.
  WaitForDeltas(*reader_);
  EXPECT_EQ(ClientFactory::Deltas(*reader_).as_received(), 0u);
}

TEST_F(DeltaFetchTest, CorruptDeltaHeaderIsNeverTaken) {
  ExpectCorruptNeverTaken(FaultWhere::kReadBody, wire::kDeltaPart);
}

TEST_F(DeltaFetchTest, CorruptDeltaStreamsAreNeverTaken) {
  ExpectCorruptNeverTaken(FaultWhere::kMidChunk, wire::kDeltaPart);
}

TEST_F(DeltaFetchTest, CorruptDeltaIndexIsNeverTaken) {
  ExpectCorruptNeverTaken(FaultWhere::kReadBody, wire::kDeltaIndexPart);
}

TEST_F(DeltaFetchTest, BaseChangedAtTheReaderGivesThatChunkWhole) {
  TrainerAndReader();
  // The reader's copy of version 1 was written after it was fetched (it
  // still serves it: the caller broke the contract): the delta of that
  // chunk decodes, but not to version 2's bytes.
  reader_base_->w[3 * kChunkBytes + 10] ^= 0x80;
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->delta_chunks_read_whole, 1u);
  EXPECT_EQ(st->bytes_from_delta, v2_.bytes() - kChunkBytes);
}

TEST_F(DeltaFetchTest, BaseChangedAtTheTrainerGetsNoDeltaOfThatChunk) {
  trainer_ = Join("trainer", "a");
  Publish(*trainer_, 1, v1_);
  reader_ = Join("reader", "b");
  Weights* base = nullptr;
  ASSERT_TRUE(Fetch(*reader_, 1, &base).ok());
  // The trainer writes into version 1 while it is still published; the
  // delta made from that memory would carry the change to every reader.
  v1_.w[5 * kChunkBytes + 1] ^= 0x01;
  Publish(*trainer_, 2, v2_);
  WaitForDeltas(*trainer_);
  Weights* got = nullptr;
  Result<FetchStats> st = Fetch(*reader_, 2, &got);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*got, v2_);
  EXPECT_EQ(st->delta_chunks_read_whole, 1u);
  EXPECT_EQ(st->bytes_from_delta, v2_.bytes() - kChunkBytes);
}

}  // namespace
}  // namespace tensorhub::client
