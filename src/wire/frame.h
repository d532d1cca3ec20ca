// Data-plane frames: a reader asks a holder for a byte range of one part of a
// version; the holder answers with a status and the bytes. Encoding only, no
// I/O. All integers little-endian. See docs/wire.md.
//
//   ReadRequest  (48 bytes, then `model_len` bytes of model name, then, if
//                 flags has kRequestFlagStrided, u64 run | u64 stride, then,
//                 if flags has kRequestFlagLocal, 32 bytes of HostIdentity)
//     u32 magic 'THQ1' | u16 model_len | u16 flags | u64 version |
//     u64 epoch | u32 part | u32 reserved(0) | u64 offset | u64 length
//   ReadResponse (24 bytes, then `message_len` bytes, then `payload_len`)
//     u32 magic 'THP1' | u8 status | u8 flags | u16 message_len |
//     u64 payload_len | u64 reserved(0)
//   With kResponseFlagLocal the payload is a LocalReply (the holder's pid and
//   where the bytes are in its memory) instead of the bytes:
//     u32 magic 'THL1' | u32 pid | u32 piece_count | u32 reserved(0) |
//     piece_count x (u64 address | u64 length)
//   The reader then copies them (process_vm_readv) and sends a Release:
//     u32 magic 'THR1' | u32 outcome (0 copied, 1 not copied) | u64 reserved(0)
//   A request with kRequestFlagCudaIpc (instead of kRequestFlagLocal; the
//   identity follows the name the same way) asks, for bytes in CUDA device
//   memory, for a CudaIpcReply (kResponseFlagCudaIpc): where the bytes are
//   as CUDA IPC handles, which the reader opens and copies device to
//   device, then Releases as above:
//     u32 magic 'THG1' | u32 pid | u32 piece_count | u32 reserved(0) |
//     piece_count x (64-byte cudaIpcMemHandle | u64 offset in the
//                    allocation | u64 length | u64 address in the holder)
//
// Decoders never trust a length: each is bounded before anything is sized
// from it.
#ifndef TENSORHUB_WIRE_FRAME_H_
#define TENSORHUB_WIRE_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub::wire {

inline constexpr uint32_t kRequestMagic = 0x31514854;   // "THQ1"
inline constexpr uint32_t kResponseMagic = 0x31504854;  // "THP1"
inline constexpr size_t kRequestHeaderBytes = 48;
inline constexpr size_t kResponseHeaderBytes = 24;
inline constexpr size_t kMaxModelNameBytes = 256;
inline constexpr size_t kMaxMessageBytes = 1024;
inline constexpr uint64_t kMaxReadBytes = 1ull << 30;

// Reserved part numbers (docs/wire.md, "Reserved part numbers"). A
// ReadRequest's `part` is a trainer rank's part (below 4096, the largest
// group a manifest may have) or one of these:
//   kManifestPart     the version's whole manifest, encoded as the hub
//                     encodes it (EncodeManifest, offsets into it), from a
//                     holder of the whole version: what a reader the hub
//                     named the manifest to by its SHA-256 reads and checks.
//   kSliceHolderPart  a holder of slices' own layout (the boxes it
//                     registered with the hub, packed); offsets are in it.
inline constexpr uint32_t kManifestPart = 0xFFFFFFFEu;
inline constexpr uint32_t kSliceHolderPart = 0xFFFFFFFFu;

// Intra-host reads by cross-memory attach.
inline constexpr uint16_t kRequestFlagLocal = 0x0001;
inline constexpr uint8_t kResponseFlagLocal = 0x01;
inline constexpr uint32_t kLocalReplyMagic = 0x314C4854;  // "THL1"
inline constexpr uint32_t kReleaseMagic = 0x31524854;     // "THR1"
inline constexpr size_t kHostIdentityBytes = 32;
inline constexpr size_t kLocalReplyHeaderBytes = 16;
inline constexpr size_t kLocalPieceBytes = 16;
inline constexpr size_t kMaxLocalPieces = 65536;
inline constexpr size_t kMaxLocalReplyBytes =
    kLocalReplyHeaderBytes + kMaxLocalPieces * kLocalPieceBytes;
