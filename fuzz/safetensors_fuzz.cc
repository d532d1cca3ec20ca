// libFuzzer target for the safetensors header parser: any bytes, treated as
// a whole file, must yield OK or INVALID_ARGUMENT without touching memory
// outside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "safetensors/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tensorhub::Result<tensorhub::SafetensorsHeader> header =
      tensorhub::ParseSafetensorsHeader(data, size, size);
  if (!header.ok() &&
      header.status().code() != tensorhub::StatusCode::kInvalidArgument) {
    std::abort();
  }
  if (header.ok()) {
    // Invariants promised by the parser: sorted, tiling, inside the file.
    uint64_t covered = 0;
    for (const tensorhub::SafetensorsEntry& e : header->tensors) {
      if (e.begin != covered || e.end < e.begin) std::abort();
      covered = e.end;
    }
    if (header->data_start + covered != size) std::abort();
  }
  return 0;
}
