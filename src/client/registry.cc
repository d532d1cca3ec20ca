#include "client/registry.h"

#include <algorithm>

#include "common/test_point.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {

uint64_t Registry::ReserveEpoch() {
  MutexLock lock(mu_);
  const uint64_t epoch = next_epoch_++;
  reserved_.insert(epoch);
  return epoch;
}

void Registry::CancelReservation(uint64_t epoch) {
  MutexLock lock(mu_);
  if (reserved_.erase(epoch) > 0) chunk_arrived_.notify_all();
}

Result<uint64_t> Registry::Add(Holding holding) {
  MutexLock lock(mu_);
  if (holding.epoch != 0 && reserved_.count(holding.epoch) == 0) {
    return Internal("registration names epoch " +
                    std::to_string(holding.epoch) + ", which is not reserved");
  }
  Key key{holding.model, holding.version};
  if (live_.count(key) > 0) {
    return AlreadyExists("'" + holding.model + "@" +
                         std::to_string(holding.version.value()) +
                         "' is already published by this worker");
  }
  if (holding.bases.size() != holding.parts.size()) {
    return Internal("registration has bases for " +
                    std::to_string(holding.bases.size()) + " parts and " +
                    std::to_string(holding.parts.size()) + " layouts");
  }
  for (const auto& [part, layout] : holding.parts) {
    if (holding.bases[part].size() != layout.tensors.size()) {
      return Internal("registration has bases for " +
                      std::to_string(holding.bases[part].size()) +
                      " tensors of " + std::to_string(layout.tensors.size()));
    }
  }
  auto e = std::make_shared<Entry>();
  if (holding.filling) {
    if (!holding.manifest.has_value()) {
      return Internal("a filling registration needs its manifest");
    }
    e->have.assign(holding.manifest->num_chunks(), 0);
    e->landed.assign(holding.manifest->num_chunks(), 0);
  }
  std::vector<iovec> regions;
  for (const auto& [part, layout] : holding.parts) {
    const std::vector<uint8_t*>& bases = holding.bases[part];
    for (size_t t = 0; t < layout.tensors.size(); ++t) {
      if (layout.tensors[t].bytes > 0) {
        regions.push_back({bases[t], layout.tensors[t].bytes});
      }
    }
  }
  e->registration = std::make_unique<transport::Registration>(
      std::move(regions), holding.memory);
  if (holding.epoch == 0) {
    holding.epoch = next_epoch_++;
  } else {
    reserved_.erase(holding.epoch);
    chunk_arrived_.notify_all();  // reads waiting for the registration
  }
  uint64_t epoch = holding.epoch;
  e->holding = std::move(holding);
  live_[key] = std::move(e);
  return epoch;
}

Result<uint64_t> Registry::Revoke(const std::string& model, Version version) {
  MutexLock lock(mu_);
  auto it = live_.find({model, version});
  if (it == live_.end()) {
    return NotFound("this worker does not publish '" + model + "@" +
                    std::to_string(version.value()) + "'");
  }
  std::shared_ptr<Entry> e = std::move(it->second);
  live_.erase(it);
  e->revoked = true;
  e->revoked_flag->store(true);
  chunk_arrived_.notify_all();  // reads waiting for chunks give up
  uint64_t epoch = e->holding.epoch;
  if (e->inflight > 0) {
    draining_[epoch] = std::move(e);
  } else {
    e->registration.reset();  // no read holds it: unregister now
  }
  return epoch;
}

bool Registry::Contains(const std::string& model, Version version) const {
  MutexLock lock(mu_);
  return live_.count({model, version}) > 0;
}

Status Registry::Drain(const std::string& model, Version version,
                       uint64_t epoch, const Deadline& deadline) {
  MutexLock lock(mu_);
  bool done = drained_.wait_until(
      lock.native(), deadline.at(),
      [&]() TH_REQUIRES(mu_) { return draining_.count(epoch) == 0; });
  if (!done) {
    return DeadlineExceeded(
        std::to_string(draining_[epoch]->inflight) + " reads of '" + model +
        "@" + std::to_string(version.value()) +
        "' still in flight at the deadline; its memory is not safe to reuse");
  }
  return Status::Ok();
}

std::vector<std::pair<std::string, Version>> Registry::Overlapping(
    const std::vector<std::pair<const uint8_t*, uint64_t>>& ranges) const {
  std::vector<std::pair<std::string, Version>> out;
  MutexLock lock(mu_);
  for (const auto& [key, e] : live_) {
    bool hit = false;
    for (const auto& [part, bases] : e->holding.bases) {
      const PartLayout& layout = e->holding.parts.at(part);
      for (size_t i = 0; i < bases.size() && !hit; ++i) {
        const uint8_t* b = bases[i];
        uint64_t n = layout.tensors[i].bytes;
        for (const auto& [rb, rn] : ranges) {
          if (n > 0 && rn > 0 && b < rb + rn && rb < b + n) {
            hit = true;
            break;
          }
        }
      }
      if (hit) break;
    }
    if (hit) out.push_back(key);
  }
  return out;
}

