#include "transport/tcp/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

namespace tensorhub::transport {
namespace {

std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Waits until fd is ready for `events` or the deadline passes.
Status WaitFor(int fd, short events, const Deadline& deadline,
               const char* what) {
  while (true) {
    int64_t left = deadline.remaining_ms();
    if (left <= 0) {
      return DeadlineExceeded(std::string("timed out ") + what);
    }
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return Unavailable(Errno("poll"));
  }
}

using IoFn = ssize_t (*)(int, const iovec*, int);

ssize_t DoWritev(int fd, const iovec* iov, int n) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = n;
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t DoReadv(int fd, const iovec* iov, int n) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = n;
  return ::recvmsg(fd, &msg, MSG_DONTWAIT);
}

Status TransferAll(int fd, std::span<const iovec> iov, const Deadline& deadline,
                   bool write, int64_t stall_ms) {
  // Work on a copy so the partially-done first entry can be advanced.
  std::vector<iovec> rest(iov.begin(), iov.end());
  size_t idx = 0;
  while (idx < rest.size() && rest[idx].iov_len == 0) ++idx;
  while (idx < rest.size()) {
    int n = static_cast<int>(std::min<size_t>(rest.size() - idx, IOV_MAX));
    ssize_t got =
        write ? DoWritev(fd, &rest[idx], n) : DoReadv(fd, &rest[idx], n);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Deadline wait = stall_ms > 0 ? deadline.Cap(stall_ms) : deadline;
        TH_RETURN_IF_ERROR(WaitFor(
            fd, write ? POLLOUT : POLLIN, wait,
            wait.at() < deadline.at()
                ? (write ? "sending (no progress)" : "receiving (no progress)")
                : (write ? "sending" : "receiving")));
        continue;
      }
      return Unavailable(Errno(write ? "send" : "recv"));
    }
    if (got == 0 && !write) return Unavailable("peer closed the connection");
    size_t left = static_cast<size_t>(got);
    while (left > 0 && idx < rest.size()) {
      if (left >= rest[idx].iov_len) {
        left -= rest[idx].iov_len;
        ++idx;
      } else {
        rest[idx].iov_base = static_cast<char*>(rest[idx].iov_base) + left;
        rest[idx].iov_len -= left;
        left = 0;
      }
    }
    while (idx < rest.size() && rest[idx].iov_len == 0) ++idx;
  }
  return Status::Ok();
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& hp) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon + 1 >= hp.size()) {
    return InvalidArgument("address '" + hp + "' is not HOST:PORT");
  }
  std::string host = hp.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned long port = 0;
  for (size_t i = colon + 1; i < hp.size(); ++i) {
    if (hp[i] < '0' || hp[i] > '9') {
      return InvalidArgument("address '" + hp + "' has a bad port");
    }
    port = port * 10 + static_cast<unsigned long>(hp[i] - '0');
    if (port > 65535)
      return InvalidArgument("address '" + hp + "': port > 65535");
  }
  if (host.empty()) return InvalidArgument("address '" + hp + "' has no host");
  return std::make_pair(host, static_cast<uint16_t>(port));
}

static Result<addrinfo*> Resolve(const std::string& host, uint16_t port,
                                 bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    return InvalidArgument("cannot resolve '" + host +
                           "': " + gai_strerror(rc));
  }
  return res;
}

Result<Fd> ListenTcp(const std::string& host_port, int backlog) {
  TH_ASSIGN_OR_RETURN(auto hp, SplitHostPort(host_port));
  TH_ASSIGN_OR_RETURN(addrinfo * res, Resolve(hp.first, hp.second, true));
  Status last = Unavailable("no address to listen on for " + host_port);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = Unavailable(Errno("socket"));
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Unavailable(Errno(("bind " + host_port).c_str()));
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last = Unavailable(Errno("listen"));
      continue;
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Result<std::string> LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Internal(Errno("getsockname"));
  }
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    std::string out(host);
    out += ':';
    out += std::to_string(port);
    return out;
  }
  auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
  ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
  port = ntohs(a->sin6_port);
  // Appending piecewise: GCC 12 -O3 reports a false -Wrestrict on the
  // equivalent chain of operator+.
  std::string out("[");
  out += host;
  out += "]:";
  out += std::to_string(port);
  return out;
}

void TuneStream(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

Result<Fd> ConnectTcp(const std::string& host_port, const Deadline& deadline) {
  TH_ASSIGN_OR_RETURN(auto hp, SplitHostPort(host_port));
  TH_ASSIGN_OR_RETURN(addrinfo * res, Resolve(hp.first, hp.second, false));
  Status last = Unavailable("no address for " + host_port);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family,
                   ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = Unavailable(Errno("socket"));
      continue;
    }
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = Unavailable(Errno(("connect " + host_port).c_str()));
      continue;
    }
    if (rc != 0) {
      Status s = WaitFor(fd.get(), POLLOUT, deadline,
                         ("connecting to " + host_port).c_str());
      if (!s.ok()) {
        last = s;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = Unavailable("connect " + host_port + ": " + std::strerror(err));
        continue;
      }
    }
    TuneStream(fd.get());
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Status WriteAll(int fd, std::span<const iovec> iov, const Deadline& deadline,
                int64_t stall_ms) {
  return TransferAll(fd, iov, deadline, true, stall_ms);
}

Status ReadAll(int fd, std::span<const iovec> iov, const Deadline& deadline,
               int64_t stall_ms) {
  return TransferAll(fd, iov, deadline, false, stall_ms);
}

Status ReadExact(int fd, void* buf, size_t n, const Deadline& deadline,
                 int64_t stall_ms) {
  iovec v{buf, n};
  return ReadAll(fd, {&v, 1}, deadline, stall_ms);
}

}  // namespace tensorhub::transport
