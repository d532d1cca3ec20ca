#include "transport/tcp/request_io.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace tensorhub::transport {

RequestOutcome ReadIncomingRequest(Stream& stream, const Deadline& deadline,
                                   int64_t stall_ms, IncomingRequest* out,
                                   Status* status) {
  *out = IncomingRequest{};
  auto gone = [&](Status s) {
    *status = std::move(s);
    return RequestOutcome::kGone;
  };
  uint8_t header[wire::kRequestHeaderBytes];
  Status s = stream.ReadExact(header, sizeof(header), deadline, stall_ms);
  if (!s.ok()) return gone(s);
  bool strided = false;
  Result<size_t> model_len = wire::DecodeReadRequestHeader(
      header, sizeof(header), &out->req, &out->local, &out->cuda_ipc, &strided);
  if (!model_len.ok()) {
    *status = model_len.status();
    return RequestOutcome::kBad;
  }
  out->req.model.resize(*model_len);
  s = stream.ReadExact(out->req.model.data(), out->req.model.size(), deadline,
                       stall_ms);
  if (!s.ok()) return gone(s);
  if (strided) {
    uint8_t st[wire::kStrideBytes];
    s = stream.ReadExact(st, sizeof(st), deadline, stall_ms);
    if (!s.ok()) return gone(s);
    s = wire::DecodeStride(st, sizeof(st), &out->req);
    if (!s.ok()) {
      *status = s;
      return RequestOutcome::kBad;
    }
  }
  if (out->local || out->cuda_ipc) {
    uint8_t id[wire::kHostIdentityBytes];
    s = stream.ReadExact(id, sizeof(id), deadline, stall_ms);
    if (!s.ok()) return gone(s);
    Result<wire::HostIdentity> reader =
        wire::DecodeHostIdentity(id, sizeof(id));
    if (!reader.ok()) {
      *status = reader.status();
      return RequestOutcome::kBad;
    }
    out->reader = *reader;
  }
  *status = Status::Ok();
  return RequestOutcome::kOk;
}

Status SendRefusal(Stream& stream, const Status& status,
                   const Deadline& deadline, int64_t stall_ms) {
  std::string msg = status.message().substr(0, wire::kMaxMessageBytes);
  wire::ResponseHeader h;
  h.status = status.code();
  h.message_len = static_cast<uint16_t>(msg.size());
  auto hdr = wire::EncodeResponseHeader(h);
  iovec iov[2] = {{hdr.data(), hdr.size()}, {msg.data(), msg.size()}};
  return stream.Write(iov, deadline, stall_ms);
}

bool KeepsConnection(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
    case StatusCode::kNotFound:
    case StatusCode::kAborted:
    case StatusCode::kInvalidArgument:
    case StatusCode::kResourceExhausted:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kPermissionDenied:
      return true;
    default:
      return false;
  }
}

bool CoveredBy(uint64_t begin, uint64_t bytes, std::span<const iovec> regions) {
  if (bytes == 0) return true;
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // [start, end)
  for (const iovec& v : regions) {
    if (v.iov_len == 0) continue;
    const uint64_t at = reinterpret_cast<uint64_t>(v.iov_base);
    runs.emplace_back(at, at + v.iov_len);
  }
  std::sort(runs.begin(), runs.end());
  uint64_t covered_to = begin;  // [begin, covered_to) is covered
  const uint64_t end = begin + bytes;
  for (const auto& [from, to] : runs) {
    if (from > covered_to) break;  // a gap (runs are sorted by start)
    covered_to = std::max(covered_to, to);
    if (covered_to >= end) return true;
  }
  return false;
}

}  // namespace tensorhub::transport
