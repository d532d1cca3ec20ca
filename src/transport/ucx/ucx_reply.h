// The UCX data plane's control frames that are not in wire/frame.h (they
// travel on the same authenticated TCP connection; docs/wire.md "UCX"):
//
//   hello   holder -> reader once, after the handshake:
//           u32 magic "THU2" | u32 address_len | the holder's host
//           identity (16-byte boot id | u64 pid-namespace inode | u64
//           net-namespace inode; all zero where unknown) | the holder's UCX
//           worker address (address_len bytes)
//   reply   the body of an OK ResponseHeader to a ReadRequest: where the
//           range lies in the holder's registered memory and the remote
//           keys to read it with (RMA get), then the reader sends a Release
//           (wire/frame.h) once the bytes are in. Little-endian:
//           u32 key_count | u32 piece_count |
//           key_count x (u64 key_id | u32 rkey_len | rkey bytes) |
//           piece_count x (u64 address | u64 length | u32 key_index)
//
// Pure encoding, no I/O. Decoders bound every count and length before they
// size anything, and return errors (never crash) on bytes from the network.
#ifndef TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/status.h"
#include "wire/frame.h"

namespace tensorhub::transport::ucx {

inline constexpr uint32_t kHelloMagic = 0x32554854;  // "THU2"
inline constexpr size_t kHelloHeaderBytes = 8 + 16 + 8 + 8;
inline constexpr uint32_t kMaxWorkerAddressBytes = 64 << 10;
inline constexpr uint32_t kMaxRmaKeys = 4096;
inline constexpr uint32_t kMaxRkeyBytes = 16 << 10;
inline constexpr uint32_t kMaxRmaPieces = 65536;
inline constexpr size_t kMaxRmaReplyBytes = 8 << 20;

// One registration's remote key. `id` names the registration for the
// life of the holder process (the reader caches unpacked keys by it).
struct RmaKey {
  uint64_t id = 0;
  std::string packed;
  bool operator==(const RmaKey&) const = default;
};

struct RmaPiece {
  uint64_t address = 0;  // in the holder's address space
  uint64_t length = 0;
  uint32_t key = 0;  // index into RmaReply::keys
  bool operator==(const RmaPiece&) const = default;
};

struct RmaReply {
  std::vector<RmaKey> keys;
  std::vector<RmaPiece> pieces;
  bool operator==(const RmaReply&) const = default;
};

// What the hello's fixed part says.
struct Hello {
  uint32_t address_len = 0;
  wire::HostIdentity host;  // all zero: the holder could not read its own
};

std::string EncodeHelloHeader(uint32_t address_len,
                              const wire::HostIdentity& host);
// Rejects a wrong magic (a holder of an older build sent "THU1": the
// message says to upgrade it) or an address length over the bound. An
// address length of 0 is the holder saying it has no worker for this
// connection: FAILED_PRECONDITION, which moves the reader to TCP.
Result<Hello> DecodeHelloHeader(const uint8_t* bytes, size_t size);

std::string EncodeRmaReply(const RmaReply& reply);
// Accepts only 1..kMaxRmaKeys keys of 1..kMaxRkeyBytes, 1..kMaxRmaPieces
// non-empty pieces naming existing keys, whose lengths add up to exactly
// `expected_length`, and nothing after them.
Result<RmaReply> DecodeRmaReply(const uint8_t* bytes, size_t size,
                                uint64_t expected_length);

}  // namespace tensorhub::transport::ucx

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
