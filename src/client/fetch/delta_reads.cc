#include "client/fetch/delta_reads.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "client/tensor_checks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/test_point.h"
#include "delta/delta_codec.h"
#include "wire/frame.h"

namespace tensorhub::client {
namespace {

// A source whose deltas failed this often is read whole for the rest of
// the fetch (each failed chunk is read whole at once).
constexpr int kMaxDeltaFailures = 3;

}  // namespace

DeltaReads::DeltaReads(Registry& own, std::string model, Version version,
                       const Manifest& manifest, DeltaBase base, bool keep,
                       uint64_t keep_max_bytes)
    : own_(own),
      model_(std::move(model)),
      version_(version),
      manifest_(manifest),
      base_(std::move(base)),
      keep_(keep),
      keep_max_bytes_(keep_max_bytes) {}

void DeltaReads::Keep(const std::string& address,
                      const delta::DeltaIndexEntry& entry,
                      std::span<const uint8_t> bytes) {
  if (!keep_) return;
  MutexLock lock(mu_);
  if (kept_from_.empty()) {
    const Source& s = sources_[address];
    if (s.index == nullptr || s.index->body_bytes > keep_max_bytes_) return;
    kept_from_ = address;
    kept_index_ = s.index;
    kept_body_.assign(s.index->body_bytes, '\0');
  }
  if (address != kept_from_ ||
      entry.offset + bytes.size() > kept_body_.size()) {
    return;
  }
  std::memcpy(kept_body_.data() + entry.offset, bytes.data(), bytes.size());
  ++kept_chunks_;
}

std::shared_ptr<const delta::VersionDelta> DeltaReads::TakeReceived() {
  MutexLock lock(mu_);
  if (kept_index_ == nullptr || sources_[kept_from_].failures > 0) {
    return nullptr;
  }
  uint64_t with_delta = 0;
  for (const delta::DeltaIndexEntry& e : kept_index_->chunks) {
    with_delta += e.length > 0 ? 1 : 0;
  }
  if (with_delta == 0 || kept_chunks_ != with_delta) return nullptr;
  auto out = std::make_shared<delta::VersionDelta>();
  out->index = delta::EncodeDeltaIndex(*kept_index_);
  out->body = std::move(kept_body_);
  out->chunks_with_delta = with_delta;
  kept_index_.reset();
  return out;
}

void DeltaReads::Failed(const std::string& address, const std::string& why) {
  MutexLock lock(mu_);
  Source& s = sources_[address];
  if (s.failed) return;
  // Reading whole from here on; said once per source.
  s.failed = true;
  TH_LOG(WARN) << "fetch " << VersionName(model_, version_)
               << ": the delta from " << base_.version.value() << " served by "
               << address << " " << why << "; reading its chunks whole";
}

Result<std::shared_ptr<const delta::DeltaIndex>> DeltaReads::IndexOf(
    transport::Connection& conn, const FetchStep& step,
    const Deadline& deadline) {
  {
    MutexLock lock(mu_);
    const Source& s = sources_[step.address];
    if (s.index != nullptr) return s.index;
  }
  const uint64_t bytes = delta::DeltaIndexBytes(manifest_.num_chunks());
  std::vector<uint8_t> buf(bytes);
  wire::ReadRequest req;
  req.model = model_;
  req.version = version_.value();
  req.epoch = step.epoch;
  req.part = wire::kDeltaIndexPart;
  req.base = base_.version.value();
  req.offset = 0;
  req.length = bytes;
  const iovec dest{buf.data(), buf.size()};
  TH_RETURN_IF_ERROR(conn.Read(req, {&dest, 1}, deadline));
  TH_ASSIGN_OR_RETURN(
      delta::DeltaIndex index,
      delta::DecodeDeltaIndex(buf, base_.version, version_, manifest_));
  if (bytes + index.body_bytes != step.delta->bytes) {
    return DataLoss("is " + std::to_string(bytes + index.body_bytes) +
                    " bytes, the hub said " +
                    std::to_string(step.delta->bytes));
  }
  auto shared = std::make_shared<const delta::DeltaIndex>(std::move(index));
  MutexLock lock(mu_);
  Source& s = sources_[step.address];
  s.index = shared;
  s.wire_bytes += bytes;
  return shared;
}

Result<DeltaReads::Outcome> DeltaReads::Read(transport::Connection& conn,
                                             const FetchStep& step,
                                             std::span<const iovec> dest,
                                             const Deadline& deadline,
                                             std::vector<uint8_t>* scratch,
                                             int64_t* verify_ns) {
  auto read_whole = [&] {
    MutexLock lock(mu_);
    ++read_whole_;
    return Outcome::kReadWhole;
  };
  {
    MutexLock lock(mu_);
    if (base_gone_ || sources_[step.address].failed ||
        !step.delta.has_value() || step.delta->base != base_.version) {
      ++read_whole_;
      return Outcome::kReadWhole;
    }
  }
  // The source's index. A broken connection is the source's failure; a
  // refusal or a corrupt index only its delta's.
  Result<std::shared_ptr<const delta::DeltaIndex>> index =
      IndexOf(conn, step, deadline);
  if (!index.ok()) {
    if (conn.broken()) return index.status();
    Failed(step.address,
           "has no usable index (" + index.status().ToString() + ")");
    return read_whole();
  }
  const delta::DeltaIndexEntry entry = (*index)->chunks[step.chunk];
  if (entry.length == 0) return read_whole();  // no delta of this chunk
  scratch->resize(entry.length);
  wire::ReadRequest req;
  req.model = model_;
  req.version = version_.value();
  req.epoch = step.epoch;
  req.part = wire::kDeltaPart;
  req.base = base_.version.value();
  req.offset = entry.offset;
  req.length = entry.length;
  const iovec into{scratch->data(), scratch->size()};
  Status got = conn.Read(req, {&into, 1}, deadline);
  if (!got.ok()) {
    Failed(step.address, "could not be read (" + got.ToString() + ")");
    if (conn.broken()) return got;
    return read_whole();
  }
  testpoint::Hit("delta_reads.delta_read", step.chunk);
  {
    MutexLock lock(mu_);
    sources_[step.address].wire_bytes += entry.length;
  }
  // This worker's own copy of the chunk of the base, pinned while it is
  // applied (an Unpublish of the base waits for this chunk only).
  const ChunkLoc loc = manifest_.Chunk(step.chunk);
  wire::ReadRequest own;
  own.model = model_;
  own.version = base_.version.value();
  own.epoch = base_.epoch;
  own.part = loc.part;
  own.offset = loc.offset;
  own.length = loc.bytes;
  Result<transport::ServeLease> base = own_.BeginRead(own);
  if (!base.ok() || !base->memory.is_host()) {
    {
      MutexLock lock(mu_);
      if (!base_gone_) {
        TH_LOG(WARN) << "fetch " << VersionName(model_, version_)
                     << ": the base " << base_.version.value()
                     << " is no longer held here; reading the rest whole";
      }
      base_gone_ = true;
    }
    return read_whole();
  }
  thread_local delta::Codec codec;
  Status applied = codec.Apply(*scratch, base->pieces, dest);
  base->pin.reset();
  if (!applied.ok()) {
    int failures = 0;
    {
      MutexLock lock(mu_);
      failures = ++sources_[step.address].failures;
    }
    if (failures >= kMaxDeltaFailures) {
      Failed(step.address, "failed " + std::to_string(failures) + " times (" +
                               applied.ToString() + ")");
    }
    return read_whole();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t sum = ChunkSum(loc.checksum, dest);
  *verify_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
  if (sum != loc.xxh3) {
    // The delta decoded, but not to the version's bytes: the base here is
    // not the one it was made from (changed after it was fetched), or the
    // delta is wrong: the chunk is read whole.
    int failures = 0;
    {
      MutexLock lock(mu_);
      failures = ++sources_[step.address].failures;
    }
    TH_LOG(INFO) << "fetch " << VersionName(model_, version_) << ": chunk "
                 << step.chunk << " from its delta failed its checksum; "
                 << "reading it whole";
    if (failures >= kMaxDeltaFailures) {
      Failed(step.address, "gave chunks that failed their checksum " +
                               std::to_string(failures) + " times");
    }
    return read_whole();
  }
  Keep(step.address, entry, *scratch);
  MutexLock lock(mu_);
  sources_[step.address].bytes += loc.bytes;
  return Outcome::kApplied;
}

void DeltaReads::AddTo(FetchReport* report) const {
  MutexLock lock(mu_);
  if (!sources_.empty()) report->delta_base = base_.version;
  for (const auto& [address, s] : sources_) {
    report->bytes_from_delta += s.bytes;
    report->delta_wire_bytes += s.wire_bytes;
    for (FetchSourceStats& ps : report->per_source) {
      if (ps.address == address) {
        ps.delta_bytes += s.bytes;
        ps.delta_wire_bytes += s.wire_bytes;
        break;
      }
    }
  }
  report->delta_chunks_read_whole += read_whole_;
}

}  // namespace tensorhub::client
