#include "client/tensor_checks.h"

#include "cuda/device.h"

namespace tensorhub::client {

Result<MemoryLocation> CheckMemory(const std::vector<TensorRef>& tensors,
                                   const char* what) {
  if (tensors.empty()) return MemoryLocation::Host();
  const MemoryLocation memory = tensors.front().memory;
  for (const TensorRef& t : tensors) {
    if (!(t.memory == memory)) {
      return InvalidArgument(std::string(what) + ": tensor '" + t.spec.name +
                             "' is in " + MemoryLocationName(t.memory) +
                             " but '" + tensors.front().spec.name + "' is in " +
                             MemoryLocationName(memory) +
                             "; one call takes tensors of one memory");
    }
  }
  TH_RETURN_IF_ERROR(cuda::CheckLocation(memory).WithContext(what));
  if (memory.is_host()) return memory;
  for (const TensorRef& t : tensors) {
    if (t.data == nullptr) continue;  // caught with a clearer message later
    TH_RETURN_IF_ERROR(
        cuda::CheckDevicePointer(t.data, t.bytes, memory.device)
            .WithContext(std::string(what) + ": tensor '" + t.spec.name + "'"));
  }
  return memory;
}

std::vector<MemoryRange> RangesOf(const std::vector<TensorRef>& tensors) {
  std::vector<MemoryRange> out;
  out.reserve(tensors.size());
  for (const TensorRef& t : tensors) {
    out.push_back({static_cast<const uint8_t*>(t.data), t.bytes});
  }
  return out;
}

std::string DescribeSpec(const TensorSpec& spec) {
  std::string out(DTypeName(spec.dtype));
  out += "[";
  for (size_t i = 0; i < spec.shape.size(); ++i) {
    out += (i ? "," : "") + std::to_string(spec.shape[i]);
  }
  return out + "]";
}

std::string VersionName(std::string_view model, Version version) {
  return "'" + std::string(model) + "@" + std::to_string(version.value()) + "'";
}

Status CheckReaderGroup(std::string_view group) {
  if (group.size() > kMaxReaderGroupBytes) {
    return InvalidArgument("reader group id must be at most " +
                           std::to_string(kMaxReaderGroupBytes) +
                           " characters");
  }
  return Status::Ok();
}

}  // namespace tensorhub::client
