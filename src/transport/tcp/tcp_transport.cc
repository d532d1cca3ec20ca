#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <list>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "common/log.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::transport {
namespace {

// Same-host (cross-memory attach) policy, shared by one transport's server
// and connections. Thread-safe.
std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "a peer";
  char host[64] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  return "an IPv6 peer";
}

class LocalReads {
 public:
  explicit LocalReads(const TcpTransportOptions& options)
      : copy_(options.copy_fn ? options.copy_fn : CrossMemoryCopyFn(ProcessVmReadv)) {
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

  // Whether copying from `holder` failed before.
  bool Refused(const std::string& holder) const {
    std::lock_guard<std::mutex> l(mu_);
    return refused_.count(holder) > 0;
  }
  // Remembers (up to kMaxRefused holders) that copying from `holder` failed,
  // and says so once per holder.
  void Refuse(const std::string& holder, const Status& why) {
    {
      std::lock_guard<std::mutex> l(mu_);
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
  mutable std::mutex mu_;
  std::set<std::string> refused_;  // guarded by mu_
};

class TcpServer final : public Server {
 public:
  TcpServer(Fd listener, std::string address, ReadSource* source,
            ServerOptions options, std::shared_ptr<const LocalReads> local,
            std::string secret)
      : listener_(std::move(listener)),
        address_(std::move(address)),
        source_(source),
        options_(options),
        local_(std::move(local)),
        secret_(std::move(secret)),
        pid_(static_cast<uint32_t>(::getpid())) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpServer() override { Stop(); }

  std::string address() const override { return address_; }
  uint64_t bytes_served() const override { return bytes_served_.load(); }
  uint64_t connections_refused() const override { return refused_.load(); }
  uint64_t bytes_served_local() const override {
    return bytes_served_local_.load();
  }

  void Stop() override {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    stopping_ = true;
    if (accept_thread_.joinable()) accept_thread_.join();
    std::list<Conn> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Every fd here is still open: a connection's fd is closed only when
      // its node is destroyed, after its thread was joined.
      for (Conn& c : conns_) ::shutdown(c.fd.get(), SHUT_RDWR);
      conns.splice(conns.end(), conns_);
    }
    for (Conn& c : conns) c.thread.join();
  }

 private:
  struct Conn {
    Fd fd;
    std::thread thread;
    bool done = false;
  };

  void AcceptLoop() {
    while (!stopping_.load()) {
      pollfd p{listener_.get(), POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      ReapFinished();
      if (rc <= 0) continue;
      int cfd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd < 0) continue;
      Fd fd(cfd);
      std::lock_guard<std::mutex> lock(mu_);
      if (conns_.size() >= options_.max_connections) {
        TH_LOG(WARN) << "data server " << address_ << ": refusing connection, "
                     << conns_.size() << " open (the bound)";
        continue;
      }
      TuneStream(fd.get());
      conns_.push_back(Conn{std::move(fd), std::thread(), false});
      Conn* c = &conns_.back();
      c->thread = std::thread([this, c, raw = c->fd.get()] {
        Serve(raw);
        std::lock_guard<std::mutex> l(mu_);
        c->done = true;
      });
    }
    listener_.Reset();
  }

  void ReapFinished() {
    std::list<Conn> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        if (it->done) finished.splice(finished.end(), conns_, it);
        it = next;
      }
    }
    for (Conn& c : finished) c.thread.join();
  }

