// A worker's membership of the hub: its registration (and registering
// again under the same id when the hub forgot it), the heartbeat thread
// that keeps its lease, re-reports what it holds to a hub that restarted,
// and tells the hub later what it could not be told at once: withdrawn
// references (the one "force-unpublish at the hub, else retry on the
// heartbeat" path, Withdraw) and the final progress reports of finished
// fetches. Leaving the hub ends it.
//
// Threads: every method may be called from any thread; the heartbeat runs
// on a thread of its own from Join until Leave.
#ifndef TENSORHUB_CLIENT_MEMBERSHIP_H_
#define TENSORHUB_CLIENT_MEMBERSHIP_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "client/control_plane.h"
#include "client/registry.h"
#include "common/deadline.h"
#include "common/mutex.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

class Addresses;  // client/addresses.h

class Membership {
 public:
  // Borrows its arguments (Client::Impl owns them; they outlive this).
  // `options`: name, labels, class, timeouts and heartbeat interval.
  Membership(const ClientOptions& options, ControlPlane& hub,
             Registry& registry, const Addresses& addresses);
  // Leave(), if Join succeeded and Leave was not called.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Registers with the hub (within connect_timeout_ms) and starts the
  // heartbeat. Called once, after the data server listens (`addresses`
  // set).
  Status Join();
  // The id the hub gave at Join; empty before. Fixed from then on.
  const WorkerId& id() const { return id_; }

  // The hub answered NOT_FOUND for this worker (it restarted, or a new HA
  // leader has not heard of it): registers again under the same id within
  // `deadline`; the heartbeat re-reports everything held.
  Status RegisterAgain(const Deadline& deadline);

  // The hub must drop this worker's reference to `model@version`, whatever
  // it protects (a forced Unpublish: the bytes are no longer served here).
  // Tried at once within `deadline`; if the hub cannot be told now, the
  // heartbeat tells it once it answers.
  void Withdraw(const std::string& model, Version version,
                const Deadline& deadline);
  // The same, when the caller already failed to tell the hub: the
  // heartbeat retries.
  void WithdrawLater(const std::string& model, Version version);

  // A running fetch's progress (`tensorhub top`), sent now, best effort
  // (at most kProgressReportMs).
  void ReportProgress(const ProgressUpdate& update);
  // A finished fetch's last report: sent by the heartbeat thread (or by
  // Leave), so that no fetch waits for it. At most kMaxDoneReports wait;
  // the oldest is dropped (soft state).
  void QueueDoneReport(ProgressUpdate update);
  // How often a running fetch reports its progress: every second, unless
  // the hub stretched the heartbeat interval beyond its base because the
  // fleet is over its heartbeat budget; then at that interval, so that a
  // fan-out to the whole fleet costs the hub no more calls per second than
  // its heartbeats.
  int64_t ProgressIntervalMs() const;

  // Stops the heartbeat, sends the queued reports and leaves the hub:
  // while this worker holds something the hub may hold the call (renewing
  // the lease) up to leave_timeout_ms, until keepers copied retained
  // versions only it holds. Best effort: if the hub does not answer, the
  // lease expiring has the same effect (minus that protection).
  void Leave();

  static constexpr int64_t kProgressReportMs = 1000;
  static constexpr size_t kMaxDoneReports = 64;

 private:
  void HeartbeatLoop();
  // Re-registers under the same id and re-reports every reference: how a
  // restarted hub rebuilds its table.
  void Rejoin();
  // The withdrawals and reports the hub has not acknowledged yet.
  void RetryPending();
  void SendDoneReports();
  int64_t HeartbeatIntervalMs() const;

  const ClientOptions& options_;
  ControlPlane& hub_;
  Registry& registry_;
  const Addresses& addresses_;
  // Written once by Join, before the heartbeat thread starts and before
  // the client is handed out; read-only afterwards.
  WorkerId id_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  bool left_ TH_GUARDED_BY(mu_) = false;
  std::set<std::pair<std::string, Version>> pending_withdrawals_
      TH_GUARDED_BY(mu_);
  std::deque<ProgressUpdate> done_reports_ TH_GUARDED_BY(mu_);
  std::thread heartbeat_;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_MEMBERSHIP_H_
