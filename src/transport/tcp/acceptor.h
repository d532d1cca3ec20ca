// The accepting half of a data server, shared by the TCP and UCX servers
// (both take their connections on a TCP listener): accepts, serves each
// connection on its own thread, and joins the threads of finished
// connections as it goes.
//
// A connection is first *authenticating* (the server's handshake runs on
// its thread, within the server's handshake deadline), then, once the
// server calls Admit() on its ticket, *admitted*. The two are bounded
// apart (issue 27: unauthenticated connections took the readers' slots):
//  - at most `max_authenticating` at once: a new connection beyond that
//    closes the oldest one still authenticating;
//  - at most `max_authenticating_per_peer` of them from one address: a new
//    one beyond that is closed at once;
//  - at most `max_connections` admitted: Admit() refuses beyond that.
// A peer without the secret never holds an admitted slot, and holds an
// authenticating one for at most the handshake deadline.
#ifndef TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_
#define TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/refusal_log.h"
#include "transport/tcp/socket_util.h"
#include "transport/transport.h"

namespace tensorhub::transport {

struct AcceptorLimits {
  size_t max_connections = 256;
  size_t max_authenticating = 64;
  size_t max_authenticating_per_peer = 16;
};
// The bounds a server's options ask for.
AcceptorLimits AcceptorLimitsOf(const ServerOptions& options);

class Acceptor {
 public:
  // One connection's standing, handed to its ServeFn.
  class Ticket {
   public:
    // The peer's address, without the port ("10.0.0.5").
    const std::string& peer() const { return peer_; }
    // The handshake passed: the connection moves to the admitted set.
    // False (the connection must end) when max_connections are admitted,
    // or when it was closed as the oldest authenticating one meanwhile.
    bool Admit();

   private:
    friend class Acceptor;
    Acceptor* acceptor_ = nullptr;
    void* conn_ = nullptr;
    std::string peer_;
  };

  // Serves one connection until the peer leaves, an I/O error, or a
  // shutdown of `fd` by Stop() (or by the authenticating bound); it must
  // not close `fd`. It runs the handshake and calls ticket.Admit() before
  // it serves anything.
  using ServeFn = std::function<void(int fd, Ticket& ticket)>;

  // `label` names the server in the log lines of refused connections.
  Acceptor(Fd listener, AcceptorLimits limits, std::string label);
  ~Acceptor() { Stop(); }
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Starts the accept thread; once, after whatever `serve` uses is ready.
  void Start(ServeFn serve);
  // Stops accepting, shuts every open connection down (its ServeFn sees
  // the connection end) and joins every thread; the listener is closed.
  // Idempotent, and safe from several threads.
  void Stop();

  // Connections refused at accept for the per-address bound (they never
  // reach a handshake), and closed as the oldest still authenticating
  // (their handshake then fails, which the server counts as a refusal).
  uint64_t refused_at_accept() const { return refused_at_accept_.load(); }
  uint64_t evicted() const { return evicted_.load(); }
  // The server's log of refused peers (one line per peer per interval).
  RefusalLog& refusals() { return refusals_; }

 private:
  enum class Phase { kAuthenticating, kAdmitted, kEvicted };
  struct Conn {
    Fd fd;  // closed only when the node is destroyed, after the join
    std::thread thread;
    bool done = false;
    Phase phase = Phase::kAuthenticating;
    uint64_t seq = 0;  // accept order: lower is older
    Ticket ticket;
  };
  void AcceptLoop();
  void ReapFinished();
  // Makes room for one more authenticating connection from `peer`, or
  // says it must be refused.
  bool RoomFor(const std::string& peer) TH_REQUIRES(mu_);
  bool AdmitConn(Conn* c);

  Fd listener_;
  const AcceptorLimits limits_;
  const std::string label_;
  RefusalLog refusals_;
  ServeFn serve_;
  Mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  Mutex mu_;
  std::list<Conn> conns_ TH_GUARDED_BY(mu_);
  size_t authenticating_ TH_GUARDED_BY(mu_) = 0;
  size_t admitted_ TH_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ TH_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_at_accept_{0};
  std::atomic<uint64_t> evicted_{0};
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_
