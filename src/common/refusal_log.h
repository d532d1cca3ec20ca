// Rate-limited log lines about refused peers: a peer that floods a server
// with bad handshakes or unauthenticated calls must not flood its log too
// (issue 27: 7,132 refusals in 5 s wrote 1.07 MiB of WARN lines).
//
// The first refusal of a peer is logged at once. Later ones are counted;
// once per `interval_ms` a peer still being refused gets one line with the
// count since its last line (written with its next refusal, or by the next
// refusal of anyone once the interval has passed, or by Flush()). At most
// `max_peers` peers are tracked at once: refusals of others are counted
// together, under "other peers", and reported the same way.
//
// Thread-safe. The sink (default: a WARN line of the library's log) is
// called without the lock held.
#ifndef TENSORHUB_COMMON_REFUSAL_LOG_H_
#define TENSORHUB_COMMON_REFUSAL_LOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "common/clock.h"
#include "common/mutex.h"

namespace tensorhub {

class RefusalLog {
 public:
  using Sink = std::function<void(const std::string& line)>;
  // `what` starts every line ("data server 10.0.0.5:4000").
  explicit RefusalLog(std::string what, int64_t interval_ms = 10000,
                      size_t max_peers = 1024,
                      const Clock& clock = Clock::Real(), Sink sink = nullptr);
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // `peer` (an address, without the port: one host opening many
  // connections is one peer) was refused because of `why`.
  void Refused(const std::string& peer, const std::string& why);
  // Writes the counts not yet reported (at shutdown, or in tests).
  void Flush();

  uint64_t refusals() const;
  uint64_t lines() const;

 private:
  struct Peer {
    int64_t window_start_ms = 0;  // when its last line was written
    uint64_t unreported = 0;      // refusals since
    std::string last_why;
  };
  static constexpr char kOthers[] = "other peers";
  // The line reporting `p`'s unreported refusals, which it then resets.
  std::string Summary(const std::string& name, Peer& p, int64_t now_ms)
      TH_REQUIRES(mu_);
  // Lines for peers whose interval passed; forgets peers quiet that long.
  void Sweep(int64_t now_ms, std::vector<std::string>* out) TH_REQUIRES(mu_);
  void Write(const std::vector<std::string>& lines);

  const std::string what_;
  const int64_t interval_ms_;
  const size_t max_peers_;
  const Clock& clock_;
  const Sink sink_;
  mutable Mutex mu_;
  std::map<std::string, Peer> peers_ TH_GUARDED_BY(mu_);
  int64_t last_sweep_ms_ TH_GUARDED_BY(mu_) = 0;
  uint64_t refusals_ TH_GUARDED_BY(mu_) = 0;
  uint64_t lines_ TH_GUARDED_BY(mu_) = 0;
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_REFUSAL_LOG_H_
