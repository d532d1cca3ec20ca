// The data-plane contract, run over every transport this build has (tcp,
// and ucx where TH_UCX is on), on loopback with real servers and
// connections; then what only the UCX transport does: registration once
// per publish, the drain of UCX reads in flight, the unmap after it.
//
// The contract's cases include what tcp/tcp_transport_test.cc checks of the
// TCP transport (gaps left untouched, every refusal code, garbage and
// stalled peers, deadlines, Stop under a held lease, the connection limit,
// the secret both ways), so that ucx is held to the same.
//
// UCX picks its wire from UCX_TLS, read when the transport is made: ctest
// runs this binary once per wire (src/transport/CMakeLists.txt):
// UCX_TLS=tcp; sm,self; cma,posix,self; posix,sysv,self.
#include "transport/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "client/registry.h"
#include "common/checksum.h"
#include "common/manifest.h"
#include "common/test_point.h"
#include "tensorhub/host_buffer.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/cma.h"
#include "transport/tcp/raw_peer_test_util.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_reply.h"
#include "transport/ucx/ucx_wires.h"

#if defined(TH_UCX_RAW_TEST)
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <atomic>
#include <cstdarg>
#endif

namespace tensorhub::transport {
namespace {

// Calls that must succeed get kGenerousMs: it only matters if they hang
// (no timing assertions).
constexpr int64_t kGenerousMs = 30000;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif
#else
constexpr bool kUnderSanitizer = false;
#endif

// Serves model "m" version 1 epoch 1 part 0 from one buffer in pieces of
// 1..64 KiB; model "other" is refused with a settable status, other names
// with NOT_FOUND. Counts the leases it handed out and those still alive;
// while held (Hold), a read waits in BeginRead (bounded) before it is
// admitted, as a holder that does not answer.
class TestSource final : public ReadSource {
 public:
  explicit TestSource(size_t bytes) : data_(bytes) {
    std::mt19937 rng(7);
    for (uint8_t& b : data_) b = static_cast<uint8_t>(rng());
  }
  ~TestSource() override { Hold(false); }
  Result<ServeLease> BeginRead(const wire::ReadRequest& req) override {
    {
      std::unique_lock<std::mutex> l(mu_);
      ++asked_;
      cv_.notify_all();
      cv_.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                   [&] { return !held_; });
      if (req.model == "other") return refusal_;
    }
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
    {
      std::lock_guard<std::mutex> l(mu_);
      ++active_;
      ++begun_;
      cv_.notify_all();
    }
    lease.pin = std::shared_ptr<void>(nullptr, [this](void*) {
      std::lock_guard<std::mutex> l(mu_);
      --active_;
      cv_.notify_all();
    });
    return lease;
  }
  const std::vector<uint8_t>& data() const { return data_; }
  void set_refusal(Status s) {
    std::lock_guard<std::mutex> l(mu_);
    refusal_ = std::move(s);
  }
  void Hold(bool held) {
    std::lock_guard<std::mutex> l(mu_);
    held_ = held;
    cv_.notify_all();
  }
  // Waits until no lease is alive; false at the deadline.
  bool WaitIdle(int64_t ms) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(ms),
                        [&] { return active_ == 0; });
  }
  // Waits until `n` reads were asked for (admitted or not); false at the
  // deadline.
  bool WaitAsked(int n, int64_t ms) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(ms),
                        [&] { return asked_ >= n; });
  }
  int begun() {
    std::lock_guard<std::mutex> l(mu_);
    return begun_;
  }

 private:
  std::vector<uint8_t> data_;
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;                                     // guarded by mu_
  int begun_ = 0;                                      // guarded by mu_
  int asked_ = 0;                                      // guarded by mu_
  bool held_ = false;                                  // guarded by mu_
  Status refusal_ = NotFound("no such registration");  // guarded by mu_
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

