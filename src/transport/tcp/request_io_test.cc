// What the TCP and UCX data servers share (request_io.h), and the bounds on
// connections still authenticating (acceptor.h) on a real TCP server.
#include "transport/tcp/request_io.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "transport/tcp/raw_peer_test_util.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::transport {
namespace {

constexpr int64_t kGenerousMs = 30000;

iovec At(uint64_t address, uint64_t length) {
  return {reinterpret_cast<void*>(address), length};
}

TEST(RequestIoTest, CoveredByNeedsEveryByteInsideTheRegions) {
  std::vector<iovec> regions = {At(1000, 100), At(1100, 50), At(2000, 10)};
  EXPECT_TRUE(CoveredBy(1000, 150, regions));  // two adjacent regions
  EXPECT_TRUE(CoveredBy(1020, 100, regions));
  EXPECT_FALSE(CoveredBy(1000, 151, regions));   // one byte past
  EXPECT_FALSE(CoveredBy(999, 10, regions));     // one byte before
  EXPECT_FALSE(CoveredBy(1000, 1010, regions));  // across the gap
  EXPECT_TRUE(CoveredBy(2000, 10, regions));
  EXPECT_TRUE(CoveredBy(5, 0, regions));
  EXPECT_FALSE(CoveredBy(1000, 1, {}));
  // Overlapping and unsorted.
  std::vector<iovec> messy = {At(50, 20), At(0, 60), At(60, 40)};
  EXPECT_TRUE(CoveredBy(0, 100, messy));
  EXPECT_FALSE(CoveredBy(0, 101, messy));
}

TEST(RequestIoTest, OnlyTheHoldersRefusalsKeepAConnection) {
  for (StatusCode c :
       {StatusCode::kOk, StatusCode::kNotFound, StatusCode::kAborted,
        StatusCode::kInvalidArgument, StatusCode::kResourceExhausted,
        StatusCode::kFailedPrecondition, StatusCode::kPermissionDenied}) {
    EXPECT_TRUE(KeepsConnection(c)) << static_cast<int>(c);
  }
  for (StatusCode c : {StatusCode::kUnavailable, StatusCode::kDeadlineExceeded,
                       StatusCode::kDataLoss, StatusCode::kInternal,
                       StatusCode::kAlreadyExists}) {
    EXPECT_FALSE(KeepsConnection(c)) << static_cast<int>(c);
  }
}

TEST(RequestIoTest, ForRangeWalksARangeAcrossPieces) {
  uint8_t a[4], b[3], c[5];
  std::vector<iovec> pieces = {{a, 4}, {b, 3}, {c, 5}};
  std::vector<std::pair<uint8_t*, uint64_t>> runs;
  ASSERT_TRUE(ForRange(pieces, 3, 6, [&](uint8_t* p, uint64_t n, uint64_t) {
                runs.emplace_back(p, n);
                return Status::Ok();
              }).ok());
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], std::make_pair(a + 3, uint64_t{1}));
  EXPECT_EQ(runs[1], std::make_pair(b + 0, uint64_t{3}));
  EXPECT_EQ(runs[2], std::make_pair(c + 0, uint64_t{2}));
  EXPECT_EQ(ForRange(pieces, 10, 5,
                     [](uint8_t*, uint64_t, uint64_t) { return Status::Ok(); })
                .code(),
            StatusCode::kInternal);
}

TEST(RequestIoTest, AWholeRequestIsReadAndABadFrameIsToldApart) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Fd reader(sv[0]), holder(sv[1]);
  wire::ReadRequest req;
  req.model = "model-x";
  req.version = 3;
  req.epoch = 2;
  req.offset = 10;
  req.length = 100;
  wire::HostIdentity id{};
  id.boot_id[0] = 7;
  std::string frame = wire::EncodeReadRequest(req, &id, false);
  ASSERT_TRUE(testing::SendAllRaw(reader.get(), frame.data(), frame.size()));
  Stream stream(holder.get());
  IncomingRequest in;
  Status why;
  ASSERT_EQ(
      ReadIncomingRequest(stream, Deadline::AfterMs(kGenerousMs), 0, &in, &why),
      RequestOutcome::kOk)
      << why.ToString();
  EXPECT_EQ(in.req.model, "model-x");
  EXPECT_EQ(in.req.length, 100u);
  EXPECT_TRUE(in.local);
  ASSERT_TRUE(in.reader.has_value());
  EXPECT_EQ(*in.reader, id);
  // Garbage: kBad, with the decoder's status.
  std::string junk(wire::kRequestHeaderBytes, 'z');
  ASSERT_TRUE(testing::SendAllRaw(reader.get(), junk.data(), junk.size()));
  EXPECT_EQ(
      ReadIncomingRequest(stream, Deadline::AfterMs(kGenerousMs), 0, &in, &why),
      RequestOutcome::kBad);
  EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
  // The peer leaves: kGone.
  reader.Reset();
  EXPECT_EQ(
      ReadIncomingRequest(stream, Deadline::AfterMs(kGenerousMs), 0, &in, &why),
      RequestOutcome::kGone);
}

