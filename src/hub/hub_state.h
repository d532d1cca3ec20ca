// The hub's reference table and version lifecycle, as a pure state machine.
//
// No I/O, no threads, no clock: every call takes `now_ms` from the caller, so
// tests drive time by hand. Not thread-safe; the RPC adapter (hub_service.h)
// serializes calls. The hub never sees tensor bytes, only manifests.
//
// Soft state: everything here can be rebuilt from the workers' own reports
// (RegisterWorker with the old id, Publish with rebuild=true, AddHolder),
// which is what workers do when the hub forgets them after a restart.
#ifndef TENSORHUB_HUB_HUB_STATE_H_
#define TENSORHUB_HUB_HUB_STATE_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/manifest.h"
#include "tensorhub/snapshot.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::hub {

struct HubConfig {
  // The lease of a small fleet; a fleet too big for the heartbeat budget
  // gets a longer one (PlanHeartbeats).
  int64_t lease_ms = 5000;
  // Heartbeats per second the hub plans for (0: no budget, every worker
  // gets lease_ms), and the longest lease it grants to stay within it.
  uint32_t heartbeat_budget_per_s = 0;
  int64_t max_lease_ms = 60000;
  uint64_t incarnation = 1;  // distinguishes hub restarts
  size_t max_workers = 100000;
  size_t max_models = 10000;
  size_t max_dead_versions_per_model = 64;  // aborted/unavailable kept for ls
  // Rack uplinks (docs/design.md, "Scheduling"): the oversubscription
  // ratio of a rack's uplink, the NIC capacity of the rack's hosts over the
  // uplink's (4 for 4:1), and per-rack figures ((datacenter, rack) ->
  // ratio) that override it. At most 1 everywhere: full bisection, and
  // Schedule ranks an idle holder anywhere in the reader's datacenter
  // before a busy one in its rack, so that every holder uploads to one
  // reader at a time. Above 1 in some rack: Schedule builds rack-aware
  // pipelines there (RackPlanner in hub_state.cc): each version enters an
  // oversubscribed rack once and its readers there feed each other.
  double rack_oversubscription = 1.0;
  std::map<std::pair<std::string, std::string>, double>
      rack_oversubscription_by_rack;
  // A reader whose source sits behind another oversubscribed rack's uplink
  // is told to ask again (Recheck) after recheck_ms, then after twice as
  // long each time its sources stayed the same, up to max_recheck_ms: until
  // its fetch ends, a reader arriving in its source's rack may take its
  // place in the pipeline (docs/design.md, "Rack-aware pipelines").
  int64_t recheck_ms = 2;
  int64_t max_recheck_ms = 1000;
  // Retention: the latest `keep_latest` committed versions of every model
  // are retained without a Retain call (0: none).
  uint32_t keep_latest = 0;
  size_t max_retained_per_model = 1024;  // explicit Retain pins
  // Reader groups: pins kept per group (the newest steps), groups kept in
  // all, and how long an unused group's pins live.
  size_t max_steps_per_group = 8;
  size_t max_groups = 10000;
  int64_t group_ttl_ms = 600000;
  // Record every change to the durable facts (DurableState) for
  // TakeDurableChanges: on in a hub of an HA set, whose leader writes them
  // to etcd before it answers; off (nothing recorded) for a single hub.
  bool record_durable = false;
};

// ---- What outlives a hub of an HA set (docs/design.md, "A highly
// available hub") ----
// A reader group's pins (ResolveForGroup) as the durable store keeps them.
struct GroupRecord {
  std::map<uint64_t, Version> steps;  // step -> pinned version
  uint64_t forgot_below = 0;          // older steps were evicted
  bool operator==(const GroupRecord&) const = default;
};

// The facts a new leader must start from, because no worker re-reports
// them: each model's highest version number (so that numbering never goes
// backwards), the Retain pins, and the reader groups' pins. Everything else
// is soft state, rebuilt from the workers' reports.
struct DurableState {
  std::map<std::string, Version> highest;
  std::set<std::pair<std::string, Version>> pins;
  std::map<std::pair<std::string, std::string>, GroupRecord>
      groups;  // (model, group)
  bool operator==(const DurableState&) const = default;
};

// One change to the durable facts, in the order the state machine made it.
struct DurableChange {
  enum class Kind {
    kHighest,    // model's highest version is now `version`
    kPin,        // (model, version) is pinned
    kUnpin,      // (model, version) is no longer pinned
    kGroup,      // (model, group)'s pins are now `record`
    kGroupGone,  // (model, group) was forgotten
  };
  Kind kind = Kind::kHighest;
  std::string model;
  Version version;
  std::string group;
  GroupRecord record;
  bool operator==(const DurableChange&) const = default;
};

// Applies `c` to `s` (what the durable store does with a change).
void ApplyDurableChange(const DurableChange& c, DurableState& s);

struct WorkerRegistration {
  WorkerId requested_id;  // empty: the hub assigns one
  std::string name;
  std::string data_address;
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  // Transports it serves besides TCP (at most kMaxDataEndpoints).
  std::vector<DataEndpoint> endpoints;
  // Its link inside its datacenter is slow enough for a delta to win there
  // too (DeltaOptions): Schedule prefers a holder of a ready delta from a
  // base it holds in its datacenter, not only across the wide-area link.
  bool nearby_deltas = false;
};

struct ChunkRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const ChunkRange&) const = default;
};

// A delta this holder serves of the version against `base` (docs/design.md,
// "Deltas on slow links"): `bytes` of index and chunk deltas in all.
struct DeltaOffer {
  Version base;
  uint64_t bytes = 0;
  bool operator==(const DeltaOffer&) const = default;
};

