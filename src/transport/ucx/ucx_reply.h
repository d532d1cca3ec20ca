#ifndef TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub::transport::ucx {

inline constexpr uint32_t kHelloMagic = 0x32554854;  // "THU2"
inline constexpr uint32_t kReadyMagic = 0x52554854;  // "THUR"
inline constexpr size_t kHelloHeaderBytes = 8;
inline constexpr uint32_t kMaxWorkerAddressBytes = 64 << 10;
// A read is at most this many messages of at most kMaxMessageBytes each
// (the holder splits larger pieces; a reader staging into device memory
// receives one message per staging buffer of that size).
inline constexpr uint32_t kMaxMessages = 1 << 16;
inline constexpr uint64_t kMaxMessageBytes = 4ull << 20;
inline constexpr size_t kMaxPlanBytes = 4 + 8 * size_t{kMaxMessages};

// The tag of message `index` of the `read_seq`th read on a connection.
inline uint64_t MessageTag(uint64_t read_seq, uint32_t index) {
  return (read_seq << 16) | index;
}

std::string EncodeHelloHeader(uint32_t address_len);
// The address length; rejects a wrong magic or a length of 0 or over the
// bound.
Result<uint32_t> DecodeHelloHeader(const uint8_t* bytes, size_t size);

// The holder's answer to the hello: its own worker's address follows
// (`address_len` bytes), to which the reader connects an endpoint of its own.
std::string EncodeReady(uint32_t address_len);
Result<uint32_t> DecodeReady(const uint8_t* bytes, size_t size);

// The lengths of a read's messages, in order.
std::string EncodePlan(const std::vector<uint64_t>& lengths);
// Accepts only 1..kMaxMessages lengths of 1..kMaxMessageBytes that add up
// to exactly `expected_length`, and nothing after them.
Result<std::vector<uint64_t>> DecodePlan(const uint8_t* bytes, size_t size,
                                         uint64_t expected_length);

}  // namespace tensorhub::transport::ucx

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_REPLY_H_
