// device.h on the CUDA runtime (linked statically: a machine without a
// driver loads this binary and sees zero devices).
#include <cuda.h>  // driver types only: cuMemGetAddressRange is looked up at run time
#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/block_sums.cuh"
#include "cuda/device.h"
#include "cuda/xxh3_blocks.h"

namespace tensorhub::cuda {
namespace {

Status FromCuda(cudaError_t e, const std::string& what) {
  std::string msg =
      what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
      return FailedPrecondition("no CUDA device: " + msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return InvalidArgument(msg);
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(msg);
    default:
      return Internal(msg);
  }
}

#define TH_CUDA_RETURN(expr, what)                          \
  do {                                                      \
    cudaError_t th_e_ = (expr);                             \
    if (th_e_ != cudaSuccess) return FromCuda(th_e_, what); \
  } while (0)

// ---- the device checksum ----------------------------------------------------

// Block sums: the variants of cuda/block_sums.cuh that bench/gpu_kernels
// measured fastest on an H200 (docs/benchmarks.md, section 10;
// bench/results/gpu-kernels-h200.txt): reading only, 4 blocks per step
// (3.25 TB/s over 4 GiB, against 2.68 for one block per step; 64 thread
// blocks per SM did as well there, 3.23, but cut 64 MiB chunks from 718 to
// 514 GB/s in gpu_bench); copying as well, one block per step (1.68 TB/s =
// 0.79x cudaMemcpy D2D; more loads in flight slowed the writes: 1.41).
constexpr int kSumThreads = sums::kWordsPerBlock;
constexpr int kReadBlocksPerStep = 4, kReadCtasPerSm = 16;
constexpr int kCopyBlocksPerStep = 1, kCopyCtasPerSm = 16;

// Folds the block sums in order, then the tail and the merge. One warp:
// lanes 0..7 run the 8 lane chains (one scramble per KiB, a chain of
// dependent steps that no width can shorten), while all 32 lanes fetch the
// next tile of sums into registers, so the chains read shared memory and
// never wait for global memory.
constexpr int kFoldTile = 128;                    // blocks per tile
constexpr int kFoldPerLane = kFoldTile * 8 / 32;  // sums each lane fetches

__global__ void FinishKernel(const uint8_t* __restrict__ p, uint64_t len,
                             const uint64_t* __restrict__ sums, uint64_t* out) {
  __shared__ uint64_t tile[kFoldTile * 8];
  __shared__ uint64_t acc[8];
  const unsigned t = threadIdx.x;
  if (len <= xxh3::kMidsizeMax) {
    if (t == 0) *out = xxh3::HashShort(p, len);
    return;
  }
  const xxh3::Secret s = xxh3::DefaultSecret();
  const uint64_t key = xxh3::LaneKey(s, t % 8);
  uint64_t init[8];
  xxh3::InitAcc(init);
  uint64_t a = init[t % 8];
  const uint64_t nb = xxh3::FoldedBlocks(len);
  uint64_t next[kFoldPerLane];
  auto fetch = [&](uint64_t first_block) {
#pragma unroll
    for (int k = 0; k < kFoldPerLane; ++k) {
      const uint64_t i = first_block * 8 + k * 32 + t;
      next[k] = i < nb * 8 ? sums[i] : 0;
    }
  };
  fetch(0);
  for (uint64_t b0 = 0; b0 < nb; b0 += kFoldTile) {
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kFoldPerLane; ++k) tile[k * 32 + t] = next[k];
    __syncwarp();
    if (b0 + kFoldTile < nb) fetch(b0 + kFoldTile);
    if (t < 8) {
      const int n = static_cast<int>(nb - b0 < kFoldTile ? nb - b0 : kFoldTile);
#pragma unroll 4
      for (int j = 0; j < n; ++j) a = xxh3::FoldLane(a, tile[j * 8 + t], key);
    }
  }
  if (t < 8) acc[t] = a;
  __syncwarp();
  if (t == 0) {
    uint64_t all[8];
    for (int k = 0; k < 8; ++k) all[k] = acc[k];
    *out = xxh3::FinishLong(all, p, len);
  }
}

// The tree checksum's leaves: one warp per leaf (grid-stride), given the
// block sums of the whole input (LaunchSums). All 32 lanes load the
// leaf's sums into shared memory, lanes 0..7 fold them (at most 63 steps,
// against one per KiB of the whole input for plain XXH3-64), lane 0
// finishes the leaf (xxh3::LeafHashFromSums is the same in one thread).
constexpr uint64_t kLeafBlocks = xxh3::kLeafBytes / xxh3::kBlockBytes;  // 64
static_assert(xxh3::kLeafBytes == kChecksumLeafBytes,
              "the device tree's leaves are common/checksum.h's");

__global__ void LeafKernel(const uint8_t* __restrict__ p, uint64_t len,
                           const uint64_t* __restrict__ sums,
                           uint64_t* __restrict__ leaf_hashes) {
  __shared__ uint64_t tile[kLeafBlocks * 8];
  __shared__ uint64_t acc[8];
  const unsigned t = threadIdx.x;
  const xxh3::Secret s = xxh3::DefaultSecret();
  const uint64_t key = xxh3::LaneKey(s, t % 8);
  const uint64_t leaves = xxh3::LeafCount(len);
  for (uint64_t leaf = blockIdx.x; leaf < leaves; leaf += gridDim.x) {
    const uint64_t n = xxh3::LeafLength(len, leaf);
    const uint8_t* q = p + leaf * xxh3::kLeafBytes;
    if (n <= xxh3::kMidsizeMax) {  // the same for every lane
      if (t == 0) leaf_hashes[leaf] = xxh3::HashShort(q, n);
      continue;
    }
    const uint64_t nb = xxh3::FoldedBlocks(n);
    const uint64_t* mine = sums + leaf * kLeafBlocks * 8;
    __syncwarp();
    for (uint64_t i = t; i < nb * 8; i += 32) tile[i] = mine[i];
    __syncwarp();
    if (t < 8) {
      uint64_t init[8];
      xxh3::InitAcc(init);
      uint64_t a = init[t];
      for (uint64_t j = 0; j < nb; ++j)
        a = xxh3::FoldLane(a, tile[j * 8 + t], key);
      acc[t] = a;
    }
    __syncwarp();
    if (t == 0) {
      uint64_t all[8];
      for (int k = 0; k < 8; ++k) all[k] = acc[k];
      leaf_hashes[leaf] = xxh3::FinishLong(all, q, n);
    }
  }
}

class StreamImpl final : public Stream {
 public:
  StreamImpl(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}
  ~StreamImpl() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (sums_ != nullptr) cudaFree(sums_);
    if (leaves_ != nullptr) cudaFree(leaves_);
    if (out_ != nullptr) cudaFree(out_);
    cudaStreamDestroy(stream_);
  }

