// The data-plane contract, run over every transport this build has (tcp,
// and ucx where TH_UCX is on), on loopback with real servers and
// connections; then what only the UCX transport does: registration once
// per publish, the drain of UCX reads in flight, the unmap after it.
//
// UCX picks its wire from UCX_TLS, read when the transport is made: ctest
// runs this binary once per wire (src/transport/CMakeLists.txt), e.g.
// UCX_TLS=tcp, UCX_TLS=sm,self and UCX_TLS=cma,tcp.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "client/registry.h"
#include "common/checksum.h"
#include "common/manifest.h"
#include "common/test_point.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_reply.h"

namespace tensorhub::transport {
namespace {

// Calls that must succeed get kGenerousMs: it only matters if they hang
// (no timing assertions).
constexpr int64_t kGenerousMs = 30000;

// Serves model "m" version 1 epoch 1 part 0 from one buffer in pieces of
// 1..64 KiB; other names are refused with NOT_FOUND.
class TestSource final : public ReadSource {
 public:
  explicit TestSource(size_t bytes) : data_(bytes) {
    std::mt19937 rng(7);
    for (uint8_t& b : data_) b = static_cast<uint8_t>(rng());
  }
  Result<ServeLease> BeginRead(const wire::ReadRequest& req) override {
    if (req.model != "m" || req.version != 1 || req.epoch != 1) {
      return NotFound("no such registration");
    }
    if (req.offset > data_.size() || req.length > data_.size() - req.offset) {
      return InvalidArgument("read past the end");
    }
    ServeLease lease;
    uint64_t off = req.offset, end = req.offset + req.length, step = 1;
    while (off < end) {
      uint64_t take = std::min<uint64_t>(end - off, step);
      lease.pieces.push_back({data_.data() + off, take});
      off += take;
      step = step * 7 % 65536 + 1;
    }
    return lease;
  }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

wire::ReadRequest Req(uint64_t offset, uint64_t length,
                      std::string model = "m") {
  wire::ReadRequest r;
  r.model = std::move(model);
  r.version = 1;
  r.epoch = 1;
  r.part = 0;
  r.offset = offset;
  r.length = length;
  return r;
}

std::unique_ptr<Transport> MakeTransport(const std::string& name,
                                         const std::string& secret = "") {
  if (name == "tcp") {
    TcpTransportOptions o;
    o.local_reads = false;
    o.secret = secret;
    return MakeTcpTransport(o);
  }
  UcxTransportOptions o;
  o.secret = secret;
  Result<std::unique_ptr<Transport>> t = MakeUcxTransport(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<std::string> Transports() {
  std::vector<std::string> out = {"tcp"};
  if (UcxAvailable()) out.push_back("ucx");
  return out;
}

class TransportContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    transport_ = MakeTransport(GetParam());
    ASSERT_NE(transport_, nullptr);
    ASSERT_EQ(transport_->name(), GetParam());
    Result<std::unique_ptr<Server>> s =
        transport_->Listen("127.0.0.1:0", &source_, ServerOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  std::unique_ptr<Connection> MustConnect() {
    Result<std::unique_ptr<Connection>> c =
        transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  TestSource source_{6 << 20};
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Server> server_;
};

TEST_P(TransportContractTest, ReadsIntoScatteredDestinationByteExact) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  const uint64_t off = 12345, len = (5 << 20) + 777;
  std::vector<uint8_t> out(len);
  // Destination pieces of 3..100003 bytes, so they cross the source's.
  std::vector<iovec> dest;
  for (uint64_t at = 0, step = 3; at < len; step = step * 13 % 100003 + 3) {
    uint64_t take = std::min(step, len - at);
    dest.push_back({out.data() + at, take});
    at += take;
  }
  uint64_t sum = 0;
  Status s = c->Read(Req(off, len), dest, Deadline::AfterMs(kGenerousMs), &sum);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::equal(out.begin(), out.end(), source_.data().begin() + off));
  EXPECT_EQ(sum, Xxh3(source_.data().data() + off, len));
  // A second read on the same connection.
  std::vector<uint8_t> small(4096);
  iovec v{small.data(), small.size()};
  ASSERT_TRUE(
      c->Read(Req(0, 4096), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  EXPECT_TRUE(std::equal(small.begin(), small.end(), source_.data().begin()));
}

TEST_P(TransportContractTest, RefusalCarriesCodeAndKeepsConnection) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> out(100);
  iovec v{out.data(), out.size()};
  Status s =
      c->Read(Req(0, 100, "other"), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("no such registration"), std::string::npos);
  EXPECT_FALSE(c->broken());
  s = c->Read(Req(source_.data().size() - 10, 100), {&v, 1},
              Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_FALSE(c->broken());
  ASSERT_TRUE(
      c->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), source_.data().begin()));
}

TEST_P(TransportContractTest, DestinationOfTheWrongSizeIsRefusedLocally) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> out(10);
  iovec v{out.data(), out.size()};
  Status s = c->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
}

TEST_P(TransportContractTest, WrongSecretIsRefused) {
  auto other = MakeTransport(GetParam(), "not the secret");
  ASSERT_NE(other, nullptr);
  Result<std::unique_ptr<Connection>> c =
      other->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied)
      << c.status().ToString();
}

TEST_P(TransportContractTest, CancelledConnectionFailsFast) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  c->Cancel();
  std::vector<uint8_t> out(1 << 20);
  iovec v{out.data(), out.size()};
  Status s =
      c->Read(Req(0, out.size()), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(c->broken());
}

TEST_P(TransportContractTest, StopWithOpenConnectionsReturns) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  server_->Stop();
  std::vector<uint8_t> out(100);
  iovec v{out.data(), out.size()};
  EXPECT_FALSE(
      c->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContractTest,
                         ::testing::ValuesIn(Transports()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param;
                         });

TEST(UcxReplyTest, RoundTripsAndRejectsBadFrames) {
  const std::vector<uint64_t> plan = {10, 20, 5};
  std::string b = ucx::EncodePlan(plan);
  auto* p = reinterpret_cast<const uint8_t*>(b.data());
  Result<std::vector<uint64_t>> d = ucx::DecodePlan(p, b.size(), 35);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, plan);
  EXPECT_FALSE(ucx::DecodePlan(p, b.size(), 34).ok());  // wrong total
  EXPECT_FALSE(ucx::DecodePlan(p, b.size(), 36).ok());
  for (size_t cut = 0; cut < b.size(); ++cut) {
    EXPECT_FALSE(ucx::DecodePlan(p, cut, 35).ok()) << cut;
  }
  for (const std::vector<uint64_t>& bad :
       {std::vector<uint64_t>{}, std::vector<uint64_t>{0, 35},
        std::vector<uint64_t>{ucx::kMaxMessageBytes + 1}}) {
    b = ucx::EncodePlan(bad);
    uint64_t total = 0;
    for (uint64_t n : bad) total += n;
    EXPECT_FALSE(ucx::DecodePlan(reinterpret_cast<const uint8_t*>(b.data()),
                                 b.size(), total)
                     .ok());
  }
  std::string h = ucx::EncodeHelloHeader(ucx::kMaxWorkerAddressBytes + 1);
  EXPECT_FALSE(ucx::DecodeHelloHeader(
                   reinterpret_cast<const uint8_t*>(h.data()), h.size())
                   .ok());
  h = ucx::EncodeHelloHeader(0);
  EXPECT_FALSE(ucx::DecodeHelloHeader(
                   reinterpret_cast<const uint8_t*>(h.data()), h.size())
                   .ok());
  std::string r = ucx::EncodeReady();
  EXPECT_TRUE(
      ucx::DecodeReady(reinterpret_cast<const uint8_t*>(r.data()), r.size())
          .ok());
  EXPECT_FALSE(ucx::DecodeReady(reinterpret_cast<const uint8_t*>(h.data()),
                                h.size())
                   .ok());  // a hello is not a ready
}

// A one-part registration of `tensors` random buffers in the worker's real
// registry, served over UCX.
class UcxRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
    std::mt19937 rng(11);
    std::vector<TensorRef> refs;
    for (size_t i = 0; i < 3; ++i) {
      // Three separate allocations: up to three mappings.
      buffers_.emplace_back((1 << 20) + 1000 * i);
      for (uint8_t& b : buffers_.back()) b = static_cast<uint8_t>(rng());
      flat_.insert(flat_.end(), buffers_.back().begin(), buffers_.back().end());
      TensorRef r;
      r.spec.name = "t" + std::to_string(i);
      r.spec.dtype = DType::kU8;
      r.spec.shape = {buffers_.back().size()};
      r.data = buffers_.back().data();
      r.bytes = buffers_.back().size();
      refs.push_back(r);
    }
    Result<PartLayout> layout = BuildPartLayout(0, refs, 1 << 16);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    client::Holding h;
    h.model = "m";
    h.version = Version(1);
    h.rank = 0;
    h.chunk_bytes = 1 << 16;
    h.parts[0] = *layout;
    for (auto& b : buffers_) h.bases[0].push_back(b.data());
    Result<uint64_t> epoch = registry_.Add(std::move(h));
    ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
    epoch_ = *epoch;
    transport_ = MakeTransport("ucx");
    ASSERT_NE(transport_, nullptr);
    Result<std::unique_ptr<Server>> s =
        transport_->Listen("127.0.0.1:0", &registry_, ServerOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    Result<std::unique_ptr<Connection>> c =
        transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    conn_ = std::move(c).value();
  }
  void TearDown() override { testpoint::Disarm("ucx.read_landed"); }

