// The worker library: glue between the hub (control), the registry (what we
// serve) and the fetcher (what we pull).
#include "tensorhub/client.h"

#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "client/client_deps.h"
#include "client/client_metrics.h"
#include "client/client_tls.h"
#include "client/control_plane.h"
#include "client/fetcher.h"
#include "client/reachability.h"
#include "client/registry.h"
#include "client/slice_fetch.h"
#include "client/transport_set.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/test_point.h"
#include "cuda/device.h"
#include "metrics/metrics.h"
#include "tls/tls.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"
#include "wire/proto_convert.h"

namespace tensorhub {

using client::ControlPlane;
using client::Holding;
using client::Registry;

class Client::Impl {
 public:
  Impl(const ClientOptions& options, client::ClientDeps deps)
      : options_(options),
        clock_(*deps.clock),
        hub_(std::move(deps.control)),
        transport_(std::move(deps.transport)) {}

  ~Impl() {
    // First: a scrape reads the server and the registry below.
    if (metrics_server_) metrics_server_->Stop();
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    if (!id_.empty()) SendDoneReports();
    // Leave while still serving: the hub may hold the call (renewing our
    // lease) until keepers copied retained versions only we hold. Best
    // effort: if the hub does not answer, our lease expiring has the same
    // effect (minus that protection).
    if (!id_.empty()) {
      // Only a worker that holds something can hold a last copy.
      const int64_t wait_ms =
          registry_.Snapshot().empty() ? 0 : options_.leave_timeout_ms;
      Status s = hub_->Leave(
          id_, std::min<int64_t>(1000, options_.rpc_timeout_ms), wait_ms);
      if (!s.ok()) TH_LOG(DEBUG) << "leave: " << s.ToString();
    }
    if (server_) server_->Stop();
  }

  Status Start() {
    // Checked before anything listens: a refusal leaves nothing to undo.
    if (options_.secret.empty() && !options_.data_tls &&
        !tls::IsLoopbackListen(options_.data_listen_address)) {
      const std::string what =
          "data server listening on " + options_.data_listen_address +
          " with neither a shared secret nor data-plane TLS: anyone who can "
          "reach it can read every version this worker holds, and the bytes "
          "cross the network in the clear. Fix: the same secret on every "
          "worker and the hub (--secret-file), and --data-tls for links you "
          "do not trust, or listen on 127.0.0.1 (docs/security.md)";
      if (!options_.insecure) {
        return FailedPrecondition(
            "refusing to start a " + what +
            ". On a private network where that is acceptable, pass "
            "--insecure (ClientOptions::insecure).");
      }
      TH_LOG(WARN) << what << ". Running anyway: --insecure was given.";
    }
    transport::ServerOptions so;
    so.max_connections = options_.max_serving_connections;
    TH_ASSIGN_OR_RETURN(
        server_,
        transport_->Listen(options_.data_listen_address, &registry_, so));
    data_address_ = server_->address();
    endpoints_ = server_->endpoints();
    if (!options_.data_advertise_host.empty()) {
      auto advertised = [this](const std::string& address) {
        return options_.data_advertise_host +
               address.substr(address.rfind(':'));
      };
      data_address_ = advertised(data_address_);
      for (DataEndpoint& e : endpoints_) e.address = advertised(e.address);
    }
    // What this worker dials first: the transports it serves besides TCP,
    // in their order of preference (transport_set.h), then TCP.
    for (const DataEndpoint& e : endpoints_) {
      dial_preference_.push_back(e.transport);
    }
    dial_preference_.emplace_back("tcp");
    hub_is_loopback_ =
        client::HostIsLoopback(client::HostOf(options_.hub_address));
    if (!options_.metrics_listen.empty()) {
      // Before registering: a port in use fails Connect with nothing to undo.
      collector_ = std::make_shared<metrics::FunctionCollector>(
          [this] { return ScrapeTimeFamilies(); });
      TH_ASSIGN_OR_RETURN(
          metrics_server_,
          metrics::MetricsServer::Start(options_.metrics_listen,
                                        {metrics_.registry(), collector_}));
    }
    if (options_.name.empty()) {
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      options_.name = std::string(host) + ":" + std::to_string(::getpid());
    }
    TH_ASSIGN_OR_RETURN(
        WorkerId id,
        hub_->Register(WorkerId(), options_.name, data_address_, endpoints_,
                       options_.labels, options_.worker_class,
                       options_.connect_timeout_ms));
    {
      MutexLock lock(mu_);
      id_ = id;
    }
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    return Status::Ok();
  }

  Status Publish(std::string_view model_sv, Version version,
                 const std::vector<TensorRef>& tensors,
                 const PublishOptions& opts) {
    std::string model(model_sv);
    if (version.is_latest()) {
      return InvalidArgument("publish needs a version number >= 1");
    }
    if (opts.group_size == 0 || opts.rank >= opts.group_size) {
      return InvalidArgument("rank " + std::to_string(opts.rank) +
                             " is not in a group of " +
                             std::to_string(opts.group_size));
    }
    TH_ASSIGN_OR_RETURN(MemoryLocation memory, CheckMemory(tensors, "publish"));
    TH_ASSIGN_OR_RETURN(const ChunkChecksum kind, PublishChecksum(opts));
    WarnIfUnreachable();
    // The chunk checksums are computed where the bytes are.
    std::unique_ptr<cuda::Stream> stream;
    if (!memory.is_host()) {
      TH_ASSIGN_OR_RETURN(stream, cuda::Stream::Create(memory.device));
    }
    ChunkHasher hash = [&](std::span<const iovec> pieces) -> Result<uint64_t> {
      if (stream) return stream->Checksum(kind, pieces);
      return ChunkSum(kind, pieces);
    };
    PieceOptions pieces{opts.pieces, opts.segment_bytes};
    TH_ASSIGN_OR_RETURN(PartLayout part,
                        BuildPartLayout(opts.rank, tensors, opts.chunk_bytes,
                                        kind, hash, pieces));
    part.metadata = opts.metadata;
    std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
    for (const TensorRef& t : tensors) {
      ranges.push_back({static_cast<const uint8_t*>(t.data), t.bytes});
    }
    for (const auto& [m, v] : registry_.Overlapping(ranges)) {
      return FailedPrecondition(
          "the memory of these tensors is still published as '" + m + "@" +
          std::to_string(v.value()) + "'; unpublish it before reusing it");
    }
    Holding h;
    h.model = model;
    h.version = version;
    h.group_size = opts.group_size;
    h.chunk_bytes = opts.chunk_bytes;
    h.rank = opts.rank;
    h.memory = memory;
    std::vector<uint8_t*> bases;
    for (const TensorRef& t : tensors)
      bases.push_back(static_cast<uint8_t*>(t.data));
    h.bases[opts.rank] = std::move(bases);
    h.parts[opts.rank] = part;
    // Register locally first: the hub may route a read to us as soon as it
    // has heard of the reference.
    TH_ASSIGN_OR_RETURN(uint64_t epoch, registry_.Add(std::move(h)));
    const Deadline deadline = Deadline::AfterMs(opts.timeout_ms, clock_);
    Status s =
        hub_->Publish(id(), model, version, opts.rank, opts.group_size,
                      opts.chunk_bytes, part, epoch, false, opts.timeout_ms);
    if (s.code() == StatusCode::kNotFound && !deadline.expired()) {
      // The hub answers a publish NOT_FOUND only when it does not know the
      // worker: it restarted, or a new leader of an HA set has not heard
      // from us yet. Register again (the heartbeat thread re-reports what
      // we hold) and publish once more, within the caller's time.
      Result<WorkerId> again = hub_->Register(
          id(), options_.name, data_address_, endpoints_, options_.labels,
          options_.worker_class,
          std::min(options_.rpc_timeout_ms,
                   std::max<int64_t>(1, deadline.remaining_ms())));
      if (again.ok()) {
        registry_.MarkAllUnreported();
        s = hub_->Publish(id(), model, version, opts.rank, opts.group_size,
                          opts.chunk_bytes, part, epoch, false,
                          std::max<int64_t>(1, deadline.remaining_ms()));
      }
    }
    if (!s.ok()) {
      // Nothing changes: withdraw the local registration again.
      (void)registry_.Revoke(model, version);
      return s;
    }
    registry_.MarkReported(model, version, epoch, true);
    return Status::Ok();
  }

