// Value types shared by the public API: ids, versions, dtypes, tensor specs.
#ifndef TENSORHUB_TYPES_H_
#define TENSORHUB_TYPES_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub {

// A model version: unsigned 64-bit, strictly increasing per model. Version 0
// is never a real version; APIs use `Version::Latest()` to mean "the highest
// committed version".
class Version {
 public:
  constexpr Version() = default;
  constexpr explicit Version(uint64_t v) : value_(v) {}
  static constexpr Version Latest() { return Version(0); }
  constexpr bool is_latest() const { return value_ == 0; }
  constexpr uint64_t value() const { return value_; }
  auto operator<=>(const Version&) const = default;

 private:
  uint64_t value_ = 0;
};

// The hub-assigned identity of a connected worker, unique for the hub's life
// and stable across hub restarts (the worker reports it again).
class WorkerId {
 public:
  WorkerId() = default;
  explicit WorkerId(std::string v) : value_(std::move(v)) {}
  const std::string& value() const { return value_; }
  bool empty() const { return value_.empty(); }
  auto operator<=>(const WorkerId&) const = default;

 private:
  std::string value_;
};

// Element types, named as safetensors names them.
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kF8E4M3,
  kF8E5M2,
};

// "BF16", "F32", ... (the safetensors spelling).
std::string_view DTypeName(DType dtype);
Result<DType> ParseDType(std::string_view name);
size_t DTypeBytes(DType dtype);

// Name, element type and shape of one tensor.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;

  // Elements times element size; fails on overflow.
  Result<uint64_t> ByteSize() const;
  bool operator==(const TensorSpec&) const = default;
};

// Which memory a tensor lives in: host memory, or the global memory of a
// CUDA device (by ordinal, as cudaSetDevice numbers them in this process).
// Every transport accepts every kind; a build without CUDA, or a process
// that sees no such device, refuses kCuda with FAILED_PRECONDITION
// (INVALID_ARGUMENT for a negative ordinal).
enum class MemoryKind : uint8_t { kHost, kCuda };

struct MemoryLocation {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // the CUDA ordinal; ignored for kHost

  static constexpr MemoryLocation Host() { return {}; }
  static constexpr MemoryLocation Cuda(int device) {
    return {MemoryKind::kCuda, device};
  }
  constexpr bool is_host() const { return kind == MemoryKind::kHost; }
  bool operator==(const MemoryLocation& o) const {
    return kind == o.kind && (kind == MemoryKind::kHost || device == o.device);
  }
};

// "host", "cuda:0", ...
std::string MemoryLocationName(const MemoryLocation& memory);

// A tensor in caller-owned memory. TensorHub never frees `data`.
struct TensorRef {
  TensorSpec spec;
  void* data = nullptr;
  uint64_t bytes = 0;  // must equal spec.ByteSize()
  // Where `data` points. All tensors of one Publish (or one Fetch
  // destination) must be in the same memory.
  MemoryLocation memory;
};

// Where a worker runs. Used to prefer near sources (same host, then rack,
// then datacenter). Empty rack or host labels match nothing; workers with an
// empty datacenter label are all in one unnamed datacenter.
struct Labels {
  std::string datacenter;
  std::string rack;
  std::string host;
};

// A data-plane transport a worker serves besides TCP, and where: "ucx" and
// the TCP address of its UCX server. Every worker serves TCP at its data
// address; readers read over the first transport of their preference that
// the holder lists, else over TCP (docs/design.md, "Transport per peer").
struct DataEndpoint {
  std::string transport;
  std::string address;
  bool operator==(const DataEndpoint&) const = default;
};

enum class WorkerClass : uint8_t { kReliable, kSpot };

enum class VersionState : uint8_t {
  kPending,      // some ranks of the trainer group have not published yet
  kCommitted,    // all ranks published; readable
  kAborted,      // the group died before commit; never readable
  kUnavailable,  // committed, but no live holder is left
};
std::string_view VersionStateName(VersionState state);

}  // namespace tensorhub

#endif  // TENSORHUB_TYPES_H_
