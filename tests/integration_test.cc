// The worker library against a real hub and the real TCP data plane, in one
// process: lifecycle, the unpublish-drain contract, and bad input.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>

#include "client/control_plane.h"
#include "common/deadline.h"
#include "common/manifest.h"
#include "demo_model.h"
#include "hub/hub_service.h"
#include "hub_fixture.h"
#include "process_util.h"
#include "tensorhub/client.h"
#include "test_roles.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"
#include "wire/frame.h"

namespace tensorhub::testing {
namespace {

using cli::SyntheticModel;

TEST_F(HubTest, PublishFetchRoundTripAndReaderBecomesHolder) {
  SyntheticModel src(TestLayout(8 << 20));
  src.Fill(1);
  auto trainer = NewClient("trainer");
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors()).ok());
  SyntheticModel a(TestLayout(8 << 20)), b(TestLayout(8 << 20));
  auto ra = NewClient("a");
  auto st = ra->Fetch("m", Version::Latest(), a.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->version, Version(1));
  EXPECT_EQ(a.Digest(), src.Digest());
  // The trainer leaves; the version stays fetchable from reader a.
  ASSERT_TRUE(trainer->Unpublish("m", Version(1)).ok());
  auto rb = NewClient("b");
  st = rb->Fetch("m", Version(1), b.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(b.Digest(), src.Digest());
  auto info = rb->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, VersionState::kCommitted);
  EXPECT_EQ(info->num_holders, 1u);  // a (b itself is excluded from its view)
}

// A publisher that names plain XXH3-64 (for readers of earlier builds) is
// read and verified like one that names the default tree (a holder's
// damaged copy fails either check, and the chunk is read from another
// holder); a checksum name this build does not know fails the publish and
// changes nothing.
TEST_F(HubTest, PublishNamesItsChunkChecksumAndReadersVerifyEither) {
  SyntheticModel src(TestLayout(6 << 20));
  src.Fill(3);
  auto trainer = NewClient("trainer");
  PublishOptions legacy;
  legacy.chunk_checksum = "xxh3-64";
  ASSERT_TRUE(trainer->Publish("sum", Version(1), src.tensors(), legacy).ok());
  SyntheticModel src2(TestLayout(6 << 20));
  src2.Fill(4);
  PublishOptions bad;
  bad.chunk_checksum = "md5";
  Status s = trainer->Publish("sum", Version(2), src2.tensors(), bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("known: xxh3-64-tree-64k, xxh3-64"),
            std::string::npos)
      << s.ToString();
  ASSERT_TRUE(trainer->Publish("sum", Version(2), src2.tensors()).ok());
  auto reader = NewClient("reader");
  SyntheticModel dst(TestLayout(6 << 20));
  for (uint64_t v : {1, 2}) {
    auto st = reader->Fetch("sum", Version(v), dst.tensors());
    ASSERT_TRUE(st.ok()) << v << ": " << st.status().ToString();
    SyntheticModel want(TestLayout(6 << 20));
    want.Fill(v == 1 ? 3 : 4);
    EXPECT_EQ(dst.Digest(), want.Digest()) << v;
    EXPECT_EQ(st->chunk_retries, 0u) << v;
  }

  // Reader "a" holds a copy of each kind, and it is changed after a's
  // fetch (as a caller breaking the contract would). A reader that reads
  // from a first (the latest holder to join; max_sources 1) must refuse
  // the damaged chunk and take it from the trainer, under either kind.
  for (const char* sum : {"xxh3-64", "xxh3-64-tree-64k"}) {
    const Version v(sum == std::string("xxh3-64") ? 1 : 2);
    SyntheticModel bytes(TestLayout(6 << 20));
    bytes.Fill(5 + v.value());
    PublishOptions po;
    po.chunk_checksum = sum;
    Status pub = trainer->Publish("damaged", v, bytes.tensors(), po);
    ASSERT_TRUE(pub.ok()) << sum << ": " << pub.ToString();
    SyntheticModel a_copy(TestLayout(6 << 20));  // outlives its holder, a
    auto a = NewClient(std::string("a-") + sum);
    ASSERT_TRUE(a->Fetch("damaged", v, a_copy.tensors()).ok()) << sum;
    for (const TensorRef& t : a_copy.tensors())
      static_cast<uint8_t*>(t.data)[t.bytes / 2] ^= 0x5a;
    SyntheticModel got(TestLayout(6 << 20));
    FetchOptions one;
    one.max_sources = 1;
    auto st = NewClient(std::string("b-") + sum)
                  ->Fetch("damaged", v, got.tensors(), one);
    ASSERT_TRUE(st.ok()) << sum << ": " << st.status().ToString();
    EXPECT_EQ(got.Digest(), bytes.Digest()) << sum << ": damaged bytes kept";
    EXPECT_GE(st->chunk_retries, 1u) << sum << ": a's damage went unread";
    ASSERT_TRUE(trainer->Unpublish("damaged", v).ok());  // before `bytes` goes
  }
}

