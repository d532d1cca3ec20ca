// The control plane over gRPC: one channel to the hub, a deadline on every
// call, the shared secret attached, and protobuf converted to our types at
// this boundary. The generated gRPC and protobuf types appear in this file
// only.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "client/client_tls.h"
#include "client/control_plane.h"
#include "common/deadline.h"
#include "tensorhub.grpc.pb.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {
namespace {

// Asks of one Register call (see GrpcControlPlane::Register).
constexpr int kRegisterAttempts = 8;
// At most this long, after a Register that could not reach the hub, to see
// whether TLS is the reason.
constexpr int64_t kDiagnoseMs = 3000;

class GrpcControlPlane final : public ControlPlane {
 public:
  GrpcControlPlane(const std::string& address, std::string secret,
                   int64_t rpc_timeout_ms, HubTls tls);

  Result<WorkerId> Register(const WorkerId& old_id, const std::string& name,
                            const std::string& data_address,
                            const Labels& labels, WorkerClass worker_class,
                            int64_t timeout_ms) override;
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
  Status FetchDone(const WorkerId& reader, const std::string& model,
                   Version version, int64_t timeout_ms) override;
  Status Unpublish(const WorkerId& id, const std::string& model,
                   Version version, int64_t wait_ms, bool force,
                   int64_t timeout_ms) override;
  Result<Resolved> Resolve(const WorkerId& reader, const std::string& model,
                           Version version, bool include_uncommitted,
                           const std::string& group, uint64_t group_step,
                           int64_t timeout_ms) override;
  Result<std::vector<ModelInfo>> List() override;
  Status Leave(const WorkerId& id, int64_t timeout_ms,
               int64_t wait_ms) override;
  Status Retain(const std::string& model, Version version,
                bool retain) override;
  Result<KeeperPollResult> KeeperPoll(const WorkerId& keeper,
                                      int64_t wait_ms) override;

 private:
  void Prepare(grpc::ClientContext* ctx, int64_t timeout_ms) const;
  int64_t Within(int64_t timeout_ms) const {
    return timeout_ms < 0 ? rpc_timeout_ms_
                          : std::min(timeout_ms, rpc_timeout_ms_);
  }
  // One unary call with the secret set and a deadline of timeout_ms.
  template <typename Req, typename Resp>
  Status Call(grpc::Status (v1::Hub::Stub::*method)(grpc::ClientContext*,
                                                    const Req&, Resp*),
              Req& req, Resp* resp, const char* what, int64_t timeout_ms);
  Status Check(const grpc::Status& s, const char* what) const;
  static Result<ResolvedSource> FromProto(const v1::Holder& h);

  const std::string address_;
  const std::string secret_;
  const int64_t rpc_timeout_ms_;
  const HubTls tls_;
  std::unique_ptr<v1::Hub::Stub> stub_;
};

GrpcControlPlane::GrpcControlPlane(const std::string& address,
                                   std::string secret, int64_t rpc_timeout_ms,
                                   HubTls tls)
    : address_(address),
      secret_(std::move(secret)),
      rpc_timeout_ms_(rpc_timeout_ms),
      tls_(std::move(tls)) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a hub restart instead of backing off for long.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::InsecureChannelCredentials();
  if (tls_.enabled()) {
    grpc::SslCredentialsOptions so;
    so.pem_root_certs = tls_.ca_pem;
    so.pem_cert_chain = tls_.cert_chain_pem;
    so.pem_private_key = tls_.key_pem;
    creds = grpc::SslCredentials(so);
    if (!tls_.server_name.empty()) {
      args.SetSslTargetNameOverride(tls_.server_name);
    }
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  stub_ = v1::Hub::NewStub(channel);
}

template <typename Req, typename Resp>
Status GrpcControlPlane::Call(grpc::Status (v1::Hub::Stub::*method)(
                                  grpc::ClientContext*, const Req&, Resp*),
                              Req& req, Resp* resp, const char* what,
                              int64_t timeout_ms) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_ms);
  req.set_secret(secret_);
  return Check((stub_.get()->*method)(&ctx, req, resp), what);
}

void GrpcControlPlane::Prepare(grpc::ClientContext* ctx,
                               int64_t timeout_ms) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(timeout_ms));
}

Status GrpcControlPlane::Check(const grpc::Status& s, const char* what) const {
  if (s.ok()) return Status::Ok();
  Status st = wire::FromGrpc(s);
  if (st.code() == StatusCode::kUnavailable ||
      st.code() == StatusCode::kDeadlineExceeded) {
    // The hub unreachable, or reachable and saying "try again" (it is
    // rebuilding its state after a start): both are worth a retry.
    return Status(st.code(), std::string(what) + ": hub at " + address_ +
                                 " did not answer, or asked to try again (" +
                                 st.message() + ")");
  }
  return st;
}

