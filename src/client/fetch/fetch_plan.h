// The fetch policy, with no I/O, no threads and no clock: which chunk to read
// from which holder, when to ask the hub again, when to take a read away from
// a slow holder, and how the fetch ends. RunFetch (fetcher.h) is a thin loop
// of stream threads around one FetchPlan; tests drive it on simulated time
// (fetch_plan_test.cc).
//
// Inputs and outputs (every call carries the caller's `now_ms`, on the scale
// of the fetch's deadline):
//   NextStep(now)             -> what this stream does next (FetchStep)
//   ReadConnected(chunk)         the read of `chunk` may now be cancelled
//   ReadFinished(now, chunk, status)
//   SourcesRefreshed(now, update or error)
//   Rechecked(now, update or error)   after a kRecheck step
//
// Threads: not thread-safe; the caller serializes every call (RunFetch holds
// one mutex around them). Owns its copy of the sources and of the chunk
// (item) sizes; borrows nothing.
//
// Bounds: at most `max_sources` sources are kept (see AddSource); one
// in-flight entry per read handed out (at most one per stream); pending,
// attempts and done hold one entry per chunk of the version.
#ifndef TENSORHUB_CLIENT_FETCH_FETCH_PLAN_H_
#define TENSORHUB_CLIENT_FETCH_FETCH_PLAN_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/fetch/fetcher.h"
#include "common/manifest.h"
#include "tensorhub/status.h"

namespace tensorhub::client {

// How long a stream with nothing to do waits before it looks again (it is
// woken earlier by any read or refresh that finishes).
inline constexpr int64_t kFetchIdlePollMs = 50;
// At the deadline, a fetch that got no chunk for this long (or none since it
// began) ends UNAVAILABLE ("nobody answers"), not DEADLINE_EXCEEDED.
inline constexpr int64_t kFetchNoProgressMs = 2000;
// This many "no complete holder" answers from the hub in a row, a refresh
// interval apart, end a fetch some chunk of which has no live source.
inline constexpr int kFetchUnavailableAnswersToEnd = 2;
// Weight of the newest chunk in the moving average of chunk read times.
inline constexpr double kFetchChunkTimeWeight = 0.2;
// Bound on the unreachable-holder hints one fetch's error carries.
inline constexpr size_t kFetchMaxHints = 4;
// Default bound on the sources one fetch keeps track of.
inline constexpr size_t kFetchMaxSources = 1024;

struct FetchStep {
  enum class Kind {
    kRead,     // read `chunk` from source `source` (`address`, `epoch`)
    kSteal,    // cancel the read of `chunk` running on another stream
    kRefresh,  // ask the hub for sources, avoiding `failed`; then call
               // SourcesRefreshed
    kRecheck,  // ask the hub for this fetch's sources as its books have
               // them (FetcherOptions::recheck); then call Rechecked
    kWait,     // nothing to do until `until_ms` (or another stream's news)
    kDone,     // the fetch is over with `status`
  };
  Kind kind = Kind::kWait;
  uint64_t chunk = 0;
  int source = -1;
  std::string address;
  uint64_t epoch = 0;
  bool filling = false;  // kRead: the source is still receiving
  std::vector<std::string> failed;
  int64_t until_ms = 0;
  Status status;
  // kRead from a source read through a delta (FetchSource::delta).
  std::optional<DeltaOffer> delta;

  static FetchStep Done(Status s) {
    FetchStep f;
    f.kind = Kind::kDone;
    f.status = std::move(s);
    return f;
  }
  static FetchStep Wait(int64_t until_ms) {
    FetchStep f;
    f.until_ms = until_ms;
    return f;
  }
};

class FetchPlan {
 public:
  // `label` names the fetch in messages ("model@version"). `can_refresh`:
  // whether there is a hub to ask (RunFetch's refresher is set).
  FetchPlan(std::string label, const Manifest& manifest,
            std::vector<FetchSource> sources, bool can_refresh,
            const FetcherOptions& options, int64_t start_ms,
            int64_t deadline_ms, size_t max_sources = kFetchMaxSources);
  // The same over any list of items (a partial fetch's reads): item i has
  // item_bytes[i] bytes, and a source's `chunks` ranges name item ids.
  FetchPlan(std::string label, std::vector<uint64_t> item_bytes,
            std::vector<FetchSource> sources, bool can_refresh,
            const FetcherOptions& options, int64_t start_ms,
            int64_t deadline_ms, size_t max_sources = kFetchMaxSources);

  FetchStep NextStep(int64_t now_ms);
  void ReadConnected(uint64_t chunk);
  void ReadFinished(int64_t now_ms, uint64_t chunk, const Status& status);
  void SourcesRefreshed(int64_t now_ms, Result<SourceUpdate> update);
  // The answer to a kRecheck: the fetch reads from exactly these sources
  // from now on (others are retired: reads running on them finish, no new
  // ones start), and rechecks again when the answer says so. An error
  // keeps the sources: FAILED_PRECONDITION, NOT_FOUND, INVALID_ARGUMENT or
  // PERMISSION_DENIED end the rechecks, others are retried a refresh
  // interval later.
  void Rechecked(int64_t now_ms, Result<SourceUpdate> update);

