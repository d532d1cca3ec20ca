// A Transport for tests, with no sockets: holders are functions that fill a
// read's destination, and faults are injected at known points of a
// connection (NIXL-style error injection). Header-only; test code only.
//
// Where a fault lands (FaultWhere) and what it does (FaultWhat):
//   kConnect     before a connection exists: kRefuse fails Connect, kStall
//                blocks it until released, cancelled or its deadline;
//                kClose and kCorrupt act as kRefuse.
//   kReadHeader  a read, before the holder's answer: kRefuse is the holder's
//                refusal (UNAVAILABLE, the connection stays usable); kClose
//                breaks the connection; kCorrupt is a damaged response header
//                (INTERNAL, broken); kStall blocks.
//   kReadBody    the answer was accepted, no payload byte yet: as above, but
//                kCorrupt delivers every byte with one of them flipped (the
//                reader's checksum must catch it).
//   kMidChunk    half the payload was written to the destination: kClose and
//                kRefuse break the connection there, kStall blocks there,
//                kCorrupt flips a byte in the second half.
// A fault may name the part whose reads it hits (Fault::part): e.g.
// wire::kDeltaPart, a holder's delta of a version (docs/wire.md, "Delta
// parts"), so that a test breaks, stalls or corrupts the delta a reader
// applies and not the chunks it reads whole; such a fault never fires at
// kConnect.
// A stalled call ends when the test calls ReleaseStalls() (it then fails as
// a dropped connection), when Connection::Cancel() is called, or at its
// deadline (DEADLINE_EXCEEDED) as seen on the deadline's own clock, polled
// every kStallPollMs of real time.
//
// Listen serves a ReadSource (a worker's registry) as one more holder, at
// the address asked for (a port 0 becomes a fresh number), host memory only:
// so a Client can run on this transport. Faults apply to it as to any holder.
//
// Thread-safety: every method may be called from any thread.
#ifndef TENSORHUB_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_FAKE_FAKE_TRANSPORT_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "transport/transport.h"

namespace tensorhub::transport {

enum class FaultWhere { kConnect, kReadHeader, kReadBody, kMidChunk };

// Copies the bytes of `src` into `dest`, piece by piece; their sizes add up
// to the same total (false, and nothing promised about `dest`, otherwise).
inline bool CopyPieces(std::span<const iovec> src,
                       std::span<const iovec> dest) {
  size_t si = 0, so = 0;
  for (const iovec& d : dest) {
    for (size_t done = 0; done < d.iov_len;) {
      if (si == src.size()) return false;
      const size_t n = std::min(d.iov_len - done, src[si].iov_len - so);
      std::memcpy(static_cast<uint8_t*>(d.iov_base) + done,
                  static_cast<const uint8_t*>(src[si].iov_base) + so, n);
      done += n;
      so += n;
      if (so == src[si].iov_len) ++si, so = 0;
    }
  }
  for (; si < src.size(); ++si, so = 0) {
    if (src[si].iov_len > so) return false;
  }
  return true;
}
enum class FaultWhat { kRefuse, kCorrupt, kStall, kClose };

struct Fault {
  std::string address;  // the holder it applies to
  FaultWhere where = FaultWhere::kReadHeader;
  FaultWhat what = FaultWhat::kRefuse;
  int skip = 0;    // let this many calls at `where` through first
  int times = -1;  // then fire this many times; -1: forever
  // Only reads of this part (e.g. wire::kDeltaPart); unset: every read.
  std::optional<uint32_t> part{};
};

class FakeTransport final : public Transport {
 public:
  // Fills `dest` (sizes adding up to req.length) with the bytes asked for.
  using Serve = std::function<Status(const wire::ReadRequest&,
                                     std::span<const iovec> dest)>;
  static constexpr int64_t kStallPollMs = 5;