#if defined(TH_UCX_RAW_TEST)
// The address of a UCX worker of this process that nothing progresses, made
// once: what a raw peer of these tests sends a holder as its own.
std::string IdleWorkerAddress() {
  static const std::string address = [] {
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM;
    ucp_context_h ctx = nullptr;
    ucp_worker_h worker = nullptr;
    ucp_worker_params_t wp{};
    ucp_address_t* a = nullptr;
    size_t len = 0;
    if (ucp_init(&p, nullptr, &ctx) != UCS_OK ||
        ucp_worker_create(ctx, &wp, &worker) != UCS_OK ||
        ucp_worker_get_address(worker, &a, &len) != UCS_OK) {
      return std::string("no worker");
    }
    std::string out(reinterpret_cast<const char*>(a), len);
    ucp_worker_release_address(worker, a);
    return out;  // the worker lives as long as the process
  }();
  return address;
}
#endif

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
  // This machine has no RDMA: its UCX wires are all ones whose gets
  // nothing checks (UcxEmulatedGetsTest says what happens without this).
  o.allow_emulated_gets = true;
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
  void RestartServer(const ServerOptions& options) {
    server_->Stop();
    Result<std::unique_ptr<Server>> s =
        transport_->Listen("127.0.0.1:0", &source_, options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  // A raw socket past the handshake (and, over ucx, with the holder's
  // hello read), for playing a bad peer.
  Fd RawConnect(const std::string& address) {
    Result<Fd> fd = ConnectTcp(address, Deadline::AfterMs(kGenerousMs));
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (!fd.ok()) return Fd();
    Status hs = ClientHandshake(fd->get(), "", Deadline::AfterMs(kGenerousMs));
    EXPECT_TRUE(hs.ok()) << hs.ToString();
    if (GetParam() == "ucx") {
      uint8_t hello[ucx::kHelloHeaderBytes];
      EXPECT_TRUE(ReadExact(fd->get(), hello, sizeof(hello),
                            Deadline::AfterMs(kGenerousMs))
                      .ok());
      Result<ucx::Hello> h = ucx::DecodeHelloHeader(hello, sizeof(hello));
      EXPECT_TRUE(h.ok());
      std::string addr(h.ok() ? h->address_len : 0, '\0');
      EXPECT_TRUE(ReadExact(fd->get(), addr.data(), addr.size(),
                            Deadline::AfterMs(kGenerousMs))
                      .ok());
#if defined(TH_UCX_RAW_TEST)
      // A reader's worker address (of a worker no one progresses), which
      // the holder connects its endpoint to before it serves requests.
      std::string message = ucx::EncodeAddress(IdleWorkerAddress());
      iovec v{message.data(), message.size()};
      EXPECT_TRUE(
          WriteAll(fd->get(), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
#endif
    }
    return std::move(fd).value();
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
  // Each chunk checksum, computed as the pieces land.
  for (ChunkChecksum kind : {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
    std::fill(out.begin(), out.end(), 0);
    ReadChecksum sum{.kind = kind};
    Status s =
        c->Read(Req(off, len), dest, Deadline::AfterMs(kGenerousMs), &sum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(
        std::equal(out.begin(), out.end(), source_.data().begin() + off));
    EXPECT_EQ(sum.value, ChunkSum(kind, source_.data().data() + off, len))
        << ChunkChecksumName(kind);
  }
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

// What the TCP transport's own tests (tcp/tcp_transport_test.cc) check of
// it, asked of every transport: the same promises over ucx.

TEST_P(TransportContractTest, ListenResolvesThePort) {
  Result<std::pair<std::string, uint16_t>> hp =
      SplitHostPort(server_->address());
  ASSERT_TRUE(hp.ok()) << server_->address();
  EXPECT_EQ(hp->first, "127.0.0.1");
  EXPECT_NE(hp->second, 0);
}

// Destination pieces of random sizes with gaps between them, in reversed
// memory order, several rounds on one connection: the bytes land exactly,
// the gaps stay untouched, and the server counts every byte served.
TEST_P(TransportContractTest, ScatteredReadsLeaveTheGapsAndCountTheBytes) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  std::mt19937_64 rng(7);
  const std::vector<uint8_t>& src = source_.data();
  uint64_t served = 0;
  for (int round = 0; round < 3; ++round) {
    const uint64_t offset = rng() % 4096;
    const uint64_t length = (4 << 20) + rng() % (1 << 20);
    std::vector<uint8_t> arena(length * 2, 0xAB);
    std::vector<std::pair<uint64_t, uint64_t>> slots;  // length order
    uint64_t pos = 0;
    for (uint64_t left = length; left > 0;) {
      uint64_t len = std::min<uint64_t>(left, 1 + rng() % (256 << 10));
      slots.push_back({0, len});
      pos += len + 1 + rng() % 64;
      left -= len;
    }
    ASSERT_LE(pos, arena.size());
    std::vector<iovec> dest;
    for (auto& [at, len] : slots) {  // reversed memory order
      pos -= len + 1;
      at = pos;
      dest.push_back({arena.data() + at, len});
    }
    Status s =
        c->Read(Req(offset, length), dest, Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<bool> covered(arena.size(), false);
    uint64_t from = offset;
    for (auto [at, len] : slots) {
      ASSERT_EQ(std::memcmp(arena.data() + at, src.data() + from, len), 0)
          << "round " << round << " piece at " << at;
      std::fill(covered.begin() + at, covered.begin() + at + len, true);
      from += len;
    }
    for (size_t i = 0; i < arena.size(); ++i) {
      if (!covered[i]) {
        ASSERT_EQ(arena[i], 0xAB) << "gap byte " << i;
      }
    }
    served += length;
  }
  EXPECT_TRUE(source_.WaitIdle(kGenerousMs));
  EXPECT_EQ(server_->bytes_served(), served);
}

// Every refusal code the fetcher acts on comes back as itself, with its
// message (cut to the frame's bound), and leaves the connection usable.
TEST_P(TransportContractTest, EveryRefusalCodeComesBackAndTheMessageIsCut) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> out(100);
  iovec v{out.data(), out.size()};
  for (StatusCode code :
       {StatusCode::kNotFound, StatusCode::kAborted,
        StatusCode::kInvalidArgument, StatusCode::kResourceExhausted,
        StatusCode::kPermissionDenied}) {
    source_.set_refusal(Status(code, "refused with a reason"));
    Status s =
        c->Read(Req(0, 100, "other"), {&v, 1}, Deadline::AfterMs(kGenerousMs));
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find("refused with a reason"), std::string::npos)
        << s.ToString();
    EXPECT_FALSE(c->broken()) << s.ToString();
    ASSERT_TRUE(
        c->Read(Req(10, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
    EXPECT_TRUE(
        std::equal(out.begin(), out.end(), source_.data().begin() + 10));
  }
  source_.set_refusal(NotFound(std::string(5000, 'x')));
  Status s =
      c->Read(Req(0, 100, "other"), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(std::string(wire::kMaxMessageBytes, 'x')),
            std::string::npos);
  EXPECT_EQ(s.message().find(std::string(wire::kMaxMessageBytes + 1, 'x')),
            std::string::npos);
  EXPECT_TRUE(
      c->Read(Req(5, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
}

// A peer past the handshake that sends garbage is dropped; the other
// connections and new ones are served.
TEST_P(TransportContractTest, GarbageFromAPeerDropsOnlyThatConnection) {
  auto good = MustConnect();
  ASSERT_NE(good, nullptr);
  std::mt19937 rng(3);
  std::vector<std::string> frames;
  {  // random bytes
    std::string f(wire::kRequestHeaderBytes, '\0');
    for (char& ch : f) ch = static_cast<char>(rng());
    frames.push_back(f);
  }
  {  // good magic, model name too long
    std::string f = wire::EncodeReadRequest(Req(0, 10));
    f[4] = '\xFF';
    f[5] = '\xFF';
    frames.push_back(f.substr(0, wire::kRequestHeaderBytes));
  }
  frames.push_back(wire::EncodeReadRequest(Req(0, wire::kMaxReadBytes + 1)));
  std::vector<uint8_t> out(5000);
  iovec v{out.data(), out.size()};
  for (size_t i = 0; i < frames.size(); ++i) {
    Fd raw = RawConnect(server_->address());
    ASSERT_TRUE(raw.valid());
    ASSERT_TRUE(
        testing::SendAllRaw(raw.get(), frames[i].data(), frames[i].size()));
    EXPECT_TRUE(testing::ClosedByPeerWithin(raw.get(), kGenerousMs))
        << "frame " << i;
    ASSERT_TRUE(good->Read(Req(100 * i, out.size()), {&v, 1},
                           Deadline::AfterMs(kGenerousMs))
                    .ok());
    auto fresh = MustConnect();
    ASSERT_NE(fresh, nullptr);
    std::vector<uint8_t> small(100);
    iovec sv{small.data(), small.size()};
    ASSERT_TRUE(
        fresh->Read(Req(7, 100), {&sv, 1}, Deadline::AfterMs(kGenerousMs))
            .ok());
  }
  EXPECT_EQ(source_.begun(), 2 * static_cast<int>(frames.size()));
}

// Half a request, then silence: dropped by the stall timeout (the request's
// own deadline is an hour), and others are still served.
TEST_P(TransportContractTest, HalfARequestThenSilenceIsDroppedAfterTheStall) {
  ServerOptions o;
  o.io_stall_timeout_ms = 2000;
  RestartServer(o);
  Fd raw = RawConnect(server_->address());
  ASSERT_TRUE(raw.valid());
  std::string f = wire::EncodeReadRequest(Req(0, 10));
  ASSERT_TRUE(testing::SendAllRaw(raw.get(), f.data(), 20));
  EXPECT_TRUE(testing::ClosedByPeerWithin(raw.get(), kGenerousMs));
  auto good = MustConnect();
  ASSERT_NE(good, nullptr);
  std::vector<uint8_t> out(100);
  iovec v{out.data(), out.size()};
  EXPECT_TRUE(
      good->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
}

TEST_P(TransportContractTest, ConnectToAClosedPortIsUnavailable) {
  std::string address;
  {
    Result<Fd> l = ListenTcp("127.0.0.1:0", 1);
    ASSERT_TRUE(l.ok());
    Result<std::string> a = LocalAddress(l->get());
    ASSERT_TRUE(a.ok());
    address = *a;
  }
  // UNAVAILABLE, not DEADLINE_EXCEEDED: refused, not waited out.
  Result<std::unique_ptr<Connection>> c =
      transport_->Connect(address, Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable)
      << c.status().ToString();
  Result<std::unique_ptr<Connection>> bad =
      transport_->Connect("no-port-here", Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument)
      << bad.status().ToString();
}

// A holder that takes the request and does not answer (its source does not
// admit the read): the read ends by its own deadline, DEADLINE_EXCEEDED,
// and the connection is broken.
TEST_P(TransportContractTest, HolderThatDoesNotAnswerHitsTheReadDeadline) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  source_.Hold(true);
  std::vector<uint8_t> out(1000);
  iovec v{out.data(), out.size()};
  Status s = c->Read(Req(0, out.size()), {&v, 1}, Deadline::AfterMs(300));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_TRUE(c->broken());
  source_.Hold(false);
}

// Stop cuts a connection whose peer holds a lease (asked for a range and
// then neither reads it nor, over ucx, releases it) instead of waiting for
// the stall or release timeout, ends that lease, and refuses newcomers.
TEST_P(TransportContractTest, StopCutsAPeerHoldingALease) {
  ServerOptions o;
  o.io_stall_timeout_ms = 120000;
  o.local_release_timeout_ms = 120000;
  RestartServer(o);
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  Fd stuck = RawConnect(server_->address());
  ASSERT_TRUE(stuck.valid());
  std::string f = wire::EncodeReadRequest(Req(0, source_.data().size()));
  ASSERT_TRUE(testing::SendAllRaw(stuck.get(), f.data(), f.size()));
  ASSERT_TRUE(source_.WaitAsked(1, kGenerousMs));
  // The lease is taken once the read is admitted; the server then sends
  // (tcp: more than the socket buffers hold) or waits for the release.
  Deadline d = Deadline::AfterMs(kGenerousMs);
  while (source_.begun() < 1 && !d.expired()) std::this_thread::yield();
  ASSERT_EQ(source_.begun(), 1);
  server_->Stop();  // must return: the test would hang otherwise
  EXPECT_TRUE(source_.WaitIdle(0));
  server_->Stop();  // idempotent
  std::vector<uint8_t> out(10);
  iovec v{out.data(), out.size()};
  EXPECT_FALSE(c->Read(Req(0, 10), {&v, 1}, Deadline::AfterMs(5000)).ok());
  EXPECT_FALSE(
      transport_->Connect(server_->address(), Deadline::AfterMs(5000)).ok());
}

TEST_P(TransportContractTest, MaxConnectionsRefusesExtras) {
  ServerOptions o;
  o.max_connections = 2;
  RestartServer(o);
  auto a = MustConnect();
  auto b = MustConnect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> out(100);
  iovec v{out.data(), out.size()};
  ASSERT_TRUE(
      a->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  ASSERT_TRUE(
      b->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  // The kernel accepts the third; the server closes it at once, so the
  // handshake fails and Connect says so.
  Result<std::unique_ptr<Connection>> third =
      transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(third.status().code(), StatusCode::kUnavailable)
      << third.status().ToString();
  EXPECT_TRUE(
      a->Read(Req(1, 100), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  // Once one leaves, a newcomer gets in (after the server notices).
  a.reset();
  Deadline d = Deadline::AfterMs(kGenerousMs);
  bool served = false;
  while (!served && !d.expired()) {
    Result<std::unique_ptr<Connection>> n =
        transport_->Connect(server_->address(), Deadline::AfterMs(1000));
    served = n.ok() &&
             (*n)->Read(Req(0, 100), {&v, 1}, Deadline::AfterMs(1000)).ok();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served);
}

// Readers that do not prove the holder's secret (another, or none; or a
// secret the holder does not have) are refused, counted, and read nothing.
TEST_P(TransportContractTest, SharedSecretIsRequiredBothWays) {
  struct Case {
    const char* holder;
    const char* reader;
    bool served;
  };
  for (const Case& k :
       {Case{"s3cret", "s3cret", true}, Case{"s3cret", "other", false},
        Case{"s3cret", "", false}, Case{"", "s3cret", false}}) {
    auto holder = MakeTransport(GetParam(), k.holder);
    auto reader = MakeTransport(GetParam(), k.reader);
    ASSERT_NE(holder, nullptr);
    ASSERT_NE(reader, nullptr);
    Result<std::unique_ptr<Server>> server =
        holder->Listen("127.0.0.1:0", &source_, {});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    Result<std::unique_ptr<Connection>> conn =
        reader->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
    if (k.served) {
      ASSERT_TRUE(conn.ok()) << conn.status().ToString();
      std::vector<uint8_t> out(1000);
      iovec v{out.data(), out.size()};
      EXPECT_TRUE(
          (*conn)
              ->Read(Req(0, 1000), {&v, 1}, Deadline::AfterMs(kGenerousMs))
              .ok());
      EXPECT_EQ((*server)->connections_refused(), 0u);
      continue;
    }
    EXPECT_EQ(conn.status().code(), StatusCode::kPermissionDenied)
        << k.holder << "/" << k.reader << ": " << conn.status().ToString();
    Deadline d = Deadline::AfterMs(kGenerousMs);
    while ((*server)->connections_refused() == 0 && !d.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ((*server)->connections_refused(), 1u);
    EXPECT_EQ((*server)->bytes_served(), 0u);
  }
}

// A peer that skips the handshake and sends a request gets nothing (over
// ucx: not even the holder's UCX address).
TEST_P(TransportContractTest, RequestWithoutHandshakeIsRefused) {
  Result<Fd> fd =
      ConnectTcp(server_->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(fd.ok());
  std::string frame = wire::EncodeReadRequest(Req(0, 100));
  ASSERT_TRUE(testing::SendAllRaw(fd->get(), frame.data(), frame.size()));
  // Whatever the holder sent first (its challenge) is discarded: then EOF.
  EXPECT_TRUE(testing::ClosedByPeerWithin(fd->get(), kGenerousMs));
  EXPECT_EQ(source_.begun(), 0);
  EXPECT_EQ(server_->bytes_served(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContractTest,
                         ::testing::ValuesIn(Transports()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param;
                         });

TEST(UcxReplyTest, GrantsAndPieceHeadersRoundTripAndBadOnesAreRefused) {
  const ucx::Grant g{7, 1 << 20};
  std::string b = ucx::EncodeGrant(g);
  auto* p = reinterpret_cast<const uint8_t*>(b.data());
  Result<ucx::Grant> d = ucx::DecodeGrant(p, b.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, g);
  for (size_t cut = 0; cut < b.size(); ++cut) {
    EXPECT_EQ(ucx::DecodeGrant(p, cut).status().code(), StatusCode::kDataLoss);
  }
  for (uint64_t bad : {uint64_t{0}, ucx::kMinPieceBytes - 1,
                       ucx::kMaxPieceBytes + 1, ~uint64_t{0}}) {
    b = ucx::EncodeGrant({7, bad});
    EXPECT_FALSE(
        ucx::DecodeGrant(reinterpret_cast<const uint8_t*>(b.data()), b.size())
            .ok())
        << bad;
  }
  const ucx::PieceHeader h{7, 2 << 20};
  std::string hb = ucx::EncodePieceHeader(h);
  auto* hp = reinterpret_cast<const uint8_t*>(hb.data());
  ASSERT_TRUE(ucx::DecodePieceHeader(hp, hb.size()).ok());
  EXPECT_EQ(*ucx::DecodePieceHeader(hp, hb.size()), h);
  EXPECT_FALSE(ucx::DecodePieceHeader(hp, hb.size() - 1).ok());
  EXPECT_FALSE(ucx::DecodePieceHeader(nullptr, 0).ok());
  std::string a = ucx::EncodeAddress("worker");
  auto* ap = reinterpret_cast<const uint8_t*>(a.data());
  ASSERT_TRUE(ucx::DecodeAddressLength(ap, 4).ok());
  EXPECT_EQ(*ucx::DecodeAddressLength(ap, 4), 6u);
  EXPECT_FALSE(ucx::DecodeAddressLength(ap, 3).ok());
  a = ucx::EncodeAddress("");
  EXPECT_FALSE(
      ucx::DecodeAddressLength(reinterpret_cast<const uint8_t*>(a.data()), 4)
          .ok());
  std::string h2 = ucx::EncodeHelloHeader(ucx::kMaxWorkerAddressBytes + 1, {});
  EXPECT_FALSE(ucx::DecodeHelloHeader(
                   reinterpret_cast<const uint8_t*>(h2.data()), h2.size())
                   .ok());
}

// Where a piece may land: exactly the piece the read asked for at that
// index, never outside [0, length), never a piece of another read.
TEST(UcxReplyTest, APieceLandsOnlyWhereTheReadAskedForIt) {
  const ucx::Grant g{3, 4096};
  const uint64_t len = 3 * 4096 + 100;  // three whole pieces and a short one
  EXPECT_EQ(ucx::PieceCount(4096, len), 4u);
  EXPECT_EQ(ucx::PieceCount(4096, 0), 0u);
  EXPECT_EQ(ucx::PieceCount(4096, 4096), 1u);
  auto index = [&](uint64_t read, uint64_t off, uint64_t n) {
    return ucx::PieceIndex(g, len, {read, off}, n);
  };
  EXPECT_EQ(*index(3, 0, 4096), 0u);
  EXPECT_EQ(*index(3, 2 * 4096, 4096), 2u);
  EXPECT_EQ(*index(3, 3 * 4096, 100), 3u);
  for (auto bad : {index(4, 0, 4096),                    // another read
                   index(3, 1, 4096),                    // not at a boundary
                   index(3, 0, 4095),                    // short
                   index(3, 0, 4097),                    // long
                   index(3, 3 * 4096, 4096),             // past the end
                   index(3, 4 * 4096, 100),              // beyond the range
                   index(3, ~uint64_t{0} - 4095, 4096),  // wraps around
                   index(3, 0, 0)}) {
    EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss)
        << bad.status().ToString();
  }
}

TEST(UcxHelloTest, CarriesTheHoldersHostIdentity) {
  wire::HostIdentity id;
  for (size_t i = 0; i < id.boot_id.size(); ++i) id.boot_id[i] = uint8_t(i + 1);
  id.pid_ns = 0x1122334455667788ull;
  id.net_ns = 42;
  std::string h = ucx::EncodeHelloHeader(300, id);
  ASSERT_EQ(h.size(), ucx::kHelloHeaderBytes);
  auto got = ucx::DecodeHelloHeader(reinterpret_cast<const uint8_t*>(h.data()),
                                    h.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->address_len, 300u);
  EXPECT_EQ(got->host, id);
  // Cut anywhere: an error, never a read past the end.
  for (size_t n = 0; n < h.size(); ++n) {
    EXPECT_EQ(
        ucx::DecodeHelloHeader(reinterpret_cast<const uint8_t*>(h.data()), n)
            .status()
            .code(),
        StatusCode::kDataLoss)
        << n;
  }
  // An older holder's hello: a refusal on principle that says what to do
  // (the reader then reads that holder over TCP).
  std::string old = h;
  for (const char version : {'1', '2'}) {
    old[0] = 'T', old[1] = 'H', old[2] = 'U', old[3] = version;
    auto refused = ucx::DecodeHelloHeader(
        reinterpret_cast<const uint8_t*>(old.data()), old.size());
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("upgrade"), std::string::npos);
  }
  // No worker address: the holder had none to give this connection.
  std::string none = ucx::EncodeHelloHeader(0, id);
  auto to_tcp = ucx::DecodeHelloHeader(
      reinterpret_cast<const uint8_t*>(none.data()), none.size());
  EXPECT_EQ(to_tcp.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(to_tcp.status().message().find("read it over tcp"),
            std::string::npos)
      << to_tcp.status().ToString();
}

// Every listening TCP socket of this process, as "ADDRESS:PORT".
std::vector<std::string> ListeningSockets() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        !listening) {
      continue;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {0};
    int port = 0;
    if (ss.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      port = ntohs(a->sin6_port);
    } else {
      continue;
    }
    out.push_back(std::string(host) + ":" + std::to_string(port));
  }
  ::closedir(d);
  return out;
}

bool HasNonLoopbackInterface() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
      found = true;
    }
  }
  ::freeifaddrs(ifs);
  return found;
}

// Whether an IPv4 interface other than loopback is up and running here
// (in the calling thread's network namespace).
bool InterfaceRunning(const char* name) {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        std::strcmp(i->ifa_name, name) == 0 && (i->ifa_flags & IFF_UP) &&
        (i->ifa_flags & IFF_RUNNING)) {
      found = true;
    }
  }
  ::freeifaddrs(ifs);
  return found;
}

// Makes this process's own network namespace, with loopback and a veth
// pair, 10.27.0.1 on one end (an interface besides loopback on any machine,
// even one with loopback alone), and a mount namespace whose /sys is that
// network namespace's (UCX finds network devices in /sys/class/net, which
// otherwise still lists the host's). Nothing of the host's network is
// touched; both namespaces go with the process. "" when done, else why
// not (it needs root).
std::string EnterANetworkNamespaceOfItsOwn() {
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
    return std::string("unshare: ") + std::strerror(errno);
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
    return std::string("mounting /sys: ") + std::strerror(errno);
  }
  const int rc = std::system(
      "ip link set lo up && ip link add th-ucx0 type veth peer name th-ucx1 "
      "&& ip link set th-ucx1 up && ip addr add 10.27.0.1/24 dev th-ucx0 "
      "&& ip link set th-ucx0 up");
  if (rc != 0) {
    return "ip could not make a veth pair (status " + std::to_string(rc) + ")";
  }
  // A veth's carrier comes up once both ends are: a bounded wait for it.
  const Deadline up = Deadline::AfterMs(kGenerousMs);
  while (!InterfaceRunning("th-ucx0")) {
    if (up.expired()) return "th-ucx0 did not come up";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

// Holder and reader in this process, data plane on loopback, a UCX read
// open: "" when nothing of this process listens but on loopback, else
// what does. Prints what listens.
std::string WhatListensBeyondLoopbackDuringAUcxRead() {
  if (!HasNonLoopbackInterface()) return "no interface but loopback here";
  if (InterfaceOf("127.0.0.1") != "lo") return "127.0.0.1 is not on lo";
  if (!InterfaceOf("0.0.0.0").empty()) return "0.0.0.0 names an interface";
  UcxTransportOptions o;
  o.listen_host = "127.0.0.1";
  o.allow_emulated_gets = true;
  Result<std::unique_ptr<Transport>> holder = MakeUcxTransport(o);
  Result<std::unique_ptr<Transport>> reader = MakeUcxTransport(o);
  if (!holder.ok()) return holder.status().ToString();
  if (!reader.ok()) return reader.status().ToString();
  TestSource source(1 << 20);
  Result<std::unique_ptr<Server>> server =
      (*holder)->Listen("127.0.0.1:0", &source, {});
  if (!server.ok()) return server.status().ToString();
  Result<std::unique_ptr<Connection>> c =
      (*reader)->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
  if (!c.ok()) return c.status().ToString();
  std::vector<uint8_t> out(4096);
  iovec v{out.data(), out.size()};
  Status read =
      (*c)->Read(Req(0, out.size()), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  if (!read.ok()) return read.ToString();
  std::string all, beyond;
  for (const std::string& l : ListeningSockets()) {
    all += l + " ";
    if (l.rfind("127.", 0) != 0 && l.rfind("::1:", 0) != 0) beyond += l + " ";
  }
  std::fprintf(stderr, "listening during a UCX read (UCX_TLS=%s): %s\n",
               std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "(unset)",
               all.c_str());
  c->reset();
  (*server)->Stop();
  return beyond.empty() ? "" : "listening on " + beyond;
}

// Issue 27, finding 5: with the data plane on loopback, the UCX worker of a
// reader's connection listened on the machine's external address too. Now
// UCX is limited to the data plane's interface: while a reader's
// connection is open, nothing of this process listens anywhere else
// (UCX_NET_DEVICES=all makes it fail). Run as root, in a child process in
// namespaces of its own that give it an interface besides loopback on any
// machine (before, the test skipped on a machine with loopback alone);
// else in this process, where the host has such an interface.
TEST(UcxListenTest, WorkersListenOnlyOnTheDataPlanesInterface) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  if (::geteuid() == 0) {
    // The child is this binary run again for this test alone, not a fork
    // of a process that has threads.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
          const std::string no_namespace = EnterANetworkNamespaceOfItsOwn();
          if (!no_namespace.empty()) {
            std::fprintf(stderr, "no namespace of its own: %s\n",
                         no_namespace.c_str());
            std::_Exit(2);
          }
          const std::string wrong = WhatListensBeyondLoopbackDuringAUcxRead();
          std::fprintf(stderr, "%s\n", wrong.empty() ? "ok" : wrong.c_str());
          std::_Exit(wrong.empty() ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "listening during a UCX read");
    return;
  }
  if (!HasNonLoopbackInterface()) {
    GTEST_SKIP() << "not root (no namespace of its own) and no interface but "
                    "loopback here: run it as root";
  }
  const std::string wrong = WhatListensBeyondLoopbackDuringAUcxRead();
  EXPECT_EQ(wrong, "");
}

// A new connection from `t` to `address` reads 4 KiB of the test source.
void ExpectAFreshReaderReads(Transport& t, const std::string& address) {
  Result<std::unique_ptr<Connection>> c =
      t.Connect(address, Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> out(4096);
  iovec v{out.data(), out.size()};
  Status s =
      (*c)->Read(Req(0, out.size()), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// What ucp_context_print_info printed on this VM (UCX 1.13, no RDMA), and
// the shape of its lines for an RDMA host limited to rc and dc (ud only for
// connection set-up: the 'a' flag), as ucp_context.c prints them.
constexpr char kVmContext[] =
    "#\n# UCP context\n#\n#     component 0  :  self\n"
    "#            md 1  :  component 1  tcp \n#\n"
    "#      resource 0  :  md 0  dev 0  flags -- self/memory0\n"
    "#      resource 1  :  md 1  dev 1  flags -- tcp/lo\n"
    "#      resource 2  :  md 1  dev 2  flags -- tcp/eth0\n"
    "#      resource 3  :  md 2  dev 3  flags -- sysv/memory\n"
    "#      resource 4  :  md 3  dev 3  flags -- posix/memory\n"
    "#      resource 5  :  md 4  dev 3  flags -- cma/memory\n#\n";
constexpr char kRdmaContext[] =
    "#      resource 0  :  md 0  dev 0  flags -- rc_mlx5/mlx5_0:1\n"
    "#      resource 1  :  md 0  dev 0  flags a- ud_mlx5/mlx5_0:1\n"
    "#      resource 2  :  md 0  dev 0  flags -- dc_mlx5/mlx5_0:1\n"
    "#      resource 3  :  md 1  dev 1  flags -- rc_verbs/mlx4_0:1\n"
    "#      resource 4  :  md 1  dev 1  flags a- ud_verbs/mlx4_0:1\n";

// Issue 27, item 5: which wires a UCX transport may use without the
// opt-in. Pure (runs without TH_UCX too).
TEST(UcxWiresTest, OnlyRdmaWiresHaveTheirGetsChecked) {
  std::vector<ucx::Wire> vm = ucx::ParseContextWires(kVmContext);
  ASSERT_EQ(vm.size(), 6u);
  EXPECT_EQ(vm[1].transport, "tcp");
  EXPECT_EQ(vm[1].device, "lo");
  EXPECT_FALSE(vm[1].aux);
  EXPECT_EQ(ucx::UncheckedGetWires(vm),
            (std::vector<std::string>{"tcp/lo", "tcp/eth0", "sysv/memory",
                                      "posix/memory", "cma/memory"}));
  std::vector<ucx::Wire> rdma = ucx::ParseContextWires(kRdmaContext);
  ASSERT_EQ(rdma.size(), 5u);
  EXPECT_TRUE(rdma[1].aux);
  EXPECT_EQ(rdma[0].device, "mlx5_0:1");
  EXPECT_TRUE(ucx::UncheckedGetWires(rdma).empty());
  // ud as a data wire has no RDMA read: UCX emulates gets over it.
  EXPECT_FALSE(ucx::GetsCheckedByHardware({"ud_verbs", "mlx4_0:1", false}));
  EXPECT_FALSE(ucx::GetsCheckedByHardware({"cuda_ipc", "cuda", false}));
  EXPECT_FALSE(ucx::GetsCheckedByHardware({"xpmem", "memory", false}));
  // Lines of other shapes are not wires.
  EXPECT_TRUE(ucx::ParseContextWires("# resource\nflags --\n\n").empty());

  const Status refusal = ucx::EmulatedGetsRefusal({"tcp/lo"});
  EXPECT_EQ(refusal.code(), StatusCode::kFailedPrecondition);
  for (const char* want : {"tcp/lo", "TENSORHUB_UCX_EMULATED_GETS=allow",
                           "UCX_TLS=rc", "What a UCX peer can reach"}) {
    EXPECT_NE(refusal.message().find(want), std::string::npos) << want;
  }
}

TEST(UcxWiresTest, TheOptInIsAllowRefuseOrUnsetAndNothingElse) {
  const char* was = std::getenv(ucx::kEmulatedGetsEnv);
  const std::string saved = was != nullptr ? was : "";
  ::unsetenv(ucx::kEmulatedGetsEnv);
  EXPECT_EQ(ucx::EmulatedGetsAllowedByEnv().value(), false);
  ::setenv(ucx::kEmulatedGetsEnv, "refuse", 1);
  EXPECT_EQ(ucx::EmulatedGetsAllowedByEnv().value(), false);
  ::setenv(ucx::kEmulatedGetsEnv, "allow", 1);
  EXPECT_EQ(ucx::EmulatedGetsAllowedByEnv().value(), true);
  ::setenv(ucx::kEmulatedGetsEnv, "1", 1);
  Result<bool> bad = ucx::EmulatedGetsAllowedByEnv();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'allow'"), std::string::npos);
  if (was != nullptr) {
    ::setenv(ucx::kEmulatedGetsEnv, saved.c_str(), 1);
  } else {
    ::unsetenv(ucx::kEmulatedGetsEnv);
  }
}

// Issue 27, item 5, on this machine's UCX: every wire ctest runs this
// binary over (tcp; sm,self; cma,posix,self; posix,sysv,self) is one whose
// gets nothing checks, so a transport made without the opt-in is refused,
// naming those wires and the opt-in; before, it was made, and a peer that
// proved the secret could read any memory of its holder. With the opt-in
// it moves bytes as before (every other UCX test here).
TEST(UcxEmulatedGetsTest, RefusedWithoutTheOptInNamingTheWires) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  UcxTransportOptions o;
  o.listen_host = "127.0.0.1";
  Result<std::unique_ptr<Transport>> t = MakeUcxTransport(o);
  ASSERT_FALSE(t.ok()) << "UCX_TLS="
                       << (std::getenv("UCX_TLS") ? std::getenv("UCX_TLS")
                                                  : "(unset)");
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition)
      << t.status().ToString();
  EXPECT_NE(t.status().message().find("TENSORHUB_UCX_EMULATED_GETS=allow"),
            std::string::npos)
      << t.status().ToString();
  const std::string tls =
      std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : "";
  const std::string first_wire = tls.substr(0, tls.find(','));
  if (!first_wire.empty() && first_wire != "sm" && first_wire != "all") {
    EXPECT_NE(t.status().message().find(first_wire + "/"), std::string::npos)
        << t.status().ToString();
  }
  std::printf("without the opt-in (UCX_TLS=%s): %s\n",
              tls.empty() ? "(unset)" : tls.c_str(),
              t.status().ToString().c_str());
  o.allow_emulated_gets = true;
  std::unique_ptr<Transport> holder = MakeTransport("ucx");
  ASSERT_NE(holder, nullptr);
  TestSource source(1 << 20);
  Result<std::unique_ptr<Server>> server =
      holder->Listen("127.0.0.1:0", &source, ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<std::unique_ptr<Transport>> reader = MakeUcxTransport(o);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ExpectAFreshReaderReads(**reader, (*server)->address());
  (*server)->Stop();
}

#if defined(TH_UCX_RAW_TEST)
// What a forging reader asks UCX for: RMA, to send gets and puts.
constexpr uint64_t kForgerFeatures = UCP_FEATURE_RMA | UCP_FEATURE_AM;

// Raw UCX beside the transport, as a peer that proved the secret and runs
// an unmodified UCX could use it: a holder's context made with `features`,
// with one region registered read-only (as the transport once registered
// published memory), and a reader's context with RMA, whose endpoint
// reaches the holder's worker over the wires UCX_TLS names. Both progressed
// by the calling thread.
class RawUcxPeers {
 public:
  ~RawUcxPeers() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep_, &p);
      const Deadline d = Deadline::AfterMs(kGenerousMs);
      while (UCS_PTR_IS_PTR(r) &&
             ucp_request_check_status(r) == UCS_INPROGRESS && !d.expired()) {
        Progress();
      }
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
    for (void* r : pending_) ucp_request_free(r);
    if (packed_ != nullptr) ucp_rkey_buffer_release(packed_);
    if (memh_ != nullptr) ucp_mem_unmap(holder_ctx_, memh_);
    if (reader_ != nullptr) ucp_worker_destroy(reader_);
    if (holder_ != nullptr) ucp_worker_destroy(holder_);
    if (reader_ctx_ != nullptr) ucp_cleanup(reader_ctx_);
    if (holder_ctx_ != nullptr) ucp_cleanup(holder_ctx_);
  }

  // "" when made, else what failed.
  std::string Make(uint64_t holder_features, void* region, size_t len) {
    if (!Init(holder_features, &holder_ctx_) ||
        !Init(kForgerFeatures, &reader_ctx_)) {
      return "ucp_init";
    }
    ucp_worker_params_t wp{};
    if (ucp_worker_create(holder_ctx_, &wp, &holder_) != UCS_OK ||
        ucp_worker_create(reader_ctx_, &wp, &reader_) != UCS_OK) {
      return "ucp_worker_create";
    }
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = region;
    mp.length = len;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ;
    size_t packed_len = 0;
    if (ucp_mem_map(holder_ctx_, &mp, &memh_) != UCS_OK) return "ucp_mem_map";
    if (ucp_rkey_pack(holder_ctx_, memh_, &packed_, &packed_len) != UCS_OK) {
      return "ucp_rkey_pack";
    }
    ucp_address_t* address = nullptr;
    size_t address_len = 0;
    if (ucp_worker_get_address(holder_, &address, &address_len) != UCS_OK) {
      return "ucp_worker_get_address";
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = address;
    const ucs_status_t s = ucp_ep_create(reader_, &ep, &ep_);
    ucp_worker_release_address(holder_, address);
    if (s != UCS_OK) return "ucp_ep_create";
    if (ucp_ep_rkey_unpack(ep_, packed_, &rkey_) != UCS_OK) {
      return "ucp_ep_rkey_unpack";
    }
    return "";
  }

  // A get of `len` bytes at `remote` into `dst` (put: from `dst` to
  // `remote`, then a flush, which completes once the holder acknowledged
  // it), with the holder's key; progresses both workers until that
  // completes, or until the holder's UCX said it has no handler for a
  // message it got. UCS_INPROGRESS in the second case.
  ucs_status_t Move(bool put, void* dst, size_t len, const void* remote) {
    const uint64_t at = reinterpret_cast<uint64_t>(remote);
    ucp_request_param_t p{};
    if (!put) return Wait(ucp_get_nbx(ep_, dst, len, at, rkey_, &p));
    const ucs_status_t s = Wait(ucp_put_nbx(ep_, dst, len, at, rkey_, &p));
    if (s != UCS_OK) return s;
    return Wait(ucp_ep_flush_nbx(ep_, &p));
  }

  static std::atomic<int> g_unhandled_messages;

  // Counts UCX's "got active message id N, but no handler installed"
  // (uct_iface.c), and lets the line through to the other handlers.
  static ucs_log_func_rc_t CountUnhandled(const char*, unsigned, const char*,
                                          ucs_log_level_t,
                                          const ucs_log_component_config_t*,
                                          const char* format, va_list) {
    if (std::strstr(format, "no handler installed") != nullptr) {
      g_unhandled_messages.fetch_add(1);
    }
    return UCS_LOG_FUNC_RC_CONTINUE;
  }

 private:
  static bool Init(uint64_t features, ucp_context_h* out) {
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = features;
    return ucp_init(&p, nullptr, out) == UCS_OK;
  }
  void Progress() {
    (void)ucp_worker_progress(reader_);
    (void)ucp_worker_progress(holder_);
  }

  ucs_status_t Wait(void* r) {
    if (!UCS_PTR_IS_PTR(r)) return UCS_PTR_STATUS(r);
    const int unhandled = g_unhandled_messages.load();
    const Deadline d = Deadline::AfterMs(kGenerousMs);
    ucs_status_t s = UCS_INPROGRESS;
    while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           g_unhandled_messages.load() == unhandled && !d.expired()) {
      Progress();
    }
    // One the holder never answers ends with the endpoint's close (UCX
    // then warns that requests were not returned to its pool).
    if (s != UCS_INPROGRESS) ucp_request_free(r);
    if (s == UCS_INPROGRESS) pending_.push_back(r);
    return s;
  }

  ucp_context_h holder_ctx_ = nullptr;
  ucp_context_h reader_ctx_ = nullptr;
  ucp_worker_h holder_ = nullptr;
  ucp_worker_h reader_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  void* packed_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  std::vector<void*> pending_;
};
std::atomic<int> RawUcxPeers::g_unhandled_messages{0};

// Why no context of the transport asks UCX for RMA (docs/security.md,
// "What a UCX peer can reach"), shown on every wire this binary runs over
// (tcp; sm,self; cma,posix,self; posix,sysv,self): a holder's context with
// UCP_FEATURE_RMA lets a peer running an unmodified UCX, holding the key of
// one read-only registration, read memory of the holder's process that was
// never registered, and write into the read-only registration and beyond
// it (UCX 1.13's ucp_get_req_handler and ucp_put_handler copy from and to
// the address a message names; the key's protection is the NIC's to check,
// and there is none). A context with the transport's features answers no
// get and no put: UCX installs no handler for them (ucp_worker.c,
// ucp_worker_set_am_handlers). Fails on a build whose contexts ask for RMA
// (the gets of the data plane before active messages).
TEST(UcxForgedRmaTest, OnlyAContextWithRmaAnswersAPeersGetsAndPuts) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  EXPECT_EQ(UcxContextFeaturesForTest() & UCP_FEATURE_RMA, 0u);
  EXPECT_NE(UcxContextFeaturesForTest() & UCP_FEATURE_AM, 0u);
  ucs_log_push_handler(&RawUcxPeers::CountUnhandled);
  static char published[4096];
  static char secret[64];
  for (const bool holder_has_rma : {true, false}) {
    SCOPED_TRACE(holder_has_rma ? "a holder with UCP_FEATURE_RMA"
                                : "the transport's features");
    std::strcpy(published, "published");
    std::strcpy(secret, "never published");
    RawUcxPeers peers;
    const uint64_t features =
        holder_has_rma ? (UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP)
                       : UcxContextFeaturesForTest();
    ASSERT_EQ(peers.Make(features, published, sizeof(published)), "");
    char got[32] = {0};
    const ucs_status_t read =
        peers.Move(false, got, sizeof(secret) / 2, secret);
    char mine[] = "written by a reader";
    const ucs_status_t wrote_published =
        peers.Move(true, mine, sizeof(mine), published);
    const ucs_status_t wrote_beyond =
        peers.Move(true, mine, sizeof(mine), secret);
    if (holder_has_rma) {
      EXPECT_EQ(read, UCS_OK);
      EXPECT_STREQ(got, "never published");
      EXPECT_EQ(wrote_published, UCS_OK);
      EXPECT_STREQ(published, mine);
      EXPECT_EQ(wrote_beyond, UCS_OK);
      EXPECT_STREQ(secret, mine);
    } else {
      EXPECT_EQ(read, UCS_INPROGRESS);
      EXPECT_STREQ(got, "");
      EXPECT_EQ(wrote_published, UCS_INPROGRESS);
      EXPECT_STREQ(published, "published");
      EXPECT_EQ(wrote_beyond, UCS_INPROGRESS);
      EXPECT_STREQ(secret, "never published");
    }
  }
  ucs_log_pop_handler();
}

// A reader that proved the secret and then forges UCX gets and puts, with
// its own UCX made with RMA, at the worker of a real holder (one that
// MakeUcxTransport made, serving its connection): the holder answers
// neither, and no byte of its process is read or written.
TEST(UcxForgedRmaTest, ARealHolderAnswersNoForgedGetOrPut) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  TestSource source(1 << 16);
  std::unique_ptr<Transport> transport = MakeTransport("ucx");
  ASSERT_NE(transport, nullptr);
  Result<std::unique_ptr<Server>> server =
      transport->Listen("127.0.0.1:0", &source, ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const Deadline d = Deadline::AfterMs(kGenerousMs);
  Result<Fd> fd = ConnectTcp((*server)->address(), d);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(ClientHandshake(fd->get(), "", d).ok());
  uint8_t hello[ucx::kHelloHeaderBytes];
  ASSERT_TRUE(ReadExact(fd->get(), hello, sizeof(hello), d).ok());
  Result<ucx::Hello> h = ucx::DecodeHelloHeader(hello, sizeof(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::string holder(h->address_len, '\0');
  ASSERT_TRUE(ReadExact(fd->get(), holder.data(), holder.size(), d).ok());

  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  ucp_mem_h memh = nullptr;
  void* packed = nullptr;
  ucp_rkey_h rkey = nullptr;
  static char mine[4096];
  static char secret[64];
  std::strcpy(secret, "never published");
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = kForgerFeatures;
  ASSERT_EQ(ucp_init(&p, nullptr, &ctx), UCS_OK);
  ucp_worker_params_t wp{};
  ASSERT_EQ(ucp_worker_create(ctx, &wp, &worker), UCS_OK);
  // As a reader does: its worker's address to the holder, which connects
  // to it and serves on.
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  ASSERT_EQ(ucp_worker_get_address(worker, &address, &address_len), UCS_OK);
  std::string message = ucx::EncodeAddress(
      std::string(reinterpret_cast<const char*>(address), address_len));
  ucp_worker_release_address(worker, address);
  iovec v{message.data(), message.size()};
  ASSERT_TRUE(WriteAll(fd->get(), {&v, 1}, d).ok());
  ucp_ep_params_t ep_params{};
  ep_params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(holder.data());
  // As the holder's endpoint to this worker asks (UCX refuses a pair of
  // endpoints that differ), where the wires can.
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) {
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ASSERT_EQ(ucp_ep_create(worker, &ep_params, &ep), UCS_OK);
  }
  // A key of its own (the holder hands out none), as a forger would pack.
  ucp_mem_map_params_t mp{};
  mp.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = mine;
  mp.length = sizeof(mine);
  ASSERT_EQ(ucp_mem_map(ctx, &mp, &memh), UCS_OK);
  size_t packed_len = 0;
  ASSERT_EQ(ucp_rkey_pack(ctx, memh, &packed, &packed_len), UCS_OK);
  ASSERT_EQ(ucp_ep_rkey_unpack(ep, packed, &rkey), UCS_OK);

  ucs_log_push_handler(&RawUcxPeers::CountUnhandled);
  std::vector<void*> unanswered;
  // Progresses the forger (the holder's serving thread progresses its own
  // worker) until `r` completes or the holder's UCX said it has no
  // handler for what it got since there were `unhandled` such messages
  // (the holder's thread may say so before the forger waits).
  auto wait = [&](void* r, int unhandled) -> ucs_status_t {
    if (!UCS_PTR_IS_PTR(r)) return UCS_PTR_STATUS(r);
    const Deadline by = Deadline::AfterMs(kGenerousMs);
    ucs_status_t s = UCS_INPROGRESS;
    while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           RawUcxPeers::g_unhandled_messages.load() == unhandled &&
           !by.expired()) {
      (void)ucp_worker_progress(worker);
    }
    if (s == UCS_INPROGRESS) {
      unanswered.push_back(r);
    } else {
      ucp_request_free(r);
    }
    return s;
  };
  ucp_request_param_t rp{};
  char got[32] = {0};
  const uint64_t at = reinterpret_cast<uint64_t>(secret);
  int unhandled = RawUcxPeers::g_unhandled_messages.load();
  EXPECT_EQ(wait(ucp_get_nbx(ep, got, 16, at, rkey, &rp), unhandled),
            UCS_INPROGRESS);
  char forged[] = "written by a reader";
  unhandled = RawUcxPeers::g_unhandled_messages.load();
  // A put completes at the forger once sent; its flush once the holder
  // acknowledged it.
  ucs_status_t put =
      wait(ucp_put_nbx(ep, forged, sizeof(forged), at, rkey, &rp), unhandled);
  if (put == UCS_OK) put = wait(ucp_ep_flush_nbx(ep, &rp), unhandled);
  EXPECT_EQ(put, UCS_INPROGRESS);
  // Both went to a holder that had no handler for them.
  EXPECT_GE(RawUcxPeers::g_unhandled_messages.load(), unhandled + 1);
  ucs_log_pop_handler();
  EXPECT_STREQ(got, "");
  EXPECT_STREQ(secret, "never published");

  fd->Reset();  // the holder drops its side
  ucp_rkey_destroy(rkey);
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* closing = ucp_ep_close_nbx(ep, &close);
  const Deadline by = Deadline::AfterMs(kGenerousMs);
  while (UCS_PTR_IS_PTR(closing) &&
         ucp_request_check_status(closing) == UCS_INPROGRESS && !by.expired()) {
    (void)ucp_worker_progress(worker);
  }
  if (UCS_PTR_IS_PTR(closing)) ucp_request_free(closing);
  for (void* r : unanswered) ucp_request_free(r);
  ucp_rkey_buffer_release(packed);
  ucp_mem_unmap(ctx, memh);
  ucp_worker_destroy(worker);
  ucp_cleanup(ctx);
  // The holder serves on.
  ExpectAFreshReaderReads(*transport, (*server)->address());
}
#endif  // TH_UCX_RAW_TEST

// Every UCX reader connection costs the holder a worker (descriptors,
// memory). A holder that cannot make one, here because this process may
// open no more descriptors, says so in the hello, and the reader's connect
// fails with FAILED_PRECONDITION pointing to tcp (which its fetch plan
// takes: FetchPlanTest's ARefusalOverAnotherTransportMovesTheHolderToTcp)
// instead of a dead source; the holder goes on serving once it can.
TEST(UcxWorkerShortageTest, AHolderWithNoWorkerToSpareSendsTheReaderToTcp) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  if (kUnderSanitizer) {
    // The limit below is this whole process's: the sanitizer runtime then
    // cannot make the pipe it checks memory with, and UBSan reports every
    // object it looks at as having an invalid vptr.
    GTEST_SKIP() << "needs the process's descriptors to itself; a sanitizer "
                    "runtime uses some (the release build runs it)";
  }
  TestSource source(1 << 20);
  std::unique_ptr<Transport> t = MakeTransport("ucx");
  ASSERT_NE(t, nullptr);
  Result<std::unique_ptr<Server>> server =
      t->Listen("127.0.0.1:0", &source, ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  rlimit was{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  // Fill every unused descriptor number below the highest one in use, so
  // that a limit of (highest + 3) leaves exactly two: the reader's socket
  // and the holder's accepted one. The holder's worker then cannot get its
  // own (UCX needs several).
  std::vector<int> filler;
  int highest = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(e.path().filename().string()));
  }
  for (;;) {
    int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    if (fd > highest) {
      ::close(fd);
      break;
    }
    filler.push_back(fd);
  }
  rlimit tight = was;
  tight.rlim_cur = static_cast<rlim_t>(highest) + 3;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  Result<std::unique_ptr<Connection>> c =
      t->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
  for (int fd : filler) ::close(fd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("no UCX worker"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("read it over tcp"), std::string::npos)
      << c.status().ToString();

  ExpectAFreshReaderReads(*t, (*server)->address());
  (*server)->Stop();
}

// A holder whose lease is device memory refuses a UCX read with
// FAILED_PRECONDITION that says to read it over tcp (a reader's fetch plan
// then moves that holder to TCP: FetchPlanTest's
// ARefusalOverAnotherTransportMovesTheHolderToTcp), and the connection
// stays usable. No GPU needed: the server refuses before it touches the
// memory, which here is host memory labelled as device 0's.
TEST(UcxDeviceMemoryTest, DeviceMemoryIsRefusedWithAPointerToTcp) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  class DeviceSource final : public ReadSource {
   public:
    Result<ServeLease> BeginRead(const wire::ReadRequest& req) override {
      ServeLease lease;
      lease.pieces.push_back({bytes_.data(), req.length});
      lease.memory = MemoryLocation::Cuda(0);
      return lease;
    }

   private:
    std::vector<uint8_t> bytes_ = std::vector<uint8_t>(4096);
  } source;
  std::unique_ptr<Transport> t = MakeTransport("ucx");
  ASSERT_NE(t, nullptr);
  Result<std::unique_ptr<Server>> server =
      t->Listen("127.0.0.1:0", &source, ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<std::unique_ptr<Connection>> c =
      t->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> out(4096);
  iovec v{out.data(), out.size()};
  for (int i = 0; i < 2; ++i) {
    Status s =
        (*c)->Read(Req(0, out.size()), {&v, 1}, Deadline::AfterMs(kGenerousMs));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("over tcp"), std::string::npos) << s.ToString();
    EXPECT_FALSE((*c)->broken());
  }
  (*server)->Stop();
}

// A reader that refuses same-host holders (as a worker does unless told
// ucx_same_host) fails to connect to one with FAILED_PRECONDITION that
// points to tcp, and its fetch plan moves the holder there; the same
// holder is read over UCX by a reader that does not refuse.
TEST(UcxSameHostTest, AReaderOnTheHoldersHostIsPointedToTcp) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  if (!ReadHostIdentity().ok()) GTEST_SKIP() << "no /proc host identity here";
  TestSource source(1 << 20);
  std::unique_ptr<Transport> holder = MakeTransport("ucx");
  ASSERT_NE(holder, nullptr);
  Result<std::unique_ptr<Server>> server =
      holder->Listen("127.0.0.1:0", &source, ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  UcxTransportOptions o;
  o.refuse_same_host = true;
  o.allow_emulated_gets = true;
  Result<std::unique_ptr<Transport>> refusing = MakeUcxTransport(o);
  ASSERT_TRUE(refusing.ok()) << refusing.status().ToString();
  Result<std::unique_ptr<Connection>> c = (*refusing)->Connect(
      (*server)->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("read it over tcp"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("TENSORHUB_UCX_SAME_HOST"),
            std::string::npos);

  ExpectAFreshReaderReads(*holder, (*server)->address());
  (*server)->Stop();
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
  Status ReadInto(std::vector<uint8_t>& out, uint64_t offset,
                  ReadChecksum* sum = nullptr) {
    iovec v{out.data(), out.size()};
    return conn_->Read(RegReq(offset, out.size()), {&v, 1},
                       Deadline::AfterMs(kGenerousMs), sum);
  }

  // After a reader gave up on the holder mid-read: the holder is alive and
  // serves a new reader byte-exact, and the abandoned read's lease ended
  // (an unpublish's drain returns).
  void ExpectTheHolderServesOnAndDrains() {
    Result<std::unique_ptr<Connection>> again =
        transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    std::vector<uint8_t> out(flat_.size());
    iovec v{out.data(), out.size()};
    Status read = (*again)->Read(RegReq(0, out.size()), {&v, 1},
                                 Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(read.ok()) << read.ToString();
    EXPECT_EQ(out, flat_);
    Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
    ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
    Status drained = registry_.Drain("m", Version(1), *revoked,
                                     Deadline::AfterMs(kGenerousMs));
    EXPECT_TRUE(drained.ok()) << drained.ToString();
  }

  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<uint8_t> flat_;
  client::Registry registry_;
  uint64_t epoch_ = 0;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Connection> conn_;
};

TEST_F(UcxRegistryTest, ReadsVerifiedAcrossAllocationsAndNoneAfterTheDrain) {
  std::vector<uint8_t> out(flat_.size() - 100);
  // Pieces of 1 MiB (rendezvous, where UCX chooses it) across three
  // separate allocations, hashed as they land.
  ReadChecksum sum{.kind = ChunkChecksum::kXxh3};
  ASSERT_TRUE(ReadInto(out, 50, &sum).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), flat_.begin() + 50));
  EXPECT_EQ(sum.value,
            ChunkSum(ChunkChecksum::kXxh3, flat_.data() + 50, out.size()));
  for (int i = 0; i < 3; ++i) {
    // Small reads: one eager piece each.
    std::vector<uint8_t> part(4096 + i);
    ReadChecksum small{.kind = ChunkChecksum::kXxh3};
    ASSERT_TRUE(ReadInto(part, 1000 * i, &small).ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), flat_.begin() + 1000 * i));
    EXPECT_EQ(small.value, ChunkSum(ChunkChecksum::kXxh3,
                                    flat_.data() + 1000 * i, part.size()));
  }
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs))
          .ok());
  std::vector<uint8_t> late(100);
  Status s = ReadInto(late, 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

// Holds the threads that reach a test point there until Release(): by
// default UCX reads at `ucx.read_landed` (their bytes landed, their release
// not sent). Disarmed by Disarm() or at the end of the scope.
class PointHold {
 public:
  explicit PointHold(std::string point = "ucx.read_landed")
      : point_(std::move(point)) {
    testpoint::Arm(point_, [this](uint64_t) {
      std::unique_lock<std::mutex> l(mu_);
      hit_ = true;
      cv_.notify_all();
      cv_.wait(l, [&] { return go_; });
    });
  }
  ~PointHold() {
    Release();
    Disarm();
  }
  // Whether a thread reached the point within kGenerousMs.
  bool WaitHit() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                        [&] { return hit_; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    go_ = true;
    cv_.notify_all();
  }
  void Disarm() { testpoint::Disarm(point_); }

 private:
  const std::string point_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hit_ = false;
  bool go_ = false;
};

// Unpublish while a UCX read is in flight: the bytes have landed but the
// reader has not released the lease (held at the test point). The drain
// waits for it, the read completes byte-exact, and a later read is
// refused.
TEST_F(UcxRegistryTest, UnpublishDrainsAUcxReadInFlight) {
  PointHold hold;
  std::vector<uint8_t> out(flat_.size());
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  ASSERT_TRUE(hold.WaitHit());
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  EXPECT_EQ(registry_.reads_in_flight(), 1u);
  // The read holds its lease: a drain that may not wait fails.
  Status early =
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(0));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early.ToString();
  hold.Release();
  reader.join();
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(out, flat_);
  ASSERT_TRUE(
      registry_.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs))
          .ok());
  hold.Disarm();
  std::vector<uint8_t> late(100);
  Status s = ReadInto(late, 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

// A reader stopped mid-read for longer than the holder waits for its
// release (local_release_timeout_ms): the holder drops it and ends the
// lease, so an unpublish's drain completes instead of waiting for it, and
// the reader, once it runs again, fails the
// read (its bytes may come from memory the owner now reuses) instead of
// returning them; a read after the unpublish is refused.
TEST_F(UcxRegistryTest, ReaderStoppedPastTheReleaseTimeoutCannotHoldTheDrain) {
  conn_.reset();
  server_->Stop();
  ServerOptions o;
  o.local_release_timeout_ms = 500;
  Result<std::unique_ptr<Server>> s =
      transport_->Listen("127.0.0.1:0", &registry_, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  server_ = std::move(s).value();
  Result<std::unique_ptr<Connection>> c =
      transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  conn_ = std::move(c).value();
  PointHold hold;
  std::vector<uint8_t> out(flat_.size());
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  ASSERT_TRUE(hold.WaitHit());
  Result<uint64_t> revoked = registry_.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  // The reader stays stopped; the drain ends once the holder gave up on it
  // (its release timeout), well within this deadline.
  Status drained = registry_.Drain("m", Version(1), *revoked,
                                   Deadline::AfterMs(kGenerousMs));
  EXPECT_TRUE(drained.ok()) << drained.ToString();
  EXPECT_EQ(registry_.reads_in_flight(), 0u);
  hold.Release();
  reader.join();
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read.ToString();
  EXPECT_TRUE(conn_->broken());
  hold.Disarm();
  Result<std::unique_ptr<Connection>> late =
      transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  std::vector<uint8_t> small(100);
  iovec v{small.data(), small.size()};
  Status refused = (*late)->Read(RegReq(0, small.size()), {&v, 1},
                                 Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(refused.code(), StatusCode::kNotFound) << refused.ToString();
}

// The holder gives the lease up (it stops) while the reader's bytes are in
// but not released: the reader must discard them.
TEST_F(UcxRegistryTest, HolderEndingTheLeaseFailsTheRead) {
  PointHold hold;
  std::vector<uint8_t> out(4096);
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  ASSERT_TRUE(hold.WaitHit());
  server_->Stop();  // shuts the connection down, then ends the lease
  EXPECT_EQ(registry_.reads_in_flight(), 0u);
  hold.Release();
  reader.join();
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read.ToString();
  EXPECT_TRUE(conn_->broken());
}

// A hostile holder (here the real one, its piece headers changed at the
// test point where it sends them): a piece of another read, one beyond the
// range, one off a piece boundary, a second copy of a piece. Each fails the
// read with DATA_LOSS naming the piece, writes nothing outside the
// destination (guard bytes either side stay as they were), breaks that
// connection, and the holder's lease ends.
TEST_F(UcxRegistryTest, AHolderSendingAPieceNotAskedForFailsTheReadCleanly) {
  constexpr uint64_t kPiece = 1 << 20;  // the holder's piece size
  const uint64_t length = flat_.size() - 100;
  ASSERT_GT(length, 2 * kPiece);  // piece 1 is a whole one
  struct Forgery {
    const char* what;
    std::function<void(ucx::PieceHeader&)> change;
  };
  const Forgery forgeries[] = {
      {"another read's", [](ucx::PieceHeader& h) { h.read_id += 1; }},
      {"beyond the range", [&](ucx::PieceHeader& h) { h.offset = length; }},
      {"off a boundary", [](ucx::PieceHeader& h) { h.offset += 1; }},
      {"a second copy", [](ucx::PieceHeader& h) { h.offset = 0; }},
  };
  constexpr size_t kGuard = 2 * kPiece;
  for (const Forgery& f : forgeries) {
    SCOPED_TRACE(f.what);
    testpoint::Arm("ucx.piece_sending", [&](uint64_t arg) {
      auto* h = reinterpret_cast<ucx::PieceHeader*>(arg);
      if (h->offset == kPiece) f.change(*h);
    });
    Result<std::unique_ptr<Connection>> c =
        transport_->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<uint8_t> landing(kGuard + length + kGuard, 0xee);
    iovec v{landing.data() + kGuard, length};
    Status read =
        (*c)->Read(RegReq(0, length), {&v, 1}, Deadline::AfterMs(kGenerousMs));
    testpoint::Disarm("ucx.piece_sending");
    EXPECT_EQ(read.code(), StatusCode::kDataLoss) << read.ToString();
    EXPECT_NE(read.message().find("sent a piece it was not asked for"),
              std::string::npos)
        << read.ToString();
    EXPECT_TRUE((*c)->broken());
    EXPECT_TRUE(std::all_of(landing.begin(), landing.begin() + kGuard,
                            [](uint8_t b) { return b == 0xee; }));
    EXPECT_TRUE(std::all_of(landing.end() - kGuard, landing.end(),
                            [](uint8_t b) { return b == 0xee; }));
  }
  ExpectTheHolderServesOnAndDrains();
}

// A holder paused (SIGSTOP, a debugger, a frozen container) right after it
// told a reader where to read, before it answered any of the reader's gets,
// and resumed only after that reader gave up on it (work stealing, or its
// deadline) and closed its endpoint. Over wires where UCX emulates gets
// (tcp, shared memory) the reader's get requests then wait, unanswered, in
// the holder's worker. UCX 1.13 treats a failed answer to such a get as
// fatal (ucp_get_req_handler: "Fatal: unexpected error: Endpoint timeout"),
// so the resumed holder must drop that worker without progressing it: the
// holder serves on, the lease ends, and a new reader reads byte-exact.
TEST_F(UcxRegistryTest, AHolderResumedAfterItsReaderGaveUpServesOn) {
  std::vector<uint8_t> small(4096);
  ASSERT_TRUE(ReadInto(small, 0).ok());  // connects the endpoint
  PointHold paused("ucx.reply_sent");    // the holder's serving thread
  std::mutex mu;
  std::condition_variable cv;
  bool issued = false;
  testpoint::Arm("ucx.read_granted", [&](uint64_t) {
    std::lock_guard<std::mutex> l(mu);
    issued = true;
    cv.notify_all();
  });
  std::vector<uint8_t> out(flat_.size());
  Status read;
  std::thread reader([&] { read = ReadInto(out, 0); });
  ASSERT_TRUE(paused.WaitHit());
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                            [&] { return issued; }));
  }
  conn_->Cancel();  // the reader gives up on the paused holder
  reader.join();
  testpoint::Disarm("ucx.read_granted");
  EXPECT_FALSE(read.ok());
  EXPECT_TRUE(conn_->broken());
  EXPECT_EQ(registry_.reads_in_flight(), 1u);  // the paused holder's lease
  paused.Release();
  ExpectTheHolderServesOnAndDrains();
}

// The narrower case: the reader leaves just after the holder found it still
// there and before the holder's next progress call (here the holder is held
// at that point, `ucx.progress_next`, until the reader has given up). That
// call would answer the reader's gets over an endpoint the reader has
// torn down, which UCX 1.13 treats as fatal. So a reader that gives up with
// gets outstanding closes the TCP connection first and then lingers: it
// keeps its worker progressing (bytes may still land: its Read has not
// returned) until its gets are answered or the holder drops its worker,
// bounded by give_up_linger_ms (here generous, so that a slow machine
// cannot end it first), and only then tears its endpoint down. The holder
// is let go once the reader lingers (or, without lingering, once its Read
// returned): it must serve on, and its lease must end.
TEST_F(UcxRegistryTest, AReaderLeavingAsTheHolderAnswersLingersUntilItIsDone) {
  UcxTransportOptions patient;
  patient.give_up_linger_ms = kGenerousMs;
  patient.allow_emulated_gets = true;
  Result<std::unique_ptr<Transport>> reader_side = MakeUcxTransport(patient);
  ASSERT_TRUE(reader_side.ok()) << reader_side.status().ToString();
  Result<std::unique_ptr<Connection>> c =
      (*reader_side)
          ->Connect(server_->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  conn_ = std::move(c).value();
  std::vector<uint8_t> small(4096);
  ASSERT_TRUE(ReadInto(small, 0).ok());  // connects the endpoint
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id holder_thread;
  bool replied = false, issued = false, holder_held = false;
  bool go_reply = false, go_progress = false;
  auto wait_for = [&](std::unique_lock<std::mutex>& l, bool& flag) {
    return cv.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                       [&] { return flag; });
  };
  auto set = [&](bool& flag) {
    std::lock_guard<std::mutex> l(mu);
    flag = true;
    cv.notify_all();
  };
  testpoint::Arm("ucx.reply_sent", [&](uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    holder_thread = std::this_thread::get_id();
    replied = true;
    cv.notify_all();
    cv.wait(l, [&] { return go_reply; });
  });
  testpoint::Arm("ucx.read_granted", [&](uint64_t) { set(issued); });
  testpoint::Arm("ucx.progress_next", [&](uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    if (std::this_thread::get_id() != holder_thread || go_progress) return;
    holder_held = true;
    cv.notify_all();
    cv.wait(l, [&] { return go_progress; });
  });
  testpoint::Arm("ucx.reader_lingers", [&](uint64_t) { set(go_progress); });
  std::vector<uint8_t> out(flat_.size());
  Status read;
  std::thread reader([&] {
    read = ReadInto(out, 0);
    set(go_progress);
  });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(wait_for(l, replied));
    ASSERT_TRUE(wait_for(l, issued));
    go_reply = true;
    cv.notify_all();
    ASSERT_TRUE(wait_for(l, holder_held));
  }
  conn_->Cancel();  // the reader gives up on the holder
  reader.join();
  for (const char* point : {"ucx.reply_sent", "ucx.read_granted",
                            "ucx.progress_next", "ucx.reader_lingers"}) {
    testpoint::Disarm(point);
  }
  EXPECT_FALSE(read.ok());
  EXPECT_TRUE(conn_->broken());
  ExpectTheHolderServesOnAndDrains();
}

// A reader stopped right after it sent its gets, past the holder's release
// timeout. Over wires where UCX emulates a get (tcp, shared memory) the
// holder's own worker answers it, copying from the address the get names
// with no check of its own, and a large get is answered piece by piece as
// the reader takes the bytes. So the holder must not end the lease (after
// which the owner may unmap or reuse the memory) while that worker could
// still answer: here the memory is made unreadable as soon as the drain
// returns, and the reader then resumes taking bytes. A holder that still
// answered from it would die of SIGSEGV; it must instead have dropped the
// reader's worker first, so the reader fails and the holder serves on.
TEST(UcxAbandonedReadTest, TheLeaseEndsOnlyOnceTheHoldersWorkerCannotAnswer) {
  if (!UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
  constexpr uint64_t kBytes = 64ull << 20;  // more than socket buffers hold
  Result<HostBuffer> buf = HostBuffer::Allocate(kBytes);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  std::memset(buf->data(), 0x5a, kBytes);
  TensorRef r;
  r.spec.name = "w";
  r.spec.dtype = DType::kU8;
  r.spec.shape = {kBytes};
  r.data = buf->data();
  r.bytes = kBytes;
  std::vector<TensorRef> refs{r};
  Result<PartLayout> layout = BuildPartLayout(0, refs, 1 << 20);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  client::Registry registry;
  client::Holding h;
  h.model = "m";
  h.version = Version(1);
  h.rank = 0;
  h.chunk_bytes = 1 << 20;
  h.parts[0] = *layout;
  h.bases[0].push_back(buf->data());
  Result<uint64_t> epoch = registry.Add(std::move(h));
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
  std::unique_ptr<Transport> transport = MakeTransport("ucx");
  ASSERT_NE(transport, nullptr);
  ServerOptions o;
  o.local_release_timeout_ms = 300;
  Result<std::unique_ptr<Server>> server =
      transport->Listen("127.0.0.1:0", &registry, o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<std::unique_ptr<Connection>> conn =
      transport->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  auto request = [&](uint64_t length) {
    wire::ReadRequest q = Req(0, length);
    q.epoch = *epoch;
    return q;
  };
  // A first small read connects the endpoint, so the large read's gets
  // leave at once.
  std::vector<uint8_t> small(4096);
  iovec sv{small.data(), small.size()};
  ASSERT_TRUE((*conn)
                  ->Read(request(small.size()), {&sv, 1},
                         Deadline::AfterMs(kGenerousMs))
                  .ok());

  std::mutex mu;
  std::condition_variable cv;
  bool issued = false, go = false;
  testpoint::Arm("ucx.read_granted", [&](uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    issued = true;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
  });
  std::vector<uint8_t> out(kBytes);
  Status read;
  std::thread reader([&] {
    iovec v{out.data(), out.size()};
    read =
        (*conn)->Read(request(kBytes), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::milliseconds(kGenerousMs),
                            [&] { return issued; }));
  }
  Result<uint64_t> revoked = registry.Revoke("m", Version(1));
  ASSERT_TRUE(revoked.ok());
  // Ends once the holder gave up on the stopped reader.
  Status drained =
      registry.Drain("m", Version(1), *revoked, Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  ASSERT_EQ(::mprotect(buf->data(), kBytes, PROT_NONE), 0);
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
    cv.notify_all();
  }
  reader.join();
  testpoint::Disarm("ucx.read_granted");
  EXPECT_FALSE(read.ok());
  EXPECT_TRUE((*conn)->broken());
  // The holder serves on: a new reader is refused the revoked version.
  Result<std::unique_ptr<Connection>> late =
      transport->Connect((*server)->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  Status refused = (*late)->Read(request(small.size()), {&sv, 1},
                                 Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(refused.code(), StatusCode::kNotFound) << refused.ToString();
  (*server)->Stop();
  ASSERT_EQ(::mprotect(buf->data(), kBytes, PROT_READ | PROT_WRITE), 0);
}

}  // namespace
}  // namespace tensorhub::transport