  Status Unpublish(std::string_view model_sv, Version version,
                   int64_t timeout_ms, bool force) {
    std::string model(model_sv);
    Deadline deadline = Deadline::AfterMs(timeout_ms, clock_);
    if (!registry_.Contains(model, version)) {
      return NotFound("this worker does not publish '" + model + "@" +
                      std::to_string(version.value()) + "'");
    }
    // The hub first: if we hold the last reliable copy of a retained
    // version it holds the call while a keeper copies from us (we still
    // serve), and refuses if none does in time. Leave time for the drain.
    const int64_t left_ms = deadline.remaining_ms();
    const int64_t wait_ms =
        std::max<int64_t>(0, left_ms - std::min<int64_t>(left_ms / 4, 2000));
    // The call itself ends by our deadline even if the hub is unreachable.
    const int64_t call_ms = std::max<int64_t>(
        1, std::min(left_ms, wait_ms + options_.rpc_timeout_ms));
    Status hs = hub_->Unpublish(id(), model, version, wait_ms, force, call_ms);
    if (hs.code() == StatusCode::kFailedPrecondition) return hs;  // kept
    TH_ASSIGN_OR_RETURN(uint64_t epoch, registry_.Revoke(model, version));
    if (!hs.ok() && hs.code() != StatusCode::kNotFound) {
      // The hub is unreachable: it keeps routing readers here until it
      // hears from us; they are refused (the epoch is fenced) and move on.
      // The heartbeat thread tells the hub when it is back.
      TH_LOG(WARN) << "unpublish '" << model << "@" << version.value()
                   << "': hub not told yet (" << hs.ToString()
                   << "); will retry";
      MutexLock lock(mu_);
      pending_unpublish_.insert({model, version});
    }
    return TimedDrain(model, version, epoch, deadline);
  }

  // Registry::Drain, observed by the metrics.
  Status TimedDrain(const std::string& model, Version version, uint64_t epoch,
                    const Deadline& deadline) {
    const auto t0 = SteadyClock::now();
    Status s = registry_.Drain(model, version, epoch, deadline);
    metrics_.Drained(
        std::chrono::duration<double>(SteadyClock::now() - t0).count(), s.ok());
    return s;
  }

  Result<FetchStats> Fetch(std::string_view model_sv, Version version,
                           const std::vector<TensorRef>& dest,
                           const FetchOptions& opts) {
    Result<FetchStats> st = FetchOnce(model_sv, version, dest, opts);
    if (st.ok()) {
      metrics_.FetchSucceeded(*st);
    } else {
      metrics_.FetchFailed();
    }
    return st;
  }

  // A fetch, in steps: resolve, map the destination onto the manifest,
  // release memory that still serves an older version, register as a
  // filling holder, schedule sources, run the fetcher, report the holding.
  // The steps are timed as FetchStats' stages (tensorhub/client.h).
  Result<FetchStats> FetchOnce(std::string_view model_sv, Version version,
                               const std::vector<TensorRef>& dest,
                               const FetchOptions& opts) {
    const std::string model(model_sv);
    // The stats measure real time; deadlines and pauses run on clock_.
    const auto t0 = SteadyClock::now();
    const Deadline deadline = Deadline::AfterMs(opts.timeout_ms, clock_);
    if (opts.group.size() > 256) {
      return InvalidArgument("reader group id must be at most 256 characters");
    }
    // The last tenth of the time (at most 250 ms) is kept for the cleanup of
    // a failed fetch (fence and drain the partial copy, tell the hub), so
    // that even a failing fetch returns by its deadline.
    const int64_t reserve_ms =
        std::clamp<int64_t>(opts.timeout_ms / 10, 0, 250);
    const Deadline work =
        Deadline::AfterMs(opts.timeout_ms - reserve_ms, clock_);
    // One call to the hub starts the fetch: resolve, register the
    // destination as a filling holder (partial-prefix serving: it serves
    // each chunk once verified) under an epoch reserved here, schedule the
    // first sources. Reads of the epoch that arrive before the destination
    // is registered below wait for it (Registry::ReserveEpoch).
    EpochReservation reserved(registry_, opts.serve);
    if (opts.serve) WarnIfUnreachable();
    TH_ASSIGN_OR_RETURN(
        client::FetchStart start,
        BeginFetchWithin(model, version, work, opts.group, opts.group_step,
                         MaxSources(opts.max_sources), reserved.epoch()));
    const client::Resolved& r = start.resolved;
    const Version v = r.version;
    const std::string vname =
        "'" + model + "@" + std::to_string(v.value()) + "'";
    // Until the destination is registered here, an exit withdraws what the
    // hub was told: the filling reference and the sources it assigned.
    StartGuard started(this, model, v, start.filling, deadline);
    ManifestOrigin manifest_origin;
    TH_RETURN_IF_ERROR(
        TakeManifest(model, vname, &start, work, &manifest_origin));
    const auto t1 = SteadyClock::now();
    const Manifest& manifest = *r.manifest;
    if (IsSharded(manifest)) {
      // Pieces of logical tensors: the destination names the logical
      // tensors, which come whole through the slice path (not served).
      TH_ASSIGN_OR_RETURN(std::vector<TensorSlice> whole,
                          WholeSlices(manifest, dest, vname));
      started.Withdraw();
      return FetchSlices(model, v, whole, opts);
    }
    std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
    TH_ASSIGN_OR_RETURN(client::FetchJob job,
                        MapDestination(model, v, manifest, dest, &ranges));
    // The mutability contract on the reader's side: memory we are about to
    // overwrite must stop serving its old version first.
    for (const auto& [m, old] : registry_.Overlapping(ranges)) {
      TH_RETURN_IF_ERROR(Unpublish(m, old, work.remaining_ms(), false)
                             .WithContext("fetch: releasing the destination"));
    }
    // Every exit below that does not complete the fill aborts it (one
    // guard).
    std::optional<uint64_t> fill_epoch;
    if (opts.serve) {
      fill_epoch = BeginFill(model, v, manifest, job, reserved, start.filling);
    }
    started.Release(/*filled=*/fill_epoch.has_value());
    FillGuard fill(this, model, v, fill_epoch, deadline);
    const client::SourceRefresher schedule =
        MakeScheduler(model, v, opts.max_sources, work);
    TH_ASSIGN_OR_RETURN(std::vector<client::FetchSource> sources,
                        FirstSources(start, vname));
    const auto t_sources = SteadyClock::now();
    client::FetcherOptions fo;
    fo.streams = opts.connections;
    fo.on_progress = opts.on_progress;
    if (start.first_status.ok() && !start.first.sources.empty()) {
      fo.recheck_after_ms = start.first.recheck_after_ms;
      fo.recheck = MakeRechecker(model, v, opts.max_sources, work);
    }
    fo.sources_interval_ms = ProgressIntervalMs(*hub_);
    fo.on_sources = [&](const client::FetchReport& so_far) {
      ReportProgress(Progress(model, v, manifest.total_bytes(), t_sources,
                              so_far, /*done=*/false));
    };
    fo.metrics = &metrics_;
    if (fill_epoch.has_value()) {
      fo.on_chunk = [this, model, v, e = *fill_epoch](uint64_t chunk) {
        registry_.MarkChunk(model, v, e, chunk);
      };
      fo.on_landed = [this, model, v, e = *fill_epoch](uint64_t chunk,
                                                       uint64_t bytes) {
        registry_.MarkLanded(model, v, e, chunk, bytes);
      };
    }
    Result<client::FetchReport> rep = client::RunFetch(
        *transport_, job, std::move(sources), schedule, fo, work);
    const auto t2 = SteadyClock::now();
    if (!rep.ok()) {
      fill.Abort();
      (void)hub_->FetchDone(id(), model, v, deadline.remaining_ms());
      return rep.status();
    }
    if (fill_epoch.has_value()) {
      fill.Complete();
      EndFill(model, v, manifest, *fill_epoch,
              deadline);  // also releases the sources
    } else {
      Status done = hub_->FetchDone(id(), model, v, deadline.remaining_ms());
      if (!done.ok()) TH_LOG(DEBUG) << "fetch done: " << done.ToString();
    }
    const auto t3 = SteadyClock::now();
    // What each holder gave this reader, for the hub's slowest holders:
    // sent by the heartbeat thread (SendDoneReports), so no fetch waits.
    QueueDoneReport(Progress(model, v, manifest.total_bytes(), t_sources, *rep,
                             /*done=*/true, t2));
    auto secs = [](SteadyClock::time_point a, SteadyClock::time_point b) {
      return std::max(0.0, std::chrono::duration<double>(b - a).count());
    };
    FetchStats st;
    st.version = v;
    st.bytes = rep->bytes;
    st.bytes_same_host = rep->bytes_same_host;
    st.seconds = secs(t0, t2);
    st.total_seconds = secs(t0, t3);
    st.resolve_seconds = secs(t0, t1);
    st.schedule_seconds = secs(t1, t_sources);
    // The first chunk's time splits the data plane; a version of no chunks
    // has none (all of it is first byte, which is then ~0).
    const SteadyClock::time_point t_first =
        std::clamp(rep->first_chunk_at.value_or(t2), t_sources, t2);
    st.first_byte_seconds = secs(t_sources, t_first);
    const double rest = secs(t_first, t2);
    // Streams hash in parallel as bytes arrive: their summed hashing time
    // over their number is the checksum's share of the wall time.
    st.verify_seconds = std::min(
        rest, rep->verify_seconds_all_streams / std::max(1, rep->streams));
    st.transfer_seconds = rest - st.verify_seconds;
    st.register_seconds = secs(t2, t3);
    st.sources_used = rep->sources_used;
    st.sources = rep->per_source;
    for (FetchSourceStats& fs : st.sources) {
      fs.transport = std::string(client::TransportOf(fs.address));
    }
    st.chunk_retries = rep->chunk_retries;
    st.chunks_stolen = rep->chunks_stolen;
    st.tls_connections = rep->tls_connections;
    st.kernel_tls_connections = rep->kernel_tls_connections;
    st.manifest_source = manifest_origin.source;
    st.manifest_bytes = manifest_origin.bytes;
    return st;
  }