  void AddHolder(const std::string& address, Serve serve) {
    std::lock_guard<std::mutex> l(mu_);
    holders_[address] = std::move(serve);
  }
  void Inject(Fault f) {
    std::lock_guard<std::mutex> l(mu_);
    faults_.push_back(FaultState{std::move(f), 0, 0});
    released_ = false;
  }
  // Ends every call stalled now or later (until Inject is called again).
  void ReleaseStalls() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // Waits until `n` calls are stalled at once; false at the deadline.
  bool WaitForStalls(int n, const Deadline& deadline) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_until(l, deadline.at(), [&] { return stalled_ >= n; });
  }
  int fired(FaultWhere where) const {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (const FaultState& f : faults_)
      n += f.fault.where == where ? f.fired : 0;
    return n;
  }
  int reads(const std::string& address) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = reads_.find(address);
    return it == reads_.end() ? 0 : it->second;
  }

  void RemoveHolder(const std::string& address) {
    std::lock_guard<std::mutex> l(mu_);
    holders_.erase(address);
  }

  std::string_view name() const override { return "fake"; }
  Result<std::unique_ptr<Server>> Listen(const std::string& host_port,
                                         ReadSource* source,
                                         const ServerOptions& options) override;
  Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) override;

 private:
  class FakeConnection;
  struct FaultState {
    Fault fault;
    int seen = 0;
    int fired = 0;
  };

  // The fault that fires for this call at `where` (a read of `part`, or a
  // connect: none), if any.
  std::optional<FaultWhat> Take(const std::string& address, FaultWhere where,
                                std::optional<uint32_t> part = std::nullopt) {
    std::lock_guard<std::mutex> l(mu_);
    for (FaultState& f : faults_) {
      if (f.fault.address != address || f.fault.where != where) continue;
      if (f.fault.part.has_value() && f.fault.part != part) continue;
      if (f.seen++ < f.fault.skip) continue;
      if (f.fault.times >= 0 && f.fired >= f.fault.times) continue;
      ++f.fired;
      return f.fault.what;
    }
    return std::nullopt;
  }

  // Blocks until released, `cancelled` or the deadline.
  Status Stall(const std::atomic<bool>* cancelled, const Deadline& deadline) {
    std::unique_lock<std::mutex> l(mu_);
    ++stalled_;
    cv_.notify_all();
    while (!released_ && !(cancelled != nullptr && cancelled->load()) &&
           !deadline.expired()) {
      cv_.wait_for(l, std::chrono::milliseconds(kStallPollMs));
    }
    --stalled_;
    if (deadline.expired() && !released_)
      return DeadlineExceeded("fake: stalled past the deadline");
    return Unavailable("fake: connection dropped while stalled");
  }

  Status ServeRead(const std::string& address, const wire::ReadRequest& req,
                   std::span<const iovec> dest) {
    Serve serve;
    {
      std::lock_guard<std::mutex> l(mu_);
      ++reads_[address];
      auto it = holders_.find(address);
      if (it == holders_.end())
        return Unavailable("fake: no holder at " + address);
      serve = it->second;
    }
    return serve(req, dest);
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Serve> holders_;  // guarded by mu_
  std::vector<FaultState> faults_;        // guarded by mu_; as many as injected
  std::map<std::string, int> reads_;      // guarded by mu_; one per holder
  bool released_ = false;                 // guarded by mu_
  int stalled_ = 0;                       // guarded by mu_
  int listeners_ = 0;                     // guarded by mu_
};

// A ReadSource served as a holder of the FakeTransport; Stop withdraws it.
class FakeServer final : public Server {
 public:
  FakeServer(FakeTransport* t, std::string address, ReadSource* source)
      : t_(t), address_(std::move(address)) {
    t_->AddHolder(
        address_,
        [this, source](const wire::ReadRequest& req,
                       std::span<const iovec> dest) -> Status {
          Result<ServeLease> lease = source->BeginRead(req);
          if (!lease.ok()) return lease.status();
          if (!lease->memory.is_host())
            return FailedPrecondition("fake: serves host memory only");
          if (!CopyPieces(lease->pieces, dest))
            return Internal("fake: lease and read sizes differ");
          served_.fetch_add(req.length);
          return Status::Ok();
        });
  }
  ~FakeServer() override { Stop(); }
  std::string address() const override { return address_; }
  void Stop() override {
    if (!stopped_.exchange(true)) t_->RemoveHolder(address_);
  }
  uint64_t bytes_served() const override { return served_.load(); }

 private:
  FakeTransport* t_;
  const std::string address_;
  std::atomic<uint64_t> served_{0};
  std::atomic<bool> stopped_{false};
};

