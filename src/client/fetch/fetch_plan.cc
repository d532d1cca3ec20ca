#include "client/fetch/fetch_plan.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "tensorhub/check.h"

namespace tensorhub::client {

bool FetchPlan::SourceState::Has(uint64_t chunk) const {
  for (const auto& [b, e] : source.chunks) {
    if (chunk >= b && chunk < e) return true;
  }
  return false;
}

namespace {
std::vector<uint64_t> ChunkSizes(const Manifest& manifest) {
  std::vector<uint64_t> out(manifest.num_chunks());
  for (uint64_t c = 0; c < out.size(); ++c) out[c] = manifest.Chunk(c).bytes;
  return out;
}
}  // namespace

FetchPlan::FetchPlan(std::string label, const Manifest& manifest,
                     std::vector<FetchSource> sources, bool can_refresh,
                     const FetcherOptions& options, int64_t start_ms,
                     int64_t deadline_ms, size_t max_sources)
    : FetchPlan(std::move(label), ChunkSizes(manifest), std::move(sources),
                can_refresh, options, start_ms, deadline_ms, max_sources) {}

FetchPlan::FetchPlan(std::string label, std::vector<uint64_t> item_bytes,
                     std::vector<FetchSource> sources, bool can_refresh,
                     const FetcherOptions& options, int64_t start_ms,
                     int64_t deadline_ms, size_t max_sources)
    : label_(std::move(label)),
      item_bytes_(std::move(item_bytes)),
      can_refresh_(can_refresh),
      options_(options),
      start_ms_(start_ms),
      deadline_ms_(deadline_ms),
      max_sources_(std::max<size_t>(1, max_sources)),
      total_chunks_(item_bytes_.size()),
      last_chunk_ms_(start_ms) {
  for (FetchSource& s : sources) AddSource(std::move(s));
  attempts_.assign(total_chunks_, 0);
  done_.assign(total_chunks_, 0);
  for (uint64_t c = 0; c < total_chunks_; ++c) pending_.push_back(c);
  RecheckIn(start_ms, options.recheck_after_ms);
}

void FetchPlan::RecheckIn(int64_t now_ms, int64_t after_ms) {
  if (after_ms <= 0 || !options_.recheck) {
    recheck_at_ms_.reset();
    return;
  }
  recheck_at_ms_ = now_ms + after_ms;
}

// The hub said when to recheck: one stream does it, the others read on.
std::optional<FetchStep> FetchPlan::MaybeRecheck(int64_t now_ms) {
  if (rechecking_ || !recheck_at_ms_.has_value() || now_ms < *recheck_at_ms_)
    return std::nullopt;
  rechecking_ = true;
  recheck_at_ms_.reset();
  FetchStep step;
  step.kind = FetchStep::Kind::kRecheck;
  return step;
}

// A source the plan knows already (same address and epoch) is updated in
// place. A new one takes a free slot; once max_sources_ are known it takes
// the slot of a dead source with no read running (one that served nothing,
// if any, so the report loses as little as possible), or, if there is none,
// it is not kept (the hub lists it again at the next refresh).
void FetchPlan::AddSource(FetchSource s) {
  for (SourceState& k : sources_) {
    // (A source moved to TCP is the same holder as the hub lists it.)
    if (k.source.epoch == s.epoch &&
        (k.source.address == s.address ||
         (!s.tcp_address.empty() && k.source.address == s.tcp_address))) {
      if (k.refused) return;
      // The hub still lists it, so its failure may have been passing (a
      // refusal under load, a stall, a dropped connection): try it again.
      // max_attempts_per_chunk bounds how often a bad source is retried.
      k.dead = false;
      k.retired = false;
      k.source.chunks = std::move(s.chunks);
      k.source.filling = s.filling;
      k.source.unreachable_hint = std::move(s.unreachable_hint);
      k.source.delta_offers = std::move(s.delta_offers);
      k.source.delta = s.delta;
      return;
    }
  }
  if (sources_.size() < max_sources_) {
    sources_.push_back(SourceState{std::move(s)});
    return;
  }
  SourceState* slot = nullptr;
  for (SourceState& k : sources_) {
    if (!k.dead || k.active > 0) continue;
    if (slot == nullptr || (slot->chunks_served > 0 && k.chunks_served == 0))
      slot = &k;
  }
  if (slot == nullptr) {
    TH_LOG(DEBUG) << "fetch " << label_ << ": " << max_sources_
                  << " sources known, none free; not keeping " << s.address;
    return;
  }
  *slot = SourceState{std::move(s)};
}

// The least busy live source holding `chunk`; -1 if none.
int FetchPlan::Pick(uint64_t chunk) const {
  int best = -1;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const SourceState& s = sources_[i];
    if (s.dead || s.retired || !s.Has(chunk)) continue;
    if (best < 0 || s.active < sources_[best].active)
      best = static_cast<int>(i);
  }
  return best;
}

