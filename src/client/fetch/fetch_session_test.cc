// One fetch, one conversation with the hub, whatever kind of fetch it is.
//
// Workers here are real Clients on one FakeTransport and one in-memory hub
// (the hub's own state machine, client/in_memory_hub.h), on a simulated
// clock: trainers publish, a reader fetches, and the hub counts each
// worker's calls. What is checked is what a user sees: how many hub calls a
// fetch costs (exactly one BeginFetch, no forced unpublish, sharded or
// not), its metrics, its FetchStats, and what `tensorhub top` shows of it
// (the hub's snapshot: the fetch in flight, then its sources' rates).
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client_deps.h"
#include "client/in_memory_hub.h"
#include "common/clock.h"
#include "common/geometry.h"
#include "common/test_point.h"
#include "tensorhub/client.h"
#include "transport/fake/fake_transport.h"

namespace tensorhub::client {
namespace {

using transport::FakeTransport;
using Bytes = std::vector<uint8_t>;

constexpr char kModel[] = "m";

// A logical tensor of random bytes, row-major over `shape`.
struct Logical {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  Bytes data;
};

Logical MakeLogical(std::string name, std::vector<uint64_t> shape,
                    std::mt19937_64& rng) {
  Logical t{std::move(name), DType::kF32, std::move(shape), {}};
  uint64_t n = DTypeBytes(t.dtype);
  for (uint64_t d : t.shape) n *= d;
  t.data.resize(n);
  for (uint8_t& b : t.data) b = static_cast<uint8_t>(rng());
  return t;
}

// The bytes of `box` of `t`, row-major over the box's extents.
Bytes Cut(const Logical& t, const Box& box) {
  const uint64_t elem = DTypeBytes(t.dtype);
  Bytes out(box.Elements() * elem);
  for (const StridedRun& r : PlanCopy(box, Box::Whole(t.shape), box, elem)) {
    for (uint64_t i = 0; i < r.count; ++i) {
      std::memcpy(out.data() + r.dst_offset + i * r.dst_stride,
                  t.data.data() + r.src_offset + i * r.src_stride, r.run_bytes);
    }
  }
  return out;
}

TensorRef Ref(const std::string& name, DType dtype, std::vector<uint64_t> shape,
              Bytes& bytes) {
  TensorRef r;
  r.spec = {name, dtype, std::move(shape)};
  r.data = bytes.data();
  r.bytes = bytes.size();
  return r;
}

class FetchSessionTest : public ::testing::Test {
 protected:
  struct Worker {
    std::unique_ptr<Client> client;
    std::shared_ptr<HubCallCounts> calls;
  };

  void TearDown() override { testpoint::Disarm("fetcher.slice_done"); }

  Worker Join(const std::string& name) {
    ClientOptions o;
    o.name = name;
    o.heartbeat_interval_ms = 3600 * 1000;  // no heartbeat during a test
    o.leave_timeout_ms = 0;
    ClientDeps deps;
    deps.transport =
        std::make_unique<transport::SharedFakeTransport>(transport_);
    auto calls = std::make_shared<HubCallCounts>();
    deps.control = hub_.Connect(calls);
    deps.clock = &clock_;
    Result<std::unique_ptr<Client>> c =
        ClientFactory::Connect(o, std::move(deps));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return {c.ok() ? std::move(c).value() : nullptr, calls};
  }

  // kModel@1 from one trainer, whole tensors.
  void PublishWhole() {
    std::mt19937_64 rng(11);
    logical_ = {MakeLogical("x", {3000}, rng), MakeLogical("y", {40, 33}, rng)};
    Worker t = Join("trainer");
    ASSERT_NE(t.client, nullptr);
    std::vector<TensorRef> refs;
    for (Logical& l : logical_) {
      refs.push_back(Ref(l.name, l.dtype, l.shape, l.data));
    }
    PublishOptions po;
    po.chunk_bytes = kMinChunkBytes;
    ASSERT_TRUE(t.client->Publish(kModel, Version(1), refs, po).ok());
    trainers_.push_back(std::move(t));
  }

