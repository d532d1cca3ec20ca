// The delta of a whole version against a base version of the same layout:
// each chunk's delta (delta_codec.h), back to back in a body, and an index
// saying where each lies (docs/wire.md, "Delta parts"). A holder computes
// it once per (base, version) and serves both as it serves chunks; a
// reader that holds the base reads the index, then each chunk's delta,
// applies it and checks the chunk against the version's own checksum.
//
// Delta index (all integers little-endian):
//   u32 magic 'THX1' | u32 reserved (0) | u64 base | u64 version |
//   u64 num_chunks | u64 body_bytes |
//   num_chunks x (u64 offset | u64 length)      into the body
// length 0: no delta of that chunk (it changed too much to pay, or an
// input failed its checksum when the delta was made); read it whole.
#ifndef TENSORHUB_DELTA_VERSION_DELTA_H_
#define TENSORHUB_DELTA_VERSION_DELTA_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/manifest.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::delta {

inline constexpr uint32_t kDeltaIndexMagic = 0x31584854;  // "THX1"
inline constexpr size_t kDeltaIndexHeaderBytes = 40;
inline constexpr size_t kDeltaIndexEntryBytes = 16;

struct DeltaIndexEntry {
  uint64_t offset = 0;
  uint64_t length = 0;  // 0: no delta of this chunk
  bool operator==(const DeltaIndexEntry&) const = default;
};

struct DeltaIndex {
  Version base;
  Version version;
  uint64_t body_bytes = 0;
  std::vector<DeltaIndexEntry> chunks;
  bool operator==(const DeltaIndex&) const = default;
};

// The encoded index's size for a version of `num_chunks` chunks.
uint64_t DeltaIndexBytes(uint64_t num_chunks);
std::string EncodeDeltaIndex(const DeltaIndex& index);
// Accepts only the index of (base -> version) for a version of `manifest`
// (its chunk count), whose entries lie inside the body, each no longer than
// its chunk plus a chunk delta's header. DATA_LOSS otherwise.
Result<DeltaIndex> DecodeDeltaIndex(std::span<const uint8_t> bytes,
                                    Version base, Version version,
                                    const Manifest& manifest);

// Deltas pair chunk i of one version with chunk i of the other: OK if the
// two manifests cut the same bytes into the same chunks (group size, chunk
// size and every part's size); FAILED_PRECONDITION saying how they differ.
Status CheckSameChunks(const Manifest& base, const Manifest& version);

// The element width that codes chunk `chunk` of `manifest` best: that of
// the tensor holding the chunk's first byte (1 for anything else).
uint32_t ChunkElementBytes(const Manifest& manifest, uint64_t chunk);

// A computed delta, owned: what a holder serves.
struct VersionDelta {
  std::string index;  // EncodeDeltaIndex
  std::string body;
  uint64_t chunks_with_delta = 0;
  uint64_t total_bytes() const { return index.size() + body.size(); }
};

// Where chunk i's bytes lie in the caller's memory, for the base and the
// version (pieces appended to the vectors, which arrive empty).
using ChunkPieces = std::function<void(uint64_t chunk, std::vector<iovec>* base,
                                       std::vector<iovec>* version)>;

struct ComputeOptions {
  // Threads coding chunks at once (each with its own codec).
  int threads = 1;
  // Checks each chunk of the base and of the version against its manifest
  // checksum before coding it; a chunk that fails gets no delta (readers
  // read it whole). What a delta made from memory changed after publish
  // would otherwise carry to every reader.
  bool verify_inputs = true;
};

// The delta (base -> version): every chunk coded against the same chunk of
// the base. FAILED_PRECONDITION when the manifests' chunks differ
// (CheckSameChunks). Reads the memory `pieces` names; writes none of it.
Result<VersionDelta> ComputeVersionDelta(const Manifest& base_manifest,
                                         Version base,
                                         const Manifest& version_manifest,
                                         Version version,
                                         const ChunkPieces& pieces,
                                         const ComputeOptions& options = {});

}  // namespace tensorhub::delta

#endif  // TENSORHUB_DELTA_VERSION_DELTA_H_