// AddHolder over gRPC names the manifest by digest; a hub that lacks the
// committed manifest (here: it never saw the version, as after a restart)
// asks for it, and the client sends it whole, so the hub rebuilds the
// version from the holder alone. A different manifest is refused by digest.
TEST_F(HubTest, AddHolderByDigestFallsBackToTheFullManifest) {
  std::unique_ptr<client::ControlPlane> control =
      client::MakeGrpcControlPlane(hub_->address(), "", 5000);
  client::ControlPlane& hc = *control;
  auto w = hc.Register(WorkerId(), "holder", "127.0.0.1:1", {}, {},
                       WorkerClass::kReliable, false, 5000);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  SyntheticModel src(TestLayout(1 << 20));
  src.Fill(3);
  auto part = BuildPartLayout(0, src.tensors(), kMinChunkBytes);
  ASSERT_TRUE(part.ok());
  Manifest m(1, kMinChunkBytes, {*part});
  ASSERT_TRUE(hc.AddHolder(*w, "m", Version(4), 1, m).ok());
  auto r = hc.Resolve(WorkerId("reader"), "m", Version::Latest(), false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, Version(4));
  ASSERT_TRUE(r->manifest.has_value());
  EXPECT_TRUE(*r->manifest == m);
  EXPECT_EQ(r->num_holders, 1u);
  // Now the hub has it: a second holder reports by digest alone.
  auto w2 = hc.Register(WorkerId(), "holder2", "127.0.0.1:2", {}, {},
                        WorkerClass::kReliable, false, 5000);
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(hc.AddHolder(*w2, "m", Version(4), 1, m, /*filling=*/true).ok());
  std::vector<PartLayout> other = m.parts();
  other[0].chunk_xxh3[0] ^= 1;
  EXPECT_EQ(
      hc.AddHolder(*w2, "m", Version(4), 1, Manifest(1, kMinChunkBytes, other))
          .code(),
      StatusCode::kInvalidArgument);
  r = hc.Resolve(WorkerId("reader"), "m", Version(4), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_holders, 2u);
}

