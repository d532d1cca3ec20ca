#include "transport/ucx/ucx_reply.h"

#include <algorithm>

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
  bool Bytes(size_t len, std::string* out) {
    if (n_ - at_ < len) return false;
    out->assign(reinterpret_cast<const char*>(p_ + at_), len);
    at_ += len;
    return true;
  }
  size_t left() const { return n_ - at_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

}  // namespace

std::string EncodeHelloHeader(uint32_t address_len,
                              const wire::HostIdentity& host) {
  std::string out;
  Put<uint32_t>(out, kHelloMagic);
  Put<uint32_t>(out, address_len);
  out.append(reinterpret_cast<const char*>(host.boot_id.data()),
             host.boot_id.size());
  Put<uint64_t>(out, host.pid_ns);
  Put<uint64_t>(out, host.net_ns);
  return out;
}

Result<Hello> DecodeHelloHeader(const uint8_t* bytes, size_t size) {
  Reader r(bytes, size);
  uint32_t magic = 0;
  Hello h;
  std::string boot;
  if (!r.Get(&magic)) return DataLoss("short UCX hello");
  if (magic == 0x31554854 || magic == 0x32554854) {  // "THU1", "THU2"
    return FailedPrecondition(
        "the holder runs an older TensorHub build (UCX hello THU" +
        std::string(magic == 0x31554854 ? "1" : "2") +
        ", whose reads use UCX gets): upgrade it, or read it over tcp");
  }
  if (magic != kHelloMagic) {
    return DataLoss("not a TensorHub UCX data server (bad hello)");
  }
  if (!r.Get(&h.address_len) || !r.Bytes(h.host.boot_id.size(), &boot) ||
      !r.Get(&h.host.pid_ns) || !r.Get(&h.host.net_ns)) {
    return DataLoss("short UCX hello");
  }
  std::copy(boot.begin(), boot.end(), h.host.boot_id.begin());
  if (h.address_len == 0) {
    return FailedPrecondition(
        "the holder could make no UCX worker for this connection (out of "
        "descriptors or memory; its log says which): read it over tcp");
  }
  if (h.address_len > kMaxWorkerAddressBytes) {
    return DataLoss("UCX worker address of " + std::to_string(h.address_len) +
                    " bytes (at most " +
                    std::to_string(kMaxWorkerAddressBytes) + " allowed)");
  }
  return h;
}

std::string EncodeGrant(const Grant& grant) {
  std::string out;
  Put<uint64_t>(out, grant.read_id);
  Put<uint64_t>(out, grant.piece_bytes);
  return out;
}

Result<Grant> DecodeGrant(const uint8_t* bytes, size_t size) {
  if (size != kGrantBytes) {
    return DataLoss("UCX grant of " + std::to_string(size) + " bytes, not " +
                    std::to_string(kGrantBytes));
  }
  Reader r(bytes, size);
  Grant g;
  (void)r.Get(&g.read_id);
  (void)r.Get(&g.piece_bytes);
  if (g.piece_bytes < kMinPieceBytes || g.piece_bytes > kMaxPieceBytes) {
    return DataLoss("UCX grant with pieces of " +
                    std::to_string(g.piece_bytes) + " bytes (" +
                    std::to_string(kMinPieceBytes) + ".." +
                    std::to_string(kMaxPieceBytes) + " allowed)");
  }
  return g;
}

std::string EncodePieceHeader(const PieceHeader& header) {
  std::string out;
  Put<uint64_t>(out, header.read_id);
  Put<uint64_t>(out, header.offset);
  return out;
}

Result<PieceHeader> DecodePieceHeader(const uint8_t* bytes, size_t size) {
  if (bytes == nullptr || size != kPieceHeaderBytes) {
    return DataLoss("UCX piece header of " + std::to_string(size) +
                    " bytes, not " + std::to_string(kPieceHeaderBytes));
  }
  Reader r(bytes, size);
  PieceHeader h;
  (void)r.Get(&h.read_id);
  (void)r.Get(&h.offset);
  return h;
}

std::string EncodeAddress(const std::string& address) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(address.size()));
  out += address;
  return out;
}

Result<uint32_t> DecodeAddressLength(const uint8_t* bytes, size_t size) {
  Reader r(bytes, size);
  uint32_t len = 0;
  if (size != 4 || !r.Get(&len)) return DataLoss("short UCX address");
  if (len == 0 || len > kMaxWorkerAddressBytes) {
    return DataLoss("UCX worker address of " + std::to_string(len) +
                    " bytes (1.." + std::to_string(kMaxWorkerAddressBytes) +
                    " allowed)");
  }
  return len;
}

uint64_t PieceCount(uint64_t piece_bytes, uint64_t read_length) {
  if (read_length == 0) return 0;
  return (read_length - 1) / piece_bytes + 1;
}

Result<uint64_t> PieceIndex(const Grant& grant, uint64_t read_length,
                            const PieceHeader& header, uint64_t length) {
  if (header.read_id != grant.read_id) {
    return DataLoss("a piece of read " + std::to_string(header.read_id) +
                    ", not of the read in flight (" +
                    std::to_string(grant.read_id) + ")");
  }
  if (header.offset >= read_length) {
    return DataLoss("a piece at offset " + std::to_string(header.offset) +
                    " of a read of " + std::to_string(read_length) + " bytes");
  }
  if (header.offset % grant.piece_bytes != 0) {
    return DataLoss("a piece at offset " + std::to_string(header.offset) +
                    ", not at a boundary of its " +
                    std::to_string(grant.piece_bytes) + "-byte pieces");
  }
  const uint64_t want =
      std::min(grant.piece_bytes, read_length - header.offset);
  if (length != want) {
    return DataLoss("a piece of " + std::to_string(length) +
                    " bytes at offset " + std::to_string(header.offset) +
                    " (its piece holds " + std::to_string(want) + ")");
  }
  return header.offset / grant.piece_bytes;
}

}  // namespace tensorhub::transport::ucx