std::vector<Holding> Registry::Snapshot() const {
  MutexLock lock(mu_);
  std::vector<Holding> out;
  for (const auto& [key, e] : live_) out.push_back(e->holding);
  return out;
}

std::vector<Holding> Registry::Unreported() const {
  MutexLock lock(mu_);
  std::vector<Holding> out;
  for (const auto& [key, e] : live_) {
    if (!e->holding.reported) out.push_back(e->holding);
  }
  return out;
}

void Registry::MarkAllUnreported() {
  MutexLock lock(mu_);
  for (auto& [key, e] : live_) e->holding.reported = false;
}

void Registry::MarkReported(const std::string& model, Version version,
                            uint64_t epoch, bool reported) {
  MutexLock lock(mu_);
  auto it = live_.find({model, version});
  if (it != live_.end() && it->second->holding.epoch == epoch) {
    it->second->holding.reported = reported;
    if (reported) it->second->holding.accepted = true;
  }
}

Registry::Entry* Registry::FindLocked(const std::string& model, Version version,
                                      uint64_t epoch) {
  auto it = live_.find({model, version});
  if (it == live_.end() || it->second->holding.epoch != epoch) return nullptr;
  return it->second.get();
}

void Registry::MarkChunk(const std::string& model, Version version,
                         uint64_t epoch, uint64_t chunk) {
  MutexLock lock(mu_);
  Entry* e = FindLocked(model, version, epoch);
  if (e == nullptr || chunk >= e->have.size()) return;
  e->have[chunk] = 1;
  chunk_arrived_.notify_all();
}

void Registry::MarkLanded(const std::string& model, Version version,
                          uint64_t epoch, uint64_t chunk, uint64_t bytes) {
  MutexLock lock(mu_);
  Entry* e = FindLocked(model, version, epoch);
  if (e == nullptr || chunk >= e->landed.size()) return;
  e->landed[chunk] = bytes;
  if (bytes > 0) chunk_arrived_.notify_all();
}

void Registry::FinishFill(const std::string& model, Version version,
                          uint64_t epoch) {
  MutexLock lock(mu_);
  Entry* e = FindLocked(model, version, epoch);
  if (e == nullptr) return;
  e->holding.filling = false;
  e->have.clear();
  e->landed.clear();
  chunk_arrived_.notify_all();
}

Result<transport::ServeLease> Registry::BeginRead(
    const wire::ReadRequest& req) {
  Result<transport::ServeLease> lease = Admit(req);
  if (!lease.ok()) reads_refused_.fetch_add(1, std::memory_order_relaxed);
  return lease;
}

Result<transport::ServeLease> Registry::Admit(const wire::ReadRequest& req) {
  MutexLock lock(mu_);
  auto it = live_.find({req.model, Version(req.version)});
  const std::string name =
      "'" + req.model + "@" + std::to_string(req.version) + "'";
  if ((it == live_.end() || it->second->holding.epoch != req.epoch) &&
      reserved_.count(req.epoch) > 0) {
    // The hub knows this fetch's registration before it exists here
    // (BeginFetch): wait for it, as for a chunk not there yet.
    testpoint::Hit("registry.reserved_read_waits", req.epoch);
    chunk_arrived_.wait_for(
        lock.native(), std::chrono::milliseconds(fill_wait_ms_),
        [&]() TH_REQUIRES(mu_) { return reserved_.count(req.epoch) == 0; });
    it = live_.find({req.model, Version(req.version)});
  }
  if (it == live_.end()) {
    return NotFound("this worker does not hold " + name);
  }
  std::shared_ptr<Entry> e = it->second;
  if (e->holding.epoch != req.epoch) {
    return Aborted("registration " + std::to_string(req.epoch) + " of " + name +
                   " was revoked");
  }
  if (req.part == wire::kManifestPart) {
    if (e->manifest_bytes == nullptr) {
      // Encoded once per registration, outside the lock: a large model's
      // manifest takes milliseconds, which every other read and publish
      // would wait for. What it is made of (the manifest, the parts, the
      // rank) does not change after Register(), and `e` keeps the entry.
      lock.Unlock();
      testpoint::Hit("registry.manifest_encoding", req.epoch);
      Result<std::shared_ptr<const std::string>> bytes =
          EncodeManifestOf(e->holding, name);
      lock.Lock();
      if (!bytes.ok()) return bytes.status();
      if (e->revoked) {
        return Aborted("registration " + std::to_string(req.epoch) + " of " +
                       name + " was revoked");
      }
      if (e->manifest_bytes == nullptr) e->manifest_bytes = *std::move(bytes);
    }
    return ServeManifest(*e, req, name);
  }
  if (wire::IsDeltaPart(req.part)) return ServeDelta(*e, req, name);
  auto pit = e->holding.parts.find(req.part);
  if (pit == e->holding.parts.end()) {
    return NotFound("this worker does not hold part " +
                    std::to_string(req.part) + " of " + name);
  }
  const PartLayout& layout = pit->second;
  if (req.offset > layout.part_bytes || req.span_end() > layout.part_bytes ||
      req.span_end() < req.offset) {
    return InvalidArgument("read past the end of part " +
                           std::to_string(req.part) + " of " + name);
  }
  if (e->holding.filling) {
    TH_RETURN_IF_ERROR(WaitForChunks(lock, *e, req, name));
  }
  return LeaseOf(e, layout, req);
}

