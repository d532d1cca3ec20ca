#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "common/checksum.h"
#include "common/log.h"
#include "common/mutex.h"
#include "cuda/device.h"
#include "tls/tls.h"
#include "transport/tcp/acceptor.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/request_io.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/stream.h"

namespace tensorhub::transport {
namespace {

// Two CUDA streams on one device, made on first use: one per staging
// buffer, so the copy into (or out of) one overlaps the socket I/O of the
// other. One thread at a time.
class StagingStreams {
 public:
  explicit StagingStreams(cuda::DeviceApi& api) : api_(api) {}
  Status Ensure(int device) {
    if (device_ == device) return Status::Ok();
    Sync();
    for (auto& s : streams_) {
      s.reset();
      TH_ASSIGN_OR_RETURN(s, api_.CreateStream(device));
    }
    device_ = device;
    return Status::Ok();
  }
  cuda::Stream& operator[](size_t i) { return *streams_[i]; }
  // Waits for every copy (before its staging buffers are reused or given
  // back); errors were reported where the copy was waited for first.
  void Sync() {
    for (auto& s : streams_) {
      if (s) (void)s->Synchronize();
    }
  }

 private:
  cuda::DeviceApi& api_;
  int device_ = -1;
  std::unique_ptr<cuda::Stream> streams_[2];
};

// The holder's device staging buffers of one device (ipc_staging.h): the
// CUDA side of StagingSlots. Process-wide, never destroyed (see
// TcpTransportOptions::ipc_staging_bytes). Thread-safe.
class DeviceIpcStaging {
 public:
  // The pool of `max_buffers` on `device` through `api`. One per
  // combination (a process normally has one transport, so one size).
  static DeviceIpcStaging& For(cuda::DeviceApi& api, int device,
                               size_t max_buffers) {
    static Mutex mu;
    static auto* pools = new std::map<std::tuple<cuda::DeviceApi*, int, size_t>,
                                      DeviceIpcStaging*>();
    MutexLock l(mu);
    DeviceIpcStaging*& p = (*pools)[{&api, device, max_buffers}];
    if (p == nullptr) p = new DeviceIpcStaging(api, device, max_buffers);
    return *p;
  }

  // Slots taken for one lease; given back on destruction, after the lease
  // ended (the reader released it or its connection was dropped).
  class Lease {
   public:
    Lease() = default;
    Lease(DeviceIpcStaging* pool, StagingSlots::Taken taken)
        : pool_(pool), taken_(std::move(taken)) {}
    Lease(Lease&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), taken_(std::move(o.taken_)) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        GiveBack();
        pool_ = std::exchange(o.pool_, nullptr);
        taken_ = std::move(o.taken_);
      }
      return *this;
    }
    ~Lease() { GiveBack(); }

   private:
    void GiveBack() {
      if (pool_ == nullptr) return;
      MutexLock l(pool_->mu_);
      pool_->slots_.Give(taken_);
      pool_ = nullptr;
    }
    DeviceIpcStaging* pool_ = nullptr;
    StagingSlots::Taken taken_;
  };

  // Whether a read of `bytes` could ever be staged in `max_buffers`.
  static bool Fits(uint64_t bytes, size_t max_buffers) {
    return max_buffers > 0 &&
           StagingSlots(max_buffers, kIpcStagingBufferBytes).Fits(bytes);
  }

  // Copies [0, length) of `pieces` (device memory of this device) into
  // staging buffers, on `stream` (waited for), and appends their IPC pieces
  // to `out`. RESOURCE_EXHAUSTED when too few buffers are free (nothing
  // waits: the caller stages through host memory instead).
  Result<Lease> Stage(std::span<const iovec> pieces, uint64_t length,
                      uint64_t owner, cuda::Stream& stream,
                      std::vector<wire::CudaIpcPiece>* out) {
    if (length == 0) return Lease();
    std::optional<StagingSlots::Taken> taken;
    {
      MutexLock l(mu_);
      taken = slots_.Take(length, owner);
    }
    if (!taken.has_value()) {
      return ResourceExhausted(
          "all " + std::to_string(max_buffers_) +
          " device staging buffers for CUDA IPC are in use");
    }
    Lease lease(this, *taken);  // gives the slots back on every error
    // A slot's first use allocates its buffer (at most max_buffers_
    // times per device and process). Slot i's buffer is touched only by
    // the lease holding slot i, so without the lock.
    for (size_t i : taken->allocate) {
      TH_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceBuffer> memory,
                          api_.Allocate(device_, kIpcStagingBufferBytes));
      TH_ASSIGN_OR_RETURN(cuda::IpcExport ipc,
                          api_.Export(memory->data(), device_));
      buffers_[i] = Buffer{std::move(memory), ipc};
      MutexLock l(mu_);
      slots_.MarkAllocated(i);
    }
    // No copy may still run into a buffer given back.
    struct SyncOnError {
      cuda::Stream& s;
      bool armed = true;
      ~SyncOnError() {
        if (armed) (void)s.Synchronize();
      }
    } sync_on_error{stream};
    std::vector<wire::CudaIpcPiece> staged;
    for (size_t k = 0; k < taken->slots.size(); ++k) {
      const uint64_t off = k * kIpcStagingBufferBytes;
      const uint64_t len = std::min(kIpcStagingBufferBytes, length - off);
      const Buffer& b = buffers_[taken->slots[k]];
      TH_RETURN_IF_ERROR(ForRange(
          pieces, off, len, [&](uint8_t* p, uint64_t l, uint64_t done) {
            return stream.CopyAsync(b.memory->data() + done, p, l);
          }));
      staged.push_back({b.ipc.handle.bytes, b.ipc.offset, len,
                        reinterpret_cast<uint64_t>(b.memory->data())});
    }
    sync_on_error.armed = false;
    TH_RETURN_IF_ERROR(stream.Synchronize());
    out->insert(out->end(), staged.begin(), staged.end());
    return lease;
  }

 private:
  struct Buffer {
    std::unique_ptr<cuda::DeviceBuffer> memory;
    cuda::IpcExport ipc;
  };
  DeviceIpcStaging(cuda::DeviceApi& api, int device, size_t max_buffers)
      : api_(api),
        device_(device),
        max_buffers_(max_buffers),
        slots_(max_buffers, kIpcStagingBufferBytes),
        buffers_(max_buffers) {}

  cuda::DeviceApi& api_;
  const int device_;
  const size_t max_buffers_;
  Mutex mu_;
  StagingSlots slots_ TH_GUARDED_BY(mu_);
  // Indexed by slot; element i belongs to whoever holds slot i.
  std::vector<Buffer> buffers_;
};

