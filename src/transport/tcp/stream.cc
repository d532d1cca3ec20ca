#include "transport/tcp/stream.h"

#include "tls/tls.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::transport {

Stream::Stream(int fd) : fd_(fd) {}
Stream::~Stream() = default;
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;

void Stream::Secure(std::unique_ptr<tls::Session> session) {
  session_ = std::move(session);
  kernel_send_ = session_ != nullptr && session_->kernel_send();
}

Status Stream::Write(std::span<const iovec> iov, const Deadline& deadline,
                     int64_t stall_ms) {
  // With kTLS the kernel encrypts what sendmsg hands it: the plain path.
  if (session_ == nullptr || kernel_send_) {
    return WriteAll(fd_, iov, deadline, stall_ms);
  }
  return session_->Write(iov, deadline, stall_ms);
}

Status Stream::Read(std::span<const iovec> iov, const Deadline& deadline,
                    int64_t stall_ms) {
  // Through OpenSSL even with kTLS receive: it handles the records that
  // are not application data.
  if (session_ == nullptr) return ReadAll(fd_, iov, deadline, stall_ms);
  return session_->Read(iov, deadline, stall_ms);
}

Status Stream::ReadExact(void* buf, size_t n, const Deadline& deadline,
                         int64_t stall_ms) {
  iovec v{buf, n};
  return Read({&v, 1}, deadline, stall_ms);
}

bool Stream::HasBufferedInput() const {
  return session_ != nullptr && session_->HasBufferedInput();
}

}  // namespace tensorhub::transport