// Partial-prefix serving: waits (bounded) until every chunk the range
// touches has been received and verified here, or, for a range inside one
// chunk, until the chunk's bytes up to the range's end have landed
// (cut-through: the reader of this range verifies the whole chunk itself,
// against the manifest, whoever served its pieces).
Status Registry::WaitForChunks(MutexLock& lock, Entry& e,
                               const wire::ReadRequest& req,
                               const std::string& name) {
  const Manifest& m = *e.holding.manifest;
  const uint64_t first = m.chunk_base(req.part) + req.offset / m.chunk_bytes();
  const uint64_t last =
      m.chunk_base(req.part) + (req.span_end() - 1) / m.chunk_bytes();
  const uint64_t need_landed =
      req.span_end() - (req.offset / m.chunk_bytes()) * m.chunk_bytes();
  auto ready = [&]() TH_REQUIRES(mu_) {
    if (e.revoked || !e.holding.filling) return true;
    if (first == last && e.landed[first] >= need_landed) return true;
    for (uint64_t c = first; c <= last; ++c) {
      if (!e.have[c]) return false;
    }
    return true;
  };
  if (!chunk_arrived_.wait_for(
          lock.native(), std::chrono::milliseconds(fill_wait_ms_), ready)) {
    return Unavailable("chunks " + std::to_string(first) + ".." +
                       std::to_string(last) + " of " + name +
                       " did not arrive here within " +
                       std::to_string(fill_wait_ms_) + " ms");
  }
  if (e.revoked) {
    return Aborted("registration " + std::to_string(req.epoch) + " of " + name +
                   " was revoked");
  }
  return Status::Ok();
}

// The lease of an admitted read: where its bytes are, and the pin whose
// deleter ends the read.
transport::ServeLease Registry::LeaseOf(const std::shared_ptr<Entry>& e,
                                        const PartLayout& layout,
                                        const wire::ReadRequest& req) {
  transport::ServeLease lease;
  lease.memory = e->holding.memory;
  lease.registration = e->registration.get();
  lease.revoked = e->revoked_flag;
  if (req.run == 0) {
    AppendPieces(layout, e->holding.bases.at(req.part), req.offset, req.length,
                 &lease.pieces);
  } else {
    for (uint64_t i = 0; i < req.runs(); ++i) {
      AppendPieces(layout, e->holding.bases.at(req.part),
                   req.offset + i * req.stride, req.run, &lease.pieces);
    }
  }
  lease.pin = PinOf(e);
  return lease;
}

std::shared_ptr<void> Registry::PinOf(const std::shared_ptr<Entry>& e) {
  ++e->inflight;
  // The pin's deleter ends the read: the last one of a revoked registration
  // wakes Drain().
  return std::shared_ptr<void>(nullptr, [this, e](void*) {
    MutexLock l(mu_);
    if (--e->inflight == 0 && e->revoked) {
      // The last read of a revoked registration: unregister before Drain()
      // returns, so the owner never reuses memory a transport still names.
      e->registration.reset();
    }
    if (e->inflight == 0) {
      draining_.erase(e->holding.epoch);
      drained_.notify_all();
    }
  });
}

Result<std::shared_ptr<const std::string>> Registry::EncodeManifestOf(
    const Holding& h, const std::string& name) {
  if (h.manifest.has_value()) {
    return std::make_shared<const std::string>(
        wire::EncodeManifest(*h.manifest));
  }
  if (h.group_size == 1 && h.rank.has_value() && !h.slices) {
    // A trainer that published the whole version alone knows its manifest:
    // the hub's is made of this one part.
    return std::make_shared<const std::string>(wire::EncodeManifest(
        Manifest(1, h.chunk_bytes, {h.parts.at(*h.rank)})));
  }
  return NotFound("this worker holds a part of " + name +
                  " and does not know its whole manifest");
}