// Same-host (cross-memory attach) policy, shared by one transport's server
// and connections. Thread-safe.
class LocalReads {
 public:
  explicit LocalReads(const TcpTransportOptions& options)
      : copy_(options.copy_fn ? options.copy_fn
                              : CrossMemoryCopyFn(ProcessVmReadv)),
        cuda_ipc_(options.cuda_ipc),
        ipc_staging_buffers_(options.ipc_staging_bytes /
                             kIpcStagingBufferBytes),
        device_api_(options.device_api != nullptr ? *options.device_api
                                                  : cuda::Runtime()) {
    if (!options.local_reads) return;
    if (options.identity.has_value()) {
      identity_ = *options.identity;
      enabled_ = true;
      return;
    }
    Result<wire::HostIdentity> id = ReadHostIdentity();
    if (!id.ok()) {
      TH_LOG(INFO) << "same-host reads off, every read goes over TCP: "
                   << id.status().ToString();
      return;
    }
    identity_ = *id;
    enabled_ = true;
  }

  bool enabled() const { return enabled_; }
  const wire::HostIdentity& identity() const { return identity_; }
  const CrossMemoryCopyFn& copy() const { return copy_; }
  CudaIpcPolicy cuda_ipc() const { return cuda_ipc_; }
  size_t ipc_staging_buffers() const { return ipc_staging_buffers_; }
  cuda::DeviceApi& device_api() const { return device_api_; }

  // Whether copying from `holder` failed before.
  bool Refused(const std::string& holder) const {
    MutexLock l(mu_);
    return refused_.count(holder) > 0;
  }
  // Remembers (up to kMaxRefused holders) that copying from `holder` failed,
  // and says so once per holder.
  void Refuse(const std::string& holder, const Status& why) {
    {
      MutexLock l(mu_);
      if (refused_.size() >= kMaxRefused || !refused_.insert(holder).second) {
        return;
      }
    }
    TH_LOG(INFO) << "holder " << holder
                 << " is on this host but its memory cannot be read ("
                 << why.message() << "); reading it over TCP from now on";
  }

 private:
  static constexpr size_t kMaxRefused = 4096;
  bool enabled_ = false;
  wire::HostIdentity identity_;
  const CrossMemoryCopyFn copy_;
  const CudaIpcPolicy cuda_ipc_;
  const size_t ipc_staging_buffers_;
  cuda::DeviceApi& device_api_;
  mutable Mutex mu_;
  std::set<std::string> refused_ TH_GUARDED_BY(mu_);
};

// Says once per transport how data-plane TLS runs: in the kernel (kTLS),
// or in user space with the reason kTLS is not on (a notice, not silence:
// user-space TLS copies every byte through OpenSSL). Thread-safe.
class TlsNotice {
 public:
  void Note(const tls::Session& session, const char* role) {
    if (said_.exchange(true)) return;
    if (session.kernel_send()) {
      TH_LOG(INFO) << "data-plane TLS (" << session.description() << ", "
                   << role << "): kernel TLS on: the kernel encrypts sends"
                   << (session.kernel_recv() ? " and decrypts receives"
                                             : "; OpenSSL decrypts receives");
      return;
    }
    tls::KernelTlsSupport k = tls::KernelTls();
    TH_LOG(WARN) << "data-plane TLS (" << session.description() << ", " << role
                 << ") runs in user space (OpenSSL), not kernel TLS: "
                 << (k.available ? "OpenSSL did not enable kTLS for this "
                                   "connection (its cipher or TLS version)"
                                 : k.why)
                 << "; every byte is encrypted and copied by OpenSSL, which "
                    "costs throughput (tensorhub bench pair --data-tls "
                    "measures it)";
  }

 private:
  std::atomic<bool> said_{false};
};