  // kModel@1 as pieces: two trainer ranks, each half of every tensor's
  // rows, with segment checksums.
  void PublishSharded() {
    std::mt19937_64 rng(12);
    logical_ = {MakeLogical("w", {64, 48}, rng), MakeLogical("b", {40}, rng)};
    for (uint32_t rank = 0; rank < 2; ++rank) {
      Worker t = Join("trainer" + std::to_string(rank));
      ASSERT_NE(t.client, nullptr);
      PublishOptions po;
      po.rank = rank;
      po.group_size = 2;
      po.chunk_bytes = kMinChunkBytes;
      po.segment_bytes = 512;
      std::vector<TensorRef> refs;
      for (const Logical& l : logical_) {
        Box box = Box::Whole(l.shape);
        box.extent[0] /= 2;
        box.offset[0] = rank * box.extent[0];
        piece_bytes_.push_back(Cut(l, box));
        refs.push_back(Ref(l.name, l.dtype, box.extent, piece_bytes_.back()));
        po.pieces[l.name] = TensorPiece{l.shape, box.offset};
      }
      ASSERT_TRUE(t.client->Publish(kModel, Version(1), refs, po).ok());
      trainers_.push_back(std::move(t));
    }
  }

  // Fetches all of kModel@1 into dest_ (logical tensors), one stream.
  Result<FetchStats> FetchWhole(Client& c, bool serve) {
    RetireDest();
    std::vector<TensorRef> refs;
    for (const Logical& l : logical_) dest_.push_back(Bytes(l.data.size()));
    for (size_t i = 0; i < logical_.size(); ++i) {
      refs.push_back(Ref(logical_[i].name, logical_[i].dtype, logical_[i].shape,
                         dest_[i]));
    }
    FetchOptions fo;
    fo.connections = 1;
    fo.timeout_ms = 60000;  // simulated
    fo.serve = serve;
    return c.Fetch(kModel, Version(1), refs, fo);
  }

  // Fetches a box of each sharded tensor that crosses both ranks' pieces.
  Result<FetchStats> FetchSomeSlices(Client& c) {
    boxes_ = {Box{{16, 8}, {32, 32}}, Box{{10}, {20}}};
    RetireDest();
    std::vector<TensorSlice> slices;
    for (size_t i = 0; i < logical_.size(); ++i) {
      dest_.push_back(Bytes(boxes_[i].Elements() * 4));
    }
    for (size_t i = 0; i < logical_.size(); ++i) {
      slices.push_back(
          {Ref(logical_[i].name, logical_[i].dtype, boxes_[i].extent, dest_[i]),
           boxes_[i],
           {}});
    }
    FetchOptions fo;
    fo.connections = 1;
    fo.timeout_ms = 60000;  // simulated
    return c.FetchSlices(kModel, Version(1), slices, fo);
  }

  // An earlier reader that serves what it fetched serves it from dest_'s
  // buffers: they stay alive to the end of the test, as a real reader's
  // memory stays until it unpublishes.
  void RetireDest() {
    for (Bytes& b : dest_) retired_.push_back(std::move(b));
    dest_.clear();
  }

  void ExpectSlicesArrived() const {
    ASSERT_EQ(dest_.size(), logical_.size());
    for (size_t i = 0; i < logical_.size(); ++i) {
      EXPECT_EQ(dest_[i], Cut(logical_[i], boxes_[i])) << logical_[i].name;
    }
  }
  void ExpectWholeArrived() const {
    ASSERT_EQ(dest_.size(), logical_.size());
    for (size_t i = 0; i < logical_.size(); ++i) {
      EXPECT_EQ(dest_[i], logical_[i].data) << logical_[i].name;
    }
  }

  FakeClock clock_{0, FakeClock::Mode::kAdvanceOnWait};
  FakeTransport transport_;
  InMemoryHub hub_{clock_};
  std::vector<Logical> logical_;
  std::vector<Bytes>
      piece_bytes_;  // what the trainers serve (stable: reserved)
  std::vector<Worker> trainers_;
  std::vector<Box> boxes_;
  std::vector<Bytes> dest_;
  std::deque<Bytes> retired_;  // earlier fetches' buffers, still served

