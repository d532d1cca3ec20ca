#include "hub/hub_service.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "common/deadline.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/refusal_log.h"
#include "common/test_point.h"
#include "hub/call_gate.h"
#include "hub/connection_guard.h"
#include "hub/coordinator.h"
#include "hub/hub_metrics.h"
#include "hub/hub_service_internal.h"
#include "hub/hub_state.h"
#include "hub/start_hub.h"
#include "metrics/metrics.h"
#include "tensorhub.grpc.pb.h"
#include "tls/tls.h"
#include "wire/call_proof.h"
#include "wire/proto_convert.h"

namespace tensorhub::hub {
namespace {

using grpc::ServerContext;

// Trailers of an HA hub's answers (grpc_control_plane.cc reads them):
// kLeaderTrailer on a standby's "not the leader" answer, naming the leader
// ("" when none is known), and kRoleTrailer "leader" on a leader's
// UNAVAILABLE answers (e.g. "rebuilding"), so that a client does not take
// them for an unreachable hub and move on to another one.
constexpr char kLeaderTrailer[] = "th-leader";
constexpr char kRoleTrailer[] = "th-role";

// A few threads for an HA hub's calls that may wait for etcd (Persisted:
// up to kPersistMs), so that they do not hold the hot calls' one thread
// (HotCallQueue), which the heartbeats share. Bounded: a call that finds
// kMaxQueued calls queued runs where it is. Runs what is queued before it
// stops.
class WaitingCalls {
 public:
  explicit WaitingCalls(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~WaitingCalls() { Stop(); }
  // Runs what is queued, then joins the threads; later calls run inline.
  // The gRPC server must outlive this: a call's Finish() is still inside
  // gRPC when the server's Shutdown() may already have returned.
  void Stop() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  WaitingCalls(const WaitingCalls&) = delete;
  WaitingCalls& operator=(const WaitingCalls&) = delete;

  bool TryRun(std::function<void()> call) {
    MutexLock lock(mu_);
    if (stopping_ || queue_.size() >= kMaxQueued) return false;
    queue_.push_back(std::move(call));
    cv_.notify_one();
    return true;
  }

 private:
  void Run() {
    MutexLock lock(mu_);
    while (true) {
      while (!stopping_ && queue_.empty()) cv_.wait(lock.native());
      if (queue_.empty()) return;
      std::function<void()> call = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      call();
      lock.Lock();
    }
  }

  static constexpr size_t kMaxQueued = 1024;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_ TH_GUARDED_BY(mu_);
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// The calls every worker and every reader makes (a heartbeat, a fetch's
// BeginFetch and AddHolder) are served through gRPC's async API from one
// completion queue (HotCallQueue below): its one thread polls the
// connections, runs the handler and writes the answer, where the sync API
// hands each call to a thread of its pool and the callback API (gRPC 1.51)
// to its "nexting" threads (docs/design.md "What a fetch costs the hub").
// The others, some of which wait (a held Unpublish or Leave, a keeper's
// long poll), stay on the sync API.
using HotCallsService =
    v1::Hub::WithAsyncMethod_Heartbeat<v1::Hub::WithAsyncMethod_BeginFetch<
        v1::Hub::WithAsyncMethod_AddHolder<v1::Hub::Service>>>;

class HubServiceImpl final : public HotCallsService {
 public:
  // `coord` (not owned; null: a single hub) must outlive the service's
  // calls; an HA hub starts with no state and answers as a standby until
  // the coordinator elects it (OnElected).
  // `accept_request_secret`: a call without a proof in its metadata is
  // checked by the secret inside its request (older clients, and calls
  // made on the service directly).
  HubServiceImpl(HubConfig config, std::string secret, int64_t rebuild_ms,
                 int64_t started_ms, Coordinator* coord = nullptr,
                 bool accept_request_secret = true)
      : config_(config),
        state_(config),
        secret_(std::move(secret)),
        accept_request_secret_(accept_request_secret),
        rebuild_ms_(rebuild_ms),
        coord_(coord),
        started_ms_(started_ms),
        waiting_(coord != nullptr ? std::make_unique<WaitingCalls>(8)
                                  : nullptr) {}

  // After the server's Shutdown() and before the server goes: no call that
  // may wait is still inside gRPC then (WaitingCalls::Stop).
  void StopWaitingCalls() {
    if (waiting_ != nullptr) waiting_->Stop();
  }

  // The coordinator's callbacks (coordinator.h), on its thread.
  Status OnElected(const DurableState& durable) {
    MutexLock lock(mu_);
    ResetState();
    state_.Restore(durable, NowMs());
    // Workers learn of the new leader at their next heartbeat (NOT_FOUND
    // there: they register again and re-report): the rebuild window starts.
    started_ms_.store(NowMs());
    return Status::Ok();
  }
  void OnDemoted() {
    MutexLock lock(mu_);
    ResetState();
  }

  grpc::Status RegisterWorker(ServerContext* ctx,
                              const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    WorkerRegistration reg;
    reg.requested_id = WorkerId(req->worker_id());
    reg.name = req->name();
    reg.data_address = req->data_address();
    for (const v1::DataEndpoint& e : req->endpoints()) {
      if (reg.endpoints.size() > kMaxDataEndpoints) break;  // refused below
      reg.endpoints.push_back({e.transport(), e.address()});
    }
    reg.labels = wire::FromProto(req->labels());
    reg.worker_class = req->worker_class() == v1::SPOT ? WorkerClass::kSpot
                                                       : WorkerClass::kReliable;
    reg.nearby_deltas = req->nearby_deltas();
    MutexLock lock(mu_);
    Result<WorkerId> id = state_.RegisterWorker(reg, NowMs());
    if (!id.ok()) return wire::ToGrpc(id.status());
    TH_LOG(INFO) << "worker " << id->value() << " (" << reg.name << ") at "
                 << reg.data_address
                 << (req->worker_id().empty() ? " joined" : " re-joined");
    resp->set_worker_id(id->value());
    const HeartbeatPlan plan = Planned();
    resp->set_lease_ms(static_cast<uint32_t>(plan.lease_ms));
    resp->set_heartbeat_interval_ms(static_cast<uint32_t>(plan.interval_ms));
    resp->set_hub_incarnation(state_.config().incarnation);
    return grpc::Status::OK;
  }

  // The sync form (tests, the fuzz target) and the async form (the
  // server, HotCallQueue) run the same code.
  grpc::Status Heartbeat(ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    return HeartbeatCall(ctx, req, resp);
  }
  grpc::Status HeartbeatCall(grpc::ServerContextBase* ctx,
                             const v1::HeartbeatRequest* req,
                             v1::HeartbeatResponse* resp) {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    MutexLock lock(mu_);
    Status s = state_.Heartbeat(WorkerId(req->worker_id()), NowMs());
    const HeartbeatPlan plan = Planned();
    resp->set_lease_ms(static_cast<uint32_t>(plan.lease_ms));
    resp->set_heartbeat_interval_ms(static_cast<uint32_t>(plan.interval_ms));
    resp->set_hub_incarnation(state_.config().incarnation);
    return wire::ToGrpc(s);
  }

  grpc::Status Publish(ServerContext* ctx, const v1::PublishRequest* req,
                       v1::PublishResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    Result<PartLayout> part = wire::FromProto(req->part());
    if (!part.ok()) return wire::ToGrpc(part.status());
    PublishArgs a;
    a.worker = WorkerId(req->worker_id());
    a.model = req->model();
    a.version = Version(req->version());
    a.rank = req->rank();
    a.group_size = req->group_size();
    a.chunk_bytes = req->chunk_bytes();
    a.part = std::move(part).value();
    a.epoch = req->epoch();
    a.rebuild = req->rebuild();
    MutexLock lock(mu_);
    Result<VersionState> st = state_.Publish(a, NowMs());
    changed_.notify_all();
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    if (!st.ok()) return wire::ToGrpc(st.status());
    if (*st == VersionState::kCommitted) {
      TH_LOG(DEBUG) << "'" << a.model << "@" << a.version.value()
                    << "' committed";
    }
    resp->set_state(wire::ToProto(*st));
    return grpc::Status::OK;
  }

  // The sync form (tests, the fuzz target) and the async form (the
  // server, HotCallQueue) run the same code.
  grpc::Status AddHolder(ServerContext* ctx, const v1::AddHolderRequest* req,
                         v1::AddHolderResponse* resp) override {
    return AddHolderCall(ctx, req, resp);
  }
  grpc::Status AddHolderCall(grpc::ServerContextBase* ctx,
                             const v1::AddHolderRequest* req,
                             v1::AddHolderResponse* resp) {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (!req->has_manifest()) {
      if (!req->has_manifest_digest()) {
        return wire::ToGrpc(
            InvalidArgument("add holder: needs the manifest or its digest"));
      }
      // The usual report: no manifest to decode, validate or compare.
      MutexLock lock(mu_);
      Result<bool> r = state_.AddHolderByDigest(
          WorkerId(req->worker_id()), req->model(), Version(req->version()),
          req->epoch(), ManifestDigest{req->manifest_digest()}, NowMs(),
          req->filling());
      if (!r.ok()) return wire::ToGrpc(r.status());
      resp->set_need_manifest(!*r);
      return grpc::Status::OK;
    }
    Result<Manifest> m = wire::FromProto(req->manifest());
    if (!m.ok()) return wire::ToGrpc(m.status());
    MutexLock lock(mu_);
    Status s = state_.AddHolder(WorkerId(req->worker_id()), req->model(),
                                Version(req->version()), req->epoch(), *m,
                                NowMs(), req->filling());
    changed_.notify_all();
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    return wire::ToGrpc(s);
  }

  grpc::Status AddSliceHolder(ServerContext* ctx,
                              const v1::AddSliceHolderRequest* req,
                              v1::AddSliceHolderResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    Result<PartLayout> slices = wire::FromProto(req->slices());
    if (!slices.ok()) return wire::ToGrpc(slices.status());
    MutexLock lock(mu_);
    Status s = state_.AddSliceHolder(WorkerId(req->worker_id()), req->model(),
                                     Version(req->version()), req->epoch(),
                                     *slices, NowMs());
    return wire::ToGrpc(s);
  }

  grpc::Status Unpublish(ServerContext* ctx, const v1::UnpublishRequest* req,
                         v1::UnpublishResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (req->wait_ms() > kMaxWaitMs) {
      return wire::ToGrpc(InvalidArgument(
          "unpublish: wait_ms must be at most " + std::to_string(kMaxWaitMs)));
    }
    const WorkerId worker(req->worker_id());
    const Version version(req->version());
    MutexLock lock(mu_);
    // The last reliable copy of a retained version: wait (the worker still
    // serves) until a keeper or another reliable holder has copied it.
    Status keep = state_.CheckDeparture(worker, req->model(), version);
    if (!keep.ok() && !req->force()) {
      TH_LOG(INFO) << "unpublish by " << worker.value() << " waits up to "
                   << req->wait_ms()
                   << " ms for a reliable copy: " << keep.message();
      const int64_t deadline = NowMs() + req->wait_ms();
      state_.SetDeparting(worker, req->model(), version, true);
      changed_.notify_all();  // keepers polling learn of the work
      metrics_.DepartureWaiting(+1);
      testpoint::Hit("hub.departure_held", 1);
      while (!keep.ok() && NowMs() < deadline && !ctx->IsCancelled() &&
             Leading()) {
        WaitChange(lock, deadline);
        (void)state_.Heartbeat(worker, NowMs());
        keep = state_.CheckDeparture(worker, req->model(), version);
      }
      metrics_.DepartureWaiting(-1);
      if (!Leading()) return NotLeader(ctx);
      state_.SetDeparting(worker, req->model(), version, false);
      if (!keep.ok()) {
        changed_.notify_all();
        return wire::ToGrpc(keep.WithContext(
            "unpublish refused after waiting " +
            std::to_string(req->wait_ms()) + " ms; the reference stays"));
      }
    } else if (!keep.ok()) {
      TH_LOG(WARN) << "forced unpublish by " << worker.value() << ": "
                   << keep.message();
    }
    Status s = state_.Unpublish(worker, req->model(), version, NowMs());
    changed_.notify_all();
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    return wire::ToGrpc(s);
  }

  grpc::Status Retain(ServerContext* ctx, const v1::RetainRequest* req,
                      v1::RetainResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    MutexLock lock(mu_);
    Status s =
        state_.Retain(req->model(), Version(req->version()), !req->unretain());
    if (s.ok()) changed_.notify_all();
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    // A pin is recorded before it is confirmed: it outlives this hub.
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    if (s.ok()) {
      TH_LOG(INFO) << "'" << req->model() << "@" << req->version() << "' "
                   << (req->unretain() ? "unretained" : "retained");
    }
    return wire::ToGrpc(s);
  }

  grpc::Status KeeperPoll(ServerContext* ctx, const v1::KeeperPollRequest* req,
                          v1::KeeperPollResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (req->wait_ms() > kMaxPollMs) {
      return wire::ToGrpc(
          InvalidArgument("keeper poll: wait_ms must be at most " +
                          std::to_string(kMaxPollMs)));
    }
    const WorkerId keeper(req->worker_id());
    const int64_t deadline = NowMs() + req->wait_ms();
    MutexLock lock(mu_);
    KeeperWork work;
    while (true) {
      // Also renews the keeper's lease while it waits here.
      if (Status s = state_.Heartbeat(keeper, NowMs()); !s.ok()) {
        return wire::ToGrpc(s);
      }
      work = state_.KeeperTasks(keeper);
      if (!work.empty() || NowMs() >= deadline || ctx->IsCancelled()) break;
      WaitChange(lock, deadline);
    }
    const uint64_t incarnation = state_.config().incarnation;
    lock.Unlock();
    metrics_.KeeperWork(work.fetch.size(), work.release.size());
    for (const KeeperTask& t : work.fetch) ToProto(t, resp->add_fetch());
    for (const KeeperTask& t : work.release) ToProto(t, resp->add_release());
    for (const KeeperTask& t : work.pinned) ToProto(t, resp->add_pinned());
    resp->set_hub_incarnation(incarnation);
    return grpc::Status::OK;
  }

  grpc::Status Resolve(ServerContext* ctx, const v1::ResolveRequest* req,
                       v1::ResolveResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    std::shared_ptr<const EncodedManifest> encoded;
    std::optional<Manifest> manifest;  // to encode, when not cached
    uint64_t durable = 0;              // a reader group's new pin
    Result<Resolution> r = [&] {
      MutexLock lock(mu_);
      Result<Resolution> res =
          !req->group().empty() && req->version() == 0
              ? state_.ResolveForGroup(WorkerId(req->worker_id()), req->model(),
                                       req->group(), req->group_step(), NowMs(),
                                       /*copy_manifest=*/false)
              : state_.Resolve(WorkerId(req->worker_id()), req->model(),
                               Version(req->version()),
                               req->include_uncommitted(),
                               /*copy_manifest=*/false);
      if (!res.ok() && res.status().code() == StatusCode::kUnavailable &&
          req->version() != 0 &&
          state_.StateOf(req->model(), Version(req->version())) ==
              VersionState::kUnavailable &&
          !Rebuilding()) {
        // A considered answer, as for Schedule: the version with its state
        // UNAVAILABLE, its manifest and the (filling) holders left, so the
        // reader can tell it from an unreachable hub and stop waiting.
        res = state_.Resolve(
            WorkerId(req->worker_id()), req->model(), Version(req->version()),
            /*include_uncommitted=*/true, /*copy_manifest=*/false);
      }
      if (res.ok()) {
        encoded = FindManifest(req->model(), *res, &manifest);
      }
      durable = TakeDurable();
      return res;
    }();
    // All ranks of a reader group must get the version the first one got,
    // whichever hub they ask: the pin is recorded before it is answered.
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    if (!r.ok()) return Answer(ctx, DuringRebuild(r.status()));
    if (manifest.has_value()) {
      encoded = EncodeManifest(req->model(), *r, *manifest);
    }
    resp->set_version(r->version.value());
    resp->set_state(wire::ToProto(r->state));
    resp->set_num_holders(r->num_holders);
    if (encoded != nullptr) resp->set_manifest(encoded->bytes);
    resp->set_retained(r->retained);
    for (const HolderView& h : r->holders) ToProto(h, resp->add_holders());
    return grpc::Status::OK;
  }

  grpc::Status Schedule(ServerContext* ctx, const v1::ScheduleRequest* req,
                        v1::ScheduleResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (req->max_sources() < 1 || req->max_sources() > 16 ||
        req->exclude_size() > 4096 || req->want_size() > 4096) {
      return wire::ToGrpc(
          InvalidArgument("schedule: max_sources must be in [1, 16], exclude "
                          "and want at most 4096"));
    }
    std::set<WorkerId> exclude;
    for (const std::string& e : req->exclude()) exclude.insert(WorkerId(e));
    std::vector<SliceWant> wants;
    for (const v1::SliceWant& w : req->want()) {
      wants.push_back(
          {w.name(), Box{{w.box_offset().begin(), w.box_offset().end()},
                         {w.box_extent().begin(), w.box_extent().end()}}});
    }
    bool version_unavailable = false;
    int64_t recheck_after_ms = 0;
    bool delta_pending = false;
    Result<std::vector<HolderView>> r = [&] {
      MutexLock lock(mu_);
      const WorkerId reader(req->worker_id());
      const Version version(req->version());
      Result<std::vector<HolderView>> res =
          req->recheck() ? state_.Recheck(reader, req->model(), version,
                                          req->max_sources())
          : wants.empty()
              ? state_.Schedule(reader, req->model(), version, exclude,
                                req->max_sources())
              : state_.ScheduleSlices(reader, req->model(), version, exclude,
                                      req->max_sources(), wants);
      if (res.ok()) {
        recheck_after_ms = state_.RecheckAfterMs(reader, req->model(), version);
      }
      version_unavailable =
          !res.ok() && res.status().code() == StatusCode::kUnavailable &&
          state_.StateOf(req->model(), Version(req->version())) ==
              VersionState::kUnavailable;
      delta_pending =
          res.ok() && wants.empty() &&
          state_.DeltaPending(WorkerId(req->worker_id()), req->model(),
                              Version(req->version()));
      return res;
    }();
    if (version_unavailable && !Rebuilding()) {
      // A considered answer, not an RPC error: the reader may stop waiting.
      resp->set_state(v1::UNAVAILABLE);
      resp->set_detail(r.status().message());
      return grpc::Status::OK;
    }
    if (!r.ok()) return Answer(ctx, DuringRebuild(r.status()));
    for (const HolderView& h : *r) ToProto(h, resp->add_holders());
    resp->set_state(v1::COMMITTED);
    resp->set_recheck_after_ms(static_cast<uint32_t>(recheck_after_ms));
    resp->set_delta_pending(delta_pending);
    return grpc::Status::OK;
  }

  // The sync form (tests, the fuzz target) and the async form (the
  // server, HotCallQueue) run the same code.
  grpc::Status BeginFetch(ServerContext* ctx, const v1::BeginFetchRequest* req,
                          v1::BeginFetchResponse* resp) override {
    return BeginFetchCall(ctx, req, resp);
  }
  grpc::Status BeginFetchCall(grpc::ServerContextBase* ctx,
                              const v1::BeginFetchRequest* req,
                              v1::BeginFetchResponse* resp) {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (req->max_sources() < 1 || req->max_sources() > 16) {
      return wire::ToGrpc(
          InvalidArgument("begin fetch: max_sources must be in [1, 16]"));
    }
    BeginFetchArgs a;
    a.reader = WorkerId(req->worker_id());
    a.model = req->model();
    a.version = Version(req->version());
    a.group = req->group();
    a.group_step = req->group_step();
    if (req->fill_epoch() != 0) a.fill_epoch = req->fill_epoch();
    a.max_sources = req->max_sources();
    a.settled = !Rebuilding();
    std::shared_ptr<const EncodedManifest> encoded;
    std::optional<Manifest> manifest;  // to encode, when not cached
    uint64_t durable = 0;              // a reader group's new pin
    Result<FetchStart> r = [&] {
      MutexLock lock(mu_);
      Result<FetchStart> res = state_.BeginFetch(a, NowMs());
      if (res.ok()) {
        encoded = FindManifest(a.model, res->resolution, &manifest);
        if (res->filling.ok() && a.fill_epoch.has_value()) {
          changed_.notify_all();
        }
      }
      durable = TakeDurable();
      return res;
    }();
    // As Resolve: a reader group's pin is recorded before it is answered.
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    if (!r.ok()) return Answer(ctx, DuringRebuild(r.status()));
    const Resolution& res = r->resolution;
    if (manifest.has_value()) encoded = EncodeManifest(a.model, res, *manifest);
    resp->set_version(res.version.value());
    resp->set_state(wire::ToProto(res.state));
    if (encoded != nullptr) {
      if (req->manifest_from_sources() &&
          AnyHoldsAll(r->sources, encoded->num_chunks)) {
        // The reader reads it from a source and checks it against this.
        resp->set_manifest_sha256(encoded->sha256.data(),
                                  encoded->sha256.size());
        resp->set_manifest_size(encoded->bytes.size());
      } else {
        resp->set_manifest(encoded->bytes);
      }
    }
    for (const HolderView& h : res.holders) ToProto(h, resp->add_holders());
    resp->set_num_holders(res.num_holders);
    resp->set_retained(res.retained);
    resp->set_filling(a.fill_epoch.has_value() && r->filling.ok());
    if (!r->filling.ok()) resp->set_fill_detail(r->filling.ToString());
    for (const HolderView& h : r->sources) ToProto(h, resp->add_sources());
    if (r->sources_unavailable) {
      resp->set_sources_state(v1::UNAVAILABLE);
      resp->set_sources_detail(r->sources_status.message());
    } else if (!r->sources_status.ok()) {
      const Status s = DuringRebuild(r->sources_status);
      resp->set_sources_code(static_cast<uint32_t>(s.code()));
      resp->set_sources_detail(s.message());
    } else {
      resp->set_sources_state(v1::COMMITTED);
      resp->set_recheck_after_ms(static_cast<uint32_t>(r->recheck_after_ms));
    }
    resp->set_delta_pending(r->delta_pending);
    return grpc::Status::OK;
  }

  grpc::Status ReportDelta(ServerContext* ctx,
                           const v1::ReportDeltaRequest* req,
                           v1::ReportDeltaResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    const WorkerId worker(req->worker_id());
    const Version version(req->version()), base(req->base());
    MutexLock lock(mu_);
    switch (req->action()) {
      case v1::ReportDeltaRequest::CLAIM: {
        Result<bool> granted =
            state_.ClaimDelta(worker, req->model(), version, base, NowMs());
        if (!granted.ok()) return wire::ToGrpc(granted.status());
        resp->set_granted(*granted);
        return grpc::Status::OK;
      }
      case v1::ReportDeltaRequest::READY:
        return wire::ToGrpc(state_.AddDelta(worker, req->model(), version, base,
                                            req->bytes(), NowMs()));
      case v1::ReportDeltaRequest::DROP:
        return wire::ToGrpc(
            state_.DropDelta(worker, req->model(), version, base, NowMs()));
      default:
        return wire::ToGrpc(InvalidArgument("report delta: unknown action " +
                                            std::to_string(req->action())));
    }
  }

  grpc::Status FetchDone(ServerContext* ctx, const v1::FetchDoneRequest* req,
                         v1::FetchDoneResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    MutexLock lock(mu_);
    state_.FetchDone(WorkerId(req->worker_id()), req->model(),
                     Version(req->version()));
    return grpc::Status::OK;
  }

  grpc::Status ListModels(ServerContext* ctx, const v1::ListModelsRequest* req,
                          v1::ListModelsResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    std::vector<ModelSummary> models;
    {
      MutexLock lock(mu_);
      models = state_.List();
    }
    for (const ModelSummary& m : models) {
      v1::ModelSummary* ms = resp->add_models();
      ms->set_model(m.model);
      for (const VersionSummary& v : m.versions) {
        v1::VersionSummary* vs = ms->add_versions();
        vs->set_version(v.version.value());
        vs->set_state(wire::ToProto(v.state));
        vs->set_group_size(v.group_size);
        vs->set_parts_published(v.parts_published);
        vs->set_total_bytes(v.total_bytes);
        vs->set_holders(v.holders);
        vs->set_tensors(v.tensors);
        vs->set_retained(v.retained);
      }
    }
    return grpc::Status::OK;
  }

  // `tensorhub top`: a progress report costs one lookup of the version and
  // a copy of at most kMaxProgressSources counters; nothing durable.
  grpc::Status ReportProgress(ServerContext* ctx,
                              const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    ProgressReport p;
    p.reader = WorkerId(req->worker_id());
    p.model = req->model();
    p.version = Version(req->version());
    p.bytes_done = req->bytes_done();
    p.bytes_total = req->bytes_total();
    p.elapsed_ms = static_cast<int64_t>(
        std::min<uint64_t>(req->elapsed_ms(), uint64_t{1} << 62));
    for (const v1::SourceBytes& sb : req->sources()) {
      if (p.sources.size() >= kMaxProgressSources) break;
      p.sources.emplace_back(WorkerId(sb.worker_id()), sb.bytes());
    }
    p.done = req->done();
    MutexLock lock(mu_);
    return Answer(ctx, state_.ReportProgress(p, NowMs()));
  }

  grpc::Status Snapshot(ServerContext* ctx, const v1::SnapshotRequest* req,
                        v1::SnapshotResponse* resp) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    SnapshotLimits lim;
    auto set = [](uint32_t asked, uint32_t& field) {
      if (asked != 0) field = asked;
    };
    set(req->max_models(), lim.models);
    set(req->max_versions_per_model(), lim.versions_per_model);
    set(req->max_holders_per_version(), lim.holders_per_version);
    set(req->max_transfers(), lim.transfers);
    set(req->max_slowest(), lim.slowest);
    HubSnapshot snap;
    {
      MutexLock lock(mu_);
      snap = state_.Snapshot(lim, NowMs());
    }
    wire::ToProto(snap, resp);
    return grpc::Status::OK;
  }

  grpc::Status Leave(ServerContext* ctx, const v1::LeaveRequest* req,
                     v1::LeaveResponse*) override {
    if (auto s = Admit(ctx, req->secret()); !s.ok()) return s;
    if (req->wait_ms() > kMaxWaitMs) {
      return wire::ToGrpc(InvalidArgument("leave: wait_ms must be at most " +
                                          std::to_string(kMaxWaitMs)));
    }
    const WorkerId worker(req->worker_id());
    MutexLock lock(mu_);
    // Retained versions this worker holds the last (reliable) copy of: wait,
    // still serving, for keepers to copy them. It leaves in any case.
    auto blocked = state_.BlockedDepartures(worker);
    if (!blocked.empty() && req->wait_ms() > 0) {
      TH_LOG(INFO) << "worker " << worker.value() << " leaving: waiting up to "
                   << req->wait_ms() << " ms for reliable copies of "
                   << blocked.size() << " retained version(s)";
      const int64_t deadline = NowMs() + req->wait_ms();
      auto marked = blocked;
      for (const auto& [m, v] : marked) state_.SetDeparting(worker, m, v, true);
      changed_.notify_all();
      metrics_.DepartureWaiting(+1);
      // Runs with the hub's lock held: a test's action must not call the hub.
      testpoint::Hit("hub.departure_held", blocked.size());
      while (!blocked.empty() && NowMs() < deadline && !ctx->IsCancelled() &&
             Leading()) {
        WaitChange(lock, deadline);
        (void)state_.Heartbeat(worker, NowMs());
        blocked = state_.BlockedDepartures(worker);
      }
      metrics_.DepartureWaiting(-1);
      if (!Leading()) return NotLeader(ctx);
      for (const auto& [m, v] : marked)
        state_.SetDeparting(worker, m, v, false);
    }
    for (const auto& [m, v] : blocked) {
      TH_LOG(ERROR) << "worker " << worker.value() << " left with the last "
                    << "reliable copy of retained '" << m << "@" << v.value()
                    << "' (no keeper copied it in time)";
    }
    Status s = state_.Leave(worker);
    if (s.ok()) TH_LOG(INFO) << "worker " << req->worker_id() << " left";
    changed_.notify_all();
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    if (auto d = AwaitDurable(ctx, durable); !d.ok()) return d;
    return wire::ToGrpc(s);
  }

  HubMetrics& metrics() { return metrics_; }
  // The lease of the heartbeat plan last told to a worker.
  int64_t PlannedLeaseMs() const { return planned_lease_ms_.load(); }

  // The families about the table, computed now (a scrape thread).
  std::vector<prometheus::MetricFamily> StateFamilies() {
    HubStats stats;
    {
      MutexLock lock(mu_);
      stats = state_.Stats();
    }
    return HubMetrics::StateFamilies(stats, Rebuilding(),
                                     RebuildWindowMs() / 1e3);
  }

  void Expire() {
    MutexLock lock(mu_);
    if (coord_ != nullptr && !coord_->Leading()) return;
    size_t before = state_.num_workers();
    state_.ExpireLeases(NowMs());
    if (state_.num_workers() < before) {
      TH_LOG(INFO) << (before - state_.num_workers())
                   << " worker(s) lost their lease";
      metrics_.LeasesExpired(before - state_.num_workers());
      changed_.notify_all();
    }
    const uint64_t durable = TakeDurable();
    lock.Unlock();
    // Forgotten reader groups and pins: written with the next change if
    // this fails (they stay queued).
    if (Status d = Persisted(durable); !d.ok()) {
      TH_LOG(DEBUG) << "recording expired state in etcd: " << d.ToString();
    }
  }

  // Runs `answer` (a hot call that may wait for etcd) on waiting_, when this
  // is an HA hub's service and waiting_ has room; false: the caller runs it
  // where it is.
  bool RunWaiting(std::function<void()> answer) {
    return waiting_ != nullptr && waiting_->TryRun(std::move(answer));
  }

 private:
  // A served call passed the gate (call_gate.h) already, which refuses a
  // call with a bad proof before its request is read; the proof is
  // checked again here so that the service does not depend on how it is
  // served. Without one, the request's own secret (older clients), where
  // accepted; compared in constant time either way.
  grpc::Status Auth(grpc::ServerContextBase* ctx, const std::string& secret) {
    if (secret_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto proof = md.find(wire::kCallProofKey);
    Status s = Status::Ok();
    if (proof != md.end()) {
      s = wire::CheckCallProof(
          std::string_view(proof->second.data(), proof->second.size()), secret_,
          wire::UnixNowMs());
    } else if (!accept_request_secret_) {
      s = wire::CheckCallProof("", secret_, wire::UnixNowMs());
    } else if (!wire::SecretsEqual(secret, secret_)) {
      s = PermissionDenied("wrong or missing shared secret");
    }
    if (s.ok()) return grpc::Status::OK;
    refusals_.Refused(PeerHost(ctx->peer()), s.message());
    return wire::ToGrpc(s);
  }

  // "ipv4:10.0.0.5:4242" -> "10.0.0.5": one line per address, not per
  // connection, in the refusal log.
  static std::string PeerHost(const std::string& peer) {
    const size_t colon = peer.rfind(':');
    std::string host =
        colon == std::string::npos ? peer : peer.substr(0, colon);
    const size_t kind = host.find(':');
    return kind == std::string::npos ? host : host.substr(kind + 1);
  }

  bool Leading() const { return coord_ == nullptr || coord_->Leading(); }

  // The secret, then (in an HA set) whether this hub leads now.
  grpc::Status Admit(grpc::ServerContextBase* ctx, const std::string& secret) {
    if (auto s = Auth(ctx, secret); !s.ok()) return s;
    if (!Leading()) return NotLeader(ctx);
    return grpc::Status::OK;
  }

  // A standby's answer to every call: UNAVAILABLE (clients retry), the
  // leader named in the message and, for clients to follow, in a trailer.
  grpc::Status NotLeader(grpc::ServerContextBase* ctx) const {
    std::string leader = coord_->Leader();
    if (leader == coord_->self()) leader.clear();  // lost it this moment
    ctx->AddTrailingMetadata(kLeaderTrailer, leader);
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        "hub " + coord_->self() + " is not the leader; " +
            (leader.empty()
                 ? std::string("no leader is elected yet (try another hub "
                               "of the set)")
                 : "leader is " + leader));
  }

  // A leader's considered answer: an UNAVAILABLE ("rebuilding", retry) is
  // marked as the leader's, so that a client does not try another hub.
  grpc::Status Answer(grpc::ServerContextBase* ctx, const Status& s) const {
    if (coord_ != nullptr && s.code() == StatusCode::kUnavailable) {
      ctx->AddTrailingMetadata(kRoleTrailer, "leader");
    }
    return wire::ToGrpc(s);
  }

  // A fresh state machine (a new incarnation, so that keepers restore
  // their pins), the queue of unwritten changes dropped.
  void ResetState() TH_REQUIRES(mu_) {
    HubConfig c = config_;
    c.incarnation = config_.incarnation + (++resets_);
    c.record_durable = coord_ != nullptr;
    state_ = HubState(c);
    planned_lease_ms_.store(state_.plan().lease_ms);
    manifest_cache_.clear();
    manifest_order_.clear();
    manifest_cache_bytes_ = 0;
    if (!durable_queue_.empty()) durable_lost_ = durable_queue_.back().first;
    durable_queue_.clear();
    changed_.notify_all();
  }

  // Queues the state machine's durable changes (HA); returns the sequence
  // number AwaitDurable waits for (0: none).
  uint64_t TakeDurable() TH_REQUIRES(mu_) {
    if (coord_ == nullptr) return 0;
    std::vector<DurableChange> changes = state_.TakeDurableChanges();
    for (DurableChange& c : changes) {
      durable_queue_.emplace_back(++durable_seq_, std::move(c));
    }
    return changes.empty() ? 0 : durable_seq_;
  }

  // Writes the queued changes up to `seq` (and any queued before or
  // meanwhile: one fenced write for all the callers waiting) to the
  // coordinator's store. Writes are serialized, in queue order.
  Status Persisted(uint64_t seq) TH_EXCLUDES(mu_) {
    if (seq == 0) return Status::Ok();
    MutexLock writing(persist_mu_);
    std::vector<DurableChange> batch;
    uint64_t last = 0;
    {
      MutexLock lock(mu_);
      if (seq <= durable_done_) return Status::Ok();
      if (seq <= durable_lost_) {
        return FailedPrecondition(
            "this hub stopped leading before the "
            "change was recorded");
      }
      for (const auto& [n, c] : durable_queue_) batch.push_back(c);
      last = durable_queue_.back().first;
    }
    Status s = coord_->Persist(batch, NowMs() + kPersistMs);
    MutexLock lock(mu_);
    if (s.ok()) {
      while (!durable_queue_.empty() && durable_queue_.front().first <= last) {
        durable_queue_.pop_front();
      }
      durable_done_ = std::max(durable_done_, last);
    }
    return s.ok() || seq <= durable_done_ ? Status::Ok() : s;
  }

  // Persisted(), as a call's answer: a hub that could not record the
  // change answers like a standby (the client tries the leader), or
  // UNAVAILABLE when etcd could not be reached (the change stays queued).
  grpc::Status AwaitDurable(grpc::ServerContextBase* ctx, uint64_t seq) {
    Status s = Persisted(seq);
    if (s.ok()) return grpc::Status::OK;
    TH_LOG(WARN) << "could not record a change in etcd: " << s.ToString();
    if (!Leading()) return NotLeader(ctx);
    return Answer(ctx, s);
  }

  // A hub keeps no state on disk: after a (re)start it learns versions
  // from the workers as they re-register and re-report, within about a
  // lease. Until rebuild_ms_ have passed, "unknown" (NOT_FOUND) and "no
  // holder" (UNAVAILABLE) may only mean "not re-reported yet", so both are
  // answered as an UNAVAILABLE error that says so: callers retry within
  // their deadline, and no reader takes them for final.
  //
  // The window (rebuild_ms_ < 0, the default) is the lease the hub grants
  // now: a worker heartbeats within a third of it, so every worker told
  // the old plan has re-registered by then. A fleet planned a longer lease
  // by the hub before the restart re-registers at up to the budget's rate,
  // which keeps the new plan's lease, and so the window, ahead of it.
  int64_t RebuildWindowMs() const {
    return rebuild_ms_ >= 0 ? rebuild_ms_ : planned_lease_ms_.load();
  }
  bool Rebuilding() const {
    return NowMs() - started_ms_.load() < RebuildWindowMs();
  }
  Status DuringRebuild(const Status& s) {
    if (s.code() != StatusCode::kNotFound &&
        s.code() != StatusCode::kUnavailable)
      return s;
    const int64_t age_ms = NowMs() - started_ms_.load();
    const int64_t window_ms = RebuildWindowMs();
    if (age_ms >= window_ms) return s;
    metrics_.RebuildAnswer();
    return Unavailable(
        "hub started " + std::to_string(age_ms) +
        " ms ago and is rebuilding its state from the workers' reports (for " +
        std::to_string(window_ms) + " ms): " + s.message());
  }

  // The heartbeat plan now, published for Rebuilding() (read without mu_).
  HeartbeatPlan Planned() TH_REQUIRES(mu_) {
    const HeartbeatPlan plan = state_.plan();
    planned_lease_ms_.store(plan.lease_ms);
    return plan;
  }

  static constexpr uint32_t kMaxWaitMs = 600000;
  // How long a call waits for its durable change to be written.
  static constexpr int64_t kPersistMs = 5000;
  static constexpr uint32_t kMaxPollMs = 30000;

  // Waits until the state changes or `deadline_ms`, whichever is first, at
  // most 200 ms at a time so that cancelled callers are noticed.
  void WaitChange(MutexLock& lock, int64_t deadline_ms) TH_REQUIRES(mu_) {
    int64_t slice = std::min<int64_t>(200, deadline_ms - NowMs());
    if (slice > 0) {
      changed_.wait_for(lock.native(), std::chrono::milliseconds(slice));
    }
  }

  static void ToProto(const KeeperTask& t, v1::KeeperTask* out) {
    out->set_model(t.model);
    out->set_version(t.version.value());
    out->set_total_bytes(t.total_bytes);
  }

  static void ToProto(const HolderView& h, v1::Holder* out) {
    out->set_worker_id(h.worker.value());
    out->set_data_address(h.data_address);
    for (const DataEndpoint& e : h.endpoints) {
      v1::DataEndpoint* pe = out->add_endpoints();
      pe->set_transport(e.transport);
      pe->set_address(e.address);
    }
    wire::ToProto(h.labels, out->mutable_labels());
    out->set_worker_class(h.worker_class == WorkerClass::kSpot ? v1::SPOT
                                                               : v1::RELIABLE);
    out->set_epoch(h.epoch);
    out->set_filling(h.filling);
    for (const ChunkRange& c : h.chunks) {
      out->add_chunk_begin(c.begin);
      out->add_chunk_end(c.end);
    }
    if (h.slice_holder) wire::ToProto(h.slices, out->mutable_slices());
    for (const DeltaOffer& d : h.deltas) {
      v1::DeltaOffer* o = out->add_deltas();
      o->set_base(d.base.value());
      o->set_bytes(d.bytes);
    }
  }

  // A version's manifest as the hub sends it (wire::EncodeManifest), with
  // what a reader needs to take it from a source instead.
  struct EncodedManifest {
    std::string bytes;
    wire::Sha256 sha256{};
    uint64_t num_chunks = 0;
  };
  // Whether one of `sources` holds every chunk of a version of
  // `num_chunks`, and so can serve its whole manifest (a trainer rank of a
  // group holds only its part, and does not know the rest).
  static bool AnyHoldsAll(const std::vector<HolderView>& sources,
                          uint64_t num_chunks) {
    for (const HolderView& h : sources) {
      if (h.slice_holder) continue;
      uint64_t held = 0;
      for (const ChunkRange& c : h.chunks) held += c.end - c.begin;
      if (held >= num_chunks) return true;
    }
    return false;
  }

  // The encoded manifests Resolve sends, by (model, version, digest): the
  // digest tells a version re-created with other contents apart. At most
  // kManifestCacheEntries and kManifestCacheBytes, the oldest evicted first.
  using ManifestKey = std::tuple<std::string, uint64_t, uint64_t>;
  static constexpr size_t kManifestCacheEntries = 16;
  static constexpr size_t kManifestCacheBytes = 256u << 20;

  // The encoded manifest of a resolved version: the cached copy, or null
  // with `*manifest` set to the manifest to encode (outside the lock:
  // EncodeManifest), or null when the version has none.
  std::shared_ptr<const EncodedManifest> FindManifest(
      const std::string& model, const Resolution& r,
      std::optional<Manifest>* manifest) TH_REQUIRES(mu_) {
    if (!r.manifest_digest.has_value()) return nullptr;
    std::shared_ptr<const EncodedManifest> encoded = CachedManifest(model, r);
    if (encoded == nullptr)
      *manifest = state_.CommittedManifest(model, r.version);
    return encoded;
  }
  // Encoding happens outside the lock: a big manifest must not stall
  // other calls. Every reader of a version gets the same bytes, so they
  // are encoded once per version.
  std::shared_ptr<const EncodedManifest> EncodeManifest(
      const std::string& model, const Resolution& r, const Manifest& manifest)
      TH_EXCLUDES(mu_) {
    auto e = std::make_shared<EncodedManifest>();
    e->bytes = wire::EncodeManifest(manifest);
    e->sha256 = wire::Sha256Of(e->bytes);
    e->num_chunks = manifest.num_chunks();
    std::shared_ptr<const EncodedManifest> encoded = std::move(e);
    MutexLock lock(mu_);
    CacheManifest(model, r, encoded);
    return encoded;
  }

  std::shared_ptr<const EncodedManifest> CachedManifest(
      const std::string& model, const Resolution& r) TH_REQUIRES(mu_) {
    auto it = manifest_cache_.find(
        {model, r.version.value(), r.manifest_digest->value});
    return it == manifest_cache_.end() ? nullptr : it->second;
  }
  void CacheManifest(const std::string& model, const Resolution& r,
                     std::shared_ptr<const EncodedManifest> encoded)
      TH_REQUIRES(mu_) {
    ManifestKey key{model, r.version.value(), r.manifest_digest->value};
    const size_t bytes = encoded->bytes.size();
    if (!manifest_cache_.emplace(key, std::move(encoded)).second) return;
    manifest_order_.push_back(key);
    manifest_cache_bytes_ += bytes;
    while (manifest_order_.size() > kManifestCacheEntries ||
           manifest_cache_bytes_ > kManifestCacheBytes) {
      auto oldest = manifest_cache_.find(manifest_order_.front());
      manifest_cache_bytes_ -= oldest->second->bytes.size();
      manifest_cache_.erase(oldest);
      manifest_order_.pop_front();
    }
  }

  const HubConfig config_;
  Mutex mu_;
  // Signalled (under mu_) when references or retention change: departing
  // holders and polling keepers wait on it.
  std::condition_variable changed_;
  HubState state_ TH_GUARDED_BY(mu_);
  uint64_t resets_ TH_GUARDED_BY(mu_) = 0;
  // HA: durable changes not yet written, with their sequence numbers;
  // those up to durable_done_ are written, those up to durable_lost_ were
  // dropped when this hub stopped leading.
  std::deque<std::pair<uint64_t, DurableChange>> durable_queue_
      TH_GUARDED_BY(mu_);
  uint64_t durable_seq_ TH_GUARDED_BY(mu_) = 0;
  uint64_t durable_done_ TH_GUARDED_BY(mu_) = 0;
  uint64_t durable_lost_ TH_GUARDED_BY(mu_) = 0;
  Mutex persist_mu_;  // one write to the store at a time, in queue order
  std::map<ManifestKey, std::shared_ptr<const EncodedManifest>> manifest_cache_
      TH_GUARDED_BY(mu_);
  std::deque<ManifestKey> manifest_order_ TH_GUARDED_BY(mu_);  // oldest first
  size_t manifest_cache_bytes_ TH_GUARDED_BY(mu_) = 0;
  const std::string secret_;
  const bool accept_request_secret_;
  RefusalLog refusals_{"hub"};
  const int64_t rebuild_ms_;  // < 0: the planned lease (RebuildWindowMs)
  HubMetrics metrics_;
  Coordinator* const coord_;  // not owned; null: a single hub
  // When this hub started, or (HA) was last elected: the rebuild window.
  std::atomic<int64_t> started_ms_;
  // The lease of the last plan told to a worker (Planned).
  std::atomic<int64_t> planned_lease_ms_{config_.lease_ms};
  // HA only (Serve). Last: its threads stop before the rest goes.
  std::unique_ptr<WaitingCalls> waiting_;
};

// The hot calls' completion queue (HotCallsService). One thread waits on
// it, and so is the thread that polls the connections too: a call is read,
// served and answered without changing threads (an HA hub's calls that may
// wait for etcd go to the service's waiting threads). Measured in
// docs/benchmarks.md, "The hot calls on one completion queue".
class HotCallQueue {
 public:
  // `service` (not owned) outlives this; `cq` is the server builder's.
  HotCallQueue(HubServiceImpl* service,
               std::unique_ptr<grpc::ServerCompletionQueue> cq)
      : service_(service), cq_(std::move(cq)) {}
  ~HotCallQueue() { Stop(); }
  HotCallQueue(const HotCallQueue&) = delete;
  HotCallQueue& operator=(const HotCallQueue&) = delete;

