// The byte layout of a version: which tensor bytes form which chunk.
//
// A version is published by a trainer group of `group_size` ranks. Rank r's
// tensors, in the order it published them, are packed back to back into
// "part r" (no padding: the bytes stay in the caller's buffers and move as
// scatter-gather pieces). Each part is cut into chunks of `chunk_bytes` (the
// last one shorter). Global chunk ids count part 0's chunks first. A chunk is
// the unit of transfer, verification (XXH3-64) and serving; many small
// tensors share one chunk, which is how tiny tensors are batched.
#ifndef TENSORHUB_COMMON_MANIFEST_H_
#define TENSORHUB_COMMON_MANIFEST_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/geometry.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {

// Bounds on anything a manifest may claim; a manifest from the network that
// exceeds them is rejected before use.
inline constexpr uint64_t kMinChunkBytes = 4096;
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;
inline constexpr uint64_t kDefaultChunkBytes = 4ull << 20;
inline constexpr uint64_t kMaxTensorsPerPart = 1u << 20;
inline constexpr uint64_t kMaxChunksPerVersion = 1u << 22;
inline constexpr uint32_t kMaxGroupSize = 4096;
inline constexpr size_t kMaxNameBytes = 1024;
inline constexpr size_t kMaxMetadataEntries = 64;
inline constexpr size_t kMaxMetadataBytes = 16u << 20;
// Segment checksums per version (8 bytes each: 128 MiB of manifest).
inline constexpr uint64_t kMaxSegmentsPerVersion = 1u << 24;

// One tensor a part stores. `spec.name` is the logical tensor's name and
// `spec.shape` the shape of what this part stores of it: the whole tensor,
// or (`global_shape` set) the box of it at `box_offset` with extents
// spec.shape. Several parts may store boxes of one logical tensor; a
// version's boxes of a tensor must tile its global shape (Validate).
struct TensorLayout {
  TensorLayout() = default;
  TensorLayout(TensorSpec s, uint64_t off, uint64_t size)
      : spec(std::move(s)), offset(off), bytes(size) {}

  TensorSpec spec;
  uint64_t offset = 0;  // inside the part
  uint64_t bytes = 0;
  // Empty: the whole tensor (global shape = spec.shape, offset 0).
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> box_offset;
  // Segment checksums (geometry.h): tiles of `seg` of this piece's matrix
  // view, row-block major. seg {0, 0} and none: a manifest without them
  // (older publishers, device memory); such pieces are read whole.
  SegmentShape seg;
  std::vector<uint64_t> seg_xxh3;

  bool sharded() const { return !global_shape.empty(); }
  // The global shape and this piece's box of it.
  std::vector<uint64_t> GlobalShape() const {
    return sharded() ? global_shape : spec.shape;
  }
  Box PieceBox() const {
    Box b = Box::Whole(spec.shape);
    if (sharded()) b.offset = box_offset;
    return b;
  }
  bool operator==(const TensorLayout&) const = default;
};

struct PartLayout {
  uint32_t rank = 0;
  std::vector<TensorLayout> tensors;
  uint64_t part_bytes = 0;
  // Each chunk's checksum, of the kind `chunk_checksum` (checksum.h).
  std::vector<uint64_t> chunk_xxh3;
  ChunkChecksum chunk_checksum = ChunkChecksum::kXxh3;
  // Free-form key/value pairs the publisher attached (e.g. the original
  // safetensors header, so a file round-trips byte for byte).
  std::vector<std::pair<std::string, std::string>> metadata;
  bool operator==(const PartLayout&) const = default;
};

// A 64-bit digest of a whole manifest (Manifest::Digest): equal manifests
// have equal digests; different ones differ except with probability about
// 2^-64. It lets a worker name the manifest it holds without sending it.
struct ManifestDigest {
  uint64_t value = 0;
  bool operator==(const ManifestDigest&) const = default;
};

struct ChunkLoc {
  uint32_t part = 0;
  uint64_t offset = 0;  // inside the part
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;  // of the kind `checksum`
  ChunkChecksum checksum = ChunkChecksum::kXxh3;
};

