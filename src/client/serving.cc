#include "client/serving.h"

#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <utility>

#include "client/delta_maker.h"
#include "common/checksum.h"
#include "common/log.h"
#include "cuda/device.h"

namespace tensorhub::client {
namespace {

// The chunk checksum a publish names: the options', else the environment's
// TENSORHUB_CHUNK_CHECKSUM, else the tree.
Result<ChunkChecksum> PublishChecksum(const PublishOptions& opts) {
  std::string name = opts.chunk_checksum;
  const char* from = "PublishOptions::chunk_checksum";
  if (name.empty()) {
    const char* env = std::getenv("TENSORHUB_CHUNK_CHECKSUM");
    if (env == nullptr || *env == '\0') return kDefaultChunkChecksum;
    name = env;
    from = "TENSORHUB_CHUNK_CHECKSUM";
  }
  Result<ChunkChecksum> kind = ParseChunkChecksum(name);
  if (!kind.ok()) {
    return kind.status().WithContext(std::string("publish: ") + from);
  }
  return kind;
}

// A rank's part of `tensors`, its chunk checksums computed where the bytes
// are (host or device).
Result<PartLayout> PartOf(const std::vector<TensorRef>& tensors,
                          const PublishOptions& opts, MemoryLocation memory) {
  TH_ASSIGN_OR_RETURN(const ChunkChecksum kind, PublishChecksum(opts));
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
  return part;
}

std::vector<uint8_t*> BasesOf(const std::vector<TensorRef>& tensors) {
  std::vector<uint8_t*> bases;
  for (const TensorRef& t : tensors) {
    bases.push_back(static_cast<uint8_t*>(t.data));
  }
  return bases;
}

}  // namespace

Status Serving::Publish(std::string_view model_sv, Version version,
                        const std::vector<TensorRef>& tensors,
                        const PublishOptions& opts) {
  const std::string model(model_sv);
  if (version.is_latest()) {
    return InvalidArgument("publish needs a version number >= 1");
  }
  if (opts.group_size == 0 || opts.rank >= opts.group_size) {
    return InvalidArgument("rank " + std::to_string(opts.rank) +
                           " is not in a group of " +
                           std::to_string(opts.group_size));
  }
  TH_ASSIGN_OR_RETURN(MemoryLocation memory, CheckMemory(tensors, "publish"));
  ctx_.addresses.WarnIfUnreachable();
  TH_ASSIGN_OR_RETURN(PartLayout part, PartOf(tensors, opts, memory));
  for (const auto& [m, v] : ctx_.registry.Overlapping(RangesOf(tensors))) {
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
  h.bases[opts.rank] = BasesOf(tensors);
  h.parts[opts.rank] = part;
  // Register locally first: the hub may route a read to us as soon as it
  // has heard of the reference.
  TH_ASSIGN_OR_RETURN(uint64_t epoch, ctx_.registry.Add(std::move(h)));
  const Deadline deadline = Deadline::AfterMs(opts.timeout_ms, ctx_.clock);
  Status s = TellHubOfPart(model, version, opts, part, epoch, deadline);
  if (!s.ok()) {
    // Nothing changes: withdraw the local registration again.
    (void)ctx_.registry.Revoke(model, version);
    return s;
  }
  ctx_.registry.MarkReported(model, version, epoch, true);
  // A whole version published alone: its delta from an older one held
  // here, once the hub grants it (delta_maker.h).
  if (opts.group_size == 1 && ctx_.deltas != nullptr) {
    ctx_.deltas->Offer(model, version, deadline);
  }
  return Status::Ok();
}

Status Serving::TellHubOfPart(const std::string& model, Version version,
                              const PublishOptions& opts,
                              const PartLayout& part, uint64_t epoch,
                              const Deadline& deadline) {
  Membership& membership = ctx_.membership;
  Status s = ctx_.hub.Publish(membership.id(), model, version, opts.rank,
                              opts.group_size, opts.chunk_bytes, part, epoch,
                              false, opts.timeout_ms);
  if (s.code() != StatusCode::kNotFound || deadline.expired()) return s;
  // The hub answers a publish NOT_FOUND only when it does not know the
  // worker: it restarted, or a new leader of an HA set has not heard from
  // us yet. Register again (the heartbeat re-reports what we hold) and
  // publish once more, within the caller's time.
  if (!membership.RegisterAgain(deadline).ok()) return s;
  return ctx_.hub.Publish(membership.id(), model, version, opts.rank,
                          opts.group_size, opts.chunk_bytes, part, epoch, false,
                          deadline.timeout_ms());
}

Status Serving::Unpublish(std::string_view model_sv, Version version,
                          int64_t timeout_ms, bool force) {
  const std::string model(model_sv);
  const Deadline deadline = Deadline::AfterMs(timeout_ms, ctx_.clock);
  if (!ctx_.registry.Contains(model, version)) {
    return NotFound("this worker does not publish '" + model + "@" +
                    std::to_string(version.value()) + "'");
  }
  // The hub first: if we hold the last reliable copy of a retained version
  // it holds the call while a keeper copies from us (we still serve), and
  // refuses if none does in time. Leave time for the drain.
  const int64_t left_ms = deadline.remaining_ms();
  const int64_t wait_ms =
      std::max<int64_t>(0, left_ms - std::min<int64_t>(left_ms / 4, 2000));
  // The call itself ends by our deadline even if the hub is unreachable.
  const int64_t call_ms = std::max<int64_t>(
      1, std::min(left_ms, wait_ms + ctx_.options.rpc_timeout_ms));
  Status hs = ctx_.hub.Unpublish(ctx_.membership.id(), model, version, wait_ms,
                                 force, call_ms);
  if (hs.code() == StatusCode::kFailedPrecondition) return hs;  // kept
  TH_ASSIGN_OR_RETURN(uint64_t epoch, ctx_.registry.Revoke(model, version));
  if (!hs.ok() && hs.code() != StatusCode::kNotFound) {
    // The hub is unreachable: it keeps routing readers here until it hears
    // from us; they are refused (the epoch is fenced) and move on.
    TH_LOG(WARN) << "unpublish '" << model << "@" << version.value()
                 << "': hub not told yet (" << hs.ToString() << "); will retry";
    ctx_.membership.WithdrawLater(model, version);
  }
  return Drain(model, version, epoch, deadline);
}

Status Serving::Drain(const std::string& model, Version version, uint64_t epoch,
                      const Deadline& deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = ctx_.registry.Drain(model, version, epoch, deadline);
  ctx_.metrics.Drained(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count(),
      s.ok());
  return s;
}

Status Serving::ReleaseOverlapping(const std::vector<MemoryRange>& ranges,
                                   const Deadline& deadline) {
  for (const auto& [m, old] : ctx_.registry.Overlapping(ranges)) {
    TH_RETURN_IF_ERROR(Unpublish(m, old, deadline.remaining_ms(), false)
                           .WithContext("fetch: releasing the destination"));
  }
  return Status::Ok();
}

// ---------------------------------------------------------- FillingCopy

bool FillingCopy::Register(const Manifest& manifest, const FetchJob& job,
                           EpochReservation& reserved, bool reported) {
  if (!reserved.epoch().has_value()) return false;
  WorkerContext& ctx = serving_.context();
  Holding h;
  h.model = model_;
  h.version = version_;
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
  Result<uint64_t> epoch = ctx.registry.Add(std::move(h));
  if (!epoch.ok()) {
    TH_LOG(WARN) << "not serving " << VersionName(model_, version_) << ": "
                 << epoch.status().ToString();
    return false;
  }
  reserved.Used();
  if (reported) ctx.registry.MarkReported(model_, version_, *epoch, true);
  manifest_ = &manifest;
  epoch_ = *epoch;
  return true;
}

std::function<void(uint64_t)> FillingCopy::OnChunk() const {
  if (!epoch_.has_value()) return nullptr;
  Registry* registry = &serving_.context().registry;
  return [registry, model = model_, v = version_, e = *epoch_](uint64_t c) {
    registry->MarkChunk(model, v, e, c);
  };
}

std::function<void(uint64_t, uint64_t)> FillingCopy::OnLanded() const {
  if (!epoch_.has_value()) return nullptr;
  Registry* registry = &serving_.context().registry;
  return [registry, model = model_, v = version_, e = *epoch_](uint64_t c,
                                                               uint64_t bytes) {
    registry->MarkLanded(model, v, e, c, bytes);
  };
}

bool FillingCopy::Complete() {
  if (!epoch_.has_value()) return false;
  const uint64_t epoch = *epoch_;
  epoch_.reset();
  WorkerContext& ctx = serving_.context();
  ctx.registry.FinishFill(model_, version_, epoch);
  Status s = ctx.hub.AddHolder(ctx.membership.id(), model_, version_, epoch,
                               *manifest_, false, deadline_.remaining_ms());
  ctx.registry.MarkReported(model_, version_, epoch, s.ok());
  if (!s.ok()) {
    // The fetch itself succeeded; the heartbeat reports the copy once the
    // hub answers again.
    TH_LOG(WARN) << "fetched " << VersionName(model_, version_)
                 << " but could not tell the hub yet: " << s.ToString();
  } else if (ctx.deltas != nullptr) {
    // Held whole now: the first holder of a version that still holds an
    // older one may be the one to make their delta.
    ctx.deltas->Offer(model_, version_, deadline_, received_base_,
                      std::move(received_));
  }
  return true;
}

void FillingCopy::Abort() {
  if (!epoch_.has_value()) return;
  epoch_.reset();
  WorkerContext& ctx = serving_.context();
  Result<uint64_t> revoked = ctx.registry.Revoke(model_, version_);
  if (revoked.ok()) {
    // Fenced at once; reads already admitted get until the deadline. One
    // still running then reads memory the caller may overwrite: the
    // reader's chunk checksum catches that and it reads elsewhere.
    Status d = serving_.Drain(model_, version_, *revoked, deadline_);
    if (!d.ok()) TH_LOG(WARN) << "abandoned fetch: " << d.ToString();
  }
  // A filling copy never counts as a copy to keep.
  ctx.membership.Withdraw(model_, version_, deadline_);
}

// ---------------------------------------------------------- ServeSlices

namespace {

// The boxes of `slices` as a holder of slices' own layout, its segments
// about as large as the publisher's; nullopt (logged) if there is nothing
// to serve.
std::optional<std::pair<PartLayout, std::vector<TensorRef>>> SliceLayout(
    const Manifest& manifest, const std::vector<TensorSlice>& slices,
    const std::string& vname) {
  std::map<std::string, const TensorLayout*> logical;
  uint64_t segment_bytes = 0;
  for (const PartLayout& p : manifest.parts()) {
    for (const TensorLayout& t : p.tensors) {
      logical.emplace(t.spec.name, &t);
      segment_bytes = std::max(
          segment_bytes, t.seg.rows * t.seg.cols * DTypeBytes(t.spec.dtype));
    }
  }
  std::vector<TensorRef> refs;
  PieceOptions po;
  po.segment_bytes = segment_bytes > 0 ? segment_bytes : kDefaultSegmentBytes;
  for (const TensorSlice& s : slices) {
    const TensorLayout& t = *logical.at(s.tensor.spec.name);  // planned
    // Only slices kept in the published dtype are served.
    if (s.tensor.spec.dtype != t.spec.dtype || s.box.Elements() == 0) continue;
    const TensorPiece piece{t.GlobalShape(), s.box.offset};
    if (!po.pieces.emplace(s.tensor.spec.name, piece).second) {
      TH_LOG(WARN) << "serve slices of " << vname << ": tensor '"
                   << s.tensor.spec.name
                   << "' is named twice; serving none of its slices";
      return std::nullopt;
    }
    refs.push_back(s.tensor);
  }
  if (refs.empty()) return std::nullopt;
  ChunkHasher hash = [](std::span<const iovec> pieces) -> Result<uint64_t> {
    return ChunkSum(kDefaultChunkChecksum, pieces);
  };
  Result<PartLayout> layout =
      BuildPartLayout(wire::kSliceHolderPart, refs, manifest.chunk_bytes(),
                      kDefaultChunkChecksum, hash, po);
  if (!layout.ok()) {
    TH_LOG(WARN) << "serve slices of " << vname << ": "
                 << layout.status().ToString();
    return std::nullopt;
  }
  return std::make_pair(std::move(layout).value(), std::move(refs));
}

}  // namespace

void Serving::ServeSlices(const std::string& model, Version version,
                          const Manifest& manifest,
                          const std::vector<TensorSlice>& slices,
                          const Deadline& deadline) {
  const std::string vname = VersionName(model, version);
  if (ctx_.registry.Contains(model, version)) {
    TH_LOG(DEBUG) << "serve slices of " << vname
                  << ": this worker serves the version already";
    return;
  }
  auto layout = SliceLayout(manifest, slices, vname);
  if (!layout.has_value()) return;
  const auto& [part, refs] = *layout;
  Holding h;
  h.model = model;
  h.version = version;
  h.group_size = manifest.group_size();
  h.chunk_bytes = manifest.chunk_bytes();
  h.memory = MemoryLocation::Host();
  h.slices = true;
  h.bases[wire::kSliceHolderPart] = BasesOf(refs);
  h.parts[wire::kSliceHolderPart] = part;
  Result<uint64_t> epoch = ctx_.registry.Add(std::move(h));
  if (!epoch.ok()) {
    TH_LOG(WARN) << "serve slices of " << vname << ": "
                 << epoch.status().ToString();
    return;
  }
  ctx_.addresses.WarnIfUnreachable();
  Status s = ctx_.hub.AddSliceHolder(ctx_.membership.id(), model, version,
                                     *epoch, part, deadline.timeout_ms());
  // Not acknowledged: the heartbeat reports it again.
  ctx_.registry.MarkReported(model, version, *epoch, s.ok());
  if (!s.ok()) {
    TH_LOG(WARN) << "serve slices of " << vname << ": " << s.ToString();
  }
}

}  // namespace tensorhub::client
