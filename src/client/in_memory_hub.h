// A hub in the test's own process: the real state machine (HubState) behind
// the client's ControlPlane seam, with no gRPC and no threads, on the test's
// clock. Every worker of a test gets its own ControlPlane (Connect) over the
// one shared state, and each counts the calls its worker made, by name, so a
// test can say how many hub calls one fetch cost. Test code only
// (header-only; link th_hub_state).
//
// It answers as the gRPC hub does where a fetch can tell the difference: a
// considered "no complete holder" (Scheduled::unavailable), a retained
// version's departure check (an Unpublish without force is refused, without
// waiting), the manifest sent whole (never named by its SHA-256). No lease
// expires: no expiry pass runs.
//
// Thread-safety: every method may be called from any thread (one mutex
// around the state, as the RPC adapter holds).
#ifndef TENSORHUB_CLIENT_IN_MEMORY_HUB_H_
#define TENSORHUB_CLIENT_IN_MEMORY_HUB_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "client/control_plane.h"
#include "common/clock.h"
#include "hub/hub_state.h"

namespace tensorhub::client {

// The calls one worker made to the hub, by ControlPlane method name, and
// how many of its Unpublish calls were forced.
class HubCallCounts {
 public:
  void Add(const std::string& call) {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[call];
  }
  int operator[](const std::string& call) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(call);
    return it == calls_.end() ? 0 : it->second;
  }
  std::map<std::string, int> all() const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }
  void Reset() {
    std::lock_guard<std::mutex> l(mu_);
    calls_.clear();
  }
  // "BeginFetch=1 FetchDone=1", for failure messages.
  std::string ToString() const {
    std::string out;
    for (const auto& [name, n] : all()) {
      out += (out.empty() ? "" : " ") + name + "=" + std::to_string(n);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> calls_;
};

class InMemoryHub {
 public:
  explicit InMemoryHub(const Clock& clock, hub::HubConfig config = {})
      : clock_(clock), state_(config) {}

  // A control plane for one worker; `counts` (shared with the test) counts
  // its calls.
  std::unique_ptr<ControlPlane> Connect(std::shared_ptr<HubCallCounts> counts);

  // The snapshot `tensorhub top` renders.
  HubSnapshot Snapshot(const SnapshotLimits& limits = {}) {
    std::lock_guard<std::mutex> l(mu_);
    return state_.Snapshot(limits, clock_.NowMs());
  }
  // Waits (real time, at most `wait_ms`) until some worker has sent a
  // progress report that is not a fetch's last; true if one came.
  bool WaitForProgress(int64_t wait_ms) {
    std::unique_lock<std::mutex> l(mu_);
    return progress_cv_.wait_for(l, std::chrono::milliseconds(wait_ms),
                                 [&] { return running_reports_ > 0; });
  }
  int done_reports() const {
    std::lock_guard<std::mutex> l(mu_);
    return done_reports_;
  }
  // Runs `f` on the state, under the hub's lock.
  template <typename F>
  auto With(F&& f) {
    std::lock_guard<std::mutex> l(mu_);
    return f(state_, clock_.NowMs());
  }

 private:
  class Plane;

  static ResolvedSource ToSource(const hub::HolderView& h) {
    ResolvedSource s;
    s.worker = h.worker;
    s.data_address = h.data_address;
    s.endpoints = h.endpoints;
    s.labels = h.labels;
    s.worker_class = h.worker_class;
    s.epoch = h.epoch;
    for (const hub::ChunkRange& c : h.chunks)
      s.chunks.push_back({c.begin, c.end});
    s.filling = h.filling;
    if (h.slice_holder) s.slices = std::make_shared<PartLayout>(h.slices);
    for (const hub::DeltaOffer& d : h.deltas)
      s.deltas.push_back({d.base, d.bytes});
    return s;
  }
  static std::vector<ResolvedSource> ToSources(
      const std::vector<hub::HolderView>& views) {
    std::vector<ResolvedSource> out;
    for (const hub::HolderView& h : views) out.push_back(ToSource(h));
    return out;
  }
  // As the gRPC hub answers Schedule: a committed version that no live
  // worker holds whole is a considered answer, not an error.
  Result<Scheduled> ToScheduled(Result<std::vector<hub::HolderView>> r,
                                const std::string& model, Version version) {
    if (!r.ok() && r.status().code() == StatusCode::kUnavailable &&
        state_.StateOf(model, version) == VersionState::kUnavailable) {
      Scheduled out;
      out.unavailable = r.status().message();
      return out;
    }
    if (!r.ok()) return r.status();
    Scheduled out;
    out.sources = ToSources(*r);
    return out;
  }
  // ToScheduled, with DeltaPending for a full fetch's reader.
  Result<Scheduled> ToScheduled(Result<std::vector<hub::HolderView>> r,
                                const WorkerId& reader,
                                const std::string& model, Version version) {
    Result<Scheduled> out = ToScheduled(std::move(r), model, version);
    if (out.ok())
      out->delta_pending = state_.DeltaPending(reader, model, version);
    return out;
  }
  Resolved ToResolved(const std::string& model, hub::Resolution r) {
    Resolved out;
    out.version = r.version;
    out.state = r.state;
    out.manifest = std::move(r.manifest);
    if (!out.manifest.has_value()) {
      out.manifest = state_.CommittedManifest(model, r.version);
    }
    out.sources = ToSources(r.holders);
    out.num_holders = r.num_holders;
    out.retained = r.retained;
    return out;
  }

  const Clock& clock_;
  mutable std::mutex mu_;
  std::condition_variable progress_cv_;
  hub::HubState state_;      // guarded by mu_
  int running_reports_ = 0;  // guarded by mu_
  int done_reports_ = 0;     // guarded by mu_
};

class InMemoryHub::Plane final : public ControlPlane {
 public:
  Plane(InMemoryHub& hub, std::shared_ptr<HubCallCounts> counts)
      : hub_(hub), counts_(std::move(counts)) {}

  Result<WorkerId> Register(const WorkerId& old_id, const std::string& name,
                            const std::string& data_address,
                            const std::vector<DataEndpoint>& endpoints,
                            const Labels& labels, WorkerClass worker_class,
                            bool nearby_deltas, int64_t) override {
    counts_->Add("Register");
    hub::WorkerRegistration reg;
    reg.requested_id = old_id;
    reg.name = name;
    reg.data_address = data_address;
    reg.labels = labels;
    reg.worker_class = worker_class;
    reg.endpoints = endpoints;
    reg.nearby_deltas = nearby_deltas;
    return hub_.With([&](hub::HubState& s, int64_t now) {
      return s.RegisterWorker(reg, now);
    });
  }
  Status Heartbeat(const WorkerId& id) override {
    counts_->Add("Heartbeat");
    return hub_.With(
        [&](hub::HubState& s, int64_t now) { return s.Heartbeat(id, now); });
  }
  Status Publish(const WorkerId& id, const std::string& model, Version version,
                 uint32_t rank, uint32_t group_size, uint64_t chunk_bytes,
                 const PartLayout& part, uint64_t epoch, bool rebuild,
                 int64_t) override {
    counts_->Add("Publish");
    hub::PublishArgs a{id,          model, version, rank,   group_size,
                       chunk_bytes, part,  epoch,   rebuild};
    return hub_.With([&](hub::HubState& s, int64_t now) {
      return s.Publish(a, now).status();
    });
  }
  Status AddHolder(const WorkerId& id, const std::string& model,
                   Version version, uint64_t epoch, const Manifest& manifest,
                   bool filling, int64_t) override {
    counts_->Add("AddHolder");
    return hub_.With([&](hub::HubState& s, int64_t now) {
      return s.AddHolder(id, model, version, epoch, manifest, now, filling);
    });
  }
  Result<Scheduled> Schedule(const WorkerId& reader, const std::string& model,
                             Version version,
                             const std::vector<WorkerId>& exclude,
                             uint32_t max_sources, int64_t) override {
    counts_->Add("Schedule");
    const std::set<WorkerId> ex(exclude.begin(), exclude.end());
    return hub_.With([&](hub::HubState& s, int64_t) {
      return hub_.ToScheduled(
          s.Schedule(reader, model, version, ex, max_sources), reader, model,
          version);
    });
  }
  Result<Scheduled> ScheduleSlices(const WorkerId& reader,
                                   const std::string& model, Version version,
                                   const std::vector<WorkerId>& exclude,
                                   uint32_t max_sources,
                                   const std::vector<SliceWant>& wants,
                                   int64_t) override {
    counts_->Add(wants.empty() ? "Schedule" : "ScheduleSlices");
    const std::set<WorkerId> ex(exclude.begin(), exclude.end());
    std::vector<hub::SliceWant> w;
    for (const SliceWant& x : wants) w.push_back({x.name, x.box});
    return hub_.With([&](hub::HubState& s, int64_t) {
      if (w.empty()) {
        return hub_.ToScheduled(
            s.Schedule(reader, model, version, ex, max_sources), reader, model,
            version);
      }
      return hub_.ToScheduled(
          s.ScheduleSlices(reader, model, version, ex, max_sources, w), model,
          version);
    });
  }
  Status AddSliceHolder(const WorkerId& id, const std::string& model,
                        Version version, uint64_t epoch,
                        const PartLayout& slices, int64_t) override {
    counts_->Add("AddSliceHolder");
    return hub_.With([&](hub::HubState& s, int64_t now) {
      return s.AddSliceHolder(id, model, version, epoch, slices, now);
    });
  }
  Result<bool> ReportDelta(const WorkerId& id, const std::string& model,
                           Version version, Version base, DeltaAction action,
                           uint64_t bytes, int64_t) override {
    counts_->Add("ReportDelta");
    return hub_.With([&](hub::HubState& s, int64_t now) -> Result<bool> {
      switch (action) {
        case DeltaAction::kClaim:
          return s.ClaimDelta(id, model, version, base, now);
        case DeltaAction::kReady:
          TH_RETURN_IF_ERROR(s.AddDelta(id, model, version, base, bytes, now));
          return true;
        case DeltaAction::kDrop:
          TH_RETURN_IF_ERROR(s.DropDelta(id, model, version, base, now));
          return true;
      }
      return InvalidArgument("report delta: unknown action");
    });
  }
  Status FetchDone(const WorkerId& reader, const std::string& model,
                   Version version, int64_t) override {
    counts_->Add("FetchDone");
    return hub_.With([&](hub::HubState& s, int64_t) {
      s.FetchDone(reader, model, version);
      return Status::Ok();
    });
  }
  Status Unpublish(const WorkerId& id, const std::string& model,
                   Version version, int64_t, bool force, int64_t) override {
    counts_->Add(force ? "Unpublish(force)" : "Unpublish");
    return hub_.With([&](hub::HubState& s, int64_t now) {
      // The gRPC hub waits wait_ms for a keeper first; none runs here.
      Status keep = s.CheckDeparture(id, model, version);
      if (!keep.ok() && !force) return keep;
      return s.Unpublish(id, model, version, now);
    });
  }
  Result<Resolved> Resolve(const WorkerId& reader, const std::string& model,
                           Version version, bool include_uncommitted,
                           const std::string& group, uint64_t group_step,
                           int64_t) override {
    counts_->Add("Resolve");
    return hub_.With([&](hub::HubState& s, int64_t now) -> Result<Resolved> {
      Result<hub::Resolution> r =
          !group.empty() && version.is_latest()
              ? s.ResolveForGroup(reader, model, group, group_step, now)
              : s.Resolve(reader, model, version, include_uncommitted);
      if (!r.ok()) return r.status();
      return hub_.ToResolved(model, std::move(r).value());
    });
  }
  // One call, as the gRPC hub's BeginFetch (not the default's three).
  Result<FetchStart> BeginFetch(const WorkerId& reader,
                                const std::string& model, Version version,
                                const std::string& group, uint64_t group_step,
                                uint32_t max_sources,
                                std::optional<uint64_t> fill_epoch, int64_t,
                                bool) override {
    counts_->Add("BeginFetch");
    hub::BeginFetchArgs a;
    a.reader = reader;
    a.model = model;
    a.version = version;
    a.group = group;
    a.group_step = group_step;
    a.fill_epoch = fill_epoch;
    a.max_sources = max_sources;
    return hub_.With([&](hub::HubState& s, int64_t now) -> Result<FetchStart> {
      Result<hub::FetchStart> r = s.BeginFetch(a, now);
      if (!r.ok()) return r.status();
      FetchStart out;
      out.resolved = hub_.ToResolved(model, std::move(r->resolution));
      out.filling = fill_epoch.has_value() && r->filling.ok();
      if (!r->filling.ok()) out.fill_detail = r->filling.ToString();
      out.delta_pending = r->delta_pending;
      if (r->sources_unavailable) {
        out.first.unavailable = r->sources_status.message();
      } else if (!r->sources_status.ok()) {
        out.first_status = r->sources_status;
      } else {
        out.first.sources = ToSources(r->sources);
      }
      return out;
    });
  }
  Result<std::vector<ModelInfo>> List() override {
    counts_->Add("List");
    return FailedPrecondition("in-memory hub: List is not served");
  }
  Status Leave(const WorkerId& id, int64_t, int64_t) override {
    counts_->Add("Leave");
    return hub_.With([&](hub::HubState& s, int64_t) { return s.Leave(id); });
  }
  Status Retain(const std::string& model, Version version,
                bool retain) override {
    counts_->Add("Retain");
    return hub_.With([&](hub::HubState& s, int64_t) {
      return s.Retain(model, version, retain);
    });
  }
  Result<KeeperPollResult> KeeperPoll(const WorkerId&, int64_t) override {
    counts_->Add("KeeperPoll");
    return FailedPrecondition("in-memory hub: no keepers");
  }
  Status ReportProgress(const WorkerId& reader, const ProgressUpdate& u,
                        int64_t) override {
    counts_->Add("ReportProgress");
    hub::ProgressReport p;
    p.reader = reader;
    p.model = u.model;
    p.version = u.version;
    p.bytes_done = u.bytes_done;
    p.bytes_total = u.bytes_total;
    p.elapsed_ms = u.elapsed_ms;
    p.sources = u.sources;
    p.done = u.done;
    Status s = hub_.With([&](hub::HubState& st, int64_t now) {
      Status r = st.ReportProgress(p, now);
      ++(u.done ? hub_.done_reports_ : hub_.running_reports_);
      return r;
    });
    hub_.progress_cv_.notify_all();
    return s;
  }
  Result<HubSnapshot> Snapshot(const SnapshotLimits& limits) override {
    counts_->Add("Snapshot");
    return hub_.Snapshot(limits);
  }

 private:
  InMemoryHub& hub_;
  std::shared_ptr<HubCallCounts> counts_;
};

inline std::unique_ptr<ControlPlane> InMemoryHub::Connect(
    std::shared_ptr<HubCallCounts> counts) {
  return std::make_unique<Plane>(*this, std::move(counts));
}

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_IN_MEMORY_HUB_H_
