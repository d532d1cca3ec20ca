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

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CHECKSUM_H_