inline constexpr size_t kReleaseBytes = 16;

// Strided reads: 16 bytes after the model name (before a host identity):
// u64 run | u64 stride. length must be a multiple of run, stride >= run,
// at most kMaxStridedRuns runs.
inline constexpr uint16_t kRequestFlagStrided = 0x0004;
inline constexpr size_t kStrideBytes = 16;
inline constexpr uint64_t kMaxStridedRuns = 1u << 16;

// Intra-host reads of device memory by CUDA IPC.
inline constexpr uint16_t kRequestFlagCudaIpc = 0x0002;
inline constexpr uint8_t kResponseFlagCudaIpc = 0x02;
inline constexpr uint32_t kCudaIpcReplyMagic = 0x31474854;  // "THG1"
inline constexpr size_t kCudaIpcHandleBytes = 64;
inline constexpr size_t kCudaIpcPieceBytes = kCudaIpcHandleBytes + 24;
inline constexpr size_t kMaxCudaIpcPieces = 4096;
inline constexpr size_t kMaxCudaIpcReplyBytes =
    kLocalReplyHeaderBytes + kMaxCudaIpcPieces * kCudaIpcPieceBytes;

// Which kernel, pid namespace and network namespace a process lives in. Two
// processes with equal identities can address each other by pid, and are
// one "host" for routing (network namespaces that emulate separate hosts
// stay separate).
struct HostIdentity {
  std::array<uint8_t, 16> boot_id{};
  uint64_t pid_ns = 0;  // inode of /proc/self/ns/pid
  uint64_t net_ns = 0;  // inode of /proc/self/ns/net
  bool operator==(const HostIdentity&) const = default;
};

struct ReadRequest {
  std::string model;
  uint64_t version = 0;
  uint64_t epoch = 0;
  uint32_t part = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // bytes in all
  // Strided (kRequestFlagStrided; run 0: one contiguous range): length /
  // run runs of `run` bytes, run i at offset + i * stride. A column slice
  // of a row-major matrix is one such request, not one per row.
  uint64_t run = 0;
  uint64_t stride = 0;
  uint64_t runs() const { return run == 0 ? 1 : length / run; }
  // One past the last byte the request touches.
  uint64_t span_end() const {
    return run == 0 ? offset + length : offset + (runs() - 1) * stride + run;
  }
};

struct ResponseHeader {
  StatusCode status = StatusCode::kOk;
  uint16_t message_len = 0;
  uint64_t payload_len = 0;
  // kResponseFlagLocal: the payload is a LocalReply, not the bytes.
  bool local = false;
  // kResponseFlagCudaIpc: the payload is a CudaIpcReply.
  bool cuda_ipc = false;
};

struct LocalPiece {
  uint64_t address = 0;  // in the holder's address space
  uint64_t length = 0;
  bool operator==(const LocalPiece&) const = default;
};

struct LocalReply {
  uint32_t pid = 0;
  std::vector<LocalPiece> pieces;  // in the order of the requested range
};

struct CudaIpcPiece {
  std::array<uint8_t, kCudaIpcHandleBytes> handle{};
  uint64_t offset = 0;  // inside the allocation the handle names
  uint64_t length = 0;
  uint64_t address = 0;  // in the holder's address space (same-process reads)
  bool operator==(const CudaIpcPiece&) const = default;
};

struct CudaIpcReply {
  uint32_t pid = 0;
  std::vector<CudaIpcPiece> pieces;  // in the order of the requested range
};

enum class ReleaseOutcome : uint32_t { kCopied = 0, kNotCopied = 1 };

// Header and model name, ready to send. With `local` (the reader's
// identity) the request has kRequestFlagLocal and the identity follows the
// name: the reader is willing to copy the bytes itself from the holder's
// memory if the holder has the same identity.
// With `cuda_ipc` (requires `local`) the flag is kRequestFlagCudaIpc instead
// of kRequestFlagLocal: the reader wants device memory shared by CUDA IPC,
// and bytes over the connection otherwise.
std::string EncodeReadRequest(const ReadRequest& req,
                              const HostIdentity* local = nullptr,
                              bool cuda_ipc = false);
