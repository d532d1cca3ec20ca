// The element-level delta of one chunk of a version against the same chunk
// of a base version (docs/design.md, "Deltas on slow links"; docs/wire.md,
// "Chunk delta"). Encoding only, no I/O.
//
// Between two RL steps most elements of a bf16 (or FP8) tensor keep their
// bits, and those that change move by a few units in the last place. The
// delta lists the changed elements only: the gap from one changed element
// to the next (LEB128 varints) and each one's difference from the base as
// a little-endian integer of the element's width, zigzag-coded (LEB128
// too), the two streams compressed together by zstd. Chosen by measurement
// against XOR + zstd, byte planes + zstd and a bitmap of changes
// (`tensorhub-lab bench delta`, docs/benchmarks.md section 17). The
// difference is exact modulo 2^(8 * width), so any bytes round-trip: the
// element width is a hint that sets only how small the delta is.
//
// Chunk delta (all integers little-endian):
//   u32 magic 'THD1' | u8 format (1) | u8 elem_bytes (1, 2, 4 or 8) |
//   u16 reserved (0) | u64 chunk_bytes | u64 changed (elements) |
//   u32 gap_bytes | u32 diff_bytes | zstd frame of gaps || diffs (the rest;
//   absent when changed is 0)
// elem_bytes divides chunk_bytes. ApplyChunkDelta refuses, with DATA_LOSS
// and nothing promised about the destination's contents, any input that
// does not decode to exactly `changed` in-bounds, strictly increasing
// elements with nothing left over; it writes only inside the destination.
// A delta that decodes is no proof of the result: the reader checks the
// chunk's checksum from the version's manifest (a base that is not the
// encoder's base gives other bytes).
#ifndef TENSORHUB_DELTA_DELTA_CODEC_H_
#define TENSORHUB_DELTA_DELTA_CODEC_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tensorhub/status.h"

namespace tensorhub::delta {

inline constexpr uint32_t kChunkDeltaMagic = 0x31444854;  // "THD1"
inline constexpr uint8_t kChunkDeltaFormatSparse = 1;
inline constexpr size_t kChunkDeltaHeaderBytes = 32;
inline constexpr uint64_t kMaxChunkDeltaBytes = 1ull << 30;  // kMaxChunkBytes

struct ChunkDeltaHeader {
  uint8_t elem_bytes = 1;
  uint64_t chunk_bytes = 0;
  uint64_t changed = 0;
  uint32_t gap_bytes = 0;
  uint32_t diff_bytes = 0;
};

// Reusable per-thread state (zstd contexts, scratch). One per thread; not
// thread-safe. Holds at most a few chunk sizes of scratch.
class Codec {
 public:
  // `zstd_level`: 1 unless measured otherwise (docs/benchmarks.md).
  explicit Codec(int zstd_level = 1);
  ~Codec();
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  // The delta of `version` against `base` (the same total size, at most
  // kMaxChunkBytes, pieces in either anywhere), elements `elem_bytes` wide
  // (1, 2, 4 or 8; a chunk whose size it does not divide is coded with 1).
  // Appends it to `out` and returns true; returns false (and appends
  // nothing) when the delta would not pay: its streams would exceed half
  // the chunk. INVALID_ARGUMENT for sizes that differ.
  Result<bool> Encode(std::span<const iovec> base,
                      std::span<const iovec> version, uint32_t elem_bytes,
                      std::string* out);

  // Writes base + delta into `dest`. `base` and `dest` have the same total
  // size (else INVALID_ARGUMENT) and are disjoint or the very same pieces
  // (in place). DATA_LOSS, with `dest` untouched, for a delta that does not
  // decode (see above) or was made for a chunk of another size.
  Status Apply(std::span<const uint8_t> delta, std::span<const iovec> base,
               std::span<const iovec> dest);

 private:
  struct State;
  std::unique_ptr<State> state_;
  const int zstd_level_;
};

// The header alone (checked: magic, format, width, reserved, sizes within
// bounds). DATA_LOSS otherwise.
Result<ChunkDeltaHeader> DecodeChunkDeltaHeader(std::span<const uint8_t> delta);

}  // namespace tensorhub::delta

#endif  // TENSORHUB_DELTA_DELTA_CODEC_H_