  // Serves requests on one connection until the peer leaves, an I/O error,
  // or Stop().
  void Serve(int fd) {
    uint8_t header[wire::kRequestHeaderBytes];
    const int64_t stall_ms = options_.io_stall_timeout_ms;
    // Nothing is read from or served to a peer that has not proven it knows
    // the shared secret.
    Status auth = ServerHandshake(fd, secret_, Deadline::AfterMs(stall_ms));
    if (!auth.ok()) {
      TH_LOG(WARN) << "data server " << address_ << ": refused "
                   << PeerAddress(fd) << ": " << auth.ToString();
      refused_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    while (!stopping_.load()) {
      pollfd p{fd, POLLIN, 0};
      int rc = ::poll(&p, 1, 200);
      if (rc == 0) continue;
      if (rc < 0) return;
      // A whole read may take long on a slow link; what is bounded is the
      // time without progress (stall_ms), plus an hour overall.
      Deadline deadline = Deadline::AfterMs(3600 * 1000);
      if (!ReadExact(fd, header, sizeof(header), deadline, stall_ms).ok()) {
        return;
      }
      wire::ReadRequest req;
      bool local = false;
      Result<size_t> model_len =
          wire::DecodeReadRequestHeader(header, sizeof(header), &req, &local);
      if (!model_len.ok()) {
        // The stream cannot be re-synchronised after a bad frame.
        TH_LOG(WARN) << "data server " << address_ << ": dropping peer: "
                     << model_len.status().ToString();
        (void)SendError(fd, model_len.status(), deadline);
        return;
      }
      req.model.resize(*model_len);
      if (!ReadExact(fd, req.model.data(), req.model.size(), deadline,
                     stall_ms)
               .ok()) {
        return;
      }
      // The reader's identity, if it offers to copy the bytes itself.
      std::optional<wire::HostIdentity> reader;
      if (local) {
        uint8_t id[wire::kHostIdentityBytes];
        if (!ReadExact(fd, id, sizeof(id), deadline, stall_ms).ok()) return;
        reader = *wire::DecodeHostIdentity(id, sizeof(id));
      }
      Result<ServeLease> lease = source_->BeginRead(req);
      if (!lease.ok()) {
        if (!SendError(fd, lease.status(), deadline).ok()) return;
        continue;
      }
      if (reader.has_value() && local_->enabled() &&
          *reader == local_->identity()) {
        std::vector<wire::LocalPiece> pieces = CoalescePieces(lease->pieces);
        uint64_t total = 0;
        for (const wire::LocalPiece& p : pieces) total += p.length;
        // Else (too scattered to describe, or a source that does not cover
        // the range) the bytes go over TCP as usual.
        if (pieces.size() <= wire::kMaxLocalPieces && total == req.length) {
          if (!ServeLocal(fd, req, std::move(pieces), deadline)) {
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
      Status s = WriteAll(fd, iov, deadline, stall_ms);
      // The lease (and its pin on the registration) ends here, after the
      // last byte left or the send failed.
      if (!s.ok()) return;
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
    }
  }

  // Hands a same-host reader the addresses of the leased bytes and waits
  // (bounded) for its release. False: drop the connection.
  bool ServeLocal(int fd, const wire::ReadRequest& req,
                  std::vector<wire::LocalPiece> pieces,
                  const Deadline& deadline) {
    wire::LocalReply reply;
    reply.pid = pid_;
    reply.pieces = std::move(pieces);
    std::string body = wire::EncodeLocalReply(reply);
    wire::ResponseHeader h;
    h.status = StatusCode::kOk;
    h.local = true;
    h.payload_len = body.size();
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()}, {body.data(), body.size()}};
    if (!WriteAll(fd, iov, deadline, options_.io_stall_timeout_ms).ok()) {
      return false;
    }
    uint8_t release[wire::kReleaseBytes];
    Status s = ReadExact(fd, release, sizeof(release),
                         Deadline::AfterMs(options_.local_release_timeout_ms));
    if (!s.ok()) {
      if (s.code() == StatusCode::kDeadlineExceeded) {
        TH_LOG(WARN) << "data server " << address_
                     << ": a same-host reader did not release its lease within "
                     << options_.local_release_timeout_ms
                     << " ms; dropping it";
      }
      return false;
    }
    Result<wire::ReleaseOutcome> outcome =
        wire::DecodeRelease(release, sizeof(release));
    if (!outcome.ok()) {
      TH_LOG(WARN) << "data server " << address_ << ": dropping peer: "
                   << outcome.status().ToString();
      return false;
    }
    if (*outcome == wire::ReleaseOutcome::kCopied) {
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
      bytes_served_local_.fetch_add(req.length, std::memory_order_relaxed);
    }
    return true;
  }

  Status SendError(int fd, const Status& status, const Deadline& deadline) {
    std::string msg = status.message().substr(0, wire::kMaxMessageBytes);
    wire::ResponseHeader h;
    h.status = status.code();
    h.message_len = static_cast<uint16_t>(msg.size());
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()}, {msg.data(), msg.size()}};
    return WriteAll(fd, iov, deadline, options_.io_stall_timeout_ms);
  }

  Fd listener_;
  const std::string address_;
  ReadSource* const source_;
  const ServerOptions options_;
  const std::shared_ptr<const LocalReads> local_;
  const std::string secret_;
  std::atomic<uint64_t> refused_{0};
  const uint32_t pid_;
  std::mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> bytes_served_local_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Conn> conns_;  // guarded by mu_
};