  int device() const override { return device_; }

  Status CopyAsync(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    TH_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    TH_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                   "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
    return Status::Ok();
  }

  Status Synchronize() override {
    TH_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    TH_CUDA_RETURN(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return Status::Ok();
  }

  Result<uint64_t> Checksum(ChunkChecksum kind,
                            std::span<const iovec> pieces) override {
    TH_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    uint64_t len = 0;
    size_t nonempty = 0;
    const uint8_t* p = nullptr;
    for (const iovec& v : pieces) {
      len += v.iov_len;
      if (v.iov_len > 0) {
        ++nonempty;
        p = static_cast<const uint8_t*>(v.iov_base);
      }
    }
    if (nonempty != 1 || reinterpret_cast<uintptr_t>(p) % 8 != 0) {
      // Gather into one aligned run (device to device, at copy speed).
      TH_RETURN_IF_ERROR(
          Grow(&scratch_, &scratch_bytes_, std::max<uint64_t>(len, 8)));
      uint64_t off = 0;
      for (const iovec& v : pieces) {
        TH_RETURN_IF_ERROR(CopyAsync(scratch_ + off, v.iov_base, v.iov_len));
        off += v.iov_len;
      }
      p = scratch_;
    }
    if (out_ == nullptr) {
      TH_CUDA_RETURN(cudaMalloc(&out_, sizeof(uint64_t)), "cudaMalloc");
    }
    if (kind == ChunkChecksum::kXxh3Tree) {
      TH_RETURN_IF_ERROR(Grow(reinterpret_cast<uint8_t**>(&leaves_),
                              &leaves_bytes_, xxh3::LeafCount(len) * 8));
      TH_RETURN_IF_ERROR(LaunchBlockSums(p, xxh3::SummedBlocks(len)));
      TH_RETURN_IF_ERROR(LaunchTreeFromSums(p, len));
    } else if (kind == ChunkChecksum::kXxh3) {
      TH_RETURN_IF_ERROR(LaunchXxh3(p, len));
    } else {
      return InvalidArgument("chunk checksum " + ChunkChecksumName(kind) +
                             " has no device implementation");
    }
    return ReadBack();
  }

  // The tree checksum in the copy's own pass over memory: each piece's
  // whole blocks are copied by the kernel that sums them (the rest of a
  // piece by cudaMemcpyAsync), then the leaves are folded on `dst`. Needs
  // 8-byte aligned addresses and pieces that start at multiples of a block
  // in the concatenation; anything else is copied, then hashed.
  Result<uint64_t> CopyAndChecksum(ChunkChecksum kind, uint8_t* dst,
                                   std::span<const iovec> src) override {
    uint64_t len = 0;
    bool fused = kind == ChunkChecksum::kXxh3Tree &&
                 reinterpret_cast<uintptr_t>(dst) % 8 == 0;
    for (const iovec& v : src) {
      if (v.iov_len == 0) continue;
      fused = fused && reinterpret_cast<uintptr_t>(v.iov_base) % 8 == 0 &&
              len % xxh3::kBlockBytes == 0;
      len += v.iov_len;
    }
    if (!fused || len <= xxh3::kMidsizeMax) {
      return Stream::CopyAndChecksum(kind, dst, src);
    }
    TH_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    if (out_ == nullptr) {
      TH_CUDA_RETURN(cudaMalloc(&out_, sizeof(uint64_t)), "cudaMalloc");
    }
    const uint64_t nb = xxh3::SummedBlocks(len);
    TH_RETURN_IF_ERROR(Grow(reinterpret_cast<uint8_t**>(&sums_), &sums_bytes_,
                            nb * 8 * sizeof(uint64_t)));
    TH_RETURN_IF_ERROR(Grow(reinterpret_cast<uint8_t**>(&leaves_),
                            &leaves_bytes_, xxh3::LeafCount(len) * 8));
    uint64_t off = 0;
    for (const iovec& v : src) {
      if (v.iov_len == 0) continue;
      const uint8_t* from = static_cast<const uint8_t*>(v.iov_base);
      const uint64_t first = off / xxh3::kBlockBytes;
      const uint64_t summed =
          first >= nb ? 0 : std::min(v.iov_len / xxh3::kBlockBytes, nb - first);
      TH_RETURN_IF_ERROR(LaunchSums(from, summed, first, dst + off));
      const uint64_t done = summed * xxh3::kBlockBytes;
      TH_RETURN_IF_ERROR(
          CopyAsync(dst + off + done, from + done, v.iov_len - done));
      off += v.iov_len;
    }
    TH_RETURN_IF_ERROR(LaunchTreeFromSums(dst, len));
    return ReadBack();
  }

 private:
  // The tree checksum of `len` bytes at `p` into *out_, given the sums of
  // its blocks in sums_ and leaves_ large enough.
  Status LaunchTreeFromSums(const uint8_t* p, uint64_t len) {
    const uint64_t leaves = xxh3::LeafCount(len);
    const unsigned grid =
        static_cast<unsigned>(std::min<uint64_t>(leaves, Sms() * 16));
    LeafKernel<<<grid, 32, 0, stream_>>>(p, len, sums_, leaves_);
    TH_CUDA_RETURN(cudaGetLastError(), "checksum kernel launch");
    return LaunchXxh3(reinterpret_cast<const uint8_t*>(leaves_), leaves * 8);
  }

  // *out_, once everything enqueued has run.
  Result<uint64_t> ReadBack() {
    uint64_t h = 0;
    TH_CUDA_RETURN(
        cudaMemcpyAsync(&h, out_, sizeof(h), cudaMemcpyDeviceToHost, stream_),
        "reading the checksum back");
    TH_CUDA_RETURN(cudaStreamSynchronize(stream_), "checksum");
    return h;
  }

  // The block sums of the first `nb` blocks at `p` (8-byte aligned) into
  // sums_.
  Status LaunchBlockSums(const uint8_t* p, uint64_t nb) {
    if (nb == 0) return Status::Ok();
    TH_RETURN_IF_ERROR(Grow(reinterpret_cast<uint8_t**>(&sums_), &sums_bytes_,
                            nb * 8 * sizeof(uint64_t)));
    return LaunchSums(p, nb, 0, nullptr);
  }

  // Sums blocks first.. first + nb - 1 of an input from `p` (8-byte
  // aligned) into sums_ (large enough already), copying them to `dst`
  // unless it is null.
  Status LaunchSums(const uint8_t* p, uint64_t nb, uint64_t first,
                    uint8_t* dst) {
    if (nb == 0) return Status::Ok();
    const auto* in = reinterpret_cast<const uint64_t*>(p);
    auto* out = reinterpret_cast<uint64_t*>(dst);
    if (dst == nullptr) {
      sums::WordPerThread<kReadBlocksPerStep>
          <<<Grid(nb, kReadBlocksPerStep, kReadCtasPerSm), kSumThreads, 0,
             stream_>>>(in, nb, first, sums_, out);
    } else {
      sums::WordPerThread<kCopyBlocksPerStep>
          <<<Grid(nb, kCopyBlocksPerStep, kCopyCtasPerSm), kSumThreads, 0,
             stream_>>>(in, nb, first, sums_, out);
    }
    TH_CUDA_RETURN(cudaGetLastError(), "checksum kernel launch");
    return Status::Ok();
  }

  // Thread blocks for `nb` blocks summed `per_step` at a time: one per
  // step, at most `per_sm` per multiprocessor (grid-stride beyond).
  unsigned Grid(uint64_t nb, int per_step, int per_sm) {
    const uint64_t steps = (nb + per_step - 1) / per_step;
    return static_cast<unsigned>(std::min<uint64_t>(steps, Sms() * per_sm));
  }

  uint64_t Sms() {
    if (sms_ == 0) {
      int n = 0;
      if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device_) !=
              cudaSuccess ||
          n <= 0) {
        n = 132;
      }
      sms_ = static_cast<uint64_t>(n);
    }
    return sms_;
  }

  // XXH3-64 of `len` bytes at `p` (8-byte aligned) into *out_.
  Status LaunchXxh3(const uint8_t* p, uint64_t len) {
    TH_RETURN_IF_ERROR(LaunchBlockSums(p, xxh3::SummedBlocks(len)));
    FinishKernel<<<1, 32, 0, stream_>>>(p, len, sums_, out_);
    TH_CUDA_RETURN(cudaGetLastError(), "checksum kernel launch");
    return Status::Ok();
  }

  Status Grow(uint8_t** buf, uint64_t* have, uint64_t need) {
    if (*have >= need) return Status::Ok();
    // Pending work may still use the old buffer.
    TH_CUDA_RETURN(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (*buf != nullptr) cudaFree(*buf);
    *buf = nullptr;
    *have = 0;
    TH_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(buf), need),
                   "cudaMalloc of " + std::to_string(need) + " scratch bytes");
    *have = need;
    return Status::Ok();
  }

  const int device_;
  cudaStream_t stream_;
  uint8_t* scratch_ = nullptr;
  uint64_t scratch_bytes_ = 0;
  uint64_t* sums_ = nullptr;
  uint64_t sums_bytes_ = 0;
  uint64_t* leaves_ = nullptr;
  uint64_t leaves_bytes_ = 0;
  uint64_t* out_ = nullptr;
  uint64_t sms_ = 0;  // the device's multiprocessors, once asked
};