class NothingToRead final : public ReadSource {
 public:
  Result<ServeLease> BeginRead(const wire::ReadRequest&) override {
    return NotFound("nothing here");
  }
};

int ConnectFrom(const char* from, const std::string& address) {
  auto hp = SplitHostPort(address);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(hp->second);
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)), 0);
  return fd;
}

// Connections that never answer the challenge: a peer's beyond its bound
// are closed at once, the oldest go when too many authenticate at once,
// the rest at the handshake deadline; none takes a reader's slot.
TEST(AcceptorLimitsTest, UnauthenticatedConnectionsNeverTakeAReadersSlot) {
  TcpTransportOptions to;
  to.local_reads = false;
  to.secret = "s";
  std::unique_ptr<Transport> t = MakeTcpTransport(to);
  NothingToRead source;
  ServerOptions so;
  so.max_connections = 1;  // one reader at a time
  so.max_authenticating = 4;
  so.max_authenticating_per_peer = 2;
  so.handshake_timeout_ms = 600000;  // only the bounds close them here
  Result<std::unique_ptr<Server>> server =
      t->Listen("127.0.0.1:0", &source, so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string addr = (*server)->address();
  // A third from 127.0.0.2 is closed at once; the first two stay.
  std::vector<Fd> a;
  for (int i = 0; i < 3; ++i) a.emplace_back(ConnectFrom("127.0.0.2", addr));
  EXPECT_TRUE(testing::ClosedByPeerWithin(a[2].get(), kGenerousMs));
  EXPECT_FALSE(testing::ClosedByPeerWithin(a[0].get(), 200));
  // Two more from other addresses fill the four; a fifth closes the
  // oldest (a[0]).
  Fd b(ConnectFrom("127.0.0.3", addr));
  Fd c(ConnectFrom("127.0.0.4", addr));
  EXPECT_FALSE(testing::ClosedByPeerWithin(b.get(), 200));
  Fd d(ConnectFrom("127.0.0.5", addr));
  EXPECT_TRUE(testing::ClosedByPeerWithin(a[0].get(), kGenerousMs));
  EXPECT_FALSE(testing::ClosedByPeerWithin(a[1].get(), 200));
  // A reader with the secret gets the one reader's slot, and is answered.
  TcpTransportOptions ro = to;
  std::unique_ptr<Transport> rt = MakeTcpTransport(ro);
  Result<std::unique_ptr<Connection>> conn =
      rt->Connect(addr, Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  std::vector<uint8_t> out(10);
  iovec v{out.data(), out.size()};
  wire::ReadRequest req;
  req.model = "m";
  req.version = 1;
  req.length = 10;
  EXPECT_EQ((*conn)->Read(req, {&v, 1}, Deadline::AfterMs(kGenerousMs)).code(),
            StatusCode::kNotFound);
  // A second reader finds the slot taken: UNAVAILABLE, saying why.
  Result<std::unique_ptr<Connection>> second =
      rt->Connect(addr, Deadline::AfterMs(kGenerousMs));
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("as many readers"),
            std::string::npos)
      << second.status().ToString();
  EXPECT_GE((*server)->connections_refused(), 1u);
}

TEST(AcceptorLimitsTest,
     AConnectionThatDoesNotAnswerIsClosedAtTheHandshakeDeadline) {
  TcpTransportOptions to;
  to.local_reads = false;
  to.secret = "s";
  std::unique_ptr<Transport> t = MakeTcpTransport(to);
  NothingToRead source;
  ServerOptions so;
  so.handshake_timeout_ms = 300;
  Result<std::unique_ptr<Server>> server =
      t->Listen("127.0.0.1:0", &source, so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Fd idle(ConnectFrom("127.0.0.2", (*server)->address()));
  const int64_t t0 = NowMs();
  EXPECT_TRUE(testing::ClosedByPeerWithin(idle.get(), kGenerousMs));
  // Closed by the handshake deadline, not the 30 s stall bound.
  EXPECT_LT(NowMs() - t0, 10000);
}

}  // namespace
}  // namespace tensorhub::transport
