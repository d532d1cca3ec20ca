#include "hub/hub_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "common/geometry.h"
#include "tensorhub/check.h"

namespace tensorhub::hub {
namespace {

std::string VersionName(const std::string& model, Version v) {
  return "'" + model + "@" + std::to_string(v.value()) + "'";
}

}  // namespace

Status ValidateModelName(const std::string& model) {
  if (model.empty() || model.size() > 256) {
    return InvalidArgument("model name must be 1-256 characters");
  }
  for (char c : model) {
    if (c <= ' ' || c > '~' || c == '@') {
      return InvalidArgument("model name '" + model +
                             "' may hold only printable ASCII without "
                             "spaces or '@'");
    }
  }
  return Status::Ok();
}

Status ValidateRackConfig(const HubConfig& config) {
  auto ratio_ok = [](double r) { return std::isfinite(r) && r >= 0; };
  if (!ratio_ok(config.rack_oversubscription)) {
    return InvalidArgument(
        "rack oversubscription must be a finite ratio >= 0 (4 for 4:1; at "
        "most 1 for full bisection)");
  }
  for (const auto& [rack, ratio] : config.rack_oversubscription_by_rack) {
    if (rack.first.empty() || rack.first.size() > 256 || rack.second.empty() ||
        rack.second.size() > 256) {
      return InvalidArgument(
          "a per-rack oversubscription names a datacenter and a rack of 1-256 "
          "characters each (DC/RACK=RATIO)");
    }
    if (!ratio_ok(ratio)) {
      return InvalidArgument("rack oversubscription of " + rack.first + "/" +
                             rack.second + " must be a finite ratio >= 0");
    }
  }
  if (config.recheck_ms < 1 || config.max_recheck_ms < config.recheck_ms ||
      config.max_recheck_ms > 60000) {
    return InvalidArgument(
        "recheck intervals need 1 ms <= recheck <= max recheck <= 60 s");
  }
  return Status::Ok();
}

bool RackOversubscribed(const HubConfig& config, const std::string& datacenter,
                        const std::string& rack) {
  if (rack.empty()) return false;
  auto it = config.rack_oversubscription_by_rack.find({datacenter, rack});
  return (it != config.rack_oversubscription_by_rack.end()
              ? it->second
              : config.rack_oversubscription) > 1;
}

HubState::HubState(HubConfig config) : config_(std::move(config)) {
  rack_aware_ = config_.rack_oversubscription > 1;
  for (const auto& [rack, ratio] : config_.rack_oversubscription_by_rack) {
    rack_aware_ = rack_aware_ || ratio > 1;
  }
}

void HubState::Uncount(const RackKey& rack, size_t RackUse::*field) {
  auto it = rack_use_.find(rack);
  TH_CHECK(it != rack_use_.end() && it->second.*field > 0);
  --(it->second.*field);
  const RackUse& u = it->second;
  if (u.workers == 0 && u.in == 0 && u.out == 0) rack_use_.erase(it);
}

void HubState::CountWorker(const Labels& labels, int delta) {
  if (!rack_aware_ || labels.rack.empty()) return;
  const RackKey key{labels.datacenter, labels.rack};
  RackUse& u = rack_use_[key];
  u.workers = static_cast<size_t>(static_cast<int64_t>(u.workers) + delta);
  if (u.workers == 0 && u.in == 0 && u.out == 0) rack_use_.erase(key);
}

Result<WorkerId> HubState::RegisterWorker(const WorkerRegistration& reg,
                                          int64_t now_ms) {
  if (reg.data_address.empty() || reg.data_address.size() > 256) {
    return InvalidArgument("worker data address must be 1-256 characters");
  }
  if (reg.name.size() > 256 || reg.requested_id.value().size() > 128) {
    return InvalidArgument("worker name or id too long");
  }
  // Copied into every answer that lists the worker: bounded.
  if (reg.endpoints.size() > kMaxDataEndpoints) {
    return InvalidArgument("a worker may advertise at most " +
                           std::to_string(kMaxDataEndpoints) +
                           " transports besides tcp");
  }
  for (const DataEndpoint& e : reg.endpoints) {
    const bool name_ok =
        !e.transport.empty() && e.transport.size() <= 16 &&
        std::all_of(e.transport.begin(), e.transport.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        });
    if (!name_ok || e.address.empty() || e.address.size() > 256) {
      return InvalidArgument(
          "a data endpoint needs a transport name of 1-16 lowercase letters "
          "or digits and an address of 1-256 characters");
    }
  }
  // Labels are kept per worker and copied into every answer that lists the
  // worker: bounded like the name.
  if (reg.labels.datacenter.size() > 256 || reg.labels.rack.size() > 256 ||
      reg.labels.host.size() > 256) {
    return InvalidArgument(
        "worker labels (datacenter, rack, host) must be at most 256 "
        "characters");
  }
  WorkerId id = reg.requested_id;
  auto it = workers_.find(id);
  if (it == workers_.end() && workers_.size() >= config_.max_workers) {
    return ResourceExhausted("hub already tracks " +
                             std::to_string(workers_.size()) + " workers");
  }
  if (id.empty()) {
    // The incarnation keeps ids from two hub lives apart.
    id = WorkerId("w" + std::to_string(config_.incarnation % 100000) + "-" +
                  std::to_string(next_worker_++));
  }
  Worker& w = workers_[id];
  if (!w.reg.data_address.empty() && w.reg.data_address != reg.data_address) {
    // A new process took an old id: its old references are not its own.
    std::set<std::pair<std::string, Version>> refs = w.refs;
    for (const auto& [model, version] : refs) DropReference(model, version, id);
    std::set<std::pair<std::string, Version>> slices = w.slices;
    for (const auto& [model, version] : slices) {
      DropSliceReference(model, version, id);
    }
  }
  const Labels old = w.reg.labels;
  if (!w.reg.data_address.empty()) CountWorker(old, -1);
  CountWorker(reg.labels, +1);
  w.reg = reg;
  w.reg.requested_id = id;
  Renew(w, now_ms);
  if (old.datacenter != reg.labels.datacenter || old.rack != reg.labels.rack ||
      old.host != reg.labels.host) {
    // The same process, moved: file what it holds under its new place.
    for (const auto& [model, version] : w.refs) {
      VersionEntry* v = FindVersion(model, version);
      TH_CHECK(v != nullptr && v->refs.count(id) > 0);
      Reference& r = v->refs.at(id);
      Unfile(*v, r);
      File(*v, id, r, w.reg.labels);
    }
  }
  return id;
}

HeartbeatPlan PlanHeartbeats(size_t workers, int64_t base_lease_ms,
                             uint32_t budget_per_s, int64_t max_lease_ms) {
  HeartbeatPlan p;
  p.lease_ms = base_lease_ms;
  p.interval_ms = std::clamp<int64_t>(
      base_lease_ms / 3, kMinHeartbeatIntervalMs, kMaxBaseHeartbeatIntervalMs);
  if (budget_per_s == 0) return p;
  // The interval at which `workers` send `budget_per_s` heartbeats a
  // second, rounded up; no longer than a third of the longest lease.
  const uint64_t needed_ms =
      (static_cast<uint64_t>(workers) * 1000 + budget_per_s - 1) / budget_per_s;
  const int64_t longest_ms = std::max(max_lease_ms, base_lease_ms) / 3;
  if (needed_ms <= static_cast<uint64_t>(p.interval_ms) ||
      longest_ms <= p.interval_ms) {
    return p;
  }
  p.interval_ms =
      static_cast<int64_t>(std::min<uint64_t>(needed_ms, longest_ms));
  p.lease_ms = std::max(base_lease_ms, 3 * p.interval_ms);
  return p;
}

void HubState::Renew(Worker& w, int64_t now_ms) const {
  w.lease_expiry_ms = std::max(w.lease_expiry_ms, now_ms + plan().lease_ms);
}

Status HubState::Heartbeat(const WorkerId& worker, int64_t now_ms) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) {
    return NotFound("hub does not know worker " + worker.value() +
                    "; register again");
  }
  Renew(it->second, now_ms);
  return Status::Ok();
}

Result<VersionState> HubState::Publish(const PublishArgs& a, int64_t now_ms) {
  auto wit = workers_.find(a.worker);
  if (wit == workers_.end()) {
    return NotFound("hub does not know worker " + a.worker.value() +
                    "; register again");
  }
  Renew(wit->second, now_ms);
  TH_RETURN_IF_ERROR(CheckPublishArgs(a));
  TH_ASSIGN_OR_RETURN(VersionEntry * found, VersionForPublish(a));
  VersionEntry& v = *found;
  TH_RETURN_IF_ERROR(AcceptPart(v, a));
  Reference& ref = v.refs[a.worker];
  Unfile(v, ref);
  const int serving = ref.serving;  // readers it serves keep counting
  ref = Reference{};
  ref.epoch = a.epoch;
  ref.rank = a.rank;
  ref.serving = serving;
  File(v, a.worker, ref, wit->second.reg.labels);
  wit->second.refs.insert({a.model, a.version});
  TryCommit(v);
  UpdateAvailability(v);
  return v.state;
}

// The arguments of a publish on their own: name, version number, group,
// rank, and the part's layout.
Status HubState::CheckPublishArgs(const PublishArgs& a) {
  TH_RETURN_IF_ERROR(ValidateModelName(a.model));
  if (a.version.value() == 0) {
    return InvalidArgument("version numbers start at 1");
  }
  if (a.group_size == 0 || a.group_size > kMaxGroupSize) {
    return InvalidArgument("group size must be in [1, " +
                           std::to_string(kMaxGroupSize) + "]");
  }
  if (a.rank >= a.group_size || a.part.rank != a.rank) {
    return InvalidArgument("rank " + std::to_string(a.rank) +
                           " is not in a group of " +
                           std::to_string(a.group_size));
  }
  if (a.chunk_bytes < kMinChunkBytes || a.chunk_bytes > kMaxChunkBytes) {
    return InvalidArgument("chunk size " + std::to_string(a.chunk_bytes) +
                           " out of [" + std::to_string(kMinChunkBytes) + ", " +
                           std::to_string(kMaxChunkBytes) + "]");
  }
  // The part alone; how its pieces tile with the other ranks' is checked
  // by AcceptPart.
  return Manifest::ValidatePart(a.part, a.chunk_bytes);
}

// The version a publish adds to, created on its first rank; refused if it
// was aborted or is published with another group size or chunk size.
Result<HubState::VersionEntry*> HubState::VersionForPublish(
    const PublishArgs& a) {
  auto mit = models_.find(a.model);
  if (mit == models_.end()) {
    if (models_.size() >= config_.max_models) {
      return ResourceExhausted("hub already tracks " +
                               std::to_string(models_.size()) + " models");
    }
    mit = models_.emplace(a.model, Model{}).first;
  }
  Model& m = mit->second;
  auto vit = m.versions.find(a.version);
  if (vit == m.versions.end()) {
    if (a.version <= m.highest && !a.rebuild) {
      return FailedPrecondition(
          "version " + std::to_string(a.version.value()) + " of model '" +
          a.model + "' is not greater than the last one published (" +
          std::to_string(m.highest.value()) +
          "): a version number is never used twice, even once no worker "
          "holds that version");
    }
    VersionEntry v;
    v.group_size = a.group_size;
    v.chunk_bytes = a.chunk_bytes;
    v.parts.resize(a.group_size);
    vit = m.versions.emplace(a.version, std::move(v)).first;
    Created(a.model, m, a.version, vit->second);
  }
  VersionEntry& v = vit->second;
  const std::string vname = VersionName(a.model, a.version);
  if (v.state == VersionState::kAborted) {
    return Aborted(vname +
                   " was aborted: a rank of its group left before "
                   "all ranks published");
  }
  if (v.group_size != a.group_size || v.chunk_bytes != a.chunk_bytes) {
    return InvalidArgument(vname + " is published with group size " +
                           std::to_string(v.group_size) + " and chunk size " +
                           std::to_string(v.chunk_bytes) + "; got " +
                           std::to_string(a.group_size) + " and " +
                           std::to_string(a.chunk_bytes));
  }
  return &v;
}

// Checks the rank against what the version and the worker hold already, and
// records a pending version's part. One reference per worker and version.
Status HubState::AcceptPart(VersionEntry& v, const PublishArgs& a) {
  const std::string vname = VersionName(a.model, a.version);
  // A second rank from
  // the same worker would replace the first and leave its part unheld, and
  // a rank from a worker that holds the whole version (it fetched it) would
  // replace its full reference with one part.
  auto own = v.refs.find(a.worker);
  if (own != v.refs.end() && !own->second.rank.has_value()) {
    return AlreadyExists(
        "worker " + a.worker.value() + " already holds all of " + vname +
        " (it fetched it); publishing rank " + std::to_string(a.rank) +
        " would replace that with one part: unpublish it first");
  }
  if (own != v.refs.end() && own->second.rank.has_value() &&
      *own->second.rank != a.rank) {
    return InvalidArgument("worker " + a.worker.value() +
                           " already publishes "
                           "rank " +
                           std::to_string(*own->second.rank) + " of " + vname +
                           "; one rank per worker");
  }
  if (v.manifest.has_value()) {
    // Committed already (a rank re-reporting after a hub restart, or a
    // repeated call): the part must be the one committed.
    if (!(v.manifest->parts()[a.rank] == a.part)) {
      return AlreadyExists("rank " + std::to_string(a.rank) + " of " + vname +
                           " is committed with different contents");
    }
  } else {
    std::optional<PartLayout>& slot = v.parts[a.rank];
    if (slot.has_value() && !(*slot == a.part)) {
      return AlreadyExists("rank " + std::to_string(a.rank) + " of " + vname +
                           " was already published with other contents");
    }
    if (!slot.has_value()) {
      // With this rank the last, every tensor's pieces across the ranks
      // must tile it exactly (the commit check, O(manifest) once per
      // version). A refused part changes nothing: the version stays
      // pending, and the rank may publish a corrected part.
      const size_t have = std::count_if(
          v.parts.begin(), v.parts.end(),
          [](const std::optional<PartLayout>& p) { return p.has_value(); });
      if (have + 1 == v.parts.size()) {
        std::vector<PartLayout> parts;
        for (uint32_t r = 0; r < v.parts.size(); ++r) {
          parts.push_back(r == a.rank ? a.part : *v.parts[r]);
        }
        Status tiles = CheckPiecesTile(parts);
        if (!tiles.ok()) {
          return InvalidArgument(vname + ": rank " + std::to_string(a.rank) +
                                 ", the last to publish, refused (the parts "
                                 "do not tile): " +
                                 tiles.message());
        }
      }
      slot = a.part;
    }
  }
  // A rank's part is held by exactly one worker.
  if (auto h = v.index.rank_holders.find(a.rank);
      h != v.index.rank_holders.end() && h->second != a.worker) {
    return AlreadyExists("rank " + std::to_string(a.rank) + " of " + vname +
                         " is already held by worker " + h->second.value());
  }
  return Status::Ok();
}

