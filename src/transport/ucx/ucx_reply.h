// The UCX data plane's control frames that are not in wire/frame.h (they
// travel on the same authenticated TCP connection; docs/wire.md "UCX"),
// and the header of the active messages that carry a read's bytes:
//
//   hello   holder -> reader once, after the handshake:
//           u32 magic "THU3" | u32 address_len | the holder's host
//           identity (16-byte boot id | u64 pid-namespace inode | u64
//           net-namespace inode; all zero where unknown) | the holder's UCX
//           worker address (address_len bytes)
//   address reader -> holder once, after the hello: u32 address_len | the
//           reader's UCX worker address, to which the holder connects the
//           endpoint it sends a read's bytes on
//   grant   the body of an OK ResponseHeader to a ReadRequest: the holder
//           admitted the read and sends its bytes as active messages:
//           u64 read_id | u64 piece_bytes. Then the reader sends a Release
//           (wire/frame.h) once every byte is in.
//   piece   the header of each active message (UCX AM id kPieceAmId) with
//           bytes of a read: u64 read_id | u64 offset (into the read's
//           range). Piece i holds bytes [i x piece_bytes, ...) of the range,
//           piece_bytes of them (fewer only for the last), each exactly once.
//
// All little-endian. Pure encoding, no I/O. Decoders bound every count and
// length before they size anything, and return errors (never crash) on
// bytes from the network.
#ifndef TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/status.h"
#include "wire/frame.h"

namespace tensorhub::transport::ucx {

inline constexpr uint32_t kHelloMagic = 0x33554854;  // "THU3"
inline constexpr size_t kHelloHeaderBytes = 8 + 16 + 8 + 8;
inline constexpr uint32_t kMaxWorkerAddressBytes = 64 << 10;
// Active messages of one UCX worker are told apart by this id; the
// transport's workers install no handler for any other.
inline constexpr unsigned kPieceAmId = 7;
inline constexpr size_t kGrantBytes = 16;
inline constexpr size_t kPieceHeaderBytes = 16;
// The sizes of piece a holder may choose: a piece is at most one pinned
// staging buffer (cuda::kStagingBufferBytes), which a reader into device
// memory receives it in.
inline constexpr uint64_t kMinPieceBytes = 4 << 10;
inline constexpr uint64_t kMaxPieceBytes = 4 << 20;

// The holder's admission of one read.
struct Grant {
  uint64_t read_id = 0;
  uint64_t piece_bytes = 0;
  bool operator==(const Grant&) const = default;
};

// What each active message with a read's bytes says about them.
struct PieceHeader {
  uint64_t read_id = 0;
  uint64_t offset = 0;
  bool operator==(const PieceHeader&) const = default;
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

std::string EncodeGrant(const Grant& grant);
// Accepts exactly kGrantBytes with piece_bytes in [kMinPieceBytes,
// kMaxPieceBytes].
Result<Grant> DecodeGrant(const uint8_t* bytes, size_t size);

std::string EncodePieceHeader(const PieceHeader& header);
// Accepts exactly kPieceHeaderBytes.
Result<PieceHeader> DecodePieceHeader(const uint8_t* bytes, size_t size);

// The reader's worker address message: the length prefix, then the bytes.
std::string EncodeAddress(const std::string& address);
// The length prefix (4 bytes): 1..kMaxWorkerAddressBytes, else an error.
Result<uint32_t> DecodeAddressLength(const uint8_t* bytes, size_t size);

// Which piece of a read of `read_length` bytes, granted as `grant`, a
// piece of `length` bytes headed `header` is: its index, where it is the
// read's (read_id), begins at a piece boundary and holds exactly that
// piece's bytes; else DATA_LOSS saying what is wrong (the caller also
// refuses a piece whose index it has seen). Never reaches outside
// [0, read_length).
Result<uint64_t> PieceIndex(const Grant& grant, uint64_t read_length,
                            const PieceHeader& header, uint64_t length);

// The number of pieces of a read of `read_length` bytes (none for 0).
uint64_t PieceCount(uint64_t piece_bytes, uint64_t read_length);

}  // namespace tensorhub::transport::ucx

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