inline Result<std::unique_ptr<Server>> FakeTransport::Listen(
    const std::string& host_port, ReadSource* source, const ServerOptions&) {
  std::string address = host_port;
  if (address.size() >= 2 &&
      address.compare(address.size() - 2, 2, ":0") == 0) {
    std::lock_guard<std::mutex> l(mu_);
    address =
        address.substr(0, address.size() - 1) + std::to_string(++listeners_);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (holders_.count(address) != 0)
      return FailedPrecondition("fake: " + address + " is taken");
  }
  return std::unique_ptr<Server>(
      std::make_unique<FakeServer>(this, address, source));
}

class FakeTransport::FakeConnection final : public Connection {
 public:
  FakeConnection(FakeTransport* t, std::string address)
      : t_(t), address_(std::move(address)) {}

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, ReadChecksum* sum) override {
    if (broken_) return Unavailable("fake: connection is broken");
    if (cancelled_) return Broken(Unavailable("fake: read cancelled"));
    if (auto f = t_->Take(address_, FaultWhere::kReadHeader, req.part)) {
      switch (*f) {
        case FaultWhat::kRefuse:
          return Unavailable("fake: holder refused the read");
        case FaultWhat::kCorrupt:
          return Broken(Internal("fake: malformed response header"));
        case FaultWhat::kStall:
          return Broken(t_->Stall(&cancelled_, deadline));
        case FaultWhat::kClose:
          return Broken(Unavailable("fake: connection closed"));
      }
    }
    Status served = t_->ServeRead(address_, req, dest);
    if (!served.ok()) return served;
    std::optional<FaultWhat> f =
        t_->Take(address_, FaultWhere::kReadBody, req.part);
    bool mid = false;
    if (!f.has_value()) {
      f = t_->Take(address_, FaultWhere::kMidChunk, req.part);
      mid = f.has_value();
    }
    if (f.has_value()) {
      if (*f == FaultWhat::kCorrupt) {
        FlipByte(dest, mid ? req.length - 1 : 0);
      } else if (*f == FaultWhat::kStall) {
        return Broken(t_->Stall(&cancelled_, deadline));
      } else {
        return Broken(
            Unavailable(mid ? "fake: connection closed mid-chunk"
                            : "fake: connection closed before the payload"));
      }
    }
    if (cancelled_) return Broken(Unavailable("fake: read cancelled"));
    if (sum != nullptr) {
      ChunkHash hash(sum->kind);
      for (const iovec& p : dest) hash.Update(p.iov_base, p.iov_len);
      SetChecksum(hash, sum);
    }
    return Status::Ok();
  }
  Status ReadDevice(const wire::ReadRequest&, std::span<const iovec>, int,
                    const Deadline&, ReadChecksum*) override {
    return FailedPrecondition("fake: no device memory");
  }
  bool broken() const override { return broken_; }
  const std::string& peer() const override { return address_; }
  void Cancel() override { cancelled_ = true; }

 private:
  Status Broken(Status s) {
    broken_ = true;
    return s;
  }
  static void FlipByte(std::span<const iovec> dest, uint64_t at) {
    for (const iovec& v : dest) {
      if (at < v.iov_len) {
        static_cast<uint8_t*>(v.iov_base)[at] ^= 0x40;
        return;
      }
      at -= v.iov_len;
    }
  }

  FakeTransport* t_;
  const std::string address_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> cancelled_{false};
};

inline Result<std::unique_ptr<Connection>> FakeTransport::Connect(
    const std::string& address, const Deadline& deadline) {
  if (auto f = Take(address, FaultWhere::kConnect)) {
    if (*f == FaultWhat::kStall) return Stall(nullptr, deadline);
    return Unavailable("fake: connection refused by " + address);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (holders_.count(address) == 0)
      return Unavailable("fake: nobody listens at " + address);
  }
  return std::unique_ptr<Connection>(
      std::make_unique<FakeConnection>(this, address));
}

// Forwards to a FakeTransport its owner (a test) keeps, so that several
// clients, each owning its transport, serve and read on the same one.
class SharedFakeTransport final : public Transport {
 public:
  explicit SharedFakeTransport(FakeTransport& t) : t_(t) {}
  std::string_view name() const override { return t_.name(); }
  Result<std::unique_ptr<Server>> Listen(
      const std::string& host_port, ReadSource* source,
      const ServerOptions& options) override {
    return t_.Listen(host_port, source, options);
  }
  Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    return t_.Connect(address, deadline);
  }

 private:
  FakeTransport& t_;
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