void HubState::TryCommit(VersionEntry& v) {
  if (v.state != VersionState::kPending) return;
  std::vector<PartLayout> parts;
  for (const auto& p : v.parts) {
    if (!p.has_value()) return;
    parts.push_back(*p);
  }
  Manifest manifest(v.group_size, v.chunk_bytes, std::move(parts));
  TH_CHECK(manifest.Validate().ok());
  SetManifest(v, std::move(manifest));
  v.parts.clear();
  v.state = VersionState::kCommitted;
}

void HubState::SetManifest(VersionEntry& v, Manifest manifest) {
  v.manifest_digest = manifest.Digest();
  v.has_pieces = false;
  for (const PartLayout& p : manifest.parts()) {
    for (const TensorLayout& t : p.tensors) v.has_pieces |= t.sharded();
  }
  v.manifest = std::move(manifest);
  CoverBySlices(v);
}

Result<HubState::Worker*> HubState::ReportingWorker(const WorkerId& worker,
                                                    const std::string& model,
                                                    Version version,
                                                    int64_t now_ms) {
  auto wit = workers_.find(worker);
  if (wit == workers_.end()) {
    return NotFound("hub does not know worker " + worker.value() +
                    "; register again");
  }
  Renew(wit->second, now_ms);
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  if (version.value() == 0)
    return InvalidArgument("version numbers start at 1");
  return &wit->second;
}

Status HubState::AddHolder(const WorkerId& worker, const std::string& model,
                           Version version, uint64_t epoch,
                           const Manifest& manifest, int64_t now_ms,
                           bool filling) {
  TH_ASSIGN_OR_RETURN(Worker * reporter,
                      ReportingWorker(worker, model, version, now_ms));
  // The usual report repeats the committed manifest, which was validated
  // when it was stored: one comparison instead of a validation.
  const VersionEntry* known = FindVersion(model, version);
  const bool same_as_committed = known != nullptr &&
                                 known->manifest.has_value() &&
                                 *known->manifest == manifest;
  if (!same_as_committed) TH_RETURN_IF_ERROR(manifest.Validate());
  const std::string vname = VersionName(model, version);
  auto mit = models_.find(model);
  if (mit == models_.end()) {
    if (models_.size() >= config_.max_models) {
      return ResourceExhausted("hub already tracks " +
                               std::to_string(models_.size()) + " models");
    }
    mit = models_.emplace(model, Model{}).first;
  }
  Model& m = mit->second;
  auto vit = m.versions.find(version);
  if (vit == m.versions.end()) {
    // Only a committed version can have been fetched, so a full copy
    // reported to a hub that does not know the version (it restarted)
    // re-creates it as committed.
    VersionEntry v;
    v.state = VersionState::kCommitted;
    v.group_size = manifest.group_size();
    v.chunk_bytes = manifest.chunk_bytes();
    SetManifest(v, manifest);
    vit = m.versions.emplace(version, std::move(v)).first;
    Created(model, m, version, vit->second);
  }
  VersionEntry& v = vit->second;
  if (v.state == VersionState::kAborted) {
    return Aborted(vname + " was aborted");
  }
  if (v.state == VersionState::kPending) {
    // Trainer ranks re-reported before any full holder did: the full copy
    // proves the version had committed. Its parts must agree. The group
    // size is checked first: it bounds the index into manifest.parts().
    if (v.group_size != manifest.group_size() ||
        v.chunk_bytes != manifest.chunk_bytes()) {
      return InvalidArgument("manifest of " + vname +
                             " differs from the published one");
    }
    for (uint32_t r = 0; r < v.parts.size(); ++r) {
      if (v.parts[r].has_value() && !(*v.parts[r] == manifest.parts()[r])) {
        return InvalidArgument("manifest of " + vname +
                               " differs from the published part " +
                               std::to_string(r));
      }
    }
    v.parts.clear();
    SetManifest(v, manifest);
    v.state = VersionState::kCommitted;
  }
  if (!same_as_committed && !(*v.manifest == manifest)) {
    return InvalidArgument("manifest of " + vname +
                           " differs from the committed one");
  }
  return AttachHolder(*reporter, worker, model, version, v, epoch, filling);
}

Result<bool> HubState::AddHolderByDigest(const WorkerId& worker,
                                         const std::string& model,
                                         Version version, uint64_t epoch,
                                         ManifestDigest digest, int64_t now_ms,
                                         bool filling) {
  TH_ASSIGN_OR_RETURN(Worker * reporter,
                      ReportingWorker(worker, model, version, now_ms));
  VersionEntry* v = FindVersion(model, version);
  if (v != nullptr && v->state == VersionState::kAborted) {
    return Aborted(VersionName(model, version) + " was aborted");
  }
  // Nothing to compare with: the caller must send the manifest itself.
  if (v == nullptr || !v->manifest.has_value()) return false;
  if (!(v->manifest_digest == digest)) {
    return InvalidArgument("manifest of " + VersionName(model, version) +
                           " differs from the committed one (digest " +
                           std::to_string(digest.value) + ", committed " +
                           std::to_string(v->manifest_digest.value) + ")");
  }
  TH_RETURN_IF_ERROR(
      AttachHolder(*reporter, worker, model, version, *v, epoch, filling));
  return true;
}

Status HubState::AttachHolder(Worker& w, const WorkerId& worker,
                              const std::string& model, Version version,
                              VersionEntry& v, uint64_t epoch, bool filling) {
  if (filling && v.has_pieces) {
    // A reader of a version of pieces receives logical tensors, not the
    // parts' bytes: it can serve no chunk, so it is never a source of
    // chunks (it serves its tensors as a holder of slices, once fetched).
    return FailedPrecondition(VersionName(model, version) +
                              " is published as pieces: a whole fetch of it "
                              "reads slices and serves them once it has them "
                              "(a holder of slices), not while it fills");
  }
  auto rit = v.refs.find(worker);
  if (rit != v.refs.end() && rit->second.rank.has_value() && filling) {
    return FailedPrecondition("worker " + worker.value() + " holds rank " +
                              std::to_string(*rit->second.rank) + " of " +
                              VersionName(model, version) + " already");
  }
  const bool was_complete = rit != v.refs.end() && !rit->second.filling;
  Reference& ref = v.refs[worker];
  Unfile(v, ref);
  // A trainer rank that fetched the rest now holds everything.
  ref.rank.reset();
  if (ref.join_seq == 0) ref.join_seq = v.next_join++;
  ref.epoch = epoch;
  // A complete holder receiving again (readers placed anywhere may read
  // from it): it is placed before every line, so that it reads only from
  // complete holders and the pipeline stays a DAG; sources it was given
  // before are released (it asks again).
  const bool refill = rack_aware_ && was_complete && filling;
  if (refill) ref.placement = 1;
  ref.filling = filling;
  File(v, worker, ref, w.reg.labels);
  if (!filling || refill) EndFetch(v, worker);
  UpdateAvailability(v);
  w.refs.insert({model, version});
  return Status::Ok();
}

Status HubState::Unpublish(const WorkerId& worker, const std::string& model,
                           Version version, int64_t now_ms) {
  auto wit = workers_.find(worker);
  if (wit == workers_.end()) {
    return NotFound("hub does not know worker " + worker.value() +
                    "; register again");
  }
  Renew(wit->second, now_ms);
  const bool full = wit->second.refs.count({model, version}) > 0;
  const bool slices = wit->second.slices.count({model, version}) > 0;
  if (!full && !slices) {
    return NotFound("worker " + worker.value() + " holds no reference to " +
                    VersionName(model, version));
  }
  if (slices) DropSliceReference(model, version, worker);
  if (full) DropReference(model, version, worker);
  return Status::Ok();
}

void HubState::DropSliceReference(const std::string& model, Version version,
                                  const WorkerId& worker) {
  auto wit = workers_.find(worker);
  if (wit != workers_.end()) wit->second.slices.erase({model, version});
  auto mit = models_.find(model);
  if (mit == models_.end()) return;
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return;
  VersionEntry& v = vit->second;
  auto it = v.slice_refs.find(worker);
  if (it == v.slice_refs.end()) return;
  CountSliceBoxes(v, it->second.slices, -1);
  v.slice_refs.erase(it);
  UpdateAvailability(v);
  Prune(model, mit->second);
}

void HubState::CountSliceBoxes(VersionEntry& v, const PartLayout& slices,
                               int delta) {
  bool changed = false;
  for (const TensorLayout& t : slices.tensors) {
    const Box box = t.PieceBox();
    if (delta > 0) {
      changed |= v.slice_boxes[t.spec.name][box]++ == 0;
      continue;
    }
    auto named = v.slice_boxes.find(t.spec.name);
    TH_CHECK(named != v.slice_boxes.end());
    auto it = named->second.find(box);
    TH_CHECK(it != named->second.end());
    if (--it->second == 0) {
      named->second.erase(it);
      changed = true;
      if (named->second.empty()) v.slice_boxes.erase(named);
    }
  }
  if (changed) CoverBySlices(v);
}

void HubState::CoverBySlices(VersionEntry& v) {
  v.parts_in_slices.clear();
  if (!v.manifest.has_value()) return;
  std::vector<Box> boxes;
  for (const PartLayout& p : v.manifest->parts()) {
    bool covered = true;
    for (const TensorLayout& t : p.tensors) {
      const Box piece = t.PieceBox();
      if (piece.Elements() == 0) continue;
      auto it = v.slice_boxes.find(t.spec.name);
      boxes.clear();
      if (it != v.slice_boxes.end()) {
        for (const auto& [box, holders] : it->second) boxes.push_back(box);
      }
      if (!SliceHoldersCover(piece, piece, boxes, t.GlobalShape())) {
        covered = false;
        break;
      }
    }
    v.parts_in_slices.push_back(covered);
  }
}

Status HubState::CheckSlices(const std::string& vname, const Manifest& m,
                             const PartLayout& slices) {
  TH_RETURN_IF_ERROR(Manifest::ValidatePart(slices, m.chunk_bytes())
                         .WithContext("slices of " + vname));
  std::map<std::string_view, const TensorLayout*> logical;
  for (const PartLayout& p : m.parts()) {
    for (const TensorLayout& t : p.tensors) logical.emplace(t.spec.name, &t);
  }
  std::map<std::string_view, size_t> boxes;
  for (const TensorLayout& b : slices.tensors) {
    const std::string what =
        "slice of tensor '" + b.spec.name + "' of " + vname;
    auto it = logical.find(b.spec.name);
    if (it == logical.end()) {
      return InvalidArgument(what + ": no such tensor in the version");
    }
    const TensorLayout& t = *it->second;
    if (b.spec.dtype != t.spec.dtype || b.GlobalShape() != t.GlobalShape()) {
      return InvalidArgument(what +
                             ": dtype or global shape differs from the "
                             "version's");
    }
    TH_RETURN_IF_ERROR(CheckBoxInShape(b.PieceBox(), t.GlobalShape(), what));
    if (b.seg.rows == 0) {
      return InvalidArgument(what + " has no segment checksums");
    }
    if (++boxes[b.spec.name] > kMaxSliceBoxesPerTensor) {
      return InvalidArgument(what + ": more than " +
                             std::to_string(kMaxSliceBoxesPerTensor) +
                             " boxes of one tensor");
    }
  }
  return Status::Ok();
}

Status HubState::AddSliceHolder(const WorkerId& worker,
                                const std::string& model, Version version,
                                uint64_t epoch, const PartLayout& slices,
                                int64_t now_ms) {
  TH_ASSIGN_OR_RETURN(Worker * w,
                      ReportingWorker(worker, model, version, now_ms));
  const std::string vname = VersionName(model, version);
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr || !v->manifest.has_value() ||
      v->state == VersionState::kAborted) {
    return FailedPrecondition("hub has no committed manifest of " + vname +
                              " (yet): report the slices again later");
  }
  TH_RETURN_IF_ERROR(CheckSlices(vname, *v->manifest, slices));
  auto it = v->slice_refs.find(worker);
  if (it == v->slice_refs.end()) {
    if (v->slice_refs.size() >= kMaxSliceHoldersPerVersion) {
      return ResourceExhausted(vname + " has " +
                               std::to_string(kMaxSliceHoldersPerVersion) +
                               " holders of slices already");
    }
    it = v->slice_refs.emplace(worker, VersionEntry::SliceRef{}).first;
    it->second.join_seq = v->next_join++;
  } else {
    CountSliceBoxes(*v, it->second.slices, -1);
  }
  it->second.epoch = epoch;
  it->second.slices = slices;
  CountSliceBoxes(*v, slices, +1);
  w->slices.insert({model, version});
  UpdateAvailability(*v);
  return Status::Ok();
}