struct HolderView {
  WorkerId worker;
  std::string data_address;
  std::vector<DataEndpoint> endpoints;
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  uint64_t epoch = 0;
  std::vector<ChunkRange> chunks;
  // Still receiving the version: it serves each chunk once it has verified
  // it (a read of a chunk it is still receiving waits for it).
  bool filling = false;
  // A holder of slices (AddSliceHolder): `chunks` is empty and `slices` is
  // its own layout (its boxes of logical tensors, packed, with the segment
  // checksums it computed). Only ScheduleSlices gives these out.
  bool slice_holder = false;
  PartLayout slices;
  // The deltas it serves of the version from a base the reader holds
  // whole (Schedule, BeginFetch and Resolve fill it for their reader).
  std::vector<DeltaOffer> deltas;
};

// A slice reader's wanted box of one logical tensor (ScheduleSlices).
struct SliceWant {
  std::string name;
  Box box;
};

// Bounds on holders of slices: boxes per logical tensor in one report, and
// slice holders per version (a report beyond it is RESOURCE_EXHAUSTED; the
// reader keeps its slices, unserved). ScheduleSlices scans a version's slice
// holders, so the second bound also bounds its cost.
inline constexpr size_t kMaxSliceBoxesPerTensor = 4;
inline constexpr size_t kMaxSliceHoldersPerVersion = 1024;
// Deltas (ready or being computed) a version may have in all, over every
// base and holder; a claim beyond it is refused (the version travels
// whole), a report beyond it is RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxDeltasPerVersion = 16;

// Resolve lists at most this many holders: a reader needs a few to fall
// back on, and listing all of 10,000 per reader would cost the hub O(N) per
// reader (O(N^2) per version).
inline constexpr size_t kMaxResolveHolders = 64;
// Transports a worker may advertise besides TCP.
inline constexpr size_t kMaxDataEndpoints = 4;

struct Resolution {
  Version version;
  VersionState state = VersionState::kPending;
  // Set once committed (unless Resolve was asked not to copy it).
  std::optional<Manifest> manifest;
  std::optional<ManifestDigest> manifest_digest;  // set once committed
  // The nearest holders (at most kMaxResolveHolders), nearest first; within
  // one distance the order Schedule prefers (least busy, latest joined),
  // rotated by one on each Resolve so that readers spread over them.
  std::vector<HolderView> holders;
  uint32_t num_holders = 0;  // all holders but the reader, listed or not
  bool retained = false;
};

struct PublishArgs {
  WorkerId worker;
  std::string model;
  Version version;
  uint32_t rank = 0;
  uint32_t group_size = 1;
  uint64_t chunk_bytes = 0;
  PartLayout part;
  uint64_t epoch = 0;
  bool rebuild = false;
};

struct BeginFetchArgs {
  WorkerId reader;
  std::string model;
  Version version;    // Version::Latest(): the latest committed
  std::string group;  // with Latest: the reader group's pin for group_step
  uint64_t group_step = 0;
  // Register the reader as a filling holder of the resolved version under
  // this epoch (its data-plane registration's); nullopt: fetch only.
  std::optional<uint64_t> fill_epoch;
  size_t max_sources = 4;
  // The hub's answers are final (its rebuild window after a start is
  // over): a committed version that no live worker holds whole is answered
  // as such (state kUnavailable) instead of as an error.
  bool settled = true;
};

struct FetchStart {
  // As Resolve answers; holders listed only when `sources` holds none.
  Resolution resolution;
  // The filling registration: OK when made (or not asked for), else why
  // not (e.g. the version is known here only as unavailable).
  Status filling;
  // Schedule's answer: the sources, or (sources_unavailable, with
  // sources_status saying why) the considered answer that no live worker
  // holds the whole version, or an error (sources_status).
  std::vector<HolderView> sources;
  bool sources_unavailable = false;
  Status sources_status;
  // With sources: when to Recheck them (RecheckAfterMs), 0 for never.
  int64_t recheck_after_ms = 0;
  // A delta of the version from a base the reader holds whole is being
  // computed by a live holder (claimed, not ready): a reader behind a slow
  // link may wait for it (DeltaPending).
  bool delta_pending = false;
};

struct VersionSummary {
  Version version;
  VersionState state = VersionState::kPending;
  uint32_t group_size = 0;
  uint32_t parts_published = 0;
  uint64_t total_bytes = 0;
  uint32_t holders = 0;
  uint32_t tensors = 0;
  bool retained = false;
};

// What a keeper should do (KeeperTasks).
struct KeeperTask {
  std::string model;
  Version version;
  uint64_t total_bytes = 0;
  bool operator==(const KeeperTask&) const = default;
};
struct KeeperWork {
  std::vector<KeeperTask> fetch;    // retained, no reliable copy: copy it
  std::vector<KeeperTask> release;  // held by this keeper, not retained
  // Of the versions this keeper holds or is asked to fetch, those with a
  // Retain pin (so it can restore the pins after a hub restart).
  std::vector<KeeperTask> pinned;
  // Whether there is work (pinned is information, not work).
  bool empty() const { return fetch.empty() && release.empty(); }
};

struct ModelSummary {
  std::string model;
  std::vector<VersionSummary> versions;
};

// Counts over the whole table (HubState::Stats), for the hub's metrics.
struct HubStats {
  size_t workers = 0;
  size_t models = 0;
  // Versions by state, indexed by VersionState's value.
  std::array<size_t, 4> versions{};
  // References to versions: complete copies, and readers still receiving.
  size_t holders_complete = 0;
  size_t holders_filling = 0;
  size_t retained_versions = 0;
  size_t reader_group_pins = 0;
  // Readers holding sources Schedule() gave them (fetches in flight).
  size_t readers_scheduled = 0;
  // The heartbeat plan told to workers now (HubState::plan()).
  int64_t heartbeat_interval_ms = 0;
  int64_t lease_ms = 0;
};

// A fetching worker's progress (ReportProgress): bytes done in all and per
// source, cumulative since its data transfer began `elapsed_ms` ago.
struct ProgressReport {
  WorkerId reader;
  std::string model;
  Version version;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  int64_t elapsed_ms = 0;
  std::vector<std::pair<WorkerId, uint64_t>> sources;  // bytes read from each
  // The fetch ended successfully: record each source's throughput
  // (bytes over elapsed_ms) and drop the fetch's progress.
  bool done = false;
};