TEST_F(HubTest, GroupCommitIsAtomicAndUncommittedFetchFailsCleanly) {
  auto r0 = NewClient("rank0");
  auto r1 = NewClient("rank1");
  SyntheticModel p0({{"layer0.w", DType::kF32, {1000}}});
  SyntheticModel p1({{"layer1.w", DType::kF32, {3000}}});
  p0.Fill(7);
  p1.Fill(8);
  PublishOptions o0, o1;
  o0.group_size = o1.group_size = 2;
  o1.rank = 1;
  ASSERT_TRUE(r0->Publish("g", Version(5), p0.tensors(), o0).ok());
  auto reader = NewClient("reader");
  SyntheticModel dst(
      {{"layer0.w", DType::kF32, {1000}}, {"layer1.w", DType::kF32, {3000}}});
  auto st = reader->Fetch("g", Version(5), dst.tensors());
  EXPECT_EQ(st.status().code(), StatusCode::kFailedPrecondition)
      << st.status().ToString();
  EXPECT_NE(st.status().message().find("1 of 2"), std::string::npos);
  st = reader->Fetch("g", Version::Latest(), dst.tensors());
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(r1->Publish("g", Version(5), p1.tensors(), o1).ok());
  st = reader->Fetch("g", Version::Latest(), dst.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(std::memcmp(dst.tensors()[0].data, p0.tensors()[0].data, 4000), 0);
  EXPECT_EQ(std::memcmp(dst.tensors()[1].data, p1.tensors()[0].data, 12000), 0);
}

// A group of more ranks than a reader's max_sources (4 by default): each
// rank holds one part, and a reader with default options must still get a
// source for every part (it once got the same 4 ranks on every call and
// waited for the rest until its deadline).
TEST_F(HubTest, GroupOfMoreRanksThanMaxSourcesIsFetchedWhole) {
  constexpr uint32_t kRanks = 6;
  std::vector<std::unique_ptr<Client>> ranks;
  std::vector<std::unique_ptr<SyntheticModel>> parts;
  std::vector<TensorSpec> all;
  for (uint32_t r = 0; r < kRanks; ++r) {
    // Parts of different sizes, several chunks each.
    std::vector<TensorSpec> spec = {
        {"layer" + std::to_string(r) + ".w", DType::kF32, {3000 + 700 * r}}};
    all.push_back(spec[0]);
    parts.push_back(std::make_unique<SyntheticModel>(spec));
    parts.back()->Fill(20 + r);
    ranks.push_back(NewClient("rank" + std::to_string(r)));
    PublishOptions o;
    o.group_size = kRanks;
    o.rank = r;
    o.chunk_bytes = kMinChunkBytes;
    ASSERT_TRUE(ranks.back()
                    ->Publish("g", Version(1), parts.back()->tensors(), o)
                    .ok());
  }
  auto check = [&](const SyntheticModel& dst) {
    for (uint32_t r = 0; r < kRanks; ++r) {
      const TensorRef& want = parts[r]->tensors()[0];
      ASSERT_EQ(std::memcmp(dst.tensors()[r].data, want.data, want.bytes), 0)
          << "part " << r;
    }
  };
  auto reader = NewClient("reader");
  SyntheticModel dst(all);
  auto st = reader->Fetch("g", Version(1), dst.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->sources_used, kRanks);  // every rank served its own part
  check(dst);
  // A second reader reads it all from the first (idle, holds every chunk).
  auto reader2 = NewClient("reader2");
  SyntheticModel dst2(all);
  st = reader2->Fetch("g", Version(1), dst2.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  check(dst2);
}

TEST_F(HubTest, RankLeavingBeforeCommitAbortsTheVersion) {
  auto r0 = NewClient("rank0");
  SyntheticModel p0({{"w", DType::kF32, {1000}}});
  PublishOptions o;
  o.group_size = 2;
  ASSERT_TRUE(r0->Publish("g", Version(1), p0.tensors(), o).ok());
  ASSERT_TRUE(r0->Unpublish("g", Version(1)).ok());
  auto info = r0->Describe("g", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, VersionState::kAborted);
  auto r1 = NewClient("rank1");
  SyntheticModel p1({{"v", DType::kF32, {1000}}});
  o.rank = 1;
  EXPECT_EQ(r1->Publish("g", Version(1), p1.tensors(), o).code(),
            StatusCode::kAborted);
}

// A raw data-plane client that asks for a big range and does not read the
// answer keeps a read in flight on the holder.
TEST_F(HubTest, UnpublishDrainsReadsInFlightAndRefusesNewOnes) {
  const uint64_t bytes = 64ull << 20;
  SyntheticModel src({{"w", DType::kU8, {bytes}}});
  src.Fill(3);
  auto holder = NewClient("holder");
  ASSERT_TRUE(holder->Publish("d", Version(1), src.tensors()).ok());
  auto observer = NewClient("observer");
  auto info = observer->Describe("d", Version(1));
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->holders.size(), 1u);

  // Describe does not expose epochs; epoch 1 is the holder's first. 64 MiB
  // is far more than the socket buffers hold, so the holder's send blocks
  // until we read.
  auto conn =
      transport::ConnectTcp(holder->data_address(), Deadline::AfterMs(5000));
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(
      transport::ClientHandshake(conn->get(), "", Deadline::AfterMs(5000))
          .ok());
  wire::ReadRequest req{"d", 1, 1, 0, 0, bytes};
  std::string frame = wire::EncodeReadRequest(req);
  iovec v{frame.data(), frame.size()};
  ASSERT_TRUE(
      transport::WriteAll(conn->get(), {&v, 1}, Deadline::AfterMs(5000)).ok());
  // The holder admitted the read and is sending: its header and first bytes
  // are here. The rest waits for us.
  std::vector<uint8_t> sink(bytes);
  constexpr uint64_t kFirst = 4096;
  uint8_t hdr[wire::kResponseHeaderBytes];
  ASSERT_TRUE(transport::ReadExact(conn->get(), hdr, sizeof(hdr),
                                   Deadline::AfterMs(20000))
                  .ok());
  ASSERT_TRUE(transport::ReadExact(conn->get(), sink.data(), kFirst,
                                   Deadline::AfterMs(20000))
                  .ok());

  std::atomic<bool> returned{false};
  auto unpub = std::async(std::launch::async, [&] {
    Status s = holder->Unpublish("d", Version(1), 20000);
    returned = true;
    return s;
  });
  // Once unpublish has fenced the version, new reads are refused at once,
  // even on a fresh connection; wait (bounded) for that point.
  Status refused = Status::Ok();
  for (Deadline d = Deadline::AfterMs(20000); !d.expired();) {
    auto conn2 = transport::MakeTcpTransport()->Connect(
        holder->data_address(), Deadline::AfterMs(5000));
    ASSERT_TRUE(conn2.ok());
    std::vector<uint8_t> small_buf(4096);
    iovec d2{small_buf.data(), small_buf.size()};
    wire::ReadRequest req2{"d", 1, 1, 0, 0, 4096};
    refused = (*conn2)->Read(req2, {&d2, 1}, Deadline::AfterMs(5000));
    if (!refused.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // poll
  }
  EXPECT_TRUE(refused.code() == StatusCode::kNotFound ||
              refused.code() == StatusCode::kAborted)
      << refused.ToString();
  // Fenced, but our read is still in flight: unpublish must still be
  // draining. (If it did not wait, this could also pass by luck, but it can
  // never fail when it does wait.)
  EXPECT_FALSE(returned.load())
      << "unpublish returned while a read was in flight";
  // Drain the slow read; it completes with the old bytes, then unpublish
  // returns.
  ASSERT_TRUE(transport::ReadExact(conn->get(), sink.data() + kFirst,
                                   bytes - kFirst, Deadline::AfterMs(20000))
                  .ok());
  EXPECT_EQ(std::memcmp(sink.data(), src.tensors()[0].data, bytes), 0);
  Status s = unpub.get();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// The only complete holder unpublishes while a reader is mid-fetch from it.
// The reader, a filling holder, is then the only one left: the hub marks the
// version UNAVAILABLE and says so; the fetch fails with that reason at once
// (after one confirming answer), not at its deadline.
TEST_F(HubTest, FetchFailsPromptlyWhenItsOnlyCompleteHolderUnpublishes) {
  const uint64_t bytes = 64ull << 20;
  SyntheticModel src({{"w", DType::kU8, {bytes}}});
  src.Fill(5);
  auto holder = NewClient("holder");
  PublishOptions po;
  po.chunk_bytes = 1 << 20;
  ASSERT_TRUE(holder->Publish("u", Version(1), src.tensors(), po).ok());
  auto reader = NewClient("reader");
  SyntheticModel dst({{"w", DType::kU8, {bytes}}});
  FetchOptions fo;
  fo.timeout_ms = 20000;
  // One stream, so the holder unpublishes between two reads: after the
  // first chunk, from inside the progress callback (no read in flight).
  fo.connections = 1;
  std::atomic<bool> unpublished{false};
  Status unpublish = Status::Ok();
  fo.on_progress = [&](const FetchProgress& p) {
    if (p.bytes_done == 0 || p.bytes_done == p.bytes_total ||
        unpublished.exchange(true))
      return;
    unpublish = holder->Unpublish("u", Version(1), 10000);
  };
  const int64_t t0 = NowMs();
  auto st = reader->Fetch("u", Version(1), dst.tensors(), fo);
  const int64_t took_ms = NowMs() - t0;
  ASSERT_TRUE(unpublished.load()) << "the fetch ended before the holder left";
  ASSERT_TRUE(unpublish.ok()) << unpublish.ToString();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable)
      << st.status().ToString();
  EXPECT_NE(
      st.status().message().find("no live worker holds all of its chunks"),
      std::string::npos)
      << st.status().ToString();
  // It ended on the hub's answer, not at its deadline. (Which path ended it
  // is in the message; no wall-clock bound, which a loaded machine could
  // miss. took_ms is printed for the record.)
  EXPECT_NE(st.status().message().find("the hub answered twice"),
            std::string::npos)
      << st.status().ToString();
  EXPECT_EQ(st.status().message().find("did not finish in time"),
            std::string::npos)
      << st.status().ToString();
  std::printf("failed after %lld ms of a %lld ms timeout\n",
              static_cast<long long>(took_ms),
              static_cast<long long>(fo.timeout_ms));
  // The reader's partial copy was withdrawn: the hub has no holder left.
  auto info = reader->Describe("u", Version(1));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, VersionState::kUnavailable);
  EXPECT_EQ(info->num_holders, 0u);
}

// A version whose only holder left before the fetch began: the hub answers
// the resolve itself with UNAVAILABLE (not an RPC error), and the fetch
// fails at once after one confirming answer instead of retrying until its
// deadline as if the hub were unreachable.
TEST_F(HubTest, FetchOfAVersionWithNoHolderLeftFailsPromptly) {
  SyntheticModel src({{"w", DType::kU8, {1 << 20}}});
  src.Fill(6);
  auto holder = NewClient("holder");
  ASSERT_TRUE(holder->Publish("gone", Version(1), src.tensors()).ok());
  ASSERT_TRUE(holder->Unpublish("gone", Version(1)).ok());
  auto reader = NewClient("reader");
  SyntheticModel dst({{"w", DType::kU8, {1 << 20}}});
  FetchOptions fo;
  fo.timeout_ms = 20000;
  const int64_t t0 = NowMs();
  auto st = reader->Fetch("gone", Version(1), dst.tensors(), fo);
  const int64_t took_ms = NowMs() - t0;
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable)
      << st.status().ToString();
  EXPECT_NE(
      st.status().message().find("no live worker holds all of its chunks"),
      std::string::npos)
      << st.status().ToString();
  // Ended on the hub's answer, not at the deadline (see above).
  EXPECT_NE(st.status().message().find("twice"), std::string::npos)
      << st.status().ToString();
  EXPECT_EQ(st.status().message().find("did not finish in time"),
            std::string::npos)
      << st.status().ToString();
  std::printf("failed after %lld ms of a %lld ms timeout\n",
              static_cast<long long>(took_ms),
              static_cast<long long>(fo.timeout_ms));
}