// ---- pinned staging
// ----------------------------------------------------------

class CudaPinnedPool final : public PinnedPool {
 public:
  CudaPinnedPool(size_t buffer_bytes, size_t max_buffers)
      : buffer_bytes_(buffer_bytes), max_buffers_(max_buffers) {}

  size_t buffer_bytes() const override { return buffer_bytes_; }

  Result<Lease> Acquire(size_t n, const Deadline& deadline) override {
    if (n == 0 || n > max_buffers_) {
      return InvalidArgument("cannot take " + std::to_string(n) + " of " +
                             std::to_string(max_buffers_) + " staging buffers");
    }
    std::unique_lock<std::mutex> lock(mu_);
    bool ok = cv_.wait_until(lock, deadline.at(), [&] {
      return free_.size() + (max_buffers_ - allocated_) >= n;
    });
    if (!ok) {
      return ResourceExhausted(
          "all " + std::to_string(max_buffers_) +
          " pinned staging buffers stayed in use until the deadline");
    }
    std::vector<uint8_t*> out;
    while (out.size() < n && !free_.empty()) {
      out.push_back(free_.back());
      free_.pop_back();
    }
    while (out.size() < n) {
      void* p = nullptr;
      cudaError_t e = cudaHostAlloc(&p, buffer_bytes_, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        for (uint8_t* b : out) free_.push_back(b);
        cv_.notify_all();
        return FromCuda(e, "cudaHostAlloc of a staging buffer");
      }
      ++allocated_;
      out.push_back(static_cast<uint8_t*>(p));
    }
    return Lease(this, std::move(out));
  }

