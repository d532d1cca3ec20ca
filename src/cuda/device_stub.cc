// device.h for a build without CUDA (TH_CUDA=OFF): host memory only.
#include "cuda/device.h"

namespace tensorhub::cuda {
namespace {

constexpr const char* kNoCuda =
    "this TensorHub was built without CUDA (TH_CUDA=OFF); only host memory "
    "can be published or fetched";

class NoPool final : public PinnedPool {
 public:
  size_t buffer_bytes() const override { return kStagingBufferBytes; }
  Result<Lease> Acquire(size_t, const Deadline&) override {
    return FailedPrecondition(kNoCuda);
  }

 protected:
  void Release(std::vector<uint8_t*>) override {}
};

}  // namespace

bool Compiled() { return false; }

int DeviceCount(std::string* why) {
  if (why != nullptr) *why = kNoCuda;
  return 0;
}

Status CheckLocation(const MemoryLocation& memory) {
  if (memory.kind == MemoryKind::kHost) return Status::Ok();
  if (memory.device < 0) {
    return InvalidArgument("CUDA device ordinal " +
                           std::to_string(memory.device) + " is negative");
  }
  return FailedPrecondition(MemoryLocationName(memory) + ": " + kNoCuda);
}

Status CheckDevicePointer(const void*, uint64_t, int) {
  return FailedPrecondition(kNoCuda);
}

Result<std::unique_ptr<Stream>> Stream::Create(int) {
  return FailedPrecondition(kNoCuda);
}

Result<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(int, size_t) {
  return FailedPrecondition(kNoCuda);
}

PinnedPool& StagingPool() {
  static NoPool* pool = new NoPool();  // never destroyed: used until exit
  return *pool;
}

Result<IpcExport> ExportIpc(const void*, int) {
  return FailedPrecondition(kNoCuda);
}

Result<uint8_t*> IpcImports::Open(const IpcHandle&, int) {
  return FailedPrecondition(kNoCuda);
}

void IpcImports::Close(const IpcHandle&) {}

}  // namespace tensorhub::cuda