Result<std::vector<HolderView>> HubState::ScheduleSlices(
    const WorkerId& reader, const std::string& model, Version version,
    const std::set<WorkerId>& exclude, size_t max_sources,
    const std::vector<SliceWant>& wants) {
  Result<std::vector<HolderView>> chunks =
      Schedule(reader, model, version, exclude, max_sources);
  if (wants.empty()) return chunks;
  // Schedule's UNAVAILABLE for a committed version: no holder of chunks
  // left to read from, and holders of slices may still hold it all.
  VersionEntry* v = FindVersion(model, version);
  if ((!chunks.ok() && chunks.status().code() != StatusCode::kUnavailable) ||
      v == nullptr || v->state != VersionState::kCommitted) {
    return chunks;
  }
  std::vector<HolderView> out =
      SliceSources(*v, reader, exclude, max_sources, &wants,
                   chunks.ok() ? *chunks : std::vector<HolderView>{});
  if (!chunks.ok()) {
    if (out.empty()) return chunks.status();
    return out;
  }
  // Holders of slices first: a reader prefers them (at equal load), which
  // takes their share off the trainer ranks and full holders.
  out.insert(out.end(), std::make_move_iterator(chunks->begin()),
             std::make_move_iterator(chunks->end()));
  return out;
}

std::vector<HolderView> HubState::SliceSources(
    VersionEntry& v, const WorkerId& reader, const std::set<WorkerId>& exclude,
    size_t max_sources, const std::vector<SliceWant>* wants,
    const std::vector<HolderView>& chunks) {
  if (v.slice_refs.empty() || !v.manifest.has_value()) return {};
  Labels near;
  if (auto rit = workers_.find(reader); rit != workers_.end()) {
    near = rit->second.reg.labels;
  }
  std::multimap<std::string_view, const Box*> wanted;
  if (wants != nullptr) {
    for (const SliceWant& w : *wants) wanted.emplace(w.name, &w.box);
  }
  auto useful = [&](const PartLayout& slices) {
    if (wants == nullptr) return !slices.tensors.empty();
    for (const TensorLayout& b : slices.tensors) {
      auto [lo, hi] = wanted.equal_range(b.spec.name);
      for (auto it = lo; it != hi; ++it) {
        if (Intersect(*it->second, b.PieceBox())) return true;
      }
    }
    return false;
  };
  // (distance, rotated join order, worker)
  std::vector<std::tuple<int, uint64_t, const WorkerId*>> found;
  const uint64_t turn = v.slice_schedules++;
  for (const auto& [id, ref] : v.slice_refs) {
    auto wit = workers_.find(id);
    if (id == reader || exclude.count(id) > 0 || wit == workers_.end() ||
        !useful(ref.slices)) {
      continue;
    }
    found.emplace_back(Distance(near, wit->second.reg.labels),
                       (ref.join_seq + turn) % v.next_join, &id);
  }
  std::sort(found.begin(), found.end());
  std::vector<bool> chosen(found.size(), false);
  for (size_t i = 0; i < found.size() && i < max_sources; ++i) chosen[i] = true;
  // The parts no complete holder among `chunks` holds (a filling one may
  // never finish): the holders of slices must hold their wanted bytes.
  const Manifest& m = *v.manifest;
  std::vector<bool> held(m.parts().size(), false);
  for (const HolderView& h : chunks) {
    auto r = v.refs.find(h.worker);
    if (r == v.refs.end() || r->second.filling) continue;
    if (!r->second.rank.has_value()) {
      held.assign(held.size(), true);
      break;
    }
    held[*r->second.rank] = true;
  }
  // The chosen holders' boxes by tensor, and (built when first needed)
  // every candidate's, in the order of `found`.
  std::map<std::string_view, std::vector<Box>> have;
  auto take = [&](size_t i) {
    chosen[i] = true;
    for (const TensorLayout& b :
         v.slice_refs.at(*std::get<2>(found[i])).slices.tensors) {
      have[b.spec.name].push_back(b.PieceBox());
    }
  };
  for (size_t i = 0; i < found.size(); ++i) {
    if (chosen[i]) take(i);
  }
  std::map<std::string_view, std::vector<std::pair<size_t, Box>>> offered;
  auto cover = [&](const Box& piece, const Box& region, const TensorLayout& t) {
    const std::vector<uint64_t> shape = t.GlobalShape();
    std::vector<Box>& boxes = have[t.spec.name];
    if (SliceHoldersCover(piece, region, boxes, shape)) return;
    if (offered.empty()) {
      for (size_t i = 0; i < found.size(); ++i) {
        for (const TensorLayout& b :
             v.slice_refs.at(*std::get<2>(found[i])).slices.tensors) {
          offered[b.spec.name].emplace_back(i, b.PieceBox());
        }
      }
    }
    for (const auto& [i, box] : offered[t.spec.name]) {
      if (chosen[i] || !Intersect(region, box)) continue;
      take(i);
      if (SliceHoldersCover(piece, region, boxes, shape)) return;
    }
  };
  for (const PartLayout& p : m.parts()) {
    if (held[p.rank] || m.chunk_base(p.rank) == m.chunk_base(p.rank + 1)) {
      continue;
    }
    for (const TensorLayout& t : p.tensors) {
      const Box piece = t.PieceBox();
      if (wants == nullptr) {
        cover(piece, piece, t);
        continue;
      }
      auto [lo, hi] = wanted.equal_range(t.spec.name);
      for (auto it = lo; it != hi; ++it) {
        if (std::optional<Box> r = Intersect(*it->second, piece)) {
          cover(piece, *r, t);
        }
      }
    }
  }
  std::vector<HolderView> out;
  for (size_t i = 0; i < found.size(); ++i) {
    if (!chosen[i]) continue;
    const WorkerId& id = *std::get<2>(found[i]);
    const Worker& w = workers_.at(id);
    const VersionEntry::SliceRef& ref = v.slice_refs.at(id);
    HolderView hv;
    hv.worker = id;
    hv.data_address = w.reg.data_address;
    hv.labels = w.reg.labels;
    hv.worker_class = w.reg.worker_class;
    hv.epoch = ref.epoch;
    hv.slice_holder = true;
    hv.slices = ref.slices;
    out.push_back(std::move(hv));
  }
  return out;
}

void HubState::DropReference(const std::string& model, Version version,
                             const WorkerId& worker) {
  auto wit = workers_.find(worker);
  if (wit != workers_.end()) wit->second.refs.erase({model, version});
  auto mit = models_.find(model);
  if (mit == models_.end()) return;
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return;
  VersionEntry& v = vit->second;
  auto rit = v.refs.find(worker);
  if (rit == v.refs.end()) return;
  // Readers that had it as a source find out on their next read and ask
  // for new sources; its serving count goes with it.
  Unfile(v, rit->second);
  v.refs.erase(rit);
  v.departing.erase(worker);
  EndFetch(v, worker);
  std::erase_if(v.deltas,
                [&](const auto& d) { return d.first.second == worker; });
  v.relays_declined.erase(worker);
  if (v.state == VersionState::kPending) {
    // A rank left before its group committed: the version can never
    // complete. Abort it and drop the other ranks' references.
    v.state = VersionState::kAborted;
    v.parts.clear();
    for (const auto& [other, ref] : v.refs) {
      auto oit = workers_.find(other);
      if (oit != workers_.end()) oit->second.refs.erase({model, version});
    }
    v.refs.clear();
    v.index = HolderIndex{};
  } else {
    UpdateAvailability(v);
  }
  Prune(model, mit->second);
}

void HubState::UpdateAvailability(VersionEntry& v) {
  if (v.state != VersionState::kCommitted &&
      v.state != VersionState::kUnavailable) {
    return;
  }
  // Committed and readable only while every part (with bytes) is held
  // by a live holder that is not filling (a filling holder is no copy
  // yet): a complete full holder holds them all, a trainer rank its own,
  // and holders of slices together those whose every piece lies in their
  // boxes where a reader can read it (parts_in_slices).
  bool covered = true;
  if (v.index.full_complete == 0) {
    const Manifest& m = *v.manifest;
    for (uint32_t r = 0; covered && r < v.group_size; ++r) {
      covered = m.chunk_base(r) == m.chunk_base(r + 1) ||
                v.index.rank_holders.count(r) > 0 ||
                (r < v.parts_in_slices.size() && v.parts_in_slices[r]);
    }
  }
  v.state = covered ? VersionState::kCommitted : VersionState::kUnavailable;
}

bool HubState::CoveredByChunkHolders(const VersionEntry& v) {
  if (!v.manifest.has_value()) return false;
  if (v.index.full_complete > 0) return true;
  for (uint32_t r = 0; r < v.group_size; ++r) {
    if (v.manifest->chunk_base(r) != v.manifest->chunk_base(r + 1) &&
        v.index.rank_holders.count(r) == 0) {
      return false;
    }
  }
  return true;
}

void HubState::Prune(const std::string& model, Model& m) {
  auto unheld = [](const VersionEntry& v) {
    return v.refs.empty() && v.slice_refs.empty();
  };
  size_t dead = 0;
  for (const auto& [version, v] : m.versions) {
    if (unheld(v)) ++dead;
  }
  // Oldest first: forget versions nobody holds beyond the bound.
  for (auto it = m.versions.begin();
       it != m.versions.end() && dead > config_.max_dead_versions_per_model;) {
    if (unheld(it->second)) {
      // A forgotten version's pin goes with it (the durable store stays
      // bounded by what the hub knows).
      if (it->second.retained) {
        Record({DurableChange::Kind::kUnpin, model, it->first, {}, {}});
      }
      it = m.versions.erase(it);
      --dead;
    } else {
      ++it;
    }
  }
}

std::vector<ChunkRange> HubState::RangesOf(const VersionEntry& v,
                                           const Reference& r) {
  if (!v.manifest.has_value()) return {};
  if (!r.rank.has_value()) return {{0, v.manifest->num_chunks()}};
  return {
      {v.manifest->chunk_base(*r.rank), v.manifest->chunk_base(*r.rank + 1)}};
}

uint64_t HubState::FiledOrder(const Reference& r) const {
  if (!rack_aware_ || !r.filling) return r.join_seq;
  return r.placement > 0 ? r.placement : kUnplaced;
}

void HubState::File(VersionEntry& v, const WorkerId& id, Reference& r,
                    const Labels& labels) const {
  TH_CHECK(!r.filed.has_value());
  Filed f{HolderKey{r.serving, FiledOrder(r), id}, r.filling, r.rank, labels};
  HolderIndex& x = v.index;
  auto add = [&](HolderSet& set) {
    bool fresh = (f.filling ? set.filling : set.complete).insert(f.key).second;
    TH_CHECK(fresh);
  };
  add(x.all);
  add(x.by_dc[labels.datacenter]);
  if (!labels.rack.empty()) add(x.by_rack[{labels.datacenter, labels.rack}]);
  if (!labels.host.empty()) add(x.by_host[{labels.datacenter, labels.host}]);
  if (f.rank.has_value()) {
    bool fresh = x.rank_holders.emplace(*f.rank, id).second;
    TH_CHECK(fresh);  // Publish lets one worker hold each rank
  } else if (!f.filling) {
    ++x.full_complete;
  }
  r.filed = std::move(f);
}

void HubState::Unfile(VersionEntry& v, Reference& r) {
  if (!r.filed.has_value()) return;
  const Filed& f = *r.filed;
  HolderIndex& x = v.index;
  auto remove = [&](HolderSet& set) {
    size_t erased = (f.filling ? set.filling : set.complete).erase(f.key);
    TH_CHECK_EQ(erased, 1u);
  };
  // Groups are erased when they empty, so the index stays as large as the
  // set of holders.
  auto remove_from = [&](auto& groups, const auto& group) {
    auto it = groups.find(group);
    TH_CHECK(it != groups.end());
    remove(it->second);
    if (it->second.empty()) groups.erase(it);
  };
  remove(x.all);
  remove_from(x.by_dc, f.labels.datacenter);
  if (!f.labels.rack.empty()) {
    remove_from(x.by_rack, std::make_pair(f.labels.datacenter, f.labels.rack));
  }
  if (!f.labels.host.empty()) {
    remove_from(x.by_host, std::make_pair(f.labels.datacenter, f.labels.host));
  }
  if (f.rank.has_value()) {
    x.rank_holders.erase(*f.rank);
  } else if (!f.filling) {
    --x.full_complete;
  }
  r.filed.reset();
}

void HubState::Refile(VersionEntry& v, const WorkerId& id, Reference& r) const {
  TH_CHECK(r.filed.has_value());
  Filed& f = *r.filed;
  if (f.filling != r.filling || f.rank != r.rank) {
    Labels labels = f.labels;
    Unfile(v, r);
    File(v, id, r, labels);
    return;
  }
  // Only its key moves (serving, placement), within the sets it is in:
  // each node re-keyed in place, no group made or erased, nothing copied
  // (the scheduler's most frequent update: every source assigned or
  // released). The same sets and order as Unfile then File.
  const HolderKey fresh{r.serving, FiledOrder(r), id};
  HolderIndex& x = v.index;
  auto rekey = [&](HolderSet& set) {
    std::set<HolderKey>& keys = f.filling ? set.filling : set.complete;
    auto node = keys.extract(f.key);
    TH_CHECK(!node.empty());
    node.value() = fresh;
    TH_CHECK(keys.insert(std::move(node)).inserted);
  };
  auto rekey_in = [&](auto& groups, const auto& group) {
    auto it = groups.find(group);
    TH_CHECK(it != groups.end());
    rekey(it->second);
  };
  rekey(x.all);
  rekey_in(x.by_dc, f.labels.datacenter);
  if (!f.labels.rack.empty()) {
    rekey_in(x.by_rack, std::make_pair(f.labels.datacenter, f.labels.rack));
  }
  if (!f.labels.host.empty()) {
    rekey_in(x.by_host, std::make_pair(f.labels.datacenter, f.labels.host));
  }
  f.key = fresh;
}

