#include "wire/frame.h"

#include <cstring>

namespace tensorhub::wire {
namespace {

template <typename T>
void Put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T Get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

bool KnownStatus(uint8_t code) {
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::kOk:
    case StatusCode::kInvalidArgument:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kPermissionDenied:
    case StatusCode::kResourceExhausted:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
    case StatusCode::kInternal:
    case StatusCode::kUnavailable:
    case StatusCode::kDataLoss:
      return true;
  }
  return false;
}

}  // namespace

std::string EncodeReadRequest(const ReadRequest& req) {
  std::string out(kRequestHeaderBytes + req.model.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Put<uint32_t>(p + 0, kRequestMagic);
  Put<uint16_t>(p + 4, static_cast<uint16_t>(req.model.size()));
  Put<uint16_t>(p + 6, 0);
  Put<uint64_t>(p + 8, req.version);
  Put<uint64_t>(p + 16, req.epoch);
  Put<uint32_t>(p + 24, req.part);
  Put<uint32_t>(p + 28, 0);
  Put<uint64_t>(p + 32, req.offset);
  Put<uint64_t>(p + 40, req.length);
  std::memcpy(p + kRequestHeaderBytes, req.model.data(), req.model.size());
  return out;
}

Result<size_t> DecodeReadRequestHeader(const uint8_t* p, size_t size,
                                       ReadRequest* out) {
  if (size < kRequestHeaderBytes) {
    return InvalidArgument("read request shorter than its header");
  }
  if (Get<uint32_t>(p) != kRequestMagic) {
    return InvalidArgument("read request has a bad magic number");
  }
  size_t model_len = Get<uint16_t>(p + 4);
  if (model_len == 0 || model_len > kMaxModelNameBytes) {
    return InvalidArgument("read request model name length " +
                           std::to_string(model_len) + " out of range");
  }
  if (Get<uint16_t>(p + 6) != 0 || Get<uint32_t>(p + 28) != 0) {
    return InvalidArgument("read request has unknown flags");
  }
  out->version = Get<uint64_t>(p + 8);
  out->epoch = Get<uint64_t>(p + 16);
  out->part = Get<uint32_t>(p + 24);
  out->offset = Get<uint64_t>(p + 32);
  out->length = Get<uint64_t>(p + 40);
  if (out->length == 0 || out->length > kMaxReadBytes) {
    return InvalidArgument("read request length " +
                           std::to_string(out->length) + " out of range");
  }
  if (out->offset > UINT64_MAX - out->length) {
    return InvalidArgument("read request range overflows");
  }
  return model_len;
}

std::array<uint8_t, kResponseHeaderBytes> EncodeResponseHeader(
    const ResponseHeader& h) {
  std::array<uint8_t, kResponseHeaderBytes> out{};
  Put<uint32_t>(out.data(), kResponseMagic);
  out[4] = static_cast<uint8_t>(h.status);
  out[5] = 0;
  Put<uint16_t>(out.data() + 6, h.message_len);
  Put<uint64_t>(out.data() + 8, h.payload_len);
  Put<uint64_t>(out.data() + 16, 0);
  return out;
}

Result<ResponseHeader> DecodeResponseHeader(const uint8_t* p, size_t size) {
  if (size < kResponseHeaderBytes) {
    return InvalidArgument("read response shorter than its header");
  }
  if (Get<uint32_t>(p) != kResponseMagic) {
    return InvalidArgument("read response has a bad magic number");
  }
  if (!KnownStatus(p[4])) {
    return InvalidArgument("read response has unknown status " +
                           std::to_string(p[4]));
  }
  if (p[5] != 0 || Get<uint64_t>(p + 16) != 0) {
    return InvalidArgument("read response has nonzero reserved fields");
  }
  ResponseHeader h;
  h.status = static_cast<StatusCode>(p[4]);
  h.message_len = Get<uint16_t>(p + 6);
  h.payload_len = Get<uint64_t>(p + 8);
  if (h.message_len > kMaxMessageBytes) {
    return InvalidArgument("read response message too long");
  }
  if (h.payload_len > kMaxReadBytes) {
    return InvalidArgument("read response payload too long");
  }
  if (h.status != StatusCode::kOk && h.payload_len != 0) {
    return InvalidArgument("failed read response carries a payload");
  }
  if (h.status == StatusCode::kOk && h.message_len != 0) {
    return InvalidArgument("successful read response carries a message");
  }
  return h;
}

}  // namespace tensorhub::wire
