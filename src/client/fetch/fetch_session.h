// One fetch's conversation with the hub, whatever kind of fetch it is
// (docs/design.md, "Fetch"): begun by one BeginFetch (resolve, the reader's
// filling registration, the first sources), then the manifest (from a
// source, checked against the SHA-256 the hub named, or from the hub), the
// sources a run starts from, the refresher that asks the hub again, the
// run's options (metrics, progress for `tensorhub top`, set here once), and
// the end: the fetch's FetchStats (every stage), its final progress report,
// and FetchDone, unless the body's report of a complete copy ended the
// fetch at the hub. A session that ends any other way withdraws what the
// hub was told (FetchDone; a filling registration the body did not take
// over is withdrawn through Membership::Withdraw).
//
// A body says how the destination maps onto the manifest and which run it
// starts: whole_fetch.h (chunks of the manifest into the caller's tensors,
// served as they arrive) and slice_fetch.h (boxes of logical tensors). A
// whole fetch of a version published as pieces hands its session to the
// slice body: one BeginFetch per fetch, whatever the body. How bytes are
// moved from each source is the run's business (a PlanRun's Read, given
// the FetchSource it reads from): the session hands out sources and takes
// back a FetchReport, and does not care what the run did in between.
//
// Threads: one session belongs to one fetch call; the refresher and the
// progress callback it hands out run on that fetch's threads while the
// session lives.
#ifndef TENSORHUB_CLIENT_FETCH_FETCH_SESSION_H_
#define TENSORHUB_CLIENT_FETCH_FETCH_SESSION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/control_plane.h"
#include "client/fetch/fetcher.h"
#include "client/worker_context.h"
#include "common/deadline.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

class FetchSession {
 public:
  // Begins a fetch of `model@version` (Latest() allowed; a reader group
  // from `options`): checks the options, splits the deadline, asks the hub
  // (BeginFetch, again while it is unreachable or rebuilding, until the
  // work deadline) and takes the manifest. `fill_epoch`: a registry epoch
  // reserved for the destination; the hub is asked to register this
  // reader as a filling holder under it.
  static Result<std::unique_ptr<FetchSession>> Begin(
      WorkerContext& ctx, std::string_view model, Version version,
      const FetchOptions& options, std::optional<uint64_t> fill_epoch);
  // Ends the conversation if Finish did not: Withdraw().
  ~FetchSession();
  FetchSession(const FetchSession&) = delete;
  FetchSession& operator=(const FetchSession&) = delete;

  const std::string& model() const { return model_; }
  // The version resolved (never Latest()).
  Version version() const { return version_; }
  // "'model@3'", for errors.
  const std::string& name() const { return name_; }
  const Manifest& manifest() const { return *start_.resolved.manifest; }
  const FetchOptions& options() const { return options_; }
  // The fetch's own steps end by `work`; the last tenth of its time (at
  // most 250 ms) is kept for the cleanup of a failed fetch (fence and drain
  // a partial copy, tell the hub), which ends by `deadline`, the caller's.
  const Deadline& work() const { return work_; }
  const Deadline& deadline() const { return deadline_; }

  // The hub registered this reader as a filling holder (BeginFetch took
  // `fill_epoch`).
  bool filling_at_hub() const { return filling_at_hub_; }
  // The body registered its destination under that epoch: its own report
  // (FillingCopy: complete, or withdrawn) now answers for the hub's
  // filling reference.
  void HandOverFilling() { filling_at_hub_ = false; }
  // The body will not serve what it fetches: the hub's filling reference,
  // if it took one, is withdrawn now.
  void DropFilling();

  // The hub's first schedule offers holders of slices: it does so for a
  // whole fetch only of a version that fetch must read as slices (pieces,
  // or parts held only by holders of slices).
  bool OffersHoldersOfSlices() const;
  // The sources the run starts from: the hub's first schedule, or, when
  // the hub could not schedule (rebuilding, or no complete holder left),
  // the nearest holders it listed instead.
  Result<std::vector<FetchSource>> FirstSources() const;
  // The run's way to ask the hub for sources again, excluding those that
  // failed it; `wants` (a reader of slices): holders of slices that meet
  // them come too.
  SourceRefresher Refresher(std::vector<SliceWant> wants = {}) const;
  // When the hub's first schedule asked for a recheck (the reader reads
  // from behind another rack's oversubscribed uplink: docs/design.md,
  // "Rack-aware pipelines"), sets the run to recheck then and how: it asks
  // the hub for the sources its books name now (ControlPlane::Recheck).
  void FollowRechecks(FetcherOptions& fo) const;

  // A delta of the version from a base this reader holds is being computed
  // (the hub's last answer said so: FetchStart::delta_pending).
  bool delta_pending() const { return start_.delta_pending; }
  // Asks the hub for sources again (Schedule) every kDeltaPollMs, for up to
  // `wait_ms` within work(), until `good` takes the sources (as the run
  // would get them), or no delta is pending any more. Each answer replaces
  // the first sources (FirstSources). Whether `good` took them.
  bool AwaitSources(const std::function<bool(std::vector<FetchSource>&)>& good,
                    int64_t wait_ms);
  static constexpr int64_t kDeltaPollMs = 50;

  // The data plane starts now (the schedule stage ends): the run's options,
  // with the caller's streams and progress callback, this worker's metrics,
  // and progress reports to the hub (`tensorhub top`) counting towards
  // `bytes_total`, the bytes the run reads. `on_chunk`: the body's.
  FetcherOptions StartRun(uint64_t bytes_total,
                          std::function<void(uint64_t)> on_chunk = nullptr);

  // The run succeeded. `report_copy` tells the hub what this worker holds
  // now, if anything, and returns whether that report also ended the fetch
  // at the hub (a complete copy, AddHolder); if not, FetchDone ends it.
  // Queues the final progress report; returns the fetch's stats.
  FetchStats Finish(const FetchReport& report,
                    const std::function<bool()>& report_copy = nullptr);

 private:
  FetchSession(WorkerContext& ctx, std::string model,
               const FetchOptions& options);
  // BeginFetch, and again while the hub is unreachable, until work_.
  Status Start(Version version, std::optional<uint64_t> fill_epoch);
  // The manifest, when the hub named it by its SHA-256 instead of sending
  // it (manifest_source.cc).
  Status TakeManifest();
  // Withdraws what the hub was told and nobody took over.
  void Withdraw();
  void EndAtHub();
  ProgressUpdate Progress(const FetchReport& so_far, bool done,
                          std::chrono::steady_clock::time_point until) const;

  WorkerContext& ctx_;
  const std::string model_;
  const FetchOptions options_;
  // Deadlines and pauses run on ctx_.clock; the stages are measured in
  // real time.
  const std::chrono::steady_clock::time_point t0_;
  const Deadline deadline_;
  const Deadline work_;
  FetchStart start_;
  Version version_;
  std::string name_;
  // Where the manifest came from (FetchStats::manifest_source, _bytes).
  std::string manifest_source_;
  uint64_t manifest_bytes_ = 0;
  std::chrono::steady_clock::time_point t_resolved_, t_sources_;
  uint64_t bytes_total_ = 0;
  // The hub counts sources busy for this reader: from BeginFetch until
  // FetchDone, or until a complete copy is reported.
  bool sources_assigned_ = false;
  bool filling_at_hub_ = false;  // not yet handed over or withdrawn
};

// Counts a fetch's outcome (and its stages) in the worker's metrics: the
// one place a Fetch or FetchSlices call is counted.
Result<FetchStats> CountOutcome(ClientMetrics& metrics, Result<FetchStats> r);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_FETCH_SESSION_H_
