// libFuzzer target for the UCX transport's frames a reader decodes from a
// holder (transport/ucx/ucx_reply.h): the hello (the holder's worker
// address length and host identity) and the RMA reply (remote keys and the
// pieces to get). Any bytes must decode to an error or to a reply that
// keeps the decoder's promises, and a decoded frame encodes back to the
// same bytes.
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
  // Lengths the fuzzer can hit: small ones most of the time.
  if (selector & 2) expected &= 0xFFFF;
  tensorhub::Result<ucx::RmaReply> r =
      ucx::DecodeRmaReply(data, size, expected);
  if (!r.ok()) return 0;
  if (r->keys.empty() || r->keys.size() > ucx::kMaxRmaKeys ||
      r->pieces.empty() || r->pieces.size() > ucx::kMaxRmaPieces) {
    __builtin_trap();
  }
  for (const ucx::RmaKey& k : r->keys) {
    if (k.packed.empty() || k.packed.size() > ucx::kMaxRkeyBytes) {
      __builtin_trap();
    }
  }
  uint64_t total = 0;
  for (const ucx::RmaPiece& p : r->pieces) {
    if (p.length == 0 || p.key >= r->keys.size()) __builtin_trap();
    if (total + p.length < total) __builtin_trap();  // no wrap-around
    total += p.length;
  }
  if (total != expected) __builtin_trap();
  std::string again = ucx::EncodeRmaReply(*r);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
    __builtin_trap();
  }
  return 0;
}