  // Once the server has started: asks gRPC for the first call of each kind
  // and starts the thread.
  void Start() {
    Unary<v1::HeartbeatRequest, v1::HeartbeatResponse,
          &HubServiceImpl::RequestHeartbeat,
          &HubServiceImpl::HeartbeatCall>::Listen(this, /*may_wait=*/false);
    Unary<v1::BeginFetchRequest, v1::BeginFetchResponse,
          &HubServiceImpl::RequestBeginFetch,
          &HubServiceImpl::BeginFetchCall>::Listen(this, /*may_wait=*/true);
    Unary<v1::AddHolderRequest, v1::AddHolderResponse,
          &HubServiceImpl::RequestAddHolder,
          &HubServiceImpl::AddHolderCall>::Listen(this, /*may_wait=*/true);
    thread_ = std::thread([this] { Drain(); });
  }

  // After the server's Shutdown() (which ends the calls it had) and the
  // service's StopWaitingCalls() (which answers those it held): nothing
  // is asked of the queue any more; it is shut down and drained.
  void Stop() {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cq_->Shutdown();
    if (thread_.joinable()) {
      thread_.join();
    } else {
      Drain();  // never started: the events of the first requests
    }
  }

 private:
  // One call in the queue: a tag gRPC hands back with each of its events.
  class Call {
   public:
    virtual ~Call() = default;
    virtual void Proceed(bool ok) = 0;
  };