FetchStep FetchPlan::NextStep(int64_t now_ms) {
  if (finished()) return FetchStep::Done(error_);
  if (now_ms >= deadline_ms_) return Fail(DeadlineError(now_ms));
  if (std::optional<FetchStep> recheck = MaybeRecheck(now_ms)) return *recheck;
  if (pending_.empty()) {
    // Others hold the remaining chunks; one may come back on failure, or be
    // taken from a source that became very slow.
    if (std::optional<FetchStep> steal = MaybeSteal(now_ms)) return *steal;
    return Idle(now_ms);
  }
  // The first pending chunk some live source holds: a chunk nobody has yet
  // (its rank's holder is not known, or failed) must not hold up the chunks
  // others can serve now.
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    const int src = Pick(*it);
    if (src >= 0) return StartRead(now_ms, it, src);
  }
  if (std::optional<FetchStep> refresh = MaybeRefresh(now_ms)) return *refresh;
  if (can_refresh_ && !refreshing_ && last_refresh_ms_.has_value()) {
    // Nothing to do before the next refresh is due (news from another
    // stream wakes this one earlier).
    return FetchStep::Wait(std::min(
        deadline_ms_, *last_refresh_ms_ +
                          std::max<int64_t>(1, options_.refresh_interval_ms)));
  }
  return Idle(now_ms);
}

FetchStep FetchPlan::StartRead(int64_t now_ms,
                               std::deque<uint64_t>::iterator it, int src) {
  const uint64_t chunk = *it;
  pending_.erase(it);
  TH_CHECK(in_flight_.count(chunk) == 0 && !done_[chunk]);
  in_flight_[chunk] = InFlight{src, now_ms, false, false,
                               !sources_[src].source.tcp_address.empty()};
  SourceState& s = sources_[src];
  ++s.active;
  FetchStep step;
  step.kind = FetchStep::Kind::kRead;
  step.chunk = chunk;
  step.source = src;
  step.address = s.source.address;
  step.epoch = s.source.epoch;
  step.filling = s.source.filling;
  step.delta = s.source.delta;
  return step;
}

FetchStep FetchPlan::Idle(int64_t now_ms) const {
  return FetchStep::Wait(std::min(deadline_ms_, now_ms + kFetchIdlePollMs));
}

FetchStep FetchPlan::Fail(Status s) {
  if (error_.ok()) error_ = std::move(s);
  return FetchStep::Done(error_);
}

// Work stealing, for a stream that has nothing to start: cancels the oldest
// read (of those connected) that has run far longer than a chunk normally
// takes, if another live, complete source holds that chunk. The stream
// running it gets an error back and the chunk goes back to the queue.
std::optional<FetchStep> FetchPlan::MaybeSteal(int64_t now_ms) {
  if (options_.steal_min_ms <= 0 || chunks_timed_ == 0) return std::nullopt;
  const int64_t threshold_ms = std::max<int64_t>(
      options_.steal_min_ms,
      static_cast<int64_t>(options_.steal_factor * chunk_ms_avg_));
  uint64_t victim = 0;
  InFlight* oldest = nullptr;
  for (auto& [chunk, f] : in_flight_) {
    if (!f.connected || f.stolen || now_ms - f.start_ms < threshold_ms)
      continue;
    if (oldest != nullptr && f.start_ms >= oldest->start_ms) continue;
    bool elsewhere = false;
    for (size_t i = 0; i < sources_.size() && !elsewhere; ++i) {
      const SourceState& k = sources_[i];
      elsewhere = static_cast<int>(i) != f.src && !k.dead && !k.retired &&
                  !k.source.filling && k.Has(chunk);
    }
    if (!elsewhere) continue;
    victim = chunk;
    oldest = &f;
  }
  if (oldest == nullptr) return std::nullopt;
  SourceState& slow = sources_[oldest->src];
  TH_LOG(INFO)
      << "fetch " << label_ << ": chunk " << victim << " from "
      << slow.source.address << " has taken " << now_ms - oldest->start_ms
      << " ms (typical " << static_cast<int64_t>(chunk_ms_avg_)
      << " ms): moving it to another holder and dropping this one as too slow";
  oldest->stolen = true;
  // The source is dropped now so that no stream picks it again; a refresh
  // from the hub revives it if nothing else holds a chunk.
  slow.dead = true;
  ++steals_;
  if (steal_waits_ms_.size() < kMaxStealWaits) {
    steal_waits_ms_.push_back(now_ms - oldest->start_ms);
  }
  FetchStep step;
  step.kind = FetchStep::Kind::kSteal;
  step.chunk = victim;
  step.source = oldest->src;
  return step;
}

