#include "transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/log.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::transport {
namespace {

class TcpServer final : public Server {
 public:
  TcpServer(Fd listener, std::string address, ReadSource* source,
            ServerOptions options)
      : listener_(std::move(listener)),
        address_(std::move(address)),
        source_(source),
        options_(options) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpServer() override { Stop(); }

  std::string address() const override { return address_; }
  uint64_t bytes_served() const override { return bytes_served_.load(); }

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
      Result<size_t> model_len =
          wire::DecodeReadRequestHeader(header, sizeof(header), &req);
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
      Result<ServeLease> lease = source_->BeginRead(req);
      if (!lease.ok()) {
        if (!SendError(fd, lease.status(), deadline).ok()) return;
        continue;
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
  std::mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bytes_served_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Conn> conns_;  // guarded by mu_
};

class TcpConnection final : public Connection {
 public:
  TcpConnection(Fd fd, std::string peer)
      : fd_(std::move(fd)), peer_(std::move(peer)) {}

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, uint64_t* xxh3) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    Status s = DoRead(req, dest, deadline, xxh3);
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

 private:
  Status DoRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                const Deadline& deadline, uint64_t* xxh3) {
    uint64_t want = 0;
    for (const iovec& v : dest) want += v.iov_len;
    if (want != req.length) {
      return Internal("destination holds " + std::to_string(want) +
                      " bytes for a read of " + std::to_string(req.length));
    }
    std::string frame = wire::EncodeReadRequest(req);
    iovec out{frame.data(), frame.size()};
    TH_RETURN_IF_ERROR(WriteAll(fd_.get(), {&out, 1}, deadline)
                           .WithContext("holder " + peer_));
    uint8_t hdr[wire::kResponseHeaderBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), hdr, sizeof(hdr), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::ResponseHeader> h = wire::DecodeResponseHeader(hdr, sizeof(hdr));
    if (!h.ok()) {
      broken_ = true;
      return DataLoss("holder " + peer_ + " sent a bad frame: " +
                      h.status().message());
    }
    if (h->status != StatusCode::kOk) {
      std::string msg(h->message_len, '\0');
      TH_RETURN_IF_ERROR(ReadExact(fd_.get(), msg.data(), msg.size(), deadline)
                             .WithContext("holder " + peer_));
      return Status(h->status, "holder " + peer_ + " refused: " + msg);
    }
    if (h->payload_len != req.length) {
      broken_ = true;
      return DataLoss("holder " + peer_ + " sent " +
                      std::to_string(h->payload_len) + " bytes for a read of " +
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

  static constexpr size_t kHashSegmentBytes = 256 << 10;

  Fd fd_;
  std::string peer_;
  bool broken_ = false;
};

class TcpTransport final : public Transport {
 public:
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
    return std::unique_ptr<Server>(
        new TcpServer(std::move(fd), advertised, source, options));
  }

  Result<std::unique_ptr<Connection>> Connect(const std::string& address,
                                              const Deadline& deadline) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(address, deadline));
    return std::unique_ptr<Connection>(new TcpConnection(std::move(fd), address));
  }
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport() {
  return std::make_unique<TcpTransport>();
}

}  // namespace tensorhub::transport
