#include "client/delta_maker.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "client/tensor_checks.h"
#include "common/log.h"
#include "common/test_point.h"
#include "delta/version_delta.h"

namespace tensorhub::client {

DeltaMaker::DeltaMaker(const ClientOptions& options, ControlPlane& hub,
                       Registry& registry, Membership& membership)
    : options_(options),
      hub_(hub),
      registry_(registry),
      membership_(membership) {}

DeltaMaker::~DeltaMaker() { Stop(); }

void DeltaMaker::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();  // releases the pins
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeltaMaker::Offer(const std::string& model, Version version,
                       const Deadline& deadline, Version received_base,
                       std::shared_ptr<const delta::VersionDelta> received) {
  if (!options_.deltas.serve) return;
  std::optional<WholeCopy> v = registry_.PinWhole(model, version);
  if (!v.has_value() || !v->holding.memory.is_host()) return;
  // The newest older version with the same chunks: what readers most likely
  // hold (the one before); the received delta's own base if there is one.
  const std::vector<Version> held = registry_.WholeVersions(model);
  std::optional<WholeCopy> base;
  for (auto it = held.rbegin(); it != held.rend() && !base.has_value(); ++it) {
    if (*it >= version) continue;
    if (received != nullptr && *it != received_base) continue;
    std::optional<WholeCopy> b = registry_.PinWhole(model, *it);
    if (b.has_value() && b->holding.memory.is_host() &&
        delta::CheckSameChunks(b->manifest, v->manifest).ok()) {
      base = std::move(b);
    }
  }
  if (!base.has_value()) return;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    if (queue_.size() >= kMaxQueued) {
      TH_LOG(INFO) << "delta of " << VersionName(model, version) << ": "
                   << kMaxQueued
                   << " deltas wait to be made already; it travels whole";
      return;
    }
  }
  Job job{model, std::move(*v), std::move(*base), std::move(received)};
  // Claimed before the caller (a Publish, a fetch) returns: a reader that
  // starts after that sees the delta pending at the hub and may wait for it
  // rather than read the version whole across a slow link.
  if (!Claim(job, deadline)) return;
  MutexLock lock(mu_);
  if (stopping_ || queue_.size() >= kMaxQueued) {
    lock.Unlock();
    Drop(job);
    return;
  }
  queue_.push_back(std::move(job));
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();
}

bool DeltaMaker::WaitIdle(const Deadline& deadline) {
  MutexLock lock(mu_);
  return cv_.wait_until(lock.native(), deadline.at(), [&]() TH_REQUIRES(mu_) {
    return queue_.empty() && !busy_;
  });
}

void DeltaMaker::Loop() {
  MutexLock lock(mu_);
  while (true) {
    cv_.wait(lock.native(),
             [&]() TH_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (stopping_) break;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.Unlock();
    Make(job);
    job = Job{};  // the pins go before anyone is told the work is done
    lock.Lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void DeltaMaker::Drop(const Job& job) {
  Result<bool> r = hub_.ReportDelta(
      membership_.id(), job.model, job.version.holding.version,
      job.base.holding.version, DeltaAction::kDrop, 0, options_.rpc_timeout_ms);
  if (!r.ok()) TH_LOG(DEBUG) << "drop delta: " << r.status().ToString();
}

bool DeltaMaker::Claim(const Job& job, const Deadline& deadline) {
  const int64_t timeout_ms = std::max<int64_t>(
      1, std::min(options_.rpc_timeout_ms, deadline.remaining_ms()));
  Result<bool> claim = hub_.ReportDelta(
      membership_.id(), job.model, job.version.holding.version,
      job.base.holding.version, DeltaAction::kClaim, 0, timeout_ms);
  if (!claim.ok()) {
    // A hub without deltas, or one that cannot be reached now: the version
    // travels whole.
    TH_LOG(DEBUG) << "delta of "
                  << VersionName(job.model, job.version.holding.version) << ": "
                  << claim.status().ToString();
    return false;
  }
  if (!*claim) ++refused_;  // another worker has it
  return *claim;
}

void DeltaMaker::Make(Job& job) {
  const Version version = job.version.holding.version;
  const Version base = job.base.holding.version;
  const std::string what = "delta of " + VersionName(job.model, version) +
                           " from " + std::to_string(base.value());
  if (registry_.delta_bytes() >= options_.deltas.max_memory_bytes) {
    TH_LOG(INFO) << what << ": the deltas served here fill max_memory_bytes ("
                 << options_.deltas.max_memory_bytes << "); not made";
    Drop(job);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (job.received != nullptr) {
    // Received whole and every chunk of it checked here: serve it as is.
    Serve(job, job.received, t0);
    return;
  }
  testpoint::Hit("delta_maker.computing", version.value());
  auto pieces = [&](uint64_t chunk, std::vector<iovec>* b,
                    std::vector<iovec>* v) {
    const ChunkLoc loc = job.version.manifest.Chunk(chunk);
    AppendPieces(job.base.manifest.parts()[loc.part],
                 job.base.holding.bases.at(loc.part), loc.offset, loc.bytes, b);
    AppendPieces(job.version.manifest.parts()[loc.part],
                 job.version.holding.bases.at(loc.part), loc.offset, loc.bytes,
                 v);
  };
  Result<delta::VersionDelta> made = delta::ComputeVersionDelta(
      job.base.manifest, base, job.version.manifest, version, pieces);
  if (!made.ok() || made->chunks_with_delta == 0) {
    TH_LOG(INFO) << what << ": "
                 << (made.ok() ? "no chunk changed little enough to pay"
                               : made.status().ToString());
    Drop(job);
    return;
  }
  Serve(job,
        std::make_shared<const delta::VersionDelta>(std::move(made).value()),
        t0);
}

void DeltaMaker::Serve(Job& job,
                       std::shared_ptr<const delta::VersionDelta> delta,
                       std::chrono::steady_clock::time_point t0) {
  const Version version = job.version.holding.version;
  const Version base = job.base.holding.version;
  const std::string what = "delta of " + VersionName(job.model, version) +
                           " from " + std::to_string(base.value());
  const uint64_t bytes = delta->total_bytes();
  if (registry_.delta_bytes() + bytes > options_.deltas.max_memory_bytes) {
    TH_LOG(INFO) << what << ": " << bytes
                 << " bytes would pass max_memory_bytes; not served";
    Drop(job);
    return;
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  Status attached = registry_.AttachDelta(
      job.model, version, job.version.holding.epoch, base, std::move(delta));
  if (!attached.ok()) {
    Drop(job);
    return;
  }
  Result<bool> ready =
      hub_.ReportDelta(membership_.id(), job.model, version, base,
                       DeltaAction::kReady, bytes, options_.rpc_timeout_ms);
  if (!ready.ok()) {
    // Served here all the same; a restarted hub hears it with the holding.
    TH_LOG(WARN) << what << ": made, but the hub was not told: "
                 << ready.status().ToString();
    return;
  }
  ++made_;
  if (job.received != nullptr) ++as_received_;
  const uint64_t total = job.version.manifest.total_bytes();
  TH_LOG(INFO) << what << ": " << bytes << " bytes, "
               << (total > 0 ? 100.0 * static_cast<double>(bytes) /
                                   static_cast<double>(total)
                             : 0.0)
               << "% of the version, "
               << (job.received != nullptr ? "as received, served after "
                                           : "made in ")
               << ms << " ms";
}

}  // namespace tensorhub::client