TEST_F(HubTest, UnpublishReportsDeadlineWhenAReadDoesNotDrain) {
  SyntheticModel src({{"w", DType::kU8, {64ull << 20}}});
  auto holder = NewClient("holder");
  ASSERT_TRUE(holder->Publish("d", Version(1), src.tensors()).ok());
  auto conn =
      transport::ConnectTcp(holder->data_address(), Deadline::AfterMs(5000));
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(
      transport::ClientHandshake(conn->get(), "", Deadline::AfterMs(5000))
          .ok());
  wire::ReadRequest req{"d", 1, 1, 0, 0, 64ull << 20};
  std::string frame = wire::EncodeReadRequest(req);
  iovec v{frame.data(), frame.size()};
  ASSERT_TRUE(
      transport::WriteAll(conn->get(), {&v, 1}, Deadline::AfterMs(5000)).ok());
  // The read is admitted and in flight once its first bytes are here; we
  // read no more, so it cannot drain.
  uint8_t first[wire::kResponseHeaderBytes + 4096];
  ASSERT_TRUE(transport::ReadExact(conn->get(), first, sizeof(first),
                                   Deadline::AfterMs(20000))
                  .ok());
  int64_t t0 = NowMs();
  Status s = holder->Unpublish("d", Version(1), 500);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  // By its own 500 ms deadline, with slack for a loaded machine.
  EXPECT_LT(NowMs() - t0, 500 + kDeadlineSlackMs);
}

