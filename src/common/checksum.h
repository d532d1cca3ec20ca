// Chunk checksums: XXH3-64 over one or more memory pieces, as one stream.
#ifndef TENSORHUB_COMMON_CHECKSUM_H_
#define TENSORHUB_COMMON_CHECKSUM_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CHECKSUM_H_