  void SetUp() override { piece_bytes_.reserve(16); }
};

std::string MetricsText(Client& c) { return ClientFactory::MetricsText(c); }

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

// A whole fetch that serves what it gets: BeginFetch (resolve, filling
// registration, first sources) and the report of the complete copy, which
// also ends the fetch at the hub. Without serving: BeginFetch and FetchDone.
TEST_F(FetchSessionTest, AWholeFetchIsOneBeginFetchAndOneReport) {
  PublishWhole();
  Worker r = Join("reader");
  ASSERT_NE(r.client, nullptr);
  r.calls->Reset();
  Result<FetchStats> st = FetchWhole(*r.client, /*serve=*/true);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectWholeArrived();
  const std::string calls = r.calls->ToString();
  EXPECT_EQ((*r.calls)["BeginFetch"], 1) << calls;
  EXPECT_EQ((*r.calls)["AddHolder"], 1) << calls;
  EXPECT_EQ((*r.calls)["FetchDone"], 0) << calls;
  EXPECT_EQ((*r.calls)["Unpublish(force)"], 0) << calls;
  EXPECT_EQ((*r.calls)["Resolve"], 0) << calls;

  Worker q = Join("reader-not-serving");
  ASSERT_NE(q.client, nullptr);
  q.calls->Reset();
  st = FetchWhole(*q.client, /*serve=*/false);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ((*q.calls)["BeginFetch"], 1) << q.calls->ToString();
  EXPECT_EQ((*q.calls)["FetchDone"], 1) << q.calls->ToString();
  EXPECT_EQ((*q.calls)["AddHolder"], 0) << q.calls->ToString();
  EXPECT_EQ((*q.calls)["Unpublish(force)"], 0) << q.calls->ToString();
}

// A whole fetch of a version published as pieces reads slices (whole
// logical tensors) in the same conversation: one BeginFetch, no filling
// registration to withdraw (the hub takes none for a version of pieces),
// FetchDone at the end. Counted once in the metrics.
TEST_F(FetchSessionTest, AWholeFetchOfPiecesIsOneBeginFetch) {
  PublishSharded();
  Worker r = Join("reader");
  ASSERT_NE(r.client, nullptr);
  r.calls->Reset();
  Result<FetchStats> st = FetchWhole(*r.client, /*serve=*/true);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectWholeArrived();
  const std::string calls = r.calls->ToString();
  EXPECT_EQ((*r.calls)["BeginFetch"], 1) << calls;
  EXPECT_EQ((*r.calls)["Unpublish(force)"], 0) << calls;
  EXPECT_EQ((*r.calls)["Unpublish"], 0) << calls;
  EXPECT_EQ((*r.calls)["Resolve"], 0) << calls;
  EXPECT_EQ((*r.calls)["FetchDone"], 1) << calls;
  EXPECT_EQ((*r.calls)["AddHolder"], 0) << calls;
  // The hub never took the reader as a (filling) holder of the version.
  const HubSnapshot snap = hub_.Snapshot();
  ASSERT_EQ(snap.models.size(), 1u);
  ASSERT_EQ(snap.models[0].versions.size(), 1u);
  EXPECT_EQ(snap.models[0].versions[0].holders_filling, 0u);
  const std::string text = MetricsText(*r.client);
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"ok\"} 1")) << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"error\"} 0"));
  EXPECT_EQ(st->bytes, logical_[0].data.size() + logical_[1].data.size());
}

// A fetch of slices: one BeginFetch, at most one schedule naming its boxes
// (so that holders of slices come first), one FetchDone.
TEST_F(FetchSessionTest, AFetchOfSlicesIsOneBeginFetch) {
  PublishSharded();
  Worker r = Join("reader");
  ASSERT_NE(r.client, nullptr);
  r.calls->Reset();
  Result<FetchStats> st = FetchSomeSlices(*r.client);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectSlicesArrived();
  const std::string calls = r.calls->ToString();
  EXPECT_EQ((*r.calls)["BeginFetch"], 1) << calls;
  EXPECT_LE((*r.calls)["ScheduleSlices"], 1) << calls;
  EXPECT_EQ((*r.calls)["FetchDone"], 1) << calls;
  EXPECT_EQ((*r.calls)["Unpublish(force)"], 0) << calls;
  EXPECT_EQ((*r.calls)["Resolve"], 0) << calls;
}