// Distance from the reader: 0 same host, 1 same rack, 2 same datacenter, 3
// another datacenter (an empty host or rack label matches nothing). Each
// group below holds every holder at its distance, and possibly nearer ones;
// a search that reaches a group has found no usable nearer holder, so the
// nearer ones it meets there are unusable too and are skipped.
std::vector<HubState::Level> HubState::LevelsFor(const VersionEntry& v,
                                                 const Labels& reader) {
  std::vector<Level> out;
  const HolderIndex& x = v.index;
  if (!reader.host.empty()) {
    auto it = x.by_host.find({reader.datacenter, reader.host});
    if (it != x.by_host.end()) out.push_back({&it->second, 0});
  }
  if (!reader.rack.empty()) {
    auto it = x.by_rack.find({reader.datacenter, reader.rack});
    if (it != x.by_rack.end()) out.push_back({&it->second, 1});
  }
  auto it = x.by_dc.find(reader.datacenter);
  if (it != x.by_dc.end()) out.push_back({&it->second, 2});
  out.push_back({&x.all, 3});
  return out;
}

int HubState::Distance(const Labels& reader, const Labels& holder) {
  // The levels LevelsFor walks: host, rack, datacenter, everything.
  if (reader.datacenter != holder.datacenter) return 3;
  if (!reader.host.empty() && reader.host == holder.host) return 0;
  if (!reader.rack.empty() && reader.rack == holder.rack) return 1;
  return 2;
}

HolderView HubState::ViewOf(const VersionEntry& v, const WorkerId& id) const {
  const Reference& ref = v.refs.at(id);
  const Worker& w = workers_.at(id);  // a worker's references leave with it
  HolderView hv;
  hv.worker = id;
  hv.data_address = w.reg.data_address;
  hv.endpoints = w.reg.endpoints;
  hv.labels = w.reg.labels;
  hv.worker_class = w.reg.worker_class;
  hv.epoch = ref.epoch;
  hv.chunks = RangesOf(v, ref);  // empty while pending: ids not fixed yet
  hv.filling = ref.filling;
  return hv;
}

Status HubState::CheckReadable(const std::string& vname,
                               const VersionEntry& v) {
  switch (v.state) {
    case VersionState::kPending: {
      size_t have = 0;
      for (const auto& p : v.parts) have += p.has_value() ? 1 : 0;
      return FailedPrecondition(
          vname + " is not committed: " + std::to_string(have) + " of " +
          std::to_string(v.group_size) + " ranks have published");
    }
    case VersionState::kAborted:
      return Aborted(vname + " was aborted before commit");
    case VersionState::kUnavailable:
      return Unavailable(vname +
                         " is committed but no live worker holds "
                         "all of its chunks");
    case VersionState::kCommitted:
      break;
  }
  return Status::Ok();
}

std::optional<Manifest> HubState::CommittedManifest(const std::string& model,
                                                    Version version) {
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr) return std::nullopt;
  return v->manifest;
}

std::optional<VersionState> HubState::StateOf(const std::string& model,
                                              Version version) {
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr) return std::nullopt;
  return v->state;
}

Result<Resolution> HubState::Resolve(const WorkerId& reader,
                                     const std::string& model, Version version,
                                     bool include_uncommitted,
                                     bool copy_manifest, bool list_holders) {
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  auto mit = models_.find(model);
  if (mit == models_.end()) {
    return NotFound("model '" + model + "' is unknown to the hub");
  }
  Model& m = mit->second;
  auto vit = m.versions.end();
  if (version.is_latest()) {
    for (auto it = m.versions.rbegin(); it != m.versions.rend(); ++it) {
      if (it->second.state == VersionState::kCommitted) {
        vit = std::prev(it.base());
        break;
      }
    }
    if (vit == m.versions.end()) {
      return NotFound("model '" + model +
                      "' has no committed version with "
                      "a live holder");
    }
  } else {
    vit = m.versions.find(version);
    if (vit == m.versions.end()) {
      return NotFound("model '" + model + "' has no version " +
                      std::to_string(version.value()));
    }
  }
  VersionEntry& v = vit->second;
  const std::string vname = VersionName(model, vit->first);
  if (!include_uncommitted) {
    TH_RETURN_IF_ERROR(CheckReadable(vname, v));
  }
  Resolution res;
  res.version = vit->first;
  res.state = v.state;
  if (v.manifest.has_value()) {
    res.manifest_digest = v.manifest_digest;
    if (copy_manifest) res.manifest = v.manifest;
  }
  res.num_holders = static_cast<uint32_t>(v.refs.size() - v.refs.count(reader));
  res.retained = IsRetained(m, vit->first, v);
  if (!list_holders) return res;
  Labels reader_labels;
  auto rit = workers_.find(reader);
  if (rit != workers_.end()) reader_labels = rit->second.reg.labels;
  // The nearest holders, group by group; within a group complete and
  // filling holders merged in Schedule's order. Everything nearer than a
  // group was listed before it (or the list is full), so what is listed
  // already is skipped: at most kMaxResolveHolders steps of that kind.
  struct Listed {
    int distance;
    const WorkerId* worker;
  };
  std::vector<Listed> listed;
  std::set<WorkerId> seen;
  for (const Level& level : LevelsFor(v, reader_labels)) {
    auto c = level.set->complete.begin();
    auto f = level.set->filling.begin();
    while (listed.size() < kMaxResolveHolders &&
           (c != level.set->complete.end() || f != level.set->filling.end())) {
      bool take_c = f == level.set->filling.end() ||
                    (c != level.set->complete.end() && *c < *f);
      const HolderKey& k = take_c ? *c++ : *f++;
      if (k.worker == reader || !seen.insert(k.worker).second) continue;
      listed.push_back({level.distance, &k.worker});
    }
  }
  // Within one distance, rotate from one resolve to the next so that
  // readers that use this list spread over equally near holders.
  uint64_t shift = v.resolve_count++;
  for (auto begin = listed.begin(); begin != listed.end();) {
    auto end = std::find_if(begin, listed.end(), [&](const Listed& l) {
      return l.distance != begin->distance;
    });
    std::rotate(begin, begin + static_cast<long>(shift % (end - begin)), end);
    begin = end;
  }
  for (const Listed& l : listed) {
    res.holders.push_back(ViewOf(v, *l.worker));
    if (!v.deltas.empty()) {
      res.holders.back().deltas = OffersFor(model, v, *l.worker, reader);
    }
  }
  return res;
}

Result<FetchStart> HubState::BeginFetch(const BeginFetchArgs& a,
                                        int64_t now_ms) {
  const bool group = !a.group.empty() && a.version.is_latest();
  Result<Resolution> res =
      group ? ResolveForGroup(a.reader, a.model, a.group, a.group_step, now_ms,
                              /*copy_manifest=*/false, /*list_holders=*/false)
            : Resolve(a.reader, a.model, a.version, false,
                      /*copy_manifest=*/false, /*list_holders=*/false);
  if (!res.ok() && res.status().code() == StatusCode::kUnavailable &&
      !a.version.is_latest() && a.settled &&
      StateOf(a.model, a.version) == VersionState::kUnavailable) {
    // The considered answer: the version, its manifest and the (filling)
    // holders left, so the reader can tell it from an unreachable hub.
    res = Resolve(a.reader, a.model, a.version, /*include_uncommitted=*/true,
                  /*copy_manifest=*/false, /*list_holders=*/false);
  }
  if (!res.ok()) return res.status();
  FetchStart out;
  out.resolution = std::move(res).value();
  const Version version = out.resolution.version;
  // A whole fetch reads this version as slices: it has pieces, or its
  // holders of chunks left parts to holders of slices.
  VersionEntry* v = FindVersion(a.model, version);
  const bool as_slices = v != nullptr && v->state == VersionState::kCommitted &&
                         (v->has_pieces || !CoveredByChunkHolders(*v));
  if (a.fill_epoch.has_value()) {
    if (!out.resolution.manifest_digest.has_value()) {
      out.filling = FailedPrecondition(VersionName(a.model, version) +
                                       " has no committed manifest here");
    } else if (as_slices && !v->has_pieces) {
      out.filling = FailedPrecondition(
          VersionName(a.model, version) +
          " is held in part only by holders of slices: a whole fetch of it "
          "reads slices and serves them once it has them");
    } else {
      Result<bool> filled = AddHolderByDigest(
          a.reader, a.model, version, *a.fill_epoch,
          *out.resolution.manifest_digest, now_ms, /*filling=*/true);
      out.filling = filled.ok() ? Status::Ok() : filled.status();
    }
  }
  Result<std::vector<HolderView>> sources =
      Schedule(a.reader, a.model, version, {}, a.max_sources);
  out.delta_pending = DeltaPending(a.reader, a.model, version);
  if (as_slices) {
    std::vector<HolderView> slices =
        SliceSources(*v, a.reader, {}, a.max_sources, /*wants=*/nullptr,
                     sources.ok() ? *sources : std::vector<HolderView>{});
    if (!slices.empty()) {
      if (sources.ok()) {
        slices.insert(slices.end(), std::make_move_iterator(sources->begin()),
                      std::make_move_iterator(sources->end()));
      }
      out.sources = std::move(slices);
      return out;
    }
  }
  if (sources.ok()) {
    out.sources = std::move(sources).value();
    out.recheck_after_ms = RecheckAfterMs(a.reader, a.model, version);
    return out;
  }
  out.sources_status = sources.status();
  out.sources_unavailable =
      a.settled && sources.status().code() == StatusCode::kUnavailable &&
      StateOf(a.model, version) == VersionState::kUnavailable;
  // No source now: the reader falls back to the nearest holders.
  Result<Resolution> listed =
      Resolve(a.reader, a.model, version, /*include_uncommitted=*/true,
              /*copy_manifest=*/false, /*list_holders=*/true);
  if (listed.ok()) out.resolution.holders = std::move(listed->holders);
  return out;
}

void HubState::Release(VersionEntry& v, const WorkerId& reader) {
  auto it = v.assignments.find(reader);
  if (it == v.assignments.end()) return;
  for (const Edge& e : it->second.edges) {
    auto r = v.refs.find(e.source);  // it may have left since
    if (r != v.refs.end() && r->second.serving > 0) {
      --r->second.serving;
      Refile(v, e.source, r->second);
    }
    if (e.uplinks.has_value()) {
      const auto& [out_of, into] = *e.uplinks;
      if (!out_of.second.empty()) {
        Uncount(out_of, &RackUse::out);
        auto x = v.exits.find(out_of);
        if (x != v.exits.end()) {
          x->second.erase({e.source, reader});
          if (x->second.empty()) v.exits.erase(x);
        }
      }
      if (!into.second.empty()) Uncount(into, &RackUse::in);
    }
  }
  v.assignments.erase(it);
}

void HubState::EndFetch(VersionEntry& v, const WorkerId& reader) {
  Release(v, reader);
  v.progress.erase(reader);
}

HubState::VersionEntry* HubState::FindVersion(const std::string& model,
                                              Version version) {
  auto mit = models_.find(model);
  if (mit == models_.end()) return nullptr;
  auto vit = mit->second.versions.find(version);
  return vit == mit->second.versions.end() ? nullptr : &vit->second;
}

// ---- Deltas ----

namespace {

// Deltas pair chunk i of one version with chunk i of another: the two must
// cut the same bytes into the same chunks.
bool SameLayout(const Manifest& a, const Manifest& b) {
  if (a.group_size() != b.group_size() || a.chunk_bytes() != b.chunk_bytes())
    return false;
  for (size_t p = 0; p < a.parts().size(); ++p) {
    if (a.parts()[p].part_bytes != b.parts()[p].part_bytes) return false;
  }
  return true;
}

// The most a delta of a version of `m` may be (index and chunk headers
// included): more is no delta worth serving, and a report claiming more
// is refused.
uint64_t MaxDeltaBytes(const Manifest& m) {
  return m.total_bytes() + 64 * m.num_chunks() + 4096;
}

}  // namespace

bool HubState::HoldsWhole(const WorkerId& worker, const std::string& model,
                          Version version) const {
  auto mit = models_.find(model);
  if (mit == models_.end()) return false;
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return false;
  const VersionEntry& v = vit->second;
  if (!v.manifest.has_value() || v.state == VersionState::kAborted) {
    return false;
  }
  auto rit = v.refs.find(worker);
  if (rit == v.refs.end() || rit->second.filling) return false;
  return !rit->second.rank.has_value() || v.group_size == 1;
}

namespace {
// A delta's base must be an older version of the same model.
Status CheckDeltaBase(const std::string& vname, Version version, Version base) {
  if (base.value() == 0 || base >= version) {
    return InvalidArgument("delta of " + vname + ": the base " +
                           std::to_string(base.value()) +
                           " must be an older version");
  }
  return Status::Ok();
}
}  // namespace

