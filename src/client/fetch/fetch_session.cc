#include "client/fetch/fetch_session.h"

#include <algorithm>
#include <utility>

#include "client/client_metrics.h"
#include "client/tensor_checks.h"
#include "client/transport_set.h"
#include "common/log.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

using SteadyClock = std::chrono::steady_clock;

// How long BeginFetch's "committed, but no complete holder" is confirmed
// before a fetch with nothing to try gives up; the pause between asks to a
// hub that did not answer or asked to try again.
constexpr int64_t kUnavailableConfirmMs = 200;
constexpr int64_t kHubRetryPauseMs = 100;

// The hub takes at most kMaxSliceWants boxes per schedule: a reader of more
// (a whole model of many tensors) names the first ones. The holders of
// slices the hub then offers are the ones that meet them; holders of the
// other boxes can only come from the first schedule (the plan reads from
// the holders it was made with).
std::vector<SliceWant> CapWants(std::vector<SliceWant> wants) {
  if (wants.size() > kMaxSliceWants) wants.resize(kMaxSliceWants);
  return wants;
}

uint32_t MaxSources(int wanted) {
  return static_cast<uint32_t>(std::clamp(wanted, 1, 16));
}

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::max(0.0, std::chrono::duration<double>(b - a).count());
}

// The last tenth of the time (at most 250 ms) is kept for the cleanup of a
// failed fetch, so that even a failing fetch returns by its deadline.
int64_t WorkMs(int64_t timeout_ms) {
  return timeout_ms - std::clamp<int64_t>(timeout_ms / 10, 0, 250);
}

}  // namespace

FetchSession::FetchSession(WorkerContext& ctx, std::string model,
                           const FetchOptions& options)
    : ctx_(ctx),
      model_(std::move(model)),
      options_(options),
      t0_(SteadyClock::now()),
      deadline_(Deadline::AfterMs(options.timeout_ms, ctx.clock)),
      work_(Deadline::AfterMs(WorkMs(options.timeout_ms), ctx.clock)) {}

FetchSession::~FetchSession() { Withdraw(); }

Result<std::unique_ptr<FetchSession>> FetchSession::Begin(
    WorkerContext& ctx, std::string_view model, Version version,
    const FetchOptions& options, std::optional<uint64_t> fill_epoch) {
  TH_RETURN_IF_ERROR(CheckReaderGroup(options.group));
  std::unique_ptr<FetchSession> s(
      new FetchSession(ctx, std::string(model), options));
  TH_RETURN_IF_ERROR(s->Start(version, fill_epoch));
  // From here until the run, every exit withdraws what the hub was told
  // (the destructor), unless the body took it over.
  TH_RETURN_IF_ERROR(s->TakeManifest());
  s->t_resolved_ = SteadyClock::now();
  return s;
}

Status FetchSession::Start(Version version,
                           std::optional<uint64_t> fill_epoch) {
  ControlPlane& hub = ctx_.hub;
  int unavailable_answers = 0;
  uint64_t retryable_answers = 0;
  while (true) {
    Result<FetchStart> r = hub.BeginFetch(
        ctx_.membership.id(), model_, version, options_.group,
        options_.group_step, MaxSources(options_.max_sources), fill_epoch,
        work_.timeout_ms(), /*manifest_from_sources=*/true);
    if (r.ok() && r->resolved.state == VersionState::kUnavailable) {
      // The hub's own answer (not an unreachable hub): committed, but no
      // complete holder is left. Filling holders may still have chunks: the
      // fetch tries them and gives up when they cannot finish. With none,
      // asking once more (a passing moment of the hub's table must not end
      // a fetch) is all that is worth doing.
      const std::string why = VersionName(model_, r->resolved.version) +
                              " is committed but no live worker holds all "
                              "of its chunks";
      if (!r->resolved.sources.empty() || !r->first.sources.empty()) {
        TH_LOG(INFO) << "fetch: the hub says " << why << "; trying the "
                     << r->resolved.sources.size()
                     << " partial holder(s) it lists";
      } else {
        if (r->filling) {
          ctx_.membership.Withdraw(model_, r->resolved.version, work_);
        }
        if (++unavailable_answers >= 2 || work_.remaining_ms() < 400) {
          return Unavailable(why + ": the hub said so twice, " +
                             std::to_string(kUnavailableConfirmMs) +
                             " ms apart, and lists no holder to try");
        }
        ctx_.metrics.HubRetry(kUnavailableConfirmMs / 1000.0);
        ctx_.clock.SleepMs(kUnavailableConfirmMs);
        continue;
      }
    }
    if (r.ok()) {
      start_ = std::move(r).value();
      version_ = start_.resolved.version;
      name_ = VersionName(model_, version_);
      sources_assigned_ = true;
      filling_at_hub_ = start_.filling;
      return Status::Ok();
    }
    const StatusCode c = r.status().code();
    if ((c != StatusCode::kUnavailable && c != StatusCode::kDeadlineExceeded) ||
        work_.remaining_ms() < 200) {
      return r.status();
    }
    testpoint::Hit("fetch.hub_unavailable", ++retryable_answers);
    ctx_.metrics.HubRetry(kHubRetryPauseMs / 1000.0);
    ctx_.clock.SleepMs(kHubRetryPauseMs);
  }
}