// Decodes the fixed header; fills everything but `model` and returns the
// model name's length, which the caller reads next. A caller that handles
// local reads passes `local`: it is set when kRequestFlagLocal is, and then
// kHostIdentityBytes follow the name (decode them with DecodeHostIdentity).
// Without `local` the flag is refused like any unknown flag. Likewise
// `cuda_ipc` for kRequestFlagCudaIpc (the identity follows then too); a
// request may not carry both flags. A caller that handles strided reads
// passes `strided`: set when kRequestFlagStrided is; kStrideBytes then
// follow the name (DecodeStride).
Result<size_t> DecodeReadRequestHeader(const uint8_t* bytes, size_t size,
                                       ReadRequest* out, bool* local = nullptr,
                                       bool* cuda_ipc = nullptr,
                                       bool* strided = nullptr);
// Fills req->run and req->stride and checks them against req->length.
Status DecodeStride(const uint8_t* bytes, size_t size, ReadRequest* req);
Result<HostIdentity> DecodeHostIdentity(const uint8_t* bytes, size_t size);

// The body of a local response; its size is the header's payload_len.
std::string EncodeLocalReply(const LocalReply& reply);
// Accepts only a reply whose pieces are 1..kMaxLocalPieces non-empty,
// non-wrapping ranges that add up to exactly `read_length`.
Result<LocalReply> DecodeLocalReply(const uint8_t* bytes, size_t size,
                                    uint64_t read_length);

// The body of a CUDA IPC response; its size is the header's payload_len.
std::string EncodeCudaIpcReply(const CudaIpcReply& reply);
// Accepts only 1..kMaxCudaIpcPieces non-empty pieces whose offsets and
// addresses do not wrap and whose lengths add up to exactly `read_length`.
Result<CudaIpcReply> DecodeCudaIpcReply(const uint8_t* bytes, size_t size,
                                        uint64_t read_length);

std::array<uint8_t, kReleaseBytes> EncodeRelease(ReleaseOutcome outcome);
Result<ReleaseOutcome> DecodeRelease(const uint8_t* bytes, size_t size);

std::array<uint8_t, kResponseHeaderBytes> EncodeResponseHeader(
    const ResponseHeader& h);
// A local header is accepted only with status OK, no message and a
// payload_len that a LocalReply of 1..kMaxLocalPieces pieces can have.
Result<ResponseHeader> DecodeResponseHeader(const uint8_t* bytes, size_t size);

// Connection handshake (every data-plane connection, before any request):
//   Challenge (holder -> reader, 40 bytes): u32 magic 'THC1' | u32 version(1)
//     | 32-byte random nonce
//   Proof     (reader -> holder, 36 bytes): u32 magic 'THA1'
//     | 32-byte HMAC-SHA256(shared secret, "tensorhub-data-v1" || nonce)
//   Verdict   (holder -> reader, 8 bytes):  u32 magic 'THV1' | u8 status
//     (OK or PERMISSION_DENIED) | 3 bytes 0
// Without a configured secret both ends use the empty key, so a holder that
// requires a secret refuses a reader without one, and the other way round.
//   StartTls  (holder -> reader, 40 bytes): u32 magic 'THT1' | u32 version(1)
//     | 32 bytes 0. Sent instead of the Challenge by a holder with data-plane
//     TLS: the reader runs a TLS handshake (as the client), and Challenge,
//     Proof and Verdict follow inside TLS. As long as a Challenge, so that a
//     reader without TLS reads it whole and refuses at once (it does not
//     wait for bytes that never come); a reader with TLS refuses a
//     Challenge (no downgrade).
inline constexpr uint32_t kChallengeMagic = 0x31434854;  // "THC1"
inline constexpr uint32_t kStartTlsMagic = 0x31544854;   // "THT1"
inline constexpr uint32_t kProofMagic = 0x31414854;      // "THA1"
inline constexpr uint32_t kVerdictMagic = 0x31564854;    // "THV1"
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kChallengeBytes = 8 + kNonceBytes;
inline constexpr size_t kProofBytes = 4 + kMacBytes;
inline constexpr size_t kVerdictBytes = 8;

