// XXH3-64 compiled for AVX2 (this file alone is built with -mavx2), called
// only on CPUs that have it: about 2x the speed of the distribution's
// baseline (SSE2) build, which matters because every received byte is
// hashed. XXH_INLINE_ALL keeps these symbols private to this file.
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace tensorhub::internal {

uint64_t Xxh3Avx2(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

void Xxh3Avx2Reset(void* state) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state));
}

void Xxh3Avx2Update(void* state, const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, bytes);
}

uint64_t Xxh3Avx2Digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}

size_t Xxh3Avx2StateBytes() { return sizeof(XXH3_state_t); }

}  // namespace tensorhub::internal
