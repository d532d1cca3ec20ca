// Data-plane frames: a reader asks a holder for a byte range of one part of a
// version; the holder answers with a status and the bytes. Encoding only, no
// I/O. All integers little-endian. See docs/wire.md.
//
//   ReadRequest  (48 bytes, then `model_len` bytes of model name)
//     u32 magic 'THQ1' | u16 model_len | u16 flags(0) | u64 version |
//     u64 epoch | u32 part | u32 reserved(0) | u64 offset | u64 length
//   ReadResponse (24 bytes, then `message_len` bytes, then `payload_len`)
//     u32 magic 'THP1' | u8 status | u8 reserved | u16 message_len |
//     u64 payload_len | u64 reserved(0)
//
// Decoders never trust a length: each is bounded before anything is sized
// from it.
#ifndef TENSORHUB_WIRE_FRAME_H_
#define TENSORHUB_WIRE_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorhub/status.h"

namespace tensorhub::wire {

inline constexpr uint32_t kRequestMagic = 0x31514854;   // "THQ1"
inline constexpr uint32_t kResponseMagic = 0x31504854;  // "THP1"
inline constexpr size_t kRequestHeaderBytes = 48;
inline constexpr size_t kResponseHeaderBytes = 24;
inline constexpr size_t kMaxModelNameBytes = 256;
inline constexpr size_t kMaxMessageBytes = 1024;
inline constexpr uint64_t kMaxReadBytes = 1ull << 30;

struct ReadRequest {
  std::string model;
  uint64_t version = 0;
  uint64_t epoch = 0;
  uint32_t part = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct ResponseHeader {
  StatusCode status = StatusCode::kOk;
  uint16_t message_len = 0;
  uint64_t payload_len = 0;
};

// Header followed by the model name, ready to send.
std::string EncodeReadRequest(const ReadRequest& req);
// Decodes the fixed header; fills everything but `model` and returns the
// model name's length, which the caller reads next.
Result<size_t> DecodeReadRequestHeader(const uint8_t* bytes, size_t size,
                                       ReadRequest* out);

std::array<uint8_t, kResponseHeaderBytes> EncodeResponseHeader(
    const ResponseHeader& h);
Result<ResponseHeader> DecodeResponseHeader(const uint8_t* bytes, size_t size);

}  // namespace tensorhub::wire

#endif  // TENSORHUB_WIRE_FRAME_H_
