// The accepting half of a data server, shared by the TCP and UCX servers
// (both take their connections on a TCP listener): accepts, serves each
// connection on its own thread, at most `max_connections` at once, and
// joins the threads of finished connections as it goes.
#ifndef TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_
#define TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_

#include <atomic>
#include <functional>
#include <list>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::transport {

class Acceptor {
 public:
  // Serves one connection until the peer leaves, an I/O error, or a
  // shutdown of `fd` by Stop(); it must not close `fd`.
  using ServeFn = std::function<void(int fd)>;

  // `label` names the server in the log line of a refused connection.
  Acceptor(Fd listener, size_t max_connections, std::string label);
  ~Acceptor() { Stop(); }
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Starts the accept thread; once, after whatever `serve` uses is ready.
  void Start(ServeFn serve);
  // Stops accepting, shuts every open connection down (its ServeFn sees
  // the connection end) and joins every thread; the listener is closed.
  // Idempotent, and safe from several threads.
  void Stop();

 private:
  struct Conn {
    Fd fd;  // closed only when the node is destroyed, after the join
    std::thread thread;
    bool done = false;
  };
  void AcceptLoop();
  void ReapFinished();

  Fd listener_;
  const size_t max_connections_;
  const std::string label_;
  ServeFn serve_;
  Mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  Mutex mu_;
  std::list<Conn> conns_ TH_GUARDED_BY(mu_);
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_ACCEPTOR_H_