  // A unary call of one kind: asked for (Listen, through the service's
  // `kRequest`), then answered by its `kHandler`, then deleted when gRPC
  // has sent the answer. The two are template arguments, not members:
  // calls through member-function pointers held in members drew GCC's
  // maybe-uninitialized warning in the sanitizer build (-O1).
  template <class Req, class Resp, auto kRequest, auto kHandler>
  class Unary final : public Call {
   public:
    // Asks gRPC for the next call of this kind (none once the queue stops).
    static void Listen(HotCallQueue* q, bool may_wait) {
      auto* call = new Unary(q, may_wait);
      MutexLock lock(q->mu_);
      if (q->stopping_) {
        delete call;
        return;
      }
      (q->service_->*kRequest)(&call->ctx_, &call->req_, &call->responder_,
                               q->cq_.get(), q->cq_.get(), call);
    }

    void Proceed(bool ok) override {
      // Answered, or never matched (the server stops): done.
      if (answered_ || !ok) {
        // An answer made on a waiting thread (an HA hub's) wrote this call
        // and called Finish under mu_; gRPC's queue orders that before this
        // event, but outside what ThreadSanitizer sees (gRPC is not built
        // with it): taking mu_ makes the order visible.
        { MutexLock lock(q_->mu_); }
        delete this;
        return;
      }
      answered_ = true;
      Listen(q_, may_wait_);
      auto answer = [this] {
        const grpc::Status status =
            (q_->service_->*kHandler)(&ctx_, &req_, &resp_);
        MutexLock lock(q_->mu_);
        if (q_->stopping_) {  // the server has ended the call already
          lock.Unlock();
          delete this;
          return;
        }
        responder_.Finish(resp_, status, this);
      };
      if (!may_wait_ || !q_->service_->RunWaiting(answer)) answer();
    }

