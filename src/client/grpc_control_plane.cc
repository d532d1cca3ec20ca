// The control plane over gRPC: a channel to the hub (to each hub of an HA
// set, following the leader), a deadline on every call, a proof of the
// shared secret attached, and protobuf converted to our types at this
// boundary. The
// generated gRPC and protobuf types appear in this file only.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "client/client_tls.h"
#include "client/control_plane.h"
#include "common/deadline.h"
#include "common/mutex.h"
#include "common/refusal_log.h"
#include "tensorhub.grpc.pb.h"
#include "wire/call_proof.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {
namespace {

// Asks of one Register call (see GrpcControlPlane::Register).
constexpr int kRegisterAttempts = 8;
// At most this long, after a Register that could not reach the hub, to see
// whether TLS is the reason.
constexpr int64_t kDiagnoseMs = 3000;
// The trailers of an HA hub's answers (hub_service.cc): a standby names
// the leader ("" if none is known); a leader marks its UNAVAILABLE answers
// (e.g. "rebuilding") as its own, so that they are returned, not retried
// on another hub.
constexpr char kLeaderTrailer[] = "th-leader";
constexpr char kRoleTrailer[] = "th-role";
// Hubs a client keeps channels to: those it was given (a leader named by a
// standby is followed only if it is one of them).
constexpr size_t kMaxTargets = 16;
// After trying as many hubs as it knows without reaching a leader (an
// election is under way), a call pauses this long before the next round,
// within its deadline.
constexpr int64_t kNoLeaderPauseMs = 100;
// How long a call waits for a channel in TRANSIENT_FAILURE to connect
// before it calls (see Connected()).
constexpr int64_t kReconnectProbeMs = 250;

std::vector<std::string> SplitAddresses(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string a = list.substr(pos, comma - pos);
    a.erase(0, a.find_first_not_of(' '));
    a.erase(a.find_last_not_of(' ') + 1);
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) {
      out.push_back(a);
    }
    pos = comma + 1;
  }
  if (out.empty()) out.push_back(list);
  return out;
}

class GrpcControlPlane final : public ControlPlane {
 public:
  // `addresses`: one hub, or the hubs of an HA set, comma-separated.
  GrpcControlPlane(const std::string& addresses, std::string secret,
                   int64_t rpc_timeout_ms, HubTls tls);

  Result<WorkerId> Register(const WorkerId& old_id, const std::string& name,
                            const std::string& data_address,
                            const std::vector<DataEndpoint>& endpoints,
                            const Labels& labels, WorkerClass worker_class,
                            bool nearby_deltas, int64_t timeout_ms) override;
  Status Heartbeat(const WorkerId& id) override;
  Status Publish(const WorkerId& id, const std::string& model, Version version,
                 uint32_t rank, uint32_t group_size, uint64_t chunk_bytes,
                 const PartLayout& part, uint64_t epoch, bool rebuild,
                 int64_t timeout_ms) override;
  Status AddHolder(const WorkerId& id, const std::string& model,
                   Version version, uint64_t epoch, const Manifest& manifest,
                   bool filling, int64_t timeout_ms) override;
  Result<Scheduled> Schedule(const WorkerId& reader, const std::string& model,
                             Version version,
                             const std::vector<WorkerId>& exclude,
                             uint32_t max_sources, int64_t timeout_ms) override;
  Result<Scheduled> ScheduleSlices(const WorkerId& reader,
                                   const std::string& model, Version version,
                                   const std::vector<WorkerId>& exclude,
                                   uint32_t max_sources,
                                   const std::vector<SliceWant>& wants,
                                   int64_t timeout_ms) override;
  Result<Scheduled> Recheck(const WorkerId& reader, const std::string& model,
                            Version version, uint32_t max_sources,
                            int64_t timeout_ms) override;
  Status AddSliceHolder(const WorkerId& id, const std::string& model,
                        Version version, uint64_t epoch,
                        const PartLayout& slices, int64_t timeout_ms) override;
  Status FetchDone(const WorkerId& reader, const std::string& model,
                   Version version, int64_t timeout_ms) override;
  Result<bool> ReportDelta(const WorkerId& id, const std::string& model,
                           Version version, Version base, DeltaAction action,
                           uint64_t bytes, int64_t timeout_ms) override;
  Status Unpublish(const WorkerId& id, const std::string& model,
                   Version version, int64_t wait_ms, bool force,
                   int64_t timeout_ms) override;
  Result<Resolved> Resolve(const WorkerId& reader, const std::string& model,
                           Version version, bool include_uncommitted,
                           const std::string& group, uint64_t group_step,
                           int64_t timeout_ms) override;
  Result<FetchStart> BeginFetch(const WorkerId& reader,
                                const std::string& model, Version version,
                                const std::string& group, uint64_t group_step,
                                uint32_t max_sources,
                                std::optional<uint64_t> fill_epoch,
                                int64_t timeout_ms,
                                bool manifest_from_sources) override;
  Result<std::vector<ModelInfo>> List() override;
  Status Leave(const WorkerId& id, int64_t timeout_ms,
               int64_t wait_ms) override;
  Status Retain(const std::string& model, Version version,
                bool retain) override;
  Result<KeeperPollResult> KeeperPoll(const WorkerId& keeper,
                                      int64_t wait_ms) override;
  Status ReportProgress(const WorkerId& reader, const ProgressUpdate& update,
                        int64_t timeout_ms) override;
  Result<HubSnapshot> Snapshot(const SnapshotLimits& limits) override;
  int64_t lease_ms() const override { return lease_ms_.load(); }
  int64_t heartbeat_interval_ms() const override {
    return heartbeat_interval_ms_.load();
  }

