// The worker's side of the control API: one gRPC channel to the hub, a
// deadline on every call, the shared secret attached, and protobuf converted
// to our types at this boundary.
#ifndef TENSORHUB_CLIENT_HUB_CLIENT_H_
#define TENSORHUB_CLIENT_HUB_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "common/manifest.h"
#include "tensorhub.grpc.pb.h"
#include "tensorhub/client.h"
#include "tensorhub/status.h"

namespace tensorhub::client {

struct ResolvedSource {
  WorkerId worker;
  std::string data_address;
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  uint64_t epoch = 0;
  std::vector<std::pair<uint64_t, uint64_t>> chunks;  // [begin, end)
  bool filling = false;
};

struct Resolved {
  Version version;
  VersionState state = VersionState::kPending;
  std::optional<Manifest> manifest;
  std::vector<ResolvedSource> sources;
  bool retained = false;
};

// A keeper's work from KeeperPoll: (model, version, total bytes).
struct KeeperItem {
  std::string model;
  Version version;
  uint64_t total_bytes = 0;
};
struct KeeperPollResult {
  std::vector<KeeperItem> fetch;
  std::vector<KeeperItem> release;
  std::vector<KeeperItem> pinned;
  uint64_t hub_incarnation = 0;
};

class HubClient {
 public:
  HubClient(const std::string& address, std::string secret,
            int64_t rpc_timeout_ms);

  Result<WorkerId> Register(const WorkerId& old_id, const std::string& name,
                            const std::string& data_address,
                            const Labels& labels, WorkerClass worker_class,
                            int64_t timeout_ms);
  Status Heartbeat(const WorkerId& id);
  Status Publish(const WorkerId& id, const std::string& model, Version version,
                 uint32_t rank, uint32_t group_size, uint64_t chunk_bytes,
                 const PartLayout& part, uint64_t epoch, bool rebuild,
                 int64_t timeout_ms);
  Status AddHolder(const WorkerId& id, const std::string& model,
                   Version version, uint64_t epoch, const Manifest& manifest,
                   bool filling = false);
  Result<std::vector<ResolvedSource>> Schedule(
      const WorkerId& reader, const std::string& model, Version version,
      const std::vector<WorkerId>& exclude, uint32_t max_sources);
  Status FetchDone(const WorkerId& reader, const std::string& model,
                   Version version);
  // wait_ms: how long the hub may hold the call waiting for a reliable
  // copy of a retained version. force: drop the reference even so. The
  // call's deadline is timeout_ms if > 0, else wait_ms plus the RPC timeout.
  Status Unpublish(const WorkerId& id, const std::string& model,
                   Version version, int64_t wait_ms = 0, bool force = false,
                   int64_t timeout_ms = 0);
  // group non-empty with Version::Latest(): the reader group's pinned
  // version for group_step.
  Result<Resolved> Resolve(const WorkerId& reader, const std::string& model,
                           Version version, bool include_uncommitted,
                           const std::string& group = "",
                           uint64_t group_step = 0, int64_t timeout_ms = 0);
  Result<std::vector<ModelInfo>> List();
  // wait_ms: as for Unpublish, for every retained version it holds the
  // last copy of; it leaves all the same.
  Status Leave(const WorkerId& id, int64_t timeout_ms, int64_t wait_ms = 0);
  Status Retain(const std::string& model, Version version, bool retain);
  Result<KeeperPollResult> KeeperPoll(const WorkerId& keeper, int64_t wait_ms);

  const std::string& address() const { return address_; }

 private:
  void Prepare(grpc::ClientContext* ctx, int64_t timeout_ms) const;
  // One unary call with the secret set and a deadline of timeout_ms.
  template <typename Req, typename Resp>
  Status Call(grpc::Status (v1::Hub::Stub::*method)(grpc::ClientContext*,
                                                    const Req&, Resp*),
              Req& req, Resp* resp, const char* what, int64_t timeout_ms);
  Status Check(const grpc::Status& s, const char* what) const;
  static Result<ResolvedSource> FromProto(const v1::Holder& h);

  std::string address_;
  std::string secret_;
  int64_t rpc_timeout_ms_;
  std::unique_ptr<v1::Hub::Stub> stub_;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_HUB_CLIENT_H_