// A fetch of slices is a fetch to the metrics: counted by outcome, its
// chunks and bytes counted, one observation per stage; its FetchStats
// carry every stage (adding up to total_seconds) and each source's
// transport.
TEST_F(FetchSessionTest, SliceFetchesAreCountedAndTimedLikeAnyFetch) {
  PublishSharded();
  Worker r = Join("reader");
  ASSERT_NE(r.client, nullptr);
  Result<FetchStats> st = FetchSomeSlices(*r.client);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectSlicesArrived();

  EXPECT_GT(st->total_seconds, 0);
  const double stages[] = {st->resolve_seconds,    st->schedule_seconds,
                           st->first_byte_seconds, st->transfer_seconds,
                           st->verify_seconds,     st->register_seconds};
  double sum = 0;
  for (double s : stages) {
    EXPECT_GE(s, 0);
    sum += s;
  }
  EXPECT_GT(sum, 0);
  EXPECT_LE(sum, st->total_seconds + 1e-6);
  EXPECT_LE(st->seconds, st->total_seconds);
  ASSERT_FALSE(st->sources.empty());
  for (const FetchSourceStats& s : st->sources) {
    EXPECT_EQ(s.transport, "tcp") << s.address;
  }

  const std::string text = MetricsText(*r.client);
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"ok\"} 1")) << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetched_bytes_total{path=\"tcp\"} " +
                            std::to_string(st->bytes)))
      << text;
  EXPECT_FALSE(Has(text, "tensorhub_fetched_chunks_total 0")) << text;
  for (const char* stage : {"resolve", "schedule", "first_byte", "transfer",
                            "verify", "register"}) {
    EXPECT_TRUE(Has(text, "tensorhub_fetch_stage_seconds_count{stage=\"" +
                              std::string(stage) + "\"} 1"))
        << stage;
  }
}

// `tensorhub top` shows a fetch of slices: while it runs, the hub's
// snapshot lists it with the bytes it reads (its reports, once a second of
// its clock); when it is over, its final report gives each source's rate
// (the snapshot's slowest holders).
TEST_F(FetchSessionTest, ASliceFetchShowsInTop) {
  PublishSharded();
  Worker r = Join("reader");
  ASSERT_NE(r.client, nullptr);
  // After the first read landed, the read waits until the reader reported
  // its progress, while time passes on the fetch's clock: 1.1 s at a time
  // (the report is due once a second of it), each given up to 200 ms of
  // real time to show, then 10 s more for a loaded machine.
  bool reported = false;
  HubSnapshot during;
  testpoint::Arm("fetcher.slice_done", [&](uint64_t done) {
    if (done != 1) return;
    for (int i = 0; i < 10 && !reported; ++i) {
      clock_.AdvanceMs(1100);
      reported = hub_.WaitForProgress(200);
    }
    reported = reported || hub_.WaitForProgress(10000);
    during = hub_.Snapshot();
  });
  Result<FetchStats> st = FetchSomeSlices(*r.client);
  testpoint::Disarm("fetcher.slice_done");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectSlicesArrived();
  ASSERT_TRUE(reported) << "no progress report reached the hub";
  ASSERT_EQ(during.transfers.size(), 1u);
  const SnapshotTransfer& t = during.transfers[0];
  EXPECT_EQ(t.reader, r.client->id());
  EXPECT_TRUE(t.reported);
  EXPECT_GT(t.bytes_done, 0u);
  EXPECT_EQ(t.bytes_total, st->bytes);

  // The final report goes out with the heartbeat, or as the worker leaves.
  r.client.reset();
  EXPECT_EQ(hub_.done_reports(), 1);
  const HubSnapshot after = hub_.Snapshot();
  EXPECT_TRUE(after.transfers.empty());
  EXPECT_EQ(after.slowest.size(), st->sources.size());
  for (const SnapshotHolderRate& h : after.slowest) {
    EXPECT_EQ(h.samples, 1u) << h.name;
  }
}

}  // namespace
}  // namespace tensorhub::client
