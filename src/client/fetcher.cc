#include "client/fetcher.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "client/client_metrics.h"
#include "client/fetch_plan.h"
#include "client/transport_set.h"
#include "common/checksum.h"
#include "common/mutex.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

using Conns = std::map<std::string, std::unique_ptr<transport::Connection>>;

// The I/O around a FetchPlan: `streams` threads each ask the plan for the
// next step under mu_ and do it (a read, a refresh, a cancel, a wait) with
// mu_ released, then report back. The calling thread delivers on_progress,
// so a slow callback holds up no stream.
class FetchRun {
 public:
  FetchRun(transport::Transport& transport, const FetchJob& job,
           std::vector<FetchSource> sources, const SourceRefresher& refresh,
           const FetcherOptions& options, const Deadline& deadline)
      : transport_(transport),
        job_(job),
        refresh_(refresh),
        options_(options),
        deadline_(deadline),
        clock_(deadline.clock()),
        plan_(job.model + "@" + std::to_string(job.version.value()),
              *job.manifest, std::move(sources), static_cast<bool>(refresh),
              options, clock_.NowMs(), deadline.at_ms()) {}

  Result<FetchReport> Run() {
    const uint64_t total_chunks = job_.manifest->num_chunks();
    const int n = std::max(
        1, std::min<int>(options_.streams, static_cast<int>(total_chunks)));
    {
      MutexLock lock(mu_);
      running_ = n;
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { Stream(); });
    DeliverProgress();
    for (std::thread& t : threads) t.join();
    // Every stream has ended: nothing else touches the plan now (the lock
    // is for the analysis, which cannot know that).
    MutexLock lock(mu_);
    FetchReport report = plan_.Report();
    if (options_.metrics != nullptr) options_.metrics->FetchPlanEnded(report);
    if (!plan_.error().ok()) return plan_.error();
    if (plan_.chunks_done() != total_chunks) {
      return Internal("fetch ended with " +
                      std::to_string(total_chunks - plan_.chunks_done()) +
                      " chunks missing");
    }
    if (options_.on_progress) {
      options_.on_progress(
          FetchProgress{plan_.bytes_done(), job_.manifest->total_bytes()});
    }
    report.bytes_same_host = bytes_same_host_;
    report.verify_seconds_all_streams = static_cast<double>(verify_ns_) / 1e9;
    report.streams = n;
    report.first_chunk_at = first_chunk_at_;
    report.tls_connections = tls_connections_.load();
    report.kernel_tls_connections = kernel_tls_connections_.load();
    return report;
  }

 private:
  static DataPath PathOf(const FetchStep& step,
                         const transport::ReadInfo& info) {
    if (info.same_host) return DataPath::kSameHost;
    return TransportOf(step.address) == "ucx" ? DataPath::kUcx : DataPath::kTcp;
  }