// A holder's measured throughputs are kept for this long, at most
// kMaxRateSamples per holder (the newest).
inline constexpr int64_t kRateWindowMs = 300000;
inline constexpr size_t kMaxRateSamples = 8;

// Names of models: 1-256 printable ASCII characters without '@' or spaces.
Status ValidateModelName(const std::string& model);

// The rack uplink settings of a hub configuration: ratios finite and >= 0
// (at most 1: full bisection), labels of a per-rack figure 1-256
// characters, recheck intervals 1 ms <= recheck_ms <= max_recheck_ms <= 60 s.
Status ValidateRackConfig(const HubConfig& config);
// Whether a rack (datacenter, rack label) has an oversubscribed uplink:
// a rack label, and its ratio above 1.
bool RackOversubscribed(const HubConfig& config, const std::string& datacenter,
                        const std::string& rack);

// How often a fleet's workers heartbeat and the lease the hub grants them
// (docs/design.md, "Heartbeats"). The hub sends both with every Register
// and Heartbeat answer; workers heartbeat every interval_ms, so two
// heartbeats may be lost before the lease lapses (lease_ms >= 3 x
// interval_ms).
struct HeartbeatPlan {
  int64_t interval_ms = 0;
  int64_t lease_ms = 0;
  bool operator==(const HeartbeatPlan&) const = default;
};
// The bounds of the interval a small fleet gets (a third of the lease):
// at most 5 s, so that a worker notices a restarted hub soon.
inline constexpr int64_t kMinHeartbeatIntervalMs = 50;
inline constexpr int64_t kMaxBaseHeartbeatIntervalMs = 5000;
// The plan for `workers` workers: a third of `base_lease_ms` (within the
// bounds above) and base_lease_ms, unless that is more than
// `budget_per_s` heartbeats per second in all; then the interval grows
// until the fleet sends at most the budget, and the lease with it (3
// intervals), up to `max_lease_ms` (a fleet bigger than budget x
// max_lease_ms / 3 then exceeds the budget: failure detection stays
// bounded). budget_per_s 0: no budget. A pure function of its arguments.
HeartbeatPlan PlanHeartbeats(size_t workers, int64_t base_lease_ms,
                             uint32_t budget_per_s, int64_t max_lease_ms);

class HubState {
 public:
  explicit HubState(HubConfig config);