// Serial numbers of served connections, process-wide: the owner a device
// staging buffer was last exported to (StagingSlots).
uint64_t NextSerial() {
  static std::atomic<uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

class TcpServer final : public Server {
 public:
  TcpServer(Fd listener, std::string address, ReadSource* source,
            ServerOptions options, std::shared_ptr<const LocalReads> local,
            std::string secret, std::shared_ptr<const tls::Context> tls,
            std::shared_ptr<TlsNotice> notice)
      : address_(std::move(address)),
        source_(source),
        options_(options),
        local_(std::move(local)),
        secret_(std::move(secret)),
        tls_(std::move(tls)),
        notice_(std::move(notice)),
        pid_(static_cast<uint32_t>(::getpid())),
        acceptor_(std::move(listener), AcceptorLimitsOf(options),
                  "data server " + address_) {
    acceptor_.Start(
        [this](int fd, Acceptor::Ticket& ticket) { Serve(fd, ticket); });
  }
  ~TcpServer() override { Stop(); }

  std::string address() const override { return address_; }
  uint64_t bytes_served() const override { return bytes_served_.load(); }
  uint64_t connections_refused() const override {
    return refused_.load() + acceptor_.refused_at_accept();
  }
  uint64_t connections_tls() const override { return connections_tls_.load(); }
  uint64_t connections_kernel_tls() const override {
    return connections_kernel_tls_.load();
  }
  uint64_t bytes_served_local() const override {
    return bytes_served_local_.load();
  }
  uint64_t bytes_served_staged() const override {
    return bytes_served_staged_.load();
  }

  void Stop() override {
    stopping_ = true;
    acceptor_.Stop();
  }

 private:
  // Serves requests on one connection until the peer leaves, an I/O error,
  // or Stop(). Long on purpose (about 100 lines): one request's whole life
  // (frame, lease, the reply by its path) stays in one loop body, so that
  // the lease visibly ends at the bottom of the loop on every path, after
  // the last byte left or after the reader released a same-host reply.
  void Serve(int fd, Acceptor::Ticket& ticket) {
    const int64_t stall_ms = options_.io_stall_timeout_ms;
    Stream stream(fd);
    if (!Admit(stream, ticket)) return;
    // For reads of device memory, made on first use.
    StagingStreams staging(local_->device_api());
    const uint64_t serial = NextSerial();
    while (!stopping_.load()) {
      if (!stream.HasBufferedInput()) {
        pollfd p{fd, POLLIN, 0};
        int rc = ::poll(&p, 1, 200);
        if (rc == 0) continue;
        if (rc < 0) return;
      }
      // A whole read may take long on a slow link; what is bounded is the
      // time without progress (stall_ms), plus an hour overall.
      Deadline deadline = Deadline::AfterMs(3600 * 1000);
      IncomingRequest in;
      Status bad;
      const RequestOutcome got =
          ReadIncomingRequest(stream, deadline, stall_ms, &in, &bad);
      if (got == RequestOutcome::kGone) return;
      if (got == RequestOutcome::kBad) {
        // The stream cannot be re-synchronised after a bad frame.
        acceptor_.refusals().Refused(ticket.peer(),
                                     "dropped a reader: " + bad.ToString());
        (void)SendRefusal(stream, bad, deadline, stall_ms);
        return;
      }
      const wire::ReadRequest& req = in.req;
      const bool local = in.local, cuda_ipc = in.cuda_ipc;
      Result<ServeLease> lease = source_->BeginRead(req);
      if (!lease.ok()) {
        if (!SendError(stream, lease.status(), deadline).ok()) return;
        continue;
      }
      const bool same_host = in.reader.has_value() && local_->enabled() &&
                             *in.reader == local_->identity();
      if (!lease->memory.is_host()) {
        if (cuda_ipc && same_host &&
            local_->cuda_ipc() != CudaIpcPolicy::kOff) {
          // Staging buffers exported for this lease: given back when it
          // ends, after the release or after the connection was dropped.
          DeviceIpcStaging::Lease exported;
          Result<std::string> body =
              CudaIpcBody(*lease, req.length, serial, staging, &exported);
          if (body.ok()) {
            if (!ServeLocal(stream, req, *lease, std::move(body).value(), true,
                            deadline)) {
              ::shutdown(fd, SHUT_RDWR);
              return;
            }
            continue;  // the lease ends here, after the reader released it
          }
          TH_LOG(DEBUG) << "data server " << address_
                        << ": staging instead of CUDA IPC: "
                        << body.status().ToString();
        }
        if (!ServeStaged(stream, req, *lease, staging, deadline)) return;
        continue;
      }
      if (local && same_host) {
        std::vector<wire::LocalPiece> pieces = CoalescePieces(lease->pieces);
        uint64_t total = 0;
        for (const wire::LocalPiece& p : pieces) total += p.length;
        // Else (too scattered to describe, or a source that does not cover
        // the range) the bytes go over TCP as usual.
        if (pieces.size() <= wire::kMaxLocalPieces && total == req.length) {
          wire::LocalReply reply;
          reply.pid = pid_;
          reply.pieces = std::move(pieces);
          if (!ServeLocal(stream, req, *lease, wire::EncodeLocalReply(reply),
                          false, deadline)) {
            // Close before the lease ends, so a reader still copying sees
            // the connection gone when it finishes and discards the bytes.
            ::shutdown(fd, SHUT_RDWR);
            return;
          }
          continue;  // the lease ends here, after the reader released it
        }
      }
      wire::ResponseHeader h;
      h.status = StatusCode::kOk;
      h.payload_len = req.length;
      auto hdr = wire::EncodeResponseHeader(h);
      std::vector<iovec> iov;
      iov.reserve(lease->pieces.size() + 1);
      iov.push_back({hdr.data(), hdr.size()});
      iov.insert(iov.end(), lease->pieces.begin(), lease->pieces.end());
      Status s = stream.Write(iov, deadline, stall_ms);
      // The lease (and its pin on the registration) ends here, after the
      // last byte left or the send failed.
      if (!s.ok()) return;
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
    }
  }

  // Nothing is read from or served to a peer that has not proven it knows
  // the shared secret (and, with TLS, shown a certificate of the
  // deployment's CA): the handshake, within the stall bound. False: the
  // peer was refused (logged and counted).
  // The handshake's deadline is short (handshake_timeout_ms), and until it
  // passes the connection holds only an authenticating slot (acceptor.h).
  bool Admit(Stream& stream, Acceptor::Ticket& ticket) {
    Status auth =
        ServerHandshake(stream, secret_, tls_.get(),
                        Deadline::AfterMs(options_.handshake_timeout_ms),
                        [&ticket] { return ticket.Admit(); });
    if (!auth.ok()) {
      // Over max_connections: the acceptor said so already.
      if (auth.code() != StatusCode::kResourceExhausted) {
        acceptor_.refusals().Refused(ticket.peer(), auth.ToString());
        refused_.fetch_add(1, std::memory_order_relaxed);
      }
      return false;
    }
    if (stream.tls()) {
      connections_tls_.fetch_add(1, std::memory_order_relaxed);
      if (stream.session()->kernel_send()) {
        connections_kernel_tls_.fetch_add(1, std::memory_order_relaxed);
      }
      notice_->Note(*stream.session(), "serving");
    }
    return true;
  }

  // The CUDA IPC reply for a lease of device memory, by the policy
  // (ipc_staging.h): handles of holder-owned staging buffers holding a copy
  // of the read's bytes (kept in `exported` until the lease ends), or with
  // kDirect the published allocations themselves where DirectIpcBody may
  // share them. Fails (and the read is staged through host memory instead)
  // when neither can be done.
  Result<std::string> CudaIpcBody(const ServeLease& lease, uint64_t length,
                                  uint64_t owner, StagingStreams& streams,
                                  DeviceIpcStaging::Lease* exported) {
    const CudaIpcPolicy policy = local_->cuda_ipc();
    Result<std::string> direct = FailedPrecondition(
        "CUDA IPC policy " + std::string(CudaIpcPolicyName(policy)));
    if (policy == CudaIpcPolicy::kDirect) direct = DirectIpcBody(lease);
    const size_t buffers = local_->ipc_staging_buffers();
    switch (ChooseDeviceReadPath(policy, direct.ok(),
                                 DeviceIpcStaging::Fits(length, buffers))) {
      case DeviceReadPath::kShareAllocation:
        return direct;
      case DeviceReadPath::kHostStaged:
        return FailedPrecondition(
            "a read of " + std::to_string(length) +
            " bytes does not fit in the device staging buffers for CUDA "
            "IPC (" +
            std::to_string(buffers) + " x " +
            std::to_string(kIpcStagingBufferBytes) + " bytes)" +
            (direct.ok() ? "" : "; " + direct.status().ToString()));
      case DeviceReadPath::kDeviceStaged:
        break;
    }
    TH_RETURN_IF_ERROR(streams.Ensure(lease.memory.device));
    wire::CudaIpcReply reply;
    reply.pid = pid_;
    TH_ASSIGN_OR_RETURN(
        *exported,
        DeviceIpcStaging::For(local_->device_api(), lease.memory.device,
                              buffers)
            .Stage(lease.pieces, length, owner, streams[0], &reply.pieces));
    return wire::EncodeCudaIpcReply(reply);
  }

  // The CUDA IPC reply that shares the published allocations themselves
  // (CudaIpcPolicy::kDirect): one handle per allocation run. Fails for
  // memory CUDA IPC cannot share, a range too scattered to describe, or an
  // allocation that holds more than the published regions: a handle opens
  // the whole allocation, read-write (CoveredBy).
  Result<std::string> DirectIpcBody(const ServeLease& lease) {
    wire::CudaIpcReply reply;
    reply.pid = pid_;
    const std::span<const iovec> published =
        lease.registration != nullptr
            ? std::span<const iovec>(lease.registration->regions())
            : std::span<const iovec>(lease.pieces);
    for (const iovec& v : lease.pieces) {
      if (v.iov_len == 0) continue;
      TH_ASSIGN_OR_RETURN(
          cuda::IpcExport ex,
          local_->device_api().Export(v.iov_base, lease.memory.device));
      if (ex.offset > ex.alloc_bytes ||
          v.iov_len > ex.alloc_bytes - ex.offset) {
        return InvalidArgument(
            "a served range crosses the end of its CUDA allocation");
      }
      const uint64_t alloc_base =
          reinterpret_cast<uint64_t>(v.iov_base) - ex.offset;
      if (!CoveredBy(alloc_base, ex.alloc_bytes, published)) {
        return FailedPrecondition(
            "its CUDA allocation (" + std::to_string(ex.alloc_bytes) +
            " bytes) holds more than the published regions; a CUDA IPC "
            "handle would open all of it");
      }
      if (!reply.pieces.empty() &&
          reply.pieces.back().handle == ex.handle.bytes &&
          reply.pieces.back().offset + reply.pieces.back().length ==
              ex.offset) {
        reply.pieces.back().length += v.iov_len;
        continue;
      }
      if (reply.pieces.size() == wire::kMaxCudaIpcPieces) {
        return ResourceExhausted("range spans more than " +
                                 std::to_string(wire::kMaxCudaIpcPieces) +
                                 " allocations");
      }
      reply.pieces.push_back({ex.handle.bytes, ex.offset, v.iov_len,
                              reinterpret_cast<uint64_t>(v.iov_base)});
    }
    return wire::EncodeCudaIpcReply(reply);
  }

  // Sends bytes of device memory: each segment is copied device to host
  // into one of two pinned buffers while the other one is being sent.
  // False: drop the connection.
  bool ServeStaged(Stream& stream, const wire::ReadRequest& req,
                   const ServeLease& lease, StagingStreams& streams,
                   const Deadline& deadline) {
    const int64_t stall_ms = options_.io_stall_timeout_ms;
    cuda::PinnedPool& pool = cuda::StagingPool();
    Result<cuda::PinnedPool::Lease> bufs =
        pool.Acquire(2, deadline.Cap(stall_ms));
    Status ready =
        bufs.ok() ? streams.Ensure(lease.memory.device) : bufs.status();
    if (!ready.ok()) {
      // Nothing sent yet: refuse this read, keep the connection.
      return SendError(stream,
                       ready.WithContext("staging " +
                                         MemoryLocationName(lease.memory)),
                       deadline)
          .ok();
    }
    // Whatever happens, no copy may still run into a buffer given back.
    struct SyncOnExit {
      StagingStreams& s;
      ~SyncOnExit() { s.Sync(); }
    } sync_on_exit{streams};
    const uint64_t seg = pool.buffer_bytes();
    const uint64_t n = (req.length + seg - 1) / seg;
    auto enqueue = [&](uint64_t k) {
      uint8_t* buf = bufs->buffer(k % 2);
      const uint64_t off = k * seg, len = std::min(seg, req.length - off);
      return ForRange(lease.pieces, off, len,
                      [&](uint8_t* p, uint64_t l, uint64_t done) {
                        return streams[k % 2].CopyAsync(buf + done, p, l);
                      });
    };
    Status s = enqueue(0);
    if (s.ok()) s = streams[0].Synchronize();
    if (!s.ok()) {
      TH_LOG(WARN) << "data server " << address_ << ": " << s.ToString();
      return SendError(stream, s.WithContext("staging device memory"), deadline)
          .ok();
    }
    wire::ResponseHeader h;
    h.status = StatusCode::kOk;
    h.payload_len = req.length;
    auto hdr = wire::EncodeResponseHeader(h);
    iovec hv{hdr.data(), hdr.size()};
    if (!stream.Write({&hv, 1}, deadline, stall_ms).ok()) return false;
    for (uint64_t k = 0; k < n; ++k) {
      if (k > 0) s = streams[k % 2].Synchronize();
      if (s.ok() && k + 1 < n) s = enqueue(k + 1);
      if (!s.ok()) {
        // The header promised bytes that cannot come: the stream is lost.
        TH_LOG(WARN) << "data server " << address_
                     << ": staging failed mid-read: " << s.ToString();
        return false;
      }
      const uint64_t len = std::min(seg, req.length - k * seg);
      iovec v{bufs->buffer(k % 2), len};
      if (!stream.Write({&v, 1}, deadline, stall_ms).ok()) return false;
    }
    bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
    bytes_served_staged_.fetch_add(req.length, std::memory_order_relaxed);
    return true;
  }

  // Hands a same-host reader where the leased bytes are (`body`: a
  // LocalReply, or a CudaIpcReply if `cuda_ipc`) and waits (bounded) for
  // its release. False: drop the connection.
  bool ServeLocal(Stream& stream, const wire::ReadRequest& req,
                  const ServeLease& lease, std::string body, bool cuda_ipc,
                  const Deadline& deadline) {
    wire::ResponseHeader h;
    h.status = StatusCode::kOk;
    h.local = !cuda_ipc;
    h.cuda_ipc = cuda_ipc;
    h.payload_len = body.size();
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()}, {body.data(), body.size()}};
    if (!stream.Write(iov, deadline, options_.io_stall_timeout_ms).ok()) {
      return false;
    }
    if (!AwaitRelease(stream, lease)) return false;
    uint8_t release[wire::kReleaseBytes];
    Status s = stream.ReadExact(release, sizeof(release),
                                Deadline::AfterMs(options_.io_stall_timeout_ms),
                                options_.io_stall_timeout_ms);
    if (!s.ok()) return false;
    Result<wire::ReleaseOutcome> outcome =
        wire::DecodeRelease(release, sizeof(release));
    if (!outcome.ok()) {
      TH_LOG(WARN) << "data server " << address_
                   << ": dropping peer: " << outcome.status().ToString();
      return false;
    }
    if (*outcome == wire::ReleaseOutcome::kCopied) {
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
      bytes_served_local_.fetch_add(req.length, std::memory_order_relaxed);
    }
    return true;
  }

  // Waits until the same-host reader's release is there to read, at most
  // local_release_timeout_ms, or revoked_release_ms once the lease's
  // registration is revoked. False (logged): give the lease up.
  bool AwaitRelease(Stream& stream, const ServeLease& lease) {
    Deadline by = Deadline::AfterMs(options_.local_release_timeout_ms);
    bool cut = false;
    while (!stream.HasBufferedInput()) {
      if (!cut && lease.revoked != nullptr && lease.revoked->load()) {
        cut = true;
        if (by.remaining_ms() > options_.revoked_release_ms) {
          by = Deadline::AfterMs(options_.revoked_release_ms);
        }
      }
      if (by.expired()) {
        TH_LOG(WARN) << "data server " << address_
                     << ": a same-host reader did not release its lease within "
                     << (cut ? options_.revoked_release_ms
                             : options_.local_release_timeout_ms)
                     << " ms" << (cut ? " of the unpublish" : "")
                     << "; dropping it";
        return false;
      }
      pollfd p{stream.fd(), POLLIN, 0};
      const int rc = ::poll(
          &p, 1, static_cast<int>(std::min<int64_t>(50, by.remaining_ms())));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
    return true;
  }

  Status SendError(Stream& stream, const Status& status,
                   const Deadline& deadline) {
    return SendRefusal(stream, status, deadline, options_.io_stall_timeout_ms);
  }

  const std::string address_;
  ReadSource* const source_;
  const ServerOptions options_;
  const std::shared_ptr<const LocalReads> local_;
  const std::string secret_;
  const std::shared_ptr<const tls::Context> tls_;  // null: plain TCP
  const std::shared_ptr<TlsNotice> notice_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> connections_tls_{0};
  std::atomic<uint64_t> connections_kernel_tls_{0};
  const uint32_t pid_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> bytes_served_local_{0};
  std::atomic<uint64_t> bytes_served_staged_{0};
  // Last: its threads run Serve() on the members above.
  Acceptor acceptor_;
};

