#include "transport/tcp/ipc_staging.h"

#include <cassert>

namespace tensorhub::transport {

Result<CudaIpcPolicy> ParseCudaIpcPolicy(std::string_view name) {
  if (name == "staged") return CudaIpcPolicy::kStaged;
  if (name == "direct") return CudaIpcPolicy::kDirect;
  if (name == "off") return CudaIpcPolicy::kOff;
  return InvalidArgument(
      "CUDA IPC policy '" + std::string(name) +
      "' is not one of staged (default: readers get copies in the holder's "
      "own device buffers), direct (trusted hosts only: readers get the "
      "published allocation itself) or off (no CUDA IPC)");
}

std::string_view CudaIpcPolicyName(CudaIpcPolicy policy) {
  switch (policy) {
    case CudaIpcPolicy::kStaged:
      return "staged";
    case CudaIpcPolicy::kDirect:
      return "direct";
    case CudaIpcPolicy::kOff:
      return "off";
  }
  return "?";
}

DeviceReadPath ChooseDeviceReadPath(CudaIpcPolicy policy, bool covered,
                                    bool staging_fits) {
  switch (policy) {
    case CudaIpcPolicy::kOff:
      return DeviceReadPath::kHostStaged;
    case CudaIpcPolicy::kDirect:
      if (covered) return DeviceReadPath::kShareAllocation;
      break;
    case CudaIpcPolicy::kStaged:
      break;
  }
  return staging_fits ? DeviceReadPath::kDeviceStaged
                      : DeviceReadPath::kHostStaged;
}

StagingSlots::StagingSlots(size_t max_buffers, uint64_t buffer_bytes)
    : max_buffers_(max_buffers),
      buffer_bytes_(buffer_bytes == 0 ? 1 : buffer_bytes),
      slots_(max_buffers) {}

size_t StagingSlots::Needed(uint64_t bytes) const {
  if (bytes == 0) return 1;
  const uint64_t n = (bytes - 1) / buffer_bytes_ + 1;
  // Saturate: a read larger than any pool never fits.
  return n > max_buffers_ ? max_buffers_ + 1 : static_cast<size_t>(n);
}

std::optional<StagingSlots::Taken> StagingSlots::Take(uint64_t bytes,
                                                      uint64_t owner) {
  const size_t need = Needed(bytes);
  if (need > max_buffers_ - in_use_) return std::nullopt;
  Taken t;
  // Three passes, best first: free slots this reader held last (it may
  // still have their handles open: no new exposure), then allocated ones,
  // then new ones.
  auto pick = [&](auto&& wanted) {
    for (size_t i = 0; i < slots_.size() && t.slots.size() < need; ++i) {
      Slot& s = slots_[i];
      if (s.in_use || !wanted(s)) continue;
      s.in_use = true;
      t.slots.push_back(i);
      if (!s.allocated) t.allocate.push_back(i);
    }
  };
  pick([&](const Slot& s) { return s.allocated && s.last_owner == owner; });
  pick([](const Slot& s) { return s.allocated; });
  pick([](const Slot&) { return true; });
  assert(t.slots.size() == need);
  for (size_t i : t.slots) slots_[i].last_owner = owner;
  in_use_ += need;
  return t;
}

void StagingSlots::MarkAllocated(size_t slot) {
  if (slot < slots_.size()) slots_[slot].allocated = true;
}

void StagingSlots::Give(const Taken& taken) {
  for (size_t i : taken.slots) {
    if (i >= slots_.size() || !slots_[i].in_use) continue;
    slots_[i].in_use = false;
    --in_use_;
  }
}

size_t StagingSlots::allocated() const {
  size_t n = 0;
  for (const Slot& s : slots_) n += s.allocated ? 1 : 0;
  return n;
}

}  // namespace tensorhub::transport