 private:
  // One hub the client may call.
  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Hub::Stub> stub;
  };
  // gRPC keeps a channel whose last connection failed in TRANSIENT_FAILURE
  // until a new connection is READY, and fails calls at once meanwhile;
  // a reconnection completes only while some thread polls the channel,
  // which a call failed at once does not. So a hub that came back (a
  // restart, a standby elected) would stay unreachable to calls that fail
  // fast. Waiting for the channel (bounded) lets the connection complete.
  static void Connected(const Target& t, const Deadline& deadline);
  static std::shared_ptr<Target> MakeTarget(const std::string& address,
                                            const HubTls& tls);
  int64_t Within(int64_t timeout_ms) const {
    return timeout_ms < 0 ? rpc_timeout_ms_
                          : std::min(timeout_ms, rpc_timeout_ms_);
  }
  // One unary call with the secret set, within timeout_ms in all: to the
  // hub that answered last; in an HA set, on to the leader a standby names
  // (or to the next hub while no leader is known or a hub is unreachable)
  // until a leader answers or the time is up.
  template <typename Req, typename Resp>
  Status Call(grpc::Status (v1::Hub::Stub::*method)(grpc::ClientContext*,
                                                    const Req&, Resp*),
              Req& req, Resp* resp, const char* what, int64_t timeout_ms,
              bool wait_for_ready = false);
  std::shared_ptr<Target> Current();
  // `from` answered "not the leader" (naming `leader`, or "" for none
  // known) or could not be reached: the next call goes to the leader, or
  // to the next hub. Returns whether there is another hub to go to.
  bool MoveOn(const Target& from, const std::string& leader);
  Status Check(const grpc::Status& s, const char* what,
               const std::string& address) const;
  static Result<ResolvedSource> FromProto(const v1::Holder& h);
  // Schedule and Recheck: one request, the same answer.
  Result<Scheduled> SendSchedule(v1::ScheduleRequest& req, int64_t timeout_ms);
  // A manifest the hub sent encoded (empty: none yet).
  static Result<std::optional<Manifest>> ParseManifest(const std::string& bytes,
                                                       const char* what);

  const std::string secret_;
  const int64_t rpc_timeout_ms_;
  const HubTls tls_;
  std::atomic<int64_t> lease_ms_{0};               // the hub's last answer's
  std::atomic<int64_t> heartbeat_interval_ms_{0};  // likewise
  const std::string given_;  // the addresses given, as given
  RefusalLog hints_refused_{"hub client"};
  Mutex mu_;
  // The hubs given (at most kMaxTargets).
  std::vector<std::shared_ptr<Target>> targets_ TH_GUARDED_BY(mu_);
  size_t current_ TH_GUARDED_BY(mu_) = 0;
};

GrpcControlPlane::GrpcControlPlane(const std::string& addresses,
                                   std::string secret, int64_t rpc_timeout_ms,
                                   HubTls tls)
    : secret_(std::move(secret)),
      rpc_timeout_ms_(rpc_timeout_ms),
      tls_(std::move(tls)),
      given_(addresses) {
  MutexLock lock(mu_);
  for (const std::string& a : SplitAddresses(addresses)) {
    if (targets_.size() < kMaxTargets) targets_.push_back(MakeTarget(a, tls_));
  }
}