  // `tensorhub top`: a fetch's bytes so far, in all and per source, since
  // its data transfer began (`since`) until `until` (default: now).
  static client::ProgressUpdate Progress(
      const std::string& model, Version v, uint64_t total,
      SteadyClock::time_point since, const client::FetchReport& r, bool done,
      std::optional<SteadyClock::time_point> until = {}) {
    client::ProgressUpdate u;
    u.model = model;
    u.version = v;
    u.bytes_done = r.bytes;
    u.bytes_total = total;
    u.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       until.value_or(SteadyClock::now()) - since)
                       .count();
    for (const FetchSourceStats& ps : r.per_source) {
      // A holder that moved to TCP mid-fetch has an entry per transport:
      // one line per worker here.
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

  // Sends one report; best effort, at most kProgressReportMs (a hub that
  // does not take it costs a line at debug level).
  static constexpr int64_t kProgressReportMs = 1000;
  void ReportProgress(const client::ProgressUpdate& u) {
    Status s = hub_->ReportProgress(id(), u, kProgressReportMs);
    if (!s.ok()) TH_LOG(DEBUG) << "progress report: " << s.ToString();
  }

  // Final reports wait for the heartbeat thread (or the destructor); at
  // most kMaxDoneReports, the oldest dropped (they are soft state).
  static constexpr size_t kMaxDoneReports = 64;
  void QueueDoneReport(client::ProgressUpdate u) {
    MutexLock lock(mu_);
    if (done_reports_.size() >= kMaxDoneReports) done_reports_.pop_front();
    done_reports_.push_back(std::move(u));
  }
  void SendDoneReports() {
    std::deque<client::ProgressUpdate> reports;
    {
      MutexLock lock(mu_);
      reports.swap(done_reports_);
    }
    for (const client::ProgressUpdate& u : reports) ReportProgress(u);
  }

  // An epoch reserved for the fetch destination's registration
  // (Registry::ReserveEpoch), cancelled unless the registration used it.
  class EpochReservation {
   public:
    EpochReservation(client::Registry& registry, bool reserve)
        : registry_(registry) {
      if (reserve) epoch_ = registry_.ReserveEpoch();
    }
    ~EpochReservation() {
      if (epoch_.has_value()) registry_.CancelReservation(*epoch_);
    }
    EpochReservation(const EpochReservation&) = delete;
    EpochReservation& operator=(const EpochReservation&) = delete;
    std::optional<uint64_t> epoch() const { return epoch_; }
    void Used() { epoch_.reset(); }

   private:
    client::Registry& registry_;
    std::optional<uint64_t> epoch_;
  };

  // What BeginFetch told the hub, until the fetch takes it over: the
  // sources assigned to this reader (released by FetchDone) and, if the hub
  // took it, the filling reference (dropped by a forced Unpublish). On
  // exit, or on Withdraw(), both are withdrawn; Release() hands them to
  // the fetch (FillGuard, EndFill, FetchDone).
  class StartGuard {
   public:
    StartGuard(Impl* impl, const std::string& model, Version version,
               bool filling, const Deadline& deadline)
        : impl_(impl),
          model_(model),
          version_(version),
          filling_(filling),
          deadline_(deadline) {}
    ~StartGuard() { Withdraw(); }
    StartGuard(const StartGuard&) = delete;
    StartGuard& operator=(const StartGuard&) = delete;

    void Withdraw() {
      if (done_) return;
      done_ = true;
      const int64_t left_ms = std::max<int64_t>(1, deadline_.remaining_ms());
      Status s = impl_->hub_->FetchDone(impl_->id(), model_, version_, left_ms);
      if (!s.ok()) TH_LOG(DEBUG) << "fetch done: " << s.ToString();
      if (filling_) {
        s = impl_->hub_->Unpublish(impl_->id(), model_, version_, 0,
                                   /*force=*/true, left_ms);
        if (!s.ok() && s.code() != StatusCode::kNotFound) {
          MutexLock lock(impl_->mu_);
          impl_->pending_unpublish_.insert({model_, version_});
        }
      }
    }
    // The fetch goes on: its own guards and reports take over. `filled`:
    // the destination is registered here (the filling reference is its);
    // if not, a filling reference the hub took is withdrawn now.
    void Release(bool filled) {
      if (filling_ && !filled) {
        Status s = impl_->hub_->Unpublish(
            impl_->id(), model_, version_, 0, /*force=*/true,
            std::max<int64_t>(1, deadline_.remaining_ms()));
        if (!s.ok()) TH_LOG(DEBUG) << "unpublish: " << s.ToString();
      }
      done_ = true;
    }

   private:
    Impl* const impl_;
    const std::string& model_;
    const Version version_;
    const bool filling_;
    const Deadline& deadline_;
    bool done_ = false;
  };

  // Aborts a fill (fence and drain the partial copy, tell the hub) when the
  // fetch leaves without completing it: the one cleanup of every failed
  // exit. Complete() hands the fill to EndFill instead.
  class FillGuard {
   public:
    FillGuard(Impl* impl, const std::string& model, Version version,
              std::optional<uint64_t> epoch, const Deadline& deadline)
        : impl_(impl),
          model_(model),
          version_(version),
          epoch_(epoch),
          deadline_(deadline) {}
    ~FillGuard() { Abort(); }
    FillGuard(const FillGuard&) = delete;
    FillGuard& operator=(const FillGuard&) = delete;

    void Abort() {
      if (!epoch_.has_value()) return;
      impl_->AbortFill(model_, version_, epoch_, deadline_);
      epoch_.reset();
    }
    void Complete() { epoch_.reset(); }

   private:
    Impl* const impl_;
    const std::string& model_;
    const Version version_;
    std::optional<uint64_t> epoch_;
    const Deadline& deadline_;
  };

  static bool IsSharded(const Manifest& m) {
    for (const PartLayout& p : m.parts()) {
      for (const TensorLayout& t : p.tensors) {
        if (t.sharded()) return true;
      }
    }
    return false;
  }

  // A full fetch of a sharded version: every logical tensor once, with its
  // global shape and dtype, as a slice of all of it.
  static Result<std::vector<TensorSlice>> WholeSlices(
      const Manifest& manifest, const std::vector<TensorRef>& dest,
      const std::string& vname) {
    std::map<std::string, const TensorLayout*> logical;
    for (const PartLayout& p : manifest.parts()) {
      for (const TensorLayout& t : p.tensors) logical.emplace(t.spec.name, &t);
    }
    std::vector<TensorSlice> out;
    for (const TensorRef& d : dest) {
      auto it = logical.find(d.spec.name);
      if (it == logical.end()) {
        return InvalidArgument("destination tensor '" + d.spec.name +
                               "' is not part of " + vname +
                               " (or is named twice)");
      }
      const TensorLayout& t = *it->second;
      if (d.spec.dtype != t.spec.dtype || d.spec.shape != t.GlobalShape()) {
        TensorSpec global{t.spec.name, t.spec.dtype, t.GlobalShape()};
        return InvalidArgument("destination tensor '" + d.spec.name + "' is " +
                               Describe(d.spec) + " but " + vname + " has " +
                               Describe(global));
      }
      out.push_back({d, Box::Whole(d.spec.shape), {}});
      logical.erase(it);
    }
    if (!logical.empty()) {
      return InvalidArgument("destination lacks tensor '" +
                             logical.begin()->first + "' of " + vname);
    }
    return out;
  }

  // Checks `dest` against the manifest, by tensor name (every tensor of the
  // version, once, with its dtype, shape and size), and returns the job's
  // destination bases; `ranges` gets the memory that will be overwritten.
  Result<client::FetchJob> MapDestination(
      const std::string& model, Version v, const Manifest& manifest,
      const std::vector<TensorRef>& dest,
      std::vector<std::pair<const uint8_t*, uint64_t>>* ranges) {
    const std::string vname =
        "'" + model + "@" + std::to_string(v.value()) + "'";
    std::map<std::string, const TensorRef*> by_name;
    for (const TensorRef& t : dest) {
      if (!by_name.emplace(t.spec.name, &t).second) {
        return InvalidArgument("destination names tensor '" + t.spec.name +
                               "' twice");
      }
    }
    TH_ASSIGN_OR_RETURN(MemoryLocation memory, CheckMemory(dest, "fetch"));
    client::FetchJob job;
    job.model = model;
    job.version = v;
    job.manifest = &manifest;
    job.memory = memory;
    for (const PartLayout& p : manifest.parts()) {
      std::vector<uint8_t*> bases;
      for (const TensorLayout& t : p.tensors) {
        auto it = by_name.find(t.spec.name);
        if (it == by_name.end()) {
          return InvalidArgument("destination lacks tensor '" + t.spec.name +
                                 "' of " + vname);
        }
        const TensorRef& d = *it->second;
        if (d.spec.dtype != t.spec.dtype || d.spec.shape != t.spec.shape) {
          return InvalidArgument("destination tensor '" + t.spec.name +
                                 "' is " + Describe(d.spec) + " but " + vname +
                                 " has " + Describe(t.spec));
        }
        if (d.bytes != t.bytes || (d.data == nullptr && t.bytes > 0)) {
          return InvalidArgument("destination tensor '" + t.spec.name +
                                 "' has " + std::to_string(d.bytes) +
                                 " bytes, needs " + std::to_string(t.bytes));
        }
        bases.push_back(static_cast<uint8_t*>(d.data));
        ranges->push_back({static_cast<const uint8_t*>(d.data), d.bytes});
        by_name.erase(it);
      }
      job.dest_bases.push_back(std::move(bases));
    }
    if (!by_name.empty()) {
      return InvalidArgument("destination tensor '" + by_name.begin()->first +
                             "' is not part of " + vname);
    }
    return job;
  }

  // The fetcher's way to ask the hub for sources, excluding the ones that
  // failed this fetch.
  // `wants` (a reader of slices): holders of slices that intersect them
  // come too.
  client::SourceRefresher MakeScheduler(
      const std::string& model, Version v, int max_sources_wanted,
      const Deadline& work, std::vector<client::SliceWant> wants = {}) {
    const uint32_t max_sources =
        static_cast<uint32_t>(std::clamp(max_sources_wanted, 1, 16));
    return [this, model, v, max_sources, work,
            wants = std::move(wants)](const std::vector<std::string>& failed)
               -> Result<client::SourceUpdate> {
      std::vector<WorkerId> exclude;
      for (const std::string& w : failed) exclude.emplace_back(w);
      Result<client::Scheduled> srcs = hub_->ScheduleSlices(
          id(), model, v, exclude, max_sources, wants, work.remaining_ms());
      if (!srcs.ok() && srcs.status().code() == StatusCode::kUnavailable &&
          !exclude.empty()) {
        // Every holder left has failed us once. Failures are often passing
        // (a stall, a dropped connection): ask again without exclusions.
        // The fetcher's per-chunk attempt bound ends a hopeless retry.
        srcs = hub_->ScheduleSlices(id(), model, v, {}, max_sources, wants,
                                    work.remaining_ms());
      }
      if (!srcs.ok()) return srcs.status();
      client::SourceUpdate update(ToSources(srcs->sources));
      update.unavailable = std::move(srcs->unavailable);
      update.recheck_after_ms = srcs->recheck_after_ms;
      return update;
    };
  }

  // The fetcher's way to recheck its sources when the hub asked it to
  // (docs/design.md, "Rack-aware pipelines").
  std::function<Result<client::SourceUpdate>()> MakeRechecker(
      const std::string& model, Version v, int max_sources_wanted,
      const Deadline& work) {
    const uint32_t max_sources =
        static_cast<uint32_t>(std::clamp(max_sources_wanted, 1, 16));
    return
        [this, model, v, max_sources, work]() -> Result<client::SourceUpdate> {
          Result<client::Scheduled> srcs =
              hub_->Recheck(id(), model, v, max_sources, work.remaining_ms());
          if (!srcs.ok()) return srcs.status();
          client::SourceUpdate update(ToSources(srcs->sources));
          update.unavailable = std::move(srcs->unavailable);
          update.recheck_after_ms = srcs->recheck_after_ms;
          return update;
        };
  }

  // The sources a fetch starts from: the hub's first schedule, or, when
  // the hub could not schedule (restarting, or it says no complete holder
  // is left), the nearest holders it listed instead; the fetcher asks the
  // hub again when they run out.
  Result<std::vector<client::FetchSource>> FirstSources(
      const client::FetchStart& start, const std::string& vname) {
    std::vector<client::FetchSource> sources;
    if (start.first_status.ok() && start.first.unavailable.has_value()) {
      // Some may still have chunks (filling ones). The fetcher confirms
      // with the hub before giving up.
      TH_LOG(INFO) << "schedule " << vname << ": the hub says "
                   << *start.first.unavailable
                   << "; trying the holders from resolve";
      sources = ToSources(start.resolved.sources);
    } else if (start.first_status.ok()) {
      sources = ToSources(start.first.sources);
    } else {
      StatusCode c = start.first_status.code();
      if (c != StatusCode::kUnavailable && c != StatusCode::kDeadlineExceeded) {
        return start.first_status;
      }
      TH_LOG(WARN) << "schedule " << vname << ": "
                   << start.first_status.ToString()
                   << "; using the holders from resolve";
      sources = ToSources(start.resolved.sources);
    }
    if (sources.empty()) {
      return Unavailable(vname + " has no holder other than this worker");
    }
    return sources;
  }

  // A partial fetch: resolve, check and plan the slices, schedule sources,
  // run the slice fetcher. The slices are not registered for serving.
  Result<FetchStats> FetchSlices(std::string_view model_sv, Version version,
                                 const std::vector<TensorSlice>& slices,
                                 const FetchOptions& opts) {
    const std::string model(model_sv);
    const auto t0 = SteadyClock::now();
    if (opts.group.size() > 256) {
      return InvalidArgument("reader group id must be at most 256 characters");
    }
    std::vector<TensorRef> refs;
    std::vector<client::SliceDest> dests;
    for (const TensorSlice& s : slices) {
      const TensorRef& t = s.tensor;
      if (t.spec.shape != s.box.extent) {
        return InvalidArgument("slice of tensor '" + t.spec.name + "': shape " +
                               Describe(t.spec) + " is not the box's " +
                               BoxToString(s.box));
      }
      TH_ASSIGN_OR_RETURN(uint64_t size, t.spec.ByteSize());
      if (size != t.bytes) {
        return InvalidArgument("slice of tensor '" + t.spec.name + "' has " +
                               std::to_string(t.bytes) + " bytes, needs " +
                               std::to_string(size));
      }
      refs.push_back(t);
      dests.push_back({t.spec.name, s.box, t.spec.dtype,
                       static_cast<uint8_t*>(t.data), s.fp8_scales});
    }
    TH_ASSIGN_OR_RETURN(MemoryLocation memory, CheckMemory(refs, "fetch"));
    if (!memory.is_host()) {
      return FailedPrecondition(
          "fetch of slices: device memory is not supported yet; fetch into "
          "host memory");
    }
    const int64_t reserve_ms =
        std::clamp<int64_t>(opts.timeout_ms / 10, 0, 250);
    const Deadline deadline = Deadline::AfterMs(opts.timeout_ms, clock_);
    const Deadline work =
        Deadline::AfterMs(opts.timeout_ms - reserve_ms, clock_);
    TH_ASSIGN_OR_RETURN(
        client::FetchStart start,
        BeginFetchWithin(model, version, work, opts.group, opts.group_step,
                         MaxSources(opts.max_sources), std::nullopt));
    const client::Resolved& r = start.resolved;
    const Version v = r.version;
    const std::string vname =
        "'" + model + "@" + std::to_string(v.value()) + "'";
    // Releases the sources the hub assigned, on every exit (FetchDone).
    StartGuard started(this, model, v, /*filling=*/false, deadline);
    ManifestOrigin manifest_origin;
    TH_RETURN_IF_ERROR(
        TakeManifest(model, vname, &start, work, &manifest_origin));
    const auto t1 = SteadyClock::now();
    const Manifest& manifest = *r.manifest;
    Result<client::SlicePlan> plan =
        client::PlanSlices(manifest, dests, manifest.chunk_bytes());
    if (!plan.ok()) return plan.status().WithContext(vname);
    // Memory we are about to overwrite must stop serving an old version.
    std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
    for (const TensorRef& t : refs) {
      ranges.push_back({static_cast<const uint8_t*>(t.data), t.bytes});
    }
    for (const auto& [m, old] : registry_.Overlapping(ranges)) {
      TH_RETURN_IF_ERROR(Unpublish(m, old, work.remaining_ms(), false)
                             .WithContext("fetch: releasing the destination"));
    }
    std::vector<client::SliceWant> wants;
    for (const client::SliceDest& d : dests) wants.push_back({d.name, d.box});
    const client::SourceRefresher schedule =
        MakeScheduler(model, v, opts.max_sources, work, std::move(wants));
    TH_ASSIGN_OR_RETURN(std::vector<client::FetchSource> sources,
                        FirstSources(start, vname));
    // BeginFetch scheduled without the boxes: ask once more with them, so
    // that holders of slices that meet them come first (one more call, for
    // fetches of slices only). If that fails, BeginFetch's sources stand.
    if (!dests.empty()) {
      Result<client::SourceUpdate> with_boxes = schedule({});
      if (with_boxes.ok() && !with_boxes->sources.empty() &&
          !with_boxes->unavailable.has_value()) {
        sources = std::move(with_boxes->sources);
      }
    }
    if (std::any_of(sources.begin(), sources.end(),
                    [](const client::FetchSource& s) { return s.slices; })) {
      // Holders of slices: plan again with their boxes (alternative reads).
      plan =
          client::PlanSlices(manifest, dests, manifest.chunk_bytes(), sources);
      if (!plan.ok()) return plan.status().WithContext(vname);
    }
    client::FetcherOptions fo;
    fo.streams = opts.connections;
    fo.on_progress = opts.on_progress;
    client::SliceJob job{model, v, &manifest, &*plan, &dests};
    Result<client::FetchReport> rep = client::RunSliceFetch(
        *transport_, job, std::move(sources), schedule, fo, work);
    const auto t2 = SteadyClock::now();
    started.Withdraw();  // FetchDone: the slices are not served
    if (!rep.ok()) return rep.status();
    if (opts.serve_slices) ServeSlices(model, v, manifest, slices, deadline);
    FetchStats st;
    st.version = v;
    st.bytes = rep->bytes;
    st.seconds = std::chrono::duration<double>(t2 - t0).count();
    st.resolve_seconds = std::chrono::duration<double>(t1 - t0).count();
    st.sources_used = rep->sources_used;
    st.sources = rep->per_source;
    st.chunk_retries = rep->chunk_retries;
    st.chunks_stolen = rep->chunks_stolen;
    st.manifest_source = manifest_origin.source;
    st.manifest_bytes = manifest_origin.bytes;
    return st;
  }

  // After a verified fetch of slices: serve them onward as a holder of
  // slices. The segment checksums are computed here, over the bytes just
  // verified against the manifest, and registered with the hub beside the
  // boxes (docs/design.md, "Holders of slices"). Best effort: a slice that
  // cannot be served (converted, a tensor named twice, this worker serves
  // the version already) is logged and the fetch still succeeds.
  void ServeSlices(const std::string& model, Version v,
                   const Manifest& manifest,
                   const std::vector<TensorSlice>& slices,
                   const Deadline& deadline) {
    const std::string vname =
        "'" + model + "@" + std::to_string(v.value()) + "'";
    if (registry_.Contains(model, v)) {
      TH_LOG(DEBUG) << "serve slices of " << vname
                    << ": this worker serves the version already";
      return;
    }
    std::map<std::string, const TensorLayout*> logical;
    uint64_t segment_bytes = 0;
    for (const PartLayout& p : manifest.parts()) {
      for (const TensorLayout& t : p.tensors) {
        logical.emplace(t.spec.name, &t);
        // Segments about as large as the publisher's.
        segment_bytes = std::max(
            segment_bytes, t.seg.rows * t.seg.cols * DTypeBytes(t.spec.dtype));
      }
    }
    std::vector<TensorRef> refs;
    PieceOptions po;
    po.segment_bytes = segment_bytes > 0 ? segment_bytes : kDefaultSegmentBytes;
    for (const TensorSlice& s : slices) {
      const TensorLayout& t = *logical.at(s.tensor.spec.name);  // planned
      if (s.tensor.spec.dtype != t.spec.dtype || s.box.Elements() == 0)
        continue;
      if (!po.pieces
               .emplace(s.tensor.spec.name,
                        TensorPiece{t.GlobalShape(), s.box.offset})
               .second) {
        TH_LOG(WARN) << "serve slices of " << vname << ": tensor '"
                     << s.tensor.spec.name
                     << "' is named twice; serving none of its slices";
        return;
      }
      refs.push_back(s.tensor);
    }
    if (refs.empty()) return;
    ChunkHasher hash = [](std::span<const iovec> pieces) -> Result<uint64_t> {
      return ChunkSum(kDefaultChunkChecksum, pieces);
    };
    Result<PartLayout> layout =
        BuildPartLayout(client::kSliceHolderPart, refs, manifest.chunk_bytes(),
                        kDefaultChunkChecksum, hash, po);
    if (!layout.ok()) {
      TH_LOG(WARN) << "serve slices of " << vname << ": "
                   << layout.status().ToString();
      return;
    }
    Holding h;
    h.model = model;
    h.version = v;
    h.group_size = manifest.group_size();
    h.chunk_bytes = manifest.chunk_bytes();
    h.memory = MemoryLocation::Host();
    h.slices = true;
    std::vector<uint8_t*> bases;
    for (const TensorRef& t : refs)
      bases.push_back(static_cast<uint8_t*>(t.data));
    h.bases[client::kSliceHolderPart] = std::move(bases);
    h.parts[client::kSliceHolderPart] = *layout;
    Result<uint64_t> epoch = registry_.Add(std::move(h));
    if (!epoch.ok()) {
      TH_LOG(WARN) << "serve slices of " << vname << ": "
                   << epoch.status().ToString();
      return;
    }
    WarnIfUnreachable();
    Status s =
        hub_->AddSliceHolder(id(), model, v, *epoch, *layout,
                             std::max<int64_t>(1, deadline.remaining_ms()));
    // Not acknowledged: the heartbeat thread reports it again.
    registry_.MarkReported(model, v, *epoch, s.ok());
    if (!s.ok()) {
      TH_LOG(WARN) << "serve slices of " << vname << ": " << s.ToString();
    }
  }

  Result<std::vector<ModelInfo>> List() { return hub_->List(); }

  Status Retain(std::string_view model, Version version, bool retain) {
    if (version.is_latest()) {
      return InvalidArgument("retain needs a version number, not latest");
    }
    return hub_->Retain(std::string(model), version, retain);
  }

  Result<VersionInfo> DescribeVersion(std::string_view model, Version version,
                                      const std::string& group = "",
                                      uint64_t group_step = 0) {
    if (group.size() > 256) {
      return InvalidArgument("reader group id must be at most 256 characters");
    }
    TH_ASSIGN_OR_RETURN(client::Resolved r,
                        hub_->Resolve(id(), std::string(model), version, true,
                                      group, group_step));
    VersionInfo vi;
    vi.model = std::string(model);
    vi.version = r.version;
    vi.state = r.state;
    vi.retained = r.retained;
    if (r.manifest.has_value()) {
      const Manifest& m = *r.manifest;
      vi.group_size = m.group_size();
      vi.parts_published = m.group_size();
      vi.total_bytes = m.total_bytes();
      vi.chunk_bytes = m.chunk_bytes();
      vi.num_chunks = m.num_chunks();
      std::set<std::string> seen;
      for (const PartLayout& p : m.parts()) {
        for (const TensorLayout& t : p.tensors) {
          if (!t.sharded()) {
            vi.tensors.push_back(TensorInfo{t.spec, p.rank, t.bytes});
            continue;
          }
          // A logical tensor held as pieces: once, with its global shape
          // (what a full fetch allocates), at the first part holding some.
          if (!seen.insert(t.spec.name).second) continue;
          TensorSpec global{t.spec.name, t.spec.dtype, t.GlobalShape()};
          vi.tensors.push_back(
              TensorInfo{global, p.rank, global.ByteSize().value()});
        }
        vi.metadata.insert(vi.metadata.end(), p.metadata.begin(),
                           p.metadata.end());
      }
    }
    for (const client::ResolvedSource& s : r.sources) {
      HolderInfo h;
      h.worker = s.worker;
      h.data_address = s.data_address;
      h.labels = s.labels;
      h.worker_class = s.worker_class;
      for (const auto& [b, e] : s.chunks) h.chunks += e - b;
      h.filling = s.filling;
      vi.holders.push_back(std::move(h));
    }
    vi.num_holders = r.num_holders;
    return vi;
  }

  WorkerId id() const {
    MutexLock lock(mu_);
    return id_;
  }
  const WorkerId& id_ref() const { return id_; }
  std::string data_address() const { return data_address_; }
  std::string metrics_address() const {
    return metrics_server_ ? metrics_server_->address() : std::string();
  }
  client::ClientMetrics& metrics() { return metrics_; }
  // What GET /metrics answers, with or without a metrics endpoint.
  std::string MetricsText() {
    auto scrape_time = std::make_shared<metrics::FunctionCollector>(
        [this] { return ScrapeTimeFamilies(); });
    return metrics::Render({metrics_.registry(), scrape_time});
  }

 private:
  static std::string Describe(const TensorSpec& s) {
    std::string out(DTypeName(s.dtype));
    out += "[";
    for (size_t i = 0; i < s.shape.size(); ++i) {
      out += (i ? "," : "") + std::to_string(s.shape[i]);
    }
    return out + "]";
  }

  // The chunk checksum a publish names: the options', else the
  // environment's TENSORHUB_CHUNK_CHECKSUM, else the tree.
  static Result<ChunkChecksum> PublishChecksum(const PublishOptions& opts) {
    std::string name = opts.chunk_checksum;
    const char* from = "PublishOptions::chunk_checksum";
    if (name.empty()) {
      const char* env = std::getenv("TENSORHUB_CHUNK_CHECKSUM");
      if (env == nullptr || *env == '\0') return kDefaultChunkChecksum;
      name = env;
      from = "TENSORHUB_CHUNK_CHECKSUM";
    }
    Result<ChunkChecksum> kind = ParseChunkChecksum(name);
    if (!kind.ok())
      return kind.status().WithContext(std::string("publish: ") + from);
    return kind;
  }

  // The one memory all `tensors` are in, checked usable here: a call takes
  // tensors of one memory (host, or one CUDA device).
  static Result<MemoryLocation> CheckMemory(
      const std::vector<TensorRef>& tensors, const char* what) {
    if (tensors.empty()) return MemoryLocation::Host();
    const MemoryLocation memory = tensors.front().memory;
    for (const TensorRef& t : tensors) {
      if (!(t.memory == memory)) {
        return InvalidArgument(std::string(what) + ": tensor '" + t.spec.name +
                               "' is in " + MemoryLocationName(t.memory) +
                               " but '" + tensors.front().spec.name +
                               "' is in " + MemoryLocationName(memory) +
                               "; one call takes tensors of one memory");
      }
    }
    TH_RETURN_IF_ERROR(cuda::CheckLocation(memory).WithContext(what));
    if (memory.is_host()) return memory;
    for (const TensorRef& t : tensors) {
      if (t.data == nullptr) continue;  // caught with a clearer message later
      TH_RETURN_IF_ERROR(
          cuda::CheckDevicePointer(t.data, t.bytes, memory.device)
              .WithContext(std::string(what) + ": tensor '" + t.spec.name +
                           "'"));
    }
    return memory;
  }

  std::vector<client::FetchSource> ToSources(
      const std::vector<client::ResolvedSource>& sources) const {
    std::vector<client::FetchSource> out;
    for (const client::ResolvedSource& s : sources) {
      const std::string dial =
          client::DialAddress(dial_preference_, s.data_address, s.endpoints);
      out.push_back({s.worker.value(), dial, s.epoch, s.chunks, s.filling,
                     client::LoopbackHolderHint(
                         s.worker.value(), s.data_address, s.labels.host,
                         options_.labels.host, data_address_,
                         options_.hub_address, hub_is_loopback_),
                     s.slices, dial == s.data_address ? "" : s.data_address});
    }
    return out;
  }

  // Warns, once, when this worker starts serving (its first publish, or
  // fetch that serves) if readers on other hosts cannot reach it
  // (reachability.h).
  void WarnIfUnreachable() {
    if (reach_checked_.exchange(true)) return;
    const std::string warning = client::LoopbackDataPlaneWarning(
        options_.hub_address, hub_is_loopback_, data_address_);
    if (!warning.empty()) TH_LOG(WARN) << warning;
  }

  // The figures this worker keeps anyway, read when scraped (a scrape
  // thread; metrics_server_ stops before what they read goes away).
  std::vector<prometheus::MetricFamily> ScrapeTimeFamilies() const {
    using metrics::AddSample;
    std::vector<prometheus::MetricFamily> out;
    const uint64_t served = server_->bytes_served();
    const uint64_t local = server_->bytes_served_local();
    uint64_t tcp = served - std::min(served, local);
    auto bytes = metrics::CounterFamily(
        "tensorhub_served_bytes_total",
        "Bytes this worker served to readers, by path (same_host: copied by "
        "a reader on this host from this process's memory)");
    for (const auto& [name, sent] : server_->bytes_sent_by_others()) {
      tcp -= std::min(tcp, sent);
      AddSample(bytes, {{"path", name}}, static_cast<double>(sent));
    }
    AddSample(bytes, {{"path", DataPathLabel(client::DataPath::kTcp)}},
              static_cast<double>(tcp));
    AddSample(bytes, {{"path", DataPathLabel(client::DataPath::kSameHost)}},
              static_cast<double>(local));
    out.push_back(std::move(bytes));
    auto refused_reads = metrics::CounterFamily(
        "tensorhub_serve_refusals_total",
        "Reads and data connections this worker refused, by reason "
        "(read: unknown, revoked or unready data; auth: the peer did not "
        "prove the shared secret)");
    AddSample(refused_reads, {{"reason", "read"}},
              static_cast<double>(registry_.reads_refused()));
    AddSample(refused_reads, {{"reason", "auth"}},
              static_cast<double>(server_->connections_refused()));
    out.push_back(std::move(refused_reads));
    auto in_flight =
        metrics::GaugeFamily("tensorhub_serve_reads_in_flight",
                             "Reads of this worker's memory in flight now");
    AddSample(in_flight, {}, static_cast<double>(registry_.reads_in_flight()));
    out.push_back(std::move(in_flight));
    const client::Registry::HeldCounts held = registry_.held();
    auto versions = metrics::GaugeFamily(
        "tensorhub_held_versions",
        "Versions this worker holds and serves, by state (filling: a fetch "
        "still receiving it)");
    AddSample(versions, {{"state", "complete"}},
              static_cast<double>(held.complete));
    AddSample(versions, {{"state", "filling"}},
              static_cast<double>(held.filling));
    out.push_back(std::move(versions));
    return out;
  }

  static constexpr int64_t kUnavailableConfirmMs = 200;
  // Between asks to a hub that did not answer or asked to try again.
  static constexpr int64_t kHubRetryPauseMs = 100;
  // Sources asked for the manifest before the hub is.
  static constexpr int kManifestSourcesTried = 3;

  static uint32_t MaxSources(int wanted) {
    return static_cast<uint32_t>(std::clamp(wanted, 1, 16));
  }

  // BeginFetch, retrying while the hub is unreachable (it may be
  // restarting), until the deadline.
  Result<client::FetchStart> BeginFetchWithin(
      const std::string& model, Version version, const Deadline& deadline,
      const std::string& group, uint64_t group_step, uint32_t max_sources,
      std::optional<uint64_t> fill_epoch) {
    int unavailable_answers = 0;
    uint64_t retryable_answers = 0;
    while (true) {
      Result<client::FetchStart> r = hub_->BeginFetch(
          id(), model, version, group, group_step, max_sources, fill_epoch,
          std::max<int64_t>(1, deadline.remaining_ms()),
          /*manifest_from_sources=*/true);
      if (r.ok() && r->resolved.state == VersionState::kUnavailable) {
        // The hub's own answer (not an unreachable hub): committed, but no
        // complete holder is left. Filling holders may still have chunks:
        // the fetch tries them and gives up when they cannot finish. With
        // none, asking once more (a passing moment of the hub's table must
        // not end a fetch) is all that is worth doing.
        const std::string why =
            "'" + model + "@" + std::to_string(r->resolved.version.value()) +
            "' is committed but no live worker holds all of its chunks";
        if (!r->resolved.sources.empty() || !r->first.sources.empty()) {
          TH_LOG(INFO) << "fetch: the hub says " << why << "; trying the "
                       << r->resolved.sources.size()
                       << " partial holder(s) it lists";
          return r;
        }
        if (r->filling) {
          (void)hub_->Unpublish(id(), model, r->resolved.version, 0,
                                /*force=*/true,
                                std::max<int64_t>(1, deadline.remaining_ms()));
        }
        if (++unavailable_answers >= 2 || deadline.remaining_ms() < 400) {
          return Unavailable(why + ": the hub said so twice, " +
                             std::to_string(kUnavailableConfirmMs) +
                             " ms apart, and lists no holder to try");
        }
        metrics_.HubRetry(kUnavailableConfirmMs / 1000.0);
        clock_.SleepMs(kUnavailableConfirmMs);
        continue;
      }
      if (r.ok()) return r;
      StatusCode c = r.status().code();
      if ((c != StatusCode::kUnavailable &&
           c != StatusCode::kDeadlineExceeded) ||
          deadline.remaining_ms() < 200) {
        return r.status();
      }
      testpoint::Hit("fetch.hub_unavailable", ++retryable_answers);
      metrics_.HubRetry(kHubRetryPauseMs / 1000.0);
      clock_.SleepMs(kHubRetryPauseMs);
    }
  }

  // Which source served a fetch's manifest (TakeManifest).
  struct ManifestOrigin {
    std::string source;  // the address it was read at; empty: the hub
    uint64_t bytes = 0;
  };

  // The version's manifest, when the hub named it by its SHA-256 instead
  // of sending it (docs/design.md, "The manifest from a source"): read
  // from the first of the hub's sources that serves it (kManifestPart) and
  // checked against the SHA-256; if none of the first few does, from the
  // hub (Resolve), with a warning that says why. A wrong manifest is never
  // taken: one that fails the check counts as a failed source. `origin`:
  // which source served it, for FetchStats (left empty: the hub).
  Status TakeManifest(const std::string& model, const std::string& vname,
                      client::FetchStart* start, const Deadline& work,
                      ManifestOrigin* origin) {
    client::Resolved& r = start->resolved;
    if (r.manifest.has_value()) {
      metrics_.ManifestTaken(/*from_source=*/false);
      return Status::Ok();
    }
    if (!start->manifest_ref.has_value()) {
      return Internal("the hub resolved " + vname + " without a manifest");
    }
    const client::ManifestRef& ref = *start->manifest_ref;
    std::string failures;
    int tried = 0;
    for (const client::FetchSource& src : ToSources(start->first.sources)) {
      if (tried++ == kManifestSourcesTried || work.remaining_ms() < 2) break;
      // Each try gets a share of the time left, so that the hub remains
      // to be asked.
      const Deadline d = Deadline::AfterMs(
          std::max<int64_t>(1, work.remaining_ms() / 3), clock_);
      Result<Manifest> m = ReadManifest(src, model, r.version, ref, d);
      if (m.ok()) {
        r.manifest = std::move(m).value();
        origin->source = src.address;
        origin->bytes = ref.size;
        metrics_.ManifestTaken(/*from_source=*/true, ref.size);
        return Status::Ok();
      }
      failures += (failures.empty() ? "" : "; ") + src.address + ": " +
                  m.status().ToString();
    }
    TH_LOG(WARN) << "fetch " << vname
                 << ": taking the manifest from the hub, as no source served "
                    "it ("
                 << (failures.empty() ? "the hub listed none" : failures)
                 << ")";
    Result<client::Resolved> again =
        hub_->Resolve(id(), model, r.version, /*include_uncommitted=*/false, "",
                      0, std::max<int64_t>(1, work.remaining_ms()));
    if (!again.ok()) {
      return again.status().WithContext(
          "fetch " + vname +
          ": the manifest (no source served it: " + failures + ")");
    }
    if (!again->manifest.has_value()) {
      return Internal("the hub resolved " + vname + " without a manifest");
    }
    r.manifest = std::move(again->manifest);
    metrics_.ManifestTaken(/*from_source=*/false);
    return Status::Ok();
  }

  // One read of a source's manifest part, checked and decoded.
  Result<Manifest> ReadManifest(const client::FetchSource& src,
                                const std::string& model, Version v,
                                const client::ManifestRef& ref,
                                const Deadline& d) {
    TH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Connection> conn,
                        transport_->Connect(src.address, d));
    wire::ReadRequest req;
    req.model = model;
    req.version = v.value();
    req.epoch = src.epoch;
    req.part = client::kManifestPart;
    req.length = ref.size;
    std::string bytes(ref.size, '\0');
    const iovec dest{bytes.data(), bytes.size()};
    TH_RETURN_IF_ERROR(conn->Read(req, {&dest, 1}, d));
    if (wire::Sha256Of(bytes) != ref.sha256) {
      return DataLoss(
          "the manifest it served is not the one the hub named (SHA-256 "
          "differs)");
    }
    return wire::DecodeManifest(bytes, "the manifest it served");
  }