// Asks the hub for sources again, at most once per refresh interval over
// all streams, and never twice at once.
std::optional<FetchStep> FetchPlan::MaybeRefresh(int64_t now_ms) {
  if (!can_refresh_ || refreshing_) return std::nullopt;
  if (last_refresh_ms_.has_value() &&
      now_ms - *last_refresh_ms_ < options_.refresh_interval_ms) {
    return std::nullopt;
  }
  refreshing_ = true;
  last_refresh_ms_ = now_ms;
  FetchStep step;
  step.kind = FetchStep::Kind::kRefresh;
  for (const SourceState& k : sources_) {
    if (k.dead && !k.source.worker.empty())
      step.failed.push_back(k.source.worker);
  }
  return step;
}

void FetchPlan::ReadConnected(uint64_t chunk) {
  auto it = in_flight_.find(chunk);
  if (it != in_flight_.end()) it->second.connected = true;
}

void FetchPlan::ReadFinished(int64_t now_ms, uint64_t chunk,
                             const Status& status) {
  auto it = in_flight_.find(chunk);
  // Only a chunk this plan started can finish.
  TH_CHECK(it != in_flight_.end());
  const InFlight f = it->second;
  in_flight_.erase(it);
  SourceState& s = sources_[f.src];
  --s.active;
  if (status.ok()) {
    // A read that won against its cancel still counts: its bytes were
    // verified.
    ChunkDone(now_ms, chunk, f);
    return;
  }
  TH_LOG(DEBUG) << "chunk " << chunk << " from " << s.source.address
                << " failed: " << status.ToString();
  last_error_ = status;
  if (f.other_transport && s.source.tcp_address.empty()) {
    // Started before the source moved to TCP (below): try again there.
    pending_.push_front(chunk);
    return;
  }
  if (status.code() == StatusCode::kFailedPrecondition &&
      !s.source.tcp_address.empty()) {
    // Refused over its other transport on principle (a UCX holder serving
    // device memory): read it over TCP instead, without counting a retry.
    MoveToTcp(s, status);
    pending_.push_front(chunk);
    return;
  }
  if (status.code() == StatusCode::kDeadlineExceeded &&
      now_ms >= deadline_ms_) {
    // Cut by the fetch's own deadline, not the holder's fault: the fetch
    // ends now, and the source still counts as live for its verdict.
    pending_.push_front(chunk);
    return;
  }
  s.dead = true;
  s.corrupt = s.corrupt || status.code() == StatusCode::kDataLoss;
  ++retries_;
  TellHint(s, status);
  if (status.code() == StatusCode::kFailedPrecondition) {
    // Configured differently from this reader: when every holder known is,
    // the fetch ends now with the reason, not at its deadline.
    s.refused = true;
    bool all_refused = true;
    for (const SourceState& k : sources_)
      all_refused = all_refused && k.refused;
    if (all_refused) {
      Fail(status.WithContext("fetch of '" + label_ +
                              "': every holder known refused this reader"));
      return;
    }
  }
  if (f.stolen) {
    // Not the chunk's fault: it goes straight to another source.
    pending_.push_front(chunk);
    return;
  }
  if (++attempts_[chunk] >= options_.max_attempts_per_chunk) {
    Fail(NoHolderError("chunk " + std::to_string(chunk) + " of '" + label_ +
                       "' failed " + std::to_string(attempts_[chunk]) +
                       " times; last error: " + status.ToString()));
    return;
  }
  pending_.push_front(chunk);
}