TEST_F(HubTest, ReaderRefetchIntoServedBuffersNeverMixesVersions) {
  auto trainer = NewClient("trainer");
  SyntheticModel t1(TestLayout(4 << 20)), t2(TestLayout(4 << 20));
  t1.Fill(1);
  t2.Fill(2);
  ASSERT_TRUE(trainer->Publish("r", Version(1), t1.tensors()).ok());
  auto reader = NewClient("reader");
  SyntheticModel buf(TestLayout(4 << 20));
  ASSERT_TRUE(reader->Fetch("r", Version::Latest(), buf.tensors()).ok());
  ASSERT_TRUE(trainer->Publish("r", Version(2), t2.tensors()).ok());
  // The same buffers now receive v2: the reader stops serving v1 first.
  auto st = reader->Fetch("r", Version::Latest(), buf.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->version, Version(2));
  EXPECT_EQ(buf.Digest(), t2.Digest());
  auto info = reader->Describe("r", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->num_holders, 1u);  // only the trainer still holds v1
}

TEST_F(HubTest, BadInputGetsAClearErrorAndChangesNothing) {
  auto c = NewClient("c");
  SyntheticModel src({{"w", DType::kF32, {256}}, {"b", DType::kF32, {4}}});
  ASSERT_TRUE(c->Publish("bad", Version(10), src.tensors()).ok());
  // Version not greater than the last.
  Status s = c->Publish("bad", Version(10), src.tensors());
  EXPECT_FALSE(s.ok());
  SyntheticModel other({{"x", DType::kF32, {256}}});
  s = c->Publish("bad", Version(9), other.tensors());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("not greater"), std::string::npos);
  // Bad model names and version 0.
  EXPECT_EQ(c->Publish("has space", Version(1), other.tensors()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Publish("ok", Version(0), other.tensors()).code(),
            StatusCode::kInvalidArgument);
  // Sizes that disagree with the spec.
  std::vector<TensorRef> wrong = other.tensors();
  wrong[0].bytes -= 4;
  EXPECT_EQ(c->Publish("ok", Version(1), wrong).code(),
            StatusCode::kInvalidArgument);
  auto reader = NewClient("reader");
  // Unknown model and version.
  SyntheticModel dst({{"w", DType::kF32, {256}}, {"b", DType::kF32, {4}}});
  EXPECT_EQ(
      reader->Fetch("nope", Version::Latest(), dst.tensors()).status().code(),
      StatusCode::kNotFound);
  EXPECT_EQ(reader->Fetch("bad", Version(11), dst.tensors()).status().code(),
            StatusCode::kNotFound);
  // Destination mismatches: dtype, shape, missing and extra tensors.
  SyntheticModel wrong_dtype(
      {{"w", DType::kBF16, {256}}, {"b", DType::kF32, {4}}});
  auto st = reader->Fetch("bad", Version(10), wrong_dtype.tensors());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("'w'"), std::string::npos)
      << st.status().ToString();
  SyntheticModel wrong_shape(
      {{"w", DType::kF32, {16, 16}}, {"b", DType::kF32, {4}}});
  EXPECT_EQ(
      reader->Fetch("bad", Version(10), wrong_shape.tensors()).status().code(),
      StatusCode::kInvalidArgument);
  SyntheticModel missing({{"w", DType::kF32, {256}}});
  EXPECT_EQ(
      reader->Fetch("bad", Version(10), missing.tensors()).status().code(),
      StatusCode::kInvalidArgument);
  SyntheticModel extra({{"w", DType::kF32, {256}},
                        {"b", DType::kF32, {4}},
                        {"z", DType::kF32, {1}}});
  EXPECT_EQ(reader->Fetch("bad", Version(10), extra.tensors()).status().code(),
            StatusCode::kInvalidArgument);
  // Nothing changed: version 10 is still the only one, committed, one holder.
  auto models = reader->List();
  ASSERT_TRUE(models.ok());
  for (const ModelInfo& m : *models) {
    if (m.model != "bad") continue;
    ASSERT_EQ(m.versions.size(), 1u);
    EXPECT_EQ(m.versions[0].version, Version(10));
    EXPECT_EQ(m.versions[0].state, VersionState::kCommitted);
    EXPECT_EQ(m.versions[0].num_holders, 1u);
  }
  // And a correct fetch still works.
  ASSERT_TRUE(reader->Fetch("bad", Version(10), dst.tensors()).ok());
  EXPECT_EQ(dst.Digest(), src.Digest());
}