  // Returns the worker's id (the requested one when given).
  Result<WorkerId> RegisterWorker(const WorkerRegistration& reg,
                                  int64_t now_ms);
  // NOT_FOUND if the hub does not know the worker (restart or expiry).
  Status Heartbeat(const WorkerId& worker, int64_t now_ms);
  // A trainer rank's part. Returns the version's state after the call.
  Result<VersionState> Publish(const PublishArgs& args, int64_t now_ms);
  // A worker holds a committed version: all of it, or (filling) it is
  // receiving it now and serves the chunks it has verified. A full report
  // ends the worker's fetch: its assigned sources are released. A filling
  // report of a version published as pieces is FAILED_PRECONDITION: its
  // readers receive logical tensors, not the parts' chunks (they serve them
  // onward as holders of slices, AddSliceHolder).
  // O(manifest): the manifest is validated and compared (skipped when it
  // equals the committed one). A report to a hub that does not know the
  // version (it restarted) re-creates it from this manifest.
  Status AddHolder(const WorkerId& worker, const std::string& model,
                   Version version, uint64_t epoch, const Manifest& manifest,
                   int64_t now_ms, bool filling = false);
  // The same report naming the manifest by its digest (Manifest::Digest()),
  // O(log N) with no manifest work: what a reader sends after it resolved the
  // version. Returns false and changes nothing when the hub has no committed
  // manifest of the version to compare with (it restarted, or the version is
  // pending here): the caller then reports with the full manifest. A digest
  // other than the committed one's is INVALID_ARGUMENT.
  Result<bool> AddHolderByDigest(const WorkerId& worker,
                                 const std::string& model, Version version,
                                 uint64_t epoch, ManifestDigest digest,
                                 int64_t now_ms, bool filling = false);
  // Chooses the sources a reader pulls a committed version from, and counts
  // them as busy until the reader's fetch ends (FetchDone, a full AddHolder,
  // or the reader leaving). Nearest first; among equally near holders the
  // least busy, then the latest to join, so that readers arriving together
  // form a pipeline (trainer -> r1 -> r2 ...) in which every holder uploads
  // to one reader at a time. Idle complete holders as near as the first
  // choice are added as extra stripes, up to `max_sources`. The sources
  // cover every chunk that a usable holder has: a part of a group's version
  // that none of them holds (trainer ranks hold one part each) adds its
  // best holder by the same ranking, so a version of G parts may give up to
  // max_sources + G - 1 sources. `exclude`
  // names holders that failed this reader. Calling it again replaces the
  // reader's previous assignment. Cost: O((|exclude| + s + G) log N) for N
  // holders, s distinct serving counts among filling holders and G parts
  // (an index, not a scan; see HolderIndex).
  //
  // With oversubscribed racks (HubConfig::rack_oversubscription) a reader
  // in such a rack reads inside its rack when it can: from an idle holder
  // there; else it takes the place of the rack's exit (the holder there
  // that feeds a reader in another rack: that reader is moved onto this
  // one, and learns it at its next Recheck); else, with no usable holder
  // in the rack, from an idle holder outside (it then enters the rack, and
  // is told to Recheck); else by the rack's uplink budget (the rack's
  // workers over its ratio, in streams) across it or sharing the least busy
  // holder in it. Filling holders are then ordered by where they were
  // placed, not by when they joined, so the pipeline stays a DAG. Adds
  // O(w log N) for the w workers of the reader's rack holding the version.
  Result<std::vector<HolderView>> Schedule(const WorkerId& reader,
                                           const std::string& model,
                                           Version version,
                                           const std::set<WorkerId>& exclude,
                                           size_t max_sources);
  // The reader's sources again, as the hub's books have them now (another
  // reader may have taken a source's place: see Schedule), without
  // choosing anew; the reader replaces its sources with these. If it has
  // none, or one of them no longer holds the version, this is Schedule
  // (with nothing excluded). O(s log N).
  Result<std::vector<HolderView>> Recheck(const WorkerId& reader,
                                          const std::string& model,
                                          Version version, size_t max_sources);
  // How long the reader should wait before its Recheck, 0 for never (its
  // sources will not be moved): what the hub tells it with its sources.
  int64_t RecheckAfterMs(const WorkerId& reader, const std::string& model,
                         Version version) const;
  // ---- Holders of slices (docs/design.md, "Holders of slices") ----
  // A reader that fetched slices of a committed version serves them onward.
  // `slices` is its own layout: one TensorLayout per box it holds (spec.shape
  // = the box's extents, global_shape and box_offset = where it lies, in the
  // version's dtype), packed into part_bytes, with segment checksums the
  // holder computed over its verified bytes (readers verify against these).
  // Soft state like AddHolder: a restarted hub hears it again. Replaces the
  // worker's previous boxes of the version. Holders of slices count towards
  // availability (UpdateAvailability), not towards retention or keepers.
  // FAILED_PRECONDITION if the hub has no committed manifest of the version
  // (yet: report again later); INVALID_ARGUMENT for boxes that do not fit
  // the manifest. O(manifest).
  Status AddSliceHolder(const WorkerId& worker, const std::string& model,
                        Version version, uint64_t epoch,
                        const PartLayout& slices, int64_t now_ms);
  // Schedule for a reader of slices: up to `max_sources` holders of slices
  // whose boxes intersect one of `wants` (nearest first, rotated among
  // equally near ones), first, so that the reader prefers them; then
  // Schedule's sources. Where those sources leave parts of the version
  // unheld (trainer ranks gone), more holders of slices, in the same order,
  // until the wanted bytes of those parts are covered (SliceSources); with
  // no holder left but holders of slices, only those. Slice holders are not
  // counted busy. A full fetch (Schedule, Resolve) never gets a slice
  // holder. Cost: Schedule's plus O(slice holders x boxes x log wants),
  // plus O(slice holders x boxes + parts' tensors x slice holders) when
  // parts are left unheld.
  Result<std::vector<HolderView>> ScheduleSlices(
      const WorkerId& reader, const std::string& model, Version version,
      const std::set<WorkerId>& exclude, size_t max_sources,
      const std::vector<SliceWant>& wants);
  // ---- Deltas (docs/design.md, "Deltas on slow links") ----
  // A worker that holds whole both `version` and an older `base` of a
  // model, with the same layout (group size, chunk size and part sizes),
  // asks to compute the delta of the version against the base. Granted
  // (true) to the first worker to ask per (base, version) and datacenter
  // (labels.datacenter), while it lives and holds the version, and to a
  // worker the hub claimed it for (ClaimRelay); false when another live
  // worker of its datacenter has claimed or serves that delta already, or
  // the version has kMaxDeltasPerVersion. So the wide-area link carries a
  // delta once per datacenter, as it carries full copies.
  // FAILED_PRECONDITION when the worker does not hold both whole (or the
  // layouts differ), NOT_FOUND for an unknown version. O(log N).
  Result<bool> ClaimDelta(const WorkerId& worker, const std::string& model,
                          Version version, Version base, int64_t now_ms);
  // The worker serves the delta (base -> version), `bytes` in all, from its
  // copy of the version (reads name that copy's epoch): claimed or not (a
  // restarted hub hears it again). Readers holding the base whole see it
  // in their sources' HolderView::deltas. Needs a complete reference to the
  // version (FAILED_PRECONDITION otherwise); bytes within what a version of
  // that manifest can have (INVALID_ARGUMENT). The delta goes with the
  // worker's reference to the version.
  Status AddDelta(const WorkerId& worker, const std::string& model,
                  Version version, Version base, uint64_t bytes,
                  int64_t now_ms);
  // Withdraws the worker's delta (base -> version), claimed or ready
  // (e.g. it could not compute it). NOT_FOUND if it had none.
  Status DropDelta(const WorkerId& worker, const std::string& model,
                   Version version, Version base, int64_t now_ms);
  // Whether a delta of the version from a base the reader holds whole is
  // being made (claimed, not ready) where the reader may want to wait for
  // it: in its datacenter, while none is ready there; or anywhere, while
  // none is ready at all.
  bool DeltaPending(const WorkerId& reader, const std::string& model,
                    Version version) const;

  // The start of a fetch in one call (the BeginFetch RPC): Resolve (or
  // ResolveForGroup), the reader's registration as a filling holder, and
  // Schedule, as the three calls would answer them one after another. A
  // committed version that a whole fetch must read as slices (it has
  // pieces, or its complete holders of chunks no longer cover it and
  // holders of slices do) also gets holders of slices among its sources,
  // first, as ScheduleSlices of every tensor whole would give them; the
  // reader is then not registered as a filling holder (it serves slices
  // once it has them).
  // Fails only as the resolution fails; the other two steps report their
  // own outcome in FetchStart. Resolution::holders is listed only when
  // Schedule found no source (the reader then falls back to that list), so
  // a fetch costs O((s + G) log N), not the listing of 64 holders.
  Result<FetchStart> BeginFetch(const BeginFetchArgs& args, int64_t now_ms);
  // The reader's fetch ended (success or not): release its sources.
  void FetchDone(const WorkerId& reader, const std::string& model,
                 Version version);
  // Withdraws the worker's reference. Aborts a version still pending.
  Status Unpublish(const WorkerId& worker, const std::string& model,
                   Version version, int64_t now_ms);
  // Version::Latest() resolves to the highest committed version that still
  // has a live holder. Lists at most kMaxResolveHolders holders.
  // `copy_manifest` false leaves Resolution::manifest empty (the RPC layer
  // sends a copy it encoded once per version, found by manifest_digest).
  // `list_holders` false leaves Resolution::holders empty (and skips the
  // walk that finds them).
  Result<Resolution> Resolve(const WorkerId& reader, const std::string& model,
                             Version version, bool include_uncommitted,
                             bool copy_manifest = true,
                             bool list_holders = true);
  // The committed manifest of a version, if there is one.
  std::optional<Manifest> CommittedManifest(const std::string& model,
                                            Version version);
  // The state of a version the hub knows (nullopt: unknown).
  std::optional<VersionState> StateOf(const std::string& model,
                                      Version version);
  std::vector<ModelSummary> List() const;
  // Read only; O(versions + references).
  HubStats Stats() const;

