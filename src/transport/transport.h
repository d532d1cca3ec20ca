// The one data-plane interface. A holder runs a Server that answers range
// reads of versions it holds; a reader opens Connections to holders and reads
// ranges straight into its destination memory. Implementations (tcp/, later
// shm/, rdma/) live in their own targets; nothing above this header knows
// which one moves the bytes.
#ifndef TENSORHUB_TRANSPORT_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_TRANSPORT_H_

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/deadline.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"
#include "wire/frame.h"

namespace tensorhub::transport {

// The whole memory of one registration (one publish), for transports that
// register memory with the network once per publish instead of once per read
// (UCX: ucp_mem_map and a packed remote key). A transport attaches its
// state on first use; the state is destroyed with the Registration, which its
// owner (the worker's registry) does after the drain, before the memory may
// be reused, so a registration never outlives the memory it names.
// Thread-safe.
class Registration {
 public:
  Registration(std::vector<iovec> regions, MemoryLocation memory)
      : regions_(std::move(regions)), memory_(memory) {}
  ~Registration() {
    // Newest first: a later attachment may depend on an earlier one.
    while (!attached_.empty()) attached_.pop_back();
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  const std::vector<iovec>& regions() const { return regions_; }
  const MemoryLocation& memory() const { return memory_; }

  // The state `owner` attached, made by `make` on the first call (under a
  // lock: concurrent first reads make it once). `make`'s error is returned
  // and nothing is attached.
  template <typename T>
  Result<std::shared_ptr<T>> Attach(
      const void* owner,
      const std::function<Result<std::shared_ptr<T>>()>& make) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [o, state] : attached_) {
      if (o == owner) return std::static_pointer_cast<T>(state);
    }
    Result<std::shared_ptr<T>> made = make();
    if (made.ok()) attached_.emplace_back(owner, *made);
    return made;
  }

 private:
  const std::vector<iovec> regions_;
  const MemoryLocation memory_;
  std::mutex mu_;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> attached_;
};

// The memory one read is served from. `pin` keeps the registration from
// draining until the lease is destroyed, which the server does once the last
// byte has left (or the send failed), or, for a read the reader copies
// itself from this process's memory, once the reader released it (or the
// connection dropped, or local_release_timeout_ms passed).
//
// `memory` says where the pieces are. Device memory is never handed to the
// socket: the server stages it through pinned host buffers, or, for a
// same-host reader that asks, shares it by CUDA IPC (the lease then ends
// when the reader released it, as for a same-host host-memory read).
struct ServeLease {
  std::vector<iovec> pieces;
  std::shared_ptr<void> pin;
  MemoryLocation memory;
  // The registration the pieces lie in, valid while `pin` lives; null from
  // a source that does not keep one (a transport then registers per read).
  Registration* registration = nullptr;
  // Set once the registration is revoked (an unpublish began; null: the
  // source does not say). A same-host reader's release is then waited for
  // at most ServerOptions::revoked_release_ms more.
  std::shared_ptr<const std::atomic<bool>> revoked;
};

// Decides what a read may see. Implemented by the worker's registry.
// Called from server threads concurrently.
class ReadSource {
 public:
  virtual ~ReadSource() = default;
  virtual Result<ServeLease> BeginRead(const wire::ReadRequest& req) = 0;
};

struct ServerOptions {
  // Readers' connections served at once (after their handshake).
  size_t max_connections = 256;
  // Connections whose handshake (the secret's challenge-response, and TLS)
  // is still running: at most this many at once (a new one beyond closes
  // the oldest), at most max_authenticating_per_peer of them from one
  // address (a new one beyond is refused), each for at most
  // handshake_timeout_ms. They never take a reader's slot (docs/security.md,
  // "The data plane's limits").
  size_t max_authenticating = 64;
  size_t max_authenticating_per_peer = 16;
  int64_t handshake_timeout_ms = 5000;
  // A request or response that makes no progress for this long drops the
  // connection (a slow but moving transfer is not cut).
  int64_t io_stall_timeout_ms = 30000;
  // How long a lease handed to a same-host reader (which copies the bytes
  // itself) is kept waiting for its release before the connection is
  // dropped and the lease ends. Bounds how long such a reader can hold up
  // an unpublish's drain.
  int64_t local_release_timeout_ms = 30000;
  // Once an unpublish revoked the registration, a same-host reader's
  // release is waited for at most this much longer (a copy of a chunk takes
  // milliseconds), so a reader that never releases holds the unpublish for
  // this, not local_release_timeout_ms. The connection is closed before the
  // lease ends: a reader still copying then discards what it copied.
  int64_t revoked_release_ms = 2000;
};

class Server {
 public:
  virtual ~Server() = default;
  // HOST:PORT that peers can connect to (the port is resolved when 0 was
  // asked for).
  virtual std::string address() const = 0;
  // Closes the listener and every connection, and joins their threads.
  // Idempotent.
  virtual void Stop() = 0;
  // Bytes served, all paths; of which copied by same-host readers (cross
  // memory attach or CUDA IPC); of which staged from device memory.
  virtual uint64_t bytes_served() const = 0;
  virtual uint64_t bytes_served_local() const { return 0; }
  virtual uint64_t bytes_served_staged() const { return 0; }
  // Connections refused because the peer did not prove the shared secret
  // (or, with TLS, show a trusted certificate) within the handshake
  // deadline, or closed by the bounds on connections still authenticating
  // (ServerOptions).
  virtual uint64_t connections_refused() const { return 0; }
  // Connections served over TLS; of which the kernel encrypts the sends
  // (kTLS: the bytes still leave straight from the served memory).
  virtual uint64_t connections_tls() const { return 0; }
  virtual uint64_t connections_kernel_tls() const { return 0; }
  // Transports served besides the one at address() (a worker's set of
  // servers, src/client/transport_set.h), with where they listen.
  virtual std::vector<DataEndpoint> endpoints() const { return {}; }
  // Of bytes_served(), what those other transports sent over their wires
  // (not copied by same-host readers), by transport name, in the order of
  // endpoints().
  virtual std::vector<std::pair<std::string, uint64_t>> bytes_sent_by_others()
      const {
    return {};
  }
};