 protected:
  void Release(std::vector<uint8_t*> buffers) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint8_t* b : buffers) free_.push_back(b);
    cv_.notify_all();
  }

 private:
  const size_t buffer_bytes_;
  const size_t max_buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t*> free_;  // guarded by mu_
  size_t allocated_ = 0;        // guarded by mu_
};

// ---- IPC
// ---------------------------------------------------------------------

using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

Result<GetAddressRangeFn> AddressRangeFn() {
  static GetAddressRangeFn fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000,
                                           cudaEnableDefault, &q);
    if (err == cudaSuccess && q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<GetAddressRangeFn>(f);
    } else if (err == cudaSuccess) {
      err = cudaErrorSymbolNotFound;
    }
  });
  if (fn == nullptr) return FromCuda(err, "looking up cuMemGetAddressRange");
  return fn;
}

struct Imported {
  uint8_t* base = nullptr;
  int refs = 0;
};
std::mutex& ImportsMu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::map<IpcHandle, Imported>& ImportsTable() {
  static auto* table =
      new std::map<IpcHandle, Imported>();  // guarded by ImportsMu()
  return *table;
}

}  // namespace

bool Compiled() { return true; }

int DeviceCount(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) {
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")";
    }
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "the CUDA runtime sees no device";
  return n;
}