// A worker's data-plane settings that name something that does not exist
// are refused before it contacts the hub, with what the setting may hold;
// never a worker running with other settings than its user's.
TEST(NoHub, UnknownDataPlaneSettingsAreRefusedNamingThem) {
  ClientOptions o;
  o.hub_address = "127.0.0.1:" + std::to_string(FreePort());
  o.transports = {"rdma", "tcp"};
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("'rdma'"), std::string::npos)
      << c.status().ToString();
  o.transports = {"tcp"};
  ::setenv("TENSORHUB_CUDA_IPC", "shared", 1);
  c = Client::Connect(o);
  ::unsetenv("TENSORHUB_CUDA_IPC");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("TENSORHUB_CUDA_IPC"), std::string::npos)
      << c.status().ToString();
}

TEST(NoHub, UnreachableHubFailsWithinItsDeadline) {
  ClientOptions o;
  o.hub_address = "127.0.0.1:" + std::to_string(FreePort());
  o.connect_timeout_ms = 1000;
  int64_t t0 = NowMs();
  auto c = Client::Connect(o);
  int64_t took = NowMs() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().code() == StatusCode::kDeadlineExceeded ||
              c.status().code() == StatusCode::kUnavailable)
      << c.status().ToString();
  EXPECT_LT(took,
            o.connect_timeout_ms + kDeadlineSlackMs);  // by its own deadline
  EXPECT_NE(c.status().message().find(o.hub_address), std::string::npos);
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             &tensorhub::testing::MaybeRunRole);
}