  // Registers the fetch destination, under the reserved epoch, as a
  // filling holder: it serves each chunk once verified. `reported`: the hub
  // took the registration (BeginFetch); if not, the heartbeat thread
  // reports it later. Best effort: without it we only fetch.
  std::optional<uint64_t> BeginFill(const std::string& model, Version version,
                                    const Manifest& manifest,
                                    const client::FetchJob& job,
                                    EpochReservation& reserved, bool reported) {
    Holding h;
    h.model = model;
    h.version = version;
    h.epoch = *reserved.epoch();
    h.group_size = manifest.group_size();
    h.chunk_bytes = manifest.chunk_bytes();
    h.manifest = manifest;
    h.filling = true;
    h.memory = job.memory;
    for (const PartLayout& p : manifest.parts()) {
      h.parts[p.rank] = p;
      h.bases[p.rank] = job.dest_bases[p.rank];
    }
    Result<uint64_t> epoch = registry_.Add(std::move(h));
    if (!epoch.ok()) {
      TH_LOG(WARN) << "not serving '" << model << "@" << version.value()
                   << "': " << epoch.status().ToString();
      return std::nullopt;
    }
    reserved.Used();
    if (reported) registry_.MarkReported(model, version, *epoch, true);
    return *epoch;
  }

  // The fetch finished: serve the whole copy and tell the hub.
  void EndFill(const std::string& model, Version version,
               const Manifest& manifest, uint64_t epoch,
               const Deadline& deadline) {
    registry_.FinishFill(model, version, epoch);
    Status s = hub_->AddHolder(id(), model, version, epoch, manifest, false,
                               deadline.remaining_ms());
    registry_.MarkReported(model, version, epoch, s.ok());
    if (!s.ok()) {
      // The fetch itself succeeded; the heartbeat thread reports the copy
      // once the hub answers again.
      TH_LOG(WARN) << "fetched '" << model << "@" << version.value()
                   << "' but could not tell the hub yet: " << s.ToString();
    }
  }