  // Over: every chunk done, or an error decided.
  bool finished() const {
    return !error_.ok() || done_chunks_ == total_chunks_;
  }
  const Status& error() const { return error_; }
  uint64_t chunks_done() const { return done_chunks_; }
  uint64_t bytes_done() const { return bytes_done_; }
  uint64_t chunks_total() const { return total_chunks_; }
  uint64_t item_bytes(uint64_t chunk) const { return item_bytes_.at(chunk); }
  size_t sources_known() const { return sources_.size(); }
  FetchReport Report() const;

 private:
  struct SourceState {
    FetchSource source;
    bool dead = false;
    // Not among the sources the hub's last recheck answered: no new reads
    // (not a failure; the hub may list it again).
    bool retired = false;
    bool corrupt = false;  // served bytes that failed their checksum
    // Refused this reader on principle (FAILED_PRECONDITION: the two ends
    // are configured differently, e.g. data-plane TLS on one only): it
    // would refuse again, so it is not retried even if the hub lists it.
    bool refused = false;
    int active = 0;
    uint64_t chunks_served = 0;
    uint64_t bytes_served = 0;
    // What it served over its other transport before it moved to TCP
    // (the address it had then): reported as a source of its own, so
    // that each entry's address names the transport its bytes took.
    std::string moved_from = {};
    uint64_t chunks_before_move = 0;
    uint64_t bytes_before_move = 0;
    bool hint_told = false;  // its unreachable_hint is in hints_
    bool Has(uint64_t chunk) const;
  };
  struct InFlight {
    int src = -1;
    int64_t start_ms = 0;
    bool connected = false;  // may be cancelled
    bool stolen = false;
    // Dialled over the source's other transport (FetchSource::tcp_address
    // was still set): once the source moved to TCP, its failure is not
    // the holder's.
    bool other_transport = false;
  };

  void AddSource(FetchSource s);
  int Pick(uint64_t chunk) const;
  FetchStep StartRead(int64_t now_ms, std::deque<uint64_t>::iterator it,
                      int src);
  FetchStep Idle(int64_t now_ms) const;
  std::optional<FetchStep> MaybeRefresh(int64_t now_ms);
  std::optional<FetchStep> MaybeSteal(int64_t now_ms);
  std::optional<FetchStep> MaybeRecheck(int64_t now_ms);
  // The hub said to recheck after `after_ms` (0: no recheck pending).
  void RecheckIn(int64_t now_ms, int64_t after_ms);
  FetchStep Fail(Status s);
  Status DeadlineError(int64_t now_ms) const;
  Status NoHolderError(std::string message) const;
  // `message`, led by the hints of sources that failed (hints_).
  std::string WithHints(std::string message) const;
  void OnUnavailable(const std::string& why);
  void ChunkDone(int64_t now_ms, uint64_t chunk, const InFlight& f);
  // A read refused on principle over a source's other transport: the
  // source is read over TCP from now on.
  void MoveToTcp(SourceState& s, const Status& status);
  // Says once, plainly, why a failing source may be out of reach.
  void TellHint(SourceState& s, const Status& status);

  const std::string label_;
  const std::vector<uint64_t> item_bytes_;  // per chunk (or item)
  const bool can_refresh_;
  const FetcherOptions options_;  // its callbacks are not used here
  const int64_t start_ms_;
  const int64_t deadline_ms_;
  const size_t max_sources_;
  const uint64_t total_chunks_;

  std::vector<SourceState> sources_;  // at most max_sources_; indices stable
  std::deque<uint64_t> pending_;
  std::vector<int> attempts_;
  std::vector<uint8_t> done_;
  std::map<uint64_t, InFlight> in_flight_;
  double chunk_ms_avg_ = 0;
  uint64_t chunks_timed_ = 0;
  uint32_t steals_ = 0;
  std::vector<int64_t> steal_waits_ms_;  // at most kMaxStealWaits
  uint32_t retries_ = 0;
  int64_t last_chunk_ms_;
  uint64_t done_chunks_ = 0;
  uint64_t bytes_done_ = 0;
  Status error_;
  Status last_error_ = Unavailable("no holder was tried");
  bool refreshing_ = false;
  std::optional<int64_t> last_refresh_ms_;
  // When to recheck the sources with the hub (it said so); none if not.
  std::optional<int64_t> recheck_at_ms_;
  bool rechecking_ = false;
  uint32_t rechecks_ = 0;
  int unavailable_answers_ = 0;  // in a row from the hub
  // The distinct unreachable_hints of sources that failed a read (at most
  // kFetchMaxHints).
  std::vector<std::string> hints_;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_FETCH_PLAN_H_
