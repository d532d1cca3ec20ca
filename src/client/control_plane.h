// What the worker library needs from the hub: the control plane, as an
// interface in our own types. The product talks to the hub over gRPC
// (MakeGrpcControlPlane; the generated code stays in its .cc file); tests
// put an in-memory one in its place (src/client/client_test.cc), the way
// LevelDB tests replace its Env.
//
// Every call takes a deadline in milliseconds and returns by it; an
// unreachable hub, or one asking to try again (rebuilding its state after a
// start), is UNAVAILABLE or DEADLINE_EXCEEDED, worth a retry. Other codes
// are the hub's considered answer.
//
// Threads: implementations are safe to call from several threads at once.
// The default arguments are written here only; implementations repeat none.
#ifndef TENSORHUB_CLIENT_CONTROL_PLANE_H_
#define TENSORHUB_CLIENT_CONTROL_PLANE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/manifest.h"
#include "tensorhub/client.h"
#include "tensorhub/snapshot.h"
#include "tensorhub/status.h"

namespace tensorhub::client {

// A delta a source serves of the version from a base the reader holds
// whole (hub_state.h, DeltaOffer): `bytes` of index and body in all.
struct DeltaOffer {
  Version base;
  uint64_t bytes = 0;
  bool operator==(const DeltaOffer&) const = default;
};

struct ResolvedSource {
  WorkerId worker;
  std::string data_address;             // its TCP server
  std::vector<DataEndpoint> endpoints;  // other transports it serves
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  uint64_t epoch = 0;
  std::vector<std::pair<uint64_t, uint64_t>> chunks;  // [begin, end)
  bool filling = false;
  // A holder of slices (ScheduleSlices only): its own layout, no chunks.
  std::shared_ptr<const PartLayout> slices;
  // The deltas it serves of the version from bases this reader holds.
  std::vector<DeltaOffer> deltas;
};

// A slice reader's box of one logical tensor.
struct SliceWant {
  std::string name;
  Box box;
};
// The most boxes one schedule names (the hub refuses more).
inline constexpr size_t kMaxSliceWants = 4096;

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
  // The hub asks the reader to Recheck its sources after this long (it
  // reads from behind another rack's oversubscribed uplink); 0: no need.
  int64_t recheck_after_ms = 0;
  // A delta from a base this reader holds is being computed (claimed, not
  // ready): a reader behind a slow link may ask again shortly.
  bool delta_pending = false;
};

// A manifest the hub named instead of sending it: its SHA-256 and size as
// encoded (wire::EncodeManifest).
struct ManifestRef {
  std::array<uint8_t, 32> sha256{};
  uint64_t size = 0;
};
// The largest manifest a reader takes from a source (as the hub's cache of
// encoded manifests, and far above a real one: 4 MiB names ~250,000 chunks).
inline constexpr uint64_t kMaxManifestBytes = 256ull << 20;

// A BeginFetch answer: the resolution, the filling registration, and the
// first schedule, as Resolve, AddHolder (filling) and Schedule would
// answer one after another. `resolved.sources` (Resolve's nearest holders)
// is filled only when `first` has no sources: the reader falls back to it.
struct FetchStart {
  Resolved resolved;
  // The reader is a filling holder now (fill_epoch was given and the hub
  // took it); if not, fill_detail says why.
  bool filling = false;
  std::string fill_detail;
  // Schedule's answer when first_status is OK; else why it failed (e.g.
  // UNAVAILABLE: the hub is rebuilding).
  Status first_status;
  Scheduled first;
  // Set when the hub left `resolved.manifest` out (BeginFetch asked with
  // manifest_from_sources): the reader takes it from a source that holds
  // the whole version and checks it against this.
  std::optional<ManifestRef> manifest_ref;
  // As Scheduled::delta_pending.
  bool delta_pending = false;
};

// What a worker tells the hub of a delta (ReportDelta).
enum class DeltaAction { kClaim, kReady, kDrop };

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

// A fetch's progress for the hub (`tensorhub top`): bytes so far, in all
// and from each source, since its data transfer began `elapsed_ms` ago.
struct ProgressUpdate {
  std::string model;
  Version version;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  int64_t elapsed_ms = 0;
  std::vector<std::pair<WorkerId, uint64_t>> sources;
  bool done = false;  // the fetch succeeded; the last report
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;

