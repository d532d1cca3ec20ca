// libFuzzer target: data-plane frame decoders must reject any bytes cleanly.
#include <cstddef>
#include <cstdint>

#include "wire/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tensorhub::wire::ReadRequest req;
  auto n = tensorhub::wire::DecodeReadRequestHeader(data, size, &req);
  if (n.ok() && (*n == 0 || *n > tensorhub::wire::kMaxModelNameBytes)) {
    __builtin_trap();
  }
  auto h = tensorhub::wire::DecodeResponseHeader(data, size);
  if (h.ok() && h->payload_len > tensorhub::wire::kMaxReadBytes) {
    __builtin_trap();
  }
  return 0;
}