  // ---- `tensorhub top` (docs/design.md, "tensorhub top") ----
  // A fetch's progress. Kept only while the hub counts the reader's fetch
  // as in flight (it has sources from Schedule): one entry per reader and
  // version, dropped when the fetch ends (FetchDone, a full AddHolder, the
  // reader's reference dropped) or the reader leaves; a report for a fetch
  // the hub does not count as in flight is ignored. `done` records each
  // source's throughput for Snapshot's slowest holders. NOT_FOUND if the
  // hub does not know the reader. O(s log N) for s sources.
  Status ReportProgress(const ProgressReport& report, int64_t now_ms);
  // Read only. O(versions + references of the listed versions + readers
  // in flight + holders with rates), each list cut to `limits` (clamped to
  // the kMaxSnapshot* bounds).
  HubSnapshot Snapshot(const SnapshotLimits& limits, int64_t now_ms) const;
  // Drops workers whose lease ended, with all their references. A scan of
  // all workers: it runs a few times per lease, not once per request, and
  // costs less than keeping an expiry order current on every heartbeat.
  void ExpireLeases(int64_t now_ms);
  // A worker leaves on purpose: the same as its lease ending now.
  Status Leave(const WorkerId& worker);

  // ---- Retention (docs/design.md, "Retain and the keeper") ----
  // A retained version keeps a reliable copy: the last reliable holder
  // (class reliable, complete copy) may not drop its reference until
  // another reliable holder has the bytes (CheckDeparture); a keeper is
  // asked to copy retained versions that lack one (KeeperTasks). Explicit
  // pins (Retain) plus the latest `keep_latest` committed versions.
  // Retain needs a pending or committed version; unretain of a version not
  // pinned is NOT_FOUND. Versions kept by keep_latest cannot be unretained.
  Status Retain(const std::string& model, Version version, bool retain);
  bool IsRetained(const std::string& model, Version version) const;
  // OK if the worker may drop its reference to the version now. Else
  // FAILED_PRECONDITION: the version is retained and committed, and without
  // this worker (and other departing ones) no reliable worker holds all of
  // its chunks -- or, for a spot worker, no other worker does either.
  Status CheckDeparture(const WorkerId& worker, const std::string& model,
                        Version version) const;
  // The versions CheckDeparture refuses for each of the worker's
  // references (what its Leave would lose).
  std::vector<std::pair<std::string, Version>> BlockedDepartures(
      const WorkerId& worker) const;
  // A departing holder waits for a reliable copy before it drops its
  // reference: it still serves, but no longer counts as a reliable copy,
  // so keepers are asked to copy the version.
  void SetDeparting(const WorkerId& worker, const std::string& model,
                    Version version, bool departing);
  // What `keeper` should fetch (retained committed versions with neither a
  // reliable complete copy nor a reliable copy in progress, that it does
  // not hold) and release (its complete copies of versions not retained).
  // Never a version of pieces: a reader's copy of one is a holder of
  // slices, which retention does not count (retention of such a version
  // rests on its trainer ranks).
  KeeperWork KeeperTasks(const WorkerId& keeper) const;

  // ---- Reader groups ----
  // Resolves `latest` once per (model, group, step): the first rank's call
  // pins the highest committed version, every later call with the same key
  // gets that version (or a clear error if it became unreadable), even if a
  // newer one committed since. A step older than the pins the group still
  // keeps is refused (FAILED_PRECONDITION) rather than re-pinned.
  Result<Resolution> ResolveForGroup(const WorkerId& reader,
                                     const std::string& model,
                                     const std::string& group, uint64_t step,
                                     int64_t now_ms, bool copy_manifest = true,
                                     bool list_holders = true);
  size_t num_group_pins() const;
  // Forgets groups unused for group_ttl_ms (also done by ExpireLeases).
  void ExpireGroups(int64_t now_ms);

  // ---- Durable facts (HA; HubConfig::record_durable) ----
  // The changes made to the durable facts since the last call, oldest
  // first (always empty without record_durable). The RPC adapter takes them
  // after each call and has them written before it answers.
  std::vector<DurableChange> TakeDurableChanges();
  // Starts a new leader from the durable facts: version floors, pins of
  // versions no worker has re-reported yet (they apply when the version is
  // re-created), and reader groups (as used at `now_ms`). Call on a fresh
  // state, before any other call. Records no change.
  void Restore(const DurableState& durable, int64_t now_ms);
  // The durable facts now (what Restore of them would bring back).
  DurableState Durable() const;

  const HubConfig& config() const { return config_; }
  size_t num_workers() const { return workers_.size(); }
  // The plan for the fleet now (PlanHeartbeats of the config): what the
  // hub tells a worker it just renewed. A renewal grants plan().lease_ms
  // but never shortens a lease granted before: a worker told a long
  // interval keeps its long lease until its next heartbeat tells it the
  // new plan.
  HeartbeatPlan plan() const {
    return PlanHeartbeats(workers_.size(), config_.lease_ms,
                          config_.heartbeat_budget_per_s, config_.max_lease_ms);
  }

