#include "transport/tcp/acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <iterator>
#include <utility>

#include "common/log.h"

namespace tensorhub::transport {
namespace {

// The address of an accepted peer, without its port.
std::string PeerHost(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr,
                buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6,
                &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf,
                sizeof(buf));
  } else {
    return "a peer";
  }
  return buf;
}

}  // namespace

AcceptorLimits AcceptorLimitsOf(const ServerOptions& o) {
  AcceptorLimits l;
  l.max_connections = o.max_connections;
  l.max_authenticating = o.max_authenticating;
  l.max_authenticating_per_peer = o.max_authenticating_per_peer;
  return l;
}

bool Acceptor::Ticket::Admit() {
  return acceptor_->AdmitConn(static_cast<Conn*>(conn_));
}

Acceptor::Acceptor(Fd listener, AcceptorLimits limits, std::string label)
    : listener_(std::move(listener)),
      limits_(limits),
      label_(label),
      refusals_(std::move(label)) {}

void Acceptor::Start(ServeFn serve) {
  serve_ = std::move(serve);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void Acceptor::Stop() {
  MutexLock stop_lock(stop_mu_);
  stopping_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<Conn> conns;
  {
    MutexLock lock(mu_);
    // Every fd here is still open: a connection's fd is closed only when
    // its node is destroyed, after its thread was joined.
    for (Conn& c : conns_) ::shutdown(c.fd.get(), SHUT_RDWR);
    conns.splice(conns.end(), conns_);
  }
  for (Conn& c : conns) c.thread.join();
  listener_.Reset();
}

bool Acceptor::RoomFor(const std::string& peer) {
  size_t from_peer = 0;
  Conn* oldest = nullptr;
  for (Conn& c : conns_) {
    if (c.phase != Phase::kAuthenticating) continue;
    if (c.ticket.peer_ == peer) ++from_peer;
    if (oldest == nullptr || c.seq < oldest->seq) oldest = &c;
  }
  if (from_peer >= limits_.max_authenticating_per_peer) return false;
  if (authenticating_ >= limits_.max_authenticating && oldest != nullptr) {
    // Its handshake fails at once; its thread ends on its own.
    ::shutdown(oldest->fd.get(), SHUT_RDWR);
    oldest->phase = Phase::kEvicted;
    --authenticating_;
    evicted_.fetch_add(1, std::memory_order_relaxed);
    refusals_.Refused(oldest->ticket.peer_,
                      "closed the oldest connection still authenticating (" +
                          std::to_string(limits_.max_authenticating) +
                          " at once at most)");
  }
  return true;
}

void Acceptor::AcceptLoop() {
  // Threads of evicted connections end within a moment; beyond this many
  // nodes in all, new connections wait in the listen queue.
  const size_t max_nodes =
      limits_.max_connections + 2 * limits_.max_authenticating;
  while (!stopping_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, 100);
    ReapFinished();
    if (rc <= 0) continue;
    bool full = false;
    {
      MutexLock lock(mu_);
      full = conns_.size() >= max_nodes;
    }
    if (full) {
      // Evicted connections' threads end within a moment: reap them before
      // accepting more.
      ::poll(nullptr, 0, 10);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int cfd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                        SOCK_CLOEXEC);
    if (cfd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        refusals_.Refused("the listener", "out of file descriptors");
      }
      continue;
    }
    Fd fd(cfd);
    const std::string peer = PeerHost(ss);
    MutexLock lock(mu_);
    if (!RoomFor(peer)) {
      refused_at_accept_.fetch_add(1, std::memory_order_relaxed);
      refusals_.Refused(
          peer, "refused a connection: " +
                    std::to_string(limits_.max_authenticating_per_peer) +
                    " from this address are still authenticating");
      continue;
    }
    TuneStream(fd.get());
    conns_.push_back(Conn{});
    Conn* c = &conns_.back();
    c->fd = std::move(fd);
    c->seq = next_seq_++;
    c->ticket.acceptor_ = this;
    c->ticket.conn_ = c;
    c->ticket.peer_ = peer;
    ++authenticating_;
    c->thread = std::thread([this, c, raw = c->fd.get()] {
      serve_(raw, c->ticket);
      MutexLock l(mu_);
      if (c->phase == Phase::kAuthenticating) --authenticating_;
      if (c->phase == Phase::kAdmitted) --admitted_;
      c->phase = Phase::kEvicted;
      c->done = true;
    });
  }
}

bool Acceptor::AdmitConn(Conn* c) {
  MutexLock lock(mu_);
  if (c->phase != Phase::kAuthenticating) return false;  // evicted
  --authenticating_;
  if (admitted_ >= limits_.max_connections) {
    c->phase = Phase::kEvicted;
    refusals_.Refused(c->ticket.peer_, "refused a reader's connection: " +
                                           std::to_string(admitted_) +
                                           " open (the bound)");
    return false;
  }
  c->phase = Phase::kAdmitted;
  ++admitted_;
  return true;
}

void Acceptor::ReapFinished() {
  std::list<Conn> finished;
  {
    MutexLock lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), conns_, it);
      it = next;
    }
  }
  for (Conn& c : finished) c.thread.join();
}

}  // namespace tensorhub::transport