  // `data_address`: the worker's TCP data server; `endpoints`: the other
  // transports it serves; `nearby_deltas`: deltas win on its link inside
  // its datacenter too (NearbyDeltasWin, fetch/delta_choice.h).
  virtual Result<WorkerId> Register(const WorkerId& old_id,
                                    const std::string& name,
                                    const std::string& data_address,
                                    const std::vector<DataEndpoint>& endpoints,
                                    const Labels& labels,
                                    WorkerClass worker_class,
                                    bool nearby_deltas, int64_t timeout_ms) = 0;
  virtual Status Heartbeat(const WorkerId& id) = 0;
  virtual Status Publish(const WorkerId& id, const std::string& model,
                         Version version, uint32_t rank, uint32_t group_size,
                         uint64_t chunk_bytes, const PartLayout& part,
                         uint64_t epoch, bool rebuild, int64_t timeout_ms) = 0;
  // `timeout_ms` below: the caller's time left; the call waits at most the
  // smaller of it and rpc_timeout_ms (-1: rpc_timeout_ms), so a call made
  // on behalf of a fetch or unpublish never outlives that call's deadline.
  // AddHolder names the manifest by its digest; sends it whole only when the
  // hub asks (need_manifest: it restarted), so a report costs the hub O(1).
  virtual Status AddHolder(const WorkerId& id, const std::string& model,
                           Version version, uint64_t epoch,
                           const Manifest& manifest, bool filling = false,
                           int64_t timeout_ms = -1) = 0;
  virtual Result<Scheduled> Schedule(const WorkerId& reader,
                                     const std::string& model, Version version,
                                     const std::vector<WorkerId>& exclude,
                                     uint32_t max_sources,
                                     int64_t timeout_ms = -1) = 0;
  // Schedule for a reader of slices: also holders of slices whose boxes
  // intersect `wants`. Default: Schedule (no holders of slices).
  virtual Result<Scheduled> ScheduleSlices(
      const WorkerId& reader, const std::string& model, Version version,
      const std::vector<WorkerId>& exclude, uint32_t max_sources,
      const std::vector<SliceWant>& wants, int64_t timeout_ms = -1) {
    (void)wants;
    return Schedule(reader, model, version, exclude, max_sources, timeout_ms);
  }
  // The reader's sources as the hub's books have them now (hub_state.h:
  // Recheck), when a Scheduled answer asked for it. Default:
  // FAILED_PRECONDITION (a control plane without rechecks).
  virtual Result<Scheduled> Recheck(const WorkerId& reader,
                                    const std::string& model, Version version,
                                    uint32_t max_sources,
                                    int64_t timeout_ms = -1) {
    (void)reader, (void)model, (void)version, (void)max_sources,
        (void)timeout_ms;
    return FailedPrecondition("this control plane does not recheck sources");
  }
  // Registers the boxes this worker holds of a committed version, in its
  // own layout (hub_state.h: AddSliceHolder). Default: FAILED_PRECONDITION.
  virtual Status AddSliceHolder(const WorkerId& id, const std::string& model,
                                Version version, uint64_t epoch,
                                const PartLayout& slices,
                                int64_t timeout_ms = -1) {
    (void)id, (void)model, (void)version, (void)epoch, (void)slices;
    (void)timeout_ms;
    return FailedPrecondition("this control plane has no holders of slices");
  }
  virtual Status FetchDone(const WorkerId& reader, const std::string& model,
                           Version version, int64_t timeout_ms = -1) = 0;
  // Deltas (hub_state.h: ClaimDelta, AddDelta, DropDelta): kClaim returns
  // whether this worker computes the delta (base -> version); kReady (with
  // its `bytes`) and kDrop return true. Default: FAILED_PRECONDITION (a
  // control plane without deltas: versions travel whole).
  virtual Result<bool> ReportDelta(const WorkerId& id, const std::string& model,
                                   Version version, Version base,
                                   DeltaAction action, uint64_t bytes,
                                   int64_t timeout_ms = -1) {
    (void)id, (void)model, (void)version, (void)base, (void)action;
    (void)bytes, (void)timeout_ms;
    return FailedPrecondition("this control plane has no deltas");
  }
  // wait_ms: how long the hub may hold the call waiting for a reliable
  // copy of a retained version. force: drop the reference even so. The
  // call waits at most the smaller of timeout_ms and rpc_timeout_ms + wait_ms.
  virtual Status Unpublish(const WorkerId& id, const std::string& model,
                           Version version, int64_t wait_ms = 0,
                           bool force = false, int64_t timeout_ms = -1) = 0;
  // group non-empty with Version::Latest(): the reader group's pinned
  // version for group_step.
  virtual Result<Resolved> Resolve(const WorkerId& reader,
                                   const std::string& model, Version version,
                                   bool include_uncommitted,
                                   const std::string& group = "",
                                   uint64_t group_step = 0,
                                   int64_t timeout_ms = -1) = 0;
  // The start of a fetch in one call to the hub (docs/design.md, "A fetch,
  // step by step"). fill_epoch set: also register the reader as a filling
  // holder of the resolved version under that epoch. group as for Resolve.
  // Fails as Resolve fails; the other two steps' outcomes are in the
  // answer. The default asks Resolve, AddHolder and Schedule in turn (for
  // in-memory control planes in tests); the gRPC one makes one call.
  // manifest_from_sources: the caller can take the manifest from a source
  // (FetchStart::manifest_ref); the hub may then leave it out.
  virtual Result<FetchStart> BeginFetch(
      const WorkerId& reader, const std::string& model, Version version,
      const std::string& group, uint64_t group_step, uint32_t max_sources,
      std::optional<uint64_t> fill_epoch, int64_t timeout_ms = -1,
      bool manifest_from_sources = false);
  virtual Result<std::vector<ModelInfo>> List() = 0;
  // wait_ms: as for Unpublish, for every retained version it holds the
  // last copy of; it leaves all the same.
  virtual Status Leave(const WorkerId& id, int64_t timeout_ms,
                       int64_t wait_ms = 0) = 0;
  virtual Status Retain(const std::string& model, Version version,
                        bool retain) = 0;
  virtual Result<KeeperPollResult> KeeperPoll(const WorkerId& keeper,
                                              int64_t wait_ms) = 0;
  // `tensorhub top`'s two calls. Neither is needed for a fetch to work: a
  // control plane without them (a test's) answers FAILED_PRECONDITION.
  virtual Status ReportProgress(const WorkerId& reader,
                                const ProgressUpdate& update,
                                int64_t timeout_ms = -1) {
    (void)reader, (void)update, (void)timeout_ms;
    return FailedPrecondition("this control plane takes no progress reports");
  }
  virtual Result<HubSnapshot> Snapshot(const SnapshotLimits& limits) {
    (void)limits;
    return FailedPrecondition("this control plane has no snapshots");
  }
  // The lease the hub last granted (Register and Heartbeat answers carry
  // it); 0 while unknown. Workers heartbeat a few times per lease.
  virtual int64_t lease_ms() const { return 0; }
  // The heartbeat interval the hub last told (it plans it from the fleet's
  // size, docs/design.md "Heartbeats"); 0 while unknown or from a hub that
  // does not say: then a third of lease_ms().
  virtual int64_t heartbeat_interval_ms() const { return 0; }
};