Status CheckLocation(const MemoryLocation& memory) {
  if (memory.kind == MemoryKind::kHost) return Status::Ok();
  if (memory.device < 0) {
    return InvalidArgument("CUDA device ordinal " +
                           std::to_string(memory.device) + " is negative");
  }
  std::string why;
  int n = DeviceCount(&why);
  if (n == 0)
    return FailedPrecondition(MemoryLocationName(memory) +
                              ": no CUDA device: " + why);
  if (memory.device >= n) {
    return FailedPrecondition(MemoryLocationName(memory) +
                              " does not exist: this process sees " +
                              std::to_string(n) + " CUDA device(s)");
  }
  return Status::Ok();
}

Status CheckDevicePointer(const void* ptr, uint64_t bytes, int device) {
  if (bytes == 0) return Status::Ok();
  const uint8_t* ends[2] = {static_cast<const uint8_t*>(ptr),
                            static_cast<const uint8_t*>(ptr) + bytes - 1};
  for (const uint8_t* p : ends) {
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state
      return FromCuda(e, "cudaPointerGetAttributes");
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
      return InvalidArgument("memory at " +
                             std::to_string(reinterpret_cast<uintptr_t>(p)) +
                             " is not CUDA device memory");
    }
    if (a.device != device) {
      return InvalidArgument("memory at " +
                             std::to_string(reinterpret_cast<uintptr_t>(p)) +
                             " is on cuda:" + std::to_string(a.device) +
                             ", not cuda:" + std::to_string(device));
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Stream>> Stream::Create(int device) {
  TH_RETURN_IF_ERROR(CheckLocation(MemoryLocation::Cuda(device)));
  TH_CUDA_RETURN(cudaSetDevice(device),
                 "cudaSetDevice(" + std::to_string(device) + ")");
  cudaStream_t s = nullptr;
  TH_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                 "cudaStreamCreate");
  return std::unique_ptr<Stream>(new StreamImpl(device, s));
}

namespace {
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, uint8_t* p, size_t n)
      : device_(device), p_(p), n_(n) {}
  ~CudaBuffer() override {
    cudaSetDevice(device_);
    cudaFree(p_);
  }
  uint8_t* data() const override { return p_; }
  size_t size() const override { return n_; }
  int device() const override { return device_; }

 private:
  const int device_;
  uint8_t* const p_;
  const size_t n_;
};
}  // namespace