  wire::ReadRequest RegReq(uint64_t offset, uint64_t length) {
    wire::ReadRequest r = Req(offset, length);
    r.epoch = epoch_;
    return r;
  }
  Status ReadInto(std::vector<uint8_t>& out, uint64_t offset) {
    iovec v{out.data(), out.size()};
    return conn_->Read(RegReq(offset, out.size()), {&v, 1},
                       Deadline::AfterMs(kGenerousMs));
  }

  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<uint8_t> flat_;
  client::Registry registry_;
  uint64_t epoch_ = 0;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Connection> conn_;
};

TEST_F(UcxRegistryTest, RegistersOncePerPublishAndUnmapsAfterTheDrain) {
  const uint64_t before = UcxLiveMappingsForTest();
  std::vector<uint8_t> out(flat_.size() - 100);
  ASSERT_TRUE(ReadInto(out, 50).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), flat_.begin() + 50));
  const uint64_t mapped = UcxLiveMappingsForTest() - before;
  EXPECT_GE(mapped, 1u);
  EXPECT_LE(mapped, 3u);  // one per separate allocation
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> part(4096 + i);
    ASSERT_TRUE(ReadInto(part, 1000 * i).ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), flat_.begin() + 1000 * i));
  }
  EXPECT_EQ(UcxLiveMappingsForTest() - before, mapped);  // not per read
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs))
          .ok());
  EXPECT_EQ(UcxLiveMappingsForTest(), before);
  std::vector<uint8_t> late(100);
  Status s = ReadInto(late, 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

// Unpublish while a UCX read is in flight: the bytes have landed but the
// reader has not released the lease (held at the test point). The drain
// waits for it, the registration stays mapped until then, the read
// completes byte-exact, and a later read is refused.
TEST_F(UcxRegistryTest, UnpublishDrainsAUcxReadInFlight) {
  const uint64_t before = UcxLiveMappingsForTest();
  std::mutex mu;
  std::condition_variable cv;
  bool landed = false, go = false;
  testpoint::Arm("ucx.read_landed", [&](uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    landed = true;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
  });
  std::vector<uint8_t> out(flat_.size());
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                            [&] { return landed; }));
  }
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  EXPECT_EQ(registry_.reads_in_flight(), 1u);
  // The read holds its lease: a drain that may not wait fails.
  Status early =
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(0));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early.ToString();
  EXPECT_GT(UcxLiveMappingsForTest(), before);  // still mapped
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
    cv.notify_all();
  }
  reader.join();
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(out, flat_);
  ASSERT_TRUE(
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs))
          .ok());
  EXPECT_EQ(UcxLiveMappingsForTest(), before);  // unmapped by the drain
  testpoint::Disarm("ucx.read_landed");
  std::vector<uint8_t> late(100);
  Status s = ReadInto(late, 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

// The holder gives the lease up (it stops) while the reader's bytes are in
// but not released: the reader must discard them.
TEST_F(UcxRegistryTest, HolderEndingTheLeaseFailsTheRead) {
  std::mutex mu;
  std::condition_variable cv;
  bool landed = false, go = false;
  testpoint::Arm("ucx.read_landed", [&](uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    landed = true;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
  });
  std::vector<uint8_t> out(4096);
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                            [&] { return landed; }));
  }
  server_->Stop();  // shuts the connection down, then ends the lease
  EXPECT_EQ(registry_.reads_in_flight(), 0u);
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
    cv.notify_all();
  }
  reader.join();
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read.ToString();
  EXPECT_TRUE(conn_->broken());
}

// The reader goes away after its bytes landed, before its release: the
// holder, waiting for the release, sees the connection end and ends the
// lease, so a drain returns (it would hit its deadline otherwise) and the
// registration is unmapped.
TEST_F(UcxRegistryTest, AReaderLeavingBeforeItsReleaseEndsTheLease) {
  const uint64_t before = UcxLiveMappingsForTest();
  testpoint::Arm("ucx.read_landed", [&](uint64_t) { conn_->Cancel(); });
  std::vector<uint8_t> out(flat_.size());
  Status read = ReadInto(out, 0);
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read.ToString();
  EXPECT_TRUE(conn_->broken());
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs))
          .ok());
  EXPECT_EQ(registry_.reads_in_flight(), 0u);
  EXPECT_EQ(UcxLiveMappingsForTest(), before);
}

}  // namespace
}  // namespace tensorhub::transport
