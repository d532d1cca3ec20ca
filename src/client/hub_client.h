// The worker's side of the control API: one gRPC channel to the hub, a
// deadline on every call, the shared secret attached, and protobuf converted
// to our types at this boundary.
#ifndef TENSORHUB_CLIENT_HUB_CLIENT_H_
#define TENSORHUB_CLIENT_HUB_CLIENT_H_

#include <algorithm>
#include <memory>
#include <optional>
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
  std::vector<ResolvedSource> sources;  // the nearest (the hub bounds them)
  uint32_t num_holders = 0;             // all holders but this worker
  bool retained = false;
};

// A Schedule answer. `unavailable` is set (with the hub's reason, and no
// sources) when the hub itself answered that the version is committed but
// no live worker holds all of its chunks. The hub gives that answer only
// past its rebuild window after a start; while rebuilding, and when it
// cannot be reached, Schedule returns an UNAVAILABLE error instead, so the
// caller can tell a considered answer from a passing one.
struct Scheduled {
  std::vector<ResolvedSource> sources;
  std::optional<std::string> unavailable;
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
  // `timeout_ms` below: the caller's time left; the call waits at most the
  // smaller of it and rpc_timeout_ms (-1: rpc_timeout_ms), so a call made
  // on behalf of a fetch or unpublish never outlives that call's deadline.
  // AddHolder names the manifest by its digest; sends it whole only when the
  // hub asks (need_manifest: it restarted), so a report costs the hub O(1).
  Status AddHolder(const WorkerId& id, const std::string& model,
                   Version version, uint64_t epoch, const Manifest& manifest,
                   bool filling = false, int64_t timeout_ms = -1);
  Result<Scheduled> Schedule(
      const WorkerId& reader, const std::string& model, Version version,
      const std::vector<WorkerId>& exclude, uint32_t max_sources,
      int64_t timeout_ms = -1);
  Status FetchDone(const WorkerId& reader, const std::string& model,
                   Version version, int64_t timeout_ms = -1);
  // wait_ms: how long the hub may hold the call waiting for a reliable
  // copy of a retained version. force: drop the reference even so. The
  // call waits at most the smaller of timeout_ms and rpc_timeout_ms + wait_ms.
  Status Unpublish(const WorkerId& id, const std::string& model,
                   Version version, int64_t wait_ms = 0, bool force = false,
                   int64_t timeout_ms = -1);
  // group non-empty with Version::Latest(): the reader group's pinned
  // version for group_step.
  Result<Resolved> Resolve(const WorkerId& reader, const std::string& model,
                           Version version, bool include_uncommitted,
                           const std::string& group = "",
                           uint64_t group_step = 0, int64_t timeout_ms = -1);
  Result<std::vector<ModelInfo>> List();
  // wait_ms: as for Unpublish, for every retained version it holds the
  // last copy of; it leaves all the same.
  Status Leave(const WorkerId& id, int64_t timeout_ms, int64_t wait_ms = 0);
  Status Retain(const std::string& model, Version version, bool retain);
  Result<KeeperPollResult> KeeperPoll(const WorkerId& keeper, int64_t wait_ms);

  const std::string& address() const { return address_; }

 private:
  void Prepare(grpc::ClientContext* ctx, int64_t timeout_ms) const;
  int64_t Within(int64_t timeout_ms) const {
    return timeout_ms < 0 ? rpc_timeout_ms_ : std::min(timeout_ms, rpc_timeout_ms_);
  }
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