   private:
    Unary(HotCallQueue* q, bool may_wait)
        : q_(q), may_wait_(may_wait), responder_(&ctx_) {}

    HotCallQueue* const q_;
    const bool may_wait_;
    bool answered_ = false;
    ServerContext ctx_;
    Req req_;
    Resp resp_;
    grpc::ServerAsyncResponseWriter<Resp> responder_;
  };

  void Drain() {
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) static_cast<Call*>(tag)->Proceed(ok);
  }

  HubServiceImpl* const service_;
  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  Mutex mu_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class HubServerImpl final : public HubServer {
 public:
  // `coord` (null: a single hub) is started by the caller and stopped
  // here, before the server.
  HubServerImpl(std::unique_ptr<Coordinator> coord,
                std::unique_ptr<HubServiceImpl> service,
                std::unique_ptr<grpc::Server> server,
                std::unique_ptr<HotCallQueue> hot, std::string address,
                std::shared_ptr<metrics::FunctionCollector> collector,
                std::unique_ptr<metrics::MetricsServer> metrics_server,
                std::unique_ptr<ConnectionGuard> guard)
      : coord_(std::move(coord)),
        service_(std::move(service)),
        server_(std::move(server)),
        hot_(std::move(hot)),
        address_(std::move(address)),
        collector_(std::move(collector)),
        metrics_server_(std::move(metrics_server)),
        guard_(std::move(guard)) {
    expiry_ = std::thread([this] {
      MutexLock lock(mu_);
      while (!stopping_) {
        // A tenth of the lease the hub plans now: a worker is dropped at
        // most that late, and a large fleet under a long lease is not
        // scanned (all of it, under the hub's lock) every half second.
        const int64_t tick_ms =
            std::max<int64_t>(50, service_->PlannedLeaseMs() / 10);
        cv_.wait_for(lock.native(), std::chrono::milliseconds(tick_ms));
        if (stopping_) break;
        lock.Unlock();
        service_->Expire();
        lock.Lock();
      }
    });
  }
  ~HubServerImpl() override { Shutdown(); }

  std::string address() const override { return address_; }
  std::string metrics_address() const override {
    return metrics_server_ ? metrics_server_->address() : std::string();
  }

  void Wait() override {
    MutexLock lock(mu_);
    cv_.wait(lock.native(), [this]() TH_REQUIRES(mu_) { return stopping_; });
  }

  void Shutdown() override {
    {
      MutexLock lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      stopping_ = true;
    }
    cv_.notify_all();
    if (metrics_server_) metrics_server_->Stop();  // scrapes read guard_
    guard_->Stop();
    if (expiry_.joinable()) expiry_.join();
    // Resign first: a standby takes over at once, and clients that call
    // this hub meanwhile are told to go there.
    if (coord_ != nullptr) coord_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
    service_->StopWaitingCalls();
    hot_->Stop();
  }

 private:
  std::unique_ptr<Coordinator> coord_;  // outlives the service using it
  std::unique_ptr<HubServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HotCallQueue> hot_;  // drained before the server goes
  std::string address_;
  // Scrapes read service_: stopped in Shutdown, before anything goes.
  std::shared_ptr<metrics::FunctionCollector> collector_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<ConnectionGuard> guard_;
  Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  bool stopped_ TH_GUARDED_BY(mu_) = false;
  std::thread expiry_;
};

}  // namespace

std::unique_ptr<v1::Hub::Service> NewHubService(const HubConfig& config,
                                                std::string secret,
                                                int64_t rebuild_ms,
                                                int64_t started_ms,
                                                Coordinator* coord) {
  return std::make_unique<HubServiceImpl>(config, std::move(secret), rebuild_ms,
                                          started_ms < 0 ? NowMs() : started_ms,
                                          coord);
}

void ExpireLeases(v1::Hub::Service* service) {
  static_cast<HubServiceImpl*>(service)->Expire();
}

Status ElectService(v1::Hub::Service* service, const DurableState& durable) {
  return static_cast<HubServiceImpl*>(service)->OnElected(durable);
}

void DemoteService(v1::Hub::Service* service) {
  static_cast<HubServiceImpl*>(service)->OnDemoted();
}

}  // namespace tensorhub::hub

namespace tensorhub {

using hub::Coordinator;
using hub::DurableState;
using hub::HubConfig;
using hub::HubServerImpl;
using hub::HubServiceImpl;

// How often the connection guard looks at the hub's connections.
constexpr int64_t kGuardPeriodMs = 1000;

namespace {

// gRPC's credentials for `options`: plaintext, TLS, or mutual TLS, from
// files read and checked here (a bad one is named, not left to gRPC's
// opaque start failure); with a secret, every call passes `gate` before
// its request is read.
Result<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const HubOptions& options, std::shared_ptr<hub::CallGate> gate) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    if (!options.tls_client_ca_file.empty()) {
      return InvalidArgument(
          "tls_client_ca (--tls-client-ca) needs the hub's own certificate "
          "and key: tls_cert (--tls-cert) and tls_key (--tls-key)");
    }
    return hub::MakeServerCredentials(nullptr, std::move(gate));
  }
  tls::PemFiles files;
  files.cert = options.tls_cert_file;
  files.key = options.tls_key_file;
  files.ca = options.tls_client_ca_file;
  files.cert_option = "tls_cert (--tls-cert)";
  files.key_option = "tls_key (--tls-key)";
  files.ca_option = "tls_client_ca (--tls-client-ca)";
  TH_ASSIGN_OR_RETURN(tls::Credentials c, tls::LoadCredentials(files));
  return hub::MakeServerCredentials(&c, std::move(gate));
}

