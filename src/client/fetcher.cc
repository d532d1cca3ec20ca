#include "client/fetcher.h"

#include <algorithm>
#include <cassert>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/checksum.h"
#include "common/log.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

struct SourceState {
  FetchSource source;
  bool dead = false;
  int active = 0;
  uint64_t chunks_served = 0;
  uint64_t bytes_served = 0;
  bool Has(uint64_t chunk) const {
    for (const auto& [b, e] : source.chunks) {
      if (chunk >= b && chunk < e) return true;
    }
    return false;
  }
};

class FetchRun {
 public:
  FetchRun(transport::Transport& transport, const FetchJob& job,
           std::vector<FetchSource> sources, const SourceRefresher& refresh,
           const FetcherOptions& options, const Deadline& deadline)
      : transport_(transport),
        job_(job),
        refresh_(refresh),
        options_(options),
        deadline_(deadline) {
    for (FetchSource& s : sources) AddSourceLocked(std::move(s));
    total_chunks_ = job.manifest->num_chunks();
    attempts_.assign(total_chunks_, 0);
    done_.assign(total_chunks_, 0);
    for (uint64_t c = 0; c < total_chunks_; ++c) pending_.push_back(c);
  }

  Result<FetchReport> Run() {
    int n = std::max(1, std::min<int>(options_.streams,
                                      static_cast<int>(total_chunks_)));
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { Stream(); });
    for (std::thread& t : threads) t.join();
    if (!error_.ok()) return error_;
    for (uint64_t c = 0; c < total_chunks_; ++c) {
      if (!done_[c]) return Internal("fetch ended with chunk " + std::to_string(c) + " missing");
    }
    FetchReport r;
    r.bytes = bytes_done_;
    r.chunk_retries = retries_;
    r.chunks_stolen = steals_;
    for (const SourceState& s : sources_) {
      if (s.chunks_served == 0) continue;
      ++r.sources_used;
      r.per_source.push_back({WorkerId(s.source.worker), s.source.address,
                              s.bytes_served, s.chunks_served,
                              s.source.filling});
    }
    Progress(true);
    return r;
  }

 private:
  void AddSourceLocked(FetchSource s) {
    for (SourceState& k : sources_) {
      if (k.source.address == s.address && k.source.epoch == s.epoch) {
        // The hub still lists it, so its failure may have been passing (a
        // refusal under load, a stall, a dropped connection): try it again.
        // max_attempts_per_chunk bounds how often a bad source is retried.
        k.dead = false;
        k.source.chunks = std::move(s.chunks);
        k.source.filling = s.filling;
        return;
      }
    }
    sources_.push_back(SourceState{std::move(s)});
  }

  // Picks the least busy live source holding `chunk`; -1 if none.
  int PickLocked(uint64_t chunk) const {
    int best = -1;
    for (size_t i = 0; i < sources_.size(); ++i) {
      const SourceState& s = sources_[i];
      if (s.dead || !s.Has(chunk)) continue;
      if (best < 0 || s.active < sources_[best].active) best = static_cast<int>(i);
    }
    return best;
  }

  void FailLocked(Status s) {
    if (error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }

  bool FinishedLocked() const {
    return !error_.ok() || done_chunks_ == total_chunks_;
  }

  // The error at the deadline. UNAVAILABLE when no holder was reachable:
  // every source known failed (killed, cut off, stopped), or none delivered
  // a chunk for the last kNoProgressMs (or since the fetch began). So the
  // caller can tell "nobody answers" from DEADLINE_EXCEEDED, "bytes were
  // still arriving, only too slowly".
  Status DeadlineErrorLocked() const {
    static constexpr int64_t kNoProgressMs = 2000;
    bool any_live = false;
    for (const SourceState& k : sources_) any_live = any_live || !k.dead;
    const int64_t now = NowMs();
    if (now - last_chunk_ms_ >= std::min(kNoProgressMs, now - start_ms_)) any_live = false;
    std::string what = "fetch of '" + job_.model + "@" + std::to_string(job_.version.value()) +
                       "' did not finish in time: " + std::to_string(done_chunks_) + " of " +
                       std::to_string(total_chunks_) + " chunks done; last error: " +
                       last_error_.ToString();
    if (!any_live) return Unavailable("no reachable holder: " + what);
    return DeadlineExceeded(what);
  }

  // Work stealing, called by a stream that has nothing to start: cancels the
  // oldest read that has run far longer than a chunk normally takes, if
  // another live, complete source holds that chunk. The cancelled stream
  // puts the chunk back in the queue. Returns true if it cancelled one.
  bool MaybeStealLocked() {
    if (options_.steal_min_ms <= 0 || chunks_timed_ == 0) return false;
    const int64_t now = NowMs();
    const int64_t threshold_ms =
        std::max<int64_t>(options_.steal_min_ms,
                          static_cast<int64_t>(options_.steal_factor * chunk_ms_avg_));
    uint64_t victim = 0;
    InFlight* oldest = nullptr;
    for (auto& [chunk, f] : in_flight_) {
      if (f.conn == nullptr || f.stolen || now - f.start_ms < threshold_ms) continue;
      if (oldest != nullptr && f.start_ms >= oldest->start_ms) continue;
      bool elsewhere = false;
      for (size_t i = 0; i < sources_.size() && !elsewhere; ++i) {
        const SourceState& k = sources_[i];
        elsewhere = static_cast<int>(i) != f.src && !k.dead && !k.source.filling && k.Has(chunk);
      }
      if (!elsewhere) continue;
      victim = chunk;
      oldest = &f;
    }
    if (oldest == nullptr) return false;
    SourceState& slow = sources_[oldest->src];
    TH_LOG(INFO) << "fetch " << job_.model << "@" << job_.version.value() << ": chunk " << victim
                 << " from " << slow.source.address << " has taken " << now - oldest->start_ms
                 << " ms (typical " << static_cast<int64_t>(chunk_ms_avg_)
                 << " ms): moving it to another holder and dropping this one as too slow";
    oldest->stolen = true;
    // The source is dropped now so that no stream picks it again; a
    // refresh from the hub revives it if nothing else holds a chunk.
    slow.dead = true;
    oldest->conn->Cancel();
    ++steals_;
    return true;
  }

  void Stream() {
    std::map<std::string, std::unique_ptr<transport::Connection>> conns;
    std::vector<iovec> pieces;
    std::unique_lock<std::mutex> lock(mu_);
    while (!FinishedLocked()) {
      if (deadline_.expired()) {
        FailLocked(DeadlineErrorLocked());
        break;
      }
      if (pending_.empty()) {
        // Others hold the remaining chunks; one may come back on failure,
        // or be taken from a source that became very slow.
        if (!MaybeStealLocked()) cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      // The first pending chunk some live source holds: a chunk nobody has
      // yet (its rank's holder is not known, or failed) must not hold up
      // the chunks others can serve now.
      uint64_t chunk = 0;
      int src = -1;
      auto it = pending_.begin();
      for (; it != pending_.end(); ++it) {
        src = PickLocked(*it);
        if (src >= 0) break;
      }
      if (src < 0) {
        // MaybeRefreshLocked may drop the lock, and other streams may take
        // chunks meanwhile: start over from the queue as it is then.
        bool refreshed = false;
        if (!MaybeRefreshLocked(lock, &refreshed)) break;
        if (!refreshed) cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      chunk = *it;
      pending_.erase(it);
      assert(in_flight_.count(chunk) == 0 && !done_[chunk]);
      const int64_t start_ms = NowMs();
      in_flight_[chunk] = InFlight{src, start_ms, nullptr, false};
      SourceState& s = sources_[src];
      ++s.active;
      std::string address = s.source.address;
      uint64_t epoch = s.source.epoch;
      lock.unlock();

      ChunkLoc loc = job_.manifest->Chunk(chunk);
      Status st = ReadChunk(conns, address, epoch, chunk, loc, &pieces);

      lock.lock();
      SourceState& s2 = sources_[src];  // the vector may have grown
      --s2.active;
      const bool stolen = in_flight_[chunk].stolen;
      in_flight_.erase(chunk);
      if (st.ok()) {
        // A read that won against its cancel still counts: its bytes were
        // verified.
        const double took_ms = static_cast<double>(NowMs() - start_ms);
        chunk_ms_avg_ = chunks_timed_ == 0 ? took_ms : 0.8 * chunk_ms_avg_ + 0.2 * took_ms;
        ++chunks_timed_;
        last_chunk_ms_ = NowMs();
        // Each chunk completes exactly once; the count of done chunks is
        // what ends the fetch.
        assert(!done_[chunk]);
        done_[chunk] = 1;
        ++s2.chunks_served;
        s2.bytes_served += loc.bytes;
        ++done_chunks_;
        bytes_done_ += loc.bytes;
        if (done_chunks_ == total_chunks_) cv_.notify_all();
        const uint64_t done_now = done_chunks_;
        lock.unlock();
        if (options_.on_chunk) options_.on_chunk(chunk);
        testpoint::Hit("fetcher.chunk_done", done_now);
        Progress(false);
        lock.lock();
        continue;
      }
      TH_LOG(DEBUG) << "chunk " << chunk << " from " << address
                    << " failed: " << st.ToString();
      last_error_ = st;
      s2.dead = true;
      conns.erase(address);
      ++retries_;
      if (stolen) {
        // Not the chunk's fault: it goes straight to another source.
        pending_.push_front(chunk);
        cv_.notify_all();
        continue;
      }
      if (++attempts_[chunk] >= options_.max_attempts_per_chunk) {
        FailLocked(Unavailable("chunk " + std::to_string(chunk) + " of '" +
                               job_.model + "@" +
                               std::to_string(job_.version.value()) +
                               "' failed " + std::to_string(attempts_[chunk]) +
                               " times; last error: " + st.ToString()));
        break;
      }
      pending_.push_front(chunk);
      cv_.notify_all();
    }
  }

  // Asks the hub for sources again, at most once per refresh interval over
  // all streams. Returns false if the fetch must end.
  bool MaybeRefreshLocked(std::unique_lock<std::mutex>& lock, bool* refreshed) {
    *refreshed = false;
    int64_t now = NowMs();
    if (refreshing_ || now - last_refresh_ms_ < options_.refresh_interval_ms ||
        !refresh_) {
      return true;
    }
    refreshing_ = true;
    last_refresh_ms_ = now;
    std::vector<std::string> failed;
    for (const SourceState& k : sources_) {
      if (k.dead && !k.source.worker.empty()) failed.push_back(k.source.worker);
    }
    lock.unlock();
    Result<SourceUpdate> fresh = refresh_(failed);
    lock.lock();
    refreshing_ = false;
    if (!fresh.ok()) {
      StatusCode c = fresh.status().code();
      if (c == StatusCode::kNotFound || c == StatusCode::kAborted ||
          c == StatusCode::kInvalidArgument ||
          c == StatusCode::kPermissionDenied) {
        FailLocked(fresh.status().WithContext("fetch: asking the hub for holders"));
        return false;
      }
      // The hub may be restarting: keep going on what we know.
      last_error_ = fresh.status();
      return true;
    }
    if (fresh->unavailable.has_value()) return OnUnavailableLocked(*fresh->unavailable);
    unavailable_answers_ = 0;
    for (FetchSource& s : fresh->sources) AddSourceLocked(std::move(s));
    *refreshed = true;
    return true;
  }

  // The hub answered that the version has no complete holder left. Waiting
  // is in vain only if some missing chunk has no live source we know of:
  // then, on the second such answer in a row (a refresh interval later, so
  // one passing moment of the hub's table does not end the fetch), the
  // fetch fails now rather than at its deadline. Returns false if it ended.
  bool OnUnavailableLocked(const std::string& why) {
    last_error_ = Unavailable("the hub says: " + why);
    std::optional<uint64_t> orphan;
    for (uint64_t c : pending_) {
      if (PickLocked(c) < 0) {
        orphan = c;
        break;
      }
    }
    if (!orphan.has_value()) {
      unavailable_answers_ = 0;
      return true;
    }
    if (++unavailable_answers_ < 2) {
      TH_LOG(INFO) << "fetch " << job_.model << "@" << job_.version.value()
                   << ": the hub says " << why << "; asking once more before giving up";
      return true;
    }
    FailLocked(Unavailable(
        "fetch of '" + job_.model + "@" + std::to_string(job_.version.value()) +
        "' cannot finish: the hub answered twice, " +
        std::to_string(options_.refresh_interval_ms) + "+ ms apart, that " + why +
        "; no live source known to this fetch holds chunk " + std::to_string(*orphan) + " (" +
        std::to_string(total_chunks_ - done_chunks_) + " of " + std::to_string(total_chunks_) +
        " chunks missing)"));
    return false;
  }

  Status ReadChunk(std::map<std::string, std::unique_ptr<transport::Connection>>& conns,
                   const std::string& address, uint64_t epoch, uint64_t chunk,
                   const ChunkLoc& loc, std::vector<iovec>* pieces) {
    auto it = conns.find(address);
    if (it == conns.end() || it->second->broken()) {
      Result<std::unique_ptr<transport::Connection>> c = transport_.Connect(
          address, deadline_.Cap(options_.connect_timeout_ms));
      if (!c.ok()) return c.status();
      it = conns.insert_or_assign(address, std::move(c).value()).first;
    }
    {
      // From here until the stream erases the entry (under mu_, before the
      // connection can be destroyed) a stealing stream may Cancel it.
      std::lock_guard<std::mutex> l(mu_);
      in_flight_[chunk].conn = it->second.get();
    }
    pieces->clear();
    AppendPieces(job_.manifest->parts()[loc.part], job_.dest_bases[loc.part],
                 loc.offset, loc.bytes, pieces);
    wire::ReadRequest req;
    req.model = job_.model;
    req.version = job_.version.value();
    req.epoch = epoch;
    req.part = loc.part;
    req.offset = loc.offset;
    req.length = loc.bytes;
    uint64_t got = 0;
    const Deadline read_deadline = deadline_.Cap(options_.read_timeout_ms);
    if (job_.memory.is_host()) {
      TH_RETURN_IF_ERROR(it->second->Read(req, *pieces, read_deadline, &got));
    } else {
      TH_RETURN_IF_ERROR(
          it->second->ReadDevice(req, *pieces, job_.memory.device, read_deadline, &got));
    }
    if (got != loc.xxh3) {
      return DataLoss("chunk at part " + std::to_string(loc.part) + " offset " +
                      std::to_string(loc.offset) + " from " + address +
                      " failed its checksum");
    }
    return Status::Ok();
  }

  void Progress(bool final) {
    if (!options_.on_progress) return;
    int64_t now = NowMs();
    FetchProgress p;
    {
      std::lock_guard<std::mutex> l(progress_mu_);
      if (!final && now - last_progress_ms_ < 50) return;
      last_progress_ms_ = now;
      {
        std::lock_guard<std::mutex> l2(mu_);
        p.bytes_done = bytes_done_;
      }
      p.bytes_total = job_.manifest->total_bytes();
      // Outside mu_: a slow callback must not stall the streams.
      options_.on_progress(p);
    }
  }

  transport::Transport& transport_;
  const FetchJob& job_;
  const SourceRefresher& refresh_;
  const FetcherOptions& options_;
  const Deadline deadline_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SourceState> sources_;  // guarded by mu_; only grows
  std::deque<uint64_t> pending_;      // guarded by mu_
  std::vector<int> attempts_;         // guarded by mu_
  std::vector<uint8_t> done_;         // guarded by mu_
  struct InFlight {
    int src = -1;
    int64_t start_ms = 0;
    transport::Connection* conn = nullptr;  // set once connected
    bool stolen = false;
  };
  // At most one entry per stream.
  std::map<uint64_t, InFlight> in_flight_;  // guarded by mu_
  double chunk_ms_avg_ = 0;  // moving average of chunk read times; guarded by mu_
  uint64_t chunks_timed_ = 0;  // guarded by mu_
  uint32_t steals_ = 0;        // guarded by mu_
  const int64_t start_ms_ = NowMs();
  int64_t last_chunk_ms_ = start_ms_;  // guarded by mu_
  uint64_t total_chunks_ = 0;
  uint64_t done_chunks_ = 0;   // guarded by mu_
  uint64_t bytes_done_ = 0;    // guarded by mu_
  uint32_t retries_ = 0;       // guarded by mu_
  Status error_;               // guarded by mu_
  Status last_error_ = Unavailable("no holder was tried");  // guarded by mu_
  bool refreshing_ = false;    // guarded by mu_
  int64_t last_refresh_ms_ = 0;  // guarded by mu_
  int unavailable_answers_ = 0;  // in a row from the hub; guarded by mu_

  std::mutex progress_mu_;
  int64_t last_progress_ms_ = 0;  // guarded by progress_mu_
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
