// Host memory for tensors that are published or fetched on one host:
// backed by transparent huge pages where the kernel allows them.
//
// A same-host read copies the holder's memory straight into the reader's
// (process_vm_readv). The kernel pins every page of both sides for each
// copy, so the page size sets the speed: between two buffers of 2 MiB pages
// the fetch runs faster than one thread's memcpy, between two of 4 KiB
// pages well below it (docs/benchmarks.md section 2). Memory from malloc,
// numpy or torch gets huge pages only where the kernel's THP mode is
// "always"; a HostBuffer asks for them (madvise) in the default "madvise"
// mode too. Publish from a HostBuffer and fetch into one (Python:
// tensorhub.HostBuffer, VersionInfo.empty()).
#ifndef TENSORHUB_HOST_BUFFER_H_
#define TENSORHUB_HOST_BUFFER_H_

#include <cstdint>
#include <string>

#include "tensorhub/status.h"

namespace tensorhub {

class HostBuffer {
 public:
  // Huge pages are this big on x86-64 and on arm64 with 4 KiB base pages;
  // the buffer starts at a multiple of it.
  static constexpr uint64_t kAlignment = uint64_t{2} << 20;

  // `bytes` (> 0) of zeroed memory at a kAlignment boundary, every page
  // faulted in now (so that neither the huge-page allocation nor the
  // zeroing lands in the first publish or fetch). RESOURCE_EXHAUSTED when
  // the kernel refuses the memory.
  static Result<HostBuffer> Allocate(uint64_t bytes);

  HostBuffer() = default;
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether the kernel was asked for huge pages and agreed to consider
  // them (its THP mode is not "never" and it accepted the advice). The
  // kernel may still back parts with small pages when it has no free huge
  // ones: /proc/PID/smaps (AnonHugePages) says what it did.
  bool huge_pages() const { return huge_pages_; }

 private:
  void Release();
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint8_t* mapping_ = nullptr;  // what munmap gets: data_ rounded out
  uint64_t mapping_bytes_ = 0;
  bool huge_pages_ = false;
};

// The kernel's transparent huge page mode for anonymous memory, as
// /sys/kernel/mm/transparent_hugepage/enabled names it ("always",
// "madvise" or "never"); empty where the file is missing.
std::string TransparentHugePageMode();

}  // namespace tensorhub

#endif  // TENSORHUB_HOST_BUFFER_H_
