// One data-plane connection's byte stream: a connected non-blocking socket
// and, with data-plane TLS, the TLS session on it. Reads and writes take a
// deadline and a no-progress bound, as socket_util.h's do. With kernel TLS
// on for sends, writes go to the socket with sendmsg as on plain TCP (the
// kernel encrypts), so a holder still sends straight from its buffers; in
// user space they go through OpenSSL.
#ifndef TENSORHUB_TRANSPORT_TCP_STREAM_H_
#define TENSORHUB_TRANSPORT_TCP_STREAM_H_

#include <sys/uio.h>

#include <memory>
#include <span>

#include "common/deadline.h"
#include "tensorhub/status.h"

namespace tensorhub::tls {
class Session;
}  // namespace tensorhub::tls

namespace tensorhub::transport {

// Not thread-safe: one thread at a time (another may shutdown(2) the socket
// to make a call end soon). Does not own the socket.
class Stream {
 public:
  explicit Stream(int fd);
  ~Stream();
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;

  int fd() const { return fd_; }
  // From now on the bytes go through `session` (set up on this socket).
  void Secure(std::unique_ptr<tls::Session> session);
  bool tls() const { return session_ != nullptr; }
  // Null on plain TCP.
  const tls::Session* session() const { return session_.get(); }

  Status Write(std::span<const iovec> iov, const Deadline& deadline,
               int64_t stall_ms = 0);
  Status Read(std::span<const iovec> iov, const Deadline& deadline,
              int64_t stall_ms = 0);
  Status ReadExact(void* buf, size_t n, const Deadline& deadline,
                   int64_t stall_ms = 0);
  // Received bytes TLS holds that poll(2) on the socket cannot see.
  bool HasBufferedInput() const;

 private:
  int fd_;
  std::unique_ptr<tls::Session> session_;
  bool kernel_send_ = false;
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_STREAM_H_