void FetchSession::DropFilling() {
  if (!filling_at_hub_) return;
  filling_at_hub_ = false;
  ctx_.membership.Withdraw(model_, version_, deadline_);
}

void FetchSession::EndAtHub() {
  if (!sources_assigned_) return;
  sources_assigned_ = false;
  Status s = ctx_.hub.FetchDone(ctx_.membership.id(), model_, version_,
                                deadline_.timeout_ms());
  if (!s.ok()) TH_LOG(DEBUG) << "fetch done: " << s.ToString();
}

void FetchSession::Withdraw() {
  EndAtHub();
  DropFilling();
}

bool FetchSession::OffersHoldersOfSlices() const {
  return start_.first_status.ok() &&
         std::any_of(
             start_.first.sources.begin(), start_.first.sources.end(),
             [](const ResolvedSource& s) { return s.slices != nullptr; });
}

Result<std::vector<FetchSource>> FetchSession::FirstSources() const {
  std::vector<FetchSource> sources;
  const Status& first = start_.first_status;
  if (first.ok() && start_.first.unavailable.has_value()) {
    // Some may still have chunks (filling ones). The run confirms with the
    // hub before giving up.
    TH_LOG(INFO) << "schedule " << name_ << ": the hub says "
                 << *start_.first.unavailable
                 << "; trying the holders from resolve";
    sources = ctx_.addresses.ToSources(start_.resolved.sources);
  } else if (first.ok()) {
    sources = ctx_.addresses.ToSources(start_.first.sources);
  } else {
    const StatusCode c = first.code();
    if (c != StatusCode::kUnavailable && c != StatusCode::kDeadlineExceeded) {
      return first;
    }
    TH_LOG(WARN) << "schedule " << name_ << ": " << first.ToString()
                 << "; using the holders from resolve";
    sources = ctx_.addresses.ToSources(start_.resolved.sources);
  }
  if (sources.empty()) {
    return Unavailable(name_ + " has no holder other than this worker");
  }
  return sources;
}

SourceRefresher FetchSession::Refresher(std::vector<SliceWant> wants) const {
  ControlPlane* hub = &ctx_.hub;
  const Addresses* addresses = &ctx_.addresses;
  return [hub, addresses, id = ctx_.membership.id(), model = model_,
          v = version_, max_sources = MaxSources(options_.max_sources),
          work = work_, wants = CapWants(std::move(wants))](
             const std::vector<std::string>& failed) -> Result<SourceUpdate> {
    std::vector<WorkerId> exclude;
    for (const std::string& w : failed) exclude.emplace_back(w);
    Result<Scheduled> srcs = hub->ScheduleSlices(
        id, model, v, exclude, max_sources, wants, work.remaining_ms());
    if (!srcs.ok() && srcs.status().code() == StatusCode::kUnavailable &&
        !exclude.empty()) {
      // Every holder left has failed us once. Failures are often passing
      // (a stall, a dropped connection): ask again without exclusions. The
      // run's per-read attempt bound ends a hopeless retry.
      srcs = hub->ScheduleSlices(id, model, v, {}, max_sources, wants,
                                 work.remaining_ms());
    }
    if (!srcs.ok()) return srcs.status();
    SourceUpdate update(addresses->ToSources(srcs->sources));
    update.unavailable = std::move(srcs->unavailable);
    update.recheck_after_ms = srcs->recheck_after_ms;
    return update;
  };
}

void FetchSession::FollowRechecks(FetcherOptions& fo) const {
  if (!start_.first_status.ok() || start_.first.sources.empty()) return;
  fo.recheck_after_ms = start_.first.recheck_after_ms;
  ControlPlane* hub = &ctx_.hub;
  const Addresses* addresses = &ctx_.addresses;
  fo.recheck = [hub, addresses, id = ctx_.membership.id(), model = model_,
                v = version_, max_sources = MaxSources(options_.max_sources),
                work = work_]() -> Result<SourceUpdate> {
    Result<Scheduled> srcs =
        hub->Recheck(id, model, v, max_sources, work.remaining_ms());
    if (!srcs.ok()) return srcs.status();
    SourceUpdate update(addresses->ToSources(srcs->sources));
    update.unavailable = std::move(srcs->unavailable);
    update.recheck_after_ms = srcs->recheck_after_ms;
    return update;
  };
}