std::shared_ptr<GrpcControlPlane::Target> GrpcControlPlane::MakeTarget(
    const std::string& address, const HubTls& tls) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a hub restart instead of backing off for long.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::InsecureChannelCredentials();
  if (tls.enabled()) {
    grpc::SslCredentialsOptions so;
    so.pem_root_certs = tls.ca_pem;
    so.pem_cert_chain = tls.cert_chain_pem;
    so.pem_private_key = tls.key_pem;
    creds = grpc::SslCredentials(so);
    if (!tls.server_name.empty()) {
      args.SetSslTargetNameOverride(tls.server_name);
    }
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  auto t = std::make_shared<Target>();
  t->address = address;
  t->channel = channel;
  t->stub = v1::Hub::NewStub(channel);
  return t;
}

void GrpcControlPlane::Connected(const Target& t, const Deadline& deadline) {
  if (t.channel->GetState(/*try_to_connect=*/true) !=
      GRPC_CHANNEL_TRANSIENT_FAILURE) {
    return;
  }
  const int64_t wait_ms = std::min(kReconnectProbeMs, deadline.remaining_ms());
  (void)t.channel->WaitForConnected(std::chrono::system_clock::now() +
                                    std::chrono::milliseconds(wait_ms));
}

std::shared_ptr<GrpcControlPlane::Target> GrpcControlPlane::Current() {
  MutexLock lock(mu_);
  return targets_[current_];
}

bool GrpcControlPlane::MoveOn(const Target& from, const std::string& leader) {
  MutexLock lock(mu_);
  if (targets_.size() == 1 && (leader.empty() || leader == from.address)) {
    return false;
  }
  // Another call moved on already: go where it went.
  if (targets_[current_].get() != &from) return true;
  if (!leader.empty() && leader != from.address) {
    for (size_t i = 0; i < targets_.size(); ++i) {
      if (targets_[i]->address == leader) {
        current_ = i;
        return true;
      }
    }
    // A hint to a hub this client was not given is not followed: whoever
    // answers as a standby could otherwise send it, and its proofs of the
    // secret, anywhere. The next hub of the set is asked instead, which
    // reaches the leader too if it is one of them.
    hints_refused_.Refused(
        leader, "not following hub " + from.address +
                    "'s leader hint: not one of the hubs this client was "
                    "given (" +
                    given_ +
                    "); give clients the addresses the hubs advertise");
  }
  current_ = (current_ + 1) % targets_.size();
  return true;
}

template <typename Req, typename Resp>
Status GrpcControlPlane::Call(grpc::Status (v1::Hub::Stub::*method)(
                                  grpc::ClientContext*, const Req&, Resp*),
                              Req& req, Resp* resp, const char* what,
                              int64_t timeout_ms, bool wait_for_ready) {
  // The secret is proven in the call's metadata, never sent: the hub
  // checks the proof before it reads the request (wire/call_proof.h).
  req.clear_secret();
  const Deadline deadline = Deadline::AfterMs(std::max<int64_t>(0, timeout_ms));
  Status last;
  for (int attempt = 1;; ++attempt) {
    std::shared_ptr<Target> t = Current();
    if (!wait_for_ready) Connected(*t, deadline);
    grpc::ClientContext ctx;
    if (!secret_.empty()) {
      ctx.AddMetadata(wire::kCallProofKey,
                      wire::MakeCallProof(secret_, wire::UnixNowMs()));
    }
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(deadline.timeout_ms()));
    if (wait_for_ready) ctx.set_wait_for_ready(true);
    grpc::Status s = (t->stub.get()->*method)(&ctx, req, resp);
    if (s.ok()) return Status::Ok();
    if (attempt > 1 && deadline.expired() &&
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // A retry the time ran out on says less than the last answer a hub
      // gave (a standby's "not the leader", say): that one is the reason.
      return last;
    }
    last = Check(s, what, t->address);
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto leader = trailers.find(kLeaderTrailer);
    bool move_on = leader != trailers.end();
    if (!move_on && trailers.find(kRoleTrailer) == trailers.end()) {
      // No hub's answer at all (or a single hub's): unreachable, or a
      // stopped hub that let the call time out. Try another hub of a set.
      move_on = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    }
    if (!move_on) return last;
    const std::string named =
        leader == trailers.end()
            ? std::string()
            : std::string(leader->second.data(), leader->second.size());
    // A standby's answer always leads somewhere, if only to asking again
    // once the election is over; an unreachable hub only to another one.
    const bool moved = MoveOn(*t, named);
    if ((!moved && leader == trailers.end()) || deadline.expired()) {
      return last;
    }
    size_t known = 0;
    {
      MutexLock lock(mu_);
      known = targets_.size();
    }
    if (attempt % std::max<size_t>(2, known) == 0) {
      // Every hub tried and none leads (an election is under way, or the
      // standbys still name a leader that died and whose lease runs on).
      std::this_thread::sleep_for(std::chrono::milliseconds(
          std::min(kNoLeaderPauseMs, deadline.remaining_ms())));
      if (deadline.expired()) return last;
    }
    resp->Clear();
  }
}

