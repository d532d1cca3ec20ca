#include "tensorhub/types.h"

#include <array>

namespace tensorhub {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t bytes;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},
    {DType::kU64, "U64", 8},
    {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
}};

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

size_t DTypeBytes(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.bytes;
  }
  return 0;
}

Result<uint64_t> TensorSpec::ByteSize() const {
  uint64_t n = DTypeBytes(dtype);
  if (n == 0) return InvalidArgument("tensor '" + name + "': bad dtype");
  // The product of the non-zero dimensions must fit, whatever their order
  // and whether some dimension is 0: a shape is valid or not by itself, not
  // by where its zero happens to stand.
  bool empty = false;
  for (uint64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (n > UINT64_MAX / d) {
      return InvalidArgument("tensor '" + name +
                             "': byte size overflows 64 bits");
    }
    n *= d;
  }
  return empty ? 0 : n;
}

std::string_view VersionStateName(VersionState state) {
  switch (state) {
    case VersionState::kPending:
      return "PENDING";
    case VersionState::kCommitted:
      return "COMMITTED";
    case VersionState::kAborted:
      return "ABORTED";
    case VersionState::kUnavailable:
      return "UNAVAILABLE";
  }
  return "?";
}

}  // namespace tensorhub
