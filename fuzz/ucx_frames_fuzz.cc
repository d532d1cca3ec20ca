// libFuzzer target for the UCX transport's frames a reader decodes from a
// holder (transport/ucx/ucx_reply.h): the hello (the holder's worker
// address length and host identity), the grant of a read, and the header
// of a piece with the check of where it may land. Any bytes must decode to
// an error or to a frame that keeps the decoder's promises (a piece
// accepted lies inside the read's range), and a decoded frame encodes back
// to the same bytes.
//
// Input: [selector byte][8 bytes: the read's length, little-endian][frame].
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "transport/ucx/ucx_reply.h"

namespace ucx = tensorhub::transport::ucx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const uint8_t selector = data[0];
  uint64_t expected = 0;
  std::memcpy(&expected, data + 1, 8);
  data += 9;
  size -= 9;
  if (selector & 1) {
    tensorhub::Result<ucx::Hello> h = ucx::DecodeHelloHeader(data, size);
    if (!h.ok()) return 0;
    if (h->address_len == 0 || h->address_len > ucx::kMaxWorkerAddressBytes) {
      __builtin_trap();
    }
    std::string again = ucx::EncodeHelloHeader(h->address_len, h->host);
    if (again.size() != ucx::kHelloHeaderBytes ||
        std::memcmp(again.data(), data, again.size()) != 0) {
      __builtin_trap();
    }
    return 0;
  }
  if (selector & 2) {
    tensorhub::Result<ucx::Grant> g = ucx::DecodeGrant(data, size);
    if (!g.ok()) return 0;
    if (g->piece_bytes < ucx::kMinPieceBytes ||
        g->piece_bytes > ucx::kMaxPieceBytes) {
      __builtin_trap();
    }
    std::string again = ucx::EncodeGrant(*g);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
      __builtin_trap();
    }
    return 0;
  }
  // A piece: [16-byte grant][16-byte header][8 bytes: the piece's length].
  if (size < ucx::kGrantBytes + ucx::kPieceHeaderBytes + 8) return 0;
  tensorhub::Result<ucx::Grant> g = ucx::DecodeGrant(data, ucx::kGrantBytes);
  if (!g.ok()) return 0;
  tensorhub::Result<ucx::PieceHeader> h =
      ucx::DecodePieceHeader(data + ucx::kGrantBytes, ucx::kPieceHeaderBytes);
  if (!h.ok()) __builtin_trap();  // any 16 bytes are a header
  uint64_t length = 0;
  std::memcpy(&length, data + ucx::kGrantBytes + ucx::kPieceHeaderBytes, 8);
  // Lengths the fuzzer can hit: small ones most of the time.
  if (selector & 4) {
    expected &= 0xFFFFFF;
    length &= 0xFFFFFF;
  }
  tensorhub::Result<uint64_t> index = ucx::PieceIndex(*g, expected, *h, length);
  if (!index.ok()) return 0;
  if (h->read_id != g->read_id || h->offset >= expected ||
      length > expected - h->offset || length == 0 ||
      *index >= ucx::PieceCount(g->piece_bytes, expected) ||
      *index * g->piece_bytes != h->offset) {
    __builtin_trap();
  }
  return 0;
}