Status GrpcControlPlane::Check(const grpc::Status& s, const char* what,
                               const std::string& address) const {
  if (s.ok()) return Status::Ok();
  Status st = wire::FromGrpc(s);
  if (st.code() == StatusCode::kUnavailable ||
      st.code() == StatusCode::kDeadlineExceeded) {
    // The hub unreachable, or reachable and saying "try again" (it is
    // rebuilding its state after a start, or is not the leader of its
    // set): all are worth a retry.
    return Status(st.code(), std::string(what) + ": hub at " + address +
                                 " did not answer, or asked to try again (" +
                                 st.message() + ")");
  }
  return st;
}

Result<WorkerId> GrpcControlPlane::Register(
    const WorkerId& old_id, const std::string& name,
    const std::string& data_address, const std::vector<DataEndpoint>& endpoints,
    const Labels& labels, WorkerClass worker_class, bool nearby_deltas,
    int64_t timeout_ms) {
  v1::RegisterWorkerRequest req;
  req.set_nearby_deltas(nearby_deltas);
  req.set_worker_id(old_id.value());
  req.set_name(name);
  req.set_data_address(data_address);
  for (const DataEndpoint& e : endpoints) {
    v1::DataEndpoint* pe = req.add_endpoints();
    pe->set_transport(e.transport);
    pe->set_address(e.address);
  }
  wire::ToProto(labels, req.mutable_labels());
  req.set_worker_class(worker_class == WorkerClass::kSpot ? v1::SPOT
                                                          : v1::RELIABLE);
  // The first registration may wait for the hub to come up (wait for
  // ready), and is asked again if the hub went away while it was in flight
  // (a hub restarting): up to kRegisterAttempts times within timeout_ms. A
  // registration the old hub took and never answered leaves an id that
  // expires with its lease.
  // With several hubs, a call waiting for one that is down would wait out
  // its deadline there: Call moves on to the next instead.
  bool one_hub = false;
  {
    MutexLock lock(mu_);
    one_hub = targets_.size() == 1;
  }
  const Deadline deadline = Deadline::AfterMs(std::max<int64_t>(0, timeout_ms));
  Status last;
  for (int attempt = 0; attempt < kRegisterAttempts; ++attempt) {
    const int64_t left_ms = deadline.remaining_ms();
    if (attempt > 0 && left_ms <= 0) break;
    v1::RegisterWorkerResponse resp;
    last = Call(&v1::Hub::Stub::RegisterWorker, req, &resp, "register",
                std::max<int64_t>(1, left_ms), /*wait_for_ready=*/one_hub);
    if (last.ok()) {
      lease_ms_.store(resp.lease_ms());
      heartbeat_interval_ms_.store(resp.heartbeat_interval_ms());
      return WorkerId(resp.worker_id());
    }
    if (last.code() != StatusCode::kUnavailable) break;
  }
  if (last.code() == StatusCode::kUnavailable ||
      last.code() == StatusCode::kDeadlineExceeded) {
    // gRPC says only that it could not connect; if TLS is why (one end
    // without it, a certificate missing or not trusted), say that.
    Status why = DiagnoseHubTls(
        Current()->address, tls_,
        Deadline::AfterMs(std::min<int64_t>(rpc_timeout_ms_, kDiagnoseMs)));
    if (!why.ok()) return why;
  }
  return last;
}

Status GrpcControlPlane::Heartbeat(const WorkerId& id) {
  v1::HeartbeatRequest req;
  req.set_worker_id(id.value());
  v1::HeartbeatResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::Heartbeat, req, &resp, "heartbeat",
                          rpc_timeout_ms_));
  lease_ms_.store(resp.lease_ms());
  heartbeat_interval_ms_.store(resp.heartbeat_interval_ms());
  return Status::Ok();
}

