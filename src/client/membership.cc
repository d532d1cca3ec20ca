#include "client/membership.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "client/addresses.h"
#include "client/fetch/delta_choice.h"
#include "common/log.h"

namespace tensorhub::client {
namespace {

// A hub that names no interval gets a heartbeat every third of its lease,
// within these bounds: the upper one keeps a hub restart noticed soon even
// under a long lease.
constexpr int64_t kMinHeartbeatMs = 50;
constexpr int64_t kMaxHeartbeatMs = 5000;

}  // namespace

Membership::Membership(const ClientOptions& options, ControlPlane& hub,
                       Registry& registry, const Addresses& addresses)
    : options_(options),
      hub_(hub),
      registry_(registry),
      addresses_(addresses) {}

Membership::~Membership() { Leave(); }

Status Membership::Join() {
  TH_ASSIGN_OR_RETURN(
      id_, hub_.Register(
               WorkerId(), options_.name, addresses_.data_address(),
               addresses_.endpoints(), options_.labels, options_.worker_class,
               NearbyDeltasWin(options_.deltas), options_.connect_timeout_ms));
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return Status::Ok();
}

Status Membership::RegisterAgain(const Deadline& deadline) {
  Result<WorkerId> again = hub_.Register(
      id_, options_.name, addresses_.data_address(), addresses_.endpoints(),
      options_.labels, options_.worker_class, NearbyDeltasWin(options_.deltas),
      std::min(options_.rpc_timeout_ms, deadline.timeout_ms()));
  if (!again.ok()) return again.status();
  registry_.MarkAllUnreported();
  return Status::Ok();
}

void Membership::Withdraw(const std::string& model, Version version,
                          const Deadline& deadline) {
  // No wait, force: the bytes are no longer served here, whatever they
  // protected.
  Status s = hub_.Unpublish(id_, model, version, /*wait_ms=*/0,
                            /*force=*/true, deadline.timeout_ms());
  if (!s.ok() && s.code() != StatusCode::kNotFound) {
    TH_LOG(DEBUG) << "withdraw '" << model << "@" << version.value()
                  << "' at the hub: " << s.ToString() << "; will retry";
    WithdrawLater(model, version);
  }
}

void Membership::WithdrawLater(const std::string& model, Version version) {
  MutexLock lock(mu_);
  pending_withdrawals_.insert({model, version});
}

void Membership::ReportProgress(const ProgressUpdate& update) {
  Status s = hub_.ReportProgress(id_, update, kProgressReportMs);
  if (!s.ok()) TH_LOG(DEBUG) << "progress report: " << s.ToString();
}

void Membership::QueueDoneReport(ProgressUpdate update) {
  MutexLock lock(mu_);
  if (done_reports_.size() >= kMaxDoneReports) done_reports_.pop_front();
  done_reports_.push_back(std::move(update));
}

void Membership::SendDoneReports() {
  std::deque<ProgressUpdate> reports;
  {
    MutexLock lock(mu_);
    reports.swap(done_reports_);
  }
  for (const ProgressUpdate& u : reports) ReportProgress(u);
}

int64_t Membership::ProgressIntervalMs() const {
  constexpr int64_t kProgressMs = 1000;
  const int64_t planned_ms = hub_.heartbeat_interval_ms();
  return planned_ms > kMaxHeartbeatMs ? planned_ms : kProgressMs;
}

void Membership::Leave() {
  {
    MutexLock lock(mu_);
    if (left_) return;
    left_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (id_.empty()) return;  // never joined
  SendDoneReports();
  // Only a worker that holds something can hold a last copy.
  const int64_t wait_ms =
      registry_.Snapshot().empty() ? 0 : options_.leave_timeout_ms;
  Status s = hub_.Leave(id_, std::min<int64_t>(1000, options_.rpc_timeout_ms),
                        wait_ms);
  if (!s.ok()) TH_LOG(DEBUG) << "leave: " << s.ToString();
}

// The configured interval, or the one the hub planned for its fleet (it
// grows with the fleet, docs/design.md "Heartbeats"), at most a third of the
// lease it granted (so that two heartbeats may be lost before it expires).
int64_t Membership::HeartbeatIntervalMs() const {
  if (options_.heartbeat_interval_ms > 0) return options_.heartbeat_interval_ms;
  const int64_t lease_ms = hub_.lease_ms();
  if (lease_ms <= 0) return 1000;
  const int64_t planned_ms = hub_.heartbeat_interval_ms();
  if (planned_ms > 0) {
    return std::clamp<int64_t>(planned_ms, kMinHeartbeatMs,
                               std::max(kMinHeartbeatMs, lease_ms / 3));
  }
  return std::clamp<int64_t>(lease_ms / 3, kMinHeartbeatMs, kMaxHeartbeatMs);
}

void Membership::HeartbeatLoop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    // Real time whatever the client's clock (ClientDeps::clock): this paces
    // I/O.
    cv_.wait_for(lock.native(),
                 std::chrono::milliseconds(HeartbeatIntervalMs()));
    if (stopping_) break;
    lock.Unlock();
    Status s = hub_.Heartbeat(id_);
    if (s.code() == StatusCode::kNotFound) {
      TH_LOG(INFO) << "hub forgot worker " << id_.value()
                   << " (restart or lease expiry); registering again";
      Rejoin();
    } else if (!s.ok()) {
      TH_LOG(DEBUG) << "heartbeat: " << s.ToString();
    } else {
      RetryPending();
      SendDoneReports();
    }
    lock.Lock();
  }
}