namespace tensorhub::testing {
namespace {

// One shared secret guards both planes: the hub refuses a worker without
// it, and a holder refuses a reader without it.
TEST(SharedSecret, BothPlanesRequireIt) {
  auto hub = Hub::Start({"127.0.0.1:0", 5000, "k3y"});
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  auto connect = [&](const std::string& secret) {
    ClientOptions o;
    o.hub_address = (*hub)->address();
    o.secret = secret;
    o.connect_timeout_ms = 3000;
    return Client::Connect(o);
  };
  auto trainer = connect("k3y");
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  SyntheticModel src(TestLayout(1 << 20));
  src.Fill(4);
  ASSERT_TRUE((*trainer)->Publish("s", Version(1), src.tensors()).ok());
  auto reader = connect("k3y");
  ASSERT_TRUE(reader.ok());
  SyntheticModel dst(TestLayout(1 << 20));
  ASSERT_TRUE((*reader)->Fetch("s", Version::Latest(), dst.tensors()).ok());
  EXPECT_EQ(dst.Digest(), src.Digest());
  auto intruder = connect("wrong");
  EXPECT_EQ(intruder.status().code(), StatusCode::kPermissionDenied)
      << intruder.status().ToString();
  auto anonymous = connect("");
  EXPECT_EQ(anonymous.status().code(), StatusCode::kPermissionDenied);
}

// Rack-aware pipelines end to end (docs/design.md, "Rack-aware
// pipelines"): a hub told 4:1 racks; readers in three racks fetch at once,
// one stream each, from the real data plane with cut-through. Whatever
// order they reach the hub in, readers entering a rack are told to recheck
// and follow the moves the hub makes when their rack-mates arrive; every
// reader ends with the trainer's bytes, and no pipeline waits on itself.
class RackHubTest : public HubTest {
 protected:
  void SetUp() override {
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.lease_ms = 5000;
    o.rebuild_ms = 0;
    o.rack_oversubscription = 4;
    o.recheck_ms = 1;
    auto hub = hub::HubServer::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
  }
  ClientOptions WorkerOptions(const std::string& name) const override {
    ClientOptions o = HubTest::WorkerOptions(name);
    o.labels.datacenter = "dc";
    o.labels.rack = name == "trainer" ? "r0" : "r" + name.substr(0, 1);
    o.labels.host = name;
    return o;
  }
};

TEST_F(RackHubTest, ReadersInOversubscribedRacksFetchAtOnceAndAllGetTheBytes) {
  SyntheticModel src(TestLayout(6 << 20));
  src.Fill(8);
  auto trainer = NewClient("trainer");
  PublishOptions po;
  po.chunk_bytes = 512 << 10;
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors(), po).ok());
  const std::vector<std::string> names = {"1a", "2a", "1b", "3a", "2b", "1c"};
  std::vector<std::unique_ptr<Client>> readers;
  std::vector<std::unique_ptr<SyntheticModel>> dst;
  for (const std::string& n : names) {
    readers.push_back(NewClient(n));
    dst.push_back(std::make_unique<SyntheticModel>(TestLayout(6 << 20)));
  }
  std::vector<Status> got(names.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&, i] {
      FetchOptions fo;
      fo.connections = 1;
      fo.timeout_ms = 60000;
      got[i] =
          readers[i]->Fetch("m", Version(1), dst[i]->tensors(), fo).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(got[i].ok()) << names[i] << ": " << got[i].ToString();
    EXPECT_EQ(dst[i]->Digest(), src.Digest()) << names[i];
  }
}

}  // namespace
}  // namespace tensorhub::testing
