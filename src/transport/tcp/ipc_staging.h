// What a holder hands a same-host reader of device memory, and the
// bookkeeping of the holder-owned device staging buffers it exports instead
// of its own allocations. Pure: no CUDA, no I/O, no threads, no clock (the
// CUDA calls are in tcp_transport.cc, through cuda/device.h).
//
// Why staging: a legacy CUDA IPC handle opens a whole cudaMalloc
// allocation, read-write, to any process of the host holding it, for as long
// as that process keeps it open; the exporter cannot revoke it, and freeing
// memory another process still has open is undefined behaviour (CUDA runtime
// API, cudaIpcOpenMemHandle). So by default a holder never exports the memory
// it publishes (its engine's weights): it copies the read's bytes device to
// device into buffers of its own and exports those. A reader that keeps or
// writes through such a handle touches only a copy of published bytes
// (docs/security.md, "Same-host readers").
#ifndef TENSORHUB_TRANSPORT_TCP_IPC_STAGING_H_
#define TENSORHUB_TRANSPORT_TCP_IPC_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub::transport {

// What a holder shares with same-host readers of its device memory
// (TcpTransportOptions::cuda_ipc, TENSORHUB_CUDA_IPC).
enum class CudaIpcPolicy {
  // Default. Only holder-owned staging buffers holding a copy of the read's
  // bytes are exported; the published allocation never is.
  kStaged,
  // For hosts whose every process is trusted: the published allocation
  // itself is exported when the published regions cover all of it (no
  // copy); otherwise as kStaged.
  kDirect,
  // No CUDA IPC: every read of device memory goes through pinned host
  // buffers over the socket.
  kOff,
};

// "staged", "direct", "off"; anything else is INVALID_ARGUMENT naming the
// accepted values.
Result<CudaIpcPolicy> ParseCudaIpcPolicy(std::string_view name);
std::string_view CudaIpcPolicyName(CudaIpcPolicy policy);

// How one same-host read of device memory is served.
enum class DeviceReadPath {
  kShareAllocation,  // the published allocation's own handle
  kDeviceStaged,     // a copy in holder-owned device buffers, their handles
  kHostStaged,       // the bytes over the socket, through pinned host memory
};

// The path of a read of `read_bytes` under `policy`. `covered`: the
// published regions cover every allocation the read touches (CoveredBy);
// only then may an allocation itself be shared. `staging_fits`: the read
// fits in the device staging pool (StagingSlots::Needed <= its size).
DeviceReadPath ChooseDeviceReadPath(CudaIpcPolicy policy, bool covered,
                                    bool staging_fits);

// The holder's device staging buffers of one device: `max_buffers` slots
// of `buffer_bytes` each, allocated by the caller on first use (Take says
// when) and never freed while the process lives: a reader may keep a
// handle open as long as it likes, and freeing memory an importer still has
// mapped is undefined behaviour in CUDA. A slot serves one lease at a time;
// it is reused after that lease ended (the reader released it, or its
// connection was dropped), preferably by the same reader (`owner`, a
// connection's serial), so that a reader that keeps a handle mostly sees its
// own later reads. Not thread-safe: the owner locks.
class StagingSlots {
 public:
  StagingSlots(size_t max_buffers, uint64_t buffer_bytes);

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  size_t max_buffers() const { return max_buffers_; }
  // Slots a read of `bytes` takes (at least 1: an empty read takes one).
  size_t Needed(uint64_t bytes) const;
  // Whether a read of `bytes` could ever be staged here.
  bool Fits(uint64_t bytes) const { return Needed(bytes) <= max_buffers_; }

  struct Taken {
    std::vector<size_t> slots;     // in the order the read's bytes fill them
    std::vector<size_t> allocate;  // of those, the ones to allocate first
  };
  // All of the slots a read of `bytes` needs, or none (nullopt: the read
  // goes through host staging instead, nothing waits). Prefers free slots
  // last held by `owner`, then allocated free ones, then new ones.
  std::optional<Taken> Take(uint64_t bytes, uint64_t owner);
  // The caller allocated (and exported) `slot`'s buffer, as Take said to.
  // A slot whose allocation failed stays unallocated: a later Take says so
  // again.
  void MarkAllocated(size_t slot);
  // Gives back the slots of a lease that ended.
  void Give(const Taken& taken);

  size_t in_use() const { return in_use_; }
  size_t allocated() const;
  uint64_t allocated_bytes() const { return allocated() * buffer_bytes_; }

 private:
  struct Slot {
    bool allocated = false;
    bool in_use = false;
    std::optional<uint64_t> last_owner;
  };
  const size_t max_buffers_;
  const uint64_t buffer_bytes_;
  std::vector<Slot> slots_;
  size_t in_use_ = 0;
};

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_IPC_STAGING_H_
