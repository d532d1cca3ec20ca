// The hub's connection bounds: the policy on made-up connections, and one
// pass over real sockets of this process.
#include "hub/connection_guard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

namespace tensorhub::hub {
namespace {

std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ConnectionsOverLimitsTest,
     APeersNewestExcessGoesFirstThenTheNewestOverall) {
  std::vector<GuardedConnection> conns;
  // Peer a: 5 connections seen at 1..5; b: 2 at 10, 11; c: 1 at 0.
  for (uint64_t i = 1; i <= 5; ++i) conns.push_back({i, "a", int64_t(i)});
  conns.push_back({10, "b", 10});
  conns.push_back({11, "b", 11});
  conns.push_back({20, "c", 0});
  EXPECT_TRUE(ConnectionsOverLimits(conns, {100, 100}).empty());
  // Three per peer: a's two newest.
  EXPECT_EQ(Sorted(ConnectionsOverLimits(conns, {100, 3})),
            (std::vector<uint64_t>{4, 5}));
  // Three per peer and five in all: a's two newest, then the newest two
  // of what is left (b's).
  EXPECT_EQ(Sorted(ConnectionsOverLimits(conns, {4, 3})),
            (std::vector<uint64_t>{4, 5, 10, 11}));
  // Equal times: the higher id (the later socket) goes.
  std::vector<GuardedConnection> same = {{1, "x", 7}, {2, "x", 7}};
  EXPECT_EQ(ConnectionsOverLimits(same, {100, 1}), (std::vector<uint64_t>{2}));
}

// A listener on loopback, connections to it from two loopback addresses,
// and the accepted ends kept in this process, as gRPC keeps a hub's.
struct Loop {
  int listener = -1;
  int port = 0;
  std::vector<int> clients, accepted;

  Loop() {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listener, 64), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Loop() {
    for (int fd : clients) ::close(fd);
    for (int fd : accepted) ::close(fd);
    ::close(listener);
  }
  void Connect(const char* from) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &src.sin_addr);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(static_cast<uint16_t>(port));
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)), 0);
    clients.push_back(fd);
    accepted.push_back(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_GE(accepted.back(), 0);
  }
  // Client ends whose server end was shut down: they read EOF at once.
  size_t ClientsCut() const {
    size_t n = 0;
    for (int fd : clients) {
      pollfd p{fd, POLLIN, 0};
      char c;
      if (::poll(&p, 1, 0) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) == 0) ++n;
    }
    return n;
  }
};

TEST(ConnectionGuardTest, APassShutsDownTheNewestBeyondTheBounds) {
  Loop loop;
  for (int i = 0; i < 6; ++i) loop.Connect("127.0.0.2");
  for (int i = 0; i < 2; ++i) loop.Connect("127.0.0.3");
  ConnectionGuard guard(loop.port, {/*max_connections=*/6, /*max_per_peer=*/4});
  // One pass sees them all at once (same time): 2 of 127.0.0.2's go for
  // the per-peer bound; 4 + 2 are left, within the total.
  EXPECT_EQ(guard.Pass(), 2u);
  EXPECT_EQ(loop.ClientsCut(), 2u);
  ConnectionGuard::Stats st = guard.stats();
  EXPECT_EQ(st.open, 6u);
  EXPECT_EQ(st.peers, 2u);
  EXPECT_EQ(st.closed_over_peer, 2u);
  EXPECT_GE(st.descriptors, loop.clients.size() + loop.accepted.size());
  // Two more from a third address: over the total, they (the newest) go.
  loop.Connect("127.0.0.4");
  loop.Connect("127.0.0.4");
  EXPECT_EQ(guard.Pass(), 2u);
  EXPECT_EQ(loop.ClientsCut(), 4u);
  st = guard.stats();
  EXPECT_EQ(st.closed_over_total, 2u);
  // Nothing more to do; the shut-down ones are still open descriptors
  // here (the owner closes them), and are not counted twice.
  EXPECT_EQ(guard.Pass(), 0u);
}

// The connection to shut down is closed by its owner, and its descriptor
// number reused for a new connection, after the pass checked the number
// and before it shuts the socket down (as a hub embedded beside clients
// may do on another thread): the new connection is untouched.
TEST(ConnectionGuardTest,
     ANumberClosedAndReusedBeforeTheShutdownIsNotShutDown) {
  Loop loop;
  loop.Connect("127.0.0.2");
  loop.Connect("127.0.0.2");
  ConnectionGuard guard(loop.port,
                        {/*max_connections=*/16, /*max_per_peer=*/1});
  int reused = -1;
  size_t new_client = 0;
  ConnectionGuard::SetBeforeShutdownForTest([&](int fd) {
    // The owner closes `fd`; the next accepted socket takes its number.
    loop.Connect("127.0.0.3");
    new_client = loop.clients.size() - 1;
    ASSERT_EQ(::dup2(loop.accepted.back(), fd), fd);
    ::close(loop.accepted.back());
    loop.accepted.back() = -1;
    reused = fd;
  });
  EXPECT_EQ(guard.Pass(), 1u);
  ConnectionGuard::SetBeforeShutdownForTest(nullptr);
  ASSERT_GE(reused, 0);
  // The socket now numbered `reused` is the new connection: still open,
  // so its client end reads nothing (not EOF).
  pollfd p{loop.clients[new_client], POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0)
      << "the connection that took the number was shut down";
  // The one the pass chose was shut down (its client reads EOF), though its
  // owner's descriptor number names another socket now.
  EXPECT_EQ(loop.ClientsCut(), 1u);
}

}  // namespace
}  // namespace tensorhub::hub
