// Checks of the tensors a caller hands to Publish and Fetch, and the names
// their errors use. Pure, apart from asking the CUDA driver where a pointer
// lives.
#ifndef TENSORHUB_CLIENT_TENSOR_CHECKS_H_
#define TENSORHUB_CLIENT_TENSOR_CHECKS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::client {

// [start, start + bytes) of caller memory.
using MemoryRange = std::pair<const uint8_t*, uint64_t>;

// The memory every one of `tensors` lives in, checked usable here: a call
// takes tensors of one memory (host, or one CUDA device). `what` names the
// call in the error ("publish", "fetch").
Result<MemoryLocation> CheckMemory(const std::vector<TensorRef>& tensors,
                                   const char* what);

// The memory ranges `tensors` cover.
std::vector<MemoryRange> RangesOf(const std::vector<TensorRef>& tensors);

// "F32[4,8]".
std::string DescribeSpec(const TensorSpec& spec);
// "'model@3'", as errors and logs name a version.
std::string VersionName(std::string_view model, Version version);

// A reader group id (FetchOptions::group) is at most this long.
inline constexpr size_t kMaxReaderGroupBytes = 256;
Status CheckReaderGroup(std::string_view group);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_TENSOR_CHECKS_H_
