#include "common/manifest.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "common/checksum.h"
#include "tensorhub/check.h"

namespace tensorhub {

uint64_t ChunksFor(uint64_t bytes, uint64_t chunk_bytes) {
  return bytes == 0 ? 0 : (bytes - 1) / chunk_bytes + 1;
}

Manifest::Manifest(uint32_t group_size, uint64_t chunk_bytes,
                   std::vector<PartLayout> parts)
    : group_size_(group_size),
      chunk_bytes_(chunk_bytes),
      parts_(std::move(parts)) {
  chunk_base_.reserve(parts_.size() + 1);
  chunk_base_.push_back(0);
  for (const PartLayout& p : parts_) {
    total_bytes_ += p.part_bytes;
    chunk_base_.push_back(chunk_base_.back() + p.chunk_xxh3.size());
  }
  digest_ = ComputeDigest();
}

size_t Manifest::num_tensors() const {
  size_t n = 0;
  for (const PartLayout& p : parts_) n += p.tensors.size();
  return n;
}

ChunkLoc Manifest::Chunk(uint64_t global_chunk) const {
  TH_CHECK_LT(global_chunk, num_chunks());
  auto it =
      std::upper_bound(chunk_base_.begin(), chunk_base_.end(), global_chunk);
  uint32_t part = static_cast<uint32_t>(it - chunk_base_.begin() - 1);
  uint64_t local = global_chunk - chunk_base_[part];
  const PartLayout& p = parts_[part];
  ChunkLoc loc;
  loc.part = part;
  loc.offset = local * chunk_bytes_;
  loc.bytes = std::min(chunk_bytes_, p.part_bytes - loc.offset);
  loc.xxh3 = p.chunk_xxh3[local];
  loc.checksum = p.chunk_checksum;
  return loc;
}

namespace {

// Feeds fixed-width integers and length-prefixed strings to one stream.
class DigestWriter {
 public:
  void U64(uint64_t v) { stream_.Update(&v, sizeof(v)); }
  void Str(const std::string& s) {
    U64(s.size());
    stream_.Update(s.data(), s.size());
  }
  void U64s(const std::vector<uint64_t>& v) {
    U64(v.size());
    stream_.Update(v.data(), v.size() * sizeof(uint64_t));
  }
  uint64_t Digest() const { return stream_.Digest(); }

