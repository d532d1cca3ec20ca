// Test helpers for playing a raw (possibly misbehaving) peer of the TCP data
// plane. Header-only; for tests only.
#ifndef TENSORHUB_TRANSPORT_TCP_RAW_PEER_TEST_UTIL_H_
#define TENSORHUB_TRANSPORT_TCP_RAW_PEER_TEST_UTIL_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "common/deadline.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::transport::testing {

// True if the peer closes `fd` within `ms` (reading and discarding whatever
// it sends first).
inline bool ClosedByPeerWithin(int fd, int64_t ms) {
  Deadline d = Deadline::AfterMs(ms);
  char buf[4096];
  while (!d.expired()) {
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(d.timeout_ms()));
    if (rc <= 0) continue;
    ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got == 0) return true;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return true;  // reset
    }
  }
  return false;
}

inline bool SendAllRaw(int fd, const void* data, size_t n) {
  iovec v{const_cast<void*>(data), n};
  return WriteAll(fd, {&v, 1}, Deadline::AfterMs(2000)).ok();
}

}  // namespace tensorhub::transport::testing

#endif  // TENSORHUB_TRANSPORT_TCP_RAW_PEER_TEST_UTIL_H_