Status GrpcControlPlane::Publish(const WorkerId& id, const std::string& model,
                                 Version version, uint32_t rank,
                                 uint32_t group_size, uint64_t chunk_bytes,
                                 const PartLayout& part, uint64_t epoch,
                                 bool rebuild, int64_t timeout_ms) {
  v1::PublishRequest req;
  req.set_worker_id(id.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_rank(rank);
  req.set_group_size(group_size);
  req.set_chunk_bytes(chunk_bytes);
  wire::ToProto(part, req.mutable_part());
  req.set_epoch(epoch);
  req.set_rebuild(rebuild);
  v1::PublishResponse resp;
  return Call(&v1::Hub::Stub::Publish, req, &resp, "publish", timeout_ms);
}

Status GrpcControlPlane::AddHolder(const WorkerId& id, const std::string& model,
                                   Version version, uint64_t epoch,
                                   const Manifest& manifest, bool filling,
                                   int64_t timeout_ms) {
  v1::AddHolderRequest req;
  req.set_worker_id(id.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_epoch(epoch);
  req.set_filling(filling);
  // By digest first: the hub usually has the manifest (the reader resolved
  // it there), and comparing 8 bytes keeps a report O(1) for the hub.
  req.set_manifest_digest(manifest.Digest().value);
  v1::AddHolderResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::AddHolder, req, &resp, "add holder",
                          rpc_timeout_ms_));
  if (!resp.need_manifest()) return Status::Ok();
  // The hub restarted (or has the version only pending): it rebuilds the
  // version from the full manifest.
  wire::ToProto(manifest, req.mutable_manifest());
  resp.Clear();
  return Call(&v1::Hub::Stub::AddHolder, req, &resp, "add holder",
              Within(timeout_ms));
}

Status GrpcControlPlane::Unpublish(const WorkerId& id, const std::string& model,
                                   Version version, int64_t wait_ms, bool force,
                                   int64_t timeout_ms) {
  v1::UnpublishRequest req;
  req.set_worker_id(id.value());
  req.set_model(model);
  req.set_version(version.value());
  wait_ms = std::clamp<int64_t>(wait_ms, 0, 600000);
  req.set_wait_ms(static_cast<uint32_t>(wait_ms));
  req.set_force(force);
  v1::UnpublishResponse resp;
  return Call(&v1::Hub::Stub::Unpublish, req, &resp, "unpublish",
              timeout_ms < 0 ? rpc_timeout_ms_ + wait_ms
                             : std::min(timeout_ms, rpc_timeout_ms_ + wait_ms));
}

Result<Resolved> GrpcControlPlane::Resolve(
    const WorkerId& reader, const std::string& model, Version version,
    bool include_uncommitted, const std::string& group, uint64_t group_step,
    int64_t timeout_ms) {
  v1::ResolveRequest req;
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_include_uncommitted(include_uncommitted);
  req.set_group(group);
  req.set_group_step(group_step);
  v1::ResolveResponse resp;
  TH_RETURN_IF_ERROR(
      Call(&v1::Hub::Stub::Resolve, req, &resp, "resolve", Within(timeout_ms)));
  Resolved out;
  out.version = Version(resp.version());
  out.state = wire::FromProto(resp.state());
  out.num_holders = resp.num_holders();
  out.retained = resp.retained();
  TH_ASSIGN_OR_RETURN(out.manifest, ParseManifest(resp.manifest(), "resolve"));
  for (const v1::Holder& h : resp.holders()) {
    TH_ASSIGN_OR_RETURN(ResolvedSource src, FromProto(h));
    out.sources.push_back(std::move(src));
  }
  return out;
}

Result<std::optional<Manifest>> GrpcControlPlane::ParseManifest(
    const std::string& bytes, const char* what) {
  if (bytes.empty()) return std::optional<Manifest>();
  v1::VersionManifest vm;
  if (!vm.ParseFromString(bytes)) {
    return InvalidArgument(std::string(what) +
                           ": the hub sent a malformed manifest");
  }
  if (vm.group_size() == 0) return std::optional<Manifest>();
  TH_ASSIGN_OR_RETURN(Manifest m, wire::FromProto(vm));
  return std::optional<Manifest>(std::move(m));
}

