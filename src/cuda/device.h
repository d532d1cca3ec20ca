// Device memory for the data plane: the one place that talks to the CUDA
// runtime. Two builds of one interface: device.cu (TH_CUDA=ON, the runtime
// linked statically, so a binary runs on a machine without a GPU or driver)
// and device_stub.cc (TH_CUDA=OFF). Without CUDA, or without a device at run
// time, every call that would touch device memory fails with
// FAILED_PRECONDITION and a message that says why; host memory is never
// affected. Nothing here knows about versions, holders or the hub.
#ifndef TENSORHUB_CUDA_DEVICE_H_
#define TENSORHUB_CUDA_DEVICE_H_

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/deadline.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::cuda {

// Whether this build has CUDA support compiled in (TH_CUDA).
bool Compiled();

// CUDA devices this process sees; 0 when there are none, with the reason
// ("built without CUDA", "no CUDA driver: ...", "no device visible") in
// `why` if not null.
int DeviceCount(std::string* why = nullptr);

// OK for host memory. For a CUDA location: INVALID_ARGUMENT for a negative
// ordinal; FAILED_PRECONDITION ("no CUDA device: ...", "cuda:3 does not
// exist: this process sees 1 CUDA device(s)") when it cannot be used here.
Status CheckLocation(const MemoryLocation& memory);

// Checks that [ptr, ptr + bytes) is memory the CUDA runtime knows as device
// memory of `device` (a host pointer labelled as device memory, or the
// wrong ordinal, is INVALID_ARGUMENT).
Status CheckDevicePointer(const void* ptr, uint64_t bytes, int device);

// A non-blocking CUDA stream on one device, with scratch memory for the
// device checksum. Owns what it allocates. One thread at a time.
class Stream {
 public:
  static Result<std::unique_ptr<Stream>> Create(int device);
  virtual ~Stream() = default;
  virtual int device() const = 0;
  // Enqueues a copy between any two of host (pinned or not), this device
  // or a peer (unified addressing decides the direction).
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes) = 0;
  // Waits for everything enqueued; reports the first error.
  virtual Status Synchronize() = 0;
  // The chunk checksum `kind` (common/checksum.h) of the concatenation of
  // `pieces`, all in this device's memory, computed by kernels
  // (cuda/xxh3_blocks.h): equal to ChunkSum on the host over the same
  // bytes. Ordered after the copies enqueued before it; synchronizes.
  // Several pieces, or a start not 8-byte aligned, are first gathered into
  // scratch memory on the device.
  virtual Result<uint64_t> Checksum(ChunkChecksum kind,
                                    std::span<const iovec> pieces) = 0;
  // Copies the concatenation of `src` (device memory, this device's or a
  // peer's) to `dst` (this device) and returns Checksum of the copied
  // bytes; synchronizes. The device implementation checks the XXH3-64
  // tree in the copy's own pass over memory (when the pieces are 8-byte
  // aligned and start at multiples of 1 KiB); this one copies, then
  // hashes.
  virtual Result<uint64_t> CopyAndChecksum(ChunkChecksum kind, uint8_t* dst,
                                           std::span<const iovec> src) {
    uint64_t off = 0;
    for (const iovec& v : src) {
      TH_RETURN_IF_ERROR(CopyAsync(dst + off, v.iov_base, v.iov_len));
      off += v.iov_len;
    }
    const iovec all{dst, off};
    return Checksum(kind, {&all, 1});
  }
};

// Device memory from cudaMalloc, freed on destruction (for tests, benchmarks
// and tools; TensorHub never allocates the memory it publishes).
class DeviceBuffer {
 public:
  static Result<std::unique_ptr<DeviceBuffer>> Allocate(int device,
                                                        size_t bytes);
  virtual ~DeviceBuffer() = default;
  virtual uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  virtual int device() const = 0;
};