// The descriptor limit, raised to its hard limit (a hub holds one per
// connection): the connection bound is kept below it, so that accept()
// never fails for want of descriptors.
size_t RaiseDescriptorLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = std::min<rlim_t>(r.rlim_max, rlim_t{1} << 20);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? size_t{1} << 20
                                     : static_cast<size_t>(r.rlim_cur);
}

// What the metrics scrape reads about the hub's bounds (the guard is set
// once the server listens).
struct LimitsView {
  std::shared_ptr<hub::CallGate> gate;  // null: no secret
  std::atomic<hub::ConnectionGuard*> guard{nullptr};
  size_t descriptor_limit = 0;
  hub::ConnectionLimits limits;

  hub::HubMetrics::LimitStats Stats() const {
    hub::HubMetrics::LimitStats st;
    st.descriptor_limit = descriptor_limit;
    st.max_connections = limits.max_connections;
    st.max_connections_per_peer = limits.max_per_peer;
    if (const hub::ConnectionGuard* g = guard.load()) {
      const hub::ConnectionGuard::Stats gs = g->stats();
      st.connections = gs.open;
      st.connection_peers = gs.peers;
      st.descriptors = gs.descriptors;
      st.closed_over_peer = gs.closed_over_peer;
      st.closed_over_total = gs.closed_over_total;
    }
    if (gate != nullptr) {
      using wire::ProofRefusal;
      st.refused_missing = gate->refused(ProofRefusal::kMissing);
      st.refused_malformed = gate->refused(ProofRefusal::kMalformed);
      st.refused_stale = gate->refused(ProofRefusal::kStale);
      st.refused_wrong_secret = gate->refused(ProofRefusal::kWrongSecret);
      st.request_secret_calls = gate->passed_without_proof();
    }
    return st;
  }
};