Result<FetchStart> GrpcControlPlane::BeginFetch(
    const WorkerId& reader, const std::string& model, Version version,
    const std::string& group, uint64_t group_step, uint32_t max_sources,
    std::optional<uint64_t> fill_epoch, int64_t timeout_ms,
    bool manifest_from_sources) {
  v1::BeginFetchRequest req;
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_group(group);
  req.set_group_step(group_step);
  req.set_max_sources(max_sources);
  if (fill_epoch.has_value()) req.set_fill_epoch(*fill_epoch);
  req.set_manifest_from_sources(manifest_from_sources);
  v1::BeginFetchResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::BeginFetch, req, &resp, "begin fetch",
                          Within(timeout_ms)));
  FetchStart out;
  Resolved& r = out.resolved;
  r.version = Version(resp.version());
  r.state = wire::FromProto(resp.state());
  r.num_holders = resp.num_holders();
  r.retained = resp.retained();
  TH_ASSIGN_OR_RETURN(r.manifest,
                      ParseManifest(resp.manifest(), "begin fetch"));
  if (!resp.manifest_sha256().empty()) {
    ManifestRef ref;
    if (!manifest_from_sources || r.manifest.has_value() ||
        resp.manifest_sha256().size() != ref.sha256.size() ||
        resp.manifest_size() == 0 || resp.manifest_size() > kMaxManifestBytes) {
      return InvalidArgument(
          "begin fetch: the hub named the manifest by a bad digest or size (" +
          std::to_string(resp.manifest_size()) + " bytes)");
    }
    std::memcpy(ref.sha256.data(), resp.manifest_sha256().data(),
                ref.sha256.size());
    ref.size = resp.manifest_size();
    out.manifest_ref = ref;
  }
  for (const v1::Holder& h : resp.holders()) {
    TH_ASSIGN_OR_RETURN(ResolvedSource src, FromProto(h));
    r.sources.push_back(std::move(src));
  }
  out.filling = resp.filling() && fill_epoch.has_value();
  out.fill_detail = resp.fill_detail();
  out.delta_pending = resp.delta_pending();
  if (resp.sources_code() != 0) {
    out.first_status = wire::FromGrpc(
        grpc::Status(static_cast<grpc::StatusCode>(resp.sources_code()),
                     "schedule: " + resp.sources_detail()));
    if (out.first_status.ok()) {
      return InvalidArgument("begin fetch: the hub sent a bad status code");
    }
  } else if (resp.sources_state() == v1::UNAVAILABLE) {
    if (resp.sources_size() > 0) {
      return InvalidArgument(
          "begin fetch: the hub sent sources of an unavailable version");
    }
    out.first.unavailable = resp.sources_detail().empty()
                                ? "the version has no complete holder"
                                : resp.sources_detail();
  } else {
    for (const v1::Holder& h : resp.sources()) {
      TH_ASSIGN_OR_RETURN(ResolvedSource src, FromProto(h));
      out.first.sources.push_back(std::move(src));
    }
    out.first.recheck_after_ms = resp.recheck_after_ms();
  }
  return out;
}

Result<ResolvedSource> GrpcControlPlane::FromProto(const v1::Holder& h) {
  ResolvedSource s;
  s.worker = WorkerId(h.worker_id());
  s.data_address = h.data_address();
  if (h.endpoints_size() > 16) {
    return InvalidArgument("hub sent too many data endpoints");
  }
  for (const v1::DataEndpoint& e : h.endpoints()) {
    s.endpoints.push_back({e.transport(), e.address()});
  }
  s.labels = wire::FromProto(h.labels());
  s.worker_class = h.worker_class() == v1::SPOT ? WorkerClass::kSpot
                                                : WorkerClass::kReliable;
  s.epoch = h.epoch();
  s.filling = h.filling();
  if (h.chunk_begin_size() != h.chunk_end_size() ||
      h.chunk_begin_size() > 4096) {
    return InvalidArgument("hub sent malformed chunk ranges");
  }
  for (int i = 0; i < h.chunk_begin_size(); ++i) {
    if (h.chunk_begin(i) > h.chunk_end(i)) {
      return InvalidArgument("hub sent an inverted chunk range");
    }
    s.chunks.push_back({h.chunk_begin(i), h.chunk_end(i)});
  }
  if (h.has_slices()) {
    TH_ASSIGN_OR_RETURN(PartLayout slices, wire::FromProto(h.slices()));
    if (!s.chunks.empty()) {
      return InvalidArgument("hub sent a holder of slices with chunks");
    }
    s.slices = std::make_shared<const PartLayout>(std::move(slices));
  }
  if (h.deltas_size() > 16) {
    return InvalidArgument("hub sent too many deltas for one holder");
  }
  for (const v1::DeltaOffer& d : h.deltas()) {
    if (d.base() == 0 || d.bytes() == 0) {
      return InvalidArgument("hub sent a delta with no base or no bytes");
    }
    s.deltas.push_back({Version(d.base()), d.bytes()});
  }
  return s;
}