class TcpConnection final : public Connection {
 public:
  // `stream` runs on `fd` (and is secured if the handshake made it so).
  TcpConnection(Fd fd, Stream stream, std::string peer,
                std::shared_ptr<LocalReads> local)
      : fd_(std::move(fd)),
        stream_(std::move(stream)),
        peer_(std::move(peer)),
        local_(std::move(local)),
        staging_(local_->device_api()) {}
  ~TcpConnection() override {
    staging_.Sync();
    for (const cuda::IpcHandle& h : opened_) cuda::IpcImports::Close(h);
  }

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, ReadChecksum* sum) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    last_read_ = ReadInfo{};
    return Finish(DoRead(req, dest, deadline, sum));
  }

  Status ReadDevice(const wire::ReadRequest& req, std::span<const iovec> dest,
                    int device, const Deadline& deadline,
                    ReadChecksum* sum) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    // A failure here is about this process's device, not the holder: it
    // must not break the connection.
    TH_RETURN_IF_ERROR(staging_.Ensure(device));
    last_read_ = ReadInfo{};
    return Finish(DoReadDevice(req, dest, device, deadline, sum));
  }

 private:
  Status Finish(Status s) {
    if (cancelled_.load()) {
      broken_ = true;
      if (s.ok()) return s;  // it finished before the cancel landed
      return Unavailable("read from holder " + peer_ + " was cancelled (" +
                         s.message() + ")");
    }
    if (!KeepsConnection(s.code())) {
      broken_ = true;  // the stream position is unknown now
    }
    return s;
  }

 public:
  bool broken() const override { return broken_; }
  const std::string& peer() const override { return peer_; }
  bool tls() const override { return stream_.tls(); }
  bool kernel_tls() const override {
    return stream_.tls() && stream_.session()->kernel_recv();
  }
  ReadInfo last_read() const override { return last_read_; }
  void Cancel() override {
    // Under fd_mu_ so that the descriptor cannot be closed (and its number
    // reused by another socket) between the check and the shutdown.
    MutexLock l(fd_mu_);
    cancelled_.store(true);
    if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  }

 private:
  Status DoRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                const Deadline& deadline, ReadChecksum* sum) {
    uint64_t want = 0;
    for (const iovec& v : dest) want += v.iov_len;
    if (want != req.length) {
      return Internal("destination holds " + std::to_string(want) +
                      " bytes for a read of " + std::to_string(req.length));
    }
    if (!local_->enabled() || local_declined_ || local_->Refused(peer_)) {
      return TcpRead(req, dest, deadline, sum);
    }
    TH_RETURN_IF_ERROR(SendRequest(req, &local_->identity(), deadline));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h, ReceiveHeader(deadline));
    if (h.cuda_ipc) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " answered with a CUDA IPC reply it was not asked for");
    }
    if (!h.local) {
      // Another host (or a holder with same-host reads off): it sent the
      // bytes, and will again, so stop asking on this connection.
      local_declined_ = true;
      return ReceivePayload(h, req, dest, deadline, sum);
    }
    return LocalRead(h, req, dest, deadline, sum);
  }

  Status TcpRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                 const Deadline& deadline, ReadChecksum* sum) {
    TH_RETURN_IF_ERROR(SendRequest(req, nullptr, deadline));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h, ReceiveHeader(deadline));
    if (h.local || h.cuda_ipc) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " answered a TCP read with a same-host reply");
    }
    return ReceivePayload(h, req, dest, deadline, sum);
  }

  Status DoReadDevice(const wire::ReadRequest& req, std::span<const iovec> dest,
                      int device, const Deadline& deadline, ReadChecksum* sum) {
    uint64_t want = 0;
    for (const iovec& v : dest) want += v.iov_len;
    if (want != req.length) {
      return Internal("destination holds " + std::to_string(want) +
                      " bytes for a read of " + std::to_string(req.length));
    }
    const bool ask_ipc =
        local_->enabled() && !ipc_declined_ && !local_->Refused("ipc " + peer_);
    TH_RETURN_IF_ERROR(SendRequest(req, ask_ipc ? &local_->identity() : nullptr,
                                   deadline, ask_ipc));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h, ReceiveHeader(deadline));
    if (h.local || (h.cuda_ipc && !ask_ipc)) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " answered with a same-host reply it was not asked for");
    }
    if (h.cuda_ipc) return CudaIpcRead(h, req, dest, device, deadline, sum);
    // The holder sent the bytes (host memory, another host, or memory CUDA
    // IPC cannot share): it will again, so stop asking on this connection.
    if (ask_ipc) ipc_declined_ = true;
    return ReceiveToDevice(h, req, dest, deadline, sum);
  }

  // Receives the payload segment by segment into two pinned buffers, hashes
  // each segment there, and copies it to the device while the next one
  // arrives into the other buffer.
  Status ReceiveToDevice(const wire::ResponseHeader& h,
                         const wire::ReadRequest& req,
                         std::span<const iovec> dest, const Deadline& deadline,
                         ReadChecksum* sum) {
    if (h.payload_len != req.length) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent " +
                      std::to_string(h.payload_len) + " bytes for a read of " +
                      std::to_string(req.length));
    }
    cuda::PinnedPool& pool = cuda::StagingPool();
    Result<cuda::PinnedPool::Lease> bufs = pool.Acquire(2, deadline);
    if (!bufs.ok()) {
      Abandon();  // the payload is on its way and nowhere to go
      return bufs.status().WithContext("staging a read from holder " + peer_);
    }
    struct SyncOnExit {
      StagingStreams& s;
      ~SyncOnExit() { s.Sync(); }
    } sync_on_exit{staging_};
    // Verified on the device once the bytes landed (a kernel pass over
    // them), so that this thread only receives; on the host as they arrive
    // where the caller wants the leaves' hashes too.
    const bool hash_on_device = sum != nullptr && sum->leaves == nullptr;
    ChunkHash hash(ChecksumKind(sum), /*timed=*/true);
    // A failure of this device mid-payload leaves the rest of the payload
    // unread: whatever its code, the stream is out of step.
    auto broken = [this](Status s) {
      Abandon();
      return s;
    };
    const uint64_t seg = pool.buffer_bytes();
    for (uint64_t k = 0, off = 0; off < req.length; ++k, off += seg) {
      const uint64_t len = std::min(seg, req.length - off);
      uint8_t* buf = bufs->buffer(k % 2);
      // The copy out of this buffer two segments ago must be done.
      if (Status s = staging_[k % 2].Synchronize(); !s.ok()) return broken(s);
      TH_RETURN_IF_ERROR(
          stream_.ReadExact(buf, len, deadline).WithContext("holder " + peer_));
      if (sum != nullptr && !hash_on_device) hash.Update(buf, len);
      Status copied =
          ForRange(dest, off, len, [&](uint8_t* p, uint64_t l, uint64_t done) {
            return staging_[k % 2].CopyAsync(p, buf + done, l);
          });
      if (!copied.ok()) return broken(copied);
    }
    for (size_t i = 0; i < 2; ++i)
      TH_RETURN_IF_ERROR(staging_[i].Synchronize());
    if (hash_on_device) {
      const auto t0 = std::chrono::steady_clock::now();
      TH_ASSIGN_OR_RETURN(sum->value, staging_[0].Checksum(sum->kind, dest));
      last_read_.verify_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now() - t0)
              .count();
      return Status::Ok();
    }
    SetChecksum(hash, sum);
    last_read_.verify_ns = hash.update_ns();
    return Status::Ok();
  }

  // The holder shared its device memory by CUDA IPC: open each allocation
  // (once per connection), copy device to device, hash the destination on
  // the device, then release the lease. If the memory cannot be opened,
  // release and read the bytes over TCP instead (and stop asking).
  Status CudaIpcRead(const wire::ResponseHeader& h,
                     const wire::ReadRequest& req, std::span<const iovec> dest,
                     int device, const Deadline& deadline, ReadChecksum* sum) {
    std::string body(h.payload_len, '\0');
    TH_RETURN_IF_ERROR(stream_.ReadExact(body.data(), body.size(), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::CudaIpcReply> reply = wire::DecodeCudaIpcReply(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(), req.length);
    if (!reply.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ + " sent a bad CUDA IPC reply: " +
                      reply.status().message());
    }
    const bool same_process = reply->pid == static_cast<uint32_t>(::getpid());
    Status copied = Status::Ok();
    std::vector<iovec> sources;
    sources.reserve(reply->pieces.size());
    for (const wire::CudaIpcPiece& piece : reply->pieces) {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(piece.address);
      if (!same_process) {
        // A process cannot open its own handles; it reads its own memory.
        cuda::IpcHandle handle{piece.handle};
        Result<uint8_t*> base = OpenIpc(handle, device);
        if (!base.ok()) {
          copied = base.status();
          break;
        }
        src = *base + piece.offset;
      }
      sources.push_back({const_cast<uint8_t*>(src), piece.length});
    }
    const iovec* whole =
        dest.size() == 1 && dest[0].iov_len == req.length ? &dest[0] : nullptr;
    uint64_t value = 0;
    if (copied.ok() && sum != nullptr && whole != nullptr) {
      // Into one destination, verified: the copy and the check in one pass
      // over memory (cuda::Stream::CopyAndChecksum).
      const auto t0 = std::chrono::steady_clock::now();
      Result<uint64_t> r = staging_[0].CopyAndChecksum(
          sum->kind, static_cast<uint8_t*>(whole->iov_base), sources);
      last_read_.verify_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now() - t0)
              .count();
      if (r.ok()) {
        TH_RETURN_IF_ERROR(ReleaseCopied(deadline));
        sum->value = *r;
        last_read_.same_host = true;
        return Status::Ok();
      }
      copied = r.status();
    }
    uint64_t off = 0;
    for (size_t i = 0; copied.ok() && i < sources.size(); ++i) {
      const uint8_t* src = static_cast<const uint8_t*>(sources[i].iov_base);
      copied = ForRange(dest, off, sources[i].iov_len,
                        [&](uint8_t* p, uint64_t l, uint64_t done) {
                          return staging_[0].CopyAsync(p, src + done, l);
                        });
      off += sources[i].iov_len;
    }
    if (copied.ok()) {
      if (sum != nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        Result<uint64_t> r = staging_[0].Checksum(sum->kind, dest);
        last_read_.verify_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - t0)
                .count();
        copied = r.status();
        if (r.ok()) value = *r;
      } else {
        copied = staging_[0].Synchronize();
      }
    } else {
      staging_.Sync();  // nothing may still copy after the release
    }
    if (copied.ok()) {
      TH_RETURN_IF_ERROR(ReleaseCopied(deadline));
      if (sum != nullptr) sum->value = value;
      last_read_.same_host = true;
      return Status::Ok();
    }
    TH_RETURN_IF_ERROR(SendRelease(wire::ReleaseOutcome::kNotCopied, deadline));
    local_->Refuse("ipc " + peer_, copied);
    ipc_declined_ = true;
    TH_RETURN_IF_ERROR(SendRequest(req, nullptr, deadline));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h2, ReceiveHeader(deadline));
    if (h2.local || h2.cuda_ipc) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " answered a TCP read with a same-host reply");
    }
    return ReceiveToDevice(h2, req, dest, deadline, sum);
  }

  Result<uint8_t*> OpenIpc(const cuda::IpcHandle& handle, int device) {
    TH_ASSIGN_OR_RETURN(uint8_t * base, cuda::IpcImports::Open(handle, device));
    if (!opened_.insert(handle).second)
      cuda::IpcImports::Close(handle);  // one ref each
    return base;
  }

  Status SendRequest(const wire::ReadRequest& req,
                     const wire::HostIdentity* local, const Deadline& deadline,
                     bool cuda_ipc = false) {
    std::string frame = wire::EncodeReadRequest(req, local, cuda_ipc);
    iovec out{frame.data(), frame.size()};
    return stream_.Write({&out, 1}, deadline).WithContext("holder " + peer_);
  }

  // The response header of a successful read; a refusal comes back as the
  // holder's status.
  Result<wire::ResponseHeader> ReceiveHeader(const Deadline& deadline) {
    uint8_t hdr[wire::kResponseHeaderBytes];
    TH_RETURN_IF_ERROR(stream_.ReadExact(hdr, sizeof(hdr), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::ResponseHeader> h =
        wire::DecodeResponseHeader(hdr, sizeof(hdr));
    if (!h.ok()) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " sent a bad frame: " + h.status().message());
    }
    if (h->status != StatusCode::kOk) {
      std::string msg(h->message_len, '\0');
      TH_RETURN_IF_ERROR(stream_.ReadExact(msg.data(), msg.size(), deadline)
                             .WithContext("holder " + peer_));
      return Status(h->status, "holder " + peer_ + " refused: " + msg);
    }
    return h;
  }

  Status ReceivePayload(const wire::ResponseHeader& h,
                        const wire::ReadRequest& req,
                        std::span<const iovec> dest, const Deadline& deadline,
                        ReadChecksum* sum) {
    if (h.payload_len != req.length) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent " +
                      std::to_string(h.payload_len) + " bytes for a read of " +
                      std::to_string(req.length));
    }
    if (sum == nullptr) {
      return stream_.Read(dest, deadline).WithContext("holder " + peer_);
    }
    // Hash each segment right after it lands, while it is still in cache:
    // one pass over memory instead of two.
    ChunkHash hash(ChecksumKind(sum), /*timed=*/true);
    for (const iovec& piece : dest) {
      auto* p = static_cast<uint8_t*>(piece.iov_base);
      for (size_t off = 0; off < piece.iov_len; off += kHashSegmentBytes) {
        size_t n = std::min(kHashSegmentBytes, piece.iov_len - off);
        TH_RETURN_IF_ERROR(stream_.ReadExact(p + off, n, deadline)
                               .WithContext("holder " + peer_));
        hash.Update(p + off, n);
      }
    }
    SetChecksum(hash, sum);
    last_read_.verify_ns = hash.update_ns();
    return Status::Ok();
  }

  // The holder pinned the range and sent where it is; copy it, then release
  // the lease. If the copy is refused, release and read over TCP instead.
  Status LocalRead(const wire::ResponseHeader& h, const wire::ReadRequest& req,
                   std::span<const iovec> dest, const Deadline& deadline,
                   ReadChecksum* sum) {
    // payload_len was bounded by the decoder (at most kMaxLocalReplyBytes).
    std::string body(h.payload_len, '\0');
    TH_RETURN_IF_ERROR(stream_.ReadExact(body.data(), body.size(), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::LocalReply> reply = wire::DecodeLocalReply(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(), req.length);
    if (!reply.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ + " sent a bad same-host reply: " +
                      reply.status().message());
    }
    ChunkHash hash(ChecksumKind(sum), /*timed=*/true);
    Status copied = CopyFromProcess(
        static_cast<pid_t>(reply->pid), reply->pieces, dest, kCmaSegmentBytes,
        sum != nullptr ? &hash : nullptr, local_->copy());
    if (copied.ok()) {
      TH_RETURN_IF_ERROR(ReleaseCopied(deadline));
      SetChecksum(hash, sum);
      last_read_ = ReadInfo{true, hash.update_ns()};
      return Status::Ok();
    }
    TH_RETURN_IF_ERROR(SendRelease(wire::ReleaseOutcome::kNotCopied, deadline));
    local_->Refuse(peer_, copied);
    return TcpRead(req, dest, deadline, sum);
  }

  // After a same-host copy that succeeded. The holder sends nothing until
  // it has our release; anything to read now means it gave up the lease
  // (timeout, Stop), and its memory may have been reused under the copy.
  Status ReleaseCopied(const Deadline& deadline) {
    if (PeerClosed()) {
      Abandon();
      return Unavailable("holder " + peer_ +
                         " ended the lease before the copy finished");
    }
    return SendRelease(wire::ReleaseOutcome::kCopied, deadline);
  }

  Status SendRelease(wire::ReleaseOutcome outcome, const Deadline& deadline) {
    auto frame = wire::EncodeRelease(outcome);
    iovec out{frame.data(), frame.size()};
    return stream_.Write({&out, 1}, deadline).WithContext("holder " + peer_);
  }

  bool PeerClosed() {
    if (stream_.HasBufferedInput()) return true;
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  void Abandon() {
    broken_ = true;
    MutexLock l(fd_mu_);
    stream_ = Stream(-1);  // its TLS session first: it uses the socket
    fd_.Reset();
  }

  static constexpr size_t kHashSegmentBytes = 256 << 10;

  // Written only by the reading thread, under fd_mu_; Cancel reads it under
  // fd_mu_ from another thread.
  Fd fd_;
  Mutex fd_mu_;
  // On fd_; used only by the reading thread.
  Stream stream_;
  std::atomic<bool> cancelled_{false};
  std::string peer_;
  const std::shared_ptr<LocalReads> local_;
  bool broken_ = false;
  ReadInfo last_read_;  // the reading thread's, like broken_
  bool local_declined_ = false;
  bool ipc_declined_ = false;
  // Device reads: staging streams, and the holder allocations this
  // connection opened (one reference each in cuda::IpcImports).
  StagingStreams staging_;
  std::set<cuda::IpcHandle> opened_;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpTransportOptions& options)
      : local_(std::make_shared<LocalReads>(options)),
        secret_(options.secret),
        tls_(options.tls),
        notice_(std::make_shared<TlsNotice>()) {}

  std::string_view name() const override { return "tcp"; }

  Result<std::unique_ptr<Server>> Listen(
      const std::string& host_port, ReadSource* source,
      const ServerOptions& options) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ListenTcp(host_port, 512));
    TH_ASSIGN_OR_RETURN(std::string addr, LocalAddress(fd.get()));
    TH_ASSIGN_OR_RETURN(auto hp, SplitHostPort(host_port));
    TH_ASSIGN_OR_RETURN(auto bound, SplitHostPort(addr));
    // Keep the host as asked (a name stays a name), with the real port.
    std::string advertised =
        (hp.first.find(':') != std::string::npos ? "[" + hp.first + "]"
                                                 : hp.first) +
        ":" + std::to_string(bound.second);
    return std::unique_ptr<Server>(new TcpServer(std::move(fd), advertised,
                                                 source, options, local_,
                                                 secret_, tls_, notice_));
  }

  Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(address, deadline));
    Stream stream(fd.get());
    TH_RETURN_IF_ERROR(ClientHandshake(stream, secret_, tls_.get(), deadline)
                           .WithContext("holder " + address));
    if (stream.tls()) notice_->Note(*stream.session(), "reading");
    return std::unique_ptr<Connection>(
        new TcpConnection(std::move(fd), std::move(stream), address, local_));
  }

 private:
  const std::shared_ptr<LocalReads> local_;
  const std::string secret_;
  const std::shared_ptr<const tls::Context> tls_;
  const std::shared_ptr<TlsNotice> notice_;
};

}  // namespace