Result<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(int device,
                                                             size_t bytes) {
  TH_RETURN_IF_ERROR(CheckLocation(MemoryLocation::Cuda(device)));
  TH_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  TH_CUDA_RETURN(cudaMalloc(&p, std::max<size_t>(bytes, 1)),
                 "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return std::unique_ptr<DeviceBuffer>(
      new CudaBuffer(device, static_cast<uint8_t*>(p), bytes));
}

PinnedPool& StagingPool() {
  // Never destroyed: buffers may be in use until exit, and freeing pinned
  // memory after the runtime shut down fails.
  static CudaPinnedPool* pool =
      new CudaPinnedPool(kStagingBufferBytes, kMaxStagingBuffers);
  return *pool;
}

Result<IpcExport> ExportIpc(const void* ptr, int device) {
  TH_ASSIGN_OR_RETURN(GetAddressRangeFn range, AddressRangeFn());
  TH_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return InvalidArgument("cuMemGetAddressRange failed (CUresult " +
                           std::to_string(r) + "): not device memory");
  }
  IpcExport out;
  cudaIpcMemHandle_t h;
  TH_CUDA_RETURN(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)),
                 "cudaIpcGetMemHandle");
  static_assert(sizeof(h) == sizeof(out.handle.bytes));
  std::memcpy(out.handle.bytes.data(), &h, sizeof(h));
  out.offset = reinterpret_cast<uint64_t>(ptr) - base;
  out.alloc_bytes = size;
  return out;
}

Result<uint8_t*> IpcImports::Open(const IpcHandle& handle, int device) {
  std::lock_guard<std::mutex> lock(ImportsMu());
  auto& table = ImportsTable();
  auto it = table.find(handle);
  if (it != table.end()) {
    ++it->second.refs;
    return it->second.base;
  }
  TH_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  void* p = nullptr;
  TH_CUDA_RETURN(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle");
  table[handle] = Imported{static_cast<uint8_t*>(p), 1};
  return static_cast<uint8_t*>(p);
}

void IpcImports::Close(const IpcHandle& handle) {
  std::lock_guard<std::mutex> lock(ImportsMu());
  auto& table = ImportsTable();
  auto it = table.find(handle);
  if (it == table.end()) return;
  if (--it->second.refs == 0) {
    cudaIpcCloseMemHandle(it->second.base);
    table.erase(it);
  }
}

}  // namespace tensorhub::cuda
