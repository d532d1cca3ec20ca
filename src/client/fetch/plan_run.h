// The I/O around a FetchPlan (fetch_plan.h), shared by whole fetches
// (fetcher.cc: a read is a chunk of the manifest) and slice fetches
// (slice_fetch.cc: a read is one item of a slice plan). `streams` threads
// each ask the plan for its next step under mu_ and do it (a read, a
// refresh, a cancel, a wait) with mu_ released, then report back. The
// calling thread delivers on_progress and on_sources, so a slow callback
// holds up no stream. A subclass says how one read is done.
#ifndef TENSORHUB_CLIENT_FETCH_PLAN_RUN_H_
#define TENSORHUB_CLIENT_FETCH_PLAN_RUN_H_

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/fetch/fetch_plan.h"
#include "client/fetch/fetcher.h"
#include "common/mutex.h"
#include "transport/transport.h"

namespace tensorhub::client {

class PlanRun {
 public:
  virtual ~PlanRun() = default;
  PlanRun(const PlanRun&) = delete;
  PlanRun& operator=(const PlanRun&) = delete;

  // Runs the streams until the plan is over. The plan's report with this
  // run's I/O figures; the plan's error if it failed.
  Result<FetchReport> Run();

 protected:
  // What one stream keeps from one read to the next.
  struct StreamState {
    // One connection per address it read from lately.
    std::map<std::string, std::unique_ptr<transport::Connection>> conns;
    std::vector<iovec> pieces;     // where a read lands
    std::vector<uint8_t> scratch;  // what lands before its destination
  };

  // `total_bytes`: what on_progress counts towards.
  PlanRun(transport::Transport& transport, const SourceRefresher& refresh,
          const FetcherOptions& options, const Deadline& deadline,
          FetchPlan plan, uint64_t total_bytes);

  // Reads and verifies read `step.chunk` of the plan (mu_ not held), on
  // the connection Connect gives; sets *info to how its bytes moved.
  virtual Status Read(StreamState& s, const FetchStep& step,
                      transport::ReadInfo* info) = 0;
  // After read `step.chunk` succeeded (mu_ not held): the caller's
  // callbacks and test points. `done`: reads done so far.
  virtual void Landed(const FetchStep& step, uint64_t done) = 0;
  // New sources from the hub, before the plan takes them.
  virtual void AdjustSources(SourceUpdate& update) { (void)update; }

  // The connection to read `step` on, made if need be; from here until
  // the read is finished a stealing stream may Cancel it.
  Result<transport::Connection*> Connect(StreamState& s, const FetchStep& step);

  const FetcherOptions& options() const { return options_; }
  const Deadline& deadline() const { return deadline_; }

 private:
  void Stream();
  void DeliverProgress();

  transport::Transport& transport_;
  const SourceRefresher& refresh_;
  const FetcherOptions& options_;
  const Deadline deadline_;
  const uint64_t total_bytes_;
  // Every time the fetch reads comes from the deadline's clock.
  const Clock& clock_;

  Mutex mu_;
  std::condition_variable cv_;  // any news for the plan, or a stream ended
  FetchPlan plan_ TH_GUARDED_BY(mu_);
  // The connection each connected read runs on; at most one per stream.
  std::map<uint64_t, transport::Connection*> cancellable_ TH_GUARDED_BY(mu_);
  int running_ TH_GUARDED_BY(mu_) = 0;  // streams
  // For FetchReport's I/O figures.
  uint64_t bytes_same_host_ TH_GUARDED_BY(mu_) = 0;
  int64_t verify_ns_ TH_GUARDED_BY(mu_) = 0;
  std::optional<std::chrono::steady_clock::time_point> first_chunk_at_
      TH_GUARDED_BY(mu_);
  std::atomic<uint32_t> tls_connections_{0};
  std::atomic<uint32_t> kernel_tls_connections_{0};
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_PLAN_RUN_H_
