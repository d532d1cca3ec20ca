#include "client/fetch/plan_run.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "client/client_metrics.h"
#include "client/transport_set.h"

namespace tensorhub::client {

PlanRun::PlanRun(transport::Transport& transport,
                 const SourceRefresher& refresh, const FetcherOptions& options,
                 const Deadline& deadline, FetchPlan plan, uint64_t total_bytes)
    : transport_(transport),
      refresh_(refresh),
      options_(options),
      deadline_(deadline),
      total_bytes_(total_bytes),
      clock_(deadline.clock()),
      plan_(std::move(plan)) {}

Result<FetchReport> PlanRun::Run() {
  uint64_t total = 0;
  int n = 1;
  {
    MutexLock lock(mu_);
    total = plan_.chunks_total();
    n = std::max(1, std::min<int>(options_.streams, static_cast<int>(total)));
    running_ = n;
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([this] { Stream(); });
  DeliverProgress();
  for (std::thread& t : threads) t.join();
  // Every stream has ended: nothing else touches the plan now (the lock is
  // for the analysis, which cannot know that).
  MutexLock lock(mu_);
  FetchReport report = plan_.Report();
  if (options_.metrics != nullptr) options_.metrics->FetchPlanEnded(report);
  if (!plan_.error().ok()) return plan_.error();
  if (plan_.chunks_done() != total) {
    return Internal("fetch ended with " +
                    std::to_string(total - plan_.chunks_done()) +
                    " reads missing");
  }
  if (options_.on_progress) {
    options_.on_progress(FetchProgress{plan_.bytes_done(), total_bytes_});
  }
  report.bytes_same_host = bytes_same_host_;
  report.verify_seconds_all_streams = static_cast<double>(verify_ns_) / 1e9;
  report.streams = n;
  report.first_chunk_at = first_chunk_at_;
  report.tls_connections = tls_connections_.load();
  report.kernel_tls_connections = kernel_tls_connections_.load();
  return report;
}

void PlanRun::Stream() {
  StreamState state;
  MutexLock lock(mu_);
  for (;;) {
    const int64_t now_ms = clock_.NowMs();
    FetchStep step = plan_.NextStep(now_ms);
    switch (step.kind) {
      case FetchStep::Kind::kDone:
        --running_;
        cv_.notify_all();
        return;
      case FetchStep::Kind::kWait:
        // On the fetch's clock: a simulated one may move on instead.
        clock_.WaitFor(cv_, lock.native(),
                       std::max<int64_t>(1, step.until_ms - now_ms));
        break;
      case FetchStep::Kind::kSteal:
        // Registered by the stream running it before the plan could pick
        // it; that stream erases it (under mu_) before the connection can
        // be destroyed.
        cancellable_.at(step.chunk)->Cancel();
        break;
      case FetchStep::Kind::kRefresh: {
        lock.Unlock();
        Result<SourceUpdate> fresh = refresh_(step.failed);
        if (fresh.ok()) AdjustSources(*fresh);
        lock.Lock();
        plan_.SourcesRefreshed(clock_.NowMs(), std::move(fresh));
        cv_.notify_all();
        break;
      }
      case FetchStep::Kind::kRecheck: {
        lock.Unlock();
        Result<SourceUpdate> books =
            options_.recheck ? options_.recheck()
                             : Result<SourceUpdate>(FailedPrecondition(
                                   "this fetch cannot recheck its sources"));
        if (books.ok()) AdjustSources(*books);
        lock.Lock();
        plan_.Rechecked(clock_.NowMs(), std::move(books));
        cv_.notify_all();
        break;
      }
      case FetchStep::Kind::kRead: {
        lock.Unlock();
        transport::ReadInfo info;
        Status st = Read(state, step, &info);
        lock.Lock();
        cancellable_.erase(step.chunk);
        plan_.ReadFinished(clock_.NowMs(), step.chunk, st);
        cv_.notify_all();
        if (!st.ok()) {
          state.conns.erase(step.address);
          break;
        }
        const uint64_t bytes = plan_.item_bytes(step.chunk);
        const uint64_t done = plan_.chunks_done();
        if (info.same_host) bytes_same_host_ += bytes;
        verify_ns_ += info.verify_ns;
        if (!first_chunk_at_.has_value()) {
          first_chunk_at_ = std::chrono::steady_clock::now();
        }
        lock.Unlock();
        if (options_.metrics != nullptr) {
          const DataPath path = info.same_host ? DataPath::kSameHost
                                : TransportOf(step.address) == "ucx"
                                    ? DataPath::kUcx
                                    : DataPath::kTcp;
          options_.metrics->ChunkFetched(bytes, path);
        }
        Landed(step, done);
        lock.Lock();
        break;
      }
    }
  }
}

Result<transport::Connection*> PlanRun::Connect(StreamState& s,
                                                const FetchStep& step) {
  auto it = s.conns.find(step.address);
  if (it == s.conns.end() || it->second->broken()) {
    Result<std::unique_ptr<transport::Connection>> c = transport_.Connect(
        step.address, deadline_.Cap(options_.connect_timeout_ms));
    if (!c.ok()) return c.status();
    if ((*c)->tls()) tls_connections_.fetch_add(1);
    if ((*c)->kernel_tls()) kernel_tls_connections_.fetch_add(1);
    it = s.conns.insert_or_assign(step.address, std::move(c).value()).first;
  }
  MutexLock l(mu_);
  cancellable_[step.chunk] = it->second.get();
  plan_.ReadConnected(step.chunk);
  return it->second.get();
}

// On the calling thread, until every stream has ended: at most one
// on_progress per kProgressIntervalMs, never under mu_. Also on_sources,
// every sources_interval_ms.
void PlanRun::DeliverProgress() {
  static constexpr int64_t kProgressIntervalMs = 50;
  uint64_t reported = 0;
  int64_t sources_ms = clock_.NowMs();
  MutexLock lock(mu_);
  while (running_ > 0) {
    cv_.wait_for(lock.native(), std::chrono::milliseconds(kProgressIntervalMs));
    if (options_.on_sources && running_ > 0 &&
        clock_.NowMs() - sources_ms >= options_.sources_interval_ms) {
      sources_ms = clock_.NowMs();
      const FetchReport so_far = plan_.Report();
      lock.Unlock();
      options_.on_sources(so_far);
      lock.Lock();
    }
    const uint64_t bytes = plan_.bytes_done();
    if (!options_.on_progress || bytes == reported || running_ == 0) continue;
    reported = bytes;
    lock.Unlock();
    options_.on_progress(FetchProgress{bytes, total_bytes_});
    lock.Lock();
  }
}

}  // namespace tensorhub::client