  // The fetch failed: stop serving the partial copy (its memory may be
  // overwritten by the caller as soon as we return).
  void AbortFill(const std::string& model, Version version,
                 std::optional<uint64_t> epoch, const Deadline& deadline) {
    if (!epoch.has_value()) return;
    Result<uint64_t> revoked = registry_.Revoke(model, version);
    if (revoked.ok()) {
      // Fenced at once; reads already admitted get until the deadline. One
      // still running then reads memory the caller may overwrite: the
      // reader's chunk checksum catches that and it reads elsewhere.
      Status d = TimedDrain(model, version, *revoked, deadline);
      if (!d.ok()) TH_LOG(WARN) << "abandoned fetch: " << d.ToString();
    }
    // A filling copy never counts as a copy to keep: no wait, force.
    Status s = hub_->Unpublish(id(), model, version, 0, /*force=*/true,
                               std::max<int64_t>(1, deadline.remaining_ms()));
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      MutexLock lock(mu_);
      pending_unpublish_.insert({model, version});
    }
  }

  // The configured interval, or the one the hub planned for its fleet
  // (it grows with the fleet, docs/design.md "Heartbeats"), at most a third
  // of the lease it granted (so that two heartbeats may be lost before it
  // expires). From a hub that names no interval: a third of its lease,
  // within [kMinHeartbeatMs, kMaxHeartbeatMs], the bound keeping a hub
  // restart noticed soon even under a long lease.
  static constexpr int64_t kMinHeartbeatMs = 50;
  static constexpr int64_t kMaxHeartbeatMs = 5000;
  static int64_t HeartbeatIntervalMs(const ClientOptions& o,
                                     const client::ControlPlane& hub) {
    if (o.heartbeat_interval_ms > 0) return o.heartbeat_interval_ms;
    const int64_t lease_ms = hub.lease_ms();
    if (lease_ms <= 0) return 1000;
    const int64_t planned_ms = hub.heartbeat_interval_ms();
    if (planned_ms > 0) {
      return std::clamp<int64_t>(planned_ms, kMinHeartbeatMs,
                                 std::max(kMinHeartbeatMs, lease_ms / 3));
    }
    return std::clamp<int64_t>(lease_ms / 3, kMinHeartbeatMs, kMaxHeartbeatMs);
  }

