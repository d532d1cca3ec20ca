#include <string>

#include "tensorhub/types.h"

namespace tensorhub {

std::string MemoryLocationName(const MemoryLocation& memory) {
  if (memory.kind == MemoryKind::kHost) return "host";
  return "cuda:" + std::to_string(memory.device);
}

}  // namespace tensorhub
