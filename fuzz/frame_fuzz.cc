// libFuzzer target: data-plane frame decoders must reject any bytes cleanly.
#include <cstddef>
#include <cstdint>

#include "wire/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tensorhub::wire::ReadRequest req;
  auto n = tensorhub::wire::DecodeReadRequestHeader(data, size, &req);
  if (n.ok() && (*n == 0 || *n > tensorhub::wire::kMaxModelNameBytes)) {
    __builtin_trap();
  }
  bool local = false;
  auto ln = tensorhub::wire::DecodeReadRequestHeader(data, size, &req, &local);
  if (n.ok() && (!ln.ok() || local)) __builtin_trap();  // the flag is opt-in
  if (ln.ok() && local && (data[6] & tensorhub::wire::kRequestFlagLocal) == 0) {
    __builtin_trap();
  }
  // The same-host identity that follows a local read request.
  auto id = tensorhub::wire::DecodeHostIdentity(data, size);
  if (id.ok() && size < tensorhub::wire::kHostIdentityBytes) __builtin_trap();
  auto h = tensorhub::wire::DecodeResponseHeader(data, size);
  if (h.ok() && h->payload_len > tensorhub::wire::kMaxReadBytes) {
    __builtin_trap();
  }
  if (h.ok() && h->local &&
      (h->status != tensorhub::StatusCode::kOk ||
       h->payload_len > tensorhub::wire::kMaxLocalReplyBytes)) {
    __builtin_trap();
  }
  // A local reply: the first 8 bytes are the read length, the rest the reply.
  uint64_t length = 0;
  for (size_t i = 0; i < size && i < 8; ++i)
    length |= uint64_t{data[i]} << (8 * i);
  auto reply =
      size < 8 ? tensorhub::Result<tensorhub::wire::LocalReply>(
                     tensorhub::InvalidArgument("short"))
               : tensorhub::wire::DecodeLocalReply(data + 8, size - 8, length);
  if (reply.ok()) {
    uint64_t sum = 0;
    if (reply->pieces.empty() ||
        reply->pieces.size() > tensorhub::wire::kMaxLocalPieces) {
      __builtin_trap();
    }
    for (const auto& p : reply->pieces) {
      if (p.length == 0 || p.address > UINT64_MAX - p.length) __builtin_trap();
      sum += p.length;
    }
    if (sum != length) __builtin_trap();
  }
  // A strided request: its header, then (after the name) run and stride;
  // accepted ones stay inside the bounds every holder relies on.
  bool strided = false;
  auto sn = tensorhub::wire::DecodeReadRequestHeader(data, size, &req, &local,
                                                     nullptr, &strided);
  if (sn.ok() && strided && size >= tensorhub::wire::kRequestHeaderBytes + 16) {
    const uint8_t* st = data + size - 16;
    if (tensorhub::wire::DecodeStride(st, 16, &req).ok()) {
      if (req.run == 0 || req.length % req.run != 0 || req.stride < req.run ||
          req.runs() > tensorhub::wire::kMaxStridedRuns ||
          req.span_end() < req.offset) {
        __builtin_trap();
      }
    }
  }
  bool ipc = false;
  auto in =
      tensorhub::wire::DecodeReadRequestHeader(data, size, &req, &local, &ipc);
  if (in.ok() && local && ipc) __builtin_trap();  // never both
  if (h.ok() && h->cuda_ipc &&
      (h->local || h->status != tensorhub::StatusCode::kOk ||
       h->payload_len > tensorhub::wire::kMaxCudaIpcReplyBytes)) {
    __builtin_trap();
  }
  auto ipc_reply = size < 8 ? tensorhub::Result<tensorhub::wire::CudaIpcReply>(
                                  tensorhub::InvalidArgument("short"))
                            : tensorhub::wire::DecodeCudaIpcReply(
                                  data + 8, size - 8, length);
  if (ipc_reply.ok()) {
    uint64_t sum = 0;
    if (ipc_reply->pieces.empty() ||
        ipc_reply->pieces.size() > tensorhub::wire::kMaxCudaIpcPieces) {
      __builtin_trap();
    }
    for (const auto& p : ipc_reply->pieces) {
      if (p.length == 0 || p.offset > UINT64_MAX - p.length ||
          p.address > UINT64_MAX - p.length) {
        __builtin_trap();
      }
      sum += p.length;
    }
    if (sum != length) __builtin_trap();
  }
  auto release = tensorhub::wire::DecodeRelease(data, size);
  if (release.ok() && static_cast<uint32_t>(*release) > 1) __builtin_trap();
  // Handshake frames: only OK or PERMISSION_DENIED verdicts are accepted.
  (void)tensorhub::wire::DecodeChallenge(data, size);
  // A hello is StartTls (no nonce) or exactly what DecodeChallenge accepts.
  auto hello = tensorhub::wire::DecodeHolderHello(data, size);
  if (hello.ok() && !hello->start_tls &&
      !tensorhub::wire::DecodeChallenge(data, size).ok()) {
    __builtin_trap();
  }
  (void)tensorhub::wire::DecodeProof(data, size);
  auto verdict = tensorhub::wire::DecodeVerdict(data, size);
  if (verdict.ok() && *verdict != tensorhub::StatusCode::kOk &&
      *verdict != tensorhub::StatusCode::kPermissionDenied &&
      *verdict != tensorhub::StatusCode::kResourceExhausted) {
    __builtin_trap();
  }
  return 0;
}