  // How often a running fetch reports its progress (for `tensorhub top`):
  // every second, unless the hub stretched the heartbeat interval beyond
  // its base (at most 5 s) because the fleet is over its heartbeat budget:
  // then at that interval, so that a fan-out to the whole fleet costs the
  // hub no more calls per second than its heartbeats.
  static int64_t ProgressIntervalMs(const client::ControlPlane& hub) {
    constexpr int64_t kProgressMs = 1000;
    const int64_t planned_ms = hub.heartbeat_interval_ms();
    return planned_ms > kMaxHeartbeatMs ? planned_ms : kProgressMs;
  }

  void HeartbeatLoop() {
    MutexLock lock(mu_);
    while (!stopping_) {
      // Real time whatever clock_ is (ClientDeps::clock): this paces I/O.
      cv_.wait_for(lock.native(), std::chrono::milliseconds(
                                      HeartbeatIntervalMs(options_, *hub_)));
      if (stopping_) break;
      WorkerId id = id_;
      lock.Unlock();
      Status s = hub_->Heartbeat(id);
      if (s.code() == StatusCode::kNotFound) {
        TH_LOG(INFO) << "hub forgot worker " << id.value()
                     << " (restart or lease expiry); registering again";
        Rejoin(id);
      } else if (!s.ok()) {
        TH_LOG(DEBUG) << "heartbeat: " << s.ToString();
      } else {
        RetryPending(id);
        SendDoneReports();
      }
      lock.Lock();
    }
  }