Result<bool> HubState::ClaimDelta(const WorkerId& worker,
                                  const std::string& model, Version version,
                                  Version base, int64_t now_ms) {
  TH_RETURN_IF_ERROR(ReportingWorker(worker, model, version, now_ms).status());
  const std::string vname = VersionName(model, version);
  TH_RETURN_IF_ERROR(CheckDeltaBase(vname, version, base));
  VersionEntry* v = FindVersion(model, version);
  VersionEntry* b = FindVersion(model, base);
  if (v == nullptr) return NotFound("hub does not know " + vname);
  if (b == nullptr || !HoldsWhole(worker, model, version) ||
      !HoldsWhole(worker, model, base)) {
    return FailedPrecondition("worker " + worker.value() +
                              " does not hold both " + vname + " and " +
                              VersionName(model, base) + " whole");
  }
  if (!SameLayout(*v->manifest, *b->manifest)) {
    return FailedPrecondition(vname + " and " + VersionName(model, base) +
                              " cut their bytes into different chunks: no "
                              "delta between them");
  }
  // Entries go with their holders' references: these are live.
  if (v->deltas.count({base, worker}) > 0) return true;
  // Once per datacenter: its first holder of both makes it for its
  // readers, so that the wide-area link carries it once.
  if (DeltaInDatacenter(*v, base, worker)) return false;
  if (v->deltas.size() >= kMaxDeltasPerVersion) return false;
  v->deltas[{base, worker}] = VersionEntry::DeltaRef{};
  return true;
}

Status HubState::AddDelta(const WorkerId& worker, const std::string& model,
                          Version version, Version base, uint64_t bytes,
                          int64_t now_ms) {
  TH_RETURN_IF_ERROR(ReportingWorker(worker, model, version, now_ms).status());
  const std::string vname = VersionName(model, version);
  TH_RETURN_IF_ERROR(CheckDeltaBase(vname, version, base));
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr) return NotFound("hub does not know " + vname);
  if (!HoldsWhole(worker, model, version)) {
    return FailedPrecondition("worker " + worker.value() + " does not hold " +
                              vname + " whole: it cannot serve its delta");
  }
  if (bytes == 0 || bytes > MaxDeltaBytes(*v->manifest)) {
    return InvalidArgument("delta of " + vname + ": " + std::to_string(bytes) +
                           " bytes is no size a delta of it can have");
  }
  auto it = v->deltas.find({base, worker});
  if (it == v->deltas.end()) {
    if (v->deltas.size() >= kMaxDeltasPerVersion) {
      return ResourceExhausted(vname + " has " +
                               std::to_string(kMaxDeltasPerVersion) +
                               " deltas already");
    }
    it = v->deltas
             .emplace(std::make_pair(base, worker), VersionEntry::DeltaRef{})
             .first;
  }
  it->second.ready = true;
  it->second.bytes = bytes;
  return Status::Ok();
}

Status HubState::DropDelta(const WorkerId& worker, const std::string& model,
                           Version version, Version base, int64_t now_ms) {
  TH_RETURN_IF_ERROR(ReportingWorker(worker, model, version, now_ms).status());
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr || v->deltas.erase({base, worker}) == 0) {
    return NotFound("worker " + worker.value() + " has no delta of " +
                    VersionName(model, version) + " from " +
                    std::to_string(base.value()));
  }
  auto rit = v->refs.find(worker);
  if (rit != v->refs.end() && rit->second.filling) {
    v->relays_declined.insert(worker);  // ClaimRelay's, declined
  }
  return Status::Ok();
}

bool HubState::DeltaPending(const WorkerId& reader, const std::string& model,
                            Version version) const {
  auto mit = models_.find(model);
  if (mit == models_.end()) return false;
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return false;
  auto rit = workers_.find(reader);
  if (rit == workers_.end()) return false;
  const std::string& dc = rit->second.reg.labels.datacenter;
  bool ready = false, pending = false, pending_near = false;
  for (const auto& [key, d] : vit->second.deltas) {
    if (key.second == reader) return false;  // it makes one itself
    if (!HoldsWhole(reader, model, key.first)) continue;
    const bool near = workers_.at(key.second).reg.labels.datacenter == dc;
    if (d.ready && near) return false;  // one to read in its datacenter
    (d.ready ? ready : pending) = true;
    pending_near = pending_near || (!d.ready && near);
  }
  // Being made in its datacenter (by the first reader there: ClaimRelay),
  // or anywhere while none is ready.
  return pending_near || (pending && !ready);
}

bool HubState::DeltaInDatacenter(const VersionEntry& v, Version base,
                                 const WorkerId& worker) const {
  const std::string& dc = workers_.at(worker).reg.labels.datacenter;
  for (auto it = v.deltas.lower_bound({base, WorkerId()});
       it != v.deltas.end() && it->first.first == base; ++it) {
    const WorkerId& other = it->first.second;
    if (other != worker && workers_.at(other).reg.labels.datacenter == dc) {
      return true;
    }
  }
  return false;
}

void HubState::ClaimRelay(VersionEntry& v, const WorkerId& reader,
                          Version base) {
  auto rit = v.refs.find(reader);
  // Only a reader that serves what it fetches (a filling holder) relays.
  if (rit == v.refs.end() || !rit->second.filling) return;
  if (v.deltas.count({base, reader}) > 0 ||
      v.relays_declined.count(reader) > 0 ||
      DeltaInDatacenter(v, base, reader) ||
      v.deltas.size() >= kMaxDeltasPerVersion) {
    return;
  }
  v.deltas.emplace(std::make_pair(base, reader), VersionEntry::DeltaRef{});
}

std::vector<DeltaOffer> HubState::OffersFor(const std::string& model,
                                            const VersionEntry& v,
                                            const WorkerId& holder,
                                            const WorkerId& reader) const {
  std::vector<DeltaOffer> out;
  for (const auto& [key, d] : v.deltas) {
    if (key.second == holder && d.ready && HoldsWhole(reader, model, key.first))
      out.push_back({key.first, d.bytes});
  }
  return out;
}

std::optional<HubState::DeltaPick> HubState::PreferDeltaHolder(
    const std::string& model, const VersionEntry& v, const WorkerId& reader,
    const std::set<WorkerId>& exclude, int first_distance,
    std::vector<WorkerId>* chosen) const {
  if (v.deltas.empty()) return std::nullopt;
  auto rit = workers_.find(reader);
  if (rit == workers_.end()) return std::nullopt;
  // Across the link, any delta holder beats full copies. A reader whose
  // link inside its datacenter is slow (nearby_deltas) takes one there;
  // else, while one is being made there, none (it waits for that one:
  // DeltaPending), so that the link carries the delta once; else one
  // across the link (it then makes it for its datacenter: ClaimRelay).
  int max_distance = std::numeric_limits<int>::max();
  if (!rit->second.reg.nearby_deltas) {
    if (first_distance <= kDatacenterDistance) return std::nullopt;
  } else {
    bool near_ready = false, near_pending = false;
    const std::string& dc = rit->second.reg.labels.datacenter;
    for (const auto& [key, d] : v.deltas) {
      if (key.second == reader || exclude.count(key.second) > 0 ||
          workers_.at(key.second).reg.labels.datacenter != dc ||
          !HoldsWhole(reader, model, key.first)) {
        continue;
      }
      (d.ready ? near_ready : near_pending) = true;
    }
    if (near_ready) {
      max_distance = kDatacenterDistance;
    } else if (near_pending) {
      return std::nullopt;
    }
  }
  const WorkerId* best = nullptr;
  DeltaPick pick;
  for (const auto& [key, d] : v.deltas) {
    const WorkerId& holder = key.second;
    if (!d.ready || holder == reader || exclude.count(holder) > 0 ||
        !HoldsWhole(reader, model, key.first)) {
      continue;
    }
    const int distance =
        Distance(rit->second.reg.labels, workers_.at(holder).reg.labels);
    if (distance > max_distance) continue;
    if (best == nullptr || distance < pick.distance) {
      best = &holder;
      pick = {key.first, distance};
    }
  }
  if (best == nullptr) return std::nullopt;
  // Full copies from other holders across the link would cross it too:
  // the delta's holder alone (it holds every chunk; a chunk it has no
  // delta of comes from it whole).
  chosen->assign(1, *best);
  return pick;
}

// Schedule's search, for one reader of one version. The ranking, written
// once (Rank): an idle holder in the reader's datacenter, nearest first;
// else the nearest holder, least busy first (HolderKey's order breaks ties).
// A busy holder in the reader's rack thus ranks after an idle one elsewhere
// in its datacenter: every holder uploads to one reader at a time, so a
// reader that lands in a rack whose only holder already feeds another rack
// extends the pipeline instead of halving that holder's upload. Across
// datacenters distance still comes first, so each chunk crosses the WAN
// once per datacenter. `nearest_first` ranks every holder as "later":
// nearest first (RackPlanner's last resort, sharing a holder in the rack).
//
// `reader_order`: a filling holder is usable only if it is filed under a
// smaller order (joined, or was placed, before the reader), so that the
// pipeline is a DAG, never a cycle of readers waiting on each other.
class HubState::Picker {
 public:
  struct Pick {
    const HolderKey* key = nullptr;
    int distance = 0;
    const HolderSet* group = nullptr;
  };

  Picker(const HubState& hub, const VersionEntry& v, const WorkerId& reader,
         const std::set<WorkerId>& exclude, uint64_t reader_order,
         bool nearest_first)
      : v_(v),
        reader_(reader),
        exclude_(exclude),
        reader_order_(reader_order),
        nearest_first_(nearest_first) {
    if (auto rit = hub.workers_.find(reader); rit != hub.workers_.end()) {
      reader_labels_ = rit->second.reg.labels;
    }
    levels_ = LevelsFor(v, reader_labels_);
  }

  // The order a reader that joined as a filling holder may read below:
  // its join order (UINT64_MAX for one that does not serve).
  static uint64_t JoinOrder(const VersionEntry& v, const WorkerId& reader) {
    auto own = v.refs.find(reader);
    return own != v.refs.end() && own->second.filling ? own->second.join_seq
                                                      : UINT64_MAX;
  }

  const std::vector<Level>& levels() const { return levels_; }

  // The best usable holder by Rank; `full_only` skips trainer ranks that
  // hold one part. Each level contributes its first usable holder (its sets
  // are in HolderKey order), and levels run nearest first with strictly
  // growing distances, so a holder also filed at a farther level is met
  // first at its own.
  Pick Best(bool full_only) const {
    Pick best;
    for (const Level& level : levels_) {
      if (!CanImprove(best, level.distance)) break;
      const HolderKey* c = FirstComplete(level.set->complete, full_only);
      const HolderKey* f = FirstFilling(level.set->filling);
      for (const HolderKey* k : {c, f}) {
        if (k == nullptr) continue;
        if (best.key == nullptr ||
            Rank(*k, level.distance) < Rank(*best.key, best.distance)) {
          best = {k, level.distance, level.set};
        }
      }
    }
    return best;
  }

  // The first idle usable holder of one level, a complete one before a
  // filling one; none if every usable holder there is busy.
  Pick Idle(const Level& level) const {
    const HolderKey* c = FirstComplete(level.set->complete, false);
    if (c != nullptr && c->serving == 0) return {c, level.distance, level.set};
    const HolderKey* f = FirstFilling(level.set->filling);
    if (f != nullptr && f->serving == 0) return {f, level.distance, level.set};
    return {};
  }

  // Whether the level has a usable holder at all (busy or not).
  bool AnyUsable(const Level& level) const {
    return FirstComplete(level.set->complete, false) != nullptr ||
           FirstFilling(level.set->filling) != nullptr;
  }

  // The first choice and the extra stripes: idle complete holders of the
  // same group, the latest joined first, up to `max_sources` in all.
  std::vector<WorkerId> WithStripes(const Pick& first,
                                    size_t max_sources) const {
    std::vector<WorkerId> chosen = {first.key->worker};
    const size_t want = max_sources > 0 ? max_sources : 1;
    for (auto it = first.group->complete.begin();
         it != first.group->complete.end() && it->serving == 0 &&
         chosen.size() < want;
         ++it) {
      if (it->worker != first.key->worker && Usable(*it)) {
        chosen.push_back(it->worker);
      }
    }
    return chosen;
  }

  // A trainer rank holds one part, so the sources chosen so far may miss
  // parts, and a reader must never be left without a source for a chunk
  // that some holder has. Each part that none of them holds gets its best
  // holder by Rank: that rank's worker, or the best holder of every chunk if
  // it ranks first (which then covers the rest). A group of G ranks may thus
  // give up to max_sources + G - 1 sources. O(G log N), plus O(G) rank
  // holders skipped in the search for a holder of every chunk.
  void CoverMissingParts(std::vector<WorkerId>* chosen) const {
    auto holds_all = [&](const WorkerId& id) {
      return !v_.refs.at(id).rank.has_value();
    };
    if (std::any_of(chosen->begin(), chosen->end(), holds_all)) return;
    std::set<uint32_t> have;
    for (const WorkerId& id : *chosen) have.insert(*v_.refs.at(id).rank);
    std::optional<Pick> full;  // searched once, when first needed
    const Manifest& manifest = *v_.manifest;
    for (uint32_t r = 0; r < v_.group_size; ++r) {
      if (have.count(r) > 0) continue;
      if (manifest.chunk_base(r) == manifest.chunk_base(r + 1)) continue;
      Pick part = RankHolder(r);
      if (!full.has_value()) full = Best(/*full_only=*/true);
      if (full->key != nullptr &&
          (part.key == nullptr ||
           Rank(*full->key, full->distance) < Rank(*part.key, part.distance))) {
        chosen->push_back(full->key->worker);
        return;
      }
      // No holder but the reader or excluded ones has this part: the
      // reader's fetcher asks again when it finds no source for a chunk.
      if (part.key != nullptr) chosen->push_back(part.key->worker);
    }
  }

