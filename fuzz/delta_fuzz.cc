// libFuzzer target: the chunk delta decoder (src/delta/delta_codec.h) must
// refuse any bytes cleanly: DATA_LOSS with the destination untouched, or a
// chunk written entirely inside the destination, never a byte outside it.
// The first two input bytes pick the chunk's size (so headers that name
// the right size get past the size check and into the streams); the rest
// is the delta. Every 8th input is also split in two to check a round trip:
// the encoder's delta of one half against the other must apply exactly.
// And every input is also taken as the two streams themselves, wrapped in a
// valid header and zstd frame, so that the change walk sees any streams,
// not only the few that get through zstd's own checks.
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "delta/delta_codec.h"

namespace {

constexpr size_t kGuard = 32;
constexpr uint8_t kGuardByte = 0x5A, kFill = 0xC3;

void ApplyChecked(tensorhub::delta::Codec& codec, size_t chunk,
                  const uint8_t* delta, size_t size) {
  std::vector<uint8_t> base(chunk);
  for (size_t i = 0; i < chunk; ++i) base[i] = static_cast<uint8_t>(i * 131);
  std::vector<uint8_t> arena(chunk + 2 * kGuard, kGuardByte);
  std::memset(arena.data() + kGuard, kFill, chunk);
  const iovec b{base.data(), base.size()};
  const iovec d{arena.data() + kGuard, chunk};
  const tensorhub::Status s = codec.Apply({delta, size}, {&b, 1}, {&d, 1});
  for (size_t i = 0; i < kGuard; ++i) {
    if (arena[i] != kGuardByte || arena[arena.size() - 1 - i] != kGuardByte) {
      __builtin_trap();  // wrote outside the destination
    }
  }
  if (!s.ok()) {
    if (s.code() != tensorhub::StatusCode::kDataLoss) __builtin_trap();
    for (size_t i = 0; i < chunk; ++i) {
      if (arena[kGuard + i] != kFill) __builtin_trap();  // refused, yet wrote
    }
  }
}

void CheckApply(tensorhub::delta::Codec& codec, const uint8_t* data,
                size_t size) {
  const size_t chunk = (size_t{data[0]} | size_t{data[1]} << 8) % 8193;
  ApplyChecked(codec, chunk, data + 2, size - 2);
}

// data: u16 chunk size | u8 width (log2) | u8 changed | u8 gap_bytes |
// streams (the rest; gap_bytes of gaps, then the diffs).
void CheckStreams(tensorhub::delta::Codec& codec, const uint8_t* data,
                  size_t size) {
  if (size < 6) return;
  const uint32_t w = 1u << (data[2] % 4);
  size_t chunk = (size_t{data[0]} | size_t{data[1]} << 8) % 8193;
  chunk -= chunk % w;
  const size_t streams = size - 5;
  const uint32_t gap_bytes = std::min<uint32_t>(data[4], streams);
  const uint32_t diff_bytes = static_cast<uint32_t>(streams - gap_bytes);
  const uint64_t changed = data[3];
  std::string delta(tensorhub::delta::kChunkDeltaHeaderBytes, '\0');
  const uint32_t magic = tensorhub::delta::kChunkDeltaMagic;
  const uint64_t chunk64 = chunk;
  std::memcpy(delta.data(), &magic, 4);
  delta[4] = static_cast<char>(tensorhub::delta::kChunkDeltaFormatSparse);
  delta[5] = static_cast<char>(w);
  std::memcpy(delta.data() + 8, &chunk64, 8);
  std::memcpy(delta.data() + 16, &changed, 8);
  std::memcpy(delta.data() + 24, &gap_bytes, 4);
  std::memcpy(delta.data() + 28, &diff_bytes, 4);
  std::string frame(ZSTD_compressBound(streams), '\0');
  const size_t z =
      ZSTD_compress(frame.data(), frame.size(), data + 5, streams, 1);
  if (ZSTD_isError(z)) __builtin_trap();
  delta.append(frame.data(), z);
  ApplyChecked(codec, chunk, reinterpret_cast<const uint8_t*>(delta.data()),
               delta.size());
}

void CheckRoundTrip(tensorhub::delta::Codec& codec, const uint8_t* data,
                    size_t size) {
  const size_t half = (size - 1) / 2;
  const uint32_t w = 1u << (data[0] % 4);
  std::vector<uint8_t> base(data + 1, data + 1 + half);
  std::vector<uint8_t> version(data + 1 + half, data + 1 + 2 * half);
  const iovec b{base.data(), half}, v{version.data(), half};
  std::string delta;
  auto made = codec.Encode({&b, 1}, {&v, 1}, w, &delta);
  if (!made.ok()) __builtin_trap();
  if (!*made) return;  // too dense to pay
  std::vector<uint8_t> out(half, 0);
  const iovec o{out.data(), half};
  const tensorhub::Status s = codec.Apply(
      {reinterpret_cast<const uint8_t*>(delta.data()), delta.size()}, {&b, 1},
      {&o, 1});
  if (!s.ok() || out != version) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tensorhub::delta::Codec codec;
  if (size < 2) return 0;
  CheckApply(codec, data, size);
  CheckStreams(codec, data, size);
  if (data[size - 1] % 8 == 0) CheckRoundTrip(codec, data, size);
  return 0;
}