// How one read moved its bytes, for metrics and FetchStats.
struct ReadInfo {
  // Copied by the reader from a holder on its own host (cross-memory
  // attach or CUDA IPC), not sent over the connection.
  bool same_host = false;
  // Time spent computing the checksum asked for (0 when none was).
  int64_t verify_ns = 0;
};

// The checksum a read computes of the bytes it moves, as they arrive
// (cheaper than a second pass over memory): `kind` in, `value` out.
struct ReadChecksum {
  ChunkChecksum kind = ChunkChecksum::kXxh3;
  uint64_t value = 0;
  // Not null (kXxh3Tree only): receives ChunkHash::Leaves() of the bytes
  // read, so that a chunk read in pieces that begin at leaf boundaries is
  // verified as a whole (TreeSumOfLeaves over the pieces' leaves).
  std::vector<uint64_t>* leaves = nullptr;
};
// Sets sum->value (and sum->leaves) from a hash of the bytes read.
inline void SetChecksum(const ChunkHash& hash, ReadChecksum* sum) {
  if (sum == nullptr) return;
  sum->value = hash.Digest();
  if (sum->leaves != nullptr) *sum->leaves = hash.Leaves();
}
inline ChunkChecksum ChecksumKind(const ReadChecksum* sum) {
  return sum != nullptr ? sum->kind : ChunkChecksum::kXxh3;
}

// One read of a run of them (Connection::ReadPipelined): what Read takes.
struct PipelinedRead {
  wire::ReadRequest req;
  std::span<const iovec> dest;
  ReadChecksum* sum = nullptr;
};

// One reader-to-holder channel. Not thread-safe: one read at a time. After
// any I/O error the connection is broken and every later Read fails fast;
// open a new one.
class Connection {
 public:
  virtual ~Connection() = default;
  // Reads req.length bytes into `dest` (whose sizes must add up to it).
  // A refusal by the holder comes back with the holder's code and message.
  // If `sum` is not null, sum->value receives the checksum sum->kind of
  // the bytes read.
  virtual Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
                      const Deadline& deadline,
                      ReadChecksum* sum = nullptr) = 0;
  // The same into memory of CUDA device `device` (`dest` holds device
  // addresses). Bytes that come over the connection land in pinned host
  // staging buffers first, are hashed there (so `sum` covers exactly the
  // bytes then copied to the device) and copied host to device; bytes a
  // same-host holder shares by CUDA IPC are copied device to device and
  // hashed by a kernel on the destination. Returns once the bytes are in
  // `dest` (every copy synchronized). FAILED_PRECONDITION without CUDA.
  virtual Status ReadDevice(const wire::ReadRequest& req,
                            std::span<const iovec> dest, int device,
                            const Deadline& deadline,
                            ReadChecksum* sum = nullptr) = 0;
  // Several reads on this connection, answered in order: the TCP transport
  // sends up to `window` requests before the first answer is read
  // (pipelining), so that a holder that holds a read until its bytes land
  // (a filling holder, cut-through: docs/design.md) answers each next one
  // as soon as its bytes are there, with no round trip between them.
  // After each read landed, `landed(i)` is called on this thread (with
  // last_read() describing that read); an error from it, or from read i,
  // ends the run there (the connection is broken if answers were still
  // outstanding). This default reads one at a time (no pipelining).
  virtual Status ReadPipelined(std::span<const PipelinedRead> reads,
                               size_t window, const Deadline& deadline,
                               const std::function<Status(size_t)>& landed) {
    (void)window;
    for (size_t i = 0; i < reads.size(); ++i) {
      TH_RETURN_IF_ERROR(
          Read(reads[i].req, reads[i].dest, deadline, reads[i].sum));
      if (landed) TH_RETURN_IF_ERROR(landed(i));
    }
    return Status::Ok();
  }
  virtual bool broken() const = 0;
  virtual const std::string& peer() const = 0;
  // Runs over TLS; the kernel decrypts what it receives (kTLS).
  virtual bool tls() const { return false; }
  virtual bool kernel_tls() const { return false; }
  // How the last Read or ReadDevice that succeeded moved its bytes
  // (unspecified after one that failed).
  virtual ReadInfo last_read() const { return {}; }
  // Makes a Read running on another thread end soon with an error, and
  // breaks the connection. The one method that may be called while another
  // thread is inside Read (the reader uses it to move a read away from a
  // holder that became very slow); a no-op on a connection already broken.
  virtual void Cancel() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  // `source` must outlive the server.
  virtual Result<std::unique_ptr<Server>> Listen(
      const std::string& host_port, ReadSource* source,
      const ServerOptions& options) = 0;
  virtual Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) = 0;
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TRANSPORT_H_