  bool Usable(const HolderKey& k) const {
    return k.worker != reader_ && exclude_.count(k.worker) == 0;
  }

 private:
  // The one ranking: lower is better.
  std::tuple<bool, int, const HolderKey&> Rank(const HolderKey& k,
                                               int distance) const {
    bool later =
        nearest_first_ || k.serving > 0 || distance > kDatacenterDistance;
    return {later, distance, k};
  }

  // Whether a level at `distance` (farther than every level searched so
  // far) may hold a holder that ranks before `best`: only while there is no
  // best yet, or the best is "later" and an idle holder there would not be.
  // Saves searching the farther levels once the answer is settled.
  bool CanImprove(const Pick& best, int distance) const {
    if (best.key == nullptr) return true;
    if (!std::get<0>(Rank(*best.key, best.distance))) return false;
    return !nearest_first_ && distance <= kDatacenterDistance;
  }

  const HolderKey* FirstComplete(const std::set<HolderKey>& set,
                                 bool full_only) const {
    for (const HolderKey& k : set) {
      if (Usable(k) && (!full_only || !v_.refs.at(k.worker).rank.has_value()))
        return &k;
    }
    return nullptr;
  }

  // Jumps over filling holders filed at or after the reader's order with
  // one search per serving count.
  const HolderKey* FirstFilling(const std::set<HolderKey>& set) const {
    if (reader_order_ == 0) return nullptr;
    for (auto it = set.begin(); it != set.end();) {
      if (it->order >= reader_order_) {
        // Keys run by serving, then order downwards: the first holder
        // with this serving count filed before the reader.
        it = set.lower_bound(
            HolderKey{it->serving, reader_order_ - 1, WorkerId()});
      } else if (Usable(*it)) {
        return &*it;
      } else {
        ++it;
      }
    }
    return nullptr;
  }

  // The usable worker that published rank `r`, if any.
  Pick RankHolder(uint32_t r) const {
    auto rh = v_.index.rank_holders.find(r);
    if (rh == v_.index.rank_holders.end()) return {};
    const Reference& ref = v_.refs.at(rh->second);
    if (!ref.filed.has_value() || !Usable(ref.filed->key)) return {};
    return {&ref.filed->key, Distance(reader_labels_, ref.filed->labels),
            nullptr};
  }

  const VersionEntry& v_;
  const WorkerId& reader_;
  const std::set<WorkerId>& exclude_;
  const uint64_t reader_order_;
  const bool nearest_first_;
  Labels reader_labels_;
  std::vector<Level> levels_;
};

// A rack-aware hub's choice of sources for one reader (Schedule's comment
// in hub_state.h). Filling holders are ordered by where they were placed:
// each rack's readers in a line, each line after the ones before it. A
// reader placed in its rack's line comes after every holder placed there,
// so it may read from any of them; a reader that enters a rack (or one
// whose rack is not oversubscribed) starts a new line, after everything.
// The exit of a rack (a holder there feeding a reader outside) is in the
// rack's line, and the reader outside in a later line, so a reader placed
// in the rack's line fits between the two: the move keeps the DAG.
class HubState::RackPlanner {
 public:
  RackPlanner(HubState& hub, VersionEntry& v, const WorkerId& reader,
              const std::set<WorkerId>& exclude, size_t max_sources)
      : hub_(hub),
        v_(v),
        reader_(reader),
        exclude_(exclude),
        max_sources_(max_sources),
        rack_(hub.RackOf(reader)) {
    auto own = v.refs.find(reader);
    if (own != v.refs.end() && own->second.filling) own_ = &own->second;
  }

  // The sources, with the reader placed (if it serves and was not yet);
  // empty if there is no usable holder.
  std::vector<WorkerId> Choose() {
    const bool oversubscribed =
        rack_.has_value() &&
        RackOversubscribed(hub_.config_, rack_->first, rack_->second);
    if (!oversubscribed) return IdleFirst();
    // In the rack: its line's next place (a new line if it has none).
    const uint64_t follower = PlacementFor(/*in_rack=*/true);
    Picker in(hub_, v_, reader_, exclude_, OrderFor(follower), false);
    bool rack_has_usable = false;
    for (const Level& level : in.levels()) {
      if (level.distance > 1) break;
      const Picker::Pick p = in.Idle(level);
      if (p.key != nullptr) return Finish(in, p, follower);
      rack_has_usable = rack_has_usable || in.AnyUsable(level);
    }
    if (rack_has_usable && own_ != nullptr) {
      if (std::optional<WorkerId> h = TakeExit(in, follower)) {
        std::vector<WorkerId> chosen = {*h};
        // The move refiled two holders, which may have erased groups that
        // `in`'s levels point at: cover the parts with a picker made now.
        Picker moved(hub_, v_, reader_, exclude_, OrderFor(follower), false);
        moved.CoverMissingParts(&chosen);
        Place(follower);
        return chosen;
      }
    }
    // Across the uplink: an idle holder in the datacenter, else, if the
    // datacenter has none at all, in another one.
    const uint64_t entry = PlacementFor(/*in_rack=*/false);
    Picker out(hub_, v_, reader_, exclude_, OrderFor(entry), false);
    Picker::Pick cross;
    bool dc_has_usable = false;
    for (const Level& level : out.levels()) {
      if (level.distance == kDatacenterDistance) {
        cross = out.Idle(level);
        dc_has_usable = out.AnyUsable(level);
      } else if (level.distance > kDatacenterDistance && !dc_has_usable) {
        cross = out.Idle(level);
      }
      if (cross.key != nullptr) break;
    }
    if (cross.key != nullptr &&
        (!rack_has_usable || UplinksAllow(cross.key->worker))) {
      return Finish(out, cross, entry);
    }
    // Last: share the nearest holder, least busy first.
    Picker near(hub_, v_, reader_, exclude_, OrderFor(follower), true);
    const Picker::Pick p = near.Best(/*full_only=*/false);
    if (p.key == nullptr) return {};
    return Finish(near, p, p.distance <= 1 ? follower : entry);
  }

 private:
  // A rack that is not oversubscribed (or a reader without a rack): the
  // idle-first ranking, the reader placed on a new line.
  std::vector<WorkerId> IdleFirst() {
    const uint64_t entry = PlacementFor(/*in_rack=*/false);
    Picker p(hub_, v_, reader_, exclude_, OrderFor(entry), false);
    const Picker::Pick first = p.Best(/*full_only=*/false);
    if (first.key == nullptr) return {};
    return Finish(p, first, entry);
  }

  std::vector<WorkerId> Finish(const Picker& p, const Picker::Pick& first,
                               uint64_t placement) {
    std::vector<WorkerId> chosen = p.WithStripes(first, max_sources_);
    p.CoverMissingParts(&chosen);
    Place(placement);
    return chosen;
  }

  // Where the reader would be placed: its placement if it has one; else in
  // its rack's line or on a new line. 0 for a reader that does not serve.
  uint64_t PlacementFor(bool in_rack) const {
    if (own_ == nullptr) return 0;
    if (own_->placement > 0) return own_->placement;
    return in_rack && rack_.has_value() ? FollowerPlacement(v_, *rack_)
                                        : NewLinePlacement(v_);
  }
  // The order the reader may read below: its placement, or for a reader
  // that does not serve every placed holder.
  static uint64_t OrderFor(uint64_t placement) {
    return placement > 0 ? placement : kUnplaced;
  }
  void Place(uint64_t placement) {
    if (own_ == nullptr || own_->placement > 0) return;
    hub_.Place(v_, reader_, placement);
  }

  // A usable holder in the reader's rack whose reader outside the rack is
  // movable and placed after `placement`: that reader is moved onto this
  // one (in the books), and the holder returned. Stale exits are dropped.
  std::optional<WorkerId> TakeExit(const Picker& in, uint64_t placement) {
    auto xs = v_.exits.find(*rack_);
    if (xs == v_.exits.end()) return std::nullopt;
    std::set<std::pair<WorkerId, WorkerId>> exits = xs->second;
    for (const auto& [h, x] : exits) {
      if (!ExitValid(h, x)) {
        auto it = v_.exits.find(*rack_);
        if (it != v_.exits.end()) {
          it->second.erase({h, x});
          if (it->second.empty()) v_.exits.erase(it);
        }
        continue;
      }
      const Reference& hr = v_.refs.at(h);
      if (x == reader_ || !in.Usable(hr.filed->key) ||
          (hr.filling && hr.filed->key.order >= placement)) {
        continue;
      }
      const Reference* xr = nullptr;
      if (auto it = v_.refs.find(x); it != v_.refs.end()) xr = &it->second;
      if (xr != nullptr && xr->filling && xr->placement > 0 &&
          xr->placement <= placement) {
        continue;  // it would read from a reader placed after it
      }
      hub_.Move(v_, x, h, reader_);
      return h;
    }
    return std::nullopt;
  }

  // The exit is as filed: `h` still holds the version in this rack, and
  // `x` still reads from it and will recheck.
  bool ExitValid(const WorkerId& h, const WorkerId& x) const {
    auto hr = v_.refs.find(h);
    if (hr == v_.refs.end() || !hr->second.filed.has_value() ||
        hub_.RackOf(h) != rack_) {
      return false;
    }
    auto a = v_.assignments.find(x);
    if (a == v_.assignments.end() || a->second.recheck_ms == 0) return false;
    return std::any_of(
        a->second.edges.begin(), a->second.edges.end(), [&](const Edge& e) {
          return e.source == h && e.source_join == hr->second.join_seq;
        });
  }

  // Whether one more stream may cross the reader's rack uplink (in) and
  // the source's (out) within their budgets (UplinkStreams).
  bool UplinksAllow(const WorkerId& source) const {
    auto used = [&](const RackKey& r, size_t RackUse::*field) {
      auto it = hub_.rack_use_.find(r);
      return it == hub_.rack_use_.end() ? size_t{0} : it->second.*field;
    };
    if (used(*rack_, &RackUse::in) >= hub_.UplinkStreams(*rack_)) return false;
    const std::optional<RackKey> src = hub_.RackOf(source);
    return !src.has_value() ||
           used(*src, &RackUse::out) < hub_.UplinkStreams(*src);
  }

  HubState& hub_;
  VersionEntry& v_;
  const WorkerId& reader_;
  const std::set<WorkerId>& exclude_;
  const size_t max_sources_;
  const std::optional<RackKey> rack_;
  Reference* own_ = nullptr;  // the reader's filling reference, if any
};

Result<std::vector<HolderView>> HubState::Schedule(
    const WorkerId& reader, const std::string& model, Version version,
    const std::set<WorkerId>& exclude, size_t max_sources) {
  if (version.is_latest()) {
    return InvalidArgument("schedule needs a resolved version number");
  }
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  VersionEntry* found = FindVersion(model, version);
  if (found == nullptr) {
    return NotFound("model '" + model + "' has no version " +
                    std::to_string(version.value()));
  }
  VersionEntry& v = *found;
  // Same errors as a resolve of that exact version (the name is made only
  // for an error: this runs for every reader).
  if (v.state != VersionState::kCommitted) {
    TH_RETURN_IF_ERROR(CheckReadable(VersionName(model, version), v));
  }
  Release(v, reader);
  std::vector<WorkerId> chosen;
  if (rack_aware_) {
    chosen = RackPlanner(*this, v, reader, exclude, max_sources).Choose();
  } else {
    const Picker picker(*this, v, reader, exclude, Picker::JoinOrder(v, reader),
                        false);
    const Picker::Pick first = picker.Best(/*full_only=*/false);
    if (first.key != nullptr) {
      chosen = picker.WithStripes(first, max_sources);
      picker.CoverMissingParts(&chosen);
      const std::optional<DeltaPick> via =
          PreferDeltaHolder(model, v, reader, exclude, first.distance, &chosen);
      // Across the wide-area link: the reader makes it for its datacenter.
      if (via.has_value() && via->distance > kDatacenterDistance) {
        ClaimRelay(v, reader, via->base);
      }
    }
  }
  if (chosen.empty()) {
    return Unavailable("'" + model + "@" + std::to_string(version.value()) +
                       "' has no holder left to read from");
  }
  std::vector<HolderView> views = Assign(v, reader, chosen);
  if (!v.deltas.empty()) {
    for (HolderView& h : views)
      h.deltas = OffersFor(model, v, h.worker, reader);
  }
  return views;
}

Result<std::vector<HolderView>> HubState::Recheck(const WorkerId& reader,
                                                  const std::string& model,
                                                  Version version,
                                                  size_t max_sources) {
  if (version.is_latest()) {
    return InvalidArgument("recheck needs a resolved version number");
  }
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr) {
    return NotFound("model '" + model + "' has no version " +
                    std::to_string(version.value()));
  }
  if (v->state != VersionState::kCommitted) {
    TH_RETURN_IF_ERROR(CheckReadable(VersionName(model, version), *v));
  }
  auto it = v->assignments.find(reader);
  const bool intact =
      it != v->assignments.end() &&
      std::all_of(
          it->second.edges.begin(), it->second.edges.end(), [&](const Edge& e) {
            auto r = v->refs.find(e.source);
            return r != v->refs.end() && r->second.join_seq == e.source_join;
          });
  if (!intact) return Schedule(reader, model, version, {}, max_sources);
  Assignment& a = it->second;
  if (a.recheck_ms > 0) {
    // Moved: soon again, another reader may follow. Else less often.
    a.recheck_ms = a.moved ? config_.recheck_ms
                           : std::min(2 * a.recheck_ms, config_.max_recheck_ms);
    a.moved = false;
  }
  std::vector<HolderView> out;
  for (const Edge& e : a.edges) out.push_back(ViewOf(*v, e.source));
  return out;
}

