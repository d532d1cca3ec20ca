#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cassert>

namespace tensorhub {

uint64_t Xxh3(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

uint64_t Xxh3Pieces(std::span<const iovec> pieces) {
  if (pieces.size() == 1) return Xxh3(pieces[0].iov_base, pieces[0].iov_len);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const iovec& p : pieces) {
    XXH_errorcode rc = XXH3_64bits_update(&state, p.iov_base, p.iov_len);
    assert(rc == XXH_OK);
    (void)rc;
  }
  return XXH3_64bits_digest(&state);
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  assert(state_ != nullptr);
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::Update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace tensorhub
