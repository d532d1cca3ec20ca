// Bounds on the connections a hub keeps open (issue 27, docs/security.md
// "The hub's limits"): at most `max_connections` in all and
// `max_per_peer` from one address. Debian's gRPC 1.51 has no such bound
// (nor a hook at accept time), so the guard looks at the hub's own
// connections: every `period_ms` it lists this process's sockets accepted
// on the hub's port (/proc/self/fd: a readlink per descriptor, getsockname
// and getpeername once per new socket) and shuts down the newest beyond
// either bound, which gRPC then closes. Connections that never call are
// closed by gRPC itself (the handshake deadline and the idle timeout that
// Hub::Start sets), so what the bounds must stop is a flood of new ones.
//
// Between two passes a flood can open more than the bound; the descriptor
// limit (raised by Hub::Start, and the bound kept below it) absorbs that.
// A socket is checked and shut down through a duplicate of its descriptor,
// so a number its owner closed and reused meanwhile is never shut down.
#ifndef TENSORHUB_HUB_CONNECTION_GUARD_H_
#define TENSORHUB_HUB_CONNECTION_GUARD_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/refusal_log.h"

namespace tensorhub::hub {

struct ConnectionLimits {
  size_t max_connections = 16384;
  size_t max_per_peer = 256;
};

// One accepted connection as a pass sees it.
struct GuardedConnection {
  uint64_t id = 0;   // the socket's inode: unique while it is open
  std::string peer;  // the address, without the port
  int64_t first_seen_ms = 0;
};

// The pure policy: which of `conns` to close so that no peer has more than
// limits.max_per_peer and all together no more than limits.max_connections;
// the newest first (as a bound at accept time would have refused them), a
// peer's own excess before anyone else's. Ids in no particular order.
std::vector<uint64_t> ConnectionsOverLimits(
    const std::vector<GuardedConnection>& conns,
    const ConnectionLimits& limits);

class ConnectionGuard {
 public:
  struct Stats {
    size_t open = 0;         // connections on the port at the last pass
    size_t peers = 0;        // distinct addresses among them
    size_t descriptors = 0;  // this process's, at the last pass
    uint64_t closed_over_peer = 0;
    uint64_t closed_over_total = 0;
  };

  // Guards connections accepted on local `port`. Start() runs the passes
  // on a thread; tests may call Pass() themselves instead.
  ConnectionGuard(int port, ConnectionLimits limits);
  ~ConnectionGuard() { Stop(); }
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  void Start(int64_t period_ms);
  void Stop();
  // One pass; returns how many connections it shut down.
  size_t Pass();
  Stats stats() const;
  const ConnectionLimits& limits() const { return limits_; }
  // Called with a descriptor's number after a pass checked that it names
  // the socket to shut down and before it shuts that socket down (every
  // guard of the process; an empty function: none). For the test that
  // closes and reuses the number in that window.
  static void SetBeforeShutdownForTest(std::function<void(int fd)> f);

 private:
  struct Seen {
    int fd = -1;
    GuardedConnection conn;
  };

  const int port_;
  const ConnectionLimits limits_;
  RefusalLog log_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  // Sockets of earlier passes, by inode: those on the port, and those not
  // (a listener, another port's), so each is looked at once.
  std::map<uint64_t, Seen> known_ TH_GUARDED_BY(mu_);
  std::set<uint64_t> ignored_ TH_GUARDED_BY(mu_);
  Stats stats_ TH_GUARDED_BY(mu_);
  Mutex pass_mu_;  // one pass at a time
  std::thread thread_;
};

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_CONNECTION_GUARD_H_