// A hub reachable from other machines with neither a secret nor TLS refuses
// to start unless told --insecure, saying what it would give away and how
// to fix it; weaker setups are warned about (issue 14).
Status CheckExposure(const HubOptions& options, bool tls, bool client_certs) {
  if (tls::IsLoopbackListen(options.listen_address)) return Status::Ok();
  const std::string where = "hub listening on " + options.listen_address;
  if (options.secret.empty() && !tls) {
    const std::string what =
        where +
        " with neither a shared secret nor TLS: anyone who can reach this "
        "port can register as a worker, publish, unpublish, retain and "
        "unretain versions, list every model with its tensor layout and "
        "holders' addresses, and send readers to a holder of their "
        "choosing; every call, and the tensor bytes on the data plane, "
        "cross the network in the clear. Fix: --secret-file F (the same "
        "secret on every worker), and --tls-cert/--tls-key (workers: "
        "--tls-ca) to encrypt, or listen on 127.0.0.1 (docs/security.md)";
    if (!options.insecure) {
      return FailedPrecondition(
          "refusing to start a " + what +
          ". On a private network where that is acceptable, pass --insecure "
          "(HubOptions::insecure).");
    }
    TH_LOG(WARN) << what << ". Running anyway: --insecure was given.";
  } else if (options.secret.empty() && !client_certs) {
    TH_LOG(WARN) << where
                 << " with TLS but neither a shared secret nor client "
                    "certificates: the traffic is encrypted, but anyone who "
                    "can reach this port can call every method (register, "
                    "publish, unpublish, list...). Fix: --secret-file F or "
                    "--tls-client-ca CA (docs/security.md).";
  } else if (!tls) {
    TH_LOG(WARN) << where
                 << " without TLS: every call crosses the network in the "
                    "clear, so anyone who can watch the network sees them "
                    "and can replay a call's proof of the secret for 5 "
                    "minutes (the secret itself is never sent). Fix: "
                    "--tls-cert/--tls-key (workers: --tls-ca) "
                    "(docs/security.md).";
  }
  return Status::Ok();
}