bool FetchSession::AwaitSources(
    const std::function<bool(std::vector<FetchSource>&)>& good,
    int64_t wait_ms) {
  const Deadline until = work_.Cap(wait_ms);
  while (true) {
    Result<std::vector<FetchSource>> now = FirstSources();
    if (now.ok() && good(*now)) return true;
    if (!start_.delta_pending || until.remaining_ms() < kDeltaPollMs) {
      return false;
    }
    ctx_.clock.SleepMs(kDeltaPollMs);
    Result<Scheduled> r =
        ctx_.hub.Schedule(ctx_.membership.id(), model_, version_, {},
                          MaxSources(options_.max_sources), work_.timeout_ms());
    if (!r.ok() || r->unavailable.has_value()) continue;  // keep the last
    start_.first = std::move(r).value();
    start_.first_status = Status::Ok();
    start_.delta_pending = start_.first.delta_pending;
  }
}

FetcherOptions FetchSession::StartRun(uint64_t bytes_total,
                                      std::function<void(uint64_t)> on_chunk) {
  t_sources_ = SteadyClock::now();
  bytes_total_ = bytes_total;
  FetcherOptions fo;
  fo.streams = options_.connections;
  fo.on_progress = options_.on_progress;
  fo.sources_interval_ms = ctx_.membership.ProgressIntervalMs();
  fo.on_sources = [this](const FetchReport& so_far) {
    ctx_.membership.ReportProgress(
        Progress(so_far, /*done=*/false, SteadyClock::now()));
  };
  fo.metrics = &ctx_.metrics;
  fo.on_chunk = std::move(on_chunk);
  return fo;
}

FetchStats FetchSession::Finish(const FetchReport& rep,
                                const std::function<bool()>& report_copy) {
  const auto t2 = SteadyClock::now();
  if (report_copy && report_copy()) {
    sources_assigned_ = false;  // a complete copy ends the fetch at the hub
  } else {
    EndAtHub();
  }
  const auto t3 = SteadyClock::now();
  // What each holder gave this reader, for the hub's slowest holders: sent
  // by the heartbeat thread, so that no fetch waits for it.
  ctx_.membership.QueueDoneReport(Progress(rep, /*done=*/true, t2));
  FetchStats st;
  st.version = version_;
  st.bytes = rep.bytes;
  st.bytes_same_host = rep.bytes_same_host;
  st.seconds = Seconds(t0_, t2);
  st.total_seconds = Seconds(t0_, t3);
  st.resolve_seconds = Seconds(t0_, t_resolved_);
  st.schedule_seconds = Seconds(t_resolved_, t_sources_);
  // The first verified read splits the data plane; a run of no reads has
  // none (all of it is first byte, which is then ~0).
  const SteadyClock::time_point t_first =
      std::clamp(rep.first_chunk_at.value_or(t2), t_sources_, t2);
  st.first_byte_seconds = Seconds(t_sources_, t_first);
  const double rest = Seconds(t_first, t2);
  // Streams hash in parallel as bytes arrive: their summed hashing time
  // over their number is the checksum's share of the wall time.
  st.verify_seconds =
      std::min(rest, rep.verify_seconds_all_streams / std::max(1, rep.streams));
  st.transfer_seconds = rest - st.verify_seconds;
  st.register_seconds = Seconds(t2, t3);
  st.sources_used = rep.sources_used;
  st.sources = rep.per_source;
  for (FetchSourceStats& fs : st.sources) {
    fs.transport = std::string(TransportOf(fs.address));
  }
  st.chunk_retries = rep.chunk_retries;
  st.chunks_stolen = rep.chunks_stolen;
  st.tls_connections = rep.tls_connections;
  st.kernel_tls_connections = rep.kernel_tls_connections;
  st.manifest_source = manifest_source_;
  st.manifest_bytes = manifest_bytes_;
  st.delta_base = rep.delta_base;
  st.bytes_from_delta = rep.bytes_from_delta;
  st.delta_wire_bytes = rep.delta_wire_bytes;
  st.delta_chunks_read_whole = rep.delta_chunks_read_whole;
  return st;
}

// `tensorhub top`: the bytes so far, in all and per source, since the data
// transfer began until `until`.
ProgressUpdate FetchSession::Progress(const FetchReport& r, bool done,
                                      SteadyClock::time_point until) const {
  ProgressUpdate u;
  u.model = model_;
  u.version = version_;
  u.bytes_done = r.bytes;
  u.bytes_total = bytes_total_;
  u.elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(until - t_sources_)
          .count();
  for (const FetchSourceStats& ps : r.per_source) {
    // A holder that moved to TCP mid-fetch has an entry per transport: one
    // line per worker here.
    auto same =
        std::find_if(u.sources.begin(), u.sources.end(),
                     [&](const auto& e) { return e.first == ps.worker; });
    if (same != u.sources.end()) {
      same->second += ps.bytes;
    } else {
      u.sources.emplace_back(ps.worker, ps.bytes);
    }
  }
  u.done = done;
  return u;
}

Result<FetchStats> CountOutcome(ClientMetrics& metrics, Result<FetchStats> r) {
  if (r.ok()) {
    metrics.FetchSucceeded(*r);
  } else {
    metrics.FetchFailed();
  }
  return r;
}

}  // namespace tensorhub::client