Status GrpcControlPlane::AddSliceHolder(const WorkerId& id,
                                        const std::string& model,
                                        Version version, uint64_t epoch,
                                        const PartLayout& slices,
                                        int64_t timeout_ms) {
  v1::AddSliceHolderRequest req;
  req.set_worker_id(id.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_epoch(epoch);
  wire::ToProto(slices, req.mutable_slices());
  v1::AddSliceHolderResponse resp;
  return Call(&v1::Hub::Stub::AddSliceHolder, req, &resp, "add slice holder",
              Within(timeout_ms));
}

Result<Scheduled> GrpcControlPlane::Schedule(
    const WorkerId& reader, const std::string& model, Version version,
    const std::vector<WorkerId>& exclude, uint32_t max_sources,
    int64_t timeout_ms) {
  return ScheduleSlices(reader, model, version, exclude, max_sources, {},
                        timeout_ms);
}

Result<Scheduled> GrpcControlPlane::Recheck(const WorkerId& reader,
                                            const std::string& model,
                                            Version version,
                                            uint32_t max_sources,
                                            int64_t timeout_ms) {
  v1::ScheduleRequest req;
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_max_sources(max_sources);
  req.set_recheck(true);
  return SendSchedule(req, timeout_ms);
}

Result<Scheduled> GrpcControlPlane::ScheduleSlices(
    const WorkerId& reader, const std::string& model, Version version,
    const std::vector<WorkerId>& exclude, uint32_t max_sources,
    const std::vector<SliceWant>& wants, int64_t timeout_ms) {
  v1::ScheduleRequest req;
  for (const SliceWant& w : wants) {
    v1::SliceWant* pw = req.add_want();
    pw->set_name(w.name);
    for (uint64_t o : w.box.offset) pw->add_box_offset(o);
    for (uint64_t e : w.box.extent) pw->add_box_extent(e);
  }
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  for (const WorkerId& e : exclude) req.add_exclude(e.value());
  req.set_max_sources(max_sources);
  return SendSchedule(req, timeout_ms);
}

Result<Scheduled> GrpcControlPlane::SendSchedule(v1::ScheduleRequest& req,
                                                 int64_t timeout_ms) {
  v1::ScheduleResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::Schedule, req, &resp,
                          req.recheck() ? "recheck" : "schedule",
                          Within(timeout_ms)));
  Scheduled out;
  if (resp.state() == v1::UNAVAILABLE) {
    if (resp.holders_size() > 0) {
      return InvalidArgument(
          "schedule: the hub sent holders of an unavailable version");
    }
    out.unavailable = resp.detail().empty()
                          ? "the version has no complete holder"
                          : resp.detail();
    return out;
  }
  for (const v1::Holder& h : resp.holders()) {
    TH_ASSIGN_OR_RETURN(ResolvedSource src, FromProto(h));
    out.sources.push_back(std::move(src));
  }
  out.recheck_after_ms = resp.recheck_after_ms();
  out.delta_pending = resp.delta_pending();
  return out;
}

Result<bool> GrpcControlPlane::ReportDelta(const WorkerId& id,
                                           const std::string& model,
                                           Version version, Version base,
                                           DeltaAction action, uint64_t bytes,
                                           int64_t timeout_ms) {
  v1::ReportDeltaRequest req;
  req.set_worker_id(id.value());
  req.set_model(model);
  req.set_version(version.value());
  req.set_base(base.value());
  req.set_action(action == DeltaAction::kClaim ? v1::ReportDeltaRequest::CLAIM
                 : action == DeltaAction::kReady
                     ? v1::ReportDeltaRequest::READY
                     : v1::ReportDeltaRequest::DROP);
  req.set_bytes(bytes);
  v1::ReportDeltaResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::ReportDelta, req, &resp,
                          "report delta", Within(timeout_ms)));
  return action != DeltaAction::kClaim || resp.granted();
}

Status GrpcControlPlane::FetchDone(const WorkerId& reader,
                                   const std::string& model, Version version,
                                   int64_t timeout_ms) {
  v1::FetchDoneRequest req;
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  v1::FetchDoneResponse resp;
  return Call(&v1::Hub::Stub::FetchDone, req, &resp, "fetch done",
              Within(timeout_ms));
}

Status GrpcControlPlane::Leave(const WorkerId& id, int64_t timeout_ms,
                               int64_t wait_ms) {
  v1::LeaveRequest req;
  req.set_worker_id(id.value());
  wait_ms = std::clamp<int64_t>(wait_ms, 0, 600000);
  req.set_wait_ms(static_cast<uint32_t>(wait_ms));
  v1::LeaveResponse resp;
  return Call(&v1::Hub::Stub::Leave, req, &resp, "leave", timeout_ms + wait_ms);
}