  // Re-registers under the same id and re-reports every reference: this is
  // how a restarted hub rebuilds its table.
  void Rejoin(const WorkerId& id) {
    Result<WorkerId> r = hub_->Register(
        id, options_.name, data_address_, endpoints_, options_.labels,
        options_.worker_class, options_.rpc_timeout_ms);
    if (!r.ok()) {
      TH_LOG(WARN) << "re-register: " << r.status().ToString();
      return;
    }
    registry_.MarkAllUnreported();
    RetryPending(id);
  }

  void RetryPending(const WorkerId& id) {
    std::set<std::pair<std::string, Version>> unpub;
    {
      MutexLock lock(mu_);
      unpub.swap(pending_unpublish_);
    }
    for (const auto& [m, v] : unpub) {
      // Revoked here already: the bytes are no longer served, so the hub
      // must drop the reference even if it was a retained version's last.
      Status s = hub_->Unpublish(id, m, v, 0, /*force=*/true);
      if (!s.ok() && s.code() != StatusCode::kNotFound) {
        MutexLock lock(mu_);
        pending_unpublish_.insert({m, v});
      }
    }
    for (const Holding& h : registry_.Unreported()) {
      // A part whose own Publish has not been acknowledged yet: that call
      // reports it (as a new version, not a rebuild).
      if (!h.manifest.has_value() && !h.accepted && !h.slices) continue;
      Status s;
      if (h.slices) {
        s = hub_->AddSliceHolder(id, h.model, h.version, h.epoch,
                                 h.parts.at(client::kSliceHolderPart));
      } else if (h.manifest.has_value()) {
        s = hub_->AddHolder(id, h.model, h.version, h.epoch, *h.manifest,
                            h.filling);
      } else {
        s = hub_->Publish(id, h.model, h.version, *h.rank, h.group_size,
                          h.chunk_bytes, h.parts.at(*h.rank), h.epoch, true,
                          options_.rpc_timeout_ms);
      }
      if (s.ok()) {
        registry_.MarkReported(h.model, h.version, h.epoch, true);
      } else {
        TH_LOG(WARN) << "re-report '" << h.model << "@" << h.version.value()
                     << "': " << s.ToString();
      }
    }
  }