Result<WorkerId> GrpcControlPlane::Register(const WorkerId& old_id,
                                            const std::string& name,
                                            const std::string& data_address,
                                            const Labels& labels,
                                            WorkerClass worker_class,
                                            int64_t timeout_ms) {
  v1::RegisterWorkerRequest req;
  req.set_secret(secret_);
  req.set_worker_id(old_id.value());
  req.set_name(name);
  req.set_data_address(data_address);
  wire::ToProto(labels, req.mutable_labels());
  req.set_worker_class(worker_class == WorkerClass::kSpot ? v1::SPOT
                                                          : v1::RELIABLE);
  // The first registration may wait for the hub to come up (wait for
  // ready), and is asked again if the hub went away while it was in flight
  // (a hub restarting): up to kRegisterAttempts times within timeout_ms. A
  // registration the old hub took and never answered leaves an id that
  // expires with its lease.
  const Deadline deadline = Deadline::AfterMs(std::max<int64_t>(0, timeout_ms));
  Status last;
  for (int attempt = 0; attempt < kRegisterAttempts; ++attempt) {
    const int64_t left_ms = deadline.remaining_ms();
    if (attempt > 0 && left_ms <= 0) break;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::max<int64_t>(1, left_ms));
    ctx.set_wait_for_ready(true);
    v1::RegisterWorkerResponse resp;
    last = Check(stub_->RegisterWorker(&ctx, req, &resp), "register");
    if (last.ok()) return WorkerId(resp.worker_id());
    if (last.code() != StatusCode::kUnavailable) break;
  }
  if (last.code() == StatusCode::kUnavailable ||
      last.code() == StatusCode::kDeadlineExceeded) {
    // gRPC says only that it could not connect; if TLS is why (one end
    // without it, a certificate missing or not trusted), say that.
    Status why = DiagnoseHubTls(
        address_, tls_,
        Deadline::AfterMs(std::min<int64_t>(rpc_timeout_ms_, kDiagnoseMs)));
    if (!why.ok()) return why;
  }
  return last;
}

Status GrpcControlPlane::Heartbeat(const WorkerId& id) {
  v1::HeartbeatRequest req;
  req.set_worker_id(id.value());
  v1::HeartbeatResponse resp;
  return Call(&v1::Hub::Stub::Heartbeat, req, &resp, "heartbeat",
              rpc_timeout_ms_);
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
  if (!resp.manifest().empty()) {
    v1::VersionManifest vm;
    if (!vm.ParseFromString(resp.manifest())) {
      return InvalidArgument("resolve: the hub sent a malformed manifest");
    }
    if (vm.group_size() > 0) {
      TH_ASSIGN_OR_RETURN(Manifest m, wire::FromProto(vm));
      out.manifest = std::move(m);
    }
  }
  for (const v1::Holder& h : resp.holders()) {
    TH_ASSIGN_OR_RETURN(ResolvedSource src, FromProto(h));
    out.sources.push_back(std::move(src));
  }
  return out;
}

Result<ResolvedSource> GrpcControlPlane::FromProto(const v1::Holder& h) {
  ResolvedSource s;
  s.worker = WorkerId(h.worker_id());
  s.data_address = h.data_address();
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
  return s;
}

Result<Scheduled> GrpcControlPlane::Schedule(
    const WorkerId& reader, const std::string& model, Version version,
    const std::vector<WorkerId>& exclude, uint32_t max_sources,
    int64_t timeout_ms) {
  v1::ScheduleRequest req;
  req.set_worker_id(reader.value());
  req.set_model(model);
  req.set_version(version.value());
  for (const WorkerId& e : exclude) req.add_exclude(e.value());
  req.set_max_sources(max_sources);
  v1::ScheduleResponse resp;
  TH_RETURN_IF_ERROR(Call(&v1::Hub::Stub::Schedule, req, &resp, "schedule",
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
  return out;
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

std::unique_ptr<ControlPlane> MakeGrpcControlPlane(const std::string& address,
                                                   std::string secret,
                                                   int64_t rpc_timeout_ms,
                                                   HubTls tls) {
  return std::make_unique<GrpcControlPlane>(address, std::move(secret),
                                            rpc_timeout_ms, std::move(tls));
}

}  // namespace tensorhub::client
