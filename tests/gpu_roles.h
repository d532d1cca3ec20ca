// Worker processes for the GPU tests and the GPU benchmark (spawned as
// /proc/self/exe --role=NAME ...), speaking a line protocol on stdin/stdout:
//   serve   --memory cuda|host --bytes N [--tensors K] [--sizes A,B,...]
//           [--cuda-ipc staged|direct|off] [--pool-slack S]
//           A bare data-plane holder (a Registry behind the TCP transport,
//           no hub) of version m@1, part 0: K tensors of N/K bytes each
//           plus one of 1001 bytes, or with --sizes exactly tensors of
//           those sizes in that order (--bytes and --tensors ignored),
//           each its own allocation (with --pool-slack, all in one, as
//           Tensors::Make lays them out), filled with consecutive bytes of
//           Pattern(total, 7) in part order. Prints "ready ADDRESS EPOCH", then
//           answers "stats" -> "stats SERVED LOCAL STAGED", "revoke" ->
//           "revoked", "drain MS" -> "drained CODE".
//   holder  --hub A --memory cuda|host --bytes N --version V [--pool-slack S]
//           A Client that publishes m@V from that memory (GpuLayout(N),
//           Pattern(V)). Prints "published", then "unpublish" ->
//           "unpublished CODE".
#ifndef TENSORHUB_TESTS_GPU_ROLES_H_
#define TENSORHUB_TESTS_GPU_ROLES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"
#include "wire/frame.h"

namespace tensorhub::testing {

// Runs the role named by argv[1] ("--role=NAME"); -1 if there is none.
int MaybeRunGpuRole(int argc, char** argv);

// A read of `length` bytes at `offset` of what a "serve" holder serves
// (m@1, part 0) under its registration `epoch`.
wire::ReadRequest ServedRead(uint64_t epoch, uint64_t offset, uint64_t length);

// Where a "serve" holder serves, from the line it prints when ready
// ("ready ADDRESS EPOCH"); INTERNAL, quoting the line, for any other.
struct ServeReady {
  std::string address;
  uint64_t epoch = 0;
};
Result<ServeReady> ParseServeReady(const std::string& line);

// Seeded bytes, the same in every process.
std::vector<uint8_t> Pattern(size_t bytes, uint64_t seed);

// The tensors of a version of about `bytes` bytes: one large tensor, a
// BF16 one of 100 bytes and an odd-sized U8 one of 1001 bytes (so chunks
// span tensors and start unaligned).
std::vector<TensorSpec> GpuLayout(uint64_t bytes);

// Tensors of `specs` in fresh memory of `memory` (each its own
// allocation), filled with consecutive bytes of `content`. Owns the memory.
// With `pool_slack` (device memory), as PyTorch's caching allocator lays
// them out instead: every tensor at a 512-byte aligned offset of one
// cudaMalloc, followed by `pool_slack` bytes that no tensor of `specs` uses
// (other tensors of the process, as far as a holder can tell).
class Tensors {
 public:
  static Result<Tensors> Make(const std::vector<TensorSpec>& specs,
                              MemoryLocation memory,
                              const std::vector<uint8_t>& content,
                              std::optional<uint64_t> pool_slack = {});
  const std::vector<TensorRef>& refs() const { return refs_; }
  // The bytes of every tensor, concatenated (copied back from the device).
  Result<std::vector<uint8_t>> Read() const;

 private:
  std::vector<TensorRef> refs_;
  std::vector<std::unique_ptr<cuda::DeviceBuffer>> device_;
  std::vector<std::vector<uint8_t>> host_;
};

}  // namespace tensorhub::testing

#endif  // TENSORHUB_TESTS_GPU_ROLES_H_