class TcpConnection final : public Connection {
 public:
  TcpConnection(Fd fd, std::string peer, std::shared_ptr<LocalReads> local)
      : fd_(std::move(fd)), peer_(std::move(peer)), local_(std::move(local)) {}

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, uint64_t* xxh3) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    Status s = DoRead(req, dest, deadline, xxh3);
    if (cancelled_.load()) {
      broken_ = true;
      if (s.ok()) return s;  // it finished before the cancel landed
      return Unavailable("read from holder " + peer_ + " was cancelled (" +
                         s.message() + ")");
    }
    if (!s.ok() && s.code() != StatusCode::kNotFound &&
        s.code() != StatusCode::kAborted &&
        s.code() != StatusCode::kInvalidArgument &&
        s.code() != StatusCode::kResourceExhausted &&
        s.code() != StatusCode::kPermissionDenied) {
      broken_ = true;  // the stream position is unknown now
    }
    return s;
  }
  bool broken() const override { return broken_; }
  const std::string& peer() const override { return peer_; }
  void Cancel() override {
    // Under fd_mu_ so that the descriptor cannot be closed (and its number
    // reused by another socket) between the check and the shutdown.
    std::lock_guard<std::mutex> l(fd_mu_);
    cancelled_.store(true);
    if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  }

 private:
  Status DoRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                const Deadline& deadline, uint64_t* xxh3) {
    uint64_t want = 0;
    for (const iovec& v : dest) want += v.iov_len;
    if (want != req.length) {
      return Internal("destination holds " + std::to_string(want) +
                      " bytes for a read of " + std::to_string(req.length));
    }
    if (!local_->enabled() || local_declined_ || local_->Refused(peer_)) {
      return TcpRead(req, dest, deadline, xxh3);
    }
    TH_RETURN_IF_ERROR(SendRequest(req, &local_->identity(), deadline));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h, ReceiveHeader(deadline));
    if (!h.local) {
      // Another host (or a holder with same-host reads off): it sent the
      // bytes, and will again, so stop asking on this connection.
      local_declined_ = true;
      return ReceivePayload(h, req, dest, deadline, xxh3);
    }
    return LocalRead(h, req, dest, deadline, xxh3);
  }

  Status TcpRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                 const Deadline& deadline, uint64_t* xxh3) {
    TH_RETURN_IF_ERROR(SendRequest(req, nullptr, deadline));
    TH_ASSIGN_OR_RETURN(wire::ResponseHeader h, ReceiveHeader(deadline));
    if (h.local) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " answered a TCP read with a same-host reply");
    }
    return ReceivePayload(h, req, dest, deadline, xxh3);
  }

  Status SendRequest(const wire::ReadRequest& req,
                     const wire::HostIdentity* local, const Deadline& deadline) {
    std::string frame = wire::EncodeReadRequest(req, local);
    iovec out{frame.data(), frame.size()};
    return WriteAll(fd_.get(), {&out, 1}, deadline)
        .WithContext("holder " + peer_);
  }

  // The response header of a successful read; a refusal comes back as the
  // holder's status.
  Result<wire::ResponseHeader> ReceiveHeader(const Deadline& deadline) {
    uint8_t hdr[wire::kResponseHeaderBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), hdr, sizeof(hdr), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::ResponseHeader> h = wire::DecodeResponseHeader(hdr, sizeof(hdr));
    if (!h.ok()) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent a bad frame: " +
                      h.status().message());
    }
    if (h->status != StatusCode::kOk) {
      std::string msg(h->message_len, '\0');
      TH_RETURN_IF_ERROR(ReadExact(fd_.get(), msg.data(), msg.size(), deadline)
                             .WithContext("holder " + peer_));
      return Status(h->status, "holder " + peer_ + " refused: " + msg);
    }
    return h;
  }

  Status ReceivePayload(const wire::ResponseHeader& h,
                        const wire::ReadRequest& req,
                        std::span<const iovec> dest, const Deadline& deadline,
                        uint64_t* xxh3) {
    if (h.payload_len != req.length) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent " +
                      std::to_string(h.payload_len) + " bytes for a read of " +
                      std::to_string(req.length));
    }
    if (xxh3 == nullptr) {
      return ReadAll(fd_.get(), dest, deadline).WithContext("holder " + peer_);
    }
    // Hash each segment right after it lands, while it is still in cache:
    // one pass over memory instead of two.
    Xxh3Stream hash;
    for (const iovec& piece : dest) {
      auto* p = static_cast<uint8_t*>(piece.iov_base);
      for (size_t off = 0; off < piece.iov_len; off += kHashSegmentBytes) {
        size_t n = std::min(kHashSegmentBytes, piece.iov_len - off);
        TH_RETURN_IF_ERROR(ReadExact(fd_.get(), p + off, n, deadline)
                               .WithContext("holder " + peer_));
        hash.Update(p + off, n);
      }
    }
    *xxh3 = hash.Digest();
    return Status::Ok();
  }

  // The holder pinned the range and sent where it is; copy it, then release
  // the lease. If the copy is refused, release and read over TCP instead.
  Status LocalRead(const wire::ResponseHeader& h, const wire::ReadRequest& req,
                   std::span<const iovec> dest, const Deadline& deadline,
                   uint64_t* xxh3) {
    // payload_len was bounded by the decoder (at most kMaxLocalReplyBytes).
    std::string body(h.payload_len, '\0');
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), body.data(), body.size(), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::LocalReply> reply = wire::DecodeLocalReply(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(),
        req.length);
    if (!reply.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ + " sent a bad same-host reply: " +
                      reply.status().message());
    }
    Xxh3Stream hash;
    Status copied =
        CopyFromProcess(static_cast<pid_t>(reply->pid), reply->pieces, dest,
                        kCmaSegmentBytes, xxh3 != nullptr ? &hash : nullptr,
                        local_->copy());
    if (copied.ok()) {
      // The holder sends nothing until it has our release; anything to
      // read now means it gave up the lease (timeout, Stop) and its memory
      // may have changed under the copy.
      if (PeerClosed()) {
        Abandon();
        return Unavailable("holder " + peer_ +
                           " ended the lease before the copy finished");
      }
      TH_RETURN_IF_ERROR(SendRelease(wire::ReleaseOutcome::kCopied, deadline));
      if (xxh3 != nullptr) *xxh3 = hash.Digest();
      return Status::Ok();
    }
    TH_RETURN_IF_ERROR(SendRelease(wire::ReleaseOutcome::kNotCopied, deadline));
    local_->Refuse(peer_, copied);
    return TcpRead(req, dest, deadline, xxh3);
  }

  Status SendRelease(wire::ReleaseOutcome outcome, const Deadline& deadline) {
    auto frame = wire::EncodeRelease(outcome);
    iovec out{frame.data(), frame.size()};
    return WriteAll(fd_.get(), {&out, 1}, deadline)
        .WithContext("holder " + peer_);
  }

  bool PeerClosed() {
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  void Abandon() {
    broken_ = true;
    std::lock_guard<std::mutex> l(fd_mu_);
    fd_.Reset();
  }

  static constexpr size_t kHashSegmentBytes = 256 << 10;

  // Written only by the reading thread, under fd_mu_; Cancel reads it under
  // fd_mu_ from another thread.
  Fd fd_;
  std::mutex fd_mu_;
  std::atomic<bool> cancelled_{false};
  std::string peer_;
  const std::shared_ptr<LocalReads> local_;
  bool broken_ = false;
  bool local_declined_ = false;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpTransportOptions& options)
      : local_(std::make_shared<LocalReads>(options)), secret_(options.secret) {}

  std::string_view name() const override { return "tcp"; }

  Result<std::unique_ptr<Server>> Listen(const std::string& host_port,
                                         ReadSource* source,
                                         const ServerOptions& options) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ListenTcp(host_port, 512));
    TH_ASSIGN_OR_RETURN(std::string addr, LocalAddress(fd.get()));
    TH_ASSIGN_OR_RETURN(auto hp, SplitHostPort(host_port));
    TH_ASSIGN_OR_RETURN(auto bound, SplitHostPort(addr));
    // Keep the host as asked (a name stays a name), with the real port.
    std::string advertised = (hp.first.find(':') != std::string::npos
                                  ? "[" + hp.first + "]"
                                  : hp.first) +
                             ":" + std::to_string(bound.second);
    return std::unique_ptr<Server>(new TcpServer(
        std::move(fd), advertised, source, options, local_, secret_));
  }

  Result<std::unique_ptr<Connection>> Connect(const std::string& address,
                                              const Deadline& deadline) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(address, deadline));
    TH_RETURN_IF_ERROR(ClientHandshake(fd.get(), secret_, deadline)
                           .WithContext("holder " + address));
    return std::unique_ptr<Connection>(
        new TcpConnection(std::move(fd), address, local_));
  }

 private:
  const std::shared_ptr<LocalReads> local_;
  const std::string secret_;
};

}  // namespace

TcpTransportOptions TcpTransportOptions::FromEnv() {
  TcpTransportOptions o;
  const char* no_cma = std::getenv("TENSORHUB_NO_CMA");
  if (no_cma != nullptr && std::string(no_cma) == "1") o.local_reads = false;
  return o;
}

std::unique_ptr<Transport> MakeTcpTransport() {
  return MakeTcpTransport(TcpTransportOptions::FromEnv());
}

std::unique_ptr<Transport> MakeTcpTransport(const TcpTransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace tensorhub::transport