// The constants above are tied to the layouts written at the top of this
// file and in docs/wire.md: a change to one that forgets the other does not
// compile.
namespace layout {
// The little-endian u32 whose bytes are the four characters of `tag`.
constexpr uint32_t Magic(const char (&tag)[5]) {
  return static_cast<uint32_t>(static_cast<uint8_t>(tag[0])) |
         static_cast<uint32_t>(static_cast<uint8_t>(tag[1])) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(tag[2])) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(tag[3])) << 24;
}
inline constexpr size_t kU8 = 1, kU16 = 2, kU32 = 4, kU64 = 8;
}  // namespace layout
static_assert(kRequestMagic == layout::Magic("THQ1"));
static_assert(kResponseMagic == layout::Magic("THP1"));
static_assert(kLocalReplyMagic == layout::Magic("THL1"));
static_assert(kReleaseMagic == layout::Magic("THR1"));
static_assert(kCudaIpcReplyMagic == layout::Magic("THG1"));
static_assert(kChallengeMagic == layout::Magic("THC1"));
static_assert(kStartTlsMagic == layout::Magic("THT1"));
static_assert(kProofMagic == layout::Magic("THA1"));
static_assert(kVerdictMagic == layout::Magic("THV1"));
// magic | model_len | flags | version | epoch | part | reserved | offset |
// length
static_assert(kRequestHeaderBytes == layout::kU32 + 2 * layout::kU16 +
                                         2 * layout::kU64 + 2 * layout::kU32 +
                                         2 * layout::kU64);
// magic | status | flags | message_len | payload_len | reserved
static_assert(kResponseHeaderBytes ==
              layout::kU32 + 2 * layout::kU8 + layout::kU16 + 2 * layout::kU64);
// magic | pid | piece_count | reserved, then pieces of address | length
static_assert(kLocalReplyHeaderBytes == 4 * layout::kU32);
static_assert(kLocalPieceBytes == 2 * layout::kU64);
// magic | outcome | reserved
static_assert(kReleaseBytes == 2 * layout::kU32 + layout::kU64);
// handle | offset | length | address
static_assert(kCudaIpcPieceBytes == kCudaIpcHandleBytes + 3 * layout::kU64);
// magic | version | nonce;  magic | mac;  magic | status | 3 zero bytes
static_assert(kChallengeBytes == 2 * layout::kU32 + kNonceBytes);
static_assert(kProofBytes == layout::kU32 + kMacBytes);
static_assert(kVerdictBytes == layout::kU32 + 4 * layout::kU8);
// Every reply fits the largest read a request may ask for.
static_assert(kMaxLocalReplyBytes <= kMaxReadBytes);
static_assert(kMaxCudaIpcReplyBytes <= kMaxReadBytes);
static_assert(kMaxModelNameBytes <= UINT16_MAX);  // model_len is a u16
static_assert(kMaxMessageBytes <= UINT16_MAX);    // message_len is a u16

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

std::array<uint8_t, kChallengeBytes> EncodeChallenge(const Nonce& nonce);
Result<Nonce> DecodeChallenge(const uint8_t* bytes, size_t size);
std::array<uint8_t, kChallengeBytes> EncodeStartTls();
// The holder's first frame: a Challenge (its nonce), or StartTls.
struct HolderHello {
  bool start_tls = false;
  Nonce nonce{};  // of a Challenge
};
Result<HolderHello> DecodeHolderHello(const uint8_t* bytes, size_t size);
std::array<uint8_t, kProofBytes> EncodeProof(const Mac& mac);
Result<Mac> DecodeProof(const uint8_t* bytes, size_t size);
std::array<uint8_t, kVerdictBytes> EncodeVerdict(StatusCode status);
// Returns the verdict's status code (OK or PERMISSION_DENIED).
Result<StatusCode> DecodeVerdict(const uint8_t* bytes, size_t size);

}  // namespace tensorhub::wire

#endif  // TENSORHUB_WIRE_FRAME_H_
