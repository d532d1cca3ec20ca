// Chunk checksums: XXH3-64 over one or more memory pieces, as one stream,
// and the tree of XXH3-64s over 64 KiB leaves that manifests name by
// default (ChunkChecksum).
#ifndef TENSORHUB_COMMON_CHECKSUM_H_
#define TENSORHUB_COMMON_CHECKSUM_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub {

uint64_t Xxh3(const void* data, size_t bytes);
// Same value as Xxh3 over the concatenation of the pieces.
uint64_t Xxh3Pieces(std::span<const iovec> pieces);

// Incremental XXH3-64: Update() with consecutive byte runs, then Digest().
// Equals Xxh3 over everything passed. Owns its (heap) state.
class Xxh3Stream {
 public:
  // `timed`: measure the time spent in Update() (two clock reads per call;
  // the fetch's "verify" stage, docs/metrics.md).
  explicit Xxh3Stream(bool timed = false);
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  // Starts over (Digest() of nothing); update_ns() keeps counting.
  void Reset();
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;
  // Nanoseconds spent in Update() (0 unless constructed `timed`).
  int64_t update_ns() const { return update_ns_; }

 private:
  void UpdateUntimed(const void* data, size_t bytes);

  void* state_;  // XXH3_state_t
  const bool timed_;
  int64_t update_ns_ = 0;
};

// The checksum a manifest's chunks carry (PartManifest.chunk_checksum).
enum class ChunkChecksum : uint32_t {
  // XXH3-64 of the chunk's bytes: manifests of builds before the tree.
  kXxh3 = 0,
  // XXH3-64 over the XXH3-64s of the chunk's leaves of kChecksumLeafBytes
  // (the last may be shorter; an empty chunk is one empty leaf), each leaf
  // hash as 8 little-endian bytes. The leaves hash independently, so a GPU
  // hashes a chunk with as many leaves in flight as it has (src/cuda/
  // xxh3_blocks.h); plain XXH3-64 is one chain of steps per KiB.
  kXxh3Tree = 1,
};
inline constexpr ChunkChecksum kDefaultChunkChecksum = ChunkChecksum::kXxh3Tree;
inline constexpr uint64_t kChecksumLeafBytes = 64 << 10;

// Every kind this build knows, the default first.
inline constexpr ChunkChecksum kKnownChunkChecksums[] = {
    ChunkChecksum::kXxh3Tree, ChunkChecksum::kXxh3};

// "xxh3-64", "xxh3-64-tree-64k"; "unknown (N)" for other values.
std::string ChunkChecksumName(ChunkChecksum kind);
// The known kinds' names, in kKnownChunkChecksums' order, ", " between.
std::string KnownChunkChecksumNames();
bool IsKnownChunkChecksum(uint32_t value);
// The kind a name gives ("xxh3-64", "xxh3-64-tree-64k"); InvalidArgument
// naming the known ones otherwise.
Result<ChunkChecksum> ParseChunkChecksum(std::string_view name);

// The kXxh3Tree checksum of a chunk from its leaves' hashes, in order.
uint64_t TreeSumOfLeaves(std::span<const uint64_t> leaves);

// The checksum `kind` of the concatenation of `pieces`, or of one run.
uint64_t ChunkSum(ChunkChecksum kind, std::span<const iovec> pieces);
uint64_t ChunkSum(ChunkChecksum kind, const void* data, size_t bytes);

// Incremental chunk checksum of either kind: Update() with the chunk's
// consecutive byte runs (any sizes), then Digest(). Equals ChunkSum over
// everything passed.
class ChunkHash {
 public:
  explicit ChunkHash(ChunkChecksum kind, bool timed = false);
  ChunkHash(const ChunkHash&) = delete;
  ChunkHash& operator=(const ChunkHash&) = delete;
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;
  // kXxh3Tree: the hashes of the leaves of everything passed, the last one
  // partial (or the one empty leaf): TreeSumOfLeaves of them is Digest().
  // Passed bytes that begin at a leaf boundary of a chunk give that
  // chunk's leaves, so a chunk read in pieces of whole leaves is verified
  // from its pieces' leaves. Empty for kXxh3.
  std::vector<uint64_t> Leaves() const;
  // Nanoseconds spent in Update() (0 unless constructed `timed`).
  int64_t update_ns() const { return update_ns_; }

 private:
  void UpdateUntimed(const uint8_t* data, size_t bytes);

  const ChunkChecksum kind_;
  const bool timed_;
  Xxh3Stream bytes_;  // kXxh3: the chunk; kXxh3Tree: the current leaf
  uint64_t leaf_fill_ = 0;
  std::vector<uint64_t> leaves_;  // kXxh3Tree: finished leaves' hashes
  int64_t update_ns_ = 0;
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CHECKSUM_H_
