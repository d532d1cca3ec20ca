#include "transport/ucx/ucx_reply.h"

namespace tensorhub::transport::ucx {
namespace {

template <typename T>
void Put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

// Reads little-endian values, never past the end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    if (n_ - at_ < sizeof(T)) return false;
    T x = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      x |= static_cast<T>(p_[at_ + i]) << (8 * i);
    }
    at_ += sizeof(T);
    *v = x;
    return true;
  }
  size_t left() const { return n_ - at_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

}  // namespace

std::string EncodeHelloHeader(uint32_t address_len) {
  std::string out;
  Put<uint32_t>(out, kHelloMagic);
  Put<uint32_t>(out, address_len);
  return out;
}

Result<uint32_t> DecodeHelloHeader(const uint8_t* bytes, size_t size) {
  Reader r(bytes, size);
  uint32_t magic = 0, len = 0;
  if (!r.Get(&magic) || !r.Get(&len)) return DataLoss("short UCX hello");
  if (magic != kHelloMagic) {
    return DataLoss("not a TensorHub UCX data server (bad hello)");
  }
  if (len == 0 || len > kMaxWorkerAddressBytes) {
    return DataLoss("UCX worker address of " + std::to_string(len) +
                    " bytes (1.." + std::to_string(kMaxWorkerAddressBytes) +
                    " allowed)");
  }
  return len;
}

std::string EncodeReady(uint32_t address_len) {
  std::string out;
  Put<uint32_t>(out, kReadyMagic);
  Put<uint32_t>(out, address_len);
  return out;
}

Result<uint32_t> DecodeReady(const uint8_t* bytes, size_t size) {
  Reader r(bytes, size);
  uint32_t magic = 0, len = 0;
  if (!r.Get(&magic) || !r.Get(&len)) return DataLoss("short UCX ready");
  if (magic != kReadyMagic) {
    return DataLoss("not a TensorHub UCX data server (bad ready frame)");
  }
  if (len == 0 || len > kMaxWorkerAddressBytes) {
    return DataLoss("UCX ready frame names a worker address of " +
                    std::to_string(len) + " bytes");
  }
  return len;
}

std::string EncodePlan(const std::vector<uint64_t>& lengths) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(lengths.size()));
  for (uint64_t n : lengths) Put<uint64_t>(out, n);
  return out;
}

Result<std::vector<uint64_t>> DecodePlan(const uint8_t* bytes, size_t size,
                                         uint64_t expected_length) {
  if (size > kMaxPlanBytes) return DataLoss("UCX plan too large");
  Reader r(bytes, size);
  uint32_t n = 0;
  if (!r.Get(&n)) return DataLoss("short UCX plan");
  if (n == 0 || n > kMaxMessages) {
    return DataLoss("UCX plan of " + std::to_string(n) + " messages");
  }
  if (r.left() != static_cast<size_t>(n) * 8) {
    return DataLoss("UCX plan lengths do not fill the frame");
  }
  std::vector<uint64_t> lengths(n);
  uint64_t total = 0;
  for (uint64_t& len : lengths) {
    (void)r.Get(&len);
    if (len == 0 || len > kMaxMessageBytes) {
      return DataLoss("UCX plan with a message of " + std::to_string(len) +
                      " bytes");
    }
    if (len > expected_length - total) {
      return DataLoss("UCX plan messages exceed the read");
    }
    total += len;
  }
  if (total != expected_length) {
    return DataLoss("UCX plan messages cover " + std::to_string(total) +
                    " bytes of a read of " + std::to_string(expected_length));
  }
  return lengths;
}

}  // namespace tensorhub::transport::ucx
