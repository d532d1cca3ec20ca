// Small POSIX socket helpers with deadlines. Every call that may block waits
// in poll() for at most the time left.
#ifndef TENSORHUB_TRANSPORT_TCP_SOCKET_UTIL_H_
#define TENSORHUB_TRANSPORT_TCP_SOCKET_UTIL_H_

#include <sys/uio.h>

#include <span>
#include <string>
#include <utility>

#include "common/deadline.h"
#include "tensorhub/status.h"

namespace tensorhub::transport {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

// "host:port" -> (host, port). Accepts "[v6]:port".
Result<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& hp);

Result<Fd> ListenTcp(const std::string& host_port, int backlog);
Result<std::string> LocalAddress(int fd);
Result<Fd> ConnectTcp(const std::string& host_port, const Deadline& deadline);
void TuneStream(int fd);

// Write/read every byte of `iov` before the deadline. The iovec array is
// not modified. `stall_ms` (if > 0) also fails the call when no byte moves
// for that long.
Status WriteAll(int fd, std::span<const iovec> iov, const Deadline& deadline,
                int64_t stall_ms = 0);
Status ReadAll(int fd, std::span<const iovec> iov, const Deadline& deadline,
               int64_t stall_ms = 0);
Status ReadExact(int fd, void* buf, size_t n, const Deadline& deadline,
                 int64_t stall_ms = 0);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_SOCKET_UTIL_H_
