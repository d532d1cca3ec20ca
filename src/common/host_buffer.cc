#include "tensorhub/host_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

namespace tensorhub {

std::string TransparentHugePageMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  if (!in || !std::getline(in, text)) return "";
  // "always [madvise] never": the bracketed word is the mode.
  size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open)
    return "";
  return text.substr(open + 1, close - open - 1);
}

Result<HostBuffer> HostBuffer::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("HostBuffer of 0 bytes");
  const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes || rounded > UINT64_MAX - kAlignment) {
    return InvalidArgument("HostBuffer of " + std::to_string(bytes) +
                           " bytes is too large");
  }
  // Map one alignment more than needed and trim both ends, so the buffer
  // starts on a huge-page boundary and the kernel can back all of it.
  const uint64_t span = rounded + kAlignment;
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    return ResourceExhausted("cannot map " + std::to_string(bytes) +
                             " bytes of host memory: " + std::strerror(errno));
  }
  auto* raw = static_cast<uint8_t*>(m);
  auto at = reinterpret_cast<uintptr_t>(raw);
  auto* start = reinterpret_cast<uint8_t*>((at + kAlignment - 1) / kAlignment *
                                           kAlignment);
  const uint64_t head = static_cast<uint64_t>(start - raw);
  const uint64_t tail = span - head - rounded;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(start + rounded, tail);

  HostBuffer out;
  out.mapping_ = start;
  out.mapping_bytes_ = rounded;
  out.data_ = start;
  out.size_ = bytes;
  const std::string mode = TransparentHugePageMode();
  out.huge_pages_ = mode != "never" && !mode.empty() &&
                    ::madvise(start, rounded, MADV_HUGEPAGE) == 0;
  // Fault every page in now. Anonymous memory reads as zeros already; the
  // write is what makes the kernel allocate (a huge page per 2 MiB where it
  // can; the other writes of that 2 MiB then find it mapped).
  for (uint64_t off = 0; off < rounded; off += 4096) start[off] = 0;
  return out;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = data_ = nullptr;
  mapping_bytes_ = size_ = 0;
  huge_pages_ = false;
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(mapping_, o.mapping_);
    std::swap(mapping_bytes_, o.mapping_bytes_);
    std::swap(huge_pages_, o.huge_pages_);
  }
  return *this;
}

}  // namespace tensorhub