void FetchPlan::MoveToTcp(SourceState& s, const Status& status) {
  TH_LOG(INFO) << "fetch " << label_ << ": reading " << s.source.address
               << " over tcp at " << s.source.tcp_address << " ("
               << status.ToString() << ")";
  s.moved_from = s.source.address;
  s.chunks_before_move = s.chunks_served;
  s.bytes_before_move = s.bytes_served;
  s.source.address = std::exchange(s.source.tcp_address, std::string());
}

void FetchPlan::TellHint(SourceState& s, const Status& status) {
  // Said once, rather than as one failed read after another.
  if (s.source.unreachable_hint.empty() || s.hint_told) return;
  s.hint_told = true;
  if (hints_.size() < kFetchMaxHints &&
      std::find(hints_.begin(), hints_.end(), s.source.unreachable_hint) ==
          hints_.end()) {
    hints_.push_back(s.source.unreachable_hint);
  }
  TH_LOG(WARN) << "fetch " << label_ << ": " << s.source.unreachable_hint
               << " (the read failed: " << status.ToString() << ")";
}

void FetchPlan::ChunkDone(int64_t now_ms, uint64_t chunk, const InFlight& f) {
  const double took_ms = static_cast<double>(now_ms - f.start_ms);
  chunk_ms_avg_ = chunks_timed_ == 0
                      ? took_ms
                      : (1 - kFetchChunkTimeWeight) * chunk_ms_avg_ +
                            kFetchChunkTimeWeight * took_ms;
  ++chunks_timed_;
  last_chunk_ms_ = now_ms;
  // Each chunk completes exactly once; the count of done chunks is what
  // ends the fetch.
  TH_CHECK(!done_[chunk]);
  done_[chunk] = 1;
  const uint64_t bytes = item_bytes_[chunk];
  SourceState& s = sources_[f.src];
  ++s.chunks_served;
  s.bytes_served += bytes;
  ++done_chunks_;
  bytes_done_ += bytes;
}

void FetchPlan::SourcesRefreshed(int64_t now_ms, Result<SourceUpdate> update) {
  refreshing_ = false;
  if (finished()) return;
  if (!update.ok()) {
    StatusCode c = update.status().code();
    if (c == StatusCode::kNotFound || c == StatusCode::kAborted ||
        c == StatusCode::kInvalidArgument ||
        c == StatusCode::kPermissionDenied) {
      Fail(update.status().WithContext("fetch: asking the hub for holders"));
      return;
    }
    // The hub may be restarting: keep going on what we know.
    last_error_ = update.status();
    return;
  }
  if (update->unavailable.has_value()) {
    OnUnavailable(*update->unavailable);
    return;
  }
  unavailable_answers_ = 0;
  const int64_t recheck_after_ms = update->recheck_after_ms;
  for (FetchSource& s : update->sources) AddSource(std::move(s));
  if (!recheck_at_ms_.has_value() && !rechecking_) {
    RecheckIn(now_ms, recheck_after_ms);
  }
}

void FetchPlan::Rechecked(int64_t now_ms, Result<SourceUpdate> update) {
  rechecking_ = false;
  ++rechecks_;
  if (finished()) return;
  if (!update.ok()) {
    const StatusCode c = update.status().code();
    if (c == StatusCode::kFailedPrecondition || c == StatusCode::kNotFound ||
        c == StatusCode::kInvalidArgument ||
        c == StatusCode::kPermissionDenied) {
      return;  // no books to follow; the fetch goes on with its sources
    }
    // The hub may be restarting: keep the sources, ask again later.
    RecheckIn(now_ms, std::max<int64_t>(1, options_.refresh_interval_ms));
    return;
  }
  if (update->unavailable.has_value() || update->sources.empty()) {
    // No books to follow: the fetch goes on with what it has (a refresh
    // finds new sources if those fail).
    return;
  }
  for (SourceState& k : sources_) k.retired = true;
  const int64_t recheck_after_ms = update->recheck_after_ms;
  for (FetchSource& s : update->sources) AddSource(std::move(s));
  RecheckIn(now_ms, recheck_after_ms);
}