int64_t HubState::RecheckAfterMs(const WorkerId& reader,
                                 const std::string& model,
                                 Version version) const {
  auto mit = models_.find(model);
  if (mit == models_.end()) return 0;
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return 0;
  auto a = vit->second.assignments.find(reader);
  return a == vit->second.assignments.end() ? 0 : a->second.recheck_ms;
}

std::vector<HolderView> HubState::Assign(VersionEntry& v,
                                         const WorkerId& reader,
                                         const std::vector<WorkerId>& chosen) {
  std::vector<HolderView> out;
  Assignment& assigned = v.assignments[reader];
  const std::optional<RackKey> into = RackOf(reader);
  for (const WorkerId& id : chosen) {
    out.push_back(ViewOf(v, id));
    Edge e{id, v.refs.at(id).join_seq, std::nullopt};
    if (rack_aware_) {
      const std::optional<RackKey> out_of = RackOf(id);
      if (out_of != into && (out_of.has_value() || into.has_value())) {
        // Crosses the source's rack uplink, the reader's, or both.
        e.uplinks = std::make_pair(out_of.value_or(RackKey()),
                                   into.value_or(RackKey()));
        if (out_of.has_value()) ++rack_use_[*out_of].out;
        if (into.has_value()) ++rack_use_[*into].in;
        if (out_of.has_value() &&
            RackOversubscribed(config_, out_of->first, out_of->second)) {
          // Behind an oversubscribed uplink: a reader arriving in that
          // rack may take this source's place; this reader rechecks.
          v.exits[*out_of].insert({id, reader});
          assigned.recheck_ms = config_.recheck_ms;
        }
      }
    }
    assigned.edges.push_back(std::move(e));
    Reference& ref = v.refs.at(id);
    ++ref.serving;
    Refile(v, id, ref);
  }
  return out;
}

std::optional<HubState::RackKey> HubState::RackOf(const WorkerId& id) const {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.reg.labels.rack.empty()) {
    return std::nullopt;
  }
  return RackKey{it->second.reg.labels.datacenter, it->second.reg.labels.rack};
}

double HubState::RatioOf(const RackKey& rack) const {
  auto it = config_.rack_oversubscription_by_rack.find(rack);
  return it != config_.rack_oversubscription_by_rack.end()
             ? it->second
             : config_.rack_oversubscription;
}

size_t HubState::UplinkStreams(const RackKey& rack) const {
  const double ratio = RatioOf(rack);
  if (ratio <= 1) return SIZE_MAX;
  auto it = rack_use_.find(rack);
  const size_t workers = it == rack_use_.end() ? 0 : it->second.workers;
  return std::max<size_t>(1, static_cast<size_t>(workers / ratio));
}

uint64_t HubState::FollowerPlacement(const VersionEntry& v,
                                     const RackKey& rack) {
  auto it = v.lines.find(rack);
  if (it == v.lines.end() || it->second.next_position >= (1ull << 32)) {
    return NewLinePlacement(v);
  }
  return (it->second.line << 32) | it->second.next_position;
}

uint64_t HubState::NewLinePlacement(const VersionEntry& v) {
  return (v.next_line << 32) | 1;
}

void HubState::TakePlacement(VersionEntry& v, const RackKey& rack,
                             uint64_t placement) {
  const uint64_t line = placement >> 32;
  if (line == v.next_line) {
    ++v.next_line;
    if (!rack.second.empty()) v.lines[rack] = Line{line, 2};
    return;
  }
  Line& l = v.lines.at(rack);
  TH_CHECK_EQ(l.line, line);
  ++l.next_position;
}

void HubState::Place(VersionEntry& v, const WorkerId& id, uint64_t placement) {
  Reference& r = v.refs.at(id);
  TH_CHECK(r.filling && r.placement == 0);
  const std::optional<RackKey> rack = RackOf(id);
  TakePlacement(v, rack.value_or(RackKey()), placement);
  r.placement = placement;
  Refile(v, id, r);
}

void HubState::Move(VersionEntry& v, const WorkerId& x, const WorkerId& from,
                    const WorkerId& to) {
  Assignment& a = v.assignments.at(x);
  auto e = std::find_if(a.edges.begin(), a.edges.end(),
                        [&](const Edge& e) { return e.source == from; });
  TH_CHECK(e != a.edges.end());
  if (auto r = v.refs.find(from); r != v.refs.end() && r->second.serving > 0) {
    --r->second.serving;
    Refile(v, from, r->second);
  }
  Reference& ref = v.refs.at(to);
  ++ref.serving;
  Refile(v, to, ref);
  TH_CHECK(e->uplinks.has_value());
  RackKey& out_of = e->uplinks->first;
  auto x_exits = v.exits.find(out_of);
  if (x_exits != v.exits.end()) {
    x_exits->second.erase({from, x});
    if (x_exits->second.empty()) v.exits.erase(x_exits);
  }
  Uncount(out_of, &RackUse::out);
  out_of = RackOf(to).value();  // `to` sits in the rack of `from`
  ++rack_use_[out_of].out;
  v.exits[out_of].insert({to, x});
  e->source = to;
  e->source_join = ref.join_seq;
  a.moved = true;
}

void HubState::FetchDone(const WorkerId& reader, const std::string& model,
                         Version version) {
  VersionEntry* v = FindVersion(model, version);
  if (v != nullptr) EndFetch(*v, reader);
}

std::vector<ModelSummary> HubState::List() const {
  std::vector<ModelSummary> out;
  for (const auto& [name, m] : models_) {
    ModelSummary ms;
    ms.model = name;
    for (const auto& [version, v] : m.versions) {
      VersionSummary s;
      s.version = version;
      s.state = v.state;
      s.group_size = v.group_size;
      s.holders = static_cast<uint32_t>(v.refs.size());
      s.retained = IsRetained(m, version, v);
      if (v.manifest.has_value()) {
        s.parts_published = v.group_size;
        s.total_bytes = v.manifest->total_bytes();
        s.tensors = static_cast<uint32_t>(v.manifest->num_tensors());
      } else {
        for (const auto& p : v.parts) {
          if (!p.has_value()) continue;
          ++s.parts_published;
          s.total_bytes += p->part_bytes;
          s.tensors += static_cast<uint32_t>(p->tensors.size());
        }
      }
      ms.versions.push_back(s);
    }
    out.push_back(std::move(ms));
  }
  return out;
}

HubStats HubState::Stats() const {
  HubStats st;
  st.workers = workers_.size();
  st.models = models_.size();
  const HeartbeatPlan p = plan();
  st.heartbeat_interval_ms = p.interval_ms;
  st.lease_ms = p.lease_ms;
  for (const auto& [name, m] : models_) {
    for (const auto& [version, v] : m.versions) {
      ++st.versions.at(static_cast<size_t>(v.state));
      for (const auto& [id, r] : v.refs) {
        ++(r.filling ? st.holders_filling : st.holders_complete);
      }
      if (IsRetained(m, version, v)) ++st.retained_versions;
      st.readers_scheduled += v.assignments.size();
    }
  }
  st.reader_group_pins = num_group_pins();
  return st;
}

// ---- tensorhub top ----

Status HubState::ReportProgress(const ProgressReport& p, int64_t now_ms) {
  if (workers_.count(p.reader) == 0) {
    return NotFound("hub does not know worker " + p.reader.value() +
                    "; register again");
  }
  if (p.done) {
    // Each source's throughput as this reader saw it. Sources the hub no
    // longer knows are skipped (rates_ holds known workers only).
    const int64_t ms = std::max<int64_t>(1, p.elapsed_ms);
    size_t n = 0;
    for (const auto& [src, bytes] : p.sources) {
      if (++n > kMaxProgressSources) break;
      if (bytes == 0 || workers_.count(src) == 0) continue;
      std::vector<RateSample>& samples = rates_[src];
      if (samples.size() >= kMaxRateSamples) samples.erase(samples.begin());
      samples.push_back({static_cast<double>(bytes) * 1000.0 / ms, now_ms});
    }
  }
  VersionEntry* v = FindVersion(p.model, p.version);
  if (v == nullptr) return Status::Ok();
  if (p.done) {
    v->progress.erase(p.reader);
    return Status::Ok();
  }
  // Only a fetch the hub counts as in flight: what bounds the entries.
  if (v->assignments.count(p.reader) == 0) return Status::Ok();
  ReaderProgress& rp = v->progress[p.reader];
  rp.bytes_done = p.bytes_done;
  rp.bytes_total = p.bytes_total;
  rp.elapsed_ms = std::max<int64_t>(0, p.elapsed_ms);
  rp.sources.assign(
      p.sources.begin(),
      p.sources.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(
                              p.sources.size(), kMaxProgressSources)));
  return Status::Ok();
}

std::string HubState::NameOf(const WorkerId& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? std::string() : it->second.reg.name;
}

HubSnapshot HubState::Snapshot(const SnapshotLimits& want,
                               int64_t now_ms) const {
  SnapshotLimits lim;
  lim.models = std::min(want.models, kMaxSnapshotModels);
  lim.versions_per_model =
      std::min(want.versions_per_model, kMaxSnapshotVersions);
  lim.holders_per_version =
      std::min(want.holders_per_version, kMaxSnapshotHolders);
  lim.transfers = std::min(want.transfers, kMaxSnapshotTransfers);
  lim.slowest = std::min(want.slowest, kMaxSnapshotSlowest);
  auto rate = [](uint64_t bytes, int64_t ms) {
    return ms > 0 ? static_cast<double>(bytes) * 1000.0 / ms : 0.0;
  };
  HubSnapshot out;
  out.workers = static_cast<uint32_t>(workers_.size());
  out.models_total = static_cast<uint32_t>(models_.size());
  for (const auto& [name, m] : models_) {
    const bool listed = out.models.size() < lim.models;
    SnapshotModel sm;
    sm.model = name;
    sm.versions_total = static_cast<uint32_t>(m.versions.size());
    uint32_t listed_versions = 0;
    for (auto vit = m.versions.rbegin(); vit != m.versions.rend(); ++vit) {
      const Version version = vit->first;
      const VersionEntry& v = vit->second;
      // Every version's fetches count; only listed ones are described.
      for (const auto& [reader, sources] : v.assignments) {
        ++out.transfers_total;
        if (out.transfers.size() >= lim.transfers) continue;
        SnapshotTransfer t;
        t.model = name;
        t.version = version;
        t.reader = reader;
        t.reader_name = NameOf(reader);
        std::map<WorkerId, uint64_t> bytes;
        auto pit = v.progress.find(reader);
        if (pit != v.progress.end()) {
          const ReaderProgress& p = pit->second;
          t.reported = true;
          t.bytes_done = p.bytes_done;
          t.bytes_total = p.bytes_total;
          t.elapsed_ms = p.elapsed_ms;
          t.bytes_per_second = rate(p.bytes_done, p.elapsed_ms);
          for (const auto& [src, b] : p.sources) bytes[src] += b;
        }
        if (t.bytes_total == 0 && v.manifest.has_value()) {
          t.bytes_total = v.manifest->total_bytes();
        }
        // The assigned sources first, then others it read from earlier.
        std::set<WorkerId> seen;
        auto add = [&](const WorkerId& src) {
          if (t.sources.size() >= kMaxProgressSources ||
              !seen.insert(src).second) {
            return;
          }
          auto b = bytes.find(src);
          const uint64_t n = b == bytes.end() ? 0 : b->second;
          t.sources.push_back({src, NameOf(src), n, rate(n, t.elapsed_ms)});
        };
        for (const Edge& e : sources.edges) add(e.source);
        for (const auto& [src, b] : bytes) add(src);
        out.transfers.push_back(std::move(t));
      }
      if (!listed || listed_versions >= lim.versions_per_model) continue;
      ++listed_versions;
      SnapshotVersion sv;
      sv.version = version;
      sv.state = v.state;
      sv.retained = IsRetained(m, version, v);
      if (v.manifest.has_value()) {
        sv.total_bytes = v.manifest->total_bytes();
      } else {
        for (const auto& p : v.parts) {
          if (p.has_value()) sv.total_bytes += p->part_bytes;
        }
      }
      for (const auto& [id, r] : v.refs) {
        ++(r.filling ? sv.holders_filling : sv.holders_complete);
      }
      for (bool filling : {false, true}) {
        for (const auto& [id, r] : v.refs) {
          if (r.filling != filling) continue;
          if (sv.holders.size() >= lim.holders_per_version) break;
          sv.holders.push_back({id, NameOf(id), r.filling});
        }
      }
      sm.versions.push_back(std::move(sv));
    }
    if (listed) out.models.push_back(std::move(sm));
  }
  for (const auto& [id, samples] : rates_) {
    double sum = 0;
    uint32_t n = 0;
    for (const RateSample& s : samples) {
      if (now_ms - s.at_ms > kRateWindowMs) continue;
      sum += s.bytes_per_second;
      ++n;
    }
    if (n == 0) continue;
    out.slowest.push_back({id, NameOf(id), sum / n, n});
  }
  std::sort(out.slowest.begin(), out.slowest.end(),
            [](const SnapshotHolderRate& a, const SnapshotHolderRate& b) {
              if (a.bytes_per_second != b.bytes_per_second) {
                return a.bytes_per_second < b.bytes_per_second;
              }
              return a.worker < b.worker;
            });
  if (out.slowest.size() > lim.slowest) out.slowest.resize(lim.slowest);
  return out;
}

void HubState::ExpireLeases(int64_t now_ms) {
  std::vector<WorkerId> expired;
  for (const auto& [id, w] : workers_) {
    if (w.lease_expiry_ms <= now_ms) expired.push_back(id);
  }
  for (const WorkerId& id : expired) RemoveWorker(id);
  ExpireGroups(now_ms);
}

