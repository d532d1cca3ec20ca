#include "wire/frame.h"

#include <cstring>

namespace tensorhub::wire {
namespace {

template <typename T>
void Put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
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

std::string EncodeReadRequest(const ReadRequest& req, const HostIdentity* local,
                              bool cuda_ipc) {
  const size_t tail = local != nullptr ? kHostIdentityBytes : 0;
  const size_t stride = req.run != 0 ? kStrideBytes : 0;
  std::string out(kRequestHeaderBytes + req.model.size() + stride + tail, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Put<uint32_t>(p + 0, kRequestMagic);
  Put<uint16_t>(p + 4, static_cast<uint16_t>(req.model.size()));
  uint16_t flags = local == nullptr ? 0
                   : cuda_ipc       ? kRequestFlagCudaIpc
                                    : kRequestFlagLocal;
  if (stride != 0) flags |= kRequestFlagStrided;
  Put<uint16_t>(p + 6, flags);
  Put<uint64_t>(p + 8, req.version);
  Put<uint64_t>(p + 16, req.epoch);
  Put<uint32_t>(p + 24, req.part);
  // The caller asks for a delta part of an older base only (its decoder
  // refuses anything else).
  Put<uint32_t>(p + 28, IsDeltaPart(req.part) && req.base < req.version
                            ? static_cast<uint32_t>(req.version - req.base)
                            : 0);
  Put<uint64_t>(p + 32, req.offset);
  Put<uint64_t>(p + 40, req.length);
  std::memcpy(p + kRequestHeaderBytes, req.model.data(), req.model.size());
  if (stride != 0) {
    Put<uint64_t>(p + kRequestHeaderBytes + req.model.size(), req.run);
    Put<uint64_t>(p + kRequestHeaderBytes + req.model.size() + 8, req.stride);
  }
  if (local != nullptr) {
    uint8_t* id = p + kRequestHeaderBytes + req.model.size() + stride;
    std::memcpy(id, local->boot_id.data(), 16);
    Put<uint64_t>(id + 16, local->pid_ns);
    Put<uint64_t>(id + 24, local->net_ns);
  }
  return out;
}

Result<HostIdentity> DecodeHostIdentity(const uint8_t* p, size_t size) {
  if (size < kHostIdentityBytes) {
    return InvalidArgument("host identity shorter than 32 bytes");
  }
  HostIdentity id;
  std::memcpy(id.boot_id.data(), p, 16);
  id.pid_ns = Get<uint64_t>(p + 16);
  id.net_ns = Get<uint64_t>(p + 24);
  return id;
}

Status DecodeStride(const uint8_t* p, size_t size, ReadRequest* req) {
  if (size < kStrideBytes) {
    return InvalidArgument(
        "strided read request: stride shorter than 16 bytes");
  }
  req->run = Get<uint64_t>(p);
  req->stride = Get<uint64_t>(p + 8);
  if (req->run == 0 || req->length % req->run != 0 || req->stride < req->run ||
      req->length / req->run > kMaxStridedRuns) {
    return InvalidArgument("strided read request: run " +
                           std::to_string(req->run) + ", stride " +
                           std::to_string(req->stride) + " for " +
                           std::to_string(req->length) + " bytes");
  }
  const uint64_t n = req->length / req->run;
  uint64_t span = 0;
  if (__builtin_mul_overflow(n - 1, req->stride, &span) ||
      __builtin_add_overflow(span, req->run, &span) ||
      req->offset > UINT64_MAX - span) {
    return InvalidArgument("strided read request range overflows");
  }
  return Status::Ok();
}

Result<size_t> DecodeReadRequestHeader(const uint8_t* p, size_t size,
                                       ReadRequest* out, bool* local,
                                       bool* cuda_ipc, bool* strided) {
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
  const uint16_t flags = Get<uint16_t>(p + 6);
  const uint16_t known = (local != nullptr ? kRequestFlagLocal : 0) |
                         (cuda_ipc != nullptr ? kRequestFlagCudaIpc : 0) |
                         (strided != nullptr ? kRequestFlagStrided : 0);
  if ((flags & ~known) != 0) {
    return InvalidArgument("read request has unknown flags");
  }
  if ((flags & kRequestFlagLocal) != 0 && (flags & kRequestFlagCudaIpc) != 0) {
    return InvalidArgument("read request asks for both local reply kinds");
  }
  if (local != nullptr) *local = (flags & kRequestFlagLocal) != 0;
  if (cuda_ipc != nullptr) *cuda_ipc = (flags & kRequestFlagCudaIpc) != 0;
  if (strided != nullptr) *strided = (flags & kRequestFlagStrided) != 0;
  out->version = Get<uint64_t>(p + 8);
  out->epoch = Get<uint64_t>(p + 16);
  out->part = Get<uint32_t>(p + 24);
  const uint32_t base_back = Get<uint32_t>(p + 28);
  out->base = 0;
  if (IsDeltaPart(out->part)) {
    if (base_back == 0 || base_back >= out->version) {
      return InvalidArgument(
          "delta read request: base " + std::to_string(base_back) +
          " versions back from " + std::to_string(out->version));
    }
    out->base = out->version - base_back;
  } else if (base_back != 0) {
    return InvalidArgument("read request has unknown flags");
  }
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
  out[5] = static_cast<uint8_t>((h.local ? kResponseFlagLocal : 0) |
                                (h.cuda_ipc ? kResponseFlagCudaIpc : 0));
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
  if ((p[5] & ~(kResponseFlagLocal | kResponseFlagCudaIpc)) != 0 ||
      p[5] == (kResponseFlagLocal | kResponseFlagCudaIpc) ||
      Get<uint64_t>(p + 16) != 0) {
    return InvalidArgument("read response has nonzero reserved fields");
  }
  ResponseHeader h;
  h.status = static_cast<StatusCode>(p[4]);
  h.local = (p[5] & kResponseFlagLocal) != 0;
  h.cuda_ipc = (p[5] & kResponseFlagCudaIpc) != 0;
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
  if (h.local) {
    if (h.status != StatusCode::kOk) {
      return InvalidArgument("failed read response is marked local");
    }
    if (h.payload_len < kLocalReplyHeaderBytes + kLocalPieceBytes ||
        h.payload_len > kMaxLocalReplyBytes ||
        (h.payload_len - kLocalReplyHeaderBytes) % kLocalPieceBytes != 0) {
      return InvalidArgument("local read response has a bad length " +
                             std::to_string(h.payload_len));
    }
  }
  if (h.cuda_ipc) {
    if (h.status != StatusCode::kOk) {
      return InvalidArgument("failed read response is marked CUDA IPC");
    }
    if (h.payload_len < kLocalReplyHeaderBytes + kCudaIpcPieceBytes ||
        h.payload_len > kMaxCudaIpcReplyBytes ||
        (h.payload_len - kLocalReplyHeaderBytes) % kCudaIpcPieceBytes != 0) {
      return InvalidArgument("CUDA IPC read response has a bad length " +
                             std::to_string(h.payload_len));
    }
  }
  return h;
}

std::string EncodeCudaIpcReply(const CudaIpcReply& reply) {
  std::string out(
      kLocalReplyHeaderBytes + reply.pieces.size() * kCudaIpcPieceBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Put<uint32_t>(p + 0, kCudaIpcReplyMagic);
  Put<uint32_t>(p + 4, reply.pid);
  Put<uint32_t>(p + 8, static_cast<uint32_t>(reply.pieces.size()));
  Put<uint32_t>(p + 12, 0);
  p += kLocalReplyHeaderBytes;
  for (const CudaIpcPiece& piece : reply.pieces) {
    std::memcpy(p, piece.handle.data(), kCudaIpcHandleBytes);
    Put<uint64_t>(p + 64, piece.offset);
    Put<uint64_t>(p + 72, piece.length);
    Put<uint64_t>(p + 80, piece.address);
    p += kCudaIpcPieceBytes;
  }
  return out;
}

Result<CudaIpcReply> DecodeCudaIpcReply(const uint8_t* p, size_t size,
                                        uint64_t read_length) {
  if (size < kLocalReplyHeaderBytes + kCudaIpcPieceBytes ||
      size > kMaxCudaIpcReplyBytes) {
    return InvalidArgument("CUDA IPC reply size " + std::to_string(size) +
                           " out of range");
  }
  if (Get<uint32_t>(p) != kCudaIpcReplyMagic) {
    return InvalidArgument("CUDA IPC reply has a bad magic number");
  }
  CudaIpcReply reply;
  reply.pid = Get<uint32_t>(p + 4);
  const uint32_t count = Get<uint32_t>(p + 8);
  if (reply.pid == 0 || reply.pid > 0x7fffffffu) {
    return InvalidArgument("CUDA IPC reply names pid " +
                           std::to_string(reply.pid));
  }
  if (Get<uint32_t>(p + 12) != 0) {
    return InvalidArgument("CUDA IPC reply has nonzero reserved fields");
  }
  if (count == 0 || count > kMaxCudaIpcPieces ||
      size != kLocalReplyHeaderBytes + size_t{count} * kCudaIpcPieceBytes) {
    return InvalidArgument("CUDA IPC reply claims " + std::to_string(count) +
                           " pieces in " + std::to_string(size) + " bytes");
  }
  reply.pieces.resize(count);
  uint64_t total = 0;
  const uint8_t* q = p + kLocalReplyHeaderBytes;
  for (CudaIpcPiece& piece : reply.pieces) {
    std::memcpy(piece.handle.data(), q, kCudaIpcHandleBytes);
    piece.offset = Get<uint64_t>(q + 64);
    piece.length = Get<uint64_t>(q + 72);
    piece.address = Get<uint64_t>(q + 80);
    q += kCudaIpcPieceBytes;
    if (piece.length == 0 || piece.length > read_length - total ||
        piece.offset > UINT64_MAX - piece.length || piece.address == 0 ||
        piece.address > UINT64_MAX - piece.length) {
      return InvalidArgument("CUDA IPC reply has a bad piece (offset " +
                             std::to_string(piece.offset) + ", length " +
                             std::to_string(piece.length) + ")");
    }
    total += piece.length;
  }
  if (total != read_length) {
    return InvalidArgument("CUDA IPC reply pieces add up to " +
                           std::to_string(total) + " bytes for a read of " +
                           std::to_string(read_length));
  }
  return reply;
}

std::string EncodeLocalReply(const LocalReply& reply) {
  std::string out(
      kLocalReplyHeaderBytes + reply.pieces.size() * kLocalPieceBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Put<uint32_t>(p + 0, kLocalReplyMagic);
  Put<uint32_t>(p + 4, reply.pid);
  Put<uint32_t>(p + 8, static_cast<uint32_t>(reply.pieces.size()));
  Put<uint32_t>(p + 12, 0);
  p += kLocalReplyHeaderBytes;
  for (const LocalPiece& piece : reply.pieces) {
    Put<uint64_t>(p, piece.address);
    Put<uint64_t>(p + 8, piece.length);
    p += kLocalPieceBytes;
  }
  return out;
}

Result<LocalReply> DecodeLocalReply(const uint8_t* p, size_t size,
                                    uint64_t read_length) {
  if (size < kLocalReplyHeaderBytes + kLocalPieceBytes ||
      size > kMaxLocalReplyBytes) {
    return InvalidArgument("local reply size " + std::to_string(size) +
                           " out of range");
  }
  if (Get<uint32_t>(p) != kLocalReplyMagic) {
    return InvalidArgument("local reply has a bad magic number");
  }
  LocalReply reply;
  reply.pid = Get<uint32_t>(p + 4);
  const uint32_t count = Get<uint32_t>(p + 8);
  if (reply.pid == 0 || reply.pid > 0x7fffffffu) {
    return InvalidArgument("local reply names pid " +
                           std::to_string(reply.pid));
  }
  if (Get<uint32_t>(p + 12) != 0) {
    return InvalidArgument("local reply has nonzero reserved fields");
  }
  if (count == 0 || count > kMaxLocalPieces ||
      size != kLocalReplyHeaderBytes + size_t{count} * kLocalPieceBytes) {
    return InvalidArgument("local reply claims " + std::to_string(count) +
                           " pieces in " + std::to_string(size) + " bytes");
  }
  reply.pieces.resize(count);
  uint64_t total = 0;
  const uint8_t* q = p + kLocalReplyHeaderBytes;
  for (LocalPiece& piece : reply.pieces) {
    piece.address = Get<uint64_t>(q);
    piece.length = Get<uint64_t>(q + 8);
    q += kLocalPieceBytes;
    if (piece.address == 0 || piece.length == 0 ||
        piece.length > read_length - total ||
        piece.address > UINT64_MAX - piece.length) {
      return InvalidArgument("local reply has a bad piece (address " +
                             std::to_string(piece.address) + ", length " +
                             std::to_string(piece.length) + ")");
    }
    total += piece.length;
  }
  if (total != read_length) {
    return InvalidArgument("local reply pieces add up to " +
                           std::to_string(total) + " bytes for a read of " +
                           std::to_string(read_length));
  }
  return reply;
}

std::array<uint8_t, kReleaseBytes> EncodeRelease(ReleaseOutcome outcome) {
  std::array<uint8_t, kReleaseBytes> out{};
  Put<uint32_t>(out.data(), kReleaseMagic);
  Put<uint32_t>(out.data() + 4, static_cast<uint32_t>(outcome));
  Put<uint64_t>(out.data() + 8, 0);
  return out;
}

Result<ReleaseOutcome> DecodeRelease(const uint8_t* p, size_t size) {
  if (size < kReleaseBytes) {
    return InvalidArgument("release shorter than 16 bytes");
  }
  if (Get<uint32_t>(p) != kReleaseMagic) {
    return InvalidArgument("release has a bad magic number");
  }
  const uint32_t outcome = Get<uint32_t>(p + 4);
  if (outcome > static_cast<uint32_t>(ReleaseOutcome::kNotCopied) ||
      Get<uint64_t>(p + 8) != 0) {
    return InvalidArgument("release has an unknown outcome or reserved bits");
  }
  return static_cast<ReleaseOutcome>(outcome);
}

std::array<uint8_t, kChallengeBytes> EncodeChallenge(const Nonce& nonce) {
  std::array<uint8_t, kChallengeBytes> out{};
  Put<uint32_t>(out.data(), kChallengeMagic);
  Put<uint32_t>(out.data() + 4, 1);
  std::memcpy(out.data() + 8, nonce.data(), nonce.size());
  return out;
}

Result<Nonce> DecodeChallenge(const uint8_t* p, size_t size) {
  if (size < kChallengeBytes || Get<uint32_t>(p) != kChallengeMagic) {
    return InvalidArgument("data-plane challenge has a bad magic number");
  }
  if (Get<uint32_t>(p + 4) != 1) {
    return InvalidArgument("data-plane handshake version " +
                           std::to_string(Get<uint32_t>(p + 4)) +
                           " is not supported");
  }
  Nonce n;
  std::memcpy(n.data(), p + 8, n.size());
  return n;
}

std::array<uint8_t, kChallengeBytes> EncodeStartTls() {
  std::array<uint8_t, kChallengeBytes> out{};
  Put<uint32_t>(out.data(), kStartTlsMagic);
  Put<uint32_t>(out.data() + 4, 1);
  return out;
}

Result<HolderHello> DecodeHolderHello(const uint8_t* p, size_t size) {
  HolderHello h;
  if (size >= kChallengeBytes && Get<uint32_t>(p) == kStartTlsMagic) {
    if (Get<uint32_t>(p + 4) != 1) {
      return InvalidArgument("data-plane StartTls version " +
                             std::to_string(Get<uint32_t>(p + 4)) +
                             " is not supported");
    }
    h.start_tls = true;
    return h;
  }
  TH_ASSIGN_OR_RETURN(h.nonce, DecodeChallenge(p, size));
  return h;
}

std::array<uint8_t, kProofBytes> EncodeProof(const Mac& mac) {
  std::array<uint8_t, kProofBytes> out{};
  Put<uint32_t>(out.data(), kProofMagic);
  std::memcpy(out.data() + 4, mac.data(), mac.size());
  return out;
}

Result<Mac> DecodeProof(const uint8_t* p, size_t size) {
  if (size < kProofBytes || Get<uint32_t>(p) != kProofMagic) {
    return InvalidArgument("data-plane proof has a bad magic number");
  }
  Mac m;
  std::memcpy(m.data(), p + 4, m.size());
  return m;
}

std::array<uint8_t, kVerdictBytes> EncodeVerdict(StatusCode status) {
  std::array<uint8_t, kVerdictBytes> out{};
  Put<uint32_t>(out.data(), kVerdictMagic);
  out[4] = static_cast<uint8_t>(status);
  return out;
}

Result<StatusCode> DecodeVerdict(const uint8_t* p, size_t size) {
  if (size < kVerdictBytes || Get<uint32_t>(p) != kVerdictMagic) {
    return InvalidArgument("data-plane verdict has a bad magic number");
  }
  if (p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return InvalidArgument("data-plane verdict has nonzero reserved bytes");
  }
  StatusCode c = static_cast<StatusCode>(p[4]);
  if (c != StatusCode::kOk && c != StatusCode::kPermissionDenied &&
      c != StatusCode::kResourceExhausted) {
    return InvalidArgument("data-plane verdict has unknown status " +
                           std::to_string(p[4]));
  }
  return c;
}

}  // namespace tensorhub::wire