 private:
  Xxh3Stream stream_;
};

}  // namespace

ManifestDigest Manifest::ComputeDigest() const {
  DigestWriter w;
  w.U64(group_size_);
  w.U64(chunk_bytes_);
  w.U64(parts_.size());
  for (const PartLayout& p : parts_) {
    w.U64(p.rank);
    w.U64(p.tensors.size());
    for (const TensorLayout& t : p.tensors) {
      w.Str(t.spec.name);
      w.U64(static_cast<uint64_t>(t.spec.dtype));
      w.U64s(t.spec.shape);
      w.U64(t.offset);
      w.U64(t.bytes);
      w.U64s(t.global_shape);
      w.U64s(t.box_offset);
      w.U64(t.seg.rows);
      w.U64(t.seg.cols);
      w.U64s(t.seg_xxh3);
    }
    w.U64(p.part_bytes);
    w.U64s(p.chunk_xxh3);
    // Only when not plain XXH3, so that manifests of earlier builds keep
    // their digests.
    if (p.chunk_checksum != ChunkChecksum::kXxh3) {
      w.U64(static_cast<uint64_t>(p.chunk_checksum) | uint64_t{1} << 63);
    }
    w.U64(p.metadata.size());
    for (const auto& [k, v] : p.metadata) {
      w.Str(k);
      w.Str(v);
    }
  }
  return ManifestDigest{w.Digest()};
}

namespace {

// A tensor's geometry and segment claims, on their own.
Status ValidatePiece(const TensorLayout& t) {
  const std::string what = "manifest: tensor '" + t.spec.name + "'";
  if (!t.sharded() && !t.box_offset.empty()) {
    return InvalidArgument(what + " has a box offset but no global shape");
  }
  if (t.sharded()) {
    if (t.global_shape.size() != t.spec.shape.size() ||
        t.box_offset.size() != t.spec.shape.size()) {
      return InvalidArgument(what +
                             ": global shape, box offset and shape differ "
                             "in rank");
    }
    TH_RETURN_IF_ERROR(CheckBoxInShape(t.PieceBox(), t.global_shape, what));
    TensorSpec global{t.spec.name, t.spec.dtype, t.global_shape};
    Result<uint64_t> size = global.ByteSize();
    if (!size.ok()) return size.status().WithContext(what);
  }
  TH_RETURN_IF_ERROR(
      CheckSegmentShape(t.spec.shape, DTypeBytes(t.spec.dtype), t.seg, what));
  if (t.seg_xxh3.size() != NumSegments(t.spec.shape, t.seg)) {
    return InvalidArgument(what + " has " + std::to_string(t.seg_xxh3.size()) +
                           " segment checksums for " +
                           std::to_string(NumSegments(t.spec.shape, t.seg)) +
                           " segments");
  }
  return Status::Ok();
}

}  // namespace

// Long on purpose (about 70 lines): a flat list of independent checks, one
// per documented limit, each with its own message; splitting it would only
// scatter the list.
Status Manifest::ValidatePart(const PartLayout& p, uint64_t chunk_bytes) {
  const uint32_t r = p.rank;
  if (p.tensors.size() > kMaxTensorsPerPart) {
    return InvalidArgument("manifest: too many tensors in part " +
                           std::to_string(r));
  }
  std::set<std::string_view> names;
  uint64_t offset = 0, segments = 0;
  for (const TensorLayout& t : p.tensors) {
    if (t.spec.name.empty() || t.spec.name.size() > kMaxNameBytes) {
      return InvalidArgument("manifest: tensor name empty or longer than " +
                             std::to_string(kMaxNameBytes) + " bytes");
    }
    if (!names.insert(t.spec.name).second) {
      return InvalidArgument("manifest: tensor '" + t.spec.name +
                             "' appears twice in part " + std::to_string(r));
    }
    if (t.spec.shape.size() > 16) {
      return InvalidArgument("manifest: tensor '" + t.spec.name +
                             "' has more than 16 dimensions");
    }
    Result<uint64_t> size = t.spec.ByteSize();
    if (!size.ok()) return size.status().WithContext("manifest");
    if (*size != t.bytes || t.offset != offset) {
      return InvalidArgument("manifest: tensor '" + t.spec.name +
                             "' has inconsistent offset or size");
    }
    if (offset > UINT64_MAX - t.bytes) {
      return InvalidArgument("manifest: part size overflows");
    }
    offset += t.bytes;
    TH_RETURN_IF_ERROR(ValidatePiece(t));
    segments += t.seg_xxh3.size();
    if (segments > kMaxSegmentsPerVersion) {
      return InvalidArgument("manifest: more than " +
                             std::to_string(kMaxSegmentsPerVersion) +
                             " segment checksums; use larger segments");
    }
  }
  if (offset != p.part_bytes) {
    return InvalidArgument("manifest: part " + std::to_string(r) +
                           " size does not match its tensors");
  }
  if (p.metadata.size() > kMaxMetadataEntries) {
    return InvalidArgument(
        "manifest: part " + std::to_string(r) + " has more than " +
        std::to_string(kMaxMetadataEntries) + " metadata entries");
  }
  size_t meta_bytes = 0;
  for (const auto& [k, v] : p.metadata) meta_bytes += k.size() + v.size();
  if (meta_bytes > kMaxMetadataBytes) {
    return InvalidArgument("manifest: part " + std::to_string(r) +
                           " metadata exceeds " +
                           std::to_string(kMaxMetadataBytes) + " bytes");
  }
  if (!IsKnownChunkChecksum(static_cast<uint32_t>(p.chunk_checksum))) {
    return InvalidArgument("manifest: part " + std::to_string(r) +
                           " names chunk checksum " +
                           ChunkChecksumName(p.chunk_checksum) +
                           ", which this build does not know (it knows " +
                           KnownChunkChecksumNames() +
                           "): upgrade this worker to the publisher's release");
  }
  uint64_t n = ChunksFor(p.part_bytes, chunk_bytes);
  if (n != p.chunk_xxh3.size()) {
    return InvalidArgument("manifest: part " + std::to_string(r) + " has " +
                           std::to_string(p.chunk_xxh3.size()) +
                           " checksums for " + std::to_string(n) + " chunks");
  }
  return Status::Ok();
}

Status Manifest::Validate() const {
  if (group_size_ == 0 || group_size_ > kMaxGroupSize) {
    return InvalidArgument("manifest: group size " +
                           std::to_string(group_size_) + " out of [1, " +
                           std::to_string(kMaxGroupSize) + "]");
  }
  if (chunk_bytes_ < kMinChunkBytes || chunk_bytes_ > kMaxChunkBytes) {
    return InvalidArgument("manifest: chunk size " +
                           std::to_string(chunk_bytes_) + " out of [" +
                           std::to_string(kMinChunkBytes) + ", " +
                           std::to_string(kMaxChunkBytes) + "]");
  }
  if (parts_.size() != group_size_) {
    return InvalidArgument("manifest: " + std::to_string(parts_.size()) +
                           " parts for a group of " +
                           std::to_string(group_size_));
  }
  uint64_t chunks = 0, segments = 0;
  for (uint32_t r = 0; r < parts_.size(); ++r) {
    const PartLayout& p = parts_[r];
    if (p.rank != r) {
      return InvalidArgument("manifest: part " + std::to_string(r) +
                             " claims rank " + std::to_string(p.rank));
    }
    TH_RETURN_IF_ERROR(ValidatePart(p, chunk_bytes_));
    for (const TensorLayout& t : p.tensors) segments += t.seg_xxh3.size();
    chunks += p.chunk_xxh3.size();
    if (chunks > kMaxChunksPerVersion) {
      return InvalidArgument("manifest: more than " +
                             std::to_string(kMaxChunksPerVersion) +
                             " chunks; use a larger chunk size");
    }
    if (segments > kMaxSegmentsPerVersion) {
      return InvalidArgument("manifest: more than " +
                             std::to_string(kMaxSegmentsPerVersion) +
                             " segment checksums; use larger segments");
    }
  }
  return CheckPiecesTile(parts_);
}

Status CheckPiecesTile(std::span<const PartLayout> parts, bool complete) {
  std::map<std::string_view,
           std::vector<std::pair<uint32_t, const TensorLayout*>>>
      by_name;
  for (const PartLayout& p : parts) {
    for (const TensorLayout& t : p.tensors) {
      by_name[t.spec.name].push_back({p.rank, &t});
    }
  }
  for (const auto& [name, pieces] : by_name) {
    const TensorLayout& first = *pieces.front().second;
    if (pieces.size() == 1 && !first.sharded()) continue;  // the usual case
    const std::vector<uint64_t> global = first.GlobalShape();
    std::vector<TilePiece> tiles;
    for (const auto& [rank, t] : pieces) {
      if (t->spec.dtype != first.spec.dtype || t->GlobalShape() != global) {
        return InvalidArgument(
            "tensor '" + std::string(name) + "': part " + std::to_string(rank) +
            " has it as " + std::string(DTypeName(t->spec.dtype)) +
            " of global shape " + BoxToString(Box::Whole(t->GlobalShape())) +
            ", part " + std::to_string(pieces.front().first) + " as " +
            std::string(DTypeName(first.spec.dtype)) + " of " +
            BoxToString(Box::Whole(global)));
      }
      tiles.push_back({rank, t->PieceBox()});
    }
    TH_RETURN_IF_ERROR(complete ? CheckTiling(name, global, tiles)
                                : CheckNoOverlap(name, tiles));
  }
  return Status::Ok();
}

Result<PartLayout> BuildPartLayout(uint32_t rank,
                                   std::span<const TensorRef> tensors,
                                   uint64_t chunk_bytes) {
  return BuildPartLayout(rank, tensors, chunk_bytes, kDefaultChunkChecksum,
                         [](std::span<const iovec> pieces) -> Result<uint64_t> {
                           return ChunkSum(kDefaultChunkChecksum, pieces);
                         });
}

Result<PartLayout> BuildPartLayout(uint32_t rank,
                                   std::span<const TensorRef> tensors,
                                   uint64_t chunk_bytes, ChunkChecksum kind,
                                   const ChunkHasher& hash_chunk,
                                   const PieceOptions& options) {
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes) {
    return InvalidArgument("chunk size " + std::to_string(chunk_bytes) +
                           " out of [" + std::to_string(kMinChunkBytes) + ", " +
                           std::to_string(kMaxChunkBytes) + "]");
  }
  if (tensors.empty()) return InvalidArgument("no tensors to publish");
  if (tensors.size() > kMaxTensorsPerPart) {
    return InvalidArgument("too many tensors (" +
                           std::to_string(tensors.size()) + ")");
  }
  PartLayout part;
  part.rank = rank;
  part.chunk_checksum = kind;
  std::set<std::string_view> names;
  std::vector<uint8_t*> bases;
  for (const TensorRef& t : tensors) {
    if (t.spec.name.empty() || t.spec.name.size() > kMaxNameBytes) {
      return InvalidArgument("a tensor name is empty or longer than " +
                             std::to_string(kMaxNameBytes) + " bytes");
    }
    if (!names.insert(t.spec.name).second) {
      return InvalidArgument("tensor '" + t.spec.name + "' given twice");
    }
    TH_ASSIGN_OR_RETURN(uint64_t size, t.spec.ByteSize());
    if (size != t.bytes) {
      return InvalidArgument(
          "tensor '" + t.spec.name + "': " + std::to_string(t.bytes) +
          " bytes given, " + std::string(DTypeName(t.spec.dtype)) +
          " of its shape needs " + std::to_string(size));
    }
    if (t.data == nullptr && t.bytes > 0) {
      return InvalidArgument("tensor '" + t.spec.name + "' has no data");
    }
    TensorLayout layout;
    layout.spec = t.spec;
    layout.offset = part.part_bytes;
    layout.bytes = t.bytes;
    if (auto it = options.pieces.find(t.spec.name);
        it != options.pieces.end()) {
      layout.global_shape = it->second.global_shape;
      layout.box_offset = it->second.offset;
    }
    TH_RETURN_IF_ERROR(ValidatePiece(layout).WithContext("publish"));
    part.tensors.push_back(std::move(layout));
    part.part_bytes += t.bytes;
    bases.push_back(static_cast<uint8_t*>(t.data));
  }
  for (const auto& [name, piece] : options.pieces) {
    if (names.count(name) == 0) {
      return InvalidArgument("a box is given for tensor '" + name +
                             "', which is not published");
    }
  }
  if (options.segment_bytes > 0 && !part.tensors.empty()) {
    // Segment checksums, on the CPU: host memory only (a device hasher
    // below computes chunk checksums only).
    for (size_t i = 0; i < part.tensors.size(); ++i) {
      TensorLayout& t = part.tensors[i];
      if (tensors[i].memory.kind != MemoryKind::kHost) break;
      t.seg = ChooseSegmentShape(
          t.spec.shape, DTypeBytes(t.spec.dtype), options.segment_bytes,
          ClassifyHfTensor(t.spec.name) == ShardKind::kRow);
      t.seg_xxh3 = SegmentChecksums(bases[i], t.spec.shape,
                                    DTypeBytes(t.spec.dtype), t.seg);
    }
  }
  uint64_t n = ChunksFor(part.part_bytes, chunk_bytes);
  part.chunk_xxh3.reserve(n);
  std::vector<iovec> pieces;
  for (uint64_t c = 0; c < n; ++c) {
    uint64_t off = c * chunk_bytes;
    pieces.clear();
    AppendPieces(part, bases, off, std::min(chunk_bytes, part.part_bytes - off),
                 &pieces);
    TH_ASSIGN_OR_RETURN(uint64_t h, hash_chunk(pieces));
    part.chunk_xxh3.push_back(h);
  }
  return part;
}

void AppendPieces(const PartLayout& part, std::span<uint8_t* const> bases,
                  uint64_t offset, uint64_t bytes, std::vector<iovec>* out) {
  TH_CHECK_LE(offset + bytes, part.part_bytes);
  TH_CHECK_EQ(bases.size(), part.tensors.size());
  // First tensor whose end is past `offset`.
  auto it = std::upper_bound(part.tensors.begin(), part.tensors.end(), offset,
                             [](uint64_t off, const TensorLayout& t) {
                               return off < t.offset + t.bytes;
                             });
  uint64_t end = offset + bytes;
  for (; it != part.tensors.end() && offset < end; ++it) {
    const TensorLayout& t = *it;
    if (t.bytes == 0) continue;
    uint64_t take_begin = offset - t.offset;
    uint64_t take = std::min(t.bytes - take_begin, end - offset);
    out->push_back({bases[it - part.tensors.begin()] + take_begin, take});
    offset += take;
  }
  TH_CHECK_EQ(offset, end);
}

}  // namespace tensorhub