// A bounded pool of page-locked host buffers that stage bytes between a
// device and a socket. Buffers are allocated on first use, up to
// `max_buffers`, and kept. Thread-safe.
class PinnedPool {
 public:
  // A set of buffers taken together; returns them on destruction.
  class Lease {
   public:
    Lease() = default;
    Lease(PinnedPool* pool, std::vector<uint8_t*> buffers)
        : pool_(pool), buffers_(std::move(buffers)) {}
    Lease(Lease&& o) noexcept
        : pool_(o.pool_), buffers_(std::move(o.buffers_)) {
      o.pool_ = nullptr;
    }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    uint8_t* buffer(size_t i) const { return buffers_[i]; }
    size_t size() const { return buffers_.size(); }

   private:
    PinnedPool* pool_ = nullptr;
    std::vector<uint8_t*> buffers_;
  };

  virtual ~PinnedPool() = default;
  virtual size_t buffer_bytes() const = 0;
  // Takes `n` buffers at once (all or none, so two readers holding one
  // each never wait for each other), waiting at most until `deadline`:
  // RESOURCE_EXHAUSTED then, FAILED_PRECONDITION without CUDA.
  virtual Result<Lease> Acquire(size_t n, const Deadline& deadline) = 0;

 protected:
  virtual void Release(std::vector<uint8_t*> buffers) = 0;
};

// The process's pool: kStagingBufferBytes each, at most kMaxStagingBuffers.
inline constexpr size_t kStagingBufferBytes = 4u << 20;
inline constexpr size_t kMaxStagingBuffers = 32;
PinnedPool& StagingPool();

// CUDA IPC: a handle names one cudaMalloc allocation to other processes of
// the same host.
struct IpcHandle {
  std::array<uint8_t, 64> bytes{};
  bool operator==(const IpcHandle&) const = default;
  auto operator<=>(const IpcHandle&) const = default;
};
struct IpcExport {
  IpcHandle handle;
  uint64_t offset = 0;  // of the pointer inside its allocation
  uint64_t alloc_bytes = 0;
};
// The handle of the allocation holding `ptr` (device memory of `device`).
// Fails for memory that CUDA IPC cannot share (managed memory, memory from
// cudaMallocAsync pools or virtual memory management): the caller then
// falls back to staging.
Result<IpcExport> ExportIpc(const void* ptr, int device);

// A process-wide table of imported allocations, opened once per handle and
// closed when the last user lets go. Thread-safe.
class IpcImports {
 public:
  // Maps the allocation (peer access enabled lazily if it lives on another
  // device than `device`) and returns its base; each successful Open
  // needs one Close.
  static Result<uint8_t*> Open(const IpcHandle& handle, int device);
  static void Close(const IpcHandle& handle);
};

// The calls a data-plane holder makes on device memory it serves, as one
// interface: Runtime() is the functions above (the CUDA runtime, or the
// stub without CUDA); a host test gives a fake over host memory to check
// what a holder exports by CUDA IPC without a GPU
// (transport/tcp/ipc_export_test.cc). Thread-safe.
class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual Result<std::unique_ptr<Stream>> CreateStream(int device) {
    return Stream::Create(device);
  }
  virtual Result<std::unique_ptr<DeviceBuffer>> Allocate(int device,
                                                         size_t bytes) {
    return DeviceBuffer::Allocate(device, bytes);
  }
  virtual Result<IpcExport> Export(const void* ptr, int device) {
    return ExportIpc(ptr, device);
  }
};
// Never destroyed.
inline DeviceApi& Runtime() {
  static DeviceApi* api = new DeviceApi();
  return *api;
}

inline PinnedPool::Lease& PinnedPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pool_ != nullptr) pool_->Release(std::move(buffers_));
    pool_ = o.pool_;
    buffers_ = std::move(o.buffers_);
    o.pool_ = nullptr;
  }
  return *this;
}

inline PinnedPool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->Release(std::move(buffers_));
}

}  // namespace tensorhub::cuda

#endif  // TENSORHUB_CUDA_DEVICE_H_
