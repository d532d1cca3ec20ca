// A synthetic model with a real LLM's tensor layout, for the demo, the
// benchmarks and the tests: Qwen2.5-0.5B (24 layers, hidden 896, 14 query and
// 2 key/value heads, MLP 4864, vocabulary 151936, tied embeddings), bf16,
// about 0.99 GB. `scale` < 1 shrinks the vocabulary and layer count for quick
// runs while keeping every tensor kind.
#ifndef TENSORHUB_TOOLS_DEMO_MODEL_H_
#define TENSORHUB_TOOLS_DEMO_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "tensorhub/host_buffer.h"
#include "tensorhub/types.h"

namespace tensorhub::cli {

std::vector<TensorSpec> QwenLayout(double scale);

// Where a SyntheticModel's memory comes from: a HostBuffer (huge pages
// where the kernel allows them), or new[] (what the kernel's THP mode
// gives any allocation; `bench local --host-memory plain`).
enum class HostMemory { kHugePages, kPlain };
// "huge-pages" or "plain": the spelling of `--host-memory`.
const char* HostMemoryName(HostMemory memory);

// Host memory for all tensors of a layout, one allocation, every page
// touched.
class SyntheticModel {
 public:
  explicit SyntheticModel(std::vector<TensorSpec> specs,
                          HostMemory memory = HostMemory::kHugePages);
  const std::vector<TensorRef>& tensors() const { return refs_; }
  uint64_t total_bytes() const { return total_bytes_; }
  // Deterministic content for `version` (differs per version and tensor).
  void Fill(uint64_t version);
  // XXH3-64 over all tensors' bytes in layout order.
  uint64_t Digest() const;

 private:
  std::vector<TensorRef> refs_;
  uint64_t total_bytes_ = 0;
  HostBuffer buffer_;
  std::unique_ptr<uint64_t[]> plain_;
};

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_DEMO_MODEL_H_