Status HubState::Leave(const WorkerId& worker) {
  if (workers_.count(worker) == 0) {
    return NotFound("hub does not know worker " + worker.value());
  }
  RemoveWorker(worker);
  return Status::Ok();
}

void HubState::RemoveWorker(const WorkerId& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  std::set<std::pair<std::string, Version>> refs = it->second.refs;
  for (const auto& [model, version] : refs) DropReference(model, version, id);
  std::set<std::pair<std::string, Version>> slices = it->second.slices;
  for (const auto& [model, version] : slices) {
    DropSliceReference(model, version, id);
  }
  // A reader that served nothing may still have sources assigned.
  for (auto& [name, m] : models_) {
    for (auto& [version, v] : m.versions) EndFetch(v, id);
  }
  rates_.erase(id);
  CountWorker(it->second.reg.labels, -1);
  workers_.erase(id);
}

// ---- Retention ----

bool HubState::IsRetained(const Model& m, Version version,
                          const VersionEntry& v) const {
  if (v.retained) return true;
  if (config_.keep_latest == 0 || !v.manifest.has_value()) return false;
  // Among the latest keep_latest versions that committed (a version lost
  // since still counts: the policy does not reach back to older ones).
  uint32_t newer = 0;
  for (auto it = m.versions.rbegin(); it != m.versions.rend(); ++it) {
    if (it->first == version) return true;
    if (it->second.manifest.has_value() && ++newer >= config_.keep_latest) {
      return false;
    }
  }
  return false;
}

bool HubState::IsRetained(const std::string& model, Version version) const {
  auto mit = models_.find(model);
  if (mit == models_.end()) return false;
  auto vit = mit->second.versions.find(version);
  return vit != mit->second.versions.end() &&
         IsRetained(mit->second, version, vit->second);
}

Status HubState::Retain(const std::string& model, Version version,
                        bool retain) {
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  if (version.is_latest()) {
    return InvalidArgument("retain needs a version number, not latest");
  }
  auto mit = models_.find(model);
  VersionEntry* v = FindVersion(model, version);
  const std::string vname = VersionName(model, version);
  if (v == nullptr && mit != models_.end() &&
      mit->second.restored_pins.count(version) > 0) {
    // Pinned before this hub took over; no worker has re-reported it yet.
    if (!retain) {
      mit->second.restored_pins.erase(version);
      Record({DurableChange::Kind::kUnpin, model, version, {}, {}});
    }
    return Status::Ok();
  }
  if (v == nullptr) return NotFound("the hub knows no version " + vname);
  if (!retain) {
    if (!v->retained) {
      return NotFound(vname + " is not retained by a Retain call" +
                      (IsRetained(mit->second, version, *v)
                           ? std::string(" (it is kept by --keep-latest)")
                           : std::string()));
    }
    v->retained = false;
    Record({DurableChange::Kind::kUnpin, model, version, {}, {}});
    return Status::Ok();
  }
  if (v->state == VersionState::kAborted) {
    return FailedPrecondition(vname + " was aborted; nothing to retain");
  }
  if (v->state == VersionState::kUnavailable) {
    return FailedPrecondition(vname +
                              " is unavailable (no live holder of "
                              "some chunk); it cannot be retained");
  }
  if (v->retained) return Status::Ok();
  size_t pinned = mit->second.restored_pins.size();
  for (const auto& [ver, e] : mit->second.versions) pinned += e.retained;
  if (pinned >= config_.max_retained_per_model) {
    return ResourceExhausted("model '" + model + "' already has " +
                             std::to_string(pinned) + " retained versions");
  }
  v->retained = true;
  Record({DurableChange::Kind::kPin, model, version, {}, {}});
  return Status::Ok();
}

bool HubState::IsReliable(const WorkerId& worker) const {
  auto it = workers_.find(worker);
  return it != workers_.end() &&
         it->second.reg.worker_class == WorkerClass::kReliable;
}

template <typename Pred>
bool HubState::Covers(const VersionEntry& v, Pred keep) const {
  if (!v.manifest.has_value()) return false;
  std::vector<ChunkRange> ranges;
  for (const auto& [holder, ref] : v.refs) {
    if (ref.filling || !keep(holder)) continue;
    for (const ChunkRange& r : RangesOf(v, ref)) ranges.push_back(r);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ChunkRange& a, const ChunkRange& b) {
              return a.begin < b.begin;
            });
  uint64_t covered = 0;
  for (const ChunkRange& r : ranges) {
    if (r.begin > covered) break;
    covered = std::max(covered, r.end);
  }
  return covered >= v.manifest->num_chunks();
}

Status HubState::CheckDeparture(const WorkerId& worker,
                                const std::string& model,
                                Version version) const {
  auto mit = models_.find(model);
  if (mit == models_.end()) return Status::Ok();
  auto vit = mit->second.versions.find(version);
  if (vit == mit->second.versions.end()) return Status::Ok();
  const VersionEntry& v = vit->second;
  auto own = v.refs.find(worker);
  // Only a committed version has bytes to keep; a filling copy is not one.
  if (v.state != VersionState::kCommitted || own == v.refs.end() ||
      own->second.filling || !IsRetained(mit->second, version, v)) {
    return Status::Ok();
  }
  auto others = [&](const WorkerId& h) {
    return h != worker && v.departing.count(h) == 0;
  };
  if (Covers(v,
             [&](const WorkerId& h) { return others(h) && IsReliable(h); })) {
    return Status::Ok();
  }
  const bool spot = !IsReliable(worker);
  // A spot worker is not a reliable copy itself: it only has to wait if it
  // is (part of) the last copy of all.
  if (spot && Covers(v, others)) return Status::Ok();
  return FailedPrecondition(
      VersionName(model, version) + " is retained and worker " +
      worker.value() + " holds " +
      (spot ? "its last copy" : "its last reliable copy") +
      "; no reliable holder has copied it yet. Start a keeper "
      "(`tensorhub keeper --hub ADDR`), unretain the version, or force it");
}

std::vector<std::pair<std::string, Version>> HubState::BlockedDepartures(
    const WorkerId& worker) const {
  std::vector<std::pair<std::string, Version>> out;
  auto wit = workers_.find(worker);
  if (wit == workers_.end()) return out;
  for (const auto& [model, version] : wit->second.refs) {
    if (!CheckDeparture(worker, model, version).ok()) {
      out.emplace_back(model, version);
    }
  }
  return out;
}

void HubState::SetDeparting(const WorkerId& worker, const std::string& model,
                            Version version, bool departing) {
  VersionEntry* v = FindVersion(model, version);
  if (v == nullptr) return;
  if (departing && v->refs.count(worker) > 0) {
    v->departing.insert(worker);
  } else {
    v->departing.erase(worker);
  }
}

KeeperWork HubState::KeeperTasks(const WorkerId& keeper) const {
  KeeperWork work;
  for (const auto& [name, m] : models_) {
    for (const auto& [version, v] : m.versions) {
      if (!v.manifest.has_value()) continue;
      const bool retained = IsRetained(m, version, v);
      KeeperTask task{name, version, v.manifest->total_bytes()};
      auto own = v.refs.find(keeper);
      if (own != v.refs.end()) {
        if (!retained && !own->second.filling) work.release.push_back(task);
        if (v.retained && !own->second.filling) work.pinned.push_back(task);
        continue;
      }
      if (!retained || v.state != VersionState::kCommitted || v.has_pieces) {
        continue;
      }
      const VersionEntry& entry =
          v;  // a lambda may not capture a binding (C++20)
      auto reliable = [&](const WorkerId& h) {
        return entry.departing.count(h) == 0 && IsReliable(h);
      };
      if (Covers(v, reliable)) continue;
      // A reliable copy in progress (another keeper, or a reliable reader)
      // is given its chance first; if it fails, its reference goes away.
      bool copying = false;
      for (const auto& [holder, ref] : v.refs) {
        if (ref.filling && !ref.rank.has_value() && reliable(holder)) {
          copying = true;
          break;
        }
      }
      if (!copying) {
        work.fetch.push_back(task);
        if (v.retained) work.pinned.push_back(task);
      }
    }
  }
  return work;
}

// ---- Reader groups ----

Result<Resolution> HubState::ResolveForGroup(
    const WorkerId& reader, const std::string& model, const std::string& group,
    uint64_t step, int64_t now_ms, bool copy_manifest, bool list_holders) {
  TH_RETURN_IF_ERROR(ValidateModelName(model));
  if (group.empty() || group.size() > 256) {
    return InvalidArgument("reader group id must be 1-256 characters");
  }
  const std::string gname =
      "reader group '" + group + "' step " + std::to_string(step);
  auto key = std::make_pair(model, group);
  auto git = groups_.find(key);
  if (git != groups_.end()) {
    GroupPins& g = git->second;
    g.last_used_ms = now_ms;
    auto sit = g.steps.find(step);
    if (sit != g.steps.end()) {
      Result<Resolution> r = Resolve(reader, model, sit->second, false,
                                     copy_manifest, list_holders);
      if (!r.ok()) {
        return r.status().WithContext(gname + " is pinned to " +
                                      VersionName(model, sit->second));
      }
      return r;
    }
    if (step < g.forgot_below) {
      return FailedPrecondition(
          gname + " is older than the " +
          std::to_string(config_.max_steps_per_group) +
          " newest steps the hub keeps for the group (from step " +
          std::to_string(g.forgot_below) + "); its ranks might disagree");
    }
  }
  TH_ASSIGN_OR_RETURN(Resolution res,
                      Resolve(reader, model, Version::Latest(), false,
                              copy_manifest, list_holders));
  if (git == groups_.end()) {
    if (groups_.size() >= config_.max_groups) {
      // Forget the group unused for longest.
      auto oldest = std::min_element(
          groups_.begin(), groups_.end(), [](const auto& a, const auto& b) {
            return a.second.last_used_ms < b.second.last_used_ms;
          });
      Record({DurableChange::Kind::kGroupGone,
              oldest->first.first,
              {},
              oldest->first.second,
              {}});
      groups_.erase(oldest);
    }
    git = groups_.emplace(key, GroupPins{}).first;
    git->second.last_used_ms = now_ms;
  }
  GroupPins& g = git->second;
  g.steps[step] = res.version;
  while (g.steps.size() > config_.max_steps_per_group) {
    g.forgot_below = std::max(g.forgot_below, g.steps.begin()->first + 1);
    g.steps.erase(g.steps.begin());
  }
  RecordGroup(key);
  return res;
}

size_t HubState::num_group_pins() const {
  size_t n = 0;
  for (const auto& [key, g] : groups_) n += g.steps.size();
  return n;
}

void HubState::ExpireGroups(int64_t now_ms) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (now_ms - it->second.last_used_ms >= config_.group_ttl_ms) {
      Record({DurableChange::Kind::kGroupGone,
              it->first.first,
              {},
              it->first.second,
              {}});
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- Durable facts (HA) ----

void ApplyDurableChange(const DurableChange& c, DurableState& s) {
  using Kind = DurableChange::Kind;
  switch (c.kind) {
    case Kind::kHighest: {
      Version& h = s.highest[c.model];
      h = std::max(h, c.version);
      return;
    }
    case Kind::kPin:
      s.pins.insert({c.model, c.version});
      return;
    case Kind::kUnpin:
      s.pins.erase({c.model, c.version});
      return;
    case Kind::kGroup:
      s.groups[{c.model, c.group}] = c.record;
      return;
    case Kind::kGroupGone:
      s.groups.erase({c.model, c.group});
      return;
  }
}

void HubState::Record(DurableChange change) {
  if (config_.record_durable) durable_changes_.push_back(std::move(change));
}

void HubState::RecordGroup(const std::pair<std::string, std::string>& key) {
  if (!config_.record_durable) return;
  auto it = groups_.find(key);
  if (it == groups_.end()) return;
  Record({DurableChange::Kind::kGroup,
          key.first,
          {},
          key.second,
          GroupRecord{it->second.steps, it->second.forgot_below}});
}

void HubState::Created(const std::string& model, Model& m, Version version,
                       VersionEntry& v) {
  if (version > m.highest) {
    m.highest = version;
    Record({DurableChange::Kind::kHighest, model, version, {}, {}});
  }
  if (m.restored_pins.erase(version) > 0) v.retained = true;
}

std::vector<DurableChange> HubState::TakeDurableChanges() {
  std::vector<DurableChange> out;
  out.swap(durable_changes_);
  return out;
}

void HubState::Restore(const DurableState& durable, int64_t now_ms) {
  for (const auto& [model, highest] : durable.highest) {
    Model& m = models_[model];
    m.highest = std::max(m.highest, highest);
  }
  for (const auto& [model, version] : durable.pins) {
    Model& m = models_[model];
    auto vit = m.versions.find(version);
    if (vit != m.versions.end()) {
      vit->second.retained = true;
    } else {
      m.restored_pins.insert(version);
    }
  }
  for (const auto& [key, record] : durable.groups) {
    GroupPins& g = groups_[key];
    g.steps = record.steps;
    g.forgot_below = record.forgot_below;
    g.last_used_ms = now_ms;
  }
}

DurableState HubState::Durable() const {
  DurableState out;
  for (const auto& [name, m] : models_) {
    if (m.highest.value() > 0) out.highest[name] = m.highest;
    for (Version v : m.restored_pins) out.pins.insert({name, v});
    for (const auto& [version, v] : m.versions) {
      if (v.retained) out.pins.insert({name, version});
    }
  }
  for (const auto& [key, g] : groups_) {
    out.groups[key] = GroupRecord{g.steps, g.forgot_below};
  }
  return out;
}

}  // namespace tensorhub::hub