 private:
  struct Worker {
    WorkerRegistration reg;
    int64_t lease_expiry_ms = 0;
    std::set<std::pair<std::string, Version>> refs;    // what it holds
    std::set<std::pair<std::string, Version>> slices;  // slices it holds
  };
  // Extends w's lease to plan().lease_ms from now, never shortening it.
  void Renew(Worker& w, int64_t now_ms) const;
  // Schedule's preference among equally near holders: the least busy, then
  // the latest in the pipeline's order, then the id (trainer ranks all
  // joined at 0). `order` is when the holder joined (Reference::join_seq),
  // or, for a filling holder of a rack-aware hub, where it was placed
  // (Reference::placement; kUnplaced before).
  struct HolderKey {
    int serving = 0;
    uint64_t order = 0;
    WorkerId worker;
    bool operator<(const HolderKey& o) const {
      if (serving != o.serving) return serving < o.serving;
      if (order != o.order) return order > o.order;
      return worker < o.worker;
    }
  };
  // (datacenter, rack).
  using RackKey = std::pair<std::string, std::string>;
  // A filling holder a rack-aware Schedule has not placed yet: after every
  // placed one, so nobody reads from it.
  static constexpr uint64_t kUnplaced = UINT64_MAX - 1;
  // The holders of one version in one topology group, in preference order.
  // Filling holders are kept apart: they feed only readers that joined
  // after them, and only complete holders become extra stripes.
  struct HolderSet {
    std::set<HolderKey> complete;
    std::set<HolderKey> filling;
    bool empty() const { return complete.empty() && filling.empty(); }
  };
  // How a reference is filed in its version's index, kept so that it can be
  // unfiled after the fields it was filed by change.
  struct Filed {
    HolderKey key;
    bool filling = false;
    std::optional<uint32_t> rank;
    Labels labels;
  };
  struct Reference {
    uint64_t epoch = 0;
    std::optional<uint32_t> rank;  // set for a trainer rank's part
    bool filling = false;
    uint64_t join_seq = 0;  // order in which holders joined (trainers: 0)
    // Rack-aware hubs: where Schedule placed this holder in the version's
    // pipeline, (line << 32) | position in the line; 0 until placed. A
    // filling holder reads only from filling holders placed before it.
    uint64_t placement = 0;
    int serving = 0;  // readers Schedule() assigned it, still fetching
    std::optional<Filed> filed;  // set while it is in the version's index
  };
  // Every reference of a version, filed by where its worker is: Schedule and
  // Resolve walk the reader's host, rack, datacenter and then all holders,
  // nearest first, and stop at the first usable holder instead of scanning
  // every holder (which made one version for N readers cost O(N^2)).
  struct HolderIndex {
    HolderSet all;
    std::map<std::string, HolderSet> by_dc;
    std::map<std::pair<std::string, std::string>, HolderSet>
        by_rack;  // (dc, rack)
    std::map<std::pair<std::string, std::string>, HolderSet>
        by_host;                                // (dc, host)
    std::map<uint32_t, WorkerId> rank_holders;  // trainer rank -> its worker
    size_t full_complete = 0;  // holders of every chunk that are not filling
  };
  struct ReaderProgress {
    uint64_t bytes_done = 0;
    uint64_t bytes_total = 0;
    int64_t elapsed_ms = 0;
    std::vector<std::pair<WorkerId, uint64_t>> sources;
  };
  struct RateSample {
    double bytes_per_second = 0;
    int64_t at_ms = 0;
  };
  // One source Schedule gave a reader: counted in the source's serving
  // count, and, when it crosses rack uplinks, in rack_use_ of both racks
  // (as they were when it was counted).
  struct Edge {
    WorkerId source;
    // The source's reference when counted (its join_seq): a worker that
    // left and came back is a new reference, and this edge a stale one.
    uint64_t source_join = 0;
    std::optional<std::pair<RackKey, RackKey>> uplinks;  // (source's, reader's)
  };
  struct Assignment {
    std::vector<Edge> edges;
    // > 0: the reader reads from behind an oversubscribed rack's uplink and
    // was told to Recheck after this long; until its fetch ends another
    // reader may take its source's place (the reader is "movable").
    int64_t recheck_ms = 0;
    bool moved = false;  // a source was replaced since it was last told
  };
  // A rack's line in one version's pipeline (rack-aware hubs): readers
  // placed in the rack get positions after every holder placed there.
  struct Line {
    uint64_t line = 0;
    uint64_t next_position = 1;
  };
  // Streams across a rack's uplink (rack-aware hubs), over all versions.
  struct RackUse {
    size_t workers = 0;
    size_t in = 0;
    size_t out = 0;
  };

  // Boxes in an order, to count them (VersionEntry::slice_boxes).
  struct BoxLess {
    bool operator()(const Box& a, const Box& b) const {
      return std::tie(a.offset, a.extent) < std::tie(b.offset, b.extent);
    }
  };

