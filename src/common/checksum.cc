#include "common/checksum.h"

#include <algorithm>
#include <bit>
#include <chrono>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "tensorhub/check.h"

namespace tensorhub {
namespace internal {
uint64_t Xxh3Avx2(const void* data, size_t bytes);
void Xxh3Avx2Reset(void* state);
void Xxh3Avx2Update(void* state, const void* data, size_t bytes);
uint64_t Xxh3Avx2Digest(const void* state);
size_t Xxh3Avx2StateBytes();
}  // namespace internal

namespace {

// Chosen once: the AVX2 build where the CPU has AVX2, else the library's.
bool UseAvx2() {
#if defined(__x86_64__) && defined(TH_HAVE_AVX2_TU)
  static const bool use =
      __builtin_cpu_supports("avx2") &&
      internal::Xxh3Avx2StateBytes() == sizeof(XXH3_state_t);
  return use;
#else
  return false;
#endif
}

// Runs fn, adding the nanoseconds it took to *ns when `timed`.
template <typename Fn>
void RunTimed(bool timed, int64_t* ns, Fn&& fn) {
  if (!timed) return fn();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  *ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now() - t0)
             .count();
}

}  // namespace

uint64_t Xxh3(const void* data, size_t bytes) {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2(data, bytes);
#endif
  return XXH3_64bits(data, bytes);
}

uint64_t Xxh3Pieces(std::span<const iovec> pieces) {
  if (pieces.size() == 1) return Xxh3(pieces[0].iov_base, pieces[0].iov_len);
  Xxh3Stream stream;
  for (const iovec& p : pieces) stream.Update(p.iov_base, p.iov_len);
  return stream.Digest();
}

Xxh3Stream::Xxh3Stream(bool timed) : state_(XXH3_createState()), timed_(timed) {
  TH_CHECK(state_ != nullptr);
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) {
    internal::Xxh3Avx2Reset(state_);
    return;
  }
#endif
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::Reset() {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2Reset(state_);
#endif
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::Update(const void* data, size_t bytes) {
  RunTimed(timed_, &update_ns_, [&] { UpdateUntimed(data, bytes); });
}

void Xxh3Stream::UpdateUntimed(const void* data, size_t bytes) {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2Update(state_, data, bytes);
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3Stream::Digest() const {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2Digest(state_);
#endif
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

static_assert(std::endian::native == std::endian::little,
              "the tree checksum hashes its leaf hashes as stored in memory");

std::string ChunkChecksumName(ChunkChecksum kind) {
  switch (kind) {
    case ChunkChecksum::kXxh3:
      return "xxh3-64";
    case ChunkChecksum::kXxh3Tree:
      return "xxh3-64-tree-64k";
  }
  return "unknown (" + std::to_string(static_cast<uint32_t>(kind)) + ")";
}

std::string KnownChunkChecksumNames() {
  std::string out;
  for (ChunkChecksum k : kKnownChunkChecksums) {
    out += (out.empty() ? "" : ", ") + ChunkChecksumName(k);
  }
  return out;
}

bool IsKnownChunkChecksum(uint32_t value) {
  return std::ranges::any_of(kKnownChunkChecksums, [&](ChunkChecksum k) {
    return value == static_cast<uint32_t>(k);
  });
}

Result<ChunkChecksum> ParseChunkChecksum(std::string_view name) {
  for (ChunkChecksum k : kKnownChunkChecksums) {
    if (name == ChunkChecksumName(k)) return k;
  }
  return InvalidArgument("unknown chunk checksum '" + std::string(name) +
                         "' (known: " + KnownChunkChecksumNames() + ")");
}

uint64_t ChunkSum(ChunkChecksum kind, std::span<const iovec> pieces) {
  if (kind == ChunkChecksum::kXxh3) return Xxh3Pieces(pieces);
  ChunkHash h(kind);
  for (const iovec& p : pieces) h.Update(p.iov_base, p.iov_len);
  return h.Digest();
}

uint64_t ChunkSum(ChunkChecksum kind, const void* data, size_t bytes) {
  iovec v{const_cast<void*>(data), bytes};
  return ChunkSum(kind, {&v, 1});
}

ChunkHash::ChunkHash(ChunkChecksum kind, bool timed)
    : kind_(kind), timed_(timed) {}

void ChunkHash::Update(const void* data, size_t bytes) {
  RunTimed(timed_, &update_ns_,
           [&] { UpdateUntimed(static_cast<const uint8_t*>(data), bytes); });
}

void ChunkHash::UpdateUntimed(const uint8_t* p, size_t bytes) {
  if (kind_ == ChunkChecksum::kXxh3) return bytes_.Update(p, bytes);
  while (bytes > 0) {
    if (leaf_fill_ == 0 && bytes >= kChecksumLeafBytes) {
      // A whole leaf in one run: one-shot, no stream state.
      leaves_.push_back(Xxh3(p, kChecksumLeafBytes));
      p += kChecksumLeafBytes;
      bytes -= kChecksumLeafBytes;
      continue;
    }
    const size_t take = static_cast<size_t>(
        std::min<uint64_t>(bytes, kChecksumLeafBytes - leaf_fill_));
    bytes_.Update(p, take);
    leaf_fill_ += take;
    p += take;
    bytes -= take;
    if (leaf_fill_ == kChecksumLeafBytes) {
      leaves_.push_back(bytes_.Digest());
      bytes_.Reset();
      leaf_fill_ = 0;
    }
  }
}

std::vector<uint64_t> ChunkHash::Leaves() const {
  if (kind_ == ChunkChecksum::kXxh3) return {};
  std::vector<uint64_t> out = leaves_;
  if (leaf_fill_ > 0 || out.empty()) out.push_back(bytes_.Digest());
  return out;
}

uint64_t TreeSumOfLeaves(std::span<const uint64_t> leaves) {
  return Xxh3(leaves.data(), leaves.size() * sizeof(uint64_t));
}

uint64_t ChunkHash::Digest() const {
  if (kind_ == ChunkChecksum::kXxh3) return bytes_.Digest();
  // The last leaf: the partial one, or the only (empty) one.
  if (leaf_fill_ == 0 && !leaves_.empty()) {
    return Xxh3(leaves_.data(), leaves_.size() * sizeof(uint64_t));
  }
  Xxh3Stream all;
  all.Update(leaves_.data(), leaves_.size() * sizeof(uint64_t));
  const uint64_t last = bytes_.Digest();
  all.Update(&last, sizeof(last));
  return all.Digest();
}

}  // namespace tensorhub