// "4:1".
std::string FormatRatio(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g:1", ratio);
  return buf;
}

}  // namespace

namespace hub {

Result<std::unique_ptr<Hub>> StartHub(
    const HubOptions& options, const CoordinatorFactory& make_coordinator) {
  HubConfig config;
  config.lease_ms = options.lease_ms;
  config.heartbeat_budget_per_s = options.heartbeat_budget_per_s;
  config.max_lease_ms = options.max_lease_ms;
  config.rack_oversubscription =
      options.racks_oversubscribed && options.rack_oversubscription <= 1
          ? 4.0
          : options.rack_oversubscription;
  for (const auto& [name, ratio] : options.rack_oversubscription_by_rack) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) {
      return InvalidArgument("per-rack oversubscription '" + name +
                             "': name the rack DATACENTER/RACK");
    }
    config.rack_oversubscription_by_rack[{name.substr(0, slash),
                                          name.substr(slash + 1)}] = ratio;
  }
  config.recheck_ms = options.recheck_ms;
  config.max_recheck_ms = options.max_recheck_ms;
  TH_RETURN_IF_ERROR(ValidateRackConfig(config));
  config.keep_latest = options.keep_latest;
  config.incarnation = std::random_device{}() ^ static_cast<uint64_t>(NowMs());
  // -1: the lease the hub plans for the fleet it sees (RebuildWindowMs).
  const int64_t rebuild_ms = options.rebuild_ms < 0 ? -1 : options.rebuild_ms;
  // TLS files are checked before anything starts (etcd, a listener).
  auto limits = std::make_shared<LimitsView>();
  if (!options.secret.empty()) {
    limits->gate = std::make_shared<hub::CallGate>(
        options.secret, options.accept_request_secret);
  }
  TH_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      ServerCredentials(options, limits->gate));
  if (options.max_connections == 0 || options.max_connections_per_peer == 0 ||
      options.idle_connection_ms <= 0 || options.handshake_timeout_ms <= 0) {
    return InvalidArgument(
        "max_connections, max_connections_per_peer, idle_connection_ms and "
        "handshake_timeout_ms must be positive");
  }
  // A reserve of descriptors for everything else the hub opens (etcd, the
  // metrics endpoint, files).
  constexpr size_t kDescriptorReserve = 256;
  limits->descriptor_limit = RaiseDescriptorLimit();
  limits->limits.max_connections =
      std::min<size_t>(options.max_connections,
                       limits->descriptor_limit > 2 * kDescriptorReserve
                           ? limits->descriptor_limit - kDescriptorReserve
                           : limits->descriptor_limit / 2);
  limits->limits.max_per_peer = std::min<size_t>(
      options.max_connections_per_peer, limits->limits.max_connections);
  const bool tls = !options.tls_cert_file.empty();
  const bool client_certs = !options.tls_client_ca_file.empty();
  TH_RETURN_IF_ERROR(CheckExposure(options, tls, client_certs));
  // A hub of an HA set: its coordinator is made once the options are
  // checked and before anything listens.
  std::unique_ptr<Coordinator> coord;
  if (make_coordinator) {
    TH_ASSIGN_OR_RETURN(coord, make_coordinator());
  }
  const bool ha = coord != nullptr;
  auto service = std::make_unique<HubServiceImpl>(
      config, options.secret, rebuild_ms, NowMs(), coord.get(),
      options.accept_request_secret);
  std::shared_ptr<metrics::FunctionCollector> collector;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  grpc::ServerBuilder builder;
  if (!options.metrics_listen.empty()) {
    HubServiceImpl* svc = service.get();
    collector = std::make_shared<metrics::FunctionCollector>([svc, limits] {
      std::vector<prometheus::MetricFamily> out = svc->StateFamilies();
      for (auto& f : hub::HubMetrics::LimitFamilies(limits->Stats())) {
        out.push_back(std::move(f));
      }
      return out;
    });
    TH_ASSIGN_OR_RETURN(metrics_server,
                        metrics::MetricsServer::Start(
                            options.metrics_listen,
                            {service->metrics().registry(), collector}));
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(service->metrics().NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  int port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &port);
  builder.RegisterService(service.get());
  // Debian's abseil is built without NDEBUG, so every absl::Mutex lock
  // inside gRPC runs deadlock detection (a graph of lock order, hashed per
  // lock): about 6% of the hub's CPU per call in a profile of `bench hub`.
  // Our own locks are checked at compile time (common/mutex.h); gRPC's are
  // not ours to debug in production.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A caller's request may be large (the manifest of a big model), but only
  // a caller that proved the secret gets its request read (call_gate.h).
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  // What a connection may take before and between calls: its TLS handshake
  // and HTTP/2 preface within handshake_timeout_ms, then at most
  // idle_connection_ms without a call in flight; the pings of a client
  // that keeps it alive at most one a minute (a faster pinger is sent
  // GOAWAY after two strikes); a dead peer's connection found by the
  // hub's own pings within two minutes; headers at most 16 KiB; at most
  // 512 calls at once on one connection.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(options.handshake_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(options.idle_connection_ms));
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 90000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 512);
  // No bandwidth-delay probing on what callers send: it grows a
  // connection's flow-control window, and so what a caller may push before
  // the hub's refusal reaches it. A caller streaming 32 MiB requests the
  // hub refused (chaos's hostile peer) took its RSS from 21 to 49 MiB with
  // it, to 23 MiB without. Requests then flow at 64 KiB per round trip (a
  // 10 MiB manifest: 0.16 s at 1 ms); answers are not affected.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // gRPC's own memory (read buffers, calls in flight) and the threads of
  // the sync calls (a held Unpublish, a keeper's long poll): bounded, so
  // that a flood ends in RESOURCE_EXHAUSTED answers instead of the hub's
  // memory. Room for four of the largest requests at once.
  grpc::ResourceQuota quota("tensorhub-hub");
  quota.Resize(size_t{1} << 30);
  quota.SetMaxThreads(1024);
  builder.SetResourceQuota(quota);
  auto hot = std::make_unique<HotCallQueue>(service.get(),
                                            builder.AddCompletionQueue());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    hot->Stop();
    return Unavailable("hub cannot listen on " + options.listen_address +
                       " (address in use or not local?)");
  }
  hot->Start();
  std::string host =
      options.listen_address.substr(0, options.listen_address.rfind(':'));
  std::string address = host + ":" + std::to_string(port);
  auto guard = std::make_unique<hub::ConnectionGuard>(port, limits->limits);
  guard->Start(kGuardPeriodMs);
  limits->guard.store(guard.get());
  if (coord != nullptr) {
    // Until elected, this hub answers every call "not the leader".
    HubServiceImpl* svc = service.get();
    Status s = coord->Start(
        {[svc](const DurableState& d) { return svc->OnElected(d); },
         [svc] { svc->OnDemoted(); }});
    if (!s.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      service->StopWaitingCalls();
      hot->Stop();
      return s;
    }
  }
  TH_LOG(INFO) << "hub listening on " << address << " (lease "
               << options.lease_ms << " ms"
               << (options.heartbeat_budget_per_s > 0
                       ? ", longer up to " +
                             std::to_string(std::max(options.max_lease_ms,
                                                     options.lease_ms)) +
                             " ms to keep heartbeats under " +
                             std::to_string(options.heartbeat_budget_per_s) +
                             "/s"
                       : std::string())
               << ", rebuilding from the workers' reports for "
               << (rebuild_ms < 0 ? std::string("a lease")
                                  : std::to_string(rebuild_ms) + " ms")
               << (options.secret.empty() ? ", no secret" : ", secret required")
               << (!tls           ? ", plaintext"
                   : client_certs ? ", TLS with client certificates required"
                                  : ", TLS")
               << (config.rack_oversubscription > 1 ||
                           !config.rack_oversubscription_by_rack.empty()
                       ? ", rack uplinks oversubscribed " +
                             FormatRatio(config.rack_oversubscription) +
                             (config.rack_oversubscription_by_rack.empty()
                                  ? std::string()
                                  : " (" +
                                        std::to_string(
                                            config.rack_oversubscription_by_rack
                                                .size()) +
                                        " racks their own)") +
                             ": rack-aware pipelines"
                       : ", sources idle first within a datacenter")
               << (options.keep_latest > 0
                       ? ", keeping the latest " +
                             std::to_string(options.keep_latest) + " retained"
                       : std::string())
               << (ha ? ", one of an HA hub set in etcd at " +
                            options.etcd_endpoints + ": serving once elected"
                      : std::string())
               << ", at most " << limits->limits.max_connections
               << " connections (" << limits->limits.max_per_peer
               << " per address; descriptor limit " << limits->descriptor_limit
               << "), idle ones closed after " << options.idle_connection_ms
               << " ms"
               << (options.accept_request_secret
                       ? ", accepting the secret inside requests of older "
                         "clients (--accept-request-secret, deprecated)"
                       : std::string())
               << ")";
  return std::unique_ptr<Hub>(
      new HubServerImpl(std::move(coord), std::move(service), std::move(server),
                        std::move(hot), address, std::move(collector),
                        std::move(metrics_server), std::move(guard)));
}

}  // namespace hub

}  // namespace tensorhub
