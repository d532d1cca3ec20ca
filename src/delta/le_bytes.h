// Little-endian integers in the delta formats (docs/wire.md, "Delta
// parts"): appended to a string, read from a byte pointer. Internal to
// src/delta.
#ifndef TENSORHUB_DELTA_LE_BYTES_H_
#define TENSORHUB_DELTA_LE_BYTES_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

namespace tensorhub::delta::le {

static_assert(std::endian::native == std::endian::little,
              "deltas are little-endian integers, read with memcpy");

inline void PutU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}
inline void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace tensorhub::delta::le

#endif  // TENSORHUB_DELTA_LE_BYTES_H_
