#include "transport/tcp/acceptor.h"

#include <poll.h>
#include <sys/socket.h>

#include <iterator>
#include <utility>

#include "common/log.h"

namespace tensorhub::transport {

Acceptor::Acceptor(Fd listener, size_t max_connections, std::string label)
    : listener_(std::move(listener)),
      max_connections_(max_connections),
      label_(std::move(label)) {}

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

void Acceptor::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, 100);
    ReapFinished();
    if (rc <= 0) continue;
    int cfd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd < 0) continue;
    Fd fd(cfd);
    MutexLock lock(mu_);
    if (conns_.size() >= max_connections_) {
      TH_LOG(WARN) << label_ << ": refusing connection, " << conns_.size()
                   << " open (the bound)";
      continue;
    }
    TuneStream(fd.get());
    conns_.push_back(Conn{std::move(fd), std::thread(), false});
    Conn* c = &conns_.back();
    c->thread = std::thread([this, c, raw = c->fd.get()] {
      serve_(raw);
      MutexLock l(mu_);
      c->done = true;
    });
  }
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
