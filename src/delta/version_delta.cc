#include "delta/version_delta.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "delta/delta_codec.h"
#include "delta/le_bytes.h"

namespace tensorhub::delta {
namespace {

using le::GetU32;
using le::GetU64;
using le::PutU32;
using le::PutU64;

}  // namespace

uint64_t DeltaIndexBytes(uint64_t num_chunks) {
  return kDeltaIndexHeaderBytes + kDeltaIndexEntryBytes * num_chunks;
}

std::string EncodeDeltaIndex(const DeltaIndex& index) {
  std::string out;
  out.reserve(DeltaIndexBytes(index.chunks.size()));
  PutU32(&out, kDeltaIndexMagic);
  PutU32(&out, 0);
  PutU64(&out, index.base.value());
  PutU64(&out, index.version.value());
  PutU64(&out, index.chunks.size());
  PutU64(&out, index.body_bytes);
  for (const DeltaIndexEntry& e : index.chunks) {
    PutU64(&out, e.offset);
    PutU64(&out, e.length);
  }
  return out;
}

Result<DeltaIndex> DecodeDeltaIndex(std::span<const uint8_t> bytes,
                                    Version base, Version version,
                                    const Manifest& manifest) {
  const uint64_t n = manifest.num_chunks();
  if (bytes.size() != DeltaIndexBytes(n)) {
    return DataLoss("delta index: " + std::to_string(bytes.size()) +
                    " bytes, a version of " + std::to_string(n) +
                    " chunks has " + std::to_string(DeltaIndexBytes(n)));
  }
  const uint8_t* p = bytes.data();
  if (GetU32(p) != kDeltaIndexMagic || GetU32(p + 4) != 0) {
    return DataLoss("delta index: bad magic or reserved field");
  }
  DeltaIndex index;
  index.base = Version(GetU64(p + 8));
  index.version = Version(GetU64(p + 16));
  if (index.base != base || index.version != version || GetU64(p + 24) != n) {
    return DataLoss("delta index of " + std::to_string(index.base.value()) +
                    " -> " + std::to_string(index.version.value()) +
                    ", not of the one asked for");
  }
  index.body_bytes = GetU64(p + 32);
  index.chunks.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    DeltaIndexEntry& e = index.chunks[i];
    e.offset = GetU64(p + kDeltaIndexHeaderBytes + kDeltaIndexEntryBytes * i);
    e.length =
        GetU64(p + kDeltaIndexHeaderBytes + kDeltaIndexEntryBytes * i + 8);
    const uint64_t most = manifest.Chunk(i).bytes + kChunkDeltaHeaderBytes;
    if (e.length > most || e.offset > index.body_bytes ||
        e.length > index.body_bytes - e.offset) {
      return DataLoss("delta index: chunk " + std::to_string(i) + " at " +
                      std::to_string(e.offset) + " + " +
                      std::to_string(e.length) + " does not fit a body of " +
                      std::to_string(index.body_bytes) + " bytes");
    }
  }
  return index;
}

Status CheckSameChunks(const Manifest& base, const Manifest& version) {
  if (base.group_size() != version.group_size() ||
      base.chunk_bytes() != version.chunk_bytes()) {
    return FailedPrecondition(
        "the two versions differ in group size or chunk size (" +
        std::to_string(base.group_size()) + " x " +
        std::to_string(base.chunk_bytes()) + " vs " +
        std::to_string(version.group_size()) + " x " +
        std::to_string(version.chunk_bytes()) + ")");
  }
  for (size_t p = 0; p < base.parts().size(); ++p) {
    if (base.parts()[p].part_bytes != version.parts()[p].part_bytes) {
      return FailedPrecondition("part " + std::to_string(p) + " has " +
                                std::to_string(base.parts()[p].part_bytes) +
                                " bytes in one version and " +
                                std::to_string(version.parts()[p].part_bytes) +
                                " in the other");
    }
  }
  return Status::Ok();
}

uint32_t ChunkElementBytes(const Manifest& manifest, uint64_t chunk) {
  const ChunkLoc loc = manifest.Chunk(chunk);
  const std::vector<TensorLayout>& ts = manifest.parts()[loc.part].tensors;
  // Tensors tile the part in offset order: the last one starting at or
  // before the chunk holds its first byte.
  auto it = std::upper_bound(
      ts.begin(), ts.end(), loc.offset,
      [](uint64_t off, const TensorLayout& t) { return off < t.offset; });
  if (it == ts.begin()) return 1;
  const size_t w = DTypeBytes(std::prev(it)->spec.dtype);
  return (w == 2 || w == 4 || w == 8) ? static_cast<uint32_t>(w) : 1;
}

Result<VersionDelta> ComputeVersionDelta(const Manifest& base_manifest,
                                         Version base,
                                         const Manifest& version_manifest,
                                         Version version,
                                         const ChunkPieces& pieces,
                                         const ComputeOptions& options) {
  TH_RETURN_IF_ERROR(CheckSameChunks(base_manifest, version_manifest));
  const uint64_t n = version_manifest.num_chunks();
  std::vector<std::string> deltas(n);
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  Status error;
  std::mutex error_mu;
  auto work = [&] {
    Codec codec;
    std::vector<iovec> b, v;
    for (uint64_t i = next++; i < n && !failed; i = next++) {
      b.clear();
      v.clear();
      pieces(i, &b, &v);
      if (options.verify_inputs) {
        const ChunkLoc bl = base_manifest.Chunk(i);
        const ChunkLoc vl = version_manifest.Chunk(i);
        if (ChunkSum(bl.checksum, b) != bl.xxh3 ||
            ChunkSum(vl.checksum, v) != vl.xxh3) {
          continue;  // no delta: readers read this chunk whole
        }
      }
      Result<bool> made = codec.Encode(
          b, v, ChunkElementBytes(version_manifest, i), &deltas[i]);
      if (!made.ok()) {
        std::lock_guard<std::mutex> l(error_mu);
        error = made.status();
        failed = true;
      }
    }
  };
  const int threads = static_cast<int>(
      std::clamp<uint64_t>(options.threads, 1, std::max<uint64_t>(n, 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failed) return error;

  VersionDelta out;
  DeltaIndex index;
  index.base = base;
  index.version = version;
  index.chunks.resize(n);
  uint64_t body = 0;
  for (const std::string& d : deltas) body += d.size();
  out.body.reserve(body);
  for (uint64_t i = 0; i < n; ++i) {
    index.chunks[i] = {out.body.size(), deltas[i].size()};
    out.chunks_with_delta += deltas[i].empty() ? 0 : 1;
    out.body += deltas[i];
    std::string().swap(deltas[i]);
  }
  index.body_bytes = out.body.size();
  out.index = EncodeDeltaIndex(index);
  return out;
}

}  // namespace tensorhub::delta