  ClientOptions options_;
  const Clock& clock_;  // not owned (ClientDeps::clock)
  std::unique_ptr<ControlPlane> hub_;
  std::unique_ptr<transport::Transport> transport_;
  Registry registry_;
  std::unique_ptr<transport::Server> server_;
  std::string data_address_;  // its TCP data server, as advertised
  // The other transports it serves (advertised), and the order in which it
  // dials a holder's (transport_set.h).
  std::vector<DataEndpoint> endpoints_;
  std::vector<std::string> dial_preference_;
  // Whether the hub is on loopback (reachability.h), set by Start.
  bool hub_is_loopback_ = true;
  std::atomic<bool> reach_checked_{false};  // WarnIfUnreachable ran
  client::ClientMetrics metrics_;
  std::shared_ptr<metrics::FunctionCollector> collector_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  WorkerId id_ TH_GUARDED_BY(mu_);
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  std::set<std::pair<std::string, Version>> pending_unpublish_
      TH_GUARDED_BY(mu_);
  std::deque<client::ProgressUpdate> done_reports_ TH_GUARDED_BY(mu_);
  std::thread heartbeat_;
};

namespace client {

namespace {

// The transports asked for, in order: the options', else the
// environment's TENSORHUB_TRANSPORTS, else tcp.
std::vector<std::string> WantedTransports(const ClientOptions& options) {
  if (!options.transports.empty()) return options.transports;
  std::vector<std::string> out;
  const char* env = std::getenv("TENSORHUB_TRANSPORTS");
  std::string list = env != nullptr ? env : "";
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  if (out.empty()) out.push_back("tcp");
  return out;
}

// A holder gives each UCX reader connection a worker of its own, which
// costs descriptors: about 13 with every UCX wire allowed, 9 with tcp alone
// (`tensorhub bench ucx` prints it; docs/design.md, UCX data plane). Says
// so at start-up where this process may not open enough for its
// connection cap: readers past it would be sent to tcp.
void WarnIfTooFewDescriptorsForUcx(size_t max_serving_connections) {
  constexpr uint64_t kPerUcxConnection = 14;
  constexpr uint64_t kForTheRest = 256;  // hub channel, fetches, files
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) {
    return;
  }
  const uint64_t want =
      max_serving_connections * kPerUcxConnection + kForTheRest;
  if (lim.rlim_cur >= want) return;
  const bool hard = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want;
  TH_LOG(WARN) << "data plane: ucx: this process may open " << lim.rlim_cur
               << " descriptors (ulimit -n), and serving "
               << max_serving_connections
               << " UCX readers (max_serving_connections) takes about " << want
               << "; readers past the limit are sent to tcp. Raise it ('ulimit "
                  "-n "
               << want << "'"
               << (hard ? ", above the hard limit of " +
                              std::to_string(lim.rlim_max) + ": as root"
                        : std::string())
               << ", or LimitNOFILE= in a systemd unit), or lower "
                  "max_serving_connections";
}

// TCP, which every worker serves and reads (the fallback), and besides it
// each other transport of the list this build and machine can run, in the
// list's order (transport_set.h). With data-plane TLS (`tls`), TCP alone:
// UCX would move the bytes in the clear.
std::unique_ptr<transport::Transport> PickTransports(
    const ClientOptions& options, std::shared_ptr<const tls::Context> tls) {
  std::vector<std::unique_ptr<transport::Transport>> others;
  for (const std::string& name : WantedTransports(options)) {
    if (name == "tcp") continue;
    if (name == "ucx" && tls != nullptr) {
      TH_LOG(WARN) << "data plane: ucx skipped: data-plane TLS (data_tls) "
                      "runs over tcp, and UCX would move the bytes in the "
                      "clear";
      continue;
    }
    if (name == "ucx") {
      if (!others.empty()) continue;  // listed twice
      transport::UcxTransportOptions u;
      u.secret = options.secret;
      // A holder on this host is read over TCP (its cross-memory attach)
      // unless UCX on one host is what is wanted (tests, benchmarks).
      const char* same_host_env = std::getenv("TENSORHUB_UCX_SAME_HOST");
      u.refuse_same_host =
          !options.ucx_same_host &&
          (same_host_env == nullptr || std::string(same_host_env) != "1");
      Result<std::unique_ptr<transport::Transport>> t =
          transport::MakeUcxTransport(u);
      if (t.ok()) {
        WarnIfTooFewDescriptorsForUcx(options.max_serving_connections);
        others.push_back(std::move(t).value());
        continue;
      }
      TH_LOG(WARN) << "data plane: ucx asked for but unavailable ("
                   << t.status().ToString() << "); serving and reading tcp";
      continue;
    }
    TH_LOG(WARN) << "data plane: unknown transport '" << name
                 << "' skipped (known: ucx, tcp)";
  }
  transport::TcpTransportOptions t = transport::TcpTransportOptions::FromEnv();
  t.secret = options.secret;  // the data plane requires the hub's secret too
  t.tls = std::move(tls);
  std::unique_ptr<transport::Transport> set =
      MakeTransportSet(transport::MakeTcpTransport(t), std::move(others));
  TH_LOG(INFO) << "data plane: " << set->name() << (t.tls ? " with TLS" : "")
               << " (reads use the first of these a holder serves)";
  return set;
}

}  // namespace

Result<ClientDeps> DefaultClientDeps(const ClientOptions& options) {
  TH_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(options));
  ClientDeps deps;
  deps.transport = PickTransports(options, tls.data);
  deps.control =
      MakeGrpcControlPlane(options.hub_address, options.secret,
                           options.rpc_timeout_ms, std::move(tls.hub));
  deps.clock = &Clock::Real();
  return deps;
}

ClientMetrics& ClientFactory::Metrics(Client& client) {
  return client.impl_->metrics();
}

std::string ClientFactory::MetricsText(Client& client) {
  return client.impl_->MetricsText();
}

Result<std::unique_ptr<Client>> ClientFactory::Connect(
    const ClientOptions& options, ClientDeps deps) {
  if (!deps.transport || !deps.control || deps.clock == nullptr) {
    return InvalidArgument(
        "client: a transport, a control plane and a clock are all needed");
  }
  auto impl = std::make_unique<Client::Impl>(options, std::move(deps));
  TH_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

}  // namespace client

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  TH_ASSIGN_OR_RETURN(client::ClientDeps deps,
                      client::DefaultClientDeps(options));
  return client::ClientFactory::Connect(options, std::move(deps));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Publish(std::string_view model, Version version,
                       const std::vector<TensorRef>& tensors,
                       const PublishOptions& options) {
  return impl_->Publish(model, version, tensors, options);
}

Status Client::Unpublish(std::string_view model, Version version,
                         int64_t timeout_ms, bool force) {
  return impl_->Unpublish(model, version, timeout_ms, force);
}

Status Client::Retain(std::string_view model, Version version) {
  return impl_->Retain(model, version, true);
}

Status Client::Unretain(std::string_view model, Version version) {
  return impl_->Retain(model, version, false);
}

Result<FetchStats> Client::Fetch(std::string_view model, Version version,
                                 const std::vector<TensorRef>& destination,
                                 const FetchOptions& options) {
  return impl_->Fetch(model, version, destination, options);
}

Result<FetchStats> Client::FetchSlices(std::string_view model, Version version,
                                       const std::vector<TensorSlice>& slices,
                                       const FetchOptions& options) {
  return impl_->FetchSlices(model, version, slices, options);
}

Result<std::vector<ModelInfo>> Client::List() { return impl_->List(); }

Result<VersionInfo> Client::Describe(std::string_view model, Version version) {
  return impl_->DescribeVersion(model, version);
}

Result<VersionInfo> Client::Describe(std::string_view model, Version version,
                                     std::string_view group,
                                     uint64_t group_step) {
  if (group.empty()) return InvalidArgument("reader group id is empty");
  return impl_->DescribeVersion(model, version, std::string(group), group_step);
}

const WorkerId& Client::id() const { return impl_->id_ref(); }
std::string Client::data_address() const { return impl_->data_address(); }
std::string Client::metrics_address() const { return impl_->metrics_address(); }

}  // namespace tensorhub