void Membership::Rejoin() {
  Result<WorkerId> r = hub_.Register(
      id_, options_.name, addresses_.data_address(), addresses_.endpoints(),
      options_.labels, options_.worker_class, NearbyDeltasWin(options_.deltas),
      options_.rpc_timeout_ms);
  if (!r.ok()) {
    TH_LOG(WARN) << "re-register: " << r.status().ToString();
    return;
  }
  registry_.MarkAllUnreported();
  RetryPending();
}

void Membership::RetryPending() {
  std::set<std::pair<std::string, Version>> withdrawals;
  {
    MutexLock lock(mu_);
    withdrawals.swap(pending_withdrawals_);
  }
  for (const auto& [m, v] : withdrawals) {
    // Revoked here already: the hub must drop the reference even if it was
    // a retained version's last.
    Status s = hub_.Unpublish(id_, m, v, 0, /*force=*/true);
    if (!s.ok() && s.code() != StatusCode::kNotFound) WithdrawLater(m, v);
  }
  for (const Holding& h : registry_.Unreported()) {
    // A part whose own Publish has not been acknowledged yet: that call
    // reports it (as a new version, not a rebuild).
    if (!h.manifest.has_value() && !h.accepted && !h.slices) continue;
    Status s;
    if (h.slices) {
      s = hub_.AddSliceHolder(id_, h.model, h.version, h.epoch,
                              h.parts.at(wire::kSliceHolderPart));
    } else if (h.manifest.has_value()) {
      s = hub_.AddHolder(id_, h.model, h.version, h.epoch, *h.manifest,
                         h.filling);
    } else {
      s = hub_.Publish(id_, h.model, h.version, *h.rank, h.group_size,
                       h.chunk_bytes, h.parts.at(*h.rank), h.epoch, true,
                       options_.rpc_timeout_ms);
    }
    if (s.ok()) {
      registry_.MarkReported(h.model, h.version, h.epoch, true);
      // The deltas it serves are soft state too.
      for (const auto& [base, bytes] : h.deltas) {
        Result<bool> d =
            hub_.ReportDelta(id_, h.model, h.version, base, DeltaAction::kReady,
                             bytes, options_.rpc_timeout_ms);
        if (!d.ok()) {
          TH_LOG(DEBUG) << "re-report delta: " << d.status().ToString();
        }
      }
    } else {
      TH_LOG(WARN) << "re-report '" << h.model << "@" << h.version.value()
                   << "': " << s.ToString();
    }
  }
}

}  // namespace tensorhub::client