Result<transport::ServeLease> Registry::ServeManifest(
    Entry& e, const wire::ReadRequest& req, const std::string& name) {
  const std::shared_ptr<const std::string>& bytes = e.manifest_bytes;
  if (req.run != 0 || req.offset > bytes->size() ||
      req.length > bytes->size() - req.offset) {
    return InvalidArgument("read past the end of the manifest of " + name +
                           " (" + std::to_string(bytes->size()) + " bytes)");
  }
  // The bytes are the registry's own, not the published memory: the read
  // pins them, not the registration, and no drain waits for it.
  transport::ServeLease lease;
  lease.memory = MemoryLocation::Host();
  lease.pieces.push_back(
      {const_cast<char*>(bytes->data()) + req.offset, req.length});
  lease.pin = std::const_pointer_cast<std::string>(bytes);
  return lease;
}

Result<transport::ServeLease> Registry::ServeDelta(Entry& e,
                                                   const wire::ReadRequest& req,
                                                   const std::string& name) {
  auto it = e.deltas.find(Version(req.base));
  if (it == e.deltas.end()) {
    return NotFound("this worker has no delta of " + name + " from " +
                    std::to_string(req.base));
  }
  const std::shared_ptr<const delta::VersionDelta>& d = it->second;
  const std::string& bytes =
      req.part == wire::kDeltaIndexPart ? d->index : d->body;
  if (req.run != 0 || req.offset > bytes.size() ||
      req.length > bytes.size() - req.offset) {
    return InvalidArgument("read past the end of the delta of " + name +
                           " from " + std::to_string(req.base));
  }
  // As the manifest: the registry's own bytes, pinned by the read; no
  // drain waits for them.
  transport::ServeLease lease;
  lease.memory = MemoryLocation::Host();
  lease.pieces.push_back(
      {const_cast<char*>(bytes.data()) + req.offset, req.length});
  lease.pin = std::const_pointer_cast<delta::VersionDelta>(d);
  return lease;
}

std::vector<Version> Registry::WholeVersions(const std::string& model) const {
  MutexLock lock(mu_);
  std::vector<Version> out;
  for (auto it = live_.lower_bound({model, Version(0)});
       it != live_.end() && it->first.first == model; ++it) {
    const Holding& h = it->second->holding;
    if (h.filling || h.slices) continue;
    if (h.manifest.has_value() || (h.group_size == 1 && h.rank.has_value())) {
      out.push_back(h.version);
    }
  }
  return out;
}

std::optional<WholeCopy> Registry::PinWhole(const std::string& model,
                                            Version version) {
  MutexLock lock(mu_);
  auto it = live_.find({model, version});
  if (it == live_.end()) return std::nullopt;
  const std::shared_ptr<Entry>& e = it->second;
  const Holding& h = e->holding;
  if (h.filling || h.slices) return std::nullopt;
  std::optional<Manifest> manifest = h.manifest;
  if (!manifest.has_value()) {
    if (h.group_size != 1 || !h.rank.has_value()) return std::nullopt;
    manifest = Manifest(1, h.chunk_bytes, {h.parts.at(*h.rank)});
  }
  return WholeCopy{h, std::move(*manifest), PinOf(e)};
}

Status Registry::AttachDelta(const std::string& model, Version version,
                             uint64_t epoch, Version base,
                             std::shared_ptr<const delta::VersionDelta> delta) {
  MutexLock lock(mu_);
  Entry* e = FindLocked(model, version, epoch);
  if (e == nullptr || e->revoked) {
    return NotFound("'" + model + "@" + std::to_string(version.value()) +
                    "' registration " + std::to_string(epoch) +
                    " is gone: its delta is not served");
  }
  e->holding.deltas[base] = delta->total_bytes();
  e->deltas[base] = std::move(delta);
  return Status::Ok();
}

uint64_t Registry::delta_bytes() const {
  MutexLock lock(mu_);
  uint64_t n = 0;
  for (const auto& [key, e] : live_) {
    for (const auto& [base, d] : e->deltas) n += d->total_bytes();
  }
  return n;
}

Registry::HeldCounts Registry::held() const {
  MutexLock lock(mu_);
  HeldCounts c;
  for (const auto& [key, e] : live_) {
    ++(e->holding.filling ? c.filling : c.complete);
  }
  return c;
}

size_t Registry::reads_in_flight() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [key, e] : live_) n += e->inflight;
  for (const auto& [epoch, e] : draining_) n += e->inflight;
  return n;
}

}  // namespace tensorhub::client
