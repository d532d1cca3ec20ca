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
  if (magic == 0x31554854) {  // "THU1"
    return FailedPrecondition(
        "the holder runs a TensorHub build from before 2026-11-25 (UCX hello "
        "THU1, without its host identity): upgrade it, or read it over tcp");
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

std::string EncodeRmaReply(const RmaReply& reply) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(reply.keys.size()));
  Put<uint32_t>(out, static_cast<uint32_t>(reply.pieces.size()));
  for (const RmaKey& k : reply.keys) {
    Put<uint64_t>(out, k.id);
    Put<uint32_t>(out, static_cast<uint32_t>(k.packed.size()));
    out.append(k.packed);
  }
  for (const RmaPiece& p : reply.pieces) {
    Put<uint64_t>(out, p.address);
    Put<uint64_t>(out, p.length);
    Put<uint32_t>(out, p.key);
  }
  return out;
}

Result<RmaReply> DecodeRmaReply(const uint8_t* bytes, size_t size,
                                uint64_t expected_length) {
  if (size > kMaxRmaReplyBytes) return DataLoss("UCX reply too large");
  Reader r(bytes, size);
  uint32_t nkeys = 0, npieces = 0;
  if (!r.Get(&nkeys) || !r.Get(&npieces)) return DataLoss("short UCX reply");
  if (nkeys == 0 || nkeys > kMaxRmaKeys) {
    return DataLoss("UCX reply with " + std::to_string(nkeys) + " keys");
  }
  if (npieces == 0 || npieces > kMaxRmaPieces) {
    return DataLoss("UCX reply with " + std::to_string(npieces) + " pieces");
  }
  RmaReply reply;
  reply.keys.resize(nkeys);
  for (RmaKey& k : reply.keys) {
    uint32_t len = 0;
    if (!r.Get(&k.id) || !r.Get(&len)) return DataLoss("short UCX reply key");
    if (len == 0 || len > kMaxRkeyBytes) {
      return DataLoss("UCX remote key of " + std::to_string(len) + " bytes");
    }
    if (!r.Bytes(len, &k.packed)) return DataLoss("short UCX remote key");
  }
  if (r.left() != static_cast<size_t>(npieces) * 20) {
    return DataLoss("UCX reply pieces do not fill the frame");
  }
  reply.pieces.resize(npieces);
  uint64_t total = 0;
  for (RmaPiece& p : reply.pieces) {
    (void)r.Get(&p.address);
    (void)r.Get(&p.length);
    (void)r.Get(&p.key);
    if (p.length == 0 || p.key >= nkeys) {
      return DataLoss("UCX reply with an empty piece or an unknown key");
    }
    if (p.address + p.length < p.address) {
      return DataLoss("UCX reply piece wraps the address space");
    }
    if (p.length > expected_length - total) {
      return DataLoss("UCX reply pieces exceed the read");
    }
    total += p.length;
  }
  if (total != expected_length) {
    return DataLoss("UCX reply pieces cover " + std::to_string(total) +
                    " bytes of a read of " + std::to_string(expected_length));
  }
  return reply;
}

}  // namespace tensorhub::transport::ucx
