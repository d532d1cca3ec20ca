// What the TCP and UCX data servers (and their connections) share about
// the request frames on their TCP stream (wire/frame.h): reading one
// request whole, answering with a refusal, walking a byte range over a
// list of pieces, and which of a holder's answers leave a connection
// usable. One copy, so that the two servers cannot drift apart.
#ifndef TENSORHUB_TRANSPORT_TCP_REQUEST_IO_H_
#define TENSORHUB_TRANSPORT_TCP_REQUEST_IO_H_

#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/deadline.h"
#include "tensorhub/status.h"
#include "transport/tcp/stream.h"
#include "wire/frame.h"

namespace tensorhub::transport {

// One request as a holder receives it.
struct IncomingRequest {
  wire::ReadRequest req;
  bool local = false;     // asks for a same-host (cross-memory) reply
  bool cuda_ipc = false;  // asks for a CUDA IPC reply
  // The reader's host identity, sent with `local` or `cuda_ipc`.
  std::optional<wire::HostIdentity> reader;
};

// How reading a request ended.
enum class RequestOutcome {
  kOk,
  // The stream failed (the peer left, a stall, Stop()): drop the
  // connection without a word.
  kGone,
  // The peer sent a bad frame: answer with the status (SendRefusal), then
  // drop the connection (the stream cannot be re-synchronised).
  kBad,
};

// Reads one request: its header, model name, stride and the reader's
// identity. `deadline` bounds the whole; `stall_ms` the time without a
// byte. `*status` says what was wrong (kBad) or failed (kGone).
RequestOutcome ReadIncomingRequest(Stream& stream, const Deadline& deadline,
                                   int64_t stall_ms, IncomingRequest* out,
                                   Status* status);

// Answers the request in flight with `status` (not OK): its code and
// message (truncated to wire::kMaxMessageBytes). The connection stays in
// step.
Status SendRefusal(Stream& stream, const Status& status,
                   const Deadline& deadline, int64_t stall_ms);

// Whether a reader's connection is still in step after a read that
// returned `code`: the holder's refusals (a whole response frame, nothing
// left unread) keep it; every other failure (I/O, a bad frame, a
// deadline) leaves the stream's position unknown, so the connection is
// broken. The one list both transports' connections use.
bool KeepsConnection(StatusCode code);

// Calls fn(address, length, done) for the runs of `pieces` that make up
// bytes [offset, offset + n) of their concatenation, in order (`done`:
// bytes of the range before this run). INTERNAL if the pieces end first.
template <typename Fn>
Status ForRange(std::span<const iovec> pieces, uint64_t offset, uint64_t n,
                Fn&& fn) {
  uint64_t at = 0, done = 0;
  for (const iovec& v : pieces) {
    if (done == n) break;
    const uint64_t end = at + v.iov_len;
    if (end > offset) {
      const uint64_t from = std::max(at, offset) - at;
      const uint64_t len = std::min<uint64_t>(v.iov_len - from, n - done);
      TH_RETURN_IF_ERROR(
          fn(static_cast<uint8_t*>(v.iov_base) + from, len, done));
      done += len;
    }
    at = end;
  }
  if (done != n) return Internal("range past the end of its pieces");
  return Status::Ok();
}

// Whether bytes [begin, begin + bytes) lie wholly inside the union of
// `regions` (in any order, overlapping or adjacent). A holder shares a
// CUDA allocation with a same-host reader only if so: CUDA IPC hands out
// the whole allocation, read-write, for as long as the reader keeps it
// open, so it must hold nothing but published bytes (docs/security.md).
bool CoveredBy(uint64_t begin, uint64_t bytes, std::span<const iovec> regions);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_REQUEST_IO_H_