  struct VersionEntry {
    VersionState state = VersionState::kPending;
    uint32_t group_size = 0;
    uint64_t chunk_bytes = 0;
    std::vector<std::optional<PartLayout>> parts;  // while pending
    std::optional<Manifest> manifest;              // once committed
    ManifestDigest manifest_digest;                // of *manifest
    // Some tensor of *manifest is a piece of a logical tensor: a reader
    // fetching it is never a filling holder (AttachHolder).
    bool has_pieces = false;
    std::map<WorkerId, Reference> refs;  // each one filed in index
    HolderIndex index;
    uint64_t resolve_count = 0;  // rotates equally near holders
    uint64_t next_join = 1;
    // Reader -> the sources Schedule() gave it (each counted in the source's
    // Reference::serving until released).
    std::map<WorkerId, Assignment> assignments;
    // Rack-aware hubs: each rack's line, and the rack's exits: (source in
    // the rack, movable reader outside it) of each such assignment. Entries
    // go stale when a source leaves or a worker moves, and are checked
    // when used.
    std::map<RackKey, Line> lines;
    uint64_t next_line = 1;
    std::map<RackKey, std::set<std::pair<WorkerId, WorkerId>>> exits;
    bool retained = false;         // an explicit Retain pin
    std::set<WorkerId> departing;  // holders waiting to leave it
    // Readers in `assignments` that reported progress (ReportProgress).
    std::map<WorkerId, ReaderProgress> progress;
    // Holders of slices (AddSliceHolder), kept apart from `refs`: they
    // count towards availability (parts_in_slices), never towards retention
    // or full fetches of chunks.
    struct SliceRef {
      uint64_t epoch = 0;
      uint64_t join_seq = 0;
      PartLayout slices;
    };
    std::map<WorkerId, SliceRef> slice_refs;
    uint64_t slice_schedules = 0;  // rotates equally near slice holders
    // The boxes of slice_refs by tensor: each distinct box with the number
    // of holders of slices that hold it. Availability depends only on which
    // boxes are held, so it is worked out again (CoverBySlices) only when a
    // box gains its first holder or loses its last.
    std::map<std::string, std::map<Box, uint32_t, BoxLess>, std::less<>>
        slice_boxes;
    // Per part (once committed): holders of slices hold every piece of it
    // where a reader can read it from them (SliceHoldersCover).
    std::vector<bool> parts_in_slices;
    // Deltas of this version: (base, holder) -> ready (its size known) or
    // claimed. Each holder has a reference in `refs` (complete, or filling
    // for a claim ClaimRelay made); the entry goes with that reference. At
    // most kMaxDeltasPerVersion.
    struct DeltaRef {
      bool ready = false;
      uint64_t bytes = 0;
    };
    std::map<std::pair<Version, WorkerId>, DeltaRef> deltas;
    // Filling readers that withdrew a claim ClaimRelay made for them: not
    // claimed for again while that reference lasts.
    std::set<WorkerId> relays_declined;
  };
  struct Model {
    std::map<Version, VersionEntry> versions;
    Version highest;  // highest version number ever seen
    // Pins restored from the durable store (Restore) of versions not known
    // yet: applied when the version is re-created from a worker's report.
    std::set<Version> restored_pins;
  };
  // Distances: same host 0, same rack 1, same datacenter 2, elsewhere 3.
  static constexpr int kDatacenterDistance = 2;
  // One topology group to search, at its distance from the reader.
  struct Level {
    const HolderSet* set;
    int distance;
  };

  // Schedule's search for one reader: the ranking of candidate holders,
  // written once, and the steps that use it (hub_state.cc).
  class Picker;
  // A rack-aware hub's choice for a reader in an oversubscribed rack.
  class RackPlanner;
  // Counts the reader's new sources as serving it and returns them.
  std::vector<HolderView> Assign(VersionEntry& v, const WorkerId& reader,
                                 const std::vector<WorkerId>& chosen);
  // Rack-aware hubs: the key a filling holder is filed under, and placing
  // one in its version's pipeline (refiled under its new key).
  uint64_t FiledOrder(const Reference& r) const;
  void Place(VersionEntry& v, const WorkerId& id, uint64_t placement);
  // The placement a reader in `rack` would get after every holder there
  // (its rack's line), and the placement of a new line (after everything).
  static uint64_t FollowerPlacement(const VersionEntry& v, const RackKey& rack);
  static uint64_t NewLinePlacement(const VersionEntry& v);
  // Makes `placement` real: advances (or starts) the rack's line.
  static void TakePlacement(VersionEntry& v, const RackKey& rack,
                            uint64_t placement);
  // The rack a worker is in (empty rack label: none).
  std::optional<RackKey> RackOf(const WorkerId& id) const;
  // Streams a rack's uplink carries at full rate: its workers over its
  // ratio, at least 1.
  size_t UplinkStreams(const RackKey& rack) const;
  double RatioOf(const RackKey& rack) const;
  // The movable reader `x` reads from `to` instead of `from` (in the books;
  // it learns at its Recheck).
  void Move(VersionEntry& v, const WorkerId& x, const WorkerId& from,
            const WorkerId& to);
  void CountWorker(const Labels& labels, int delta);
  void Uncount(const RackKey& rack, size_t RackUse::*field);

  struct GroupPins {
    std::map<uint64_t, Version> steps;  // step -> pinned version
    uint64_t forgot_below = 0;          // older steps were evicted
    int64_t last_used_ms = 0;
  };

