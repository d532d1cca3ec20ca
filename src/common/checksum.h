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
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CHECKSUM_H_