Result<TcpTransportOptions> TcpTransportOptions::FromEnv() {
  TcpTransportOptions o;
  const char* no_cma = std::getenv("TENSORHUB_NO_CMA");
  if (no_cma != nullptr && std::string(no_cma) == "1") o.local_reads = false;
  if (const char* ipc = std::getenv("TENSORHUB_CUDA_IPC"); ipc != nullptr) {
    Result<CudaIpcPolicy> p = ParseCudaIpcPolicy(ipc);
    if (!p.ok()) {
      return p.status().WithContext(
          "TENSORHUB_CUDA_IPC: set it to staged, direct or off, or unset it "
          "(staged)");
    }
    o.cuda_ipc = *p;
  }
  if (const char* mib = std::getenv("TENSORHUB_CUDA_IPC_STAGING_MIB");
      mib != nullptr) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(mib, &end, 10);
    if (*mib == '\0' || *end != '\0' || errno != 0 || v > (1ull << 30) ||
        *mib == '-' || *mib == '+' || *mib == ' ') {
      return InvalidArgument(
          "TENSORHUB_CUDA_IPC_STAGING_MIB='" + std::string(mib) +
          "' is not a whole number of MiB (0 to 1073741824): set it to the "
          "device staging memory a holder may use per GPU, or unset it (" +
          std::to_string(kDefaultIpcStagingBytes >> 20) + ")");
    }
    o.ipc_staging_bytes = v << 20;
  }
  return o;
}

std::unique_ptr<Transport> MakeTcpTransport() {
  return MakeTcpTransport(TcpTransportOptions{});
}

std::unique_ptr<Transport> MakeTcpTransport(
    const TcpTransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace tensorhub::transport