  bool IsRetained(const Model& m, Version version, const VersionEntry& v) const;
  // Whether the complete (non-filling) references of workers accepted by
  // `keep` cover every chunk of a committed version.
  template <typename Pred>
  bool Covers(const VersionEntry& v, Pred keep) const;
  bool IsReliable(const WorkerId& worker) const;
  void RemoveWorker(const WorkerId& id);
  // The worker behind a holder report, its lease renewed, once the model
  // name and version number are valid.
  Result<Worker*> ReportingWorker(const WorkerId& worker,
                                  const std::string& model, Version version,
                                  int64_t now_ms);
  void DropReference(const std::string& model, Version version,
                     const WorkerId& worker);
  void DropSliceReference(const std::string& model, Version version,
                          const WorkerId& worker);
  // Counts (+1) or uncounts (-1) a holder's boxes in v.slice_boxes, and
  // works out v.parts_in_slices again if a box gained its first holder or
  // lost its last. O(boxes log) plus, then, O(manifest x boxes per tensor).
  static void CountSliceBoxes(VersionEntry& v, const PartLayout& slices,
                              int delta);
  static void CoverBySlices(VersionEntry& v);
  // Complete holders of chunks (full copies, trainer ranks) hold every part
  // (with bytes) of a committed version. O(G).
  static bool CoveredByChunkHolders(const VersionEntry& v);
  // A reader's holders of slices (ScheduleSlices, BeginFetch): up to
  // `max_sources` of those with a box that meets `wants` (nullptr: any
  // tensor, whole), nearest first, rotated among equally near ones; then,
  // for the wanted bytes of parts that no complete holder among
  // `chunk_sources` holds, more of them in the same order until those
  // bytes are covered (SliceHoldersCover), as far as they are.
  std::vector<HolderView> SliceSources(VersionEntry& v, const WorkerId& reader,
                                       const std::set<WorkerId>& exclude,
                                       size_t max_sources,
                                       const std::vector<SliceWant>* wants,
                                       const std::vector<HolderView>& chunks);
  // AddSliceHolder's checks of a holder's boxes against the manifest.
  static Status CheckSlices(const std::string& vname, const Manifest& m,
                            const PartLayout& slices);
  void Prune(const std::string& model, Model& m);
  // A version entry was just created in `m`: raises the model's highest
  // version number and applies a restored pin.
  void Created(const std::string& model, Model& m, Version version,
               VersionEntry& v);
  void Record(DurableChange change);
  void RecordGroup(const std::pair<std::string, std::string>& key);
  // Publish's steps (hub_state.cc).
  static Status CheckPublishArgs(const PublishArgs& a);
  Result<VersionEntry*> VersionForPublish(const PublishArgs& a);
  static Status AcceptPart(VersionEntry& v, const PublishArgs& a);
  static void TryCommit(VersionEntry& v);
  static void SetManifest(VersionEntry& v, Manifest manifest);
  // The part of AddHolder after the manifest is settled: file the holder.
  Status AttachHolder(Worker& w, const WorkerId& worker,
                      const std::string& model, Version version,
                      VersionEntry& v, uint64_t epoch, bool filling);
  void Release(VersionEntry& v, const WorkerId& reader);
  // The reader's fetch of `v` ended: Release, and drop its progress.
  void EndFetch(VersionEntry& v, const WorkerId& reader);
  std::string NameOf(const WorkerId& id) const;
  void File(VersionEntry& v, const WorkerId& id, Reference& r,
            const Labels& labels) const;
  static void Unfile(VersionEntry& v, Reference& r);
  // Files `r` again after its serving count or placement changed.
  void Refile(VersionEntry& v, const WorkerId& id, Reference& r) const;
  // The reader's groups, nearest first; the last one is every holder.
  static std::vector<Level> LevelsFor(const VersionEntry& v,
                                      const Labels& reader);
  // The distance of the level in which LevelsFor(reader) finds `holder`.
  static int Distance(const Labels& reader, const Labels& holder);
  VersionEntry* FindVersion(const std::string& model, Version version);
  static void UpdateAvailability(VersionEntry& v);
  // OK if readers may fetch the version; else the error a reader gets.
  static Status CheckReadable(const std::string& vname, const VersionEntry& v);
  static std::vector<ChunkRange> RangesOf(const VersionEntry& v,
                                          const Reference& r);
  HolderView ViewOf(const VersionEntry& v, const WorkerId& id) const;
  // Whether `worker` holds every chunk of model@version, filling no more.
  bool HoldsWhole(const WorkerId& worker, const std::string& model,
                  Version version) const;
  // The ready deltas `holder` serves of `v` from bases `reader` holds
  // whole.
  std::vector<DeltaOffer> OffersFor(const std::string& model,
                                    const VersionEntry& v,
                                    const WorkerId& holder,
                                    const WorkerId& reader) const;
  // A reader whose nearest source is in another datacenter reads from a
  // holder of a ready delta from a base it holds, instead of full copies
  // across the wide-area link (docs/design.md, "Deltas on slow links").
  // Inside its datacenter too for a reader registered with nearby_deltas:
  // a delta holder there, or, while none is ready or being made there, one
  // across the link. Returns the base and the distance of the delta it
  // chose, if it did.
  struct DeltaPick {
    Version base;
    int distance = 0;
  };
  std::optional<DeltaPick> PreferDeltaHolder(
      const std::string& model, const VersionEntry& v, const WorkerId& reader,
      const std::set<WorkerId>& exclude, int first_distance,
      std::vector<WorkerId>* chosen) const;
  // Whether a worker of `worker`'s datacenter other than it has claimed or
  // serves the delta (base -> v).
  bool DeltaInDatacenter(const VersionEntry& v, Version base,
                         const WorkerId& worker) const;
  // `reader`, a filling holder pointed at a delta from `base` across the
  // wide-area link (PreferDeltaHolder), makes that delta for its
  // datacenter once it holds the version (its DeltaMaker claims it then,
  // and is granted it): claimed for it now, unless a worker of its
  // datacenter has it, so that the datacenter's readers starting meanwhile
  // see it pending (DeltaPending) and may wait for it instead of reading
  // the version whole from the reader. Goes with the reader's reference.
  // Not for a reader that withdrew such a claim (DropDelta) before.
  void ClaimRelay(VersionEntry& v, const WorkerId& reader, Version base);

  HubConfig config_;
  // Some rack's uplink is oversubscribed: filling holders are ordered by
  // placement, and readers in such racks are planned by RackPlanner.
  bool rack_aware_ = false;
  std::map<RackKey, RackUse> rack_use_;  // rack-aware hubs only
  uint64_t next_worker_ = 1;
  std::map<WorkerId, Worker> workers_;
  std::map<std::string, Model> models_;
  // (model, group) -> pins; bounded by config_.max_groups.
  std::map<std::pair<std::string, std::string>, GroupPins> groups_;
  std::vector<DurableChange> durable_changes_;  // with record_durable
  // Holder -> its throughputs as readers measured them (ReportProgress
  // done), oldest first: at most kMaxRateSamples, known workers only.
  std::map<WorkerId, std::vector<RateSample>> rates_;
};

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_STATE_H_