  void Stream() {
    Conns conns;  // this stream's, one per address it read from lately
    std::vector<iovec> pieces;
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
          // it; that stream erases it (under mu_) before the connection
          // can be destroyed.
          cancellable_.at(step.chunk)->Cancel();
          break;
        case FetchStep::Kind::kRefresh: {
          lock.Unlock();
          Result<SourceUpdate> fresh = refresh_(step.failed);
          lock.Lock();
          plan_.SourcesRefreshed(clock_.NowMs(), std::move(fresh));
          cv_.notify_all();
          break;
        }
        case FetchStep::Kind::kRead: {
          lock.Unlock();
          const ChunkLoc& loc = job_.manifest->Chunk(step.chunk);
          transport::ReadInfo info;
          Status st = ReadChunk(conns, step, loc, &pieces, &info);
          lock.Lock();
          const uint64_t done_now = FinishRead(step, st, conns);
          if (done_now == 0) break;
          if (info.same_host) bytes_same_host_ += loc.bytes;
          verify_ns_ += info.verify_ns;
          if (!first_chunk_at_.has_value()) {
            first_chunk_at_ = std::chrono::steady_clock::now();
          }
          lock.Unlock();
          if (options_.metrics != nullptr) {
            options_.metrics->ChunkFetched(loc.bytes, PathOf(step, info));
          }
          if (options_.on_chunk) options_.on_chunk(step.chunk);
          testpoint::Hit("fetcher.chunk_done", done_now);
          lock.Lock();
          break;
        }
      }
    }
  }

  // Hands a finished read to the plan. Returns the chunks done so far if
  // the read succeeded, else 0.
  uint64_t FinishRead(const FetchStep& step, const Status& st, Conns& conns)
      TH_REQUIRES(mu_) {
    cancellable_.erase(step.chunk);
    plan_.ReadFinished(clock_.NowMs(), step.chunk, st);
    cv_.notify_all();
    if (!st.ok()) {
      conns.erase(step.address);
      return 0;
    }
    return plan_.chunks_done();
  }

  Status ReadChunk(Conns& conns, const FetchStep& step, const ChunkLoc& loc,
                   std::vector<iovec>* pieces, transport::ReadInfo* info) {
    auto it = conns.find(step.address);
    if (it == conns.end() || it->second->broken()) {
      Result<std::unique_ptr<transport::Connection>> c = transport_.Connect(
          step.address, deadline_.Cap(options_.connect_timeout_ms));
      if (!c.ok()) return c.status();
      if ((*c)->tls()) tls_connections_.fetch_add(1);
      if ((*c)->kernel_tls()) kernel_tls_connections_.fetch_add(1);
      it = conns.insert_or_assign(step.address, std::move(c).value()).first;
    }
    {
      // From here until this stream erases the entry, a stealing stream may
      // Cancel the connection.
      MutexLock l(mu_);
      cancellable_[step.chunk] = it->second.get();
      plan_.ReadConnected(step.chunk);
    }
    pieces->clear();
    AppendPieces(job_.manifest->parts()[loc.part], job_.dest_bases[loc.part],
                 loc.offset, loc.bytes, pieces);
    wire::ReadRequest req;
    req.model = job_.model;
    req.version = job_.version.value();
    req.epoch = step.epoch;
    req.part = loc.part;
    req.offset = loc.offset;
    req.length = loc.bytes;
    uint64_t got = 0;
    const Deadline read_deadline = deadline_.Cap(options_.read_timeout_ms);
    if (job_.memory.is_host()) {
      TH_RETURN_IF_ERROR(it->second->Read(req, *pieces, read_deadline, &got));
    } else {
      TH_RETURN_IF_ERROR(it->second->ReadDevice(
          req, *pieces, job_.memory.device, read_deadline, &got));
    }
    *info = it->second->last_read();
    if (got != loc.xxh3) {
      return DataLoss("chunk at part " + std::to_string(loc.part) + " offset " +
                      std::to_string(loc.offset) + " from " + step.address +
                      " failed its checksum");
    }
    return Status::Ok();
  }

  // On the calling thread, until every stream has ended: at most one
  // on_progress per kProgressIntervalMs, never under mu_.
  // Also on_sources, every sources_interval_ms.
  void DeliverProgress() {
    static constexpr int64_t kProgressIntervalMs = 50;
    uint64_t reported = 0;
    int64_t sources_ms = clock_.NowMs();
    MutexLock lock(mu_);
    while (running_ > 0) {
      cv_.wait_for(lock.native(),
                   std::chrono::milliseconds(kProgressIntervalMs));
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
      options_.on_progress(FetchProgress{bytes, job_.manifest->total_bytes()});
      lock.Lock();
    }
  }

  transport::Transport& transport_;
  const FetchJob& job_;
  const SourceRefresher& refresh_;
  const FetcherOptions& options_;
  const Deadline deadline_;
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

}  // namespace

Result<FetchReport> RunFetch(transport::Transport& transport,
                             const FetchJob& job,
                             std::vector<FetchSource> sources,
                             const SourceRefresher& refresh,
                             const FetcherOptions& options,
                             const Deadline& deadline) {
  if (job.manifest == nullptr ||
      job.dest_bases.size() != job.manifest->parts().size()) {
    return Internal("fetch job has no destination for some part");
  }
  if (job.manifest->num_chunks() == 0) return FetchReport{};
  FetchRun run(transport, job, std::move(sources), refresh, options, deadline);
  return run.Run();
}

}  // namespace tensorhub::client