Status GrpcControlPlane::Retain(const std::string& model, Version version,
                                bool retain) {
  v1::RetainRequest req;
  req.set_model(model);
  req.set_version(version.value());
  req.set_unretain(!retain);
  v1::RetainResponse resp;
  return Call(&v1::Hub::Stub::Retain, req, &resp,
              retain ? "retain" : "unretain", rpc_timeout_ms_);
}

Result<KeeperPollResult> GrpcControlPlane::KeeperPoll(const WorkerId& keeper,
                                                      int64_t wait_ms) {
  v1::KeeperPollRequest req;
  req.set_worker_id(keeper.value());
  wait_ms = std::clamp<int64_t>(wait_ms, 0, 30000);
  req.set_wait_ms(static_cast<uint32_t>(wait_ms));
  v1::KeeperPollResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::KeeperPoll, req, &resp, "keeper poll",
                          rpc_timeout_ms_ + wait_ms));
  KeeperPollResult out;
  for (const v1::KeeperTask& t : resp.fetch()) {
    out.fetch.push_back({t.model(), Version(t.version()), t.total_bytes()});
  }
  for (const v1::KeeperTask& t : resp.release()) {
    out.release.push_back({t.model(), Version(t.version()), t.total_bytes()});
  }
  for (const v1::KeeperTask& t : resp.pinned()) {
    out.pinned.push_back({t.model(), Version(t.version()), t.total_bytes()});
  }
  out.hub_incarnation = resp.hub_incarnation();
  return out;
}

Status GrpcControlPlane::ReportProgress(const WorkerId& reader,
                                        const ProgressUpdate& u,
                                        int64_t timeout_ms) {
  v1::ReportProgressRequest req;
  req.set_worker_id(reader.value());
  req.set_model(u.model);
  req.set_version(u.version.value());
  req.set_bytes_done(u.bytes_done);
  req.set_bytes_total(u.bytes_total);
  req.set_elapsed_ms(static_cast<uint64_t>(std::max<int64_t>(0, u.elapsed_ms)));
  for (const auto& [src, bytes] : u.sources) {
    if (req.sources_size() >= static_cast<int>(kMaxProgressSources)) break;
    v1::SourceBytes* sb = req.add_sources();
    sb->set_worker_id(src.value());
    sb->set_bytes(bytes);
  }
  req.set_done(u.done);
  v1::ReportProgressResponse resp;
  return Call(&v1::Hub::Stub::ReportProgress, req, &resp, "progress report",
              Within(timeout_ms));
}

Result<HubSnapshot> GrpcControlPlane::Snapshot(const SnapshotLimits& limits) {
  v1::SnapshotRequest req;
  req.set_max_models(limits.models);
  req.set_max_versions_per_model(limits.versions_per_model);
  req.set_max_holders_per_version(limits.holders_per_version);
  req.set_max_transfers(limits.transfers);
  req.set_max_slowest(limits.slowest);
  v1::SnapshotResponse resp;
  TH_RETURN_IF_ERROR(
      Call(&v1::Hub::Stub::Snapshot, req, &resp, "snapshot", rpc_timeout_ms_));
  return wire::FromProto(resp);
}

Result<std::vector<ModelInfo>> GrpcControlPlane::List() {
  v1::ListModelsRequest req;
  v1::ListModelsResponse resp;
  TH_RETURN_IF_ERROR(
      Call(&v1::Hub::Stub::ListModels, req, &resp, "list", rpc_timeout_ms_));
  std::vector<ModelInfo> out;
  for (const v1::ModelSummary& m : resp.models()) {
    ModelInfo mi;
    mi.model = m.model();
    for (const v1::VersionSummary& v : m.versions()) {
      VersionInfo vi;
      vi.model = m.model();
      vi.version = Version(v.version());
      vi.state = wire::FromProto(v.state());
      vi.group_size = v.group_size();
      vi.parts_published = v.parts_published();
      vi.total_bytes = v.total_bytes();
      vi.num_holders = v.holders();
      vi.retained = v.retained();
      mi.versions.push_back(std::move(vi));
    }
    out.push_back(std::move(mi));
  }
  return out;
}

}  // namespace

std::unique_ptr<ControlPlane> MakeGrpcControlPlane(const std::string& addresses,
                                                   std::string secret,
                                                   int64_t rpc_timeout_ms,
                                                   HubTls tls) {
  return std::make_unique<GrpcControlPlane>(addresses, std::move(secret),
                                            rpc_timeout_ms, std::move(tls));
}

}  // namespace tensorhub::client