// The hub answered that the version has no complete holder left. Waiting is
// in vain only if some missing chunk has no live source we know of: then, on
// the second such answer in a row (a refresh interval later, so one passing
// moment of the hub's table does not end the fetch), the fetch fails now
// rather than at its deadline.
void FetchPlan::OnUnavailable(const std::string& why) {
  last_error_ = Unavailable("the hub says: " + why);
  std::optional<uint64_t> orphan;
  for (uint64_t c : pending_) {
    if (Pick(c) < 0) {
      orphan = c;
      break;
    }
  }
  if (!orphan.has_value()) {
    unavailable_answers_ = 0;
    return;
  }
  if (++unavailable_answers_ < kFetchUnavailableAnswersToEnd) {
    TH_LOG(INFO) << "fetch " << label_ << ": the hub says " << why
                 << "; asking once more before giving up";
    return;
  }
  Fail(NoHolderError(
      "fetch of '" + label_ + "' cannot finish: the hub answered twice, " +
      std::to_string(options_.refresh_interval_ms) + "+ ms apart, that " + why +
      "; no live source known to this fetch holds chunk " +
      std::to_string(*orphan) + " (" +
      std::to_string(total_chunks_ - done_chunks_) + " of " +
      std::to_string(total_chunks_) + " chunks missing)"));
}

// The error at the deadline. UNAVAILABLE when no holder was reachable: every
// source known failed (killed, cut off, stopped), or none delivered a chunk
// for the last kFetchNoProgressMs (or since the fetch began). So the caller
// can tell "nobody answers" from DEADLINE_EXCEEDED, "bytes were still
// arriving, only too slowly".
Status FetchPlan::DeadlineError(int64_t now_ms) const {
  bool any_live = false;
  for (const SourceState& k : sources_) any_live = any_live || !k.dead;
  if (now_ms - last_chunk_ms_ >=
      std::min(kFetchNoProgressMs, now_ms - start_ms_)) {
    any_live = false;
  }
  std::string what = "fetch of '" + label_ + "' did not finish in time: " +
                     std::to_string(done_chunks_) + " of " +
                     std::to_string(total_chunks_) +
                     " chunks done; last error: " + last_error_.ToString();
  if (!any_live) return NoHolderError("no reachable holder: " + what);
  return DeadlineExceeded(WithHints(what));
}

// The fetch cannot get the bytes. DATA_LOSS if every holder it knows served
// bytes that failed their checksum (what there is to have is damaged: asking
// again will not help); UNAVAILABLE otherwise.
Status FetchPlan::NoHolderError(std::string message) const {
  bool all_corrupt = !sources_.empty();
  for (const SourceState& k : sources_) all_corrupt = all_corrupt && k.corrupt;
  if (all_corrupt)
    return DataLoss("every holder served corrupt bytes: " + message);
  return Unavailable(WithHints(std::move(message)));
}

std::string FetchPlan::WithHints(std::string message) const {
  if (hints_.empty()) return message;
  std::string out;
  for (const std::string& h : hints_) out += h + "; ";
  return out + "so: " + message;
}

FetchReport FetchPlan::Report() const {
  FetchReport r;
  r.bytes = bytes_done_;
  r.chunk_retries = retries_;
  r.chunks_stolen = steals_;
  r.steal_waits_ms = steal_waits_ms_;
  for (const SourceState& s : sources_) {
    if (s.chunks_served == 0) continue;
    ++r.sources_used;
    if (s.chunks_before_move > 0) {
      r.per_source.push_back({WorkerId(s.source.worker), s.moved_from,
                              s.bytes_before_move, s.chunks_before_move,
                              s.source.filling, ""});
    }
    if (s.chunks_served > s.chunks_before_move) {
      r.per_source.push_back({WorkerId(s.source.worker), s.source.address,
                              s.bytes_served - s.bytes_before_move,
                              s.chunks_served - s.chunks_before_move,
                              s.source.filling, ""});
    }
  }
  return r;
}

}  // namespace tensorhub::client