// TLS to the hub: the PEM text of ClientOptions' files, read and checked
// (client/client_tls.h).
struct HubTls {
  std::string ca_pem;  // the hub's certificate must chain to it; empty: none
  std::string cert_chain_pem;  // this worker's, for mutual TLS (or empty)
  std::string key_pem;
  std::string server_name;  // the name to check instead of the address's
  bool enabled() const { return !ca_pem.empty(); }
};

// The hub over gRPC at `addresses`: HOST:PORT, or the comma-separated
// hubs of an HA set (docs/design.md, "A highly available hub"), `secret`
// attached to every call, over TLS to each if tls.enabled(). Each call
// waits at most rpc_timeout_ms (and at most the caller's timeout_ms where
// one is given). With several hubs, a call follows the leader: a standby's
// answer names it, and a hub that cannot be reached passes the call to the
// next one, all within the call's time; the leader found is asked first by
// later calls. Connects lazily: never fails here. A Register that cannot
// reach the hub looks at what the hub's port speaks and, when TLS is the
// reason (one end without it, a certificate missing or not trusted),
// returns that instead: FAILED_PRECONDITION or PERMISSION_DENIED, saying
// what to set.
std::unique_ptr<ControlPlane> MakeGrpcControlPlane(const std::string& addresses,
                                                   std::string secret,
                                                   int64_t rpc_timeout_ms,
                                                   HubTls tls = {});

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_CONTROL_PLANE_H_