class Manifest {
 public:
  Manifest() : Manifest(0, 0, {}) {}
  // `parts` must be ranks 0..group_size-1 in order; checked by Validate().
  Manifest(uint32_t group_size, uint64_t chunk_bytes,
           std::vector<PartLayout> parts);

  uint32_t group_size() const { return group_size_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  const std::vector<PartLayout>& parts() const { return parts_; }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t num_chunks() const {
    return chunk_base_.empty() ? 0 : chunk_base_.back();
  }
  size_t num_tensors() const;
  // First global chunk id of `part`; chunk_base(group_size) == num_chunks().
  uint64_t chunk_base(uint32_t part) const { return chunk_base_[part]; }
  ChunkLoc Chunk(uint64_t global_chunk) const;

  // Checks every claim against the bounds above and against itself (offsets
  // tile each part, chunk and segment counts match sizes, each name once
  // per part, and every logical tensor's pieces agree on dtype and global
  // shape and tile it exactly: CheckTiling).
  Status Validate() const;
  // The checks of one part on its own (no tiling across parts): what a hub
  // can check of one rank's publish.
  static Status ValidatePart(const PartLayout& part, uint64_t chunk_bytes);

  // XXH3-64 over every field that operator== compares, each length-prefixed
  // so that no two different manifests share one encoding. Computed once,
  // when the manifest is made (it never changes afterwards): a worker
  // reports it with every AddHolder.
  ManifestDigest Digest() const { return digest_; }

  bool operator==(const Manifest& o) const {
    return group_size_ == o.group_size_ && chunk_bytes_ == o.chunk_bytes_ &&
           parts_ == o.parts_;
  }

 private:
  uint32_t group_size_ = 0;
  uint64_t chunk_bytes_ = 0;
  std::vector<PartLayout> parts_;
  uint64_t total_bytes_ = 0;
  std::vector<uint64_t> chunk_base_;  // size group_size + 1
  ManifestDigest digest_;

  ManifestDigest ComputeDigest() const;
};

// Lays out `tensors` as part `rank` and checksums every chunk (reads the
// tensor bytes). Rejects duplicate names and sizes that disagree with specs.
// Where a publisher's tensor sits in its logical tensor, by name (absent:
// the whole tensor), and how its segment checksums are cut.
struct PieceOptions {
  std::map<std::string, TensorPiece> pieces;
  // Target bytes of a segment; 0: no segment checksums.
  uint64_t segment_bytes = kDefaultSegmentBytes;
};
Result<PartLayout> BuildPartLayout(uint32_t rank,
                                   std::span<const TensorRef> tensors,
                                   uint64_t chunk_bytes);
// The same with the chunk checksum computed by `hash_chunk` (the checksum
// `kind` of the concatenated pieces): for tensors in device memory, a
// device kernel.
using ChunkHasher = std::function<Result<uint64_t>(std::span<const iovec>)>;
Result<PartLayout> BuildPartLayout(uint32_t rank,
                                   std::span<const TensorRef> tensors,
                                   uint64_t chunk_bytes, ChunkChecksum kind,
                                   const ChunkHasher& hash_chunk,
                                   const PieceOptions& pieces = {});

uint64_t ChunksFor(uint64_t bytes, uint64_t chunk_bytes);

// Each logical tensor's pieces across `parts` agree on dtype and global
// shape and do not overlap; with `complete` (every part of the version is
// there) they also tile the global shape exactly. Errors name the tensor
// and the boxes.
Status CheckPiecesTile(std::span<const PartLayout> parts, bool complete = true);

// Appends to `out` the memory pieces holding bytes [offset, offset+bytes) of
// a part whose tensor i starts at bases[i]. The range must lie in the part.
void AppendPieces(const PartLayout& part, std::span<uint8_t* const> bases,
                  uint64_t offset, uint64_t bytes, std::vector<iovec>* out);

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_MANIFEST_H_
